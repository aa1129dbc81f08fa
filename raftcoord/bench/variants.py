"""What a cluster option costs: the same load against a cluster without it
and one with it, in one run.

    raftcoord bench tls [--seconds 10] [--producers 1,8] [--rounds 1] [--dir DIR]
    raftcoord bench metrics [--seconds 10] [--producers 1,8] [--rounds 2] [--dir DIR]
    raftcoord bench replication [--seconds 10] [--producers 1,8] [--rounds 1] [--dir DIR]

``tls``: a plaintext cluster against one started with ``--tls`` (mutual TLS
on every gRPC connection). ``metrics``: a cluster without metrics endpoints
against one with them, each endpoint scraped every second while the load
runs (fifteen times as often as Prometheus's default). ``replication``: the
benchmark's topic with one replica per partition against three (acks=all,
min.insync.replicas 2: every write waits for a follower's fetch). Each cluster is a
local one (3 coordinators x 3 shards, 3 partition-log nodes, fsync always)
running the one-client-process shape of ``raftcoord bench`` (transactional
producers as threads of one process, each transaction one record to each of
2 partitions other than the ones before) for each producer count; with
``--rounds N`` the two clusters take turns N times. Prints transactions/s,
latency and the CPU per transaction of the cluster and of the client, and
the option's ratio to the baseline per round. Numbers vary with the
machine: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from raftcoord.bench.load import ClientPool, Work, run_load
from raftcoord.bench.targets import (
    SHARDS,
    TOPIC,
    TOPIC_PARTITIONS,
    bootstrap,
    load_figures,
    local_cluster,
    pids,
)
from raftcoord.cluster.launcher import LocalCluster

#: How often the ``metrics`` comparison scrapes every endpoint (seconds).
SCRAPE_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Variant:
    """One cluster of a comparison: its name, :meth:`LocalCluster.up`'s
    options, and whether its metrics endpoints are scraped during the load."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    scraped: bool = False


#: suite -> (table title, the baseline, the option measured)
COMPARISONS: dict[str, tuple[str, Variant, Variant]] = {
    "tls": (
        "mutual TLS against plaintext",
        Variant("plaintext", {"metrics": False}),
        Variant("TLS", {"metrics": False, "tls": True}),
    ),
    "metrics": (
        "metrics endpoints (scraped every second) against none",
        Variant("no metrics", {"metrics": False}),
        Variant("metrics", {"metrics": True}, scraped=True),
    ),
    "replication": (
        "3 replicas per partition against 1",
        Variant("RF 1", {"metrics": False, "replication_factor": 1}),
        Variant("RF 3", {"metrics": False, "replication_factor": 3}),
    ),
}


@contextmanager
def scraping(cluster: LocalCluster, interval_s: float | None) -> Iterator[list[int]]:
    """Scrape every metrics endpoint of ``cluster`` every ``interval_s``
    (None: never) until the block ends; yields a list of one count, the
    scrapes done."""
    assert cluster.state is not None
    addresses = [n.metrics for n in cluster.state.nodes if n.metrics]
    done = [0]
    if interval_s is None:
        yield done
        return
    stop = threading.Event()

    def scrape() -> None:
        while not stop.wait(interval_s):
            for address in addresses:
                with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as answer:
                    answer.read()
                done[0] += 1

    thread = threading.Thread(target=scrape, name="scraper", daemon=True)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join(10)


def measure(args: argparse.Namespace, console: Console) -> list[dict[str, Any]]:
    _title, baseline, option = COMPARISONS[args.suite]
    producers = [int(p) for p in args.producers.split(",") if p.strip()]
    rows = []
    with ClientPool(1) as pool:
        for round_ in range(1, args.rounds + 1):
            for variant in (baseline, option):
                rows += _variant(args, console, pool, round_, variant, producers)
    return rows


def _variant(
    args: argparse.Namespace,
    console: Console,
    pool: ClientPool,
    round_: int,
    variant: Variant,
    producers: list[int],
) -> list[dict[str, Any]]:
    """One round's steps against a cluster of ``variant``, by ``pool``'s client process."""
    rows = []
    with local_cluster(args.dir, SHARDS, **variant.options) as cluster:
        for count in producers:
            console.print(
                f"round {round_}, {variant.name}: {count} producer(s) for {args.seconds:g} s"
            )
            work = Work(
                "transactions",
                bootstrap(cluster),
                TOPIC,
                TOPIC_PARTITIONS,
                id_prefix=f"{args.suite}-{round_}-{variant.name}-{count}".replace(" ", "-"),
                rotate=True,
                tls=cluster.client_tls(),
            )
            interval = SCRAPE_INTERVAL_S if variant.scraped else None
            with scraping(cluster, interval) as scrapes:
                result = run_load(work, count, args.seconds, 1, pids(cluster), pool=pool)
            rows.append(
                {
                    "mode": variant.name,
                    "round": round_,
                    "producers": count,
                    "scrapes": scrapes[0],
                    **load_figures(result),
                }
            )
    return rows


def table(suite: str, rows: list[dict[str, Any]]) -> Table:
    title, baseline, option = COMPARISONS[suite]
    out = Table(title=f"{title} (one client process, fsync always)")
    for header in (
        "mode",
        "round",
        "producers",
        "txn/s",
        "p50 ms",
        "p99 ms",
        "cluster CPU ms/txn",
        "client CPU ms/txn",
        "failed",
    ):
        out.add_column(header, justify="left" if header == "mode" else "right")
    base = {(r["round"], r["producers"]): r for r in rows if r["mode"] == baseline.name}
    for row in rows:
        out.add_row(
            row["mode"],
            str(row["round"]),
            str(row["producers"]),
            f"{row['per_s']:.1f}",
            f"{row['p50_ms']:.1f}",
            f"{row['p99_ms']:.1f}",
            f"{row['cluster_cpu_ms_per_op']:.2f}",
            f"{row['client_cpu_ms_per_op']:.2f}",
            str(row["failed"]),
        )
        before = base.get((row["round"], row["producers"]))
        if row["mode"] == option.name and before is not None and before["per_s"]:
            out.add_row(
                f"{option.name} / {baseline.name}",
                str(row["round"]),
                str(row["producers"]),
                f"{row['per_s'] / before['per_s']:.2f}",
                _ratio(row["p50_ms"], before["p50_ms"]),
                _ratio(row["p99_ms"], before["p99_ms"]),
                _ratio(row["cluster_cpu_ms_per_op"], before["cluster_cpu_ms_per_op"]),
                _ratio(row["client_cpu_ms_per_op"], before["client_cpu_ms_per_op"]),
                "",
            )
    return out


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base else "-"


def run(args: argparse.Namespace) -> int:
    console = Console(width=120)
    rows = measure(args, console)
    console.print(table(args.suite, rows))
    if args.json:
        print(json.dumps(rows, indent=2))
    return 1 if any(r["failed"] for r in rows) else 0
