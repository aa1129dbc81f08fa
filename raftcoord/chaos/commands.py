"""``raftcoord workload`` and ``raftcoord chaos``: options, live progress and
the summary table (rich).

The workload, the nemesis, the clients and the launcher are imported by the
functions that run them, not by the module: ``raftcoord workload --help``
and ``raftcoord chaos --help`` are answered without loading gRPC and
cryptography.
"""

from __future__ import annotations

import argparse
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raftcoord.chaos.arguments import (
    CHAOS_HISTORY_FILE,
    FAULT_KINDS,
    GATEWAY_FAULTS,
    HISTORY_FILE,
    fault_list,
    parse_faults,
    positive_int,
    positive_seconds,
)
from raftcoord.chaos.options import CLIENT_KINDS, Options
from raftcoord.chaos.tables import print_unwrapped
from raftcoord.chaos.verdict import EXIT_STATUS, fault_shortfalls, verdict

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from raftcoord.chaos.workload import Workload
    from raftcoord.cluster.launcher import LocalCluster

__all__ = ["configure_chaos", "configure_workload"]


def _common(parser: argparse.ArgumentParser, nemesis_default: str, history_name: str) -> None:
    parser.add_argument(
        "--cluster-dir",
        default=".raftcoord",
        help="the directory of a `raftcoord cluster up` cluster",
    )
    parser.add_argument("--seed", type=int, help="replays a run (default: a random one, printed)")
    parser.add_argument(
        "--nemesis",
        "--faults",
        dest="nemesis",
        type=fault_list,
        default=parse_faults(nemesis_default),
        help=f"comma-separated faults ({', '.join(FAULT_KINDS)}), all (all but "
        f"{', '.join(GATEWAY_FAULTS)}) or none (default: {nemesis_default})",
    )
    parser.add_argument(
        "--fault-interval",
        type=float,
        default=10.0,
        help="seconds of quiet between the end of one fault and the start of the next",
    )
    parser.add_argument("--history", help=f"history file (default: CLUSTER_DIR/{history_name})")


def configure_workload(workload: argparse.ArgumentParser) -> None:
    """The arguments of ``raftcoord workload``."""
    _common(workload, "none", HISTORY_FILE)
    length = workload.add_mutually_exclusive_group()
    length.add_argument("--duration", type=positive_seconds, help="seconds of traffic (default 60)")
    length.add_argument("--transactions", type=positive_int, help="producer transactions in all")
    defaults = Options(seed=0)
    for name, help_ in (
        ("producers", "transactional producers"),
        (
            "two-phase-producers",
            "producers in a two-phase commit (KIP-939) that crash once prepared now and "
            "then; the cluster needs transaction.two.phase.commit.enable",
        ),
        ("workers", "consume-transform-produce workers"),
        ("pollers", "read_committed pollers"),
        ("input-records", "values pre-filled into the workers' input topic"),
        ("input-partitions", "partitions of the input (and output) topic"),
        ("partitions", "partitions of the producers' topic"),
        ("max-writes", "most writes of one producer transaction"),
        ("records-per-transaction", "most inputs of one worker transaction"),
    ):
        default = getattr(defaults, name.replace("-", "_"))
        workload.add_argument(f"--{name}", type=int, default=default, help=f"{help_} ({default})")
    workload.add_argument(
        "--abort-ratio",
        type=float,
        default=defaults.abort_ratio,
        help=f"share of transactions aborted on purpose ({defaults.abort_ratio})",
    )
    workload.add_argument(
        "--request-timeout",
        type=int,
        default=defaults.request_timeout_ms,
        help="ms the clients wait for a request, and producers for a send "
        f"({defaults.request_timeout_ms})",
    )
    workload.add_argument(
        "--client",
        choices=CLIENT_KINDS,
        default=defaults.client_kind,
        help="raftcoord's client over gRPC, or Kafka's (confluent-kafka) through the "
        f"cluster's Kafka gateways ({defaults.client_kind})",
    )
    workload.add_argument(
        "--every-fault",
        action="store_true",
        help="with --duration: go on (up to twice as long) until every fault asked for "
        "that can run here has happened once",
    )
    workload.add_argument(
        "--drain-timeout",
        type=positive_seconds,
        default=defaults.drain_timeout_s,
        help=f"seconds the drain may take ({defaults.drain_timeout_s:.0f})",
    )
    workload.set_defaults(func=_workload)


def configure_chaos(chaos: argparse.ArgumentParser) -> None:
    """The arguments of ``raftcoord chaos``."""
    _common(chaos, "all", CHAOS_HISTORY_FILE)
    chaos.add_argument(
        "--duration", type=positive_seconds, default=60.0, help="seconds of faults (60)"
    )
    chaos.set_defaults(func=_chaos)


def _seed(args: argparse.Namespace, console: Console) -> int:
    seed: int = args.seed if args.seed is not None else secrets.randbelow(1_000_000_000)
    console.print(f"seed {seed} (replay with --seed {seed})")
    return seed


def _cluster(args: argparse.Namespace) -> LocalCluster:
    from raftcoord.cluster.launcher import ClusterError, LocalCluster

    cluster = LocalCluster(args.cluster_dir)
    if cluster.state is None:
        raise ClusterError(f"no cluster in {cluster.data_dir} (run `raftcoord cluster up`)")
    return cluster


