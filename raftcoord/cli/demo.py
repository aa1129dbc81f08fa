"""The main job: ``make demo`` / ``raftcoord demo``.

Starts a local cluster (3 coordinators x 3 shards, 3 partition-log nodes;
each node in a network namespace of its own where this machine allows it,
so that the nemesis can cut real links), runs the chaos workload for about a
minute with the faults asked for (every kind by default), one at a time,
each kind at least once (the traffic goes on, up to twice as long, until
each has happened), heals and drains, stops the cluster, then runs the
Spark audit over the cluster's logs and the workload's history. Prints the
faults asked for and what they did, the audit's checks and time, the
verdict, and the path of the HTML report.

The verdict is the audit's, by the rule of :mod:`raftcoord.chaos.verdict`
(the audit reads the workload's summary from the history): FAIL when the
audit found a violation or a client crashed or did not finish; INCOMPLETE
when a check of the audit did not run or had nothing to judge, or a fault
kind asked for never changed anything (here, a partition fault without
network namespaces never runs); else PASS. Exit status 0 on PASS, 1 on
FAIL, 2 on INCOMPLETE.

An interrupt (Ctrl-C) during the traffic heals, drains and stops the
cluster, then skips the audit and says how to run it on the cluster's
directory; a second interrupt (or one before the traffic, or during the
audit) stops at once with one line. Exit status 130 either way.
"""

from __future__ import annotations

import json
import signal
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from raftcoord.chaos.commands import fault_report_table, run_with_progress, summary_table
from raftcoord.chaos.options import Options
from raftcoord.chaos.tables import print_unwrapped
from raftcoord.chaos.verdict import EXIT_STATUS
from raftcoord.chaos.workload import Workload
from raftcoord.cluster import netns, node_faults
from raftcoord.cluster.launcher import LocalCluster

#: Quiet time between one fault's recovery and the next fault: short, so that
#: every kind fits in the demo's minute.
FAULT_INTERVAL_S = 2.0
#: The exit status of an interrupted demo, as of a program SIGINT ended (128 + 2).
EXIT_INTERRUPTED = 128 + signal.SIGINT


def run_demo(
    data_dir: Path | None,
    duration_s: float,
    seed: int,
    input_records: int,
    faults: tuple[str, ...],
) -> int:
    console = Console()
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="raftcoord-demo-"))
    history = data_dir / "history.jsonl"
    later = f"raftcoord audit --cluster-dir {data_dir}"
    try:
        summary, interrupted = _run(
            console, data_dir, history, duration_s, seed, input_records, faults
        )
    except KeyboardInterrupt:  # a second interrupt, or one before the traffic
        console.print(
            f"interrupted: stopped at once; the cluster's files are in {data_dir}", soft_wrap=True
        )
        return EXIT_INTERRUPTED
    print_unwrapped(console, summary_table(summary))
    print_unwrapped(console, _faults_table(history))
    print_unwrapped(console, fault_report_table(summary["fault_report"]))
    if interrupted:
        console.print(
            "interrupted: healed, drained and stopped; the audit is skipped. The cluster's "
            f"files and the history are in {data_dir}: audit them with `{later}`",
            soft_wrap=True,
        )
        return EXIT_INTERRUPTED

    console.rule("3. the Spark audit of the logs and the history")
    from spark.audit import run_audit, session
    from spark.report import print_table, print_verdict

    try:
        spark = session()
        try:
            outcome = run_audit(spark, data_dir, history, data_dir / "audit", console)
        finally:
            spark.stop()
    except KeyboardInterrupt:
        console.print(
            f"interrupted: the audit stopped; run it again with `{later}`", soft_wrap=True
        )
        return EXIT_INTERRUPTED
    print_table(outcome.results, console)
    console.print(f"audit:   {outcome.seconds:.0f} s")
    console.print(f"history: {history}")
    console.print(f"report:  {outcome.html_path}")
    print_verdict(outcome.document, console)
    style = {"PASS": "bold green", "FAIL": "bold red", "INCOMPLETE": "bold yellow"}
    console.print(f"VERDICT: {outcome.verdict}", style=style[outcome.verdict])
    return EXIT_STATUS[outcome.verdict]


def _run(
    console: Console,
    data_dir: Path,
    history: Path,
    duration_s: float,
    seed: int,
    input_records: int,
    faults: tuple[str, ...],
) -> tuple[dict[str, Any], bool]:
    """Start the cluster, run the workload, stop the cluster (whatever
    happens); returns the workload's summary and whether an interrupt ended
    its traffic early (the workload then healed and drained)."""
    why_not = netns.unavailable()
    no_faults = node_faults.unavailable()
    console.rule("1. a local cluster")
    if why_not is not None and "partition" in faults:
        console.print(f"no network namespaces here ({why_not}): the partition fault will not run")
    if no_faults is not None and "disk" in faults:
        console.print(f"{no_faults}: the disk fault will not run")
    cluster = LocalCluster(data_dir)
    try:
        cluster.up(
            netns=why_not is None,
            faults=no_faults is None,
            tls=True,
            settings={"transaction.two.phase.commit.enable": True},
        )
        console.print(cluster.status_table(), soft_wrap=True)
        asked = ", ".join(faults) or "no faults"
        console.rule(f"2. the workload for {duration_s:.0f} s, with {asked} (seed {seed})")
        options = Options(
            seed=seed,
            duration_s=duration_s,
            two_phase_producers=1,
            input_records=input_records,
            nemesis=faults,
            fault_interval_s=FAULT_INTERVAL_S,
            every_fault=True,
        )
        workload = Workload(cluster, options, history, say=console.print)
        summary = run_with_progress(workload, console)
    finally:
        cluster.down()
    return summary, workload.interrupted


def _faults_table(history: Path) -> Table:
    """The faults of the run, in order, from the history."""
    table = Table(title="faults")
    for column in ("fault", "targets", "what happened"):
        table.add_column(column)
    with history.open() as f:
        for line in f:
            event: dict[str, Any] = json.loads(line)
            if event["op"] == "fault" and event["phase"] == "start":
                table.add_row(event["fault"], str(event["targets"]), str(event.get("detail", "")))
    return table
