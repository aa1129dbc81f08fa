"""A shard replica compacts its log into the state machine's msgpack snapshot
and a restarted replica rebuilds the same state from snapshot + journal."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest

from fsm import (
    AllocatePidBlock,
    ErrorCode,
    InitProducerId,
    Outcome,
    TransactionStateMachine,
    encode_entry,
)
from raftcoord.cluster.launcher import free_ports
from raftcoord.coordinator import raft_journal
from raftcoord.coordinator.raft import raft_conf
from raftcoord.coordinator.replica import EntryNotApplied, ShardReplica

pytestmark = pytest.mark.usefixtures("pysyncobj_restored")


def make_replica(tmp_path: Path, address: str, applied: list[int]) -> ShardReplica:
    journal, dump = str(tmp_path / "journal"), str(tmp_path / "snapshot")
    raft_journal.install()
    raft_journal.register_journal(journal, "always", snapshot_file=dump)
    conf = raft_conf(0.01, (0.05, 0.1), journal, dump)
    machine = TransactionStateMachine(0, 1)
    return ShardReplica(
        address, [], conf, machine, lambda index, term, outcomes: applied.append(index), node_id=1
    )


def tick_until(replica: ShardReplica, condition: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        replica.doTick(0.005)


def test_compaction_writes_msgpack_and_restart_restores(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_ports(1)[0]}"
    applied: list[int] = []
    replica = make_replica(tmp_path, address, applied)
    results: list[list[Outcome]] = []
    try:
        tick_until(replica, replica.is_leader)
        term = replica.raftCurrentTerm

        def done(result: list[Outcome] | None, error: ErrorCode) -> None:
            assert error == ErrorCode.NONE
            results.append(result)

        replica.apply_entry(term, encode_entry([AllocatePidBlock(0, 1, 1000)]), callback=done)
        for i in range(20):
            command = InitProducerId(f"t{i}", 1000, 1, term, new_producer_id=i)
            replica.apply_entry(term, encode_entry([command]), callback=done)
        tick_until(replica, lambda: len(results) == 21)
        assert all(o.ok for r in results for o in r)
        expected = replica.machine.snapshot()
        replica.forceLogCompaction()
        tick_until(replica, lambda: (tmp_path / "snapshot").exists())
        payload = msgpack.unpackb((tmp_path / "snapshot").read_bytes(), raw=False)
        assert set(payload) == {"v", "fsm", "last", "previous"}
        assert TransactionStateMachine.restore(payload["fsm"]).snapshot() == expected
    finally:
        replica.destroy()
    applied.clear()
    again = make_replica(tmp_path, address, applied)
    try:
        tick_until(again, lambda: again.machine.snapshot() == expected)
        assert len(again.machine.state.transactions) == 20
    finally:
        again.destroy()


def test_an_entry_that_cannot_be_applied_stops_the_replica_with_its_index(
    tmp_path: Path,
) -> None:
    """pysyncobj applies an entry again on every tick while applying raises;
    the replica must stop at that entry instead (the node exits on it)."""
    applied: list[int] = []
    replica = make_replica(tmp_path, f"127.0.0.1:{free_ports(1)[0]}", applied)
    try:
        tick_until(replica, replica.is_leader)
        term = replica.raftCurrentTerm
        replica.propose(term, encode_entry([AllocatePidBlock(0, 1, 1000)]), lambda r, e: None)
        tick_until(replica, lambda: len(applied) == 1)
        index = applied[0] + 1
        healthy = replica.machine.apply_entry

        def broken(entry: bytes) -> list[Outcome]:
            raise OSError("disk gone")

        replica.machine.apply_entry = broken  # type: ignore[method-assign]
        replica.propose(term, encode_entry([AllocatePidBlock(0, 1, 1000)]), lambda r, e: None)
        with pytest.raises(EntryNotApplied) as raised:
            tick_until(replica, lambda: False)
        assert raised.value.index == index
        assert isinstance(raised.value.__cause__, OSError)
        assert replica.raftLastApplied == index - 1
        replica.machine.apply_entry = healthy  # type: ignore[method-assign]
    finally:
        replica.destroy()


def test_a_failing_callback_does_not_apply_the_entry_twice(tmp_path: Path) -> None:
    applied: list[int] = []
    replica = make_replica(tmp_path, f"127.0.0.1:{free_ports(1)[0]}", applied)
    calls: list[int] = []

    def failing(result: list[Outcome] | None, error: ErrorCode) -> None:
        calls.append(error)
        raise RuntimeError("a bug in a caller")

    try:
        tick_until(replica, replica.is_leader)
        replica.propose(
            replica.raftCurrentTerm, encode_entry([AllocatePidBlock(0, 1, 1000)]), failing
        )
        tick_until(replica, lambda: calls != [])
        for _ in range(20):
            replica.doTick(0.005)
        assert calls == [ErrorCode.NONE]
        assert len(applied) == 1 and replica.machine.state.pids.next_seq == 1
    finally:
        replica.destroy()
