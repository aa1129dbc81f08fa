"""A node's log line stays one line whatever a client put into it."""

from __future__ import annotations

import logging
import sys

from raftcoord.protocol.process import LOG_FORMAT, OneLineFormatter


def record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            info = sys.exc_info()
    return logging.LogRecord("raftcoord.test", logging.INFO, __file__, 1, message, args, info)


def test_a_client_supplied_newline_cannot_forge_a_line() -> None:
    formatter = OneLineFormatter(LOG_FORMAT)
    forged = "tx\n2026-11-26 12:00:00,000 CRITICAL raftcoord.coordinator event=forged"
    line = formatter.format(record("event=init transactional_id=%s", forged))
    assert "\n" not in line
    assert "transactional_id=tx\\n2026-11-26" in line
    for char, shown in (("\r", "\\r"), ("\x1b", "\\x1b"), ("\u2028", "\\u2028"), ("\x85", "\\x85")):
        assert shown in formatter.format(record("id=%s", f"a{char}b"))


def test_a_traceback_still_follows_on_its_own_lines() -> None:
    text = OneLineFormatter(LOG_FORMAT).format(record("event=failed", exc=True))
    first, *rest = text.splitlines()
    assert first.endswith("event=failed")
    assert rest[0].startswith("Traceback") and rest[-1] == "ValueError: boom"
