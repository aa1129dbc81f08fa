"""What mutual TLS costs: the same load against a plaintext and a TLS cluster.

    raftcoord bench tls [--seconds 10] [--producers 1,8] [--dir DIR]

Starts a local cluster (3 coordinators x 3 shards, 3 partition-log nodes,
fsync always) without TLS, runs the one-client-process shape of
``raftcoord bench`` (transactional producers as threads of one process,
each transaction one record to each of 2 partitions other than the ones
before) for each producer count, stops it, and does the same against a
cluster started with ``--tls``. Prints transactions/s, latency and the CPU
per transaction of the cluster and of the client for both, and TLS's ratio
to plaintext. Numbers vary with the machine: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from raftcoord.bench.load import Work, run_load
from raftcoord.bench.targets import (
    SHARDS,
    TOPIC,
    TOPIC_PARTITIONS,
    bootstrap,
    load_figures,
    local_cluster,
    pids,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=10.0, help="per step (10)")
    parser.add_argument(
        "--producers", default="1,8", help="producer threads of each step, comma-separated (1,8)"
    )
    parser.add_argument("--dir", help="where the clusters' temporary directories go")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")


def measure(args: argparse.Namespace, console: Console) -> list[dict[str, Any]]:
    producers = [int(p) for p in args.producers.split(",") if p.strip()]
    rows = []
    for tls in (False, True):
        mode = "TLS" if tls else "plaintext"
        with local_cluster(args.dir, SHARDS, tls=tls) as cluster:
            for count in producers:
                console.print(f"{mode}: {count} producer(s) for {args.seconds:g} s")
                work = Work(
                    "transactions",
                    bootstrap(cluster),
                    TOPIC,
                    TOPIC_PARTITIONS,
                    id_prefix=f"tls-{mode}-{count}",
                    rotate=True,
                    tls=cluster.client_tls(),
                )
                result = run_load(work, count, args.seconds, 1, pids(cluster))
                rows.append({"mode": mode, "producers": count, **load_figures(result)})
    return rows


def table(rows: list[dict[str, Any]]) -> Table:
    out = Table(title="mutual TLS against plaintext (one client process, fsync always)")
    for header in (
        "mode",
        "producers",
        "txn/s",
        "p50 ms",
        "p99 ms",
        "cluster CPU ms/txn",
        "client CPU ms/txn",
        "failed",
    ):
        out.add_column(header, justify="right" if header != "mode" else "left")
    plain = {r["producers"]: r for r in rows if r["mode"] == "plaintext"}
    for row in rows:
        out.add_row(
            row["mode"],
            str(row["producers"]),
            f"{row['per_s']:.1f}",
            f"{row['p50_ms']:.1f}",
            f"{row['p99_ms']:.1f}",
            f"{row['cluster_cpu_ms_per_op']:.2f}",
            f"{row['client_cpu_ms_per_op']:.2f}",
            str(row["failed"]),
        )
        base = plain.get(row["producers"])
        if row["mode"] == "TLS" and base is not None and base["per_s"]:
            out.add_row(
                "TLS / plaintext",
                str(row["producers"]),
                f"{row['per_s'] / base['per_s']:.2f}",
                _ratio(row["p50_ms"], base["p50_ms"]),
                _ratio(row["p99_ms"], base["p99_ms"]),
                _ratio(row["cluster_cpu_ms_per_op"], base["cluster_cpu_ms_per_op"]),
                _ratio(row["client_cpu_ms_per_op"], base["client_cpu_ms_per_op"]),
                "",
            )
    return out


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base else "-"


def run(args: argparse.Namespace) -> int:
    console = Console(width=120)
    rows = measure(args, console)
    console.print(table(rows))
    if args.json:
        print(json.dumps(rows, indent=2))
    return 1 if any(r["failed"] for r in rows) else 0
