"""Request limits (fsm.limits) on transactional ids, group ids, topic names
and partition counts: checked by the coordinator before anything is proposed
and by the client library. A transaction with the largest legal ids and a
request with as many offsets as allowed replicate on a real 3-node cluster
(their Raft entries are large enough for pysyncobj to send them in chunks)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fsm import (
    AddOffsets,
    AddPartitions,
    CreateTopic,
    ErrorCode,
    FsmConfig,
    InitProducerId,
    OffsetCommit,
    OffsetEntry,
)
from fsm.limits import request_refusal
from raftcoord.client import Consumer, TransactionalProducer
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.limits import MAX_ID_BYTES, MAX_TOPIC_NAME_CHARS
from raftcoord.protocol.routing import shard_for
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2
from tests.coord_client import Coordinators, partitions
from tests.local_cluster import running_cluster

SHARDS = 3
#: Ids of exactly MAX_ID_BYTES bytes of UTF-8, all but one byte non-ASCII.
LARGEST_TID = "é" * (MAX_ID_BYTES // 2) + "t"
LARGEST_GROUP = "ü" * (MAX_ID_BYTES // 2) + "g"
#: The issue's id: 40,000 characters, 80,000 bytes.
TOO_LONG_TID = "é" * 40_000


def init(tid: str) -> InitProducerId:
    return InitProducerId(tid, 60_000, 0, 0)


# --- the limits (pure) ------------------------------------------------------------------


def test_ids_are_limited_in_bytes_of_utf8() -> None:
    config = FsmConfig()
    assert len(LARGEST_TID.encode()) == len(LARGEST_GROUP.encode()) == MAX_ID_BYTES
    assert request_refusal(init(LARGEST_TID), config) is None
    assert request_refusal(AddOffsets(LARGEST_TID, 1, 0, LARGEST_GROUP, 0, 0), config) is None
    # Fewer characters than the limit, more bytes.
    refusal = request_refusal(init("é" * (MAX_ID_BYTES // 2 + 1)), config)
    assert refusal is not None
    assert refusal[0] is ErrorCode.INVALID_REQUEST
    assert f"limit of {MAX_ID_BYTES} bytes" in refusal[1]
    refusal = request_refusal(AddOffsets("t", 1, 0, "g" * (MAX_ID_BYTES + 1), 0, 0), config)
    assert refusal is not None and refusal[1].startswith("group_id is 32768 bytes")
    assert request_refusal(init(""), config) == (
        ErrorCode.INVALID_REQUEST,
        "transactional_id must not be empty",
    )


def test_topic_names_follow_kafkas_rule() -> None:
    config = FsmConfig()
    longest = "t" * MAX_TOPIC_NAME_CHARS
    assert request_refusal(AddPartitions("t", 1, 0, ((longest, 0),), 0, 0), config) is None
    for bad in ("t" * (MAX_TOPIC_NAME_CHARS + 1), ".", "..", "a/b", "tópico"):
        for command in (
            AddPartitions("t", 1, 0, (("ok", 0), (bad, 1)), 0, 0),
            OffsetCommit("g", (OffsetEntry(bad, 0, 1, ""),), 0),
            CreateTopic(bad, (1,), 0),
        ):
            refusal = request_refusal(command, config)
            assert refusal is not None, (bad, command)
            assert refusal[0] is ErrorCode.INVALID_TOPIC_EXCEPTION, refusal
            assert f"1-{MAX_TOPIC_NAME_CHARS} characters" in refusal[1]
    assert request_refusal(AddPartitions("t", 1, 0, (("", 0),), 0, 0), config) is not None
    refusal = request_refusal(CreateTopic("x" * 10_000, (1,), 0), config)
    assert refusal is not None and len(refusal[1]) < 300  # the name is shortened


def test_partition_lists_are_checked_before_proposing() -> None:
    config = FsmConfig(max_partitions_per_request=3)
    many = tuple(("t", p) for p in range(4))
    refusal = request_refusal(AddPartitions("t", 1, 0, many, 0, 0), config)
    assert refusal == (ErrorCode.INVALID_REQUEST, "4 partitions exceed the limit of 3")
    refusal = request_refusal(AddPartitions("t", 1, 0, (), 0, 0), config)
    assert refusal == (ErrorCode.INVALID_REQUEST, "no partitions given")


def test_client_refuses_a_too_long_id_when_constructed() -> None:
    with pytest.raises(ValueError, match=f"limit of {MAX_ID_BYTES} bytes"):
        TransactionalProducer(["127.0.0.1:1"], TOO_LONG_TID)
    with pytest.raises(ValueError, match=f"limit of {MAX_ID_BYTES} bytes"):
        Consumer(["127.0.0.1:1"], group_id="g" * (MAX_ID_BYTES + 1))


# --- a real cluster ---------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "cluster", partition_nodes=0) as cluster:
        yield cluster


def digests(cluster: LocalCluster) -> list[str]:
    """Per-shard state digests once all three replicas agree."""
    found: list[list[str] | None] = []

    def agree() -> bool:
        found[:] = [
            None if status is None else [s.state_digest for s in status.shards]
            for status in (cluster.node_status(n) for n in (1, 2, 3))
        ]
        return found[0] is not None and found[0] == found[1] == found[2]

    cluster.wait_until(agree, 15, "replicas did not converge")
    assert found[0] is not None
    return found[0]


def begin(client: Coordinators, tid: str) -> dict[str, Any]:
    answer = client.call(
        tid,
        "InitProducerId",
        coordinator_pb2.InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=60_000),
    )
    assert answer.error_code == ErrorCode.NONE, answer
    return {
        "transactional_id": tid,
        "producer_id": answer.producer_id,
        "producer_epoch": answer.producer_epoch,
    }


@pytest.mark.slow
def test_too_long_ids_are_refused_at_once_and_the_largest_legal_ones_replicate(
    cluster: LocalCluster,
) -> None:
    assert cluster.state is not None
    client = Coordinators([n.grpc for n in cluster.coordinators()])
    try:
        anchor = next(
            f"anchor-{i}"
            for i in range(1000)
            if shard_for(f"anchor-{i}", SHARDS) == shard_for(TOO_LONG_TID, SHARDS)
        )
        begin(client, anchor)
        before = digests(cluster)

        # Every node refuses, leader of the id's shard or not: nothing is proposed.
        init = coordinator_pb2.InitProducerIdRequest(
            transactional_id=TOO_LONG_TID, transaction_timeout_ms=1000
        )
        for stub in client.stubs.values():
            answer = stub.InitProducerId(init, timeout=5)
            assert answer.error_code == ErrorCode.INVALID_REQUEST, answer.error_message
            assert answer.error_message == (
                f"transactional_id is 80000 bytes of UTF-8, "
                f"more than the limit of {MAX_ID_BYTES} bytes"
            )
        ident = {"transactional_id": anchor, "producer_id": 1, "producer_epoch": 0}
        refused = client.call(
            anchor,
            "AddOffsetsToTxn",
            coordinator_pb2.AddOffsetsToTxnRequest(group_id="g" * (MAX_ID_BYTES + 1), **ident),
        )
        assert refused.error_code == ErrorCode.INVALID_REQUEST, refused
        refused = client.call(
            anchor,
            "AddPartitionsToTxn",
            coordinator_pb2.AddPartitionsToTxnRequest(topics=partitions("no/slash", 0), **ident),
        )
        assert refused.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION, refused
        assert digests(cluster) == before, "a refused request changed the replicated state"

        # The shard of the refused id goes on working.
        added = client.call(
            anchor,
            "AddOffsetsToTxn",
            coordinator_pb2.AddOffsetsToTxnRequest(
                group_id="anchor-group", **begin(client, anchor)
            ),
        )
        assert added.error_code == ErrorCode.NONE, added

        # The largest legal ids: every command of this transaction is a Raft
        # entry of more than 64 KiB, sent to the followers in chunks.
        ident = begin(client, LARGEST_TID)
        added = client.call(
            LARGEST_TID,
            "AddOffsetsToTxn",
            coordinator_pb2.AddOffsetsToTxnRequest(group_id=LARGEST_GROUP, **ident),
        )
        assert added.error_code == ErrorCode.NONE, added
        # As many offsets as one request may carry, some on a longest-named topic.
        longest = "t" * MAX_TOPIC_NAME_CHARS
        most = FsmConfig().max_partitions_per_request
        offsets = [
            coordinator_pb2.OffsetCommitTopic(
                topic=longest,
                partitions=[
                    coordinator_pb2.OffsetCommitPartition(partition=p, offset=p + 7)
                    for p in range(100)
                ],
            ),
            coordinator_pb2.OffsetCommitTopic(
                topic="in",
                partitions=[
                    coordinator_pb2.OffsetCommitPartition(partition=p, offset=p, metadata="é")
                    for p in range(most - 100)
                ],
            ),
        ]
        committed = client.call(
            LARGEST_GROUP,
            "TxnOffsetCommit",
            coordinator_pb2.TxnOffsetCommitRequest(group_id=LARGEST_GROUP, topics=offsets, **ident),
        )
        assert committed.error_code == ErrorCode.NONE, committed
        ended = client.call(
            LARGEST_TID, "EndTxn", coordinator_pb2.EndTxnRequest(committed=True, **ident)
        )
        assert ended.error_code == ErrorCode.NONE, ended

        def visible() -> bool:
            answer = client.call(
                LARGEST_GROUP,
                "OffsetFetch",
                coordinator_pb2.OffsetFetchRequest(
                    group_id=LARGEST_GROUP,
                    topics=[*partitions(longest, 0, 99), *partitions("in", most - 101)],
                    require_stable=True,
                ),
            )
            found = [(p.error_code, p.offset) for p in answer.partitions]
            return found == [
                (ErrorCode.NONE, 7),
                (ErrorCode.NONE, 106),
                (ErrorCode.NONE, most - 101),
            ]

        client.until(visible, 15, "the committed offsets did not become visible")

        def state() -> int:
            described = client.call(
                LARGEST_TID,
                "DescribeTransactions",
                coordinator_pb2.DescribeTransactionsRequest(transactional_ids=[LARGEST_TID]),
            )
            return int(described.transactions[0].state)

        # The offsets show once the group's marker is written; the transaction
        # completes with the entry that follows it.
        client.until(
            lambda: state() == common_pb2.TRANSACTION_STATE_COMPLETE_COMMIT,
            15,
            "the transaction did not complete",
        )
        digests(cluster)  # every replica applied the same entries
        for node in cluster.coordinators():  # and none failed on the way
            text = Path(node.log).read_text(encoding="utf-8", errors="replace")
            assert "Traceback" not in text and "CRITICAL" not in text, node.log
    finally:
        client.close()
