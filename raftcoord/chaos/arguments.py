"""Command-line argument types of the workload, chaos and demo commands
(light: the command line imports it before it knows which command runs)."""

from __future__ import annotations

import argparse

#: The history `raftcoord workload` writes into the cluster directory unless
#: told otherwise (what `raftcoord audit` reads there by default).
HISTORY_FILE = "history.jsonl"
#: Where `raftcoord chaos` writes its fault events in the cluster directory.
CHAOS_HISTORY_FILE = "chaos-history.jsonl"


def positive_seconds(text: str) -> float:
    """An argument that is a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return value


def positive_int(text: str) -> int:
    """An argument that is a positive integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be a positive integer")
    return value


#: The nemesis's fault kinds on the nodes (docs/chaos.md): ``all`` is these.
FAULTS = (
    "leader-kill",
    "minority-kill",
    "pause",
    "plog-restart",
    "plog-leader-kill",
    "plog-wipe",
    "partition",
    "plog-partition",
    "disk",
)
#: Faults on a cluster's Kafka gateways, run only when asked for by name.
GATEWAY_FAULTS = ("gateway-partition",)
#: Every fault kind.
FAULT_KINDS = FAULTS + GATEWAY_FAULTS


def parse_faults(text: str) -> tuple[str, ...]:
    """``"leader-kill,pause"``, ``"all"`` (:data:`FAULTS`) or ``""``/``"none"``
    -> fault names.

    Raises:
        ValueError: an unknown fault name.
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names in ([], ["none"]):
        return ()
    if "all" in names:
        return FAULTS
    unknown = sorted(set(names) - set(FAULT_KINDS))
    if unknown:
        raise ValueError(f"unknown fault(s) {unknown}; use {', '.join(FAULT_KINDS)}, all or none")
    return tuple(dict.fromkeys(names))


def fault_list(text: str) -> tuple[str, ...]:
    """An argument that is a list of faults (:func:`parse_faults`)."""
    try:
        return parse_faults(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
