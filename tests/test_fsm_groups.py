"""Consumer-group membership in the pure state machine (fsm.membership):
Kafka's classic group protocol, and KIP-447 fencing of offset commits."""

from __future__ import annotations

import random

import pytest

from fsm import (
    ErrorCode,
    FsmConfig,
    GroupProtocol,
    GroupState,
    GroupTimeouts,
    Heartbeat,
    JoinGroup,
    LeaveGroup,
    MemberAssignment,
    OffsetCommit,
    OffsetEntry,
    Outcome,
    SyncGroup,
    TransactionStateMachine,
    TxnOffsetCommit,
)
from fsm.membership import MAX_GROUP_MEMBERS
from tests.seeds import chosen_seed

DELAY_MS, SESSION_MS, REBALANCE_MS = 100, 10_000, 30_000
CONFIG = FsmConfig(group_initial_rebalance_delay_ms=DELAY_MS)
RANGE = (GroupProtocol("range", b"r"),)
G = "group"


def machine() -> TransactionStateMachine:
    return TransactionStateMachine(0, 1, CONFIG)


def join(
    m: TransactionStateMachine,
    member_id: str,
    now: int,
    new: str = "",
    instance: str = "",
    protocols: tuple[GroupProtocol, ...] = RANGE,
    session_ms: int = SESSION_MS,
) -> Outcome:
    return m.apply(
        JoinGroup(
            G, member_id, instance, "client", "consumer", protocols, session_ms,
            REBALANCE_MS, new, now,
        )
    )  # fmt: skip


def new_member(m: TransactionStateMachine, member_id: str, now: int) -> Outcome:
    """The two-step join of JoinGroup v4+: MEMBER_ID_REQUIRED, then the join."""
    assert join(m, "", now, new=member_id).error is ErrorCode.MEMBER_ID_REQUIRED
    assert m.group(G) is not None and member_id in m.group(G).pending  # type: ignore[union-attr]
    return join(m, member_id, now)


def tick(m: TransactionStateMachine, now: int) -> None:
    """What the leader's sweeper does at ``now``."""
    for group_id in m.groups_due(now, 0):
        assert m.apply(GroupTimeouts(group_id, now, 0)).ok


def stable_pair(m: TransactionStateMachine) -> None:
    """a and b join within the initial delay: generation 1, a leads, both synced."""
    assert new_member(m, "a", 0).ok
    assert new_member(m, "b", 10).ok
    group = m.group(G)
    assert group is not None and group.state is GroupState.PREPARING_REBALANCE
    tick(m, DELAY_MS)
    assigned = (MemberAssignment("a", b"A"), MemberAssignment("b", b"B"))
    assert m.apply(SyncGroup(G, "a", "", 1, assigned, DELAY_MS + 1)).ok


def test_two_members_get_generation_one_with_one_leader() -> None:
    m = machine()
    assert new_member(m, "a", 0).ok
    assert new_member(m, "b", 10).ok
    assert m.groups_due(DELAY_MS - 1, 0) == []  # the initial delay holds the join
    tick(m, DELAY_MS)
    group = m.group(G)
    assert group is not None
    assert (group.state, group.generation, group.leader_id) == (
        GroupState.COMPLETING_REBALANCE,
        1,
        "a",
    )
    assert list(group.members) == ["a", "b"] and group.protocol_name == "range"


def test_sync_distributes_the_leaders_assignment() -> None:
    m = machine()
    stable_pair(m)
    group = m.group(G)
    assert group is not None and group.state is GroupState.STABLE
    assert {mid: x.assignment for mid, x in group.members.items()} == {"a": b"A", "b": b"B"}
    assert m.apply(SyncGroup(G, "b", "", 1, (), 200)).ok  # a follower reads its own
    assert m.apply(SyncGroup(G, "b", "", 0, (), 200)).error is ErrorCode.ILLEGAL_GENERATION


