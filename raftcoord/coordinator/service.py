"""gRPC services of a coordinator node: TransactionCoordinator and CoordinatorAdmin.

Requests are translated into :mod:`fsm` commands for the shard that owns the
key (``crc32(key) % S``); a node that does not lead that shard answers
NOT_COORDINATOR naming the leader it knows, a leader that has not applied
its log yet answers COORDINATOR_LOAD_IN_PROGRESS, and every answer comes after
the command is committed by Raft and applied. Reads go through a log barrier
so a deposed leader never serves stale state as current; topic metadata is
the exception (see :meth:`CoordinatorService.Metadata`).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import grpc

from fsm import (
    AddOffsets,
    AddPartitions,
    Command,
    CreateTopic,
    EndTxn,
    ErrorCode,
    GroupMarker,
    InitProducerId,
    OffsetCommit,
    OffsetEntry,
    Outcome,
    TransactionStateMachine,
    TxnOffsetCommit,
    TxnState,
)
from fsm.limits import id_error, request_refusal
from fsm.metadata import TopicPartition, TransactionMetadata
from fsm.states import PREPARE_STATES
from fsm.transactions import verify_group, verify_ongoing
from marker_writer import ConsumerGroup, DataPartition, DeliveryProblem, Participant, TxnKey
from raftcoord.coordinator.leader import CHECK_ONLY, Stamp, Unstamped
from raftcoord.coordinator.markers import METADATA_SHARD, MarkerWriters
from raftcoord.coordinator.settings import fsm_config
from raftcoord.coordinator.shard import Reader, Shards, now_ms
from raftcoord.protocol.config import ClusterConfig
from raftcoord.protocol.routing import shard_for
from raftcoord.protocol.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    partition_log_pb2,
)

E = ErrorCode
pb = coordinator_pb2
REQUEST_TIMEOUT_S = 10.0
FORWARDED_HEADER = "x-raftcoord-forwarded-by"
#: Deadline of a request forwarded to another node.
FORWARD_TIMEOUT_S = 2.0
T = TypeVar("T")


class _Refused(Exception):
    """The shard cannot serve the request here; carries the answer."""

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


class _NotForwarded(Exception):
    """A request could not be asked of another node; says why."""


class CoordinatorService(coordinator_pb2_grpc.TransactionCoordinatorServicer):  # type: ignore[misc]
    def __init__(
        self, shards: Shards, config: ClusterConfig, node_id: int, markers: MarkerWriters
    ) -> None:
        self.shards = shards
        self.config = config
        self.node_id = node_id
        self.markers = markers
        self.fsm_config = fsm_config(config.settings)

    # --- plumbing ------------------------------------------------------------------

    def _shard_of(self, key: str) -> int:
        return shard_for(key, self.config.shard_count)

    def _check(self, shard: int) -> None:
        error = self.shards.availability(shard)
        if error is E.NONE:
            return
        if error is E.NOT_COORDINATOR:
            leader = self.shards.leader_of(shard)
            where = "unknown" if leader is None else f"node {leader.node_id} at {leader.grpc}"
            raise _Refused(error, f"not the coordinator of shard {shard}; leader: {where}")
        raise _Refused(error, f"shard {shard} is loading its state")

    def _refusal(self, build: Unstamped) -> Outcome | None:
        """The answer to a request that must not be proposed (fsm.limits), or None."""
        refusal = request_refusal(build(CHECK_ONLY), self.fsm_config)
        return None if refusal is None else Outcome(error=refusal[0], message=refusal[1])

    def _run(
        self,
        shard: int,
        build: Unstamped,
        precheck: Callable[[], Outcome | None] | None = None,
    ) -> Outcome:
        """Replicate the command of ``build`` on ``shard``; a refusal comes back
        as an error outcome.

        ``precheck`` validates what the command's own shard cannot (state of
        other shards) once this node is known to lead ``shard``: its outcome,
        if any, is the answer and nothing is proposed.
        """
        # A request that breaks a limit is refused by any node, before routing
        # to a leader: it never reaches the log.
        refused_here = self._refusal(build)
        if refused_here is not None:
            return refused_here
        try:
            self._check(shard)
            refused_before = None if precheck is None else precheck()
        except _Refused as refused:
            return Outcome(error=refused.error, message=refused.message)
        if refused_before is not None:
            return refused_before
        result: Outcome = _wait(self.shards.submit(shard, build))
        return result

    def _read(self, shard: int, reader: Reader[T]) -> T:
        """``reader``'s answer from ``shard``'s leader (this node), through its log.

        Raises:
            _Refused: this node cannot answer (not the ready leader, timed out).
        """
        self._check(shard)
        result = _wait(self.shards.read(shard, reader))
        if isinstance(result, Outcome):  # refused or timed out
            raise _Refused(result.error, result.message)
        return result

    def _forward(self, shard: int, context: Any, method: str, request: Any) -> Any:
        """The answer of ``shard``'s leader, another node, to ``method`` with
        ``request``. A request that was itself forwarded is not forwarded
        again (no loops).

        Raises:
            _NotForwarded: already forwarded, no other node leads ``shard``
                as far as this node knows, or the call failed.
        """
        if dict(context.invocation_metadata()).get(FORWARDED_HEADER):
            raise _NotForwarded("already forwarded")
        leader = self.shards.leader_of(shard)
        if leader is None or leader.node_id == self.node_id:
            raise _NotForwarded("no leader")
        try:
            with grpc.insecure_channel(leader.grpc) as channel:
                stub = coordinator_pb2_grpc.TransactionCoordinatorStub(channel)  # type: ignore[no-untyped-call]
                return getattr(stub, method)(
                    request,
                    timeout=FORWARD_TIMEOUT_S,
                    metadata=[(FORWARDED_HEADER, str(self.node_id))],
                )
        except grpc.RpcError as exc:
            raise _NotForwarded(exc.code().name) from exc

    # --- discovery -----------------------------------------------------------------

    def FindCoordinator(self, request: Any, context: Any) -> Any:
        if not request.key:
            return pb.FindCoordinatorResponse(
                error_code=E.INVALID_REQUEST, error_message="key must not be empty", node_id=-1
            )
        shard = self._shard_of(request.key)
        leader = self.shards.leader_of(shard)
        if leader is None:
            return pb.FindCoordinatorResponse(
                error_code=E.COORDINATOR_NOT_AVAILABLE,
                error_message=f"shard {shard} has no leader",
                node_id=-1,
                shard=shard,
            )
        return pb.FindCoordinatorResponse(
            error_code=E.NONE, node_id=leader.node_id, address=leader.grpc, shard=shard
        )

    # --- transactions --------------------------------------------------------------

    def InitProducerId(self, request: Any, context: Any) -> Any:
        if not request.HasField("transactional_id"):
            return self._idempotent_producer_id(context)
        has_pid, has_epoch = request.HasField("producer_id"), request.HasField("producer_epoch")
        expected_producer_id = request.producer_id if has_pid else -1
        expected_producer_epoch = request.producer_epoch if has_epoch else -1

        def command(stamp: Stamp) -> Command:
            return InitProducerId(
                transactional_id=request.transactional_id,
                timeout_ms=request.transaction_timeout_ms,
                now_ms=stamp.now_ms,
                coordinator_epoch=stamp.coordinator_epoch,
                new_producer_id=stamp.new_producer_id,
                expected_producer_id=expected_producer_id,
                expected_producer_epoch=expected_producer_epoch,
            )

        if has_pid != has_epoch or (
            has_pid and (request.producer_id < 0 or request.producer_epoch < 0)
        ):
            return pb.InitProducerIdResponse(
                error_code=E.INVALID_REQUEST,
                error_message="expected producer id and epoch go together and are >= 0",
                producer_id=-1,
                producer_epoch=-1,
            )
        outcome = self._run(self._shard_of(request.transactional_id), command)
        return pb.InitProducerIdResponse(
            error_code=outcome.error,
            error_message=outcome.message,
            producer_id=outcome.producer_id,
            producer_epoch=outcome.producer_epoch,
        )

    def _idempotent_producer_id(self, context: Any) -> Any:
        # Any shard this node leads can hand out an id from its cursor. A node
        # that leads none asks a node that does.
        pid = self.shards.take_producer_id()
        if pid is not None:
            return pb.InitProducerIdResponse(error_code=E.NONE, producer_id=pid, producer_epoch=0)
        for shard in range(self.config.shard_count):
            try:
                answer = self._forward(shard, context, "InitProducerId", pb.InitProducerIdRequest())
            except _NotForwarded:
                continue
            if answer.error_code == E.NONE:
                return answer
        return pb.InitProducerIdResponse(
            error_code=E.COORDINATOR_NOT_AVAILABLE,
            error_message="no shard leader has producer ids ready; retry",
            producer_id=-1,
            producer_epoch=-1,
        )

    def AddPartitionsToTxn(self, request: Any, context: Any) -> Any:
        """Partitions of topics that do not exist are UNKNOWN_TOPIC_OR_PARTITION
        and the request changes nothing: the other partitions are
        OPERATION_NOT_ATTEMPTED (verify-only: verified as usual)."""
        partitions = tuple((t.topic, p) for t in request.topics for p in t.partitions)
        shard = self._shard_of(request.transactional_id)
        unknown: dict[TopicPartition, str] = {}
        if request.verify_only:
            try:
                errors = self._read(
                    shard,
                    lambda m: _verify(
                        m,
                        request.transactional_id,
                        request.producer_id,
                        request.producer_epoch,
                        partitions,
                    ),
                )
                unknown = self._unknown_partitions(partitions, context)
            except _Refused as refused:
                outcome = Outcome(error=refused.error, message=refused.message)
            else:
                return pb.AddPartitionsToTxnResponse(
                    error_code=E.NONE,
                    results=[
                        _partition_result(tp, E.UNKNOWN_TOPIC_OR_PARTITION if tp in unknown else e)
                        for tp, e in errors
                    ],
                )
        else:

            def topics_exist() -> Outcome | None:
                unknown.update(self._unknown_partitions(partitions, context))
                if not unknown:
                    return None
                return Outcome(
                    error=E.UNKNOWN_TOPIC_OR_PARTITION,
                    message="; ".join(unknown.values()) + "; nothing was added",
                )

            def command(stamp: Stamp) -> Command:
                return AddPartitions(
                    request.transactional_id,
                    request.producer_id,
                    request.producer_epoch,
                    partitions,
                    stamp.now_ms,
                    stamp.coordinator_epoch,
                )

            outcome = self._run(shard, command, topics_exist)
        return pb.AddPartitionsToTxnResponse(
            error_code=outcome.error,
            error_message=outcome.message,
            results=[
                _partition_result(
                    tp,
                    E.UNKNOWN_TOPIC_OR_PARTITION
                    if tp in unknown
                    else (E.OPERATION_NOT_ATTEMPTED if unknown else outcome.error),
                )
                for tp in partitions
            ],
        )

    def _unknown_partitions(
        self, partitions: tuple[TopicPartition, ...], context: Any
    ) -> dict[TopicPartition, str]:
        """The partitions that do not exist, with why.

        This node's replica of shard 0 may lag behind a topic just created, so
        a miss there is confirmed with shard 0's leader through a read barrier
        before it counts: a topic created and acknowledged before the request
        is never reported unknown.

        Raises:
            _Refused: a miss could not be confirmed (shard 0 has no leader).
        """
        unknown = _missing(self._local_topics(), partitions)
        if not unknown:
            return unknown
        topics = self._leader_topics(context, read_barrier=True)
        if topics is None:
            raise _Refused(
                E.COORDINATOR_NOT_AVAILABLE,
                f"cannot confirm topic {next(iter(unknown))[0]!r} with the leader "
                f"of shard {METADATA_SHARD}; retry",
            )
        return _missing(topics, tuple(unknown))

    def AddOffsetsToTxn(self, request: Any, context: Any) -> Any:
        if request.verify_only:
            try:
                error, message = self._read(
                    self._shard_of(request.transactional_id),
                    lambda m: verify_group(
                        m.describe(request.transactional_id),
                        request.producer_id,
                        request.producer_epoch,
                        request.group_id,
                    ),
                )
            except _Refused as refused:
                error, message = refused.error, refused.message
            return pb.AddOffsetsToTxnResponse(error_code=error, error_message=message)

        def command(stamp: Stamp) -> Command:
            return AddOffsets(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.group_id,
                stamp.now_ms,
                stamp.coordinator_epoch,
            )

        outcome = self._run(self._shard_of(request.transactional_id), command)
        return pb.AddOffsetsToTxnResponse(error_code=outcome.error, error_message=outcome.message)

    def EndTxn(self, request: Any, context: Any) -> Any:
        def command(stamp: Stamp) -> Command:
            return EndTxn(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.committed,
                stamp.now_ms,
                stamp.coordinator_epoch,
                stamp.new_producer_id,
            )

        outcome = self._run(self._shard_of(request.transactional_id), command)
        return pb.EndTxnResponse(
            error_code=outcome.error,
            error_message=outcome.message,
            producer_id=outcome.producer_id,
            producer_epoch=outcome.producer_epoch,
        )

    # --- group offsets -------------------------------------------------------------

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
            return None if error is E.NONE else Outcome(error=error, message=message)

        outcome = self._run(self._shard_of(request.group_id), command, in_transaction)
        return pb.TxnOffsetCommitResponse(
            error_code=outcome.error,
            error_message=outcome.message,
            results=[_partition_result((o.topic, o.partition), outcome.error) for o in offsets],
        )

    def _verify_group(self, request: Any, context: Any) -> tuple[ErrorCode, str]:
        """Whether ``request.group_id`` is in the ongoing transaction of
        ``request``'s producer, asked of the transaction's shard leader (this
        node, or with a verify-only AddOffsetsToTxn); read through its log.

        Raises:
            _Refused: the transaction's shard cannot answer now (retriable).
        """
        shard = self._shard_of(request.transactional_id)
        if self.shards.availability(shard) is E.NONE:
            verified: tuple[ErrorCode, str] = self._read(
                shard,
                lambda m: verify_group(
                    m.describe(request.transactional_id),
                    request.producer_id,
                    request.producer_epoch,
                    request.group_id,
                ),
            )
            return verified
        unavailable = f"the coordinator of the transaction (shard {shard}) cannot verify it"
        try:
            answer = self._forward(
                shard,
                context,
                "AddOffsetsToTxn",
                pb.AddOffsetsToTxnRequest(
                    transactional_id=request.transactional_id,
                    producer_id=request.producer_id,
                    producer_epoch=request.producer_epoch,
                    group_id=request.group_id,
                    verify_only=True,
                ),
            )
        except _NotForwarded as why:
            raise _Refused(E.COORDINATOR_NOT_AVAILABLE, f"{unavailable}: {why}; retry") from why
        error = E(answer.error_code)
        if error in (
            E.NOT_COORDINATOR,
            E.COORDINATOR_LOAD_IN_PROGRESS,
            E.COORDINATOR_NOT_AVAILABLE,
            E.REQUEST_TIMED_OUT,
        ):
            raise _Refused(E.COORDINATOR_NOT_AVAILABLE, f"{unavailable}: {error.name}; retry")
        return error, str(answer.error_message)

    def OffsetCommit(self, request: Any, context: Any) -> Any:
        offsets = _offset_entries(request.topics)
        outcome = self._run(
            self._shard_of(request.group_id),
            lambda stamp: OffsetCommit(request.group_id, offsets, stamp.now_ms),
        )
        return pb.OffsetCommitResponse(
            error_code=outcome.error,
            error_message=outcome.message,
            results=[_partition_result((o.topic, o.partition), outcome.error) for o in offsets],
        )

    def OffsetFetch(self, request: Any, context: Any) -> Any:
        if not request.group_id:
            return pb.OffsetFetchResponse(
                error_code=E.INVALID_REQUEST, error_message="group id must not be empty"
            )
        wanted = [(t.topic, p) for t in request.topics for p in t.partitions] or None
        try:
            fetched = self._read(
                self._shard_of(request.group_id),
                lambda m: m.offset_fetch(request.group_id, wanted, request.require_stable),
            )
        except _Refused as refused:
            return pb.OffsetFetchResponse(error_code=refused.error, error_message=refused.message)
        return pb.OffsetFetchResponse(
            error_code=E.NONE,
            partitions=[
                pb.OffsetFetchPartition(
                    topic=f.topic,
                    partition=f.partition,
                    offset=f.offset,
                    metadata=f.metadata,
                    error_code=f.error,
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
                        error_code=E.INVALID_REQUEST,
                        error_message="coordinators hold no data partitions",
                    )
            for group_id in marker.groups:
                result = answer.groups.add(group_id=group_id)
                error = self._group_marker_refusal(marker, group_id)
                if error is not E.NONE:
                    result.error_code = error
                    continue
                # Submitted together, the markers share one Raft entry per shard.
                future = self.shards.submit(
                    self._shard_of(group_id), _group_marker(marker, group_id)
                )
                waiting.append((result, future))
        for result, future in waiting:
            outcome = _wait(future)
            result.error_code = (
                outcome.error if isinstance(outcome, Outcome) else E.UNKNOWN_SERVER_ERROR
            )
        return partition_log_pb2.WriteTxnMarkersResponse(markers=answers)

    def _group_marker_refusal(self, marker: Any, group_id: str) -> ErrorCode:
        if id_error("group_id", group_id) or marker.producer_id < 0 or marker.producer_epoch < 0:
            return E.INVALID_REQUEST
        if marker.result not in (common_pb2.COMMIT, common_pb2.ABORT):
            return E.INVALID_REQUEST
        return self.shards.availability(self._shard_of(group_id))

    # --- operator queries ----------------------------------------------------------

    def DescribeTransactions(self, request: Any, context: Any) -> Any:
        descriptions = []
        for tid in request.transactional_ids:
            shard = self._shard_of(tid)
            try:
                meta = self._read(shard, lambda m, tid=tid: m.describe(tid))
            except _Refused as refused:
                descriptions.append(_no_description(tid, refused.error))
                continue
            if meta is None:
                descriptions.append(_no_description(tid, E.TRANSACTIONAL_ID_NOT_FOUND))
                continue
            topics: dict[str, list[int]] = {}
            for topic, partition in sorted(meta.partitions):
                topics.setdefault(topic, []).append(partition)
            descriptions.append(
                pb.TransactionDescription(
                    error_code=E.NONE,
                    transactional_id=tid,
                    state=int(meta.state),
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
                )
            )
        return pb.DescribeTransactionsResponse(transactions=descriptions)

    def _pending_markers(self, shard: int, meta: TransactionMetadata) -> list[Any]:
        """The markers a Prepare* transaction still owes, each with the last
        problem its delivery met, as this node's marker writer knows them."""
        if meta.state not in PREPARE_STATES:
            return []
        key = TxnKey(meta.transactional_id, meta.producer_id, meta.producer_epoch)
        owed = self.markers.pending(shard, key)
        if owed is None:  # not taken up by a writer yet: nothing tried
            participants: list[Participant] = [DataPartition(*tp) for tp in sorted(meta.partitions)]
            participants.extend(ConsumerGroup(g) for g in sorted(meta.groups))
            owed = dict.fromkeys(participants)
        return [_pending_marker(p, problem) for p, problem in owed.items()]

    def ListTransactions(self, request: Any, context: Any) -> Any:
        """Transactions of the shards this node leads (ask every node for all)."""
        states = [TxnState(s) for s in request.state_filters if s in TxnState._value2member_map_]
        listings = []
        for shard in range(self.config.shard_count):
            if self.shards.availability(shard) is not E.NONE:
                continue
            try:
                rows = self._read(
                    shard,
                    lambda m: m.list_transactions(
                        now_ms(), states, request.producer_id_filters, request.duration_filter_ms
                    ),
                )
            except _Refused:
                continue
            listings.extend(
                pb.TransactionListing(
                    transactional_id=r.transactional_id,
                    producer_id=r.producer_id,
                    state=int(r.state),
                    duration_ms=r.duration_ms,
                )
                for r in rows
            )
        return pb.ListTransactionsResponse(error_code=E.NONE, transactions=listings)

    # --- cluster metadata ----------------------------------------------------------

    def _local_topics(self) -> dict[str, tuple[int, ...]]:
        """Topic placement in this node's replica of shard 0 (it may lag)."""
        return self.shards.query(METADATA_SHARD, lambda machine: dict(machine.state.topics))

    def _leader_topics(self, context: Any, read_barrier: bool) -> dict[str, tuple[int, ...]] | None:
        """Topic placement as shard 0's leader has it (topics live in shard 0),
        or None when no leader answers.

        The leader answers from its applied state, or with ``read_barrier``
        through its log (so that a deposed leader cannot answer); another
        node asks the leader once, so that a node that is behind (just
        restarted, cut off) does not answer with a stale list.
        """
        if self.shards.availability(METADATA_SHARD) is E.NONE:
            if not read_barrier:
                return self._local_topics()
            try:
                topics: dict[str, tuple[int, ...]] = self._read(
                    METADATA_SHARD, lambda machine: dict(machine.state.topics)
                )
                return topics
            except _Refused:
                return None
        try:
            answer = self._forward(
                METADATA_SHARD, context, "Metadata", pb.MetadataRequest(read_barrier=read_barrier)
            )
        except _NotForwarded:
            return None
        return {
            t.name: tuple(p.node_id for p in t.partitions)
            for t in answer.topics
            if t.error_code == E.NONE
        }

    def Metadata(self, request: Any, context: Any) -> Any:
        """Topic placement from shard 0's leader, without writing to its log
        unless ``read_barrier`` asks to confirm (a miss). Without it, a node
        with no leader to ask answers from its own replica; with it, such a
        node fails the call (UNAVAILABLE) rather than answer unconfirmed."""
        topics = self._leader_topics(context, request.read_barrier)
        if topics is None:
            if request.read_barrier:
                context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"shard {METADATA_SHARD} has no leader to confirm the topics with",
                )
            topics = self._local_topics()
        wanted = list(request.topics) or sorted(topics)
        return pb.MetadataResponse(
            coordinators=[
                pb.NodeInfo(node_id=n.node_id, address=n.grpc) for n in self.config.coordinators
            ],
            partition_nodes=[
                pb.NodeInfo(node_id=n.node_id, address=n.grpc) for n in self.config.partition_nodes
            ],
            shard_count=self.config.shard_count,
            topics=[_topic_metadata(name, topics.get(name)) for name in wanted],
        )

    def CreateTopics(self, request: Any, context: Any) -> Any:
        nodes = [n.node_id for n in self.config.partition_nodes]
        results = []
        for topic in request.topics:
            if not nodes:
                results.append(
                    pb.CreateTopicResult(
                        name=topic.name,
                        error_code=E.INVALID_REQUEST,
                        error_message="the cluster has no partition-log nodes",
                    )
                )
                continue
            most = self.fsm_config.max_partitions_per_request
            if not 1 <= topic.num_partitions <= most:
                results.append(
                    pb.CreateTopicResult(
                        name=topic.name,
                        error_code=E.INVALID_PARTITIONS,
                        error_message=f"num_partitions {topic.num_partitions} not in 1..{most}",
                    )
                )
                continue
            start = zlib.crc32(topic.name.encode()) % len(nodes)
            placement = tuple(nodes[(start + i) % len(nodes)] for i in range(topic.num_partitions))
            command = _create_topic(topic.name, placement)
            if request.validate_only:
                outcome = self._refusal(command) or Outcome()
            else:
                outcome = self._run(0, command)
            results.append(
                pb.CreateTopicResult(
                    name=topic.name,
                    error_code=outcome.error,
                    error_message="" if outcome.ok else outcome.message,
                )
            )
        return pb.CreateTopicsResponse(results=results)


