"""One verdict rule for a run, shared by ``raftcoord demo``, ``raftcoord chaos``
and ``raftcoord audit`` (docs/chaos.md, "The verdict").

FAIL when something went wrong: a violation the audit found, a client process
that crashed or never finished. Otherwise INCOMPLETE when something that had
to happen did not: a check of the audit that did not run or had nothing to
judge, a fault kind asked for that never changed anything the cluster or the
clients saw (the nemesis's ``changed``: a fault that ended without effect
tested nothing). Otherwise PASS. Each verdict has its exit status; a command
line or inputs that are not a run's have their own (:data:`EXIT_USAGE`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

#: The exit status of each verdict.
EXIT_STATUS = {"PASS": 0, "FAIL": 1, "INCOMPLETE": 2}
#: A command line that cannot be parsed, or inputs that are not a run's (EX_USAGE).
EXIT_USAGE = 64


class UsageParser(argparse.ArgumentParser):
    """An argument parser whose usage errors exit :data:`EXIT_USAGE`, not
    argparse's 2 (INCOMPLETE here); its subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def fault_shortfalls(report: list[dict[str, Any]]) -> list[str]:
    """Per fault kind of a nemesis report (``fault_report``, docs/history.md)
    that was asked for and changed nothing: why, naming the kind."""
    found = []
    for row in report:
        kind = row["fault"]
        if row.get("not_run"):
            found.append(f"fault {kind} asked for and {row['not_run']}")
        elif not row.get("happened"):
            found.append(f"fault {kind} asked for and never happened")
        elif not row.get("changed"):
            found.append(
                f"fault {kind} never changed anything the cluster or the clients saw "
                f"({row['happened']} ended)"
            )
    return found


def run_problems(summary: dict[str, Any]) -> tuple[list[str], list[str]]:
    """What a run's summary (the last ``run`` event's) holds against it:
    (failures: client processes that crashed or never finished, shortfalls:
    :func:`fault_shortfalls` of its ``fault_report``)."""
    failures = [
        f"{what}: {entry}" for what in ("crashed", "unfinished") for entry in summary.get(what, [])
    ]
    return failures, fault_shortfalls(summary.get("fault_report") or [])


def verdict(failures: list[str], shortfalls: list[str]) -> str:
    """FAIL on any failure, else INCOMPLETE on any shortfall, else PASS."""
    if failures:
        return "FAIL"
    return "INCOMPLETE" if shortfalls else "PASS"
