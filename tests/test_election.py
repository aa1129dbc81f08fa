"""Pre-vote and check-quorum (raftcoord.coordinator.election, RaftGroup).

The rules first, as pure functions; then a replica answering pre-votes
delivered through its transport; then shard replicas in one process on
loopback, ticked by the test (real sockets, real pysyncobj, real journals),
where a member the test stops ticking is paused as a stopped process is.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.node import TCPNode

from raftcoord.cluster.launcher import free_ports
from raftcoord.coordinator.election import (
    PreVoteRound,
    grants_pre_vote,
    log_up_to_date,
    majority,
    quorum_heard,
)
from raftcoord.coordinator.replica import ShardReplica
from tests.test_raft_transport_members import KEY, Group
from tests.test_replica_append_entries import Follower, make_replica

pytestmark = pytest.mark.usefixtures("pysyncobj_restored")

DIRECTORY = "0123456789abcdef0123456789abcdef"
OTHER_DIRECTORY = "fedcba9876543210fedcba9876543210"

# --- the rules ---------------------------------------------------------------------------


def test_a_majority_is_more_than_half() -> None:
    assert [majority(n, 3) for n in range(4)] == [False, False, True, True]
    assert [majority(n, 4) for n in range(5)] == [False, False, False, True, True]
    assert majority(1, 1)


def test_a_log_is_up_to_date_by_its_last_term_then_its_length() -> None:
    assert log_up_to_date(5, 1, 4, 100)
    assert log_up_to_date(5, 10, 5, 10)
    assert not log_up_to_date(5, 9, 5, 10)
    assert not log_up_to_date(4, 100, 5, 1)


def grants(**changes: Any) -> bool:
    asked: dict[str, Any] = {
        "proposed_term": 8,
        "current_term": 7,
        "candidate_log": (7, 20),
        "own_log": (7, 20),
        "leader_heard_s": None,
        "min_timeout_s": 0.3,
    }
    return grants_pre_vote(**{**asked, **changes})


def test_a_pre_vote_is_granted_only_for_a_later_term_an_up_to_date_log_and_no_live_leader() -> None:
    assert grants()
    assert grants(leader_heard_s=0.3)  # the leader was last heard a minimum timeout ago
    assert not grants(leader_heard_s=0.29)
    assert not grants(leader_heard_s=0.0)  # the leader itself
    assert not grants(candidate_log=(7, 19))
    assert not grants(candidate_log=(6, 500))
    assert grants(candidate_log=(8, 1))
    assert not grants(proposed_term=7)  # it would not vote in its own term again
    assert not grants(proposed_term=3)


def test_a_pre_vote_is_won_with_a_majority_counting_the_candidate() -> None:
    asked = PreVoteRound(term=4, members=3)
    asked.grant("a")
    assert not asked.won
    asked.grant("a")  # the same member twice counts once
    assert not asked.won
    asked.grant("b")
    assert asked.won
    alone = PreVoteRound(term=1, members=1)
    alone.grant("a")
    assert alone.won


def test_a_leader_keeps_its_quorum_while_a_majority_answers_within_the_timeout() -> None:
    heard = {"b": 10.0, "c": 9.0, "d": 8.0, "e": 7.0}
    counted = ["b", "c", "d", "e"]
    # 5 members: itself and two more make a majority.
    assert quorum_heard(10.5, heard, counted, 5, since=0.0, timeout_s=1.5)
    assert not quorum_heard(10.5, {**heard, "c": 8.9}, counted, 5, since=0.0, timeout_s=1.5)
    # A learner's answers do not count.
    assert not quorum_heard(10.5, heard, ["b"], 5, since=0.0, timeout_s=1.5)
    # Members not heard from since the leadership began count from its start.
    assert quorum_heard(1.0, {}, counted, 5, since=0.0, timeout_s=1.5)
    assert not quorum_heard(1.6, {}, counted, 5, since=0.0, timeout_s=1.5)
    assert quorum_heard(1.6, {}, [], 1, since=0.0, timeout_s=1.5)  # a group of one


# --- one replica answering pre-votes -------------------------------------------------------


@pytest.fixture
def follower(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Follower]:
    # Partners that never answer and an election timeout far beyond the test.
    partners = [f"127.0.0.1:{port}" for port in free_ports(2)]
    replica = make_replica(tmp_path, f"127.0.0.1:{free_ports(1)[0]}", partners, 600.0)
    try:
        yield Follower(replica, monkeypatch)
    finally:
        replica.destroy()


def pre_vote(
    follower: Follower,
    term: int,
    last: tuple[int, int],
    directory: str = "",
    sender: str | None = None,
) -> Any:
    """Deliver a pre-vote for ``term`` with a log ending at ``last`` (index,
    term), from the member at ``sender`` (else the test's leader); the
    follower's answer."""
    follower.sent.clear()
    node = follower.leader if sender is None else TCPNode(sender)
    message = {
        "type": "pre_vote",
        "term": term,
        "last_log_index": last[0],
        "last_log_term": last[1],
        "directory": directory,
    }
    follower.transport._onMessageReceived(node, message)
    (answer,) = follower.sent
    assert answer["type"] == "pre_vote_answer" and answer["term"] == term
    return answer


def test_a_follower_answers_pre_votes_without_changing_its_term(follower: Follower) -> None:
    follower.append(1, 0, [(2, 5), (3, 5)], commit=0, term=5)  # a leader of term 5
    assert follower.replica.raftCurrentTerm == 5
    # It has just heard from its leader: no pre-vote, whatever the log.
    answer = pre_vote(follower, 6, (9, 5))
    assert not answer["granted"] and answer["current_term"] == 5
    # Once the leader is silent for the minimum election timeout (600 s here),
    # the log and the term decide.
    follower.replica._leader_heard_at -= 600.0
    assert pre_vote(follower, 6, (3, 5))["granted"]
    assert pre_vote(follower, 6, (4, 5))["granted"]
    assert not pre_vote(follower, 6, (2, 5))["granted"]  # a shorter log
    assert not pre_vote(follower, 9, (50, 4))["granted"]  # an older last term
    assert not pre_vote(follower, 5, (3, 5))["granted"]  # not past its own term
    assert follower.replica.raftCurrentTerm == 5  # a pre-vote changes no term
    assert follower.replica.is_leader() is False


def test_a_learner_neither_grants_nor_asks_for_pre_votes(
    follower: Follower, monkeypatch: pytest.MonkeyPatch
) -> None:
    connected(follower, monkeypatch)
    replica = follower.replica
    replica.directory_id = DIRECTORY
    others = [m for m in replica.members if m != replica.selfNode.address]
    # The record in force names another directory for this member: a learner.
    replica._snapshot_record = {
        replica.selfNode.address: OTHER_DIRECTORY,
        **dict.fromkeys(others, DIRECTORY),
    }
    replica._scan = None
    assert not replica.votes()
    member = others[0]
    assert not pre_vote(follower, 1, (1, 0), DIRECTORY, member)["granted"]
    # Its election timeout passes: it asks nobody.
    follower.sent.clear()
    replica._election_due = 0.0
    replica._elect(1e9)
    assert follower.sent == [] and replica._pre_vote is None
    # A member whose directory is not the recorded one gets no pre-vote either.
    replica.directory_id = OTHER_DIRECTORY
    assert replica.votes()
    assert pre_vote(follower, 1, (1, 0), DIRECTORY, member)["granted"]
    assert not pre_vote(follower, 1, (1, 0), OTHER_DIRECTORY, member)["granted"]


def connected(follower: Follower, monkeypatch: pytest.MonkeyPatch) -> None:
    """The follower's partners (which never answer) count as connected."""
    monkeypatch.setattr(follower.replica, "isNodeConnected", lambda node: True)


def test_a_candidate_campaigns_after_a_majority_of_pre_votes_only(
    follower: Follower, monkeypatch: pytest.MonkeyPatch
) -> None:
    replica = follower.replica
    replica._elect(1e9)
    assert follower.sent == []  # connected to nobody: nobody to ask yet
    connected(follower, monkeypatch)
    replica._elect(1e9)
    asked = [m for m in follower.sent if m["type"] == "pre_vote"]
    assert len(asked) == 2 and all(m["term"] == 1 for m in asked)
    assert replica.raftCurrentTerm == 0

    def answer(term: int, granted: bool, current_term: int) -> None:
        message = {
            "type": "pre_vote_answer",
            "term": term,
            "granted": granted,
            "current_term": current_term,
            "directory": "",
        }
        follower.transport._onMessageReceived(follower.leader, message)

    answer(7, True, 0)  # not asked for term 7: dropped
    answer(1, False, 0)
    assert replica._pre_vote is not None and not replica._pre_vote.won
    answer(1, True, 0)
    assert replica._pre_vote.won
    replica._elect(1e9)
    assert replica._SyncObj__raftElectionDeadline == 0.0  # pysyncobj campaigns in this tick


def test_a_refusal_from_a_later_term_brings_the_candidate_to_that_term(
    follower: Follower, monkeypatch: pytest.MonkeyPatch
) -> None:
    connected(follower, monkeypatch)
    replica = follower.replica
    replica._election_due = 0.0
    replica._elect(1e9)
    message = {
        "type": "pre_vote_answer",
        "term": 1,
        "granted": False,
        "current_term": 12,
        "directory": "",
    }
    follower.transport._onMessageReceived(follower.leader, message)
    assert replica.raftCurrentTerm == 12 and replica._pre_vote is None
    assert not replica.is_leader()
    follower.sent.clear()
    replica._election_due = 0.0
    replica._elect(1e9)
    assert {m["term"] for m in follower.sent if m["type"] == "pre_vote"} == {13}


# --- replicas on loopback --------------------------------------------------------------


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    made = Group(tmp_path, 3)
    try:
        for address in made.addresses:
            made.start(address, KEY)
        made.tick_until(lambda: made.leader() is not None)
        yield made
    finally:
        made.stop()


def tick_some(group: Group, replicas: list[ShardReplica], seconds: float) -> None:
    """Tick only ``replicas`` for ``seconds``: the others are paused."""
    every = group.replicas
    group.replicas = {r.selfNode.address: r for r in replicas}
    try:
        group.tick_for(seconds)
    finally:
        group.replicas = every


def terms(group: Group) -> set[int]:
    return {int(r.raftCurrentTerm) for r in group.replicas.values()}


def test_a_member_paused_past_its_election_timeout_does_not_depose_the_leader(
    group: Group,
) -> None:
    leader = group.leader()
    assert leader is not None
    group.tick_until(lambda: len(terms(group)) == 1)
    (term,) = terms(group)
    paused = next(r for r in group.replicas.values() if r is not leader)
    others = [r for r in group.replicas.values() if r is not paused]
    # Past its election timeout (0.5-0.9 s) and the connection timeout (1 s):
    # the others drop their connections to it.
    tick_some(group, others, 2.5)
    group.tick_until(lambda: paused.leader_address() == leader.selfNode.address)
    group.tick_until(lambda: paused.raftCommitIndex >= leader.raftCommitIndex)
    group.tick_for(2.0)  # a few more of its election timeouts, hearing the leader
    assert group.leader() is leader
    assert terms(group) == {term}


def test_a_leader_without_a_majority_steps_down_and_keeps_its_term(group: Group) -> None:
    leader = group.leader()
    assert leader is not None
    group.tick_until(lambda: len(terms(group)) == 1)
    (term,) = terms(group)
    every = group.replicas
    group.replicas = {leader.selfNode.address: leader}
    try:
        # Within a few of its election timeouts (0.9 s at most), well before
        # pysyncobj's own fallback (4 of them) would act.
        group.tick_until(lambda: not leader.is_leader(), timeout_s=3.0)
        group.tick_for(2.0)  # it asks for pre-votes in vain: its term stays
    finally:
        group.replicas = every
    assert int(leader.raftCurrentTerm) == term and not leader.is_leader()
    group.tick_until(lambda: group.leader() is not None and len(terms(group)) == 1)
    assert min(terms(group)) > term


def test_a_leadership_transfer_skips_the_pre_vote(group: Group) -> None:
    """Every follower has just heard from the leader and would refuse a
    pre-vote: the member asked to take over campaigns at once (TimeoutNow)."""
    leader = group.leader()
    assert leader is not None
    group.tick_until(lambda: len(terms(group)) == 1)
    (term,) = terms(group)
    target = next(r for r in group.replicas.values() if r is not leader)
    group.tick_until(lambda: leader.transfer_leadership(target.selfNode.address))
    group.tick_until(lambda: target.is_leader())
    assert int(target.raftCurrentTerm) == term + 1
