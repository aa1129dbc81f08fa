"""Reading a workload history and checking its structure (docs/history.md,
"Every event"): indexes, clock order, one operation at a time per process.
The invariants on the data are the checkers' business, not this module's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COMPLETIONS = {"ok", "fail", "info"}
REQUIRED = ("index", "time_ms", "mono_ns", "process", "type", "op")


def read_history(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def structure_problems(events: list[dict[str, Any]]) -> list[str]:
    """Every way ``events`` breaks the format's structure (empty: none)."""
    problems: list[str] = []
    open_ops: dict[str, dict[str, Any]] = {}
    last_mono = -1
    for position, event in enumerate(events):
        missing = [key for key in REQUIRED if key not in event]
        if missing:
            problems.append(f"event {position} lacks {missing}")
            continue
        if event["index"] != position:
            problems.append(f"event {position} has index {event['index']}")
        if event["mono_ns"] < last_mono:
            problems.append(f"event {position}: mono_ns goes back")
        last_mono = event["mono_ns"]
        process, type_ = event["process"], event["type"]
        pending = open_ops.get(process)
        if type_ == "invoke":
            if pending is not None:
                problems.append(f"event {position}: {process} invokes with {pending['op']} open")
            open_ops[process] = event
        elif type_ in COMPLETIONS and pending is not None:
            if pending["op"] != event["op"]:
                problems.append(f"event {position}: {process} completes the wrong op")
            del open_ops[process]
        elif type_ not in COMPLETIONS:
            problems.append(f"event {position}: unknown type {type_!r}")
    problems += [
        f"{p}: {e['op']} (event {e['index']}) never completed" for p, e in open_ops.items()
    ]
    if events and (events[0]["op"], events[0]["type"]) != ("run", "info"):
        problems.append("the first event is not the run's start")
    return problems
