"""What a shard leader does for consumer groups (one real single-node Raft
replica): its group sweeper proposes no second GroupTimeouts for a group
whose first is queued or in flight, and requests waiting for a group's
change wake when an entry applies."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fsm import (
    ErrorCode,
    FsmConfig,
    GroupProtocol,
    JoinGroup,
    Outcome,
    TransactionStateMachine,
)
from raftcoord.cluster.launcher import free_ports
from raftcoord.coordinator import raft_journal
from raftcoord.coordinator.leader import Stamp
from raftcoord.coordinator.raft import RaftTransportSettings, raft_conf
from raftcoord.coordinator.replica import ShardReplica
from raftcoord.coordinator.shard import Shard, ShardTimers, TransitionsLog

#: The members' Raft key (any 32 bytes; every member of a test uses it).
RAFT_KEY = bytes(range(32))

pytestmark = pytest.mark.usefixtures("pysyncobj_restored")

SESSION_MS = 1


@pytest.fixture
def shard(tmp_path: Path) -> Iterator[Shard]:
    journal, dump = str(tmp_path / "journal"), str(tmp_path / "snapshot")
    raft_journal.install()
    raft_journal.register_journal(journal, "always", snapshot_file=dump)
    conf = raft_conf(0.01, (0.05, 0.1), journal, dump)
    machine = TransactionStateMachine(0, 1, FsmConfig(group_min_session_timeout_ms=SESSION_MS))
    address = f"127.0.0.1:{free_ports(1)[0]}"

    def replica(
        on_applied: Callable[[int, int, list[Outcome]], None],
        on_snapshot: Callable[[int, int], None],
    ) -> ShardReplica:
        return ShardReplica(
            address,
            [],
            conf,
            machine,
            on_applied,
            node_id=1,
            transport=RaftTransportSettings(RAFT_KEY),
            on_snapshot=on_snapshot,
        )

    made = Shard(
        0,
        1,
        replica,
        TransitionsLog(tmp_path / "transitions.jsonl", 0),
        ShardTimers(60_000, 60_000, 1_000),
        lambda _shard, _markers: None,
    )
    try:
        tick_until(made, lambda: made.availability() is ErrorCode.NONE)
        yield made
    finally:
        made.replica.destroy()
        made.transitions.close()


def tick_until(shard: Shard, condition: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        shard.tick(0.005)


def first_join(stamp: Stamp) -> JoinGroup:
    protocols = (GroupProtocol("range", b""),)
    return JoinGroup(
        "g", "", "", "client", "consumer", protocols, SESSION_MS, 1_000, "m", stamp.now_ms
    )


def queued(shard: Shard) -> int:
    return shard._queue.qsize()


def test_a_due_group_gets_one_group_timeouts_until_it_is_answered(shard: Shard) -> None:
    joined = shard.submit(first_join)
    tick_until(shard, joined.done)
    assert joined.result().error is ErrorCode.MEMBER_ID_REQUIRED
    later = shard.clock.now_ms() + 10 * SESSION_MS  # the pending member id has lapsed
    assert shard.replica.query(lambda m: m.groups_due(later, 0)) == ["g"]
    before = queued(shard)
    for _ in range(3):  # three sweeps before the first GroupTimeouts is proposed
        shard._next_group_sweep = 0
        shard._sweep(later)
    assert queued(shard) == before + 1
    tick_until(
        shard, lambda: not shard.replica.query(lambda m: m.groups_due(shard.clock.now_ms(), 0))
    )
    group = shard.replica.query(lambda m: m.group("g"))
    assert group is not None and not group.pending
    assert not shard._group_timeouts_pending  # answered: the next one may go


def test_a_change_wakes_its_waiters(shard: Shard) -> None:
    seen = shard.change_count()
    assert shard.await_change(seen, 0.01) == seen  # nothing applied: the wait ends empty
    joined = shard.submit(first_join)
    tick_until(shard, joined.done)
    assert shard.await_change(seen, 10) > seen


def test_a_transitions_line_cut_short_by_a_crash_is_removed_when_the_log_opens(
    tmp_path: Path,
) -> None:
    path = tmp_path / "transitions.jsonl"
    whole = '{"index": 7, "term": 2, "shard": 0}\n'
    path.write_text(whole + '{"index": 8, "te')
    log = TransitionsLog(path, 0)
    try:
        assert path.read_text() == whole  # the next entry starts on a line of its own
        assert log.last_index == 7
    finally:
        log.close()
    path.write_text('{"index": 9')  # nothing whole at all
    TransitionsLog(path, 0).close()
    assert path.read_text() == ""
    path.write_text(whole)  # a whole last line stays
    TransitionsLog(path, 0).close()
    assert path.read_text() == whole


def test_a_snapshot_beyond_the_last_line_is_written_as_a_marker(tmp_path: Path) -> None:
    path = tmp_path / "transitions.jsonl"
    path.write_text('{"index": 7, "term": 2, "shard": 0}\n')
    log = TransitionsLog(path, 3)
    try:
        log.snapshot(5, 2)  # its own snapshot, older than its last line: nothing
        log.snapshot(30_000, 4)  # the leader's, far ahead
        log.snapshot(30_000, 4)  # once
    finally:
        log.close()
    lines = path.read_text().splitlines()
    assert lines[1:] == ['{"index":30000,"term":4,"shard":3,"snapshot":true}']
    reopened = TransitionsLog(path, 3)
    reopened.close()
    assert reopened.last_index == 30_000


def test_a_follower_that_knows_its_leader_waits_longer_between_ticks(
    shard: Shard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leaders keep their timers every tick; a follower hearing from its
    leader (whose heartbeats wake it) waits up to follower_wait_ms, and
    one without a leader (an election is due) every tick again."""
    waits: list[float] = []
    monkeypatch.setattr(shard.timers, "follower_wait_ms", 75.0)
    monkeypatch.setattr(shard.replica, "tick", waits.append)
    shard.tick(0.005)
    monkeypatch.setattr(shard.replica, "is_leader", lambda: False)
    monkeypatch.setattr(shard.replica, "leader_address", lambda: "127.0.0.1:1")
    shard.tick(0.005)
    monkeypatch.setattr(shard.replica, "leader_address", lambda: None)
    shard.tick(0.005)
    assert waits == [0.005, 0.075, 0.005]


def test_stopping_answers_the_requests_of_an_entry_not_yet_applied(shard: Shard) -> None:
    """The node stops while an entry is in flight (its tick thread has ended,
    so the entry never applies here): its requests are answered
    NOT_COORDINATOR at once, not when their handlers' wait times out (a
    handler still waiting holds up the process's exit)."""
    joined = shard.submit(first_join)
    shard.tick(0)  # proposed, not yet applied
    assert not joined.done()
    shard.stop()
    assert joined.result(timeout=0).error is ErrorCode.NOT_COORDINATOR


def test_stopping_wakes_the_waiters_for_a_change(shard: Shard) -> None:
    seen = shard.change_count()
    waited: list[int] = []
    waiter = threading.Thread(target=lambda: waited.append(shard.await_change(seen, 30)))
    waiter.start()
    shard.stop()
    waiter.join(10)
    assert waited and waited[0] > seen
    assert shard.submit(first_join).result(timeout=0).error is ErrorCode.NOT_COORDINATOR
