"""Shard replicas talking over the Raft transport, in one process on loopback.

Real sockets, real pysyncobj, real journals; the test ticks the replicas in
turn. What the transport promises its members: nothing that arrives is
unpickled (elections, entries, a large entry, a snapshot sent to a member
that joins late), a member without the cluster key never gets in, and a
member without authentication and one with it do not talk.
"""

from __future__ import annotations

import logging
import pickle
import time
import traceback
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pysyncobj.pickle
import pytest

from fsm import AllocatePidBlock, ErrorCode, InitProducerId, TransactionStateMachine, encode_entry
from raftcoord.cluster.launcher import free_ports
from raftcoord.coordinator import raft_journal
from raftcoord.coordinator.raft import RaftTransportSettings, raft_conf
from raftcoord.coordinator.replica import ShardReplica

KEY = bytes(range(32))

pytestmark = pytest.mark.usefixtures("pysyncobj_restored")


class Group:
    """Replicas of one shard on loopback, ticked by the test."""

    def __init__(self, tmp_path: Path, size: int) -> None:
        self.tmp_path = tmp_path
        self.addresses = [f"127.0.0.1:{port}" for port in free_ports(size)]
        self.replicas: dict[str, ShardReplica] = {}

    def start(self, address: str, key: bytes | None) -> ShardReplica:
        where = self.tmp_path / address.replace(":", "-")
        where.mkdir(parents=True, exist_ok=True)
        journal, dump = str(where / "journal"), str(where / "snapshot")
        raft_journal.install()
        raft_journal.register_journal(journal, "always", snapshot_file=dump)
        conf = raft_conf(0.01, (0.5, 0.9), journal, dump)
        replica = ShardReplica(
            address,
            [a for a in self.addresses if a != address],
            conf,
            TransactionStateMachine(0, 1),
            lambda index, term, outcomes: None,
            node_id=1 + self.addresses.index(address),
            transport=RaftTransportSettings(key),
        )
        self.replicas[address] = replica
        return replica

    def tick_until(self, condition: Callable[[], bool], timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, "condition not reached"
            for replica in list(self.replicas.values()):
                replica.doTick(0.002)

    def tick_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for replica in list(self.replicas.values()):
                replica.doTick(0.002)

    def leader(self) -> ShardReplica | None:
        return next((r for r in self.replicas.values() if r.is_leader()), None)

    def stop(self) -> None:
        for replica in self.replicas.values():
            replica.destroy()


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    made = Group(tmp_path, 3)
    try:
        yield made
    finally:
        made.stop()


#: Where an unpickle may happen: the sender joining pysyncobj's chunks of
#: its own large entry (its own bytes, never a socket's).
ALLOWED_UNPICKLE = ("_joined_entry",)


def test_nothing_a_member_receives_is_unpickled(
    group: Group, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Elections, entries, a 3 MiB entry, log compaction and a snapshot sent
    to a member that joins late: every unpickle and decompress made in the
    process is listed with its caller, and none is on a receiving path."""
    calls: list[str] = []

    def trap(real: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            calls.append("".join(traceback.format_stack(limit=12)))
            return real(*args, **kwargs)

        return recorded

    monkeypatch.setattr(pickle, "loads", trap(pickle.loads))
    monkeypatch.setattr(pysyncobj.pickle, "loads", trap(pysyncobj.pickle.loads))
    monkeypatch.setattr(zlib, "decompress", trap(zlib.decompress))

    first, second, late = group.addresses
    group.start(first, KEY)
    group.start(second, KEY)
    group.tick_until(lambda: group.leader() is not None)
    leader = group.leader()
    assert leader is not None
    term = leader.raftCurrentTerm
    done: list[ErrorCode] = []
    leader.propose(term, encode_entry([AllocatePidBlock(0, 1, 1000)]), lambda r, e: None)
    for i in range(300):
        command = InitProducerId(f"transactional-{i:04d}", 1000, 1, term, new_producer_id=i)
        leader.propose(term, encode_entry([command]), lambda r, e: done.append(e))
    big = InitProducerId("large-" + "x" * (3 << 20), 1000, 1, term, new_producer_id=300)
    leader.propose(term, encode_entry([big]), lambda r, e: done.append(e))
    group.tick_until(lambda: len(done) == 301)
    assert set(done) == {ErrorCode.NONE}
    follower = next(r for r in group.replicas.values() if r is not leader)
    group.tick_until(lambda: follower.raftLastApplied == leader.raftLastApplied)
    assert follower.machine.snapshot() == leader.machine.snapshot()

    first_index = leader._log_entries()[0][1]
    leader.forceLogCompaction()
    group.tick_until(lambda: leader._log_entries()[0][1] > first_index)
    expected = leader.machine.snapshot()
    joined = group.start(late, KEY)
    group.tick_until(lambda: joined.machine.snapshot() == expected)

    receiving = [c for c in calls if not any(name in c for name in ALLOWED_UNPICKLE)]
    assert not receiving, receiving[0]
    assert any("_joined_entry" in c for c in calls), "the 3 MiB entry went another way"


def test_a_member_without_the_cluster_key_never_gets_in(
    group: Group, caplog: pytest.LogCaptureFixture
) -> None:
    """Two members elect a leader; the third, with another key, is dropped at
    every attempt (logged with its address) and never hears of the leader,
    nor does its own campaigning disturb the others' term."""
    first, second, stranger = group.addresses
    with caplog.at_level(logging.WARNING, logger="raftcoord.coordinator.raft_transport"):
        group.start(first, KEY)
        group.start(second, KEY)
        outsider = group.start(stranger, bytes(32))
        group.tick_until(lambda: group.leader() not in (None, outsider))
        leader = group.leader()
        assert leader is not None
        term = leader.raftCurrentTerm
        group.tick_for(2.0)
    assert leader.is_leader() and leader.raftCurrentTerm == term
    assert outsider.leader_address() is None and not outsider.is_leader()
    dropped = [r.getMessage() for r in caplog.records if "raft_peer_dropped" in r.getMessage()]
    assert any("wrong MAC" in m for m in dropped), dropped


def test_members_without_authentication_talk_only_to_each_other(
    group: Group, caplog: pytest.LogCaptureFixture
) -> None:
    """``--insecure-raft`` members elect a leader among themselves; a member
    with a key refuses them and they refuse it, saying why."""
    first, second, keyed = group.addresses
    with caplog.at_level(logging.WARNING, logger="raftcoord.coordinator.raft_transport"):
        group.start(first, None)
        group.start(second, None)
        other = group.start(keyed, KEY)
        group.tick_until(lambda: group.leader() not in (None, other))
        group.tick_for(1.0)
    assert other.leader_address() is None
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "insecure-raft" in messages or "authenticates" in messages
