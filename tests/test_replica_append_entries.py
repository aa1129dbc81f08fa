"""AppendEntries on a follower replica: only a real conflict deletes entries,
never below the commit index, and a large entry (sent in chunks) arrives whole.

The first tests deliver hand-made AppendEntries through the replica's
transport, the way pysyncobj delivers a message from the leader; the last one
runs a leader and a follower over TCP on 127.0.0.1.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.node import TCPNode

from fsm import AllocatePidBlock, ErrorCode, InitProducerId, TransactionStateMachine, encode_entry
from raftcoord.cluster.launcher import free_ports
from raftcoord.coordinator import raft_journal
from raftcoord.coordinator.raft import RaftTransportSettings, raft_conf
from raftcoord.coordinator.replica import APPEND_ENTRIES, ShardReplica

#: The members' Raft key (any 32 bytes; every member of a test uses it).
RAFT_KEY = bytes(range(32))

pytestmark = pytest.mark.usefixtures("pysyncobj_restored")

NO_OP = b"\x01"  # pysyncobj's no-op command: applying it changes nothing
TERM = 5


def make_replica(
    tmp_path: Path, address: str, partners: list[str], election_timeout_s: float
) -> ShardReplica:
    journal, dump = str(tmp_path / f"{address}.journal"), str(tmp_path / f"{address}.snapshot")
    raft_journal.install()
    raft_journal.register_journal(journal, "always", snapshot_file=dump)
    conf = raft_conf(
        0.01,
        (election_timeout_s, election_timeout_s * 2),
        journal,
        dump,
        connection_timeout_s=election_timeout_s * 2,
        connection_retry_s=0.05,
    )
    machine = TransactionStateMachine(3, 4)
    return ShardReplica(
        address,
        partners,
        conf,
        machine,
        lambda *_: None,
        node_id=2,
        transport=RaftTransportSettings(RAFT_KEY),
    )


def tick_until(
    replicas: list[ShardReplica], condition: Callable[[], bool], timeout_s: float = 10
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        for replica in replicas:
            replica.doTick(0.002)


class Follower:
    """A replica whose leader is the test: messages go in through its
    transport, its answers are collected in ``sent``."""

    def __init__(self, replica: ShardReplica, monkeypatch: pytest.MonkeyPatch) -> None:
        self.replica = replica
        self.transport = replica._SyncObj__transport
        self.leader = TCPNode(f"127.0.0.1:{free_ports(1)[0]}")
        self.sent: list[dict[str, Any]] = []
        monkeypatch.setattr(self.transport, "send", self._send)

    def _send(self, node: Any, message: dict[str, Any]) -> bool:
        self.sent.append(message)
        return True

    def append(
        self, prev: int, prev_term: int, entries: list[tuple[int, int]], commit: int, term: int
    ) -> list[dict[str, Any]]:
        """Deliver AppendEntries carrying no-op entries given as (index, term);
        returns the follower's answers to it."""
        self.sent.clear()
        message = {
            "type": APPEND_ENTRIES,
            "term": term,
            "commit_index": commit,
            "entries": [(NO_OP, index, entry_term) for index, entry_term in entries],
            "prevLogIdx": prev,
            "prevLogTerm": prev_term,
        }
        self.transport._onMessageReceived(self.leader, message)
        return list(self.sent)

    def log(self) -> list[tuple[int, int]]:
        return [(entry[1], entry[2]) for entry in self.replica._SyncObj__raftLog[:]]

    def apply_committed(self) -> None:
        tick_until(
            [self.replica], lambda: self.replica.raftLastApplied >= self.replica.raftCommitIndex
        )


def acks(answers: list[dict[str, Any]]) -> list[tuple[int, bool]]:
    return [(a["next_node_idx"], a["success"]) for a in answers if a["type"] == "next_node_idx"]


@pytest.fixture
def follower(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Follower]:
    # Partners that never answer and an election timeout far beyond the test:
    # the replica stays a follower of whoever sends it AppendEntries.
    partners = [f"127.0.0.1:{port}" for port in free_ports(2)]
    replica = make_replica(tmp_path, f"127.0.0.1:{free_ports(1)[0]}", partners, 600.0)
    try:
        yield Follower(replica, monkeypatch)
    finally:
        replica.destroy()


def test_stale_shorter_append_entries_keeps_the_acknowledged_entries(
    follower: Follower, caplog: pytest.LogCaptureFixture
) -> None:
    full = [(i, TERM) for i in range(2, 7)]
    assert acks(follower.append(1, 0, full, commit=1, term=TERM)) == [(7, True)]
    assert acks(follower.append(6, TERM, [], commit=6, term=TERM)) == [(7, True)]
    follower.apply_committed()
    assert follower.replica.raftLastApplied == 6
    before = follower.log()

    # The leader resends from an older nextIndex with a smaller batch: every
    # entry is already here, and so are the ones after it.
    with caplog.at_level(logging.WARNING):
        answers = follower.append(2, TERM, [(3, TERM), (4, TERM)], commit=4, term=TERM)

    assert follower.log() == before == [(1, 0), *full]
    assert acks(answers) == [(5, True)]  # what the message vouches for, as pysyncobj answers
    assert follower.replica.raftCommitIndex == 6  # never lowered
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]

    # A heartbeat from an older nextIndex: same, nothing deleted.
    assert acks(follower.append(4, TERM, [], commit=6, term=TERM)) == [(5, True)]
    assert follower.log() == before