def test_a_third_member_triggers_a_rebalance() -> None:
    m = machine()
    stable_pair(m)
    assert new_member(m, "c", 1_000).ok
    for member in ("a", "b"):
        beat = m.apply(Heartbeat(G, member, "", 1, 1_001))
        assert beat.error is ErrorCode.REBALANCE_IN_PROGRESS
    assert join(m, "b", 1_002).ok
    group = m.group(G)
    assert group is not None and group.state is GroupState.PREPARING_REBALANCE
    assert join(m, "a", 1_003).ok  # the last one: the join completes at once
    group = m.group(G)
    assert group is not None
    assert (group.state, group.generation, group.leader_id) == (
        GroupState.COMPLETING_REBALANCE,
        2,
        "a",
    )
    assert set(group.members) == {"a", "b", "c"}
    assert m.apply(Heartbeat(G, "c", "", 1, 1_004)).error is ErrorCode.ILLEGAL_GENERATION


def test_the_rebalance_timeout_removes_members_that_did_not_rejoin() -> None:
    m = machine()
    stable_pair(m)
    assert new_member(m, "c", 1_000).ok
    assert join(m, "a", 1_001).ok
    # b keeps its session (its heartbeats answer REBALANCE_IN_PROGRESS) but never rejoins.
    for now in range(1_000, REBALANCE_MS, SESSION_MS // 2):
        assert m.apply(Heartbeat(G, "b", "", 1, now)).error is ErrorCode.REBALANCE_IN_PROGRESS
        tick(m, now)
    tick(m, 1_000 + REBALANCE_MS - 1)
    assert m.group(G).generation == 1  # type: ignore[union-attr]
    tick(m, 1_000 + REBALANCE_MS)
    group = m.group(G)
    assert group is not None and group.generation == 2 and set(group.members) == {"a", "c"}


def test_leave_and_session_expiry_rebalance() -> None:
    m = machine()
    stable_pair(m)
    assert m.apply(LeaveGroup(G, "b", "", 500)).ok
    group = m.group(G)
    assert group is not None and group.state is GroupState.PREPARING_REBALANCE
    assert join(m, "a", 501).ok
    group = m.group(G)
    assert group is not None and (group.generation, list(group.members)) == (2, ["a"])
    assert m.apply(LeaveGroup(G, "b", "", 502)).error is ErrorCode.UNKNOWN_MEMBER_ID
    assert m.apply(SyncGroup(G, "a", "", 2, (MemberAssignment("a", b"all"),), 503)).ok
    # a stops heartbeating: its session ends, and the group is empty.
    assert m.groups_due(503 + SESSION_MS, 0) == []
    tick(m, 504 + SESSION_MS)
    group = m.group(G)
    assert group is not None
    assert (group.state, group.generation, dict(group.members)) == (GroupState.EMPTY, 3, {})


def test_sessions_count_from_the_leaderships_start() -> None:
    """A new leader does not expire members for the heartbeats they could
    not deliver before it led."""
    m = machine()
    stable_pair(m)
    elected = 200 + SESSION_MS
    assert m.groups_due(elected + 1, elected) == []
    assert m.apply(GroupTimeouts(G, elected + 1, elected)).ok
    assert set(m.group(G).members) == {"a", "b"}  # type: ignore[union-attr]
    assert m.groups_due(elected + SESSION_MS + 1, elected) == [G]


def test_heartbeats_keep_a_session() -> None:
    m = machine()
    stable_pair(m)
    for now in range(1_000, 5 * SESSION_MS, SESSION_MS // 2):
        assert m.apply(Heartbeat(G, "a", "", 1, now)).ok
        assert m.apply(Heartbeat(G, "b", "", 1, now)).ok
        tick(m, now)
    assert m.group(G).state is GroupState.STABLE  # type: ignore[union-attr]


def test_join_refusals() -> None:
    m = machine()
    assert join(m, "", 0, new="x", session_ms=1).error is ErrorCode.INVALID_SESSION_TIMEOUT
    assert join(m, "nobody", 0).error is ErrorCode.UNKNOWN_MEMBER_ID
    assert m.group(G) is None  # a refusal changes nothing
    stable_pair(m)
    other = (GroupProtocol("roundrobin", b""),)
    refused = join(m, "", 1_000, new="c", protocols=other)
    assert refused.error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL


def test_static_members_fence_their_older_ids() -> None:
    m = machine()
    assert join(m, "", 0, new="s1", instance="i").ok  # no MEMBER_ID_REQUIRED for static
    tick(m, DELAY_MS)
    assert m.apply(SyncGroup(G, "s1", "i", 1, (MemberAssignment("s1", b"S"),), DELAY_MS)).ok
    # The instance restarts: same protocols in a Stable group, no rebalance.
    assert join(m, "", 1_000, new="s2", instance="i").ok
    group = m.group(G)
    assert group is not None and group.state is GroupState.STABLE and list(group.members) == ["s2"]
    assert group.members["s2"].assignment == b"S" and group.leader_id == "s2"
    beat = m.apply(Heartbeat(G, "s1", "i", 1, 1_001))
    assert beat.error is ErrorCode.FENCED_INSTANCE_ID
    zombie = TxnOffsetCommit(G, "t", 5, 0, (OffsetEntry("in", 0, 9, ""),), 1_002, 1, "s1", "i")
    assert m.apply(zombie).error is ErrorCode.FENCED_INSTANCE_ID
    assert m.offset_fetch(G)[:1] == []


def test_a_stale_generations_offsets_never_land() -> None:
    m = machine()
    stable_pair(m)
    assert new_member(m, "c", 1_000).ok  # generation 1 is over once this join completes
    assert join(m, "a", 1_001).ok and join(m, "b", 1_002).ok
    assert m.group(G).generation == 2  # type: ignore[union-attr]
    offsets = (OffsetEntry("in", 0, 42, ""),)
    stale = TxnOffsetCommit(G, "t", 5, 0, offsets, 1_003, 1, "b", "")
    assert m.apply(stale).error is ErrorCode.ILLEGAL_GENERATION
    plain = OffsetCommit(G, offsets, 1_003, 1, "b", "")
    assert m.apply(plain).error is ErrorCode.ILLEGAL_GENERATION
    assert G not in m.state.groups  # nothing stored, not even pending
    current = TxnOffsetCommit(G, "t", 5, 0, offsets, 1_004, 2, "b", "")
    assert m.apply(current).ok
    assert m.apply(TxnOffsetCommit(G, "t", 5, 0, offsets, 1_005, 2, "ghost", "")).error is (
        ErrorCode.UNKNOWN_MEMBER_ID
    )


def test_commits_outside_membership() -> None:
    m = machine()
    offsets = (OffsetEntry("in", 0, 1, ""),)
    assert m.apply(OffsetCommit(G, offsets, 0)).ok  # a simple consumer, no group
    stable_pair(m)
    # Only members commit plain offsets to a group with members; a
    # transactional commit without member fields (older clients) is accepted.
    assert m.apply(OffsetCommit(G, offsets, 500)).error is ErrorCode.UNKNOWN_MEMBER_ID
    assert m.apply(TxnOffsetCommit(G, "t", 5, 0, offsets, 500)).ok


def test_groups_are_listed_and_one_with_only_offsets_is_empty() -> None:
    """As Kafka's coordinator: a group exists from its first offset commit,
    transactional (still pending) or not, Empty while it has no members;
    only a group neither joined nor with offsets is Dead."""
    m = machine()
    offsets = (OffsetEntry("in", 0, 1, ""),)
    assert m.list_groups() == [] and m.group_state("pending") == "Dead"
    assert m.apply(TxnOffsetCommit("pending", "t", 5, 0, offsets, 0)).ok
    assert m.apply(OffsetCommit("plain", offsets, 0)).ok
    stable_pair(m)
    assert m.list_groups() == [(G, "Stable"), ("pending", "Empty"), ("plain", "Empty")]
    assert m.group_state("never") == "Dead"


def test_state_survives_a_snapshot() -> None:
    m = machine()
    stable_pair(m)
    assert new_member(m, "c", 1_000).ok
    restored = TransactionStateMachine.restore(m.snapshot(), CONFIG)
    assert restored.group(G) == m.group(G)
    assert restored.snapshot() == m.snapshot()


# --- random sequences ---------------------------------------------------------------


def _check_invariants(m: TransactionStateMachine, last_generation: int) -> int:
    group = m.group(G)
    if group is None:
        return last_generation
    assert group.generation >= last_generation
    if group.state is GroupState.EMPTY:
        assert not group.members and not group.leader_id
    if group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
        assert group.leader_id in group.members
        for member in group.members.values():
            assert group.protocol_name in {p.name for p in member.protocols}
    owners = [x.group_instance_id for x in group.members.values() if x.group_instance_id]
    assert len(owners) == len(set(owners)), "two members hold one instance id"
    return group.generation


def test_random_group_operations_keep_the_invariants() -> None:
    base = chosen_seed(20261126)
    for seed in range(base, base + 40):
        rng = random.Random(seed)
        m, now, generation = machine(), 0, 0
        for step in range(300):
            now += rng.choice([0, 1, 50, 500, SESSION_MS])
            group = m.group(G)
            known = list(group.members) if group else []
            pending = list(group.pending) if group else []
            member = rng.choice(known + pending + ["", "", "ghost"])
            instance = rng.choice(["", "", "", "i0", "i1"])
            gen = rng.choice([group.generation if group else 0, 0, 1, -1])
            protocols = rng.choice([RANGE, (GroupProtocol("rr", b""), *RANGE)])
            kind = rng.randrange(6)
            before = m.snapshot()
            if kind == 0:
                out = join(m, member, now, new=f"n{step}", instance=instance, protocols=protocols)
            elif kind == 1:
                assigned = tuple(MemberAssignment(x, b"x") for x in known)
                out = m.apply(SyncGroup(G, member, instance, gen, assigned, now))
            elif kind == 2:
                out = m.apply(Heartbeat(G, member, instance, gen, now))
            elif kind == 3:
                out = m.apply(LeaveGroup(G, member, instance, now))
            elif kind == 4:
                out = m.apply(TxnOffsetCommit(G, "t", 1, 0, (OffsetEntry("in", 0, step, ""),),
                                              now, gen, member, instance))  # fmt: skip
            else:
                tick(m, now)
                out = Outcome()
            where = f"RAFTCOORD_SEED={seed} step {step}"
            assert out.error is not ErrorCode.UNKNOWN_SERVER_ERROR, f"{where}: {out.message}"
            if (
                kind in (1, 2, 4)
                and not out.ok
                and out.error is not ErrorCode.REBALANCE_IN_PROGRESS
            ):
                assert m.snapshot() == before, f"{where}: a refusal changed the state"
            generation = _check_invariants(m, generation)
            assert TransactionStateMachine.restore(m.snapshot(), CONFIG).snapshot() == m.snapshot()


@pytest.mark.parametrize("member", ["a", "b"])
def test_leaving_during_a_rebalance_completes_it_without_the_member(member: str) -> None:
    m = machine()
    stable_pair(m)
    assert new_member(m, "c", 1_000).ok
    assert join(m, "c" if member == "a" else "a", 1_001).ok
    others = {"a", "b", "c"} - {member}
    for other in sorted(others):
        if other != "c" and other != ("c" if member == "a" else "a"):
            assert join(m, other, 1_002).ok
    assert m.apply(LeaveGroup(G, member, "", 1_003)).ok
    group = m.group(G)
    assert group is not None and group.generation == 2 and set(group.members) == others


def test_deadlines_near_the_end_of_time_still_snapshot() -> None:
    """A stamped time plus a timeout stays a 64-bit integer in the state."""
    m = machine()
    late = 2**63 - 10
    assert join(m, "", late, new="a").error is ErrorCode.MEMBER_ID_REQUIRED
    assert join(m, "a", late).ok
    assert TransactionStateMachine.restore(m.snapshot(), CONFIG).snapshot() == m.snapshot()


def test_a_full_group_refuses_new_members() -> None:
    m = machine()
    for i in range(MAX_GROUP_MEMBERS):
        assert join(m, "", 0, new=f"n{i}").error is ErrorCode.MEMBER_ID_REQUIRED
    assert join(m, "", 0, new="one-more").error is ErrorCode.GROUP_MAX_SIZE_REACHED
    assert join(m, "n0", 1).ok  # a pending member still joins


def test_a_known_static_member_rejoins_a_full_group() -> None:
    m = machine()
    assert join(m, "", 0, new="s1", instance="i").ok
    for i in range(MAX_GROUP_MEMBERS - 1):
        assert join(m, "", 0, new=f"n{i}").error is ErrorCode.MEMBER_ID_REQUIRED
    assert join(m, "", 1, new="t1", instance="j").error is ErrorCode.GROUP_MAX_SIZE_REACHED
    assert join(m, "", 1, new="s2", instance="i").ok  # its old id is replaced
    group = m.group(G)
    assert group is not None and group.instance_owner("i") == "s2"
    assert len(group.members) + len(group.pending) == MAX_GROUP_MEMBERS


def test_a_heartbeat_checks_the_generation_before_the_state() -> None:
    m = machine()
    stable_pair(m)
    assert new_member(m, "c", 1_000).ok  # generation 1 rebalances
    assert m.group(G).state is GroupState.PREPARING_REBALANCE  # type: ignore[union-attr]
    assert m.apply(Heartbeat(G, "a", "", 0, 1_001)).error is ErrorCode.ILLEGAL_GENERATION
    assert m.apply(Heartbeat(G, "a", "", 1, 1_002)).error is ErrorCode.REBALANCE_IN_PROGRESS


OFFSETS = (OffsetEntry("in", 0, 7, ""),)


def test_offset_commits_to_an_unknown_group_follow_kafka() -> None:
    m = machine()
    # A plain commit naming a generation: the group does not exist.
    assert m.apply(OffsetCommit(G, OFFSETS, 0, 0, "", "")).error is ErrorCode.ILLEGAL_GENERATION
    assert m.apply(OffsetCommit(G, OFFSETS, 0, 3, "x", "")).error is ErrorCode.ILLEGAL_GENERATION
    # A transactional one names a member that does not exist.
    txn = TxnOffsetCommit(G, "t", 5, 0, OFFSETS, 0, 0, "", "")
    assert m.apply(txn).error is ErrorCode.UNKNOWN_MEMBER_ID
    assert G not in m.state.groups
    # Without a generation, an Empty group takes commits whoever sends them.
    assert m.apply(OffsetCommit(G, OFFSETS, 1, -1, "x", "")).ok
    assert m.apply(TxnOffsetCommit(G, "t", 5, 0, OFFSETS, 2, -1, "x", "i")).ok


def test_offset_commits_to_a_group_follow_kafkas_order() -> None:
    m = machine()
    assert new_member(m, "a", 0).ok
    assert new_member(m, "b", 10).ok
    tick(m, DELAY_MS)  # generation 1, CompletingRebalance
    # A plain commit: the member and generation first, then the state.
    plain = OffsetCommit(G, OFFSETS, 200, 0, "a", "")
    assert m.apply(plain).error is ErrorCode.ILLEGAL_GENERATION
    plain = OffsetCommit(G, OFFSETS, 200, 1, "ghost", "")
    assert m.apply(plain).error is ErrorCode.UNKNOWN_MEMBER_ID
    plain = OffsetCommit(G, OFFSETS, 200, 1, "a", "")
    assert m.apply(plain).error is ErrorCode.REBALANCE_IN_PROGRESS
    # A transactional commit ignores the state; without a generation, a
    # group that is not Empty checks the member and its generation.
    assert m.apply(TxnOffsetCommit(G, "t", 5, 0, OFFSETS, 201, 1, "a", "")).ok
    stale = TxnOffsetCommit(G, "t", 5, 0, OFFSETS, 202, -1, "a", "")
    assert m.apply(stale).error is ErrorCode.ILLEGAL_GENERATION
    anonymous = TxnOffsetCommit(G, "t", 5, 0, OFFSETS, 202, 1, "", "")
    assert m.apply(anonymous).error is ErrorCode.UNKNOWN_MEMBER_ID
    # Once every member left, the group is Empty: commits without a
    # generation are accepted again, even naming a former member.
    assert m.apply(LeaveGroup(G, "a", "", 300)).ok
    assert m.apply(LeaveGroup(G, "b", "", 301)).ok
    assert m.group(G).state is GroupState.EMPTY  # type: ignore[union-attr]
    assert m.apply(OffsetCommit(G, OFFSETS, 302, -1, "a", "")).ok
    assert m.apply(OffsetCommit(G, OFFSETS, 303, 1, "a", "")).error is ErrorCode.UNKNOWN_MEMBER_ID


def test_an_instance_id_not_in_the_group_is_an_unknown_member() -> None:
    m = machine()
    stable_pair(m)
    assert m.apply(Heartbeat(G, "a", "nowhere", 1, 200)).error is ErrorCode.UNKNOWN_MEMBER_ID
    commit = OffsetCommit(G, OFFSETS, 201, 1, "a", "nowhere")
    assert m.apply(commit).error is ErrorCode.UNKNOWN_MEMBER_ID
    assert m.apply(OffsetCommit(G, OFFSETS, 202, 1, "a", "")).ok
