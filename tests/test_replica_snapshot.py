"""A shard replica compacts its log into the state machine's msgpack snapshot
and a restarted replica rebuilds the same state from snapshot + journal.

The snapshot is encoded and written by a background thread; the tests hold
that thread at a gate (a wrapped ``snapshot_pieces``) to look at the replica
while the write is under way, and never wait on time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fsm import (
    AllocatePidBlock,
    ErrorCode,
    InitProducerId,
    Outcome,
    ShardState,
    TransactionStateMachine,
    encode_entry,
    snapshot_pieces,
)
from raftcoord.cluster.launcher import free_ports
from raftcoord.coordinator import raft_journal
from raftcoord.coordinator import replica as replica_module
from raftcoord.coordinator.raft import RaftTransportSettings, raft_conf, voters_data
from raftcoord.coordinator.replica import (
    EntryNotApplied,
    ShardReplica,
    SnapshotDamaged,
    read_snapshot_file,
)

#: The members' Raft key (any 32 bytes; every member of a test uses it).
RAFT_KEY = bytes(range(32))
#: The data directory id of the replicas.
DIRECTORY = "d" * 32

pytestmark = pytest.mark.usefixtures("pysyncobj_restored")


def make_replica(
    tmp_path: Path,
    address: str,
    applied: list[int],
    partners: list[str] | None = None,
    election_timeout_s: tuple[float, float] = (0.05, 0.1),
    snapshots: list[tuple[int, int]] | None = None,
) -> ShardReplica:
    tmp_path.mkdir(parents=True, exist_ok=True)
    journal, dump = str(tmp_path / "journal"), str(tmp_path / "snapshot")
    raft_journal.install()
    raft_journal.register_journal(journal, "always", snapshot_file=dump)
    conf = raft_conf(0.01, election_timeout_s, journal, dump)
    machine = TransactionStateMachine(0, 1)
    return ShardReplica(
        address,
        partners or [],
        conf,
        machine,
        lambda index, term, outcomes: applied.append(index),
        node_id=1,
        transport=RaftTransportSettings(RAFT_KEY, directory_id=DIRECTORY),
        on_snapshot=None if snapshots is None else lambda i, t: snapshots.append((i, t)),
    )


def tick_until(
    replica: ShardReplica,
    condition: Callable[[], bool],
    timeout_s: float = 10,
    *,
    leader_duties: bool = False,
) -> None:
    """Tick until ``condition``; ``leader_duties``: with the replica's own
    duties (its voters record), not only pysyncobj's."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        if leader_duties:
            replica.tick(0.005)
        else:
            replica.doTick(0.005)


