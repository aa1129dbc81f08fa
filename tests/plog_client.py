"""Raw gRPC helpers for the partition-log tests: produce one batch, read a
whole partition, write a marker, find the node that owns a partition."""

from __future__ import annotations

import time
from typing import Any

import grpc

from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.v1 import (
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    partition_log_pb2,
    partition_log_pb2_grpc,
)


def stub(address: str) -> Any:
    return partition_log_pb2_grpc.PartitionLogStub(grpc.insecure_channel(address))


#: How long a partition-log node may take to learn of a topic just created.
KNOWN_TIMEOUT_S = 10.0


def create_topic(
    cluster: LocalCluster, name: str, partitions: int, replication_factor: int = 1
) -> dict[int, str]:
    """Create ``name`` (one replica per partition unless ``replication_factor``
    says otherwise: these tests address one node's log) and return partition
    -> owning node's address, once every owner knows its partitions (a node
    learns of a new topic with its next metadata refresh; until then it
    answers UNKNOWN_TOPIC_OR_PARTITION, which clients retry and these raw
    requests do not)."""
    shard0 = cluster.leaders()[0]
    coordinator = coordinator_pb2_grpc.TransactionCoordinatorStub(
        grpc.insecure_channel(cluster._require().node(shard0).grpc)
    )
    created = coordinator.CreateTopics(
        coordinator_pb2.CreateTopicsRequest(
            topics=[
                coordinator_pb2.CreatableTopic(
                    name=name, num_partitions=partitions, replication_factor=replication_factor
                )
            ]
        ),
        timeout=10,
    )
    assert created.results[0].error_code == 0, created
    meta = coordinator.Metadata(coordinator_pb2.MetadataRequest(topics=[name]), timeout=5)
    nodes = {n.node_id: n.address for n in meta.partition_nodes}
    owners = {p.partition: nodes[p.node_id] for p in meta.topics[0].partitions}
    deadline = time.monotonic() + KNOWN_TIMEOUT_S
    for partition, address in owners.items():
        latest = partition_log_pb2.OFFSET_SPEC_LATEST
        while (
            list_offsets(stub(address), name, partition, latest).error_code
            == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        ):
            assert time.monotonic() < deadline, f"{address} never learnt of {name}-{partition}"
            time.sleep(0.05)
    return owners


def records(*values: bytes, key: bytes | None = b"k") -> list[Any]:
    made = []
    for i, value in enumerate(values):
        record = partition_log_pb2.Record(value=value, timestamp_ms=1_700_000_000_000 + i)
        if key is not None:
            record.key = key
        made.append(record)
    return made


def produce(
    node: Any,
    topic: str,
    partition: int,
    values: list[bytes],
    producer_id: int = -1,
    epoch: int = -1,
    sequence: int = -1,
    transactional: bool = False,
    transactional_id: str | None = None,
    timeout_s: float = 10.0,
    leader_epoch: int | None = None,
) -> Any:
    """Produce one batch (naming ``leader_epoch`` when given); returns the
    partition's PartitionProduceResponse."""
    request = partition_log_pb2.ProduceRequest(
        partitions=[
            partition_log_pb2.PartitionProduceData(
                topic=topic,
                partition=partition,
                batch=partition_log_pb2.RecordBatch(
                    producer_id=producer_id,
                    producer_epoch=epoch,
                    base_sequence=sequence,
                    is_transactional=transactional,
                    records=records(*values),
                ),
                current_leader_epoch=leader_epoch,
            )
        ]
    )
    if transactional_id is not None:
        request.transactional_id = transactional_id
    return node.Produce(request, timeout=timeout_s).partitions[0]


def read_all(
    node: Any, topic: str, partition: int, committed: bool, start: int = 0
) -> tuple[list[tuple[int, bytes]], Any]:
    """Every (offset, value) from ``start`` on; also the last partition answer."""
    isolation = common_pb2.READ_COMMITTED if committed else common_pb2.READ_UNCOMMITTED
    position, seen = start, []
    while True:
        answer = node.Fetch(
            partition_log_pb2.FetchRequest(
                isolation_level=isolation,
                partitions=[
                    partition_log_pb2.FetchPartition(
                        topic=topic, partition=partition, fetch_offset=position
                    )
                ],
            ),
            timeout=10,
        ).partitions[0]
        assert answer.error_code == 0, answer
        seen += [(r.offset, r.value) for r in answer.records]
        if answer.next_fetch_offset == position:
            return seen, answer
        position = answer.next_fetch_offset


def write_marker(
    node: Any,
    topic: str,
    partition: int,
    producer_id: int,
    epoch: int,
    commit: bool,
    coordinator_epoch: int = 1,
) -> Any:
    """One marker for one partition; returns its PartitionResult."""
    answer = node.WriteTxnMarkers(
        partition_log_pb2.WriteTxnMarkersRequest(
            markers=[
                partition_log_pb2.TxnMarker(
                    producer_id=producer_id,
                    producer_epoch=epoch,
                    coordinator_epoch=coordinator_epoch,
                    result=common_pb2.COMMIT if commit else common_pb2.ABORT,
                    topics=[common_pb2.TopicPartitions(topic=topic, partitions=[partition])],
                )
            ]
        ),
        timeout=10,
    )
    return answer.markers[0].partitions[0]


def list_offsets(node: Any, topic: str, partition: int, spec: int) -> Any:
    """The node's ListOffsets answer for one partition."""
    return node.ListOffsets(
        partition_log_pb2.ListOffsetsRequest(
            partitions=[
                partition_log_pb2.ListOffsetsPartition(topic=topic, partition=partition, spec=spec)
            ]
        ),
        timeout=5,
    ).partitions[0]


def list_offset(node: Any, topic: str, partition: int, spec: int) -> int:
    answer = list_offsets(node, topic, partition, spec)
    assert answer.error_code == 0, answer
    return int(answer.offset)
