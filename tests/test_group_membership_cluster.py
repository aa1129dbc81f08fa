"""Consumer-group membership on real coordinator processes over gRPC:
joins, rebalances, SyncGroup, LeaveGroup, session expiry, KIP-447 fencing
of a stale generation's TxnOffsetCommit, and a shard leader's kill -9."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from raftcoord.client.admin import Admin
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.coordinator.services.groups import MAX_WAITING
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.limits import MAX_ID_BYTES
from raftcoord.protocol.routing import shard_for
from raftcoord.protocol.v1 import coordinator_pb2
from tests.coord_client import Coordinators, describe_group, join_group, partitions
from tests.local_cluster import running_cluster

pytestmark = pytest.mark.slow

#: Joins of an empty group wait this long for more members (so that members
#: started together get one generation), and a silent member is removed
#: after SESSION_MS.
INITIAL_DELAY_MS = 2_000
SESSION_MS = 4_000
SETTINGS = {
    "group.initial.rebalance.delay.ms": INITIAL_DELAY_MS,
    "group.min.session.timeout.ms": 1_000,
}
WAIT_S = 30.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "cluster", partition_nodes=1, settings=SETTINGS) as cluster:
        yield cluster


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Coordinators]:
    client = Coordinators([n.grpc for n in cluster.coordinators()])
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        yield pool


def join(client: Coordinators, group: str, member_id: str = "") -> Any:
    return join_group(client, group, member_id, session_timeout_ms=SESSION_MS)


def heartbeat(client: Coordinators, group: str, joined: Any) -> ErrorCode:
    request = coordinator_pb2.HeartbeatRequest(
        group_id=group, generation_id=joined.generation_id, member_id=joined.member_id
    )
    return ErrorCode(client.call(group, "Heartbeat", request).error_code)


def sync(client: Coordinators, group: str, joined: Any, assignments: dict[str, bytes]) -> Any:
    request = coordinator_pb2.SyncGroupRequest(
        group_id=group,
        generation_id=joined.generation_id,
        member_id=joined.member_id,
        protocol_type="consumer",
        protocol_name=joined.protocol_name,
        assignments=[
            coordinator_pb2.SyncGroupAssignment(member_id=m, assignment=a)
            for m, a in assignments.items()
        ],
    )
    return client.call(group, "SyncGroup", request, WAIT_S, WAIT_S)


def state_is(client: Coordinators, group: str, state: str) -> bool:
    return str(describe_group(client, group).state) == state


def first_generation(client: Coordinators, pool: ThreadPoolExecutor, group: str) -> list[Any]:
    """Two members joined together: both answers of generation 1."""
    first = pool.submit(join, client, group)
    client.until(lambda: state_is(client, group, "PreparingRebalance"), WAIT_S, "no rebalance")
    second = pool.submit(join, client, group)
    return [f.result(WAIT_S) for f in (first, second)]


def rejoin_all(
    client: Coordinators, pool: ThreadPoolExecutor, group: str, *members: Any
) -> list[Any]:
    futures: list[Future[Any]] = [pool.submit(join, client, group, m.member_id) for m in members]
    return [f.result(WAIT_S) for f in futures]


def test_two_members_get_generation_one_with_one_leader(
    client: Coordinators, pool: ThreadPoolExecutor
) -> None:
    answers = first_generation(client, pool, "g-two")
    assert [a.error_code for a in answers] == [ErrorCode.NONE, ErrorCode.NONE]
    assert {a.generation_id for a in answers} == {1}
    assert answers[0].leader == answers[1].leader
    leader = next(a for a in answers if a.member_id == a.leader)
    follower = next(a for a in answers if a.member_id != a.leader)
    assert {m.member_id for m in leader.members} == {a.member_id for a in answers}
    assert {m.metadata for m in leader.members} == {b"subscription"}
    assert list(follower.members) == [] and leader.protocol_name == "range"

    # SyncGroup: the follower waits for the leader's assignment.
    waiting = pool.submit(sync, client, "g-two", follower, {})
    plan = {leader.member_id: b"partitions-0", follower.member_id: b"partitions-1"}
    assert sync(client, "g-two", leader, plan).assignment == b"partitions-0"
    synced = waiting.result(WAIT_S)
    assert (synced.error_code, synced.assignment) == (ErrorCode.NONE, b"partitions-1")
    assert heartbeat(client, "g-two", follower) is ErrorCode.NONE

    with Admin(client.addresses) as admin:
        described = admin.describe_consumer_groups(["g-two", "g-never"])
    assert described["g-never"].state == "Dead"
    group = described["g-two"]
    assert (group.state, group.generation_id, group.leader) == ("Stable", 1, leader.member_id)
    assert group.partition_assignor == "range"
    assert {m.member_id: m.assignment for m in group.members} == plan


def test_a_third_member_leave_and_expiry_rebalance(
    client: Coordinators, pool: ThreadPoolExecutor
) -> None:
    group = "g-three"
    a, b = first_generation(client, pool, group)
    third = pool.submit(join, client, group)
    client.until(
        lambda: heartbeat(client, group, a) is ErrorCode.REBALANCE_IN_PROGRESS,
        WAIT_S,
        "the third member's join did not start a rebalance",
    )
    assert heartbeat(client, group, b) is ErrorCode.REBALANCE_IN_PROGRESS
    a, b = rejoin_all(client, pool, group, a, b)
    c = third.result(WAIT_S)
    assert {x.generation_id for x in (a, b, c)} == {2}
    assert len({x.member_id for x in (a, b, c)}) == 3

    # b leaves: the others rebalance into generation 3.
    leave = coordinator_pb2.LeaveGroupRequest(
        group_id=group, members=[coordinator_pb2.LeaveGroupMember(member_id=b.member_id)]
    )
    left = client.call(group, "LeaveGroup", leave)
    assert [m.error_code for m in left.members] == [ErrorCode.NONE]
    assert heartbeat(client, group, a) is ErrorCode.REBALANCE_IN_PROGRESS
    a, c = rejoin_all(client, pool, group, a, c)
    assert {x.generation_id for x in (a, c)} == {3}
    assert heartbeat(client, group, b) is ErrorCode.UNKNOWN_MEMBER_ID

    # c falls silent: its session ends, and a alone makes generation 4.
    client.until(
        lambda: heartbeat(client, group, a) is ErrorCode.REBALANCE_IN_PROGRESS,
        WAIT_S,
        "the silent member's session did not expire",
    )
    (a,) = rejoin_all(client, pool, group, a)
    assert a.generation_id == 4
    described = describe_group(client, group)
    assert [m.member_id for m in described.members] == [a.member_id]


def test_a_stale_generations_txn_offset_commit_stores_nothing(
    client: Coordinators, pool: ThreadPoolExecutor
) -> None:
    group, tid = "g-fenced", "t-fenced"
    zombie, live = first_generation(client, pool, group)
    third = pool.submit(join, client, group)
    client.until(
        lambda: heartbeat(client, group, live) is ErrorCode.REBALANCE_IN_PROGRESS,
        WAIT_S,
        "no rebalance",
    )
    (live,) = rejoin_all(client, pool, group, live)  # the zombie never rejoins
    third.result(WAIT_S)
    assert live.generation_id == 2

    ident = client.call(
        tid,
        "InitProducerId",
        coordinator_pb2.InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=60_000),
    )
    added = client.call(
        tid,
        "AddOffsetsToTxn",
        coordinator_pb2.AddOffsetsToTxnRequest(
            transactional_id=tid,
            producer_id=ident.producer_id,
            producer_epoch=ident.producer_epoch,
            group_id=group,
        ),
    )
    assert added.error_code == ErrorCode.NONE

    def commit(member: Any, generation: int) -> Any:
        request = coordinator_pb2.TxnOffsetCommitRequest(
            transactional_id=tid,
            group_id=group,
            producer_id=ident.producer_id,
            producer_epoch=ident.producer_epoch,
            generation_id=generation,
            member_id=member.member_id,
            topics=[
                coordinator_pb2.OffsetCommitTopic(
                    topic="in", partitions=[coordinator_pb2.OffsetCommitPartition(offset=7)]
                )
            ],
        )
        return client.call(group, "TxnOffsetCommit", request)

    stale = commit(zombie, 1)
    assert stale.error_code in (ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID)
    assert commit(live, 1).error_code == ErrorCode.ILLEGAL_GENERATION
    fetch = coordinator_pb2.OffsetFetchRequest(
        group_id=group, topics=partitions("in", 0), require_stable=True
    )
    [nothing] = client.call(group, "OffsetFetch", fetch).partitions
    assert (nothing.error_code, nothing.offset) == (ErrorCode.NONE, -1)  # not even pending
    assert commit(live, 2).error_code == ErrorCode.NONE
    [pending] = client.call(group, "OffsetFetch", fetch).partitions
    assert pending.error_code == ErrorCode.UNSTABLE_OFFSET_COMMIT


def test_membership_survives_a_shard_leader_kill(
    cluster: LocalCluster, client: Coordinators, pool: ThreadPoolExecutor
) -> None:
    group = "g-durable"
    a, b = first_generation(client, pool, group)
    leader, follower = sorted((a, b), key=lambda x: x.member_id != x.leader)
    waiting = pool.submit(sync, client, group, follower, {})
    sync(client, group, leader, {leader.member_id: b"L", follower.member_id: b"F"})
    assert waiting.result(WAIT_S).assignment == b"F"
    before = describe_group(client, group)

    shard = shard_for(group, 3)
    victim = cluster.leaders()[shard]
    cluster.kill(victim, "KILL")
    client.until(
        lambda: cluster.leaders().get(shard, victim) != victim,
        WAIT_S,
        "no new leader for the group's shard",
    )
    after = describe_group(client, group)
    assert (after.state, after.generation_id, after.leader) == ("Stable", 1, before.leader)
    assert [(m.member_id, m.assignment) for m in after.members] == [
        (m.member_id, m.assignment) for m in before.members
    ]
    for member in (a, b):
        assert heartbeat(client, group, member) is ErrorCode.NONE


def test_a_waiting_join_is_answered_not_coordinator_when_the_leadership_ends(
    cluster: LocalCluster, client: Coordinators, pool: ThreadPoolExecutor
) -> None:
    group = "g-deposed"
    a, _b = first_generation(client, pool, group)
    shard = shard_for(group, 3)
    victim = cluster.leaders()[shard]
    assert cluster.state is not None
    stub = client.stubs[cluster.state.node(victim).grpc]

    def request(member_id: str) -> Any:
        return coordinator_pb2.JoinGroupRequest(
            group_id=group,
            session_timeout_ms=SESSION_MS,
            rebalance_timeout_ms=20_000,
            member_id=member_id,
            protocol_type="consumer",
            protocols=[coordinator_pb2.JoinGroupProtocol(name="range", metadata=b"s")],
        )

    first = stub.JoinGroup(request(""), timeout=WAIT_S)
    assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED
    # The third member's join waits on the victim for a and b to join again.
    waiting = pool.submit(stub.JoinGroup, request(first.member_id), timeout=60)
    client.until(
        lambda: heartbeat(client, group, a) is ErrorCode.REBALANCE_IN_PROGRESS,
        WAIT_S,
        "the third member's join did not start a rebalance",
    )
    assert not waiting.done()
    cluster.kill(victim, "STOP")
    try:
        client.until(
            lambda: cluster.leaders().get(shard, victim) != victim,
            WAIT_S,
            "no new leader while the old one was paused",
        )
    finally:
        cluster.kill(victim, "CONT")
    answer = waiting.result(WAIT_S)
    assert answer.error_code == ErrorCode.NOT_COORDINATOR, answer
    # The rebalance goes on under the new leader: the member's join stands.
    assert str(describe_group(client, group).state) == "PreparingRebalance"


def _join_request(group: str, member_id: str, **fields: Any) -> Any:
    return coordinator_pb2.JoinGroupRequest(
        group_id=group,
        member_id=member_id,
        protocol_type="consumer",
        protocols=[coordinator_pb2.JoinGroupProtocol(name="range", metadata=b"s")],
        **{"session_timeout_ms": SESSION_MS, "rebalance_timeout_ms": 20_000, **fields},
    )


def test_a_join_refused_for_want_of_a_waiting_slot_changes_nothing(
    client: Coordinators,
) -> None:
    group = "g-slots"
    stub = client.stubs[client.find(group, time.monotonic() + WAIT_S)]
    # A pending member that never joins holds the rebalance open until its
    # rebalance timeout, so that the joins below keep waiting.
    held = stub.JoinGroup(_join_request(group, "", session_timeout_ms=60_000), timeout=WAIT_S)
    assert held.error_code == ErrorCode.MEMBER_ID_REQUIRED
    rebalance_ms = 10_000
    with ThreadPoolExecutor(max_workers=MAX_WAITING) as waiters:
        joins = [
            waiters.submit(join_group, client, group, "", SESSION_MS, rebalance_ms)
            for _ in range(MAX_WAITING)
        ]
        client.until(
            lambda: len(describe_group(client, group).members) == MAX_WAITING,
            WAIT_S,
            "the waiting joins did not apply",
        )
        first = stub.JoinGroup(_join_request(group, ""), timeout=WAIT_S)
        assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED  # answered at once
        refused = stub.JoinGroup(_join_request(group, first.member_id), timeout=WAIT_S)
        assert refused.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE, refused
        members = {m.member_id for m in describe_group(client, group).members}
        assert first.member_id not in members  # the refusal changed nothing
        answers = [j.result(WAIT_S) for j in joins]
    assert {(a.error_code, a.generation_id) for a in answers} == {(ErrorCode.NONE, 1)}


def test_seventeen_members_join_one_generation_with_sixteen_waiting_slots(
    client: Coordinators,
) -> None:
    group = "g-seventeen"
    count = MAX_WAITING + 1
    with ThreadPoolExecutor(max_workers=count) as members:
        joins = [members.submit(join, client, group) for _ in range(count)]
        answers = [j.result(WAIT_S) for j in joins]
    assert {(a.error_code, a.generation_id) for a in answers} == {(ErrorCode.NONE, 1)}
    leader = next(a for a in answers if a.member_id == a.leader)
    assert {m.member_id for m in leader.members} == {a.member_id for a in answers}


def test_a_static_member_with_a_long_instance_id_joins(client: Coordinators) -> None:
    group = "g-long-instance"
    instance = "é" * ((MAX_ID_BYTES - 1) // 2)  # two bytes a character, just within the limit
    joined = join_group(client, group, group_instance_id=instance)
    assert joined.error_code == ErrorCode.NONE, joined
    assert len(joined.member_id.encode()) <= MAX_ID_BYTES
    too_long = instance + "ab"
    refused = join_group(client, group, group_instance_id=too_long)
    assert refused.error_code == ErrorCode.INVALID_REQUEST
    assert "group_instance_id" in refused.error_message
