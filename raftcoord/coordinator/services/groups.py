"""Consumer-group RPCs of TransactionCoordinator: TxnOffsetCommit,
OffsetCommit, OffsetFetch, and WriteTxnMarkers for groups (the marker
writers' COMMIT/ABORT of a group's pending offsets)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from fsm import (
    Command,
    ErrorCode,
    GroupMarker,
    OffsetCommit,
    OffsetEntry,
    Outcome,
    TxnOffsetCommit,
)
from fsm.limits import id_error
from fsm.metadata import TopicPartition
from raftcoord.coordinator.leader import Stamp, Unstamped
from raftcoord.coordinator.services.common import (
    NotForwarded,
    Refused,
    ShardRouter,
    partition_result,
    wait,
)
from raftcoord.coordinator.services.transactions import read_group_verification
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2, partition_log_pb2
from raftcoord.protocol.wire import wire_error

#: What a transaction's shard answers when it cannot verify now (retriable).
_UNVERIFIABLE = (
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT,
)


class GroupRPCs:
    def __init__(self, router: ShardRouter) -> None:
        self.router = router

    def TxnOffsetCommit(self, request: Any, context: Any) -> Any:
        """Stored only when the group is in the producer's ongoing transaction,
        as the transaction's shard has it (asked before proposing)."""
        offsets = _offset_entries(request.topics)

        def command(stamp: Stamp) -> Command:
            return TxnOffsetCommit(
                request.group_id,
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                offsets,
                stamp.now_ms,
            )

        def in_transaction() -> Outcome | None:
            error, message = self._verify_group(request, context)
            return None if error is ErrorCode.NONE else Outcome(error=error, message=message)

        outcome = self.router.run(self.router.shard_of(request.group_id), command, in_transaction)
        return coordinator_pb2.TxnOffsetCommitResponse(
            error_code=wire_error(outcome.error),
            error_message=outcome.message,
            results=[
                partition_result(TopicPartition(o.topic, o.partition), outcome.error)
                for o in offsets
            ],
        )

    def _verify_group(self, request: Any, context: Any) -> tuple[ErrorCode, str]:
        """Whether ``request.group_id`` is in the ongoing transaction of
        ``request``'s producer, asked of the transaction's shard leader (this
        node, or with a verify-only AddOffsetsToTxn); read through its log.

        Raises:
            Refused: the transaction's shard cannot answer now (retriable).
        """
        shard = self.router.shard_of(request.transactional_id)
        if self.router.shards.availability(shard) is ErrorCode.NONE:
            return read_group_verification(self.router, request)
        unavailable = f"the coordinator of the transaction (shard {shard}) cannot verify it"
        try:
            answer = self.router.forward(
                shard,
                context,
                "AddOffsetsToTxn",
                coordinator_pb2.AddOffsetsToTxnRequest(
                    transactional_id=request.transactional_id,
                    producer_id=request.producer_id,
                    producer_epoch=request.producer_epoch,
                    group_id=request.group_id,
                    verify_only=True,
                ),
            )
        except NotForwarded as why:
            raise Refused(
                ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{unavailable}: {why}; retry"
            ) from why
        error = ErrorCode(answer.error_code)
        if error in _UNVERIFIABLE:
            raise Refused(
                ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{unavailable}: {error.name}; retry"
            )
        return error, str(answer.error_message)

    def OffsetCommit(self, request: Any, context: Any) -> Any:
        offsets = _offset_entries(request.topics)
        outcome = self.router.run(
            self.router.shard_of(request.group_id),
            lambda stamp: OffsetCommit(request.group_id, offsets, stamp.now_ms),
        )
        return coordinator_pb2.OffsetCommitResponse(
            error_code=wire_error(outcome.error),
            error_message=outcome.message,
            results=[
                partition_result(TopicPartition(o.topic, o.partition), outcome.error)
                for o in offsets
            ],
        )

    def OffsetFetch(self, request: Any, context: Any) -> Any:
        if not request.group_id:
            return coordinator_pb2.OffsetFetchResponse(
                error_code=wire_error(ErrorCode.INVALID_REQUEST),
                error_message="group id must not be empty",
            )
        wanted = [TopicPartition(t.topic, p) for t in request.topics for p in t.partitions] or None
        try:
            fetched = self.router.read(
                self.router.shard_of(request.group_id),
                lambda machine: machine.offset_fetch(
                    request.group_id, wanted, request.require_stable
                ),
            )
        except Refused as refused:
            return coordinator_pb2.OffsetFetchResponse(
                error_code=wire_error(refused.error), error_message=refused.message
            )
        return coordinator_pb2.OffsetFetchResponse(
            error_code=wire_error(ErrorCode.NONE),
            partitions=[
                coordinator_pb2.OffsetFetchPartition(
                    topic=f.topic,
                    partition=f.partition,
                    offset=f.offset,
                    metadata=f.metadata,
                    error_code=wire_error(f.error),
                )
                for f in fetched
            ],
        )

    def WriteTxnMarkers(self, request: Any, context: Any) -> Any:
        """Group markers from marker writers: close each group's pending offsets
        (COMMIT makes them committed, ABORT drops them) on this node's shard
        for the group. Coordinators hold no data partitions: a marker that
        lists some gets INVALID_REQUEST for each."""
        answers = []
        waiting: list[tuple[Any, Future[Any]]] = []
        for marker in request.markers:
            answer = partition_log_pb2.TxnMarkerResult(
                producer_id=marker.producer_id, producer_epoch=marker.producer_epoch
            )
            answers.append(answer)
            for topic in marker.topics:
                for partition in topic.partitions:
                    answer.partitions.add(
                        topic=topic.topic,
                        partition=partition,
                        error_code=ErrorCode.INVALID_REQUEST,
                        error_message="coordinators hold no data partitions",
                    )
            for group_id in marker.groups:
                result = answer.groups.add(group_id=group_id)
                error = self._group_marker_refusal(marker, group_id)
                if error is not ErrorCode.NONE:
                    result.error_code = wire_error(error)
                    continue
                # Submitted together, the markers share one Raft entry per shard.
                future = self.router.shards.submit(
                    self.router.shard_of(group_id),
                    group_marker(
                        group_id,
                        marker.producer_id,
                        marker.producer_epoch,
                        marker.result == common_pb2.COMMIT,
                    ),
                )
                waiting.append((result, future))
        for result, future in waiting:
            outcome = wait(future)
            result.error_code = (
                outcome.error if isinstance(outcome, Outcome) else ErrorCode.UNKNOWN_SERVER_ERROR
            )
        return partition_log_pb2.WriteTxnMarkersResponse(markers=answers)

    def _group_marker_refusal(self, marker: Any, group_id: str) -> ErrorCode:
        if id_error("group_id", group_id) or marker.producer_id < 0 or marker.producer_epoch < 0:
            return ErrorCode.INVALID_REQUEST
        if marker.result not in (common_pb2.COMMIT, common_pb2.ABORT):
            return ErrorCode.INVALID_REQUEST
        return self.router.shards.availability(self.router.shard_of(group_id))


def group_marker(group_id: str, producer_id: int, producer_epoch: int, commit: bool) -> Unstamped:
    """The GroupMarker command that resolves a transaction's pending offsets."""
    return lambda stamp: GroupMarker(group_id, producer_id, producer_epoch, commit, stamp.now_ms)


def _offset_entries(topics: Any) -> tuple[OffsetEntry, ...]:
    return tuple(
        OffsetEntry(t.topic, p.partition, p.offset, p.metadata)
        for t in topics
        for p in t.partitions
    )
