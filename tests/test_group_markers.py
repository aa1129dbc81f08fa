"""Group markers end to end on real coordinator processes: a transaction that
commits consumer offsets reaches CompleteCommit/CompleteAbort through the
marker writer, and the offsets become visible (or vanish) with it, also when
the leader that prepared the transaction is killed before delivering."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.routing import shard_for
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2, partition_log_pb2
from tests.coord_client import Coordinators, partitions
from tests.local_cluster import running_cluster

pytestmark = pytest.mark.slow
SHARDS = 3
COMPLETE_COMMIT = common_pb2.TRANSACTION_STATE_COMPLETE_COMMIT
COMPLETE_ABORT = common_pb2.TRANSACTION_STATE_COMPLETE_ABORT


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(
        tmp_path_factory.mktemp("group-markers") / "cluster",
        partition_nodes=0,  # coordinators only
    ) as cluster:
        yield cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "cluster", partition_nodes=0) as cluster:
        yield cluster


def client_for(cluster: LocalCluster) -> Coordinators:
    assert cluster.state is not None
    return Coordinators([n.grpc for n in cluster.state.nodes if n.kind == "coordinator"])


def key_on_shard(shard: int, prefix: str) -> str:
    return next(f"{prefix}-{i}" for i in range(1000) if shard_for(f"{prefix}-{i}", SHARDS) == shard)


def begin_with_offsets(client: Coordinators, tid: str, group: str, offset: int) -> Any:
    """InitProducerId, AddOffsetsToTxn(group), TxnOffsetCommit(in-0 @ offset)."""
    init = client.call(
        tid,
        "InitProducerId",
        coordinator_pb2.InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=60_000),
    )
    assert init.error_code == ErrorCode.NONE, init
    ident = {
        "transactional_id": tid,
        "producer_id": init.producer_id,
        "producer_epoch": init.producer_epoch,
    }
    added = client.call(
        tid, "AddOffsetsToTxn", coordinator_pb2.AddOffsetsToTxnRequest(group_id=group, **ident)
    )
    assert added.error_code == ErrorCode.NONE, added
    offsets = [
        coordinator_pb2.OffsetCommitTopic(
            topic="in",
            partitions=[
                coordinator_pb2.OffsetCommitPartition(partition=0, offset=offset, metadata=tid)
            ],
        )
    ]
    committed = client.call(
        group,
        "TxnOffsetCommit",
        coordinator_pb2.TxnOffsetCommitRequest(group_id=group, topics=offsets, **ident),
    )
    assert committed.error_code == ErrorCode.NONE, committed
    return init


def end_request(tid: str, init: Any, commit: bool) -> Any:
    return coordinator_pb2.EndTxnRequest(
        transactional_id=tid,
        producer_id=init.producer_id,
        producer_epoch=init.producer_epoch,
        committed=commit,
    )


def state_of(client: Coordinators, tid: str) -> int:
    answer = client.call(
        tid,
        "DescribeTransactions",
        coordinator_pb2.DescribeTransactionsRequest(transactional_ids=[tid]),
    )
    return int(answer.transactions[0].state)


def wait_for_state(client: Coordinators, tid: str, state: int, timeout_s: float) -> None:
    client.until(
        lambda: state_of(client, tid) == state,
        timeout_s,
        f"{tid} did not reach {common_pb2.TransactionState.Name(state)}",
    )


def stable_offset(client: Coordinators, group: str) -> tuple[int, int, str]:
    """(error, offset, metadata) of in-0 for ``group``, asking for a stable answer."""
    answer = client.call(
        group,
        "OffsetFetch",
        coordinator_pb2.OffsetFetchRequest(
            group_id=group, topics=partitions("in", 0), require_stable=True
        ),
    )
    [found] = answer.partitions
    return int(found.error_code), int(found.offset), str(found.metadata)


@pytest.mark.parametrize("same_shard", [True, False], ids=["group-on-own-shard", "other-shard"])
def test_commit_completes_and_makes_the_offsets_visible(
    shared_cluster: LocalCluster, same_shard: bool
) -> None:
    tid = key_on_shard(0, f"commit-{same_shard}")
    group = key_on_shard(0 if same_shard else 1, f"commit-group-{same_shard}")
    client = client_for(shared_cluster)
    try:
        init = begin_with_offsets(client, tid, group, offset=42)
        assert stable_offset(client, group)[0] == ErrorCode.UNSTABLE_OFFSET_COMMIT
        ended = client.call(tid, "EndTxn", end_request(tid, init, commit=True))
        assert ended.error_code == ErrorCode.NONE, ended
        wait_for_state(client, tid, COMPLETE_COMMIT, timeout_s=15)
        assert stable_offset(client, group) == (ErrorCode.NONE, 42, tid)
        # The producer goes on: its next transaction starts from CompleteCommit.
        again = client.call(
            tid,
            "AddOffsetsToTxn",
            coordinator_pb2.AddOffsetsToTxnRequest(
                transactional_id=tid,
                producer_id=ended.producer_id,
                producer_epoch=ended.producer_epoch,
                group_id=group,
            ),
        )
        assert again.error_code == ErrorCode.NONE, again
    finally:
        client.close()


def test_abort_completes_and_drops_the_offsets(shared_cluster: LocalCluster) -> None:
    tid, group = "abort-tx", "abort-group"
    client = client_for(shared_cluster)
    try:
        first = begin_with_offsets(client, tid, group, offset=10)
        assert (
            client.call(tid, "EndTxn", end_request(tid, first, True)).error_code == ErrorCode.NONE
        )
        wait_for_state(client, tid, COMPLETE_COMMIT, timeout_s=15)

        second = begin_with_offsets(client, tid, group, offset=20)
        assert (
            client.call(tid, "EndTxn", end_request(tid, second, False)).error_code == ErrorCode.NONE
        )
        wait_for_state(client, tid, COMPLETE_ABORT, timeout_s=15)
        # The aborted offsets are gone; the committed ones stay.
        assert stable_offset(client, group) == (ErrorCode.NONE, 10, tid)
    finally:
        client.close()


def test_write_txn_markers_answers_per_group_and_refuses_data_partitions(
    shared_cluster: LocalCluster,
) -> None:
    group = key_on_shard(2, "direct-group")
    leader = shared_cluster.wait_for_leaders()[2]
    assert shared_cluster.state is not None
    client = client_for(shared_cluster)
    marker = partition_log_pb2.TxnMarker
    request = partition_log_pb2.WriteTxnMarkersRequest(
        markers=[
            marker(
                producer_id=5,
                producer_epoch=1,
                coordinator_epoch=1,
                result=common_pb2.COMMIT,
                topics=partitions("orders", 0, 1),
                groups=[group],
            ),
            marker(producer_id=-1, producer_epoch=0, result=common_pb2.ABORT, groups=[group]),
            marker(producer_id=5, producer_epoch=1, result=common_pb2.ABORT, groups=[""]),
            marker(producer_id=5, producer_epoch=1, result=7, groups=[group]),  # no such result
        ]
    )
    try:
        answer = client.stubs[shared_cluster.state.node(leader).grpc].WriteTxnMarkers(
            request, timeout=10
        )
        results = [
            (
                [(p.topic, p.partition, p.error_code) for p in r.partitions],
                [(g.group_id, g.error_code) for g in r.groups],
            )
            for r in answer.markers
        ]
        assert results == [
            (
                [
                    ("orders", 0, ErrorCode.INVALID_REQUEST),
                    ("orders", 1, ErrorCode.INVALID_REQUEST),
                ],
                [(group, ErrorCode.NONE)],  # nothing pending for this producer: a no-op
            ),
            ([], [(group, ErrorCode.INVALID_REQUEST)]),
            ([], [("", ErrorCode.INVALID_REQUEST)]),
            ([], [(group, ErrorCode.INVALID_REQUEST)]),
        ]
        assert [(r.producer_id, r.producer_epoch) for r in answer.markers] == [
            (5, 1),
            (-1, 0),
            (5, 1),
            (5, 1),
        ]
        other = next(
            n for n in shared_cluster.state.nodes if n.kind == "coordinator" and n.node_id != leader
        )
        refused = client.stubs[other.grpc].WriteTxnMarkers(
            partition_log_pb2.WriteTxnMarkersRequest(markers=request.markers[:1]), timeout=10
        )
        assert [(g.group_id, g.error_code) for g in refused.markers[0].groups] == [
            (group, ErrorCode.NOT_COORDINATOR)
        ]
        empty = client.stubs[other.grpc].WriteTxnMarkers(
            partition_log_pb2.WriteTxnMarkersRequest(), timeout=10
        )
        assert list(empty.markers) == []
    finally:
        client.close()


def test_a_new_leader_completes_what_a_killed_leader_prepared(cluster: LocalCluster) -> None:
    """The transaction's shard leader L is killed right after EndTxn, before
    it can deliver: the group's shard leader X is paused (SIGSTOP) around the
    EndTxn, so L's marker cannot land. The next leader of the transaction's
    shard finds it in PrepareCommit and completes it."""
    leaders = _leaders_on_two_nodes(cluster)
    txn_shard, group_shard = next(
        (t, g) for t in leaders for g in leaders if leaders[t] != leaders[g]
    )
    victim, paused = leaders[txn_shard], leaders[group_shard]
    tid, group = key_on_shard(txn_shard, "kill-tx"), key_on_shard(group_shard, "kill-group")
    assert cluster.state is not None
    client = client_for(cluster)
    try:
        init = begin_with_offsets(client, tid, group, offset=77)
        cluster.kill(paused, "STOP")
        try:
            ended = client.stubs[cluster.state.node(victim).grpc].EndTxn(
                end_request(tid, init, commit=True), timeout=5
            )
            assert ended.error_code == ErrorCode.NONE, ended
            cluster.kill(victim, "KILL")
        finally:
            cluster.kill(paused, "CONT")
        wait_for_state(client, tid, COMPLETE_COMMIT, timeout_s=30)
        assert stable_offset(client, group) == (ErrorCode.NONE, 77, tid)
    finally:
        client.close()

    # The transitions log shows who completed it: a leader of a later term.
    survivors = [n.node_id for n in cluster.state.nodes if n.kind == "coordinator"]
    survivors.remove(victim)
    found: dict[str, dict[str, Any]] = {}

    def logged() -> bool:
        for node in survivors:
            path = (
                Path(cluster.data_dir) / f"node-{node}" / f"shard-{txn_shard}" / "transitions.jsonl"
            )
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            found.update({r["to"]: r for r in rows if r["transactional_id"] == tid})
        return "COMPLETE_COMMIT" in found and "PREPARE_COMMIT" in found

    cluster.wait_until(logged, 10, "the completion was not logged")
    assert found["COMPLETE_COMMIT"]["term"] > found["PREPARE_COMMIT"]["term"]


def _leaders_on_two_nodes(cluster: LocalCluster) -> dict[int, int]:
    """The shard leaders, once at least two nodes lead a shard (restarting a
    node that leads every shard moves some of its shards elsewhere)."""
    leaders = cluster.wait_for_leaders()
    for _ in range(8):
        if len(set(leaders.values())) > 1:
            return leaders
        only = next(iter(leaders.values()))
        cluster.kill(only, "KILL")
        cluster.wait_for_leaders()
        cluster.start(only)
        leaders = _settled_leaders(cluster)
    raise AssertionError(f"every shard kept one leader: {leaders}")


def _settled_leaders(cluster: LocalCluster) -> dict[int, int]:
    """Leaders that stayed the same for longer than an election timeout (a
    restarted node may still call an election as it rejoins)."""
    seen: list[dict[int, int]] = []

    def settled() -> bool:
        seen.append(cluster.wait_for_leaders())
        return len(seen) >= 8 and all(s == seen[-1] for s in seen[-8:])

    cluster.wait_until(settled, 30, "leaders did not settle")
    return seen[-1]


def test_a_stray_txn_offset_commit_is_refused_and_stores_nothing(
    shared_cluster: LocalCluster,
) -> None:
    tid = key_on_shard(0, "stray-tx")
    group = key_on_shard(1, "stray-group")  # the transaction's own group
    victim = key_on_shard(2, "stray-victim")  # never added to the transaction
    client = client_for(shared_cluster)
    try:
        init = begin_with_offsets(client, tid, group, offset=5)
        pid, epoch = init.producer_id, init.producer_epoch
        offsets = [
            coordinator_pb2.OffsetCommitTopic(
                topic="in",
                partitions=[coordinator_pb2.OffsetCommitPartition(partition=0, offset=666)],
            )
        ]
        strays = [
            (victim, tid, pid, epoch, ErrorCode.INVALID_TXN_STATE),  # no AddOffsetsToTxn
            (
                victim,
                tid,
                pid,
                epoch + 5,
                ErrorCode.PRODUCER_FENCED,
            ),  # an epoch not the current one
            (group, tid, pid + 1000, epoch, ErrorCode.INVALID_PRODUCER_ID_MAPPING),
            (victim, "stray-unknown-tx", pid, epoch, ErrorCode.INVALID_PRODUCER_ID_MAPPING),
        ]
        for group_id, transactional_id, producer_id, producer_epoch, expected in strays:
            answer = client.call(
                group_id,
                "TxnOffsetCommit",
                coordinator_pb2.TxnOffsetCommitRequest(
                    group_id=group_id,
                    transactional_id=transactional_id,
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    topics=offsets,
                ),
            )
            assert answer.error_code == expected, (group_id, producer_epoch, answer)
            assert [r.error_code for r in answer.results] == [expected]
        # Nothing is pending on the victim group: its offset reads as stable.
        assert stable_offset(client, victim) == (ErrorCode.NONE, -1, "")

        ended = client.call(tid, "EndTxn", end_request(tid, init, commit=True))
        assert ended.error_code == ErrorCode.NONE, ended
        wait_for_state(client, tid, COMPLETE_COMMIT, timeout_s=15)
        assert stable_offset(client, group) == (ErrorCode.NONE, 5, tid)
        # The real producer's next transaction commits to the victim group: the
        # stray commit with a larger epoch did not fence it there.
        nxt = {"transactional_id": tid, "producer_id": pid, "producer_epoch": ended.producer_epoch}
        added = client.call(
            tid, "AddOffsetsToTxn", coordinator_pb2.AddOffsetsToTxnRequest(group_id=victim, **nxt)
        )
        assert added.error_code == ErrorCode.NONE, added
        real = coordinator_pb2.OffsetCommitTopic(
            topic="in", partitions=[coordinator_pb2.OffsetCommitPartition(partition=0, offset=7)]
        )
        committed = client.call(
            victim,
            "TxnOffsetCommit",
            coordinator_pb2.TxnOffsetCommitRequest(group_id=victim, topics=[real], **nxt),
        )
        assert committed.error_code == ErrorCode.NONE, committed
        again = coordinator_pb2.EndTxnRequest(committed=True, **nxt)
        assert client.call(tid, "EndTxn", again).error_code == ErrorCode.NONE
        wait_for_state(client, tid, COMPLETE_COMMIT, timeout_s=15)
        assert stable_offset(client, victim) == (ErrorCode.NONE, 7, "")
    finally:
        client.close()
