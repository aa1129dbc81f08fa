"""The history writer: one JSON object per line, in the order events happen
(the format is docs/history.md).

The writer stamps each event with its ``index``, wall-clock ``time_ms`` and
monotonic ``mono_ns`` under one lock, so file order, indexes and monotonic
times agree. It also enforces the format's one rule about processes: a
process has at most one operation outstanding, so an ``invoke`` while one is
open, or a completion without one, is a bug of the caller and raises.
The file is flushed at least every ``flush_interval_s`` and fsync'd on close.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["COMPLETIONS", "History", "HistoryError"]

#: The types that complete an ``invoke``.
COMPLETIONS = frozenset({"ok", "fail", "info"})
#: A client operation that takes longer than this was held up (a commit takes
#: tens of milliseconds; polls wait for records by design and do not count).
SLOW_S = 1.0


class HistoryError(Exception):
    """An event that would break the history's format."""


class History:
    """A thread-safe JSON-lines history writer.

    Args:
        path: the file to write (created or truncated).
        flush_interval_s: longest time an event waits in the buffer.
    """

    def __init__(self, path: str | Path, flush_interval_s: float = 0.5) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("w", encoding="utf-8")
        self._lock = threading.Lock()
        self._index = 0
        self._flush_interval_ns = int(flush_interval_s * 1e9)
        self._last_flush_ns = time.monotonic_ns()
        #: process -> op of its outstanding invoke, and when it was invoked (ns).
        self._open: dict[str, tuple[str, int]] = {}
        #: Client operations (polls aside) that took longer than SLOW_S.
        self._slow = 0
        #: (op, type) -> how many events; read by progress displays.
        self._counts: Counter[tuple[str, str]] = Counter()
        self._closed = False

    def __enter__(self) -> History:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- writing -------------------------------------------------------------------

    def invoke(self, process: str, op: str, **fields: Any) -> dict[str, Any]:
        """Record that ``process`` is about to call ``op``.

        Raises:
            HistoryError: the process has an operation outstanding.
        """
        return self._write(process, "invoke", op, fields)

    def complete(self, process: str, type_: str, **fields: Any) -> dict[str, Any]:
        """Record the outcome (``ok``, ``fail`` or ``info``) of the process's
        outstanding operation.

        Raises:
            HistoryError: no operation is outstanding, or ``type_`` is not a completion.
        """
        if type_ not in COMPLETIONS:
            raise HistoryError(
                f"{type_!r} does not complete an operation; use {sorted(COMPLETIONS)}"
            )
        with self._lock:
            open_op = self._open.get(process)
        if open_op is None:
            raise HistoryError(f"{process} completes an operation it never invoked")
        return self._write(process, type_, open_op[0], fields)

    def event(self, process: str, type_: str, op: str, **fields: Any) -> dict[str, Any]:
        """Record an event that is not an operation of a client process
        (``run``, ``fault``, ``final``)."""
        if type_ == "invoke":
            raise HistoryError("use invoke() for invocations")
        return self._write(process, type_, op, fields, standalone=True)

    def _write(
        self, process: str, type_: str, op: str, fields: dict[str, Any], standalone: bool = False
    ) -> dict[str, Any]:
        with self._lock:
            if self._closed:
                raise HistoryError("the history is closed")
            opened = self._open.get(process)
            outstanding = None if opened is None else opened[0]
            now_ns = time.monotonic_ns()
            if type_ == "invoke":
                if outstanding is not None:
                    raise HistoryError(f"{process} invokes {op} while its {outstanding} is open")
                self._open[process] = (op, now_ns)
            elif not standalone:
                if opened is None or outstanding != op:
                    raise HistoryError(f"{process} completes {op} but its open op is {outstanding}")
                del self._open[process]
                if _held_up(op, now_ns - opened[1]):
                    self._slow += 1
            elif outstanding is not None:
                raise HistoryError(f"{process} records {op} while its {outstanding} is open")
            event: dict[str, Any] = {
                "index": self._index,
                "time_ms": time.time() * 1000,
                "mono_ns": now_ns,
                "process": process,
                "type": type_,
                "op": op,
                **fields,
            }
            self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
            self._index += 1
            self._counts[(op, type_)] += 1
            if now_ns - self._last_flush_ns >= self._flush_interval_ns:
                self._file.flush()
                self._last_flush_ns = now_ns
            return event

    # --- reading and closing -------------------------------------------------------

    def counts(self) -> Counter[tuple[str, str]]:
        """A copy of the (op, type) -> count tally so far."""
        with self._lock:
            return Counter(self._counts)

    def outstanding(self) -> dict[str, str]:
        """process -> op of every operation not completed yet."""
        with self._lock:
            return {process: op for process, (op, _) in self._open.items()}

    def slow(self) -> int:
        """Client operations (polls aside, which wait by design) that took
        longer than :data:`SLOW_S`, completed or still outstanding now."""
        now_ns = time.monotonic_ns()
        with self._lock:
            waiting = sum(1 for op, at in self._open.values() if _held_up(op, now_ns - at))
            return self._slow + waiting

    def close(self) -> None:
        """Flush and fsync the file and close it. Closing twice is a no-op."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()


def _held_up(op: str, waited_ns: int) -> bool:
    return op != "poll" and waited_ns > SLOW_S * 1e9
