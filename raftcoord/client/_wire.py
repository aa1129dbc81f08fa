"""Protocol messages of the client library: shared by the producer, the
consumer and the admin client, and the producer's Produce request."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from raftcoord.client._accumulator import ProducerBatch
from raftcoord.client.records import TopicPartition
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2, partition_log_pb2


def topic_partitions(tps: Iterable[TopicPartition]) -> list[common_pb2.TopicPartitions]:
    """``tps`` grouped by topic, as the protocol's TopicPartitions."""
    grouped: dict[str, list[int]] = {}
    for tp in sorted(set(tps)):
        grouped.setdefault(tp.topic, []).append(tp.partition)
    return [common_pb2.TopicPartitions(topic=t, partitions=ps) for t, ps in grouped.items()]


def offset_topics(offsets: Mapping[TopicPartition, int]) -> list[coordinator_pb2.OffsetCommitTopic]:
    """Offsets grouped by topic, as the protocol's OffsetCommitTopic."""
    grouped: dict[str, list[coordinator_pb2.OffsetCommitPartition]] = {}
    for key, offset in sorted(offsets.items()):
        tp = TopicPartition(*key)
        if offset < 0:
            raise ValueError(f"offset for {tp} must be >= 0, got {offset}")
        grouped.setdefault(tp.topic, []).append(
            coordinator_pb2.OffsetCommitPartition(
                partition=tp.partition, offset=offset, leader_epoch=-1
            )
        )
    return [coordinator_pb2.OffsetCommitTopic(topic=t, partitions=ps) for t, ps in grouped.items()]


def first_error(answer: Any) -> tuple[int, str]:
    """The request-level error of an answer, else its first per-partition error."""
    if answer.error_code != ErrorCode.NONE:
        return int(answer.error_code), str(answer.error_message)
    for result in answer.results:
        if result.error_code != ErrorCode.NONE:
            where = f"{result.topic}-{result.partition}"
            return int(result.error_code), result.error_message or f"partition {where}"
    return ErrorCode.NONE, ""


def produce_request(
    batches: list[ProducerBatch],
    transactional_id: str | None,
    flush_partitions: Sequence[TopicPartition] = (),
    leader_epoch: Callable[[TopicPartition], int | None] = lambda tp: None,
) -> partition_log_pb2.ProduceRequest:
    """One Produce request carrying ``batches`` (numbered already), of a
    transactional producer when ``transactional_id`` is given, naming the
    partitions its latest flush added to the transaction (``flush_partitions``)
    and each partition's ``leader_epoch`` where it is known."""
    request = partition_log_pb2.ProduceRequest(
        partitions=[
            partition_log_pb2.PartitionProduceData(
                topic=b.tp.topic,
                partition=b.tp.partition,
                batch=_record_batch(b, transactional_id is not None),
                current_leader_epoch=leader_epoch(b.tp),
            )
            for b in batches
        ]
    )
    if transactional_id is not None:
        request.transactional_id = transactional_id
        request.transaction_partitions.extend(topic_partitions(flush_partitions))
    return request


def _record_batch(batch: ProducerBatch, transactional: bool) -> partition_log_pb2.RecordBatch:
    records = []
    for r in batch.records:
        record = partition_log_pb2.Record(
            headers=[partition_log_pb2.RecordHeader(key=k, value=v) for k, v in r.headers],
            timestamp_ms=r.timestamp_ms,
        )
        if r.key is not None:
            record.key = r.key
        if r.value is not None:
            record.value = r.value
        records.append(record)
    assert batch.base_sequence is not None
    return partition_log_pb2.RecordBatch(
        producer_id=batch.producer_id,
        producer_epoch=batch.producer_epoch,
        base_sequence=batch.base_sequence,
        is_transactional=transactional,
        records=records,
    )
