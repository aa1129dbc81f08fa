"""Transaction RPCs of TransactionCoordinator: FindCoordinator,
InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn and EndTxn."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from contextlib import nullcontext
from functools import partial
from typing import Any

from fsm import (
    AddOffsets,
    AddPartitions,
    Command,
    EndTxn,
    ErrorCode,
    InitProducerId,
    Outcome,
    TransactionStateMachine,
)
from fsm.metadata import TopicPartition
from fsm.transactions import verify_group, verify_ongoing
from raftcoord.coordinator.leader import CHECK_ONLY, Stamp
from raftcoord.coordinator.services.common import (
    NotForwarded,
    Refused,
    ShardRouter,
    answered,
    partition_result,
    wait,
)
from raftcoord.coordinator.services.topics import TopicRPCs
from raftcoord.coordinator.shard import caller_waits, parked_at_most
from raftcoord.protocol.acl import CLUSTER_NAME, Operation, Principal, ResourceType
from raftcoord.protocol.cluster_link import Replies
from raftcoord.protocol.v1 import coordinator_pb2
from raftcoord.protocol.wire import wire_error


class TransactionRPCs:
    def __init__(self, router: ShardRouter, topics: TopicRPCs) -> None:
        self.router = router
        self.topics = topics

    def FindCoordinator(self, request: Any, context: Any) -> Any:
        if not request.key:
            return coordinator_pb2.FindCoordinatorResponse(
                error_code=wire_error(ErrorCode.INVALID_REQUEST),
                error_message="key must not be empty",
                node_id=-1,
            )
        resource = (
            ResourceType.GROUP
            if request.key_type == coordinator_pb2.GROUP
            else ResourceType.TRANSACTIONAL_ID
        )
        denied = self.router.denied(
            self.router.caller(context), (Operation.DESCRIBE, resource, request.key)
        )
        if denied is not None:
            return coordinator_pb2.FindCoordinatorResponse(
                error_code=wire_error(denied.error), error_message=denied.message, node_id=-1
            )
        shard = self.router.shard_of(request.key)
        leader = self.router.shards.leader_of(shard)
        if leader is None:
            return coordinator_pb2.FindCoordinatorResponse(
                error_code=wire_error(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                error_message=f"shard {shard} has no leader",
                node_id=-1,
                shard=shard,
            )
        return coordinator_pb2.FindCoordinatorResponse(
            error_code=wire_error(ErrorCode.NONE),
            node_id=leader.node_id,
            address=leader.grpc,
            shard=shard,
        )

    def InitProducerId(self, request: Any, context: Any) -> Any:
        who = self.router.caller(context)
        if not request.HasField("transactional_id"):
            if not self._may_write_idempotently(who):
                return coordinator_pb2.InitProducerIdResponse(
                    error_code=wire_error(ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
                    error_message=f"{who.name} may not IDEMPOTENT_WRITE the cluster "
                    "nor WRITE any topic",
                    producer_id=-1,
                    producer_epoch=-1,
                )
            return self._idempotent_producer_id(context)
        tid = request.transactional_id
        checks = [(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid)]
        if request.enable_two_phase_commit:
            if not self.router.config.settings.transaction_two_phase_commit_enable:
                return coordinator_pb2.InitProducerIdResponse(
                    error_code=wire_error(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
                    error_message="two-phase commit is not enabled on this cluster "
                    "(transaction.two.phase.commit.enable)",
                    producer_id=-1,
                    producer_epoch=-1,
                )
            checks.append((Operation.TWO_PHASE_COMMIT, ResourceType.TRANSACTIONAL_ID, tid))
        denied = self.router.denied(who, *checks)
        if denied is not None:
            return coordinator_pb2.InitProducerIdResponse(
                error_code=wire_error(denied.error),
                error_message=denied.message,
                producer_id=-1,
                producer_epoch=-1,
            )
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
                enable_two_phase_commit=request.enable_two_phase_commit,
                keep_prepared_txn=request.keep_prepared_txn,
            )

        if has_pid != has_epoch or (
            has_pid and (request.producer_id < 0 or request.producer_epoch < 0)
        ):
            return coordinator_pb2.InitProducerIdResponse(
                error_code=wire_error(ErrorCode.INVALID_REQUEST),
                error_message="expected producer id and epoch go together and are >= 0",
                producer_id=-1,
                producer_epoch=-1,
            )
        outcome = self.router.run(self.router.shard_of(request.transactional_id), command)
        return coordinator_pb2.InitProducerIdResponse(
            error_code=wire_error(outcome.error),
            error_message=outcome.message,
            producer_id=outcome.producer_id,
            producer_epoch=outcome.producer_epoch,
            produce_adds_partitions=self.router.config.settings.transaction_partition_verification_enable,
            ongoing_txn_producer_id=outcome.ongoing_producer_id,
            ongoing_txn_producer_epoch=outcome.ongoing_producer_epoch,
        )

    def _may_write_idempotently(self, who: Principal) -> bool:
        """Kafka's rule for an idempotent producer's id: IDEMPOTENT_WRITE on
        the cluster, or WRITE on some topic."""
        authorizer = self.router.authorizer
        return authorizer.allows_on_some(who, Operation.WRITE, ResourceType.TOPIC) or (
            authorizer.allows(who, Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME)
        )

    def _idempotent_producer_id(self, context: Any) -> Any:
        # Any shard this node leads can hand out an id from its cursor. A node
        # that leads none asks a node that does.
        pid = self.router.shards.take_producer_id()
        if pid is not None:
            return coordinator_pb2.InitProducerIdResponse(
                error_code=wire_error(ErrorCode.NONE), producer_id=pid, producer_epoch=0
            )
        for shard in range(self.router.config.shard_count):
            try:
                answer = self.router.forward(
                    shard, context, "InitProducerId", coordinator_pb2.InitProducerIdRequest()
                )
            except NotForwarded:
                continue
            if answer.error_code == ErrorCode.NONE:
                return answer
        return coordinator_pb2.InitProducerIdResponse(
            error_code=wire_error(ErrorCode.COORDINATOR_NOT_AVAILABLE),
            error_message="no shard leader has producer ids ready; retry",
            producer_id=-1,
            producer_epoch=-1,
        )

    def AddPartitionsToTxn(self, request: Any, context: Any) -> Any:
        """Partitions of topics that do not exist are UNKNOWN_TOPIC_OR_PARTITION
        and the request changes nothing: the other partitions are
        OPERATION_NOT_ATTEMPTED (verify-only: verified as usual).

        A request with ``transactions`` (Kafka's v4+, sent by partition-log
        nodes) carries many transactions: each is checked and queued on its
        shard, and only then are the answers awaited, so the adds go out
        together in one Raft entry per shard. Its adds are parked behind a
        completing transaction only when it asks (``wait_for_completion``),
        and then at most ``wait_for_completion_ms`` when it says so.
        """
        if request.transactions:
            refused = self.router.cluster_refusal(context, "partition_nodes")
            if refused is not None:
                return _cluster_refused(refused)
            started = self._start_batched(request, context, None)
            return coordinator_pb2.AddPartitionsToTxnResponse(
                error_code=wire_error(ErrorCode.NONE),
                transactions=[build(wait(future)) for future, build in started],
            )
        who = self.router.caller(context)
        denied = self.router.denied(
            who, (Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id)
        )
        if denied is not None:
            return _add_refused(request, denied, denied.error)
        topics = sorted({t.topic for t in request.topics})
        unwritable = [
            t for t in topics if not self.router.allows(who, Operation.WRITE, ResourceType.TOPIC, t)
        ]
        if unwritable:
            outcome = Outcome(
                error=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                message=f"{who.name} may not WRITE the topics {unwritable[:10]}; nothing was added",
            )
            return _add_refused(
                request, outcome, ErrorCode.OPERATION_NOT_ATTEMPTED, set(unwritable)
            )
        future, build = self._start_add(request, context)
        return build(wait(future))

    def add_partitions_over_link(
        self, request: Any, refused: str | None, timeout_s: float, replies: Replies | None
    ) -> Any | None:
        """A partition-log node's batched AddPartitionsToTxn over a cluster
        link (:data:`raftcoord.protocol.cluster_link.ADD_PARTITIONS_TO_TXN`),
        checked as over gRPC, each transaction answered alone through
        ``replies`` as soon as its outcome is known (None is returned): those
        added now with their entry, those parked behind their previous
        transaction's completion (each reported :meth:`Replies.parked`) when
        it applies or their park time is over, without holding up the
        others. ``refused``: why a caller that is not the cluster is
        refused (answered whole, as is a request without ``transactions``:
        a producer's own add goes over gRPC). A stranger is refused whatever
        it sent."""
        if refused is not None:
            return _cluster_refused(refused)
        if replies is None or not request.transactions:
            return coordinator_pb2.AddPartitionsToTxnResponse(
                error_code=wire_error(ErrorCode.INVALID_REQUEST),
                error_message="a cluster link carries only batched adds (transactions)",
            )
        with caller_waits(timeout_s):
            started = self._start_batched(request, None, replies)
        for item, (future, build) in enumerate(started):
            future.add_done_callback(partial(_answer_item, replies, item, build))
        return None

    def _start_batched(
        self, request: Any, context: Any | None, replies: Replies | None
    ) -> list[tuple[Future[Outcome], Callable[[Outcome], Any]]]:
        """Check and queue each transaction of a batched add (Kafka's v4+,
        sent by partition-log nodes) on its shard: their futures and how to
        answer each. ``context`` is None over a cluster link; ``replies``:
        the link's, told of each transaction parked. A transaction asked to
        wait (``wait_for_completion``) stays parked at most
        ``wait_for_completion_ms`` (when set): over a link, counted from its
        first parking (Kafka's brokers count their retries from the first
        CONCURRENT_TRANSACTIONS); over gRPC, where one parked transaction
        holds up the answer of all, from now."""
        parkable = request.wait_for_completion
        limit_ms = request.wait_for_completion_ms if parkable else 0
        if replies is not None:
            return [
                self._start_add(
                    t,
                    context,
                    parkable=parkable,
                    parked=partial(replies.parked, item),
                    park_ms=limit_ms or None,
                )
                for item, t in enumerate(request.transactions)
            ]
        with parked_at_most(limit_ms / 1000) if limit_ms else nullcontext():
            return [self._start_add(t, context, parkable=parkable) for t in request.transactions]

    def _start_add(
        self,
        request: Any,
        context: Any | None,
        parkable: bool = True,
        parked: Callable[[], None] | None = None,
        park_ms: int | None = None,
    ) -> tuple[Future[Outcome], Callable[[Outcome], Any]]:
        """Check one transaction's AddPartitionsToTxn and queue its command;
        returns the future of its outcome and the function that builds its
        answer from the outcome. An add that is not ``parkable`` (of a
        batched request that did not ask to wait) is answered
        CONCURRENT_TRANSACTIONS at once (:data:`BATCHED_SETTLED_REFUSALS`);
        ``parked`` is called each time it is parked, ``park_ms`` bounds its
        stay from its first parking."""
        partitions = tuple(TopicPartition(t.topic, p) for t in request.topics for p in t.partitions)
        shard = self.router.shard_of(request.transactional_id)
        unknown: dict[TopicPartition, str] = {}
        if request.transactions:
            nested = "a transaction of a batched AddPartitionsToTxn must not carry transactions"
            outcome = answered(Outcome(error=ErrorCode.INVALID_REQUEST, message=nested))
        elif request.verify_only:
            try:
                errors = self.router.read(
                    shard,
                    lambda machine: verify_partitions(
                        machine,
                        request.transactional_id,
                        request.producer_id,
                        request.producer_epoch,
                        partitions,
                    ),
                )
                unknown = self.topics.unknown_partitions(partitions, context)
            except Refused as refused:
                outcome = answered(Outcome(error=refused.error, message=refused.message))
            else:
                verified = coordinator_pb2.AddPartitionsToTxnResponse(
                    error_code=wire_error(ErrorCode.NONE),
                    results=[
                        partition_result(
                            tp, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if tp in unknown else error
                        )
                        for tp, error in errors
                    ],
                )
                return answered(Outcome()), lambda _outcome: verified
        else:

            def command(stamp: Stamp) -> AddPartitions:
                return AddPartitions(
                    request.transactional_id,
                    request.producer_id,
                    request.producer_epoch,
                    partitions,
                    stamp.now_ms,
                    stamp.coordinator_epoch,
                )

            def precheck() -> Outcome | None:
                refused = self.router.shards.query(
                    shard,
                    lambda machine: settled_refusal(
                        machine,
                        command(CHECK_ONLY),
                        SETTLED_REFUSALS if parkable else BATCHED_SETTLED_REFUSALS,
                    ),
                )
                if refused is not None:
                    return refused
                unknown.update(self.topics.unknown_partitions(partitions, context))
                if not unknown:
                    return None
                return Outcome(
                    error=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    message="; ".join(unknown.values()) + "; nothing was added",
                )

            outcome = self.router.start(shard, command, precheck, parkable, parked, park_ms)

        def answer(result: Outcome) -> Any:
            return coordinator_pb2.AddPartitionsToTxnResponse(
                error_code=wire_error(result.error),
                error_message=result.message,
                results=[
                    partition_result(
                        tp,
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                        if tp in unknown
                        else (ErrorCode.OPERATION_NOT_ATTEMPTED if unknown else result.error),
                    )
                    for tp in partitions
                ],
            )

        return outcome, answer

    def AddOffsetsToTxn(self, request: Any, context: Any) -> Any:
        denied = self.router.denied(
            self.router.caller(context),
            (Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id),
            (Operation.READ, ResourceType.GROUP, request.group_id),
        )
        if denied is not None:
            return coordinator_pb2.AddOffsetsToTxnResponse(
                error_code=wire_error(denied.error), error_message=denied.message
            )
        if request.verify_only:
            try:
                error, message = read_group_verification(self.router, request)
            except Refused as refused:
                error, message = refused.error, refused.message
            return coordinator_pb2.AddOffsetsToTxnResponse(
                error_code=wire_error(error), error_message=message
            )

        def command(stamp: Stamp) -> Command:
            return AddOffsets(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.group_id,
                stamp.now_ms,
                stamp.coordinator_epoch,
            )

        outcome = self.router.run(self.router.shard_of(request.transactional_id), command)
        return coordinator_pb2.AddOffsetsToTxnResponse(
            error_code=wire_error(outcome.error), error_message=outcome.message
        )

    def EndTxn(self, request: Any, context: Any) -> Any:
        denied = self.router.denied(
            self.router.caller(context),
            (Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id),
        )
        if denied is not None:
            return coordinator_pb2.EndTxnResponse(
                error_code=wire_error(denied.error),
                error_message=denied.message,
                producer_id=-1,
                producer_epoch=-1,
            )

        def command(stamp: Stamp) -> Command:
            return EndTxn(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.committed,
                stamp.now_ms,
                stamp.coordinator_epoch,
                stamp.new_producer_id,
                transaction_version=1 if request.transaction_version == 1 else 2,
            )

        outcome = self.router.run(self.router.shard_of(request.transactional_id), command)
        return coordinator_pb2.EndTxnResponse(
            error_code=wire_error(outcome.error),
            error_message=outcome.message,
            producer_id=outcome.producer_id,
            producer_epoch=outcome.producer_epoch,
        )


def _cluster_refused(refused: str) -> Any:
    """A batched add of a caller that is not the cluster's (Kafka's v4+
    needs ClusterAction), refused whole."""
    return coordinator_pb2.AddPartitionsToTxnResponse(
        error_code=wire_error(ErrorCode.CLUSTER_AUTHORIZATION_FAILED), error_message=refused
    )


def _answer_item(
    replies: Replies, item: int, build: Callable[[Outcome], Any], future: Future[Outcome]
) -> None:
    """Answer ``item`` of a batched add over a cluster link once its outcome
    (``future``, done) is known; its answer is built on the link's thread."""
    replies.answer(item, lambda: build(future.result()))


