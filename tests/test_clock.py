"""A wall clock that steps, under a real cluster.

Every coordinator's wall clock is stepped an hour forward, then an hour
back (``cluster up --faults``: ``clock_gettime(CLOCK_REALTIME)`` shifted by
a preloaded shim over the C library). The leaders measure transaction
timeouts on their monotonic clock (docs/coordinator.md, "The leader's
clock"), so after each step a transaction with a 1 s timeout is still
aborted by the sweeper about a second later, one with a 60 s timeout still
commits, and the start times the shard replicates never move backwards.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftcoord.client import Admin, TopicPartition, TransactionalProducer
from raftcoord.cluster.launcher import LocalCluster
from tests.local_cluster import running_cluster

pytestmark = pytest.mark.slow

HOUR_MS = 3_600_000
SWEEP_MS = 200


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(
        tmp_path / "cluster",
        shards=1,
        partition_nodes=0,
        faults=True,
        settings={"transaction.abort.timed.out.transaction.cleanup.interval.ms": SWEEP_MS},
    ) as running:
        yield running


def open_transaction(cluster: LocalCluster, name: str, timeout_ms: int) -> TransactionalProducer:
    """A producer whose transaction (offsets only) is open on the coordinator."""
    producer = TransactionalProducer(cluster.bootstrap(), name, transaction_timeout_ms=timeout_ms)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_offsets_to_transaction({TopicPartition("t", 0): 1}, f"group-{name}")
    return producer


def aborted_by_the_sweeper(admin: Admin, name: str, timeout_s: float) -> float:
    """Seconds until ``name``'s open transaction was aborted for its timeout."""
    began = time.monotonic()
    while True:
        state = admin.describe_transactions([name])[name].state
        if state in ("PrepareAbort", "CompleteAbort"):
            return time.monotonic() - began
        assert time.monotonic() - began < timeout_s, f"{name} is still {state}"
        time.sleep(0.1)


def test_a_stepped_wall_clock_neither_times_out_open_transactions_nor_stops_the_sweeper(
    cluster: LocalCluster,
) -> None:
    starts = []
    with Admin(cluster.bootstrap()) as admin:
        for step, shift_ms in (("forward", HOUR_MS), ("back", -HOUR_MS)):
            long = open_transaction(cluster, f"long-{step}", 60_000)
            for record in cluster.coordinators():
                cluster.shift_clock(record.node_id, shift_ms)
            time.sleep(0.1)  # the shim reads its control file every 20 ms
            short = open_transaction(cluster, f"short-{step}", 1_000)
            # An hour forward, the old wall-clock sweeper aborted every open
            # transaction at once; an hour back, it stopped for an hour.
            took = aborted_by_the_sweeper(admin, f"short-{step}", timeout_s=15.0)
            print(f"{step}: the 1 s transaction was aborted {took:.2f} s after it opened")
            assert took >= 0.5
            described = admin.describe_transactions([f"long-{step}"])[f"long-{step}"]
            assert described.state == "Ongoing"
            starts.append(described.transaction_start_time_ms)
            long.commit_transaction()
            long.close()
            short.close()
    assert starts[1] > starts[0]  # an hour back did not move replicated time back
    assert starts[1] - starts[0] < HOUR_MS / 2
