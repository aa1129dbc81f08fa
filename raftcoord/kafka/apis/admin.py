"""Kafka's admin APIs of topics and transactions: CreateTopics (to a
coordinator that accepts it), DescribeTransactions (each id to its
shard's leader) and ListTransactions (the coordinators this gateway fronts)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import grpc.aio

from raftcoord.kafka import messages as m
from raftcoord.kafka.apis.common import Data, Gateways, Handler, each_once
from raftcoord.kafka.backend import NOT_PROCESSED, Backend
from raftcoord.protocol.errors import REDISCOVER, ErrorCode
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2
from raftcoord.protocol.wire import wire_state

log = logging.getLogger(__name__)


class AdminAPIs:
    def __init__(self, backend: Backend, gateways: Gateways) -> None:
        self.backend = backend
        self.gateways = gateways

    def handlers(self) -> dict[int, Handler]:
        return {
            m.CREATE_TOPICS: self.create_topics,
            m.DESCRIBE_TRANSACTIONS: self.describe_transactions,
            m.LIST_TRANSACTIONS: self.list_transactions,
        }

    async def create_topics(self, request: m.Request) -> Data:
        body = request.body
        answer = await self.backend.accepting_coordinator(
            "CreateTopics",
            coordinator_pb2.CreateTopicsRequest(
                topics=[
                    coordinator_pb2.CreatableTopic(
                        name=t.name,
                        num_partitions=t.num_partitions,
                        replication_factor=max(t.replication_factor, 0),
                        min_insync_replicas=_min_insync_replicas(t.configs),
                    )
                    for t in body.topics
                ],
                validate_only=body.validate_only,
            ),
        )
        by_name = {r.name: r for r in answer.results}
        topics = []
        for t in body.topics:
            result = by_name.get(t.name)
            code = ErrorCode.COORDINATOR_NOT_AVAILABLE if result is None else result.error_code
            topics.append(
                {
                    "name": t.name,
                    "error_code": code,
                    "error_message": None if result is None else result.error_message or None,
                    "num_partitions": t.num_partitions,
                    "replication_factor": t.replication_factor if t.replication_factor > 0 else 1,
                }
            )
        return {"topics": topics}

    async def describe_transactions(self, request: m.Request) -> Data:
        ids = list(request.body.transactional_ids)

        async def describe(transactional_id: str) -> Data:
            def entry(answer: Any) -> Any:
                return next(
                    (t for t in answer.transactions if t.transactional_id == transactional_id),
                    None,
                )

            answer = await self.backend.to_leader(
                transactional_id,
                coordinator_pb2.TRANSACTION,
                "DescribeTransactions",
                coordinator_pb2.DescribeTransactionsRequest(transactional_ids=[transactional_id]),
                not_taken=lambda a: entry(a) is None or entry(a).error_code in NOT_PROCESSED,
            )
            found = entry(answer)
            if found is not None and found.error_code in REDISCOVER:
                self.backend.forget_leader(transactional_id)
            if found is None:
                return {
                    "transactional_id": transactional_id,
                    "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    "transaction_state": "",
                    "transaction_start_time": -1,
                    "producer_id": -1,
                    "producer_epoch": -1,
                }
            return {
                "transactional_id": transactional_id,
                "error_code": found.error_code,
                "transaction_state": kafka_state_name(found.state),
                "transaction_timeout": found.transaction_timeout_ms,
                "transaction_start_time": found.transaction_start_time_ms,
                "producer_id": found.producer_id,
                "producer_epoch": found.producer_epoch,
                "topics": [
                    {"topic": t.topic, "partitions": list(t.partitions)} for t in found.topics
                ],
            }

        return {"transaction_states": await each_once(ids, describe)}

    async def list_transactions(self, request: m.Request) -> Data:
        """The transactions of the shards led by the coordinators this gateway
        fronts (Kafka's admin client asks every broker and merges the answers)."""
        body = request.body
        by_name = {kafka_state_name(n): n for n in common_pb2.TransactionState.values()}
        unknown = [s for s in body.state_filters if s not in by_name]
        grpc_request = coordinator_pb2.ListTransactionsRequest(
            state_filters=[wire_state(by_name[s]) for s in body.state_filters if s in by_name],
            producer_id_filters=list(body.producer_id_filters),
            duration_filter_ms=getattr(body, "duration_filter", -1),
        )
        listings: list[Data] = []
        error = ErrorCode.NONE
        for node in self.gateways.fronted_coordinators():
            try:
                answer = await self.backend.coordinator_stub(node).ListTransactions(
                    grpc_request, timeout=self.backend.rpc_timeout_s
                )
            except grpc.aio.AioRpcError as exc:
                # A coordinator that cannot be reached leads no shard the
                # others could not see: its shards have moved to live ones.
                log.info(
                    "event=coordinator_unreachable api=ListTransactions node=%s code=%s",
                    node,
                    exc.code().name,
                )
                continue
            if int(answer.error_code) != ErrorCode.NONE:
                error = ErrorCode(answer.error_code)
            listings += [
                {
                    "transactional_id": t.transactional_id,
                    "producer_id": t.producer_id,
                    "transaction_state": kafka_state_name(t.state),
                }
                for t in answer.transactions
            ]
        return {
            "error_code": error,
            "unknown_state_filters": unknown,
            "transaction_states": listings,
        }


def kafka_state_name(state: int) -> str:
    """Kafka's name of a transaction state (``TRANSACTION_STATE_COMPLETE_COMMIT``
    -> ``CompleteCommit``), as DescribeTransactions and ListTransactions carry it."""
    name = common_pb2.TransactionState.Name(state)
    return "".join(part.capitalize() for part in name.removeprefix("TRANSACTION_STATE_").split("_"))


def _min_insync_replicas(configs: Iterable[Any]) -> int:
    """A CreateTopics topic's ``min.insync.replicas`` config: 0 when it names
    none (the default), -1 when it is not a positive int32 (refused as
    INVALID_CONFIG)."""
    value = next((c.value for c in configs if c.name == "min.insync.replicas"), None)
    if value is None:
        return 0
    try:
        wanted = int(value)
    except ValueError:
        return -1
    return wanted if 0 < wanted < 2**31 else -1
