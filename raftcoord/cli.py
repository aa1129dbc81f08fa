"""The ``raftcoord`` command line."""

from __future__ import annotations

import argparse
import sys


def _demo(_: argparse.Namespace) -> int:
    print(
        "raftcoord demo: not available yet.\n"
        "The main job (local coordinator cluster + partition-log nodes, a transactional\n"
        "workload with leader kills, and the Spark audit) needs the coordinator node,\n"
        "which is not built yet. What exists today: the protocol contract (proto/),\n"
        "the pure transaction state machine (fsm/) and the producer-id allocator\n"
        "(pid_allocator/); run `make test` to exercise them.",
        file=sys.stderr,
    )
    return 2


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``raftcoord`` console script."""
    parser = argparse.ArgumentParser(prog="raftcoord", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the main job (cluster, workload, faults, audit)")
    demo.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