def _add_refused(
    request: Any,
    outcome: Outcome,
    others: ErrorCode,
    refused_topics: frozenset[str] | set[str] = frozenset(),
) -> Any:
    """AddPartitionsToTxn's answer when the ACLs refuse it: the refused
    topics' partitions (every partition, for a refused transactional id) get
    the refusal, the others ``others``."""
    return coordinator_pb2.AddPartitionsToTxnResponse(
        error_code=wire_error(outcome.error),
        error_message=outcome.message,
        results=[
            partition_result(
                TopicPartition(t.topic, p),
                outcome.error if not refused_topics or t.topic in refused_topics else others,
            )
            for t in request.topics
            for p in t.partitions
        ],
    )


#: Refusals of AddPartitionsToTxn that the leader's applied state gives
#: before anything is proposed. Each stays right however far the log is
#: ahead of the applied state: producer ids and epochs only move forward.
#: (A client's add whose previous transaction is still completing is
#: parked by the shard until the completion applies.)
SETTLED_REFUSALS = frozenset({ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_ID_MAPPING})

#: The refusals given before proposing to the adds of a batched
#: AddPartitionsToTxn over gRPC that did not ask to wait for completions:
#: also CONCURRENT_TRANSACTIONS, the previous transaction is still
#: completing. Such adds are not parked (the call answers only once all its
#: transactions are answered, and one call at a time is in flight from a
#: node): a partition-log node asks again for that transaction alone,
#: asking to wait. An answer the log has overtaken only costs the node that
#: call. (Over a cluster link each transaction is answered on its own, and
#: such adds are parked.)
BATCHED_SETTLED_REFUSALS = SETTLED_REFUSALS | {ErrorCode.CONCURRENT_TRANSACTIONS}


