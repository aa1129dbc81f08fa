"""Kafka's partition APIs: Produce, Fetch and ListOffsets, each split by
the partition-log node that leads the partitions named and sent to those
nodes at once (:meth:`raftcoord.kafka.backend.Backend.per_owner`)."""

from __future__ import annotations

from typing import Any

from raftcoord.kafka import messages as m
from raftcoord.kafka.apis.common import Data, Handler
from raftcoord.kafka.backend import Backend
from raftcoord.protocol.errors import STALE_METADATA, ErrorCode
from raftcoord.protocol.v1 import common_pb2, partition_log_pb2

#: Kafka's timestamps for ListOffsets: latest and earliest.
_LATEST, _EARLIEST = -1, -2


class PartitionAPIs:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def handlers(self) -> dict[int, Handler]:
        return {
            m.PRODUCE: self.produce,
            m.FETCH: self.fetch,
            m.LIST_OFFSETS: self.list_offsets,
        }

    async def produce(self, request: m.Request) -> Data | None:
        body = request.body
        items: list[tuple[str, int, partition_log_pb2.PartitionProduceData]] = []
        results: dict[tuple[str, int], Data] = {}
        for topic in body.topic_data:
            for p in topic.partition_data:
                # The batch goes to the node as it came; the node checks it.
                items.append(
                    (
                        topic.name,
                        p.index,
                        partition_log_pb2.PartitionProduceData(
                            topic=topic.name, partition=p.index, raw_batch=bytes(p.records or b"")
                        ),
                    )
                )

        async def call(stub: Any, parts: list[partition_log_pb2.PartitionProduceData]) -> Any:
            # acks passes through: all (-1) waits for the in-sync replicas.
            grpc_request = partition_log_pb2.ProduceRequest(partitions=parts, acks=body.acks)
            if body.transactional_id is not None:
                grpc_request.transactional_id = body.transactional_id
            return await stub.Produce(grpc_request, timeout=self.backend.rpc_timeout_s)

        done, failed = await self.backend.per_owner(items, call)
        for _, answer in done:
            for r in answer.partitions:
                if r.error_code in STALE_METADATA:
                    self.backend.forget_topic(r.topic)
                results[(r.topic, r.partition)] = {
                    "index": r.partition,
                    "error_code": r.error_code,
                    "base_offset": r.base_offset,
                    "log_start_offset": r.log_start_offset,
                    "error_message": r.error_message or None,
                }
        for topic_name, partition, code in failed:
            results[(topic_name, partition)] = _produce_error(partition, code, "")
        if body.acks == 0:
            return None
        return {
            "responses": [
                {
                    "name": topic.name,
                    "partition_responses": [
                        results[(topic.name, p.index)] for p in topic.partition_data
                    ],
                }
                for topic in body.topic_data
            ]
        }

    async def fetch(self, request: m.Request) -> Data:
        body = request.body
        isolation = wire_isolation(body.isolation_level)
        items: list[tuple[str, int, partition_log_pb2.FetchPartition]] = [
            (
                topic.topic,
                p.partition,
                partition_log_pb2.FetchPartition(
                    topic=topic.topic,
                    partition=p.partition,
                    fetch_offset=p.fetch_offset,
                    partition_max_bytes=p.partition_max_bytes,
                    current_leader_epoch=_current_leader_epoch(p),
                ),
            )
            for topic in body.topics
            for p in topic.partitions
        ]
        wait_ms = m.milliseconds(body.max_wait)

        async def call(stub: Any, parts: list[partition_log_pb2.FetchPartition]) -> Any:
            return await stub.Fetch(
                partition_log_pb2.FetchRequest(
                    isolation_level=isolation,
                    max_bytes=body.max_bytes,
                    partitions=parts,
                    max_wait_ms=wait_ms,
                    min_bytes=body.min_bytes,
                    raw=True,
                ),
                timeout=self.backend.rpc_timeout_s + wait_ms / 1000,
            )

        done, failed = await self.backend.per_owner(items, call)
        results: dict[tuple[str, int], Data] = {}
        read_committed = isolation == common_pb2.READ_COMMITTED
        for _, answer in done:
            for r in answer.partitions:
                if r.error_code in STALE_METADATA:
                    self.backend.forget_topic(r.topic)
                if r.error_code != ErrorCode.NONE:
                    results[(r.topic, r.partition)] = _fetch_error(r.partition, r.error_code)
                    continue
                results[(r.topic, r.partition)] = {
                    "partition_index": r.partition,
                    "error_code": 0,
                    "high_watermark": r.high_watermark,
                    "last_stable_offset": r.last_stable_offset,
                    "log_start_offset": r.log_start_offset,
                    # The stored batches as they are: the client skips the
                    # aborted transactions' records and the markers itself.
                    "aborted_transactions": (
                        [
                            {"producer_id": a.producer_id, "first_offset": a.first_offset}
                            for a in r.aborted_transactions
                        ]
                        if read_committed
                        else None
                    ),
                    "records": r.raw_batches,
                }
        for topic_name, partition, code in failed:
            results[(topic_name, partition)] = _fetch_error(partition, code)
        return {
            "error_code": 0,
            "session_id": 0,
            "responses": [
                {
                    "topic": topic.topic,
                    "partitions": [results[(topic.topic, p.partition)] for p in topic.partitions],
                }
                for topic in body.topics
            ],
        }

    async def list_offsets(self, request: m.Request) -> Data:
        body = request.body
        isolation = wire_isolation(getattr(body, "isolation_level", 0))
        items: list[tuple[str, int, partition_log_pb2.ListOffsetsPartition]] = []
        results: dict[tuple[str, int], Data] = {}
        for topic in body.topics:
            for p in topic.partitions:
                if p.timestamp == _EARLIEST:
                    spec = partition_log_pb2.OFFSET_SPEC_EARLIEST
                elif p.timestamp == _LATEST:
                    spec = partition_log_pb2.OFFSET_SPEC_LATEST
                else:
                    results[(topic.name, p.partition_index)] = _list_offsets_error(
                        p.partition_index, ErrorCode.INVALID_REQUEST
                    )
                    continue
                items.append(
                    (
                        topic.name,
                        p.partition_index,
                        partition_log_pb2.ListOffsetsPartition(
                            topic=topic.name,
                            partition=p.partition_index,
                            spec=spec,
                            current_leader_epoch=_current_leader_epoch(p),
                        ),
                    )
                )

        async def call(stub: Any, parts: list[partition_log_pb2.ListOffsetsPartition]) -> Any:
            return await stub.ListOffsets(
                partition_log_pb2.ListOffsetsRequest(isolation_level=isolation, partitions=parts),
                timeout=self.backend.rpc_timeout_s,
            )

        done, failed = await self.backend.per_owner(items, call)
        for _, answer in done:
            for r in answer.partitions:
                if r.error_code in STALE_METADATA:
                    self.backend.forget_topic(r.topic)
                results[(r.topic, r.partition)] = {
                    "partition_index": r.partition,
                    "error_code": r.error_code,
                    "timestamp": -1,
                    "offset": r.offset,
                    "leader_epoch": -1,  # unknown: the nodes do not say it
                }
        for topic_name, partition, code in failed:
            results[(topic_name, partition)] = _list_offsets_error(partition, code)
        return {
            "topics": [
                {
                    "name": topic.name,
                    "partitions": [
                        results[(topic.name, p.partition_index)] for p in topic.partitions
                    ],
                }
                for topic in body.topics
            ]
        }


