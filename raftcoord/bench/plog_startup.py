"""Start-up time of one partition against its log size, with and without producer-state snapshots.

Run: ``raftcoord bench plog-startup --sizes 10M,100M,1G`` (the 1 GB
log takes a few minutes to write; ``--sizes 10M`` is a quick run). For each
size it writes a partition log in a temporary directory (on the disk given by
``--dir``) through :class:`partition_log.partition.Partition`, as a node
would: batches of ``--records`` records of ``--value-bytes`` bytes from eight
producers, four idempotent and four transactional (a COMMIT or ABORT marker
every ``--txn-batches`` batches each), with ``--segment-bytes`` segments. It
then times opening the partition (log recovery plus rebuilding the producer
state) in three cases:

* **clean shutdown**: the snapshot written at the log end by ``close()``;
* **crash**: only the snapshots written when segments rolled, so the batches
  of the active segment are replayed;
* **no snapshot**: every snapshot file deleted, so every batch header of the
  log is replayed (what start-up cost before snapshots existed).

Each case is opened ``--repeat`` times; the table shows the median wall time
and the batch headers the state rebuild read (``replayed``). The log's files
are in the page cache (written just before), so the times are CPU cost, not
disk reads. Prints a rich table and the machine it ran on.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from partition_log import codec
from partition_log.log import FsyncPolicy
from partition_log.partition import BatchSpec, Partition
from raftcoord.bench.arguments import parse_size

PRODUCERS = 8


def open_partition(path: Path, segment_bytes: int) -> Partition:
    return Partition(
        "bench",
        0,
        path,
        segment_bytes=segment_bytes,
        index_interval_bytes=4096,
        fsync=FsyncPolicy.NEVER,
    )


def write_log(path: Path, size: int, args: argparse.Namespace) -> tuple[int, int]:
    """Fill a partition up to ``size`` bytes of log; returns (batches, segments)."""
    part = open_partition(path, args.segment_bytes)
    sequences = [0] * PRODUCERS
    epochs = [0] * PRODUCERS
    written = batches = 0
    value = b"x" * args.value_bytes
    records = [
        codec.RecordData(key=b"key-%d" % i, value=value, headers=(), timestamp_ms=1_700_000_000_000)
        for i in range(args.records)
    ]
    while written < size:
        pid = batches % PRODUCERS
        transactional = pid >= PRODUCERS // 2
        batch = codec.encode_batch(
            records,
            producer_id=pid,
            producer_epoch=epochs[pid],
            base_sequence=sequences[pid],
            transactional=transactional,
        )
        spec = BatchSpec(pid, epochs[pid], sequences[pid], args.records, transactional)
        check = part.append(spec, batch, verified=True)
        assert check.ok, check
        sequences[pid] += args.records
        written += len(batch)
        batches += 1
        if transactional and (batches // PRODUCERS) % args.txn_batches == 0:
            epochs[pid] += 1
            sequences[pid] = 0
            commit = batches % 3 != 0
            code, message = part.write_marker(pid, epochs[pid], 1, commit, 1_700_000_000_000)
            assert code.name == "NONE", message
    segments = len(part.store.segment_base_offsets)
    part.close()
    return batches, segments


@dataclass
class Timing:
    seconds: float
    replayed: int
    snapshot_offset: int


def time_open(path: Path, args: argparse.Namespace) -> Timing:
    runs = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        part = open_partition(path, args.segment_bytes)
        elapsed = time.perf_counter() - started
        replayed = part.store.headers_scanned - part.store.recovered.batches_scanned
        runs.append(Timing(elapsed, replayed, part.snapshot_loaded))
        part.store.close()  # not part.close(): that would write a new snapshot
    median = statistics.median(r.seconds for r in runs)
    return Timing(median, runs[0].replayed, runs[0].snapshot_offset)


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, {platform.system()}"


def run(args: argparse.Namespace) -> int:
    sizes = [parse_size(s) for s in args.sizes.split(",")]

    table = Table(title=f"partition start-up time (median of {args.repeat} opens)")
    for column in (
        "log size",
        "segments",
        "data batches",
        "clean shutdown",
        "replayed",
        "crash (roll snapshot)",
        "replayed ",
        "no snapshot",
        "replayed  ",
    ):
        table.add_column(column, justify="right")
    for size in sizes:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            path = Path(tmp) / "bench-0"
            batches, segments = write_log(path, size, args)
            snapshots = sorted(path.glob("*.snapshot"))
            clean = time_open(path, args)
            snapshots[-1].unlink()  # the one close() wrote at the log end
            crash = time_open(path, args)
            for snapshot in path.glob("*.snapshot"):
                snapshot.unlink()
            none = time_open(path, args)
            table.add_row(
                f"{sum(p.stat().st_size for p in path.glob('*.log')) / (1 << 20):.0f} MiB",
                str(segments),
                str(batches),
                f"{clean.seconds * 1000:.0f} ms",
                str(clean.replayed),
                f"{crash.seconds * 1000:.0f} ms",
                str(crash.replayed),
                f"{none.seconds * 1000:.0f} ms",
                str(none.replayed),
            )
    console = Console(width=160)
    console.print(table)
    console.print(f"segments of {args.segment_bytes >> 20} MiB; {machine()}")
    return 0