def test_compaction_writes_msgpack_and_restart_restores(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_ports(1)[0]}"
    applied: list[int] = []
    replica = make_replica(tmp_path, address, applied)
    results: list[list[Outcome]] = []
    try:
        tick_until(replica, replica.is_leader)
        # The voters record, then the log's prefix that holds it compacted:
        # the snapshot carries the record.
        tick_until(replica, lambda: replica._applied_record is not None, leader_duties=True)
        assert replica.voters_record() == {address: DIRECTORY}
        term = replica.raftCurrentTerm

        def done(result: list[Outcome] | None, error: ErrorCode) -> None:
            assert error == ErrorCode.NONE
            results.append(result)

        replica.propose(term, encode_entry([AllocatePidBlock(0, 1, 1000)]), done)
        for i in range(20):
            command = InitProducerId(f"t{i}", 1000, 1, term, new_producer_id=i)
            replica.propose(term, encode_entry([command]), done)
        tick_until(replica, lambda: len(results) == 21)
        assert all(o.ok for r in results for o in r)
        expected = replica.machine.snapshot()
        replica.forceLogCompaction()
        tick_until(replica, lambda: (tmp_path / "snapshot").exists())
        payload = read_snapshot_file(str(tmp_path / "snapshot"))
        assert set(payload) == {"v", "voters", "fsm", "last", "previous"}
        assert TransactionStateMachine.restore(payload["fsm"]).snapshot() == expected
        tick_until(replica, lambda: replica.log_entry_count() < 5)
    finally:
        replica.destroy()
    applied.clear()
    again = make_replica(tmp_path, address, applied)
    try:
        tick_until(again, lambda: again.machine.snapshot() == expected)
        assert len(again.machine.state.transactions) == 20
        assert not any(voters_data(c) for c, _i, _t in again._log_entries()[:])
        assert again.voters_record() == {address: DIRECTORY}
    finally:
        again.destroy()

    # One flipped byte: the replica refuses to go on (pysyncobj alone would
    # log the failed load and carry on with an empty state).
    data = bytearray((tmp_path / "snapshot").read_bytes())
    data[len(data) // 2] ^= 0x10
    (tmp_path / "snapshot").write_bytes(bytes(data))
    damaged = make_replica(tmp_path, address, [])
    try:
        with pytest.raises(SnapshotDamaged, match="checksum"):
            damaged.tick(0.001)
    finally:
        damaged.destroy()


def test_a_stopped_replica_answers_the_entries_it_had_not_applied(tmp_path: Path) -> None:
    """Queued, or appended and not yet committed: each proposal is answered
    NOT_COORDINATOR when the replica stops, so no request waits on it."""
    replica = make_replica(tmp_path, f"127.0.0.1:{free_ports(1)[0]}", [])
    answers: list[ErrorCode] = []
    try:
        tick_until(replica, replica.is_leader)
        term = replica.raftCurrentTerm
        replica.propose(term, encode_entry([AllocatePidBlock(0, 1, 1000)]), lambda r, e: None)
        tick_until(replica, lambda: replica.raftLastApplied == replica.raftCommitIndex)
        for i in range(3):
            command = InitProducerId(f"t{i}", 1000, 1, term, new_producer_id=i)
            replica.propose(term, encode_entry([command]), lambda r, e: answers.append(e))
    finally:
        replica.destroy()
    assert answers == [ErrorCode.NOT_COORDINATOR] * 3


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


class Gate:
    """Holds the snapshot writer at the start of its encoding until opened."""

    def __init__(self, fail: bool = False) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.fail = fail
        self.encoded: list[bytes] = []

    def pieces(self, state: ShardState) -> Iterator[bytes]:
        self.entered.set()
        assert self.opened.wait(10), "the test never opened the gate"
        if self.fail:
            raise OSError("disk full")
        pieces = list(snapshot_pieces(state))
        self.encoded.append(b"".join(pieces))
        yield from pieces


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    held = Gate()
    monkeypatch.setattr(replica_module, "snapshot_pieces", held.pieces)
    yield held
    held.opened.set()  # never leave a writer thread waiting


def init_entries(replica: ShardReplica, first: int, count: int) -> None:
    """Propose and apply InitProducerId for t<first>..t<first+count-1>."""
    term = replica.raftCurrentTerm
    done: list[ErrorCode] = []
    for i in range(first, first + count):
        command = InitProducerId(f"t{i}", 1000, 1, term, new_producer_id=i)
        replica.propose(term, encode_entry([command]), lambda r, e: done.append(e))
    tick_until(replica, lambda: len(done) == count)
    assert set(done) == {ErrorCode.NONE}


def started(tmp_path: Path, address: str) -> ShardReplica:
    replica = make_replica(tmp_path, address, [])
    tick_until(replica, replica.is_leader)
    return replica


def snapshot_fsm(path: Path) -> bytes:
    payload = read_snapshot_file(str(path))
    return TransactionStateMachine.restore(payload["fsm"]).snapshot()


def first_log_index(replica: ShardReplica) -> int:
    return int(replica._log_entries()[0][1])


def test_the_snapshot_is_the_state_when_taken_while_entries_keep_applying(
    tmp_path: Path, gate: Gate
) -> None:
    address = f"127.0.0.1:{free_ports(1)[0]}"
    replica = started(tmp_path, address)
    try:
        replica.propose(
            replica.raftCurrentTerm, encode_entry([AllocatePidBlock(0, 1, 1000)]), lambda r, e: None
        )
        init_entries(replica, 0, 20)
        taken = replica.machine.snapshot()
        first = first_log_index(replica)
        replica.forceLogCompaction()
        tick_until(replica, gate.entered.is_set)
        # The tick thread goes on while the writer is held: more entries apply.
        init_entries(replica, 20, 10)
        later = replica.machine.snapshot()
        assert later != taken
        assert not (tmp_path / "snapshot").exists()
        assert first_log_index(replica) == first  # the journal keeps every entry
        gate.opened.set()
        tick_until(replica, lambda: first_log_index(replica) > first)
        assert snapshot_fsm(tmp_path / "snapshot") == taken
        assert gate.encoded == [taken]
    finally:
        gate.opened.set()
        replica.destroy()
    again = started(tmp_path, address)
    try:
        tick_until(again, lambda: again.machine.snapshot() == later)
    finally:
        again.destroy()


def test_a_failed_snapshot_write_keeps_the_previous_snapshot_and_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"127.0.0.1:{free_ports(1)[0]}"
    replica = started(tmp_path, address)
    failing = Gate(fail=True)
    try:
        replica.propose(
            replica.raftCurrentTerm, encode_entry([AllocatePidBlock(0, 1, 1000)]), lambda r, e: None
        )
        init_entries(replica, 0, 5)
        replica.forceLogCompaction()
        first = first_log_index(replica)
        tick_until(replica, lambda: first_log_index(replica) > first)
        previous = (tmp_path / "snapshot").read_bytes()
        init_entries(replica, 5, 5)
        expected = replica.machine.snapshot()
        first = first_log_index(replica)
        monkeypatch.setattr(replica_module, "snapshot_pieces", failing.pieces)
        replica.forceLogCompaction()
        tick_until(replica, failing.entered.is_set)
        failing.opened.set()
        replica._snapshots.wait()
        for _ in range(5):
            replica.doTick(0.005)
        assert (tmp_path / "snapshot").read_bytes() == previous
        assert not (tmp_path / "snapshot.tmp").exists()
        assert first_log_index(replica) == first
    finally:
        failing.opened.set()
        replica.destroy()
    monkeypatch.undo()
    # What a process killed in the middle of a write leaves behind.
    (tmp_path / "snapshot.tmp").write_bytes(b"half a snapshot")
    again = started(tmp_path, address)
    try:
        tick_until(again, lambda: again.machine.snapshot() == expected)
        assert not (tmp_path / "snapshot.tmp").exists()
    finally:
        again.destroy()


def test_a_restart_between_the_snapshot_and_the_compaction_keeps_the_log_tail(
    tmp_path: Path, gate: Gate
) -> None:
    """The new snapshot is durable but the journal was not compacted yet (the
    tick that would have done it never ran): the restarted replica rebuilds
    the state from the snapshot plus the entries after it."""
    address = f"127.0.0.1:{free_ports(1)[0]}"
    replica = started(tmp_path, address)
    try:
        replica.propose(
            replica.raftCurrentTerm, encode_entry([AllocatePidBlock(0, 1, 1000)]), lambda r, e: None
        )
        init_entries(replica, 0, 20)
        taken = replica.machine.snapshot()
        first = first_log_index(replica)
        replica.forceLogCompaction()
        tick_until(replica, gate.entered.is_set)
        init_entries(replica, 20, 10)
        expected = replica.machine.snapshot()
        gate.opened.set()
        replica._snapshots.wait()  # written and renamed; no tick compacts the journal
        assert snapshot_fsm(tmp_path / "snapshot") == taken
        assert first_log_index(replica) == first
    finally:
        gate.opened.set()
        replica.destroy()
    again = started(tmp_path, address)
    try:
        tick_until(again, lambda: again.raftLastApplied >= replica.raftLastApplied)
        assert again.machine.snapshot() == expected
        assert len(again.machine.state.transactions) == 30
    finally:
        again.destroy()


def test_a_lagging_follower_receives_a_large_snapshot_in_chunks(tmp_path: Path) -> None:
    """A replica that joins after the leader compacted its log gets the
    snapshot (larger than one transfer chunk) and reaches the same state.
    The election timeout is long enough that a loaded machine ticking the
    replicas in turn does not elect anew in the middle (2000 proposals)."""
    addresses = [f"127.0.0.1:{port}" for port in free_ports(3)]
    election_s = (0.5, 0.9)  # pysyncobj: at most its connection timeout, 1 s
    replicas = [
        make_replica(
            tmp_path / f"r{i}", address, [], [a for a in addresses if a != address], election_s
        )
        for i, address in enumerate(addresses[:2])
    ]
    late: ShardReplica | None = None

    def tick_all(condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline, "condition not reached"
            for r in [*replicas, *([late] if late else [])]:
                r.doTick(0.002)

    try:
        tick_all(lambda: any(r.is_leader() for r in replicas))
        leader = next(r for r in replicas if r.is_leader())
        term = leader.raftCurrentTerm
        done: list[ErrorCode] = []
        leader.propose(term, encode_entry([AllocatePidBlock(0, 1, 1000)]), lambda r, e: None)
        for i in range(2000):
            if i and i % 1000 == 0:
                leader.propose(
                    term, encode_entry([AllocatePidBlock(0, 1, 1000)]), lambda r, e: None
                )
            command = InitProducerId(f"transactional-{i:06d}", 1000, 1, term, new_producer_id=i)
            leader.propose(term, encode_entry([command]), lambda r, e: done.append(e))
        tick_all(lambda: len(done) == 2000)
        assert set(done) == {ErrorCode.NONE}
        first = first_log_index(leader)
        leader.forceLogCompaction()
        tick_all(lambda: first_log_index(leader) > first)
        size = (tmp_path / f"r{replicas.index(leader)}" / "snapshot").stat().st_size
        assert size > leader._snapshots._chunk_bytes
        expected = leader.machine.snapshot()
        installed: list[tuple[int, int]] = []
        late = make_replica(tmp_path / "r2", addresses[2], [], addresses[:2], election_s, installed)
        tick_all(lambda: late is not None and late.machine.snapshot() == expected)
        assert leader.is_leader() and leader.raftCurrentTerm == term
        # The follower is told the snapshot's last entry (its transitions log
        # says the entries up to it came by snapshot).
        last = read_snapshot_file(str(tmp_path / f"r{replicas.index(leader)}" / "snapshot"))
        assert installed == [(last["last"][1], last["last"][2])]
        assert installed[0][0] > 2000
    finally:
        for r in [*replicas, *([late] if late else [])]:
            r.destroy()
