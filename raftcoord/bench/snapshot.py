"""A coordinator shard's log compaction against the number of open transactions.

Run: ``raftcoord bench snapshot --sizes 10000,50000,100000``. For each size
it builds one shard replica (a single-member Raft group in a temporary
directory under ``--dir``, fsync always) whose state machine holds that many
open transactions (InitProducerId then AddPartitionsToTxn on one partition,
applied to the machine before the group starts), commits a few entries
through Raft, then forces a log compaction and ticks the group until the
journal is compacted. It reports:

* **longest tick**: the longest single tick while the snapshot was taken,
  written and the journal compacted; the shard answers nothing and sends no
  heartbeat during a tick, so this must stay well under the election
  timeout (300 ms by default);
* **compaction**: from the forced compaction to the compacted journal (the
  snapshot is encoded, written and fsynced in between);
* **encode** and **restore**: the state machine's snapshot encoding alone,
  and rebuilding a machine from the file (what a restarted replica, or a
  follower installing the snapshot, spends on its tick thread);
* the snapshot file's size.

The repetitions of each size (``--repeat``) give the median. Prints a rich
table and the machine it ran on.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fsm import (
    AddPartitions,
    AllocatePidBlock,
    InitProducerId,
    TransactionStateMachine,
    encode_entry,
)
from raftcoord.bench.progress import bench_logging
from raftcoord.cluster.launcher import free_ports
from raftcoord.coordinator import raft_journal
from raftcoord.coordinator.raft import RaftTransportSettings, raft_conf
from raftcoord.coordinator.replica import ShardReplica
from raftcoord.protocol.types import TopicPartition

BLOCK_SIZE = 1000
DEADLINE_S = 600.0


def open_transactions(count: int) -> TransactionStateMachine:
    """A machine of one shard holding ``count`` open transactions."""
    machine = TransactionStateMachine(0, 1, block_size=BLOCK_SIZE)
    for i in range(count):
        if i % BLOCK_SIZE == 0:
            machine.apply_entry(encode_entry([AllocatePidBlock(0, 1, BLOCK_SIZE)]))
        tid = f"transactional-id-{i:08d}"
        machine.apply_entry(encode_entry([InitProducerId(tid, 900_000, 1, 0, new_producer_id=i)]))
        meta = machine.state.transactions[tid]
        add = AddPartitions(
            tid, meta.producer_id, meta.producer_epoch, (TopicPartition("topic", i % 6),), 2, 0
        )
        machine.apply_entry(encode_entry([add]))
    return machine


def _tick_until(replica: ShardReplica, done: Callable[[], bool]) -> float:
    """Ticks ``replica`` until ``done()``; returns the longest tick in seconds."""
    longest = 0.0
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError("the replica did not get there in time")
        start = time.perf_counter()
        replica.doTick(0.001)
        longest = max(longest, time.perf_counter() - start)
    return longest


def measure(count: int, directory: Path) -> dict[str, float]:
    machine = open_transactions(count)
    start = time.perf_counter()
    machine.snapshot()
    encode_s = time.perf_counter() - start
    journal, dump = str(directory / "journal"), str(directory / "snapshot")
    raft_journal.install()
    raft_journal.register_journal(journal, "always", snapshot_file=dump)
    conf = raft_conf(0.05, (0.3, 0.6), journal, dump)
    address = f"127.0.0.1:{free_ports(1)[0]}"
    replica = ShardReplica(
        address,
        [],
        conf,
        machine,
        lambda *_: None,
        node_id=1,
        transport=RaftTransportSettings(os.urandom(32)),
    )
    try:
        _tick_until(replica, replica.is_leader)
        applied: list[object] = []
        for _ in range(3):
            replica.propose(
                replica.raftCurrentTerm,
                encode_entry([AllocatePidBlock(0, 1, BLOCK_SIZE)]),
                lambda result, error: applied.append(error),
            )
        _tick_until(replica, lambda: len(applied) == 3)
        first = replica._log_entries()[0][1]
        start = time.perf_counter()
        replica.forceLogCompaction()
        longest = _tick_until(replica, lambda: replica._log_entries()[0][1] > first)
        compaction_s = time.perf_counter() - start
    finally:
        replica.destroy()
        raft_journal.unregister_journal(journal)
    start = time.perf_counter()
    replica._read_snapshot(dump)
    restore_s = time.perf_counter() - start
    return {
        "longest_tick_ms": longest * 1e3,
        "compaction_ms": compaction_s * 1e3,
        "encode_ms": encode_s * 1e3,
        "restore_ms": restore_s * 1e3,
        "file_mb": os.path.getsize(dump) / 1e6,
    }


def run(args: argparse.Namespace) -> int:
    console = Console()
    table = Table(title="log compaction of one shard against its open transactions")
    for column in (
        "open txns",
        "longest tick ms",
        "compaction ms",
        "encode ms",
        "restore ms",
        "file MB",
    ):
        table.add_column(column, justify="right")
    with bench_logging(Console(stderr=True)) as log:
        for count in (int(s) for s in args.sizes.split(",")):
            runs = []
            for _ in range(args.repeat):
                with tempfile.TemporaryDirectory(dir=args.dir) as directory:
                    runs.append(measure(count, Path(directory)))
                log.info(
                    "event=measured open_transactions=%d %s",
                    count,
                    " ".join(f"{key}={value:.1f}" for key, value in runs[-1].items()),
                )
            median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            table.add_row(
                str(count),
                f"{median['longest_tick_ms']:.1f}",
                f"{median['compaction_ms']:.0f}",
                f"{median['encode_ms']:.0f}",
                f"{median['restore_ms']:.0f}",
                f"{median['file_mb']:.1f}",
            )
    console.print(table)
    console.print(
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), load average "
        f"{os.getloadavg()[0]:.2f}; Python {platform.python_version()}; median of {args.repeat}"
    )
    return 0