class AdminService(admin_pb2_grpc.CoordinatorAdminServicer):  # type: ignore[misc]
    def __init__(self, shards: Shards, config: ClusterConfig, node_id: int) -> None:
        self.shards = shards
        self.config = config
        self.node_id = node_id

    def NodeStatus(self, request: Any, context: Any) -> Any:
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
                )
            )
        return admin_pb2.NodeStatusResponse(
            node_id=self.node_id,
            address=self.config.coordinator(self.node_id).grpc,
            pid=os.getpid(),
            shards=statuses,
        )


# --- helpers -------------------------------------------------------------------------


def _group_marker(marker: Any, group_id: str) -> Unstamped:
    return lambda stamp: GroupMarker(
        group_id,
        marker.producer_id,
        marker.producer_epoch,
        marker.result == common_pb2.COMMIT,
        stamp.now_ms,
    )


def _create_topic(name: str, placement: tuple[int, ...]) -> Unstamped:
    return lambda stamp: CreateTopic(name, placement, stamp.now_ms)


def _wait(future: Future[T]) -> T | Outcome:
    try:
        return future.result(timeout=REQUEST_TIMEOUT_S)
    except FutureTimeout:
        return Outcome(error=E.REQUEST_TIMED_OUT, message="not committed in time; retry")


