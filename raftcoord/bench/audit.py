"""Benchmark of the Spark audit (``raftcoord audit``): time and rows/s by run size.

    raftcoord bench audit [--sizes 10000 100000 1000000] [--master local[*]]

For each size, generates a clean synthetic run of that many values
(``spark/synthetic.py``: segments, transitions of 3 replicas, history), audits
it in one SparkSession (started once, not timed) and prints a table: the
rows the sources read (segment records, transitions, history events), the
audit's wall time (every check and the report's figures) and rows/s. A
run must pass: the benchmark fails otherwise.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from spark import audit, stats, synthetic


def run(args: argparse.Namespace) -> int:
    spark = audit.session(args.master, args.shuffle_partitions)
    rows_out = []
    try:
        for size in args.sizes:
            root = Path(tempfile.mkdtemp(prefix=f"audit-bench-{size}-"))
            try:
                started = time.monotonic()
                cluster, history = synthetic.generate(size).write(root)
                generated = time.monotonic() - started
                started = time.monotonic()
                job, results = audit.audit(spark, cluster, history)
                figures = stats.collect(job)
                elapsed = time.monotonic() - started
                spark.catalog.clearCache()
                failed = [r.name for r in results if r.status == "FAIL"]
                if failed:
                    print(f"{size}: the clean run failed {failed}", file=sys.stderr)
                    return 1
                totals = figures["totals"]
                rows = (
                    totals["segment rows"]
                    + totals["transitions (all replicas)"]
                    + totals["history events"]
                )
                mib = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) / 2**20
                rows_out.append((size, rows, mib, generated, elapsed, rows / elapsed))
                print(
                    f"{size} values: {rows} rows, {mib:.0f} MiB, audit {elapsed:.1f} s",
                    flush=True,
                )
            finally:
                shutil.rmtree(root, ignore_errors=True)
    finally:
        spark.stop()
    print()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, master {args.master}"
    )
    print("| values | rows read | input MiB | generate s | audit s | rows/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for size, rows, mib, generated, elapsed, rate in rows_out:
        print(
            f"| {size:,} | {rows:,} | {mib:.0f} | {generated:.1f} | {elapsed:.1f} | {rate:,.0f} |"
        )
    return 0