def wire_isolation(level: int) -> common_pb2.IsolationLevel:
    """Kafka's isolation level (the same numbers) as the partition-log field."""
    return common_pb2.READ_COMMITTED if level == 1 else common_pb2.READ_UNCOMMITTED


def _current_leader_epoch(partition: Any) -> int | None:
    """The leader epoch a Fetch or ListOffsets partition names (KIP-320; the
    versions that carry it), None when it names none (-1): the node refuses
    an older one (FENCED_LEADER_EPOCH) or a newer one (UNKNOWN_LEADER_EPOCH)."""
    epoch = getattr(partition, "current_leader_epoch", -1)
    return int(epoch) if epoch >= 0 else None


def _produce_error(partition: int, code: int, message: str) -> Data:
    return {
        "index": partition,
        "error_code": code,
        "base_offset": -1,
        "log_start_offset": -1,
        "error_message": message or None,
    }


def _fetch_error(partition: int, code: int) -> Data:
    return {
        "partition_index": partition,
        "error_code": code,
        "high_watermark": -1,
        "last_stable_offset": -1,
        "log_start_offset": -1,
        # Empty, not null, as from Kafka's brokers: librdkafka refuses null records.
        "records": b"",
    }


def _list_offsets_error(partition: int, code: int) -> Data:
    return {"partition_index": partition, "error_code": code, "timestamp": -1, "offset": -1}