def test_duplicate_entries_are_not_rewritten_and_new_ones_are_appended(follower: Follower) -> None:
    follower.append(1, 0, [(2, TERM), (3, TERM)], commit=1, term=TERM)
    journal = follower.replica._SyncObj__raftLog
    writes = journal.entry_sync_count  # one per journal change under "always"
    answers = follower.append(1, 0, [(2, TERM), (3, TERM), (4, TERM)], commit=3, term=TERM)
    assert acks(answers) == [(5, True)]
    assert follower.log() == [(1, 0), (2, TERM), (3, TERM), (4, TERM)]
    assert follower.replica.raftCommitIndex == 3
    assert journal.entry_sync_count == writes + 1  # entry 4 added; 2 and 3 left alone


def test_commit_index_stops_at_the_last_entry_the_message_vouches_for(
    follower: Follower,
) -> None:
    # Entries 5 and 6 of an old term may not be the leader's: a heartbeat
    # that vouches only up to 4 must not commit them.
    follower.append(1, 0, [(2, TERM), (3, TERM), (4, TERM), (5, 4), (6, 4)], commit=1, term=TERM)
    assert acks(follower.append(4, TERM, [], commit=6, term=TERM + 1)) == [(5, True)]
    assert follower.replica.raftCommitIndex == 4
    assert follower.log()[-1] == (6, 4)


def test_conflict_above_the_commit_index_deletes_from_the_conflict_and_is_logged(
    follower: Follower, caplog: pytest.LogCaptureFixture
) -> None:
    follower.append(1, 0, [(i, TERM) for i in range(2, 9)], commit=6, term=TERM)
    follower.apply_committed()
    with caplog.at_level(logging.WARNING, logger="raftcoord.coordinator.replica"):
        answers = follower.append(5, TERM, [(6, TERM), (7, TERM + 1)], commit=6, term=TERM + 1)
    assert follower.log() == [(1, 0), *[(i, TERM) for i in range(2, 7)], (7, TERM + 1)]
    assert acks(answers) == [(8, True)]
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "node=2 shard=3 event=raft_log_conflict index=7 term=5 leader_entry_term=6" in (
        record.getMessage()
    )


def test_conflict_at_a_committed_index_deletes_nothing_and_is_not_acknowledged(
    follower: Follower, caplog: pytest.LogCaptureFixture
) -> None:
    follower.append(1, 0, [(i, TERM) for i in range(2, 7)], commit=6, term=TERM)
    follower.apply_committed()
    before = follower.log()
    with caplog.at_level(logging.WARNING, logger="raftcoord.coordinator.replica"):
        for _ in range(3):  # the leader retries; one log line
            answers = follower.append(2, TERM, [(3, TERM + 1)], commit=6, term=TERM + 1)
            assert acks(answers) == []
            assert follower.log() == before
    [record] = caplog.records
    assert record.levelno == logging.CRITICAL
    assert "node=2 shard=3 event=raft_committed_conflict index=3" in record.getMessage()
    assert follower.replica.raftCurrentTerm == TERM + 1  # still follows the leader


def test_a_large_non_ascii_entry_replicates_in_chunks(tmp_path: Path) -> None:
    # Over 64 KiB (pysyncobj's appendEntriesBatchSizeBytes) the leader sends
    # the entry in chunks of its pickle, whose "finish" mark came too early.
    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
    replicas = [
        make_replica(tmp_path, address, [a for a in addresses if a != address], 0.2)
        for address in addresses
    ]
    try:
        tick_until(replicas, lambda: any(r.is_leader() for r in replicas))
        leader = next(r for r in replicas if r.is_leader())
        follower = next(r for r in replicas if r is not leader)
        term = leader.raftCurrentTerm
        results: list[Any] = []

        def done(result: Any, error: ErrorCode) -> None:
            assert error == ErrorCode.NONE
            results.append(result)

        layout = leader.machine.state.pids.layout
        block = AllocatePidBlock(layout.shard, layout.shard_count, layout.block_size)
        leader.propose(term, encode_entry([block]), done)
        tick_until(replicas, lambda: len(results) == 1)
        big_id = "é" * 40_000
        command = InitProducerId(big_id, 60_000, 1, term, new_producer_id=results[0][0].block_first)
        leader.propose(term, encode_entry([command]), done)
        tick_until(replicas, lambda: len(results) == 2)
        assert all(outcome.ok for result in results for outcome in result), results
        tick_until(replicas, lambda: follower.raftLastApplied == leader.raftLastApplied)
        assert follower.machine.describe(big_id) is not None
        assert follower.machine.snapshot() == leader.machine.snapshot()
    finally:
        for replica in replicas:
            replica.destroy()