def _verify(
    machine: TransactionStateMachine,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    partitions: tuple[TopicPartition, ...],
) -> list[tuple[TopicPartition, ErrorCode]]:
    """KIP-890 verification: is each partition in this producer's ongoing transaction?"""
    meta = machine.describe(transactional_id)
    error, _why = verify_ongoing(meta, producer_id, producer_epoch)
    if error is not E.NONE or meta is None:
        return [(tp, error) for tp in partitions]
    return [(tp, E.NONE if tp in meta.partitions else E.INVALID_TXN_STATE) for tp in partitions]


def _missing(
    topics: dict[str, tuple[int, ...]], partitions: tuple[TopicPartition, ...]
) -> dict[TopicPartition, str]:
    """The partitions ``topics`` does not have, with why."""
    missing = {}
    for topic, partition in partitions:
        nodes = topics.get(topic)
        if nodes is None:
            missing[(topic, partition)] = f"topic {topic!r} does not exist"
        elif not 0 <= partition < len(nodes):
            missing[(topic, partition)] = (
                f"topic {topic!r} has partitions 0..{len(nodes) - 1}, not {partition}"
            )
    return missing


def _pending_marker(participant: Participant, problem: DeliveryProblem | None) -> Any:
    marker = pb.PendingMarker(
        last_error_code=E.NONE if problem is None else problem.code,
        last_error_message="" if problem is None else problem.message,
    )
    if isinstance(participant, DataPartition):
        marker.topic, marker.partition = participant.topic, participant.partition
    else:
        marker.group_id = participant.group_id
    return marker


def _no_description(transactional_id: str, error: ErrorCode) -> Any:
    """A DescribeTransactions entry for an id that cannot be described."""
    return pb.TransactionDescription(
        error_code=error,
        transactional_id=transactional_id,
        producer_id=-1,
        producer_epoch=-1,
        transaction_start_time_ms=-1,
    )


def _partition_result(tp: TopicPartition, error: ErrorCode) -> Any:
    return common_pb2.PartitionResult(topic=tp[0], partition=tp[1], error_code=error)


def _offset_entries(topics: Any) -> tuple[OffsetEntry, ...]:
    return tuple(
        OffsetEntry(t.topic, p.partition, p.offset, p.metadata)
        for t in topics
        for p in t.partitions
    )


def _topic_metadata(name: str, nodes: tuple[int, ...] | None) -> Any:
    if nodes is None:
        return pb.TopicMetadata(name=name, error_code=E.UNKNOWN_TOPIC_OR_PARTITION)
    return pb.TopicMetadata(
        name=name,
        error_code=E.NONE,
        partitions=[
            pb.PartitionMetadata(partition=i, node_id=n, error_code=E.NONE)
            for i, n in enumerate(nodes)
        ],
    )
