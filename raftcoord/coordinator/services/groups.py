"""Consumer-group RPCs of TransactionCoordinator: TxnOffsetCommit,
OffsetCommit, OffsetFetch, WriteTxnMarkers for groups (the marker writers'
COMMIT/ABORT of a group's pending offsets), and group membership: JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, DescribeGroups, ListGroups.

Membership changes are commands replicated like the others
(:mod:`fsm.membership`). What Kafka's coordinator holds back, this layer
waits for: a JoinGroup is answered once the group's join completes, a
follower's SyncGroup once the leader's assignment is applied. A waiting
request looks at the applied group again each time an entry of the group's
shard applies; it is answered NOT_COORDINATOR as soon as this node stops
leading the shard. At most :data:`MAX_WAITING` requests wait at once on a
node, so waiting requests never hold every gRPC thread: a JoinGroup or
SyncGroup takes a waiting slot before its command is proposed, and when
none is free, one that would wait (its command run on the applied group)
is answered COORDINATOR_NOT_AVAILABLE (which clients retry) without
proposing, so that the refusal changes nothing.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

from fsm import (
    NO_GENERATION,
    Command,
    ErrorCode,
    FsmConfig,
    GroupMarker,
    GroupMembership,
    GroupProtocol,
    GroupState,
    Heartbeat,
    JoinGroup,
    LeaveGroup,
    MemberAssignment,
    OffsetCommit,
    OffsetEntry,
    Outcome,
    SyncGroup,
    TransactionStateMachine,
    TxnOffsetCommit,
)
from fsm.limits import id_error
from fsm.membership import join_group, sync_group
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
from raftcoord.protocol.acl import Operation, Principal, ResourceType
from raftcoord.protocol.limits import GROUP_MAX_WAIT_S, GROUP_WAIT_GRACE_S, MAX_ID_BYTES
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2, partition_log_pb2
from raftcoord.protocol.wire import marker_identity, wire_error

T = TypeVar("T")

#: Most JoinGroup/SyncGroup requests waiting at once on one node.
MAX_WAITING = 16
#: Longest client id kept as the prefix of an assigned member id.
MEMBER_ID_PREFIX_CHARS = 100
#: What an assigned member id adds to its prefix: "-" and a UUID.
MEMBER_ID_SUFFIX_BYTES = 37

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
        self._waiting = threading.BoundedSemaphore(MAX_WAITING)

    def TxnOffsetCommit(self, request: Any, context: Any) -> Any:
        """Stored only when the group is in the producer's ongoing transaction,
        as the transaction's shard has it (asked before proposing)."""
        offsets = _offset_entries(request.topics)
        who = self.router.caller(context)
        denied = self.router.denied(
            who,
            (Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id),
            *self._group_and_topics(Operation.READ, request.group_id, offsets),
        )
        if denied is not None:
            return _offsets_answer(coordinator_pb2.TxnOffsetCommitResponse, denied, offsets)

        def command(stamp: Stamp) -> Command:
            return TxnOffsetCommit(
                request.group_id,
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                offsets,
                stamp.now_ms,
                _generation(request),
                request.member_id,
                request.group_instance_id,
            )

        def in_transaction() -> Outcome | None:
            error, message = self._verify_group(request, context)
            return None if error is ErrorCode.NONE else Outcome(error=error, message=message)

        outcome = self.router.run(self.router.shard_of(request.group_id), command, in_transaction)
        return _offsets_answer(coordinator_pb2.TxnOffsetCommitResponse, outcome, offsets)

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
        denied = self.router.denied(
            self.router.caller(context),
            *self._group_and_topics(Operation.READ, request.group_id, offsets),
        )
        if denied is not None:
            return _offsets_answer(coordinator_pb2.OffsetCommitResponse, denied, offsets)
        outcome = self.router.run(
            self.router.shard_of(request.group_id),
            lambda stamp: OffsetCommit(
                request.group_id,
                offsets,
                stamp.now_ms,
                _generation(request),
                request.member_id,
                request.group_instance_id,
            ),
        )
        return _offsets_answer(coordinator_pb2.OffsetCommitResponse, outcome, offsets)

    def OffsetFetch(self, request: Any, context: Any) -> Any:
        if not request.group_id:
            return coordinator_pb2.OffsetFetchResponse(
                error_code=wire_error(ErrorCode.INVALID_REQUEST),
                error_message="group id must not be empty",
            )
        wanted = [TopicPartition(t.topic, p) for t in request.topics for p in t.partitions] or None
        who = self.router.caller(context)
        denied = self.router.denied(who, (Operation.DESCRIBE, ResourceType.GROUP, request.group_id))
        if denied is not None:
            return coordinator_pb2.OffsetFetchResponse(
                error_code=wire_error(denied.error), error_message=denied.message
            )
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
                for f in self._describable(who, fetched, wanted is None)
            ],
        )

    def _describable(self, who: Principal, fetched: list[Any], listing: bool) -> list[Any]:
        """OffsetFetch's partitions as ``who`` may see them (Kafka's rule):
        a topic it may not DESCRIBE is left out of a listing of the whole
        group, and answered TOPIC_AUTHORIZATION_FAILED when asked for."""
        if not self.router.authorizer.enabled:
            return fetched
        topics = {f.topic for f in fetched}
        visible = set(
            self.router.authorizer.filter(who, Operation.DESCRIBE, ResourceType.TOPIC, topics)
        )
        if listing:
            return [f for f in fetched if f.topic in visible]
        return [
            f
            if f.topic in visible
            else replace(f, offset=-1, metadata="", error=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            for f in fetched
        ]

    def _group_and_topics(
        self, operation: Operation, group_id: str, offsets: tuple[OffsetEntry, ...]
    ) -> list[tuple[Operation, ResourceType, str]]:
        """The checks of an offset commit: the group, then each topic (READ)."""
        topics = sorted({o.topic for o in offsets})
        return [(operation, ResourceType.GROUP, group_id)] + [
            (Operation.READ, ResourceType.TOPIC, t) for t in topics
        ]

    def WriteTxnMarkers(self, request: Any, context: Any) -> Any:
        """Group markers from marker writers: close each group's pending offsets
        (COMMIT makes them committed, ABORT drops them) on this node's shard
        for the group. Coordinators hold no data partitions: a marker that
        lists some gets INVALID_REQUEST for each."""
        answers = []
        waiting: list[tuple[Any, Future[Any]]] = []
        refused = self.router.cluster_refusal(context, "coordinators")
        if refused is not None:
            return partition_log_pb2.WriteTxnMarkersResponse(
                markers=[
                    partition_log_pb2.TxnMarkerResult(
                        producer_id=m.producer_id,
                        producer_epoch=m.producer_epoch,
                        groups=[
                            partition_log_pb2.GroupResult(
                                group_id=g,
                                error_code=wire_error(ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
                            )
                            for g in m.groups
                        ],
                    )
                    for m in request.markers
                ]
            )
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
                        marker.coordinator_epoch,
                        *marker_identity(marker),
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
        if not self._epoch_confirmed(marker):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE  # retriable: this replica may lag
        return self.router.shards.availability(self.router.shard_of(group_id))

    def _epoch_confirmed(self, marker: Any) -> bool:
        """Whether the marker's coordinator epoch is no higher than the term
        of its transaction's shard as this node's replica knows it (of any
        shard, for a marker that names no transactional id), as the
        partition-log nodes check: a higher one was no leader's."""
        shards = self.router.shards
        if marker.transactional_id:
            return bool(
                marker.coordinator_epoch
                <= shards.term(self.router.shard_of(marker.transactional_id))
            )
        return bool(
            marker.coordinator_epoch
            <= max(shards.term(i) for i in range(self.router.config.shard_count))
        )

    # --- membership ----------------------------------------------------------------

    def JoinGroup(self, request: Any, context: Any) -> Any:
        denied = self._group_denied(context, request.group_id)
        if denied is not None:
            return coordinator_pb2.JoinGroupResponse(
                error_code=wire_error(denied.error), error_message=denied.message, generation_id=-1
            )
        shard = self.router.shard_of(request.group_id)
        new_member_id = ""
        if not request.member_id:
            new_member_id = _new_member_id(request.group_instance_id, request.client_id)
        protocols = tuple(GroupProtocol(p.name, p.metadata) for p in request.protocols)

        def command(stamp: Stamp) -> JoinGroup:
            return JoinGroup(
                request.group_id,
                request.member_id,
                request.group_instance_id,
                request.client_id,
                request.protocol_type,
                protocols,
                request.session_timeout_ms,
                request.rebalance_timeout_ms,
                new_member_id,
                stamp.now_ms,
            )

        def waits(group: GroupMembership | None, config: FsmConfig) -> bool:
            after, outcome = join_group(
                group, command(Stamp(self.router.shards.now_ms(shard), 0)), config
            )
            return (
                outcome.ok and after is not None and after.state is GroupState.PREPARING_REBALANCE
            )

        member_id = request.member_id or new_member_id
        with self._slot(shard, request.group_id, waits) as admitted:
            outcome = admitted or self.router.run(shard, command)
            if outcome.error is not ErrorCode.NONE:
                return coordinator_pb2.JoinGroupResponse(
                    error_code=wire_error(outcome.error),
                    error_message=outcome.message,
                    generation_id=-1,
                    member_id=member_id if outcome.error is ErrorCode.MEMBER_ID_REQUIRED else "",
                )

            def joined(group: GroupMembership | None) -> Any:
                if group is not None and (
                    group.state is GroupState.PREPARING_REBALANCE
                    and group.generation <= outcome.generation
                ):
                    return None  # the join has not completed yet
                return _join_answer(group, member_id)

            wait_s = request.rebalance_timeout_ms / 1000 + GROUP_WAIT_GRACE_S
            try:
                return self._await_group(shard, request.group_id, joined, wait_s)
            except Refused as refused:
                return coordinator_pb2.JoinGroupResponse(
                    error_code=wire_error(refused.error),
                    error_message=refused.message,
                    generation_id=-1,
                )

    def SyncGroup(self, request: Any, context: Any) -> Any:
        denied = self._group_denied(context, request.group_id)
        if denied is not None:
            return coordinator_pb2.SyncGroupResponse(
                error_code=wire_error(denied.error), error_message=denied.message
            )
        shard = self.router.shard_of(request.group_id)
        assignments = tuple(
            MemberAssignment(a.member_id, a.assignment) for a in request.assignments
        )

        def command(stamp: Stamp) -> SyncGroup:
            return SyncGroup(
                request.group_id,
                request.member_id,
                request.group_instance_id,
                request.generation_id,
                assignments,
                stamp.now_ms,
            )

        def waits(group: GroupMembership | None, config: FsmConfig) -> bool:
            after, outcome = sync_group(group, command(Stamp(self.router.shards.now_ms(shard), 0)))
            return (
                outcome.ok and after is not None and after.state is GroupState.COMPLETING_REBALANCE
            )

        with self._slot(shard, request.group_id, waits) as admitted:
            outcome = admitted or self.router.run(shard, command)
            if outcome.error is not ErrorCode.NONE:
                return coordinator_pb2.SyncGroupResponse(
                    error_code=wire_error(outcome.error), error_message=outcome.message
                )
            return self._await_sync(shard, request)

    def _await_sync(self, shard: int, request: Any) -> Any:
        """The answer to a SyncGroup whose command applied without error."""

        def synced(group: GroupMembership | None) -> Any:
            if group is None or request.member_id not in group.members:
                return _sync_error(ErrorCode.UNKNOWN_MEMBER_ID, "no longer a member")
            if group.generation != request.generation_id:
                return _sync_error(ErrorCode.ILLEGAL_GENERATION, "the group moved on")
            if group.state is GroupState.PREPARING_REBALANCE:
                return _sync_error(ErrorCode.REBALANCE_IN_PROGRESS, "the group rebalances")
            if group.state is not GroupState.STABLE:
                return None  # the leader's assignment has not come yet
            for wanted, name in (
                (request.protocol_type, group.protocol_type),
                (request.protocol_name, group.protocol_name),
            ):
                if wanted and wanted != name:
                    return _sync_error(
                        ErrorCode.INCONSISTENT_GROUP_PROTOCOL, f"the group's protocol is {name!r}"
                    )
            return coordinator_pb2.SyncGroupResponse(
                error_code=wire_error(ErrorCode.NONE),
                protocol_type=group.protocol_type,
                protocol_name=group.protocol_name,
                assignment=group.members[request.member_id].assignment,
            )

        def session_s(group: GroupMembership | None) -> float:
            member = None if group is None else group.members.get(request.member_id)
            return 0.0 if member is None else member.session_timeout_ms / 1000

        try:
            wait_s = self.router.shards.query(shard, lambda m: session_s(m.group(request.group_id)))
            return self._await_group(shard, request.group_id, synced, wait_s + GROUP_WAIT_GRACE_S)
        except Refused as refused:
            return _sync_error(refused.error, refused.message)

    def Heartbeat(self, request: Any, context: Any) -> Any:
        denied = self._group_denied(context, request.group_id)
        if denied is not None:
            return coordinator_pb2.HeartbeatResponse(
                error_code=wire_error(denied.error), error_message=denied.message
            )
        outcome = self.router.run(
            self.router.shard_of(request.group_id),
            lambda stamp: Heartbeat(
                request.group_id,
                request.member_id,
                request.group_instance_id,
                request.generation_id,
                stamp.now_ms,
            ),
        )
        return coordinator_pb2.HeartbeatResponse(
            error_code=wire_error(outcome.error), error_message=outcome.message
        )

    def LeaveGroup(self, request: Any, context: Any) -> Any:
        denied = self._group_denied(context, request.group_id)
        if denied is not None:
            return coordinator_pb2.LeaveGroupResponse(
                error_code=wire_error(denied.error), error_message=denied.message
            )
        shard = self.router.shard_of(request.group_id)
        try:
            self.router.check(shard)
        except Refused as refused:
            return coordinator_pb2.LeaveGroupResponse(
                error_code=wire_error(refused.error), error_message=refused.message
            )
        if not request.members:
            return coordinator_pb2.LeaveGroupResponse(
                error_code=wire_error(ErrorCode.INVALID_REQUEST), error_message="no members given"
            )
        # One command per member (Kafka answers each member on its own).
        outcomes = [
            self.router.run(shard, _leave(request.group_id, m.member_id, m.group_instance_id))
            for m in request.members
        ]
        shared = {o.error for o in outcomes} - _MEMBER_ERRORS - {ErrorCode.NONE}
        top = next(iter(shared), ErrorCode.NONE)
        return coordinator_pb2.LeaveGroupResponse(
            error_code=wire_error(top),
            error_message="" if top is ErrorCode.NONE else top.name,
            members=[
                coordinator_pb2.LeaveGroupMemberResponse(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    error_code=wire_error(o.error),
                )
                for m, o in zip(request.members, outcomes, strict=True)
            ],
        )

    def DescribeGroups(self, request: Any, context: Any) -> Any:
        described = []
        who = self.router.caller(context)
        for group_id in request.group_ids:
            try:
                if id_error("group_id", group_id):
                    raise Refused(ErrorCode.INVALID_REQUEST, "invalid group id")
                denied = self.router.denied(who, (Operation.DESCRIBE, ResourceType.GROUP, group_id))
                if denied is not None:
                    raise Refused(denied.error, denied.message)
                group, state = self.router.read(self.router.shard_of(group_id), _group_of(group_id))
            except Refused as refused:
                described.append(
                    coordinator_pb2.DescribedGroup(
                        error_code=wire_error(refused.error), group_id=group_id
                    )
                )
                continue
            described.append(_describe(group_id, group, state))
        return coordinator_pb2.DescribeGroupsResponse(groups=described)

    def ListGroups(self, request: Any, context: Any) -> Any:
        """The groups of the shards this node leads that the caller may
        describe (ask every node for all)."""
        who = self.router.caller(context)
        listed: list[tuple[str, str]] = []
        for shard in range(self.router.config.shard_count):
            if self.router.shards.availability(shard) is not ErrorCode.NONE:
                continue
            try:
                listed.extend(self.router.read(shard, TransactionStateMachine.list_groups))
            except Refused:
                continue
        visible = set(
            self.router.authorizer.filter(
                who, Operation.DESCRIBE, ResourceType.GROUP, (gid for gid, _ in listed)
            )
        )
        return coordinator_pb2.ListGroupsResponse(
            error_code=wire_error(ErrorCode.NONE),
            groups=[
                coordinator_pb2.ListedGroup(group_id=gid, state=state)
                for gid, state in sorted(listed)
                if gid in visible
            ],
        )

    def _group_denied(self, context: Any, group_id: str) -> Outcome | None:
        """The refusal of a membership request whose caller may not READ the group."""
        return self.router.denied(
            self.router.caller(context), (Operation.READ, ResourceType.GROUP, group_id)
        )

    @contextmanager
    def _slot(
        self,
        shard: int,
        group_id: str,
        waits: Callable[[GroupMembership | None, FsmConfig], bool],
    ) -> Iterator[Outcome | None]:
        """A waiting slot for a JoinGroup or SyncGroup, held for the block.

        Yields None when the request may go on: a slot was free, or
        ``waits`` (the request's command run on the applied group) says
        it will be answered at once (should the group change before the
        command applies so that it waits after all, it waits without a
        slot). Otherwise yields the refusal (COORDINATOR_NOT_AVAILABLE), to
        answer without proposing.
        """
        taken = self._waiting.acquire(blocking=False)
        try:
            if not taken and self.router.shards.query(
                shard, lambda m: waits(m.group(group_id), m.config)
            ):
                yield Outcome(
                    error=ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    message="too many group requests waiting; retry",
                )
            else:
                yield None
        finally:
            if taken:
                self._waiting.release()

    def _await_group(
        self,
        shard: int,
        group_id: str,
        answer: Callable[[GroupMembership | None], T | None],
        timeout_s: float,
    ) -> T:
        """``answer`` of the applied group, once it is not None (the caller
        holds a slot of :meth:`_slot`).

        Raises:
            Refused: this node stopped leading the shard (NOT_COORDINATOR),
                or ``timeout_s`` passed.
        """
        shards = self.router.shards
        deadline = time.monotonic() + min(timeout_s, GROUP_MAX_WAIT_S)
        # Read before looking: a change after it wakes the wait below.
        seen = shards.change_count(shard)
        while True:
            if shards.availability(shard) is not ErrorCode.NONE:
                raise Refused(
                    ErrorCode.NOT_COORDINATOR, "the group's coordinator changed; find it again"
                )
            found = answer(shards.query(shard, lambda m: m.group(group_id)))
            if found is not None:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise Refused(ErrorCode.REBALANCE_IN_PROGRESS, "the rebalance did not end")
            seen = shards.await_change(shard, seen, left)


#: Per-member LeaveGroup answers (the others concern the whole request).
_MEMBER_ERRORS = frozenset({ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID})


def _generation(request: Any) -> int:
    """An offset commit's generation; absent means no group membership."""
    return int(request.generation_id) if request.HasField("generation_id") else NO_GENERATION


def _leave(group_id: str, member_id: str, group_instance_id: str) -> Unstamped:
    return lambda stamp: LeaveGroup(group_id, member_id, group_instance_id, stamp.now_ms)


def _group_of(
    group_id: str,
) -> Callable[[TransactionStateMachine], tuple[GroupMembership | None, str]]:
    """A group's membership and Kafka's state name of the group."""
    return lambda machine: (machine.group(group_id), machine.group_state(group_id))


def _new_member_id(group_instance_id: str, client_id: str) -> str:
    """A member id for a first join: the instance id (or client id) and a
    UUID, the prefix cut so that the id stays within the id limit."""
    prefix = group_instance_id or client_id[:MEMBER_ID_PREFIX_CHARS] or "member"
    room = MAX_ID_BYTES - MEMBER_ID_SUFFIX_BYTES
    cut = prefix.encode()[:room].decode(errors="ignore")
    return f"{cut}-{uuid.uuid4()}"


def _join_answer(group: GroupMembership | None, member_id: str) -> Any:
    if group is None or member_id not in group.members:
        return coordinator_pb2.JoinGroupResponse(
            error_code=wire_error(ErrorCode.UNKNOWN_MEMBER_ID),
            error_message="removed from the group before its join completed",
            generation_id=-1,
        )
    leader = member_id == group.leader_id
    return coordinator_pb2.JoinGroupResponse(
        error_code=wire_error(ErrorCode.NONE),
        generation_id=group.generation,
        protocol_type=group.protocol_type,
        protocol_name=group.protocol_name,
        leader=group.leader_id,
        member_id=member_id,
        members=[
            coordinator_pb2.JoinGroupMember(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                metadata=m.metadata(group.protocol_name),
            )
            for m in group.members.values()
        ]
        if leader
        else [],
    )


def _sync_error(error: ErrorCode, message: str) -> Any:
    return coordinator_pb2.SyncGroupResponse(error_code=wire_error(error), error_message=message)


def _describe(group_id: str, group: GroupMembership | None, state: str) -> Any:
    if group is None:
        return coordinator_pb2.DescribedGroup(
            error_code=wire_error(ErrorCode.NONE), group_id=group_id, state=state
        )
    return coordinator_pb2.DescribedGroup(
        error_code=wire_error(ErrorCode.NONE),
        group_id=group_id,
        state=group.state.value,
        protocol_type=group.protocol_type,
        protocol_name=group.protocol_name,
        generation_id=group.generation,
        leader=group.leader_id,
        members=[
            coordinator_pb2.DescribedGroupMember(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                metadata=m.metadata(group.protocol_name),
                assignment=m.assignment,
            )
            for m in group.members.values()
        ],
    )


def group_marker(
    group_id: str,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    transaction_version: int = 2,
    txn_number: int = -1,
) -> Unstamped:
    """The GroupMarker command that resolves a transaction's pending offsets."""
    return lambda stamp: GroupMarker(
        group_id,
        producer_id,
        producer_epoch,
        commit,
        stamp.now_ms,
        coordinator_epoch,
        transaction_version,
        txn_number,
    )


def _offsets_answer(response: Any, outcome: Outcome, offsets: tuple[OffsetEntry, ...]) -> Any:
    """An offset commit's answer (``response``, TxnOffsetCommit's or
    OffsetCommit's): ``outcome`` for the request and each of its partitions."""
    return response(
        error_code=wire_error(outcome.error),
        error_message=outcome.message,
        results=[
            partition_result(TopicPartition(o.topic, o.partition), outcome.error) for o in offsets
        ],
    )


def _offset_entries(topics: Any) -> tuple[OffsetEntry, ...]:
    return tuple(
        OffsetEntry(t.topic, p.partition, p.offset, p.metadata)
        for t in topics
        for p in t.partitions
    )