def settled_refusal(
    machine: TransactionStateMachine,
    command: AddPartitions,
    refusals: frozenset[ErrorCode] = SETTLED_REFUSALS,
) -> Outcome | None:
    """The answer the state machine would give ``command`` now, when it is
    one of ``refusals``; else None (propose it). Partition-log nodes ask
    for every transaction's first batch: refusing these here keeps a fenced
    producer's retries out of the log."""
    try:
        outcome = machine.preview(command).outcome
    except Exception:  # its apply answers it: propose it
        return None
    return outcome if outcome.error in refusals else None


def verify_partitions(
    machine: TransactionStateMachine,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    partitions: tuple[TopicPartition, ...],
) -> list[tuple[TopicPartition, ErrorCode]]:
    """KIP-890 verification: is each partition in this producer's ongoing transaction?"""
    meta = machine.describe(transactional_id)
    error, _why = verify_ongoing(meta, producer_id, producer_epoch)
    if error is not ErrorCode.NONE or meta is None:
        return [(tp, error) for tp in partitions]
    return [
        (tp, ErrorCode.NONE if tp in meta.partitions else ErrorCode.INVALID_TXN_STATE)
        for tp in partitions
    ]


def read_group_verification(router: ShardRouter, request: Any) -> tuple[ErrorCode, str]:
    """Whether ``request.group_id`` is in the ongoing transaction of
    ``request``'s producer (``transactional_id``, ``producer_id``,
    ``producer_epoch``), read through the log of the transaction's shard,
    which this node must lead.

    Raises:
        Refused: this node cannot answer for the shard now.
    """
    verified: tuple[ErrorCode, str] = router.read(
        router.shard_of(request.transactional_id),
        lambda machine: verify_group(
            machine.describe(request.transactional_id),
            request.producer_id,
            request.producer_epoch,
            request.group_id,
        ),
    )
    return verified
