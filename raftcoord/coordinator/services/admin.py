"""Operator queries: DescribeTransactions and ListTransactions (served by
TransactionCoordinator) and the CoordinatorAdmin service (NodeStatus)."""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import grpc

from fsm import ErrorCode, TransactionStateMachine, TxnState
from fsm.metadata import TransactionMetadata
from fsm.states import PREPARE_STATES
from marker_writer import ConsumerGroup, DataPartition, DeliveryProblem, Participant, TxnKey
from raftcoord.coordinator.markers import MarkerWriters
from raftcoord.coordinator.services.common import Refused, ShardRouter
from raftcoord.coordinator.shard import Reader, Shards
from raftcoord.protocol.acl import Operation, ResourceType
from raftcoord.protocol.config import ClusterConfig
from raftcoord.protocol.tls import cluster_refusal
from raftcoord.protocol.v1 import admin_pb2, admin_pb2_grpc, common_pb2, coordinator_pb2
from raftcoord.protocol.wire import wire_error, wire_state


class TransactionQueries:
    def __init__(self, router: ShardRouter, markers: MarkerWriters) -> None:
        self.router = router
        self.markers = markers

    def DescribeTransactions(self, request: Any, context: Any) -> Any:
        descriptions = []
        who = self.router.caller(context)
        for tid in request.transactional_ids:
            shard = self.router.shard_of(tid)
            denied = self.router.denied(
                who, (Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, tid)
            )
            if denied is not None:
                descriptions.append(_no_description(tid, denied.error))
                continue
            try:
                meta = self.router.read(shard, _describe(tid))
            except Refused as refused:
                descriptions.append(_no_description(tid, refused.error))
                continue
            if meta is None:
                descriptions.append(_no_description(tid, ErrorCode.TRANSACTIONAL_ID_NOT_FOUND))
                continue
            topics: dict[str, list[int]] = {}
            for topic, partition in sorted(meta.partitions):
                topics.setdefault(topic, []).append(partition)
            descriptions.append(
                coordinator_pb2.TransactionDescription(
                    error_code=wire_error(ErrorCode.NONE),
                    transactional_id=tid,
                    state=wire_state(int(meta.state)),
                    producer_id=meta.producer_id,
                    producer_epoch=meta.producer_epoch,
                    transaction_timeout_ms=meta.timeout_ms,
                    transaction_start_time_ms=meta.txn_start_ms,
                    last_update_time_ms=meta.last_update_ms,
                    topics=[
                        common_pb2.TopicPartitions(topic=t, partitions=ps)
                        for t, ps in topics.items()
                    ],
                    groups=sorted(meta.groups),
                    coordinator_epoch=meta.coordinator_epoch,
                    pending_markers=self._pending_markers(shard, meta),
                    last_producer_id=meta.last_producer_id,
                    last_producer_epoch=meta.last_producer_epoch,
                    ongoing_txn_producer_id=meta.ongoing_producer_id,
                    ongoing_txn_producer_epoch=meta.ongoing_producer_epoch,
                    two_phase_commit=meta.two_phase,
                    txn_number=meta.txn_number,
                    transaction_version=meta.transaction_version,
                )
            )
        return coordinator_pb2.DescribeTransactionsResponse(transactions=descriptions)

    def _pending_markers(self, shard: int, meta: TransactionMetadata) -> list[Any]:
        """The markers a Prepare* transaction still owes, each with the last
        problem its delivery met, as this node's marker writer knows them."""
        if meta.state not in PREPARE_STATES:
            return []
        key = TxnKey(meta.transactional_id, meta.producer_id, meta.producer_epoch, meta.txn_number)
        owed = self.markers.pending(shard, key)
        if owed is None:  # not taken up by a writer yet: nothing tried
            participants: list[Participant] = [DataPartition(*tp) for tp in sorted(meta.partitions)]
            participants.extend(ConsumerGroup(g) for g in sorted(meta.groups))
            owed = dict.fromkeys(participants)
        return [_pending_marker(p, problem) for p, problem in owed.items()]

    def ListTransactions(self, request: Any, context: Any) -> Any:
        """Transactions of the shards this node leads (ask every node for all)."""
        states = [TxnState(s) for s in request.state_filters if s in TxnState._value2member_map_]
        listings: list[coordinator_pb2.TransactionListing] = []
        who = self.router.caller(context)
        for shard in range(self.router.config.shard_count):
            if self.router.shards.availability(shard) is not ErrorCode.NONE:
                continue
            list_now = partial(
                TransactionStateMachine.list_transactions,
                now_ms=self.router.shards.now_ms(shard),
                states=states,
                producer_ids=request.producer_id_filters,
                min_duration_ms=request.duration_filter_ms,
            )
            try:
                rows = self.router.read(shard, list_now)
            except Refused:
                continue
            visible = set(
                self.router.authorizer.filter(
                    who,
                    Operation.DESCRIBE,
                    ResourceType.TRANSACTIONAL_ID,
                    (r.transactional_id for r in rows),
                )
            )
            listings.extend(
                coordinator_pb2.TransactionListing(
                    transactional_id=r.transactional_id,
                    producer_id=r.producer_id,
                    state=wire_state(int(r.state)),
                    duration_ms=r.duration_ms,
                )
                for r in rows
                if r.transactional_id in visible
            )
        return coordinator_pb2.ListTransactionsResponse(
            error_code=wire_error(ErrorCode.NONE), transactions=listings
        )