def _workload(args: argparse.Namespace) -> int:
    from rich.console import Console

    from raftcoord.chaos.workload import Workload
    from raftcoord.client import KafkaError
    from raftcoord.cluster.launcher import ClusterError

    console = Console()
    try:
        options = Options(
            seed=_seed(args, console),
            duration_s=None
            if args.transactions is not None
            else (60.0 if args.duration is None else args.duration),
            transactions=args.transactions,
            producers=args.producers,
            two_phase_producers=args.two_phase_producers,
            workers=args.workers,
            pollers=args.pollers,
            abort_ratio=args.abort_ratio,
            input_records=args.input_records,
            input_partitions=args.input_partitions,
            partitions=args.partitions,
            max_writes=args.max_writes,
            records_per_transaction=args.records_per_transaction,
            nemesis=args.nemesis,
            fault_interval_s=args.fault_interval,
            every_fault=args.every_fault,
            drain_timeout_s=args.drain_timeout,
            request_timeout_ms=args.request_timeout,
            client_kind=args.client,
        )
        options.check()
        cluster = _cluster(args)
        history = Path(args.history) if args.history else cluster.data_dir / HISTORY_FILE
        summary = run_with_progress(Workload(cluster, options, history, say=console.print), console)
    except (ClusterError, KafkaError, ValueError) as exc:
        console.print(f"raftcoord workload: {exc}", style="red")
        return 1
    print_unwrapped(console, summary_table(summary))
    if summary["fault_report"]:
        print_unwrapped(console, fault_report_table(summary["fault_report"]))
    console.print(f"history: {history}")
    return 1 if summary["crashed"] or summary["unfinished"] else 0


def run_with_progress(workload: Workload, console: Console) -> dict[str, Any]:
    """Run ``workload`` under a live progress table; returns its summary."""
    from rich.live import Live

    with Live(
        console=console, transient=True, get_renderable=lambda: _progress(workload.progress())
    ):
        return workload.run()


def _progress(progress: dict[str, Any]) -> Table:
    from rich.table import Table

    table = Table(title=f"workload: {progress['phase']}, {progress['elapsed_s']:.0f} s")
    for column in ("commits", "aborts", "failures", "unknown", "faults done", "current faults"):
        table.add_column(column, justify="right" if column != "current faults" else "left")
    table.add_row(
        str(progress["commits"]),
        str(progress["aborts"]),
        str(progress["failures"]),
        str(progress["unknown"]),
        str(progress["faults_done"]),
        ", ".join(progress["faults"]) or "-",
    )
    return table


def summary_table(summary: dict[str, Any]) -> Table:
    """The run's summary: per op how many invocations ended ok, fail (did not
    happen) and info (unknown), then what crashed or did not finish."""
    from rich.table import Table

    table = Table(title=f"summary (seed {summary['seed']}, {summary['elapsed_s']} s)")
    for column in ("op", "invoked", "ok", "fail", "info (unknown)"):
        table.add_column(column, justify="left" if column == "op" else "right")
    for op, counts in summary["ops"].items():
        table.add_row(op, *(str(counts[t]) for t in ("invoke", "ok", "fail", "info")))
    for what in ("crashed", "unfinished"):
        for entry in summary[what]:
            table.add_row(f"[red]{what}[/red]", entry, "", "", "")
    return table


def fault_report_table(report: list[dict[str, Any]]) -> Table:
    """Per fault kind asked for: how many happened, how many of them changed
    something (a leader moved, requests failed, a node stopped on its disk),
    and why a kind did not run."""
    from rich.table import Table

    table = Table(title="faults asked for")
    for column in ("fault", "happened", "changed something", "note"):
        table.add_column(
            column, justify="right" if column in ("happened", "changed something") else "left"
        )
    for row in report:
        note = row["not_run"] or ("" if row["happened"] else "did not happen in the run's time")
        style = "red" if not row["changed"] else ""
        table.add_row(row["fault"], str(row["happened"]), str(row["changed"]), note, style=style)
    return table


def _chaos(args: argparse.Namespace) -> int:
    from rich.console import Console

    from raftcoord.chaos.history import History
    from raftcoord.chaos.nemesis import run_alone
    from raftcoord.cluster.launcher import ClusterError

    console = Console()
    try:
        cluster = _cluster(args)
        seed = _seed(args, console)
        path = Path(args.history) if args.history else cluster.data_dir / CHAOS_HISTORY_FILE
        with History(path) as history:
            history.event(
                "workload",
                "info",
                "run",
                seed=seed,
                args={k: v for k, v in vars(args).items() if k != "func"},
                topics={},
                bootstrap=cluster.bootstrap(),
            )
            nemesis = run_alone(
                cluster,
                history,
                args.nemesis,
                args.fault_interval,
                seed,
                args.duration,
                console.print,
            )
            report = nemesis.report()
            history.event(
                "workload",
                "ok",
                "run",
                summary={"seed": seed, "faults": nemesis.done, "fault_report": report},
            )
    except ClusterError as exc:
        console.print(f"raftcoord chaos: {exc}", style="red")
        return 1
    print_unwrapped(console, fault_report_table(report))
    console.print(f"history: {path}")
    shortfalls = fault_shortfalls(report)
    for reason in shortfalls:
        console.print(f"  {reason}")
    outcome = verdict([], shortfalls)
    console.print(f"VERDICT: {outcome}")
    return EXIT_STATUS[outcome]
