"""Kafka's transaction APIs: InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn and EndTxn, each sent to the leader of the transactional
id's shard (an InitProducerId without one to any coordinator)."""

from __future__ import annotations

from typing import Any

from raftcoord.kafka import messages as m
from raftcoord.kafka.apis.common import Data, Handler
from raftcoord.kafka.backend import Backend, Unreachable
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.v1 import coordinator_pb2


class TransactionAPIs:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def handlers(self) -> dict[int, Handler]:
        return {
            m.INIT_PRODUCER_ID: self.init_producer_id,
            m.ADD_PARTITIONS_TO_TXN: self.add_partitions_to_txn,
            m.ADD_OFFSETS_TO_TXN: self.add_offsets_to_txn,
            m.END_TXN: self.end_txn,
        }

    async def init_producer_id(self, request: m.Request) -> Data:
        """Versions 5 and 6 as 4, with v6's two-phase commit (KIP-939's
        ``Enable2Pc`` and ``KeepPreparedTxn``) passed on; the transaction
        it keeps is then ended by the client's EndTxn as any other of
        transactions v1."""
        body = request.body
        grpc_request = coordinator_pb2.InitProducerIdRequest(
            transaction_timeout_ms=m.milliseconds(body.transaction_timeout),
            enable_two_phase_commit=getattr(body, "enable2_pc", False),
            keep_prepared_txn=getattr(body, "keep_prepared_txn", False),
        )
        if body.transactional_id is not None:
            grpc_request.transactional_id = body.transactional_id
        if getattr(body, "producer_id", -1) >= 0:
            grpc_request.producer_id = body.producer_id
            grpc_request.producer_epoch = body.producer_epoch
        key = body.transactional_id
        if key is None:
            answer = await self._any_coordinator("InitProducerId", grpc_request)
        else:
            answer = await self.backend.to_leader(
                key, coordinator_pb2.TRANSACTION, "InitProducerId", grpc_request
            )
        ok = answer.error_code == 0
        return {
            "error_code": answer.error_code,
            "producer_id": answer.producer_id if ok else -1,
            "producer_epoch": answer.producer_epoch if ok else -1,
            "ongoing_txn_producer_id": (
                answer.ongoing_txn_producer_id
                if ok and answer.HasField("ongoing_txn_producer_id")
                else -1
            ),
            "ongoing_txn_producer_epoch": (
                answer.ongoing_txn_producer_epoch
                if ok and answer.HasField("ongoing_txn_producer_epoch")
                else -1
            ),
        }

    async def _any_coordinator(self, method: str, grpc_request: Any) -> Any:
        try:
            return await self.backend.any_coordinator(
                lambda stub: getattr(stub, method)(grpc_request, timeout=self.backend.rpc_timeout_s)
            )
        except Unreachable as exc:
            response_type = getattr(coordinator_pb2, f"{method}Response")
            return response_type(
                error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE, error_message=str(exc)
            )

    async def add_partitions_to_txn(self, request: m.Request) -> Data:
        body = request.body
        transactional_id = body.v3_and_below_transactional_id
        topics = body.v3_and_below_topics
        grpc_request = coordinator_pb2.AddPartitionsToTxnRequest(
            transactional_id=transactional_id,
            producer_id=body.v3_and_below_producer_id,
            producer_epoch=body.v3_and_below_producer_epoch,
        )
        for topic in topics:
            grpc_request.topics.add(topic=topic.name, partitions=list(topic.partitions))
        answer = await self.backend.to_leader(
            transactional_id, coordinator_pb2.TRANSACTION, "AddPartitionsToTxn", grpc_request
        )
        per_partition = {(r.topic, r.partition): r.error_code for r in answer.results}
        return {
            "results_by_topic_v3_and_below": [
                {
                    "name": topic.name,
                    "results_by_partition": [
                        {
                            "partition_index": p,
                            "partition_error_code": per_partition.get(
                                (topic.name, p), answer.error_code
                            ),
                        }
                        for p in topic.partitions
                    ],
                }
                for topic in topics
            ]
        }

    async def add_offsets_to_txn(self, request: m.Request) -> Data:
        body = request.body
        answer = await self.backend.to_leader(
            body.transactional_id,
            coordinator_pb2.TRANSACTION,
            "AddOffsetsToTxn",
            coordinator_pb2.AddOffsetsToTxnRequest(
                transactional_id=body.transactional_id,
                producer_id=body.producer_id,
                producer_epoch=body.producer_epoch,
                group_id=body.group_id,
            ),
        )
        return {"error_code": answer.error_code}

    async def end_txn(self, request: m.Request) -> Data:
        """EndTxn below version 5: the client speaks transactions v1 (its
        epoch stays, its sequences go on), and so does the coordinator for
        it (docs/kafka.md, "Transactions v1")."""
        body = request.body
        answer = await self.backend.to_leader(
            body.transactional_id,
            coordinator_pb2.TRANSACTION,
            "EndTxn",
            coordinator_pb2.EndTxnRequest(
                transactional_id=body.transactional_id,
                producer_id=body.producer_id,
                producer_epoch=body.producer_epoch,
                committed=body.committed,
                transaction_version=1,
            ),
        )
        return {"error_code": answer.error_code}
