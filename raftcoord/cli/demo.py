"""The main job: ``make demo`` / ``raftcoord demo``.

Starts a local cluster (3 coordinators x 3 shards, 3 partition-log nodes;
each node in a network namespace of its own where this machine allows it,
so that the nemesis can cut real links), runs the chaos workload for about a
minute with every fault of the nemesis, heals and drains, stops the
cluster, then runs the Spark audit over the cluster's logs and the
workload's history. Prints the faults that happened, the audit's checks and
verdict, and the path of the HTML report. Exit status 0 on PASS.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from raftcoord.chaos.commands import run_with_progress, summary_table
from raftcoord.chaos.nemesis import FAULTS
from raftcoord.chaos.workload import Options, Workload
from raftcoord.cluster import netns, node_faults
from raftcoord.cluster.launcher import LocalCluster


def run_demo(data_dir: Path | None, duration_s: float, seed: int, input_records: int) -> int:
    console = Console()
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="raftcoord-demo-"))
    history = data_dir / "history.jsonl"
    why_not = netns.unavailable()
    no_faults = node_faults.unavailable()
    console.rule("1. a local cluster")
    if why_not is not None:
        console.print(f"no network namespaces here ({why_not}): the partition fault will not run")
    if no_faults is not None:
        console.print(f"{no_faults}: the disk fault will not run")
    cluster = LocalCluster(data_dir)
    try:
        cluster.up(netns=why_not is None, faults=no_faults is None, tls=True)
        console.print(cluster.status_table())
        console.rule(f"2. the workload for {duration_s:.0f} s, with every fault (seed {seed})")
        options = Options(
            seed=seed,
            duration_s=duration_s,
            input_records=input_records,
            nemesis=FAULTS,
            fault_interval_s=5.0,
        )
        workload = Workload(cluster, options, history, say=console.print)
        summary = run_with_progress(workload, console)
    finally:
        cluster.down()
    console.print(summary_table(summary))
    console.print(_faults_table(history))

    console.rule("3. the Spark audit of the logs and the history")
    from spark.audit import run_audit, session
    from spark.report import print_table

    spark = session()
    try:
        outcome = run_audit(spark, data_dir, history, data_dir / "audit")
    finally:
        spark.stop()
    print_table(outcome.results, console)
    console.print(f"history: {history}")
    console.print(f"report:  {outcome.html_path}")
    passed = outcome.verdict == "PASS" and not summary["crashed"] and not summary["unfinished"]
    console.print(
        f"VERDICT: {'PASS' if passed else 'FAIL'}", style="bold green" if passed else "bold red"
    )
    return 0 if passed else 1


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