class AdminService(admin_pb2_grpc.CoordinatorAdminServicer):
    def __init__(self, shards: Shards, config: ClusterConfig, node_id: int) -> None:
        self.shards = shards
        self.config = config
        self.node_id = node_id

    def NodeStatus(self, request: Any, context: Any) -> Any:
        refused = cluster_refusal(self.config, context)
        if refused is not None:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, refused)
        statuses = []
        for shard in range(self.config.shard_count):
            leader = self.shards.leader_of(shard)
            status = self.shards.status(shard)
            statuses.append(
                admin_pb2.ShardStatus(
                    shard=shard,
                    is_leader=status.ready_leader,
                    term=status.term,
                    leader_node_id=-1 if leader is None else leader.node_id,
                    leader_address="" if leader is None else leader.grpc,
                    commit_index=status.commit_index,
                    applied_index=status.applied_index,
                    state_digest=status.state_digest,
                    transactional_ids=status.transactional_ids,
                    parked_requests=status.parked_requests,
                )
            )
        return admin_pb2.NodeStatusResponse(
            node_id=self.node_id,
            address=self.config.coordinator(self.node_id).grpc,
            pid=os.getpid(),
            shards=statuses,
        )

    def Ping(self, request: Any, context: Any) -> Any:
        return admin_pb2.PingResponse()

    def ElectLeaders(self, request: Any, context: Any) -> Any:
        refused = cluster_refusal(self.config, context)
        if refused is not None:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, refused)
        return admin_pb2.ElectLeadersResponse(shards=self.shards.elect_preferred_leaders())


def _describe(transactional_id: str) -> Reader[TransactionMetadata | None]:
    return lambda machine: machine.describe(transactional_id)


def _pending_marker(participant: Participant, problem: DeliveryProblem | None) -> Any:
    marker = coordinator_pb2.PendingMarker(
        last_error_code=wire_error(ErrorCode.NONE if problem is None else problem.code),
        last_error_message="" if problem is None else problem.message,
    )
    if isinstance(participant, DataPartition):
        marker.topic, marker.partition = participant.topic, participant.partition
    else:
        marker.group_id = participant.group_id
    return marker


def _no_description(transactional_id: str, error: ErrorCode) -> Any:
    """A DescribeTransactions entry for an id that cannot be described."""
    return coordinator_pb2.TransactionDescription(
        error_code=wire_error(error),
        transactional_id=transactional_id,
        producer_id=-1,
        producer_epoch=-1,
        transaction_start_time_ms=-1,
        last_producer_id=-1,
        last_producer_epoch=-1,
        ongoing_txn_producer_id=-1,
        ongoing_txn_producer_epoch=-1,
    )
