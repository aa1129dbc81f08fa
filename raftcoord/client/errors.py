"""The client's exceptions: one class per protocol error code, plus a few the
client raises on its own (deadlines, lost connections, API misuse).

The tree mirrors the Kafka clients' exceptions::

    KafkaError                              every error the client raises
    ├── RetriableError                      may succeed if tried again
    │   ├── NotCoordinatorError                  16  rediscover the coordinator
    │   ├── CoordinatorNotAvailableError         15  rediscover the coordinator
    │   ├── CoordinatorLoadInProgressError       14  back off, retry
    │   ├── ConcurrentTransactionsError          51  back off, retry
    │   ├── RequestTimedOutError                  7  back off, retry
    │   ├── NotLeaderOrFollowerError              6  refresh metadata, retry
    │   ├── LeaderNotAvailableError               5  refresh metadata, retry
    │   ├── FencedLeaderEpochError               74  refresh metadata, retry
    │   ├── UnknownLeaderEpochError              76  retry
    │   ├── NotEnoughReplicasError               19  back off, retry
    │   ├── NotEnoughReplicasAfterAppendError    20  back off, retry
    │   ├── UnknownTopicOrPartitionError          3  refresh metadata, retry
    │   ├── UnstableOffsetCommitError            88  a transactional offset commit is pending
    │   ├── KafkaStorageError                    56  the partition's node lost its disk, retry
    │   ├── KafkaConnectionError                     a gRPC call failed in transport
    │   └── KafkaTimeoutError                        a client-side deadline passed
    ├── FatalError                          the producer can only be closed
    │   ├── ProducerFencedError                  90  a newer producer has the same id
    │   ├── InvalidProducerEpochError            47
    │   ├── InvalidTxnStateError                 48
    │   └── TransactionalIdAuthorizationFailedError 53
    ├── TransactionAbortableError           120  abort the transaction, then go on
    │   ├── UnknownProducerIdError               59
    │   └── InvalidProducerIdMappingError        49
    ├── OutOfOrderSequenceError                  45
    ├── DuplicateSequenceError                   46
    ├── ... one class per remaining code (see ``CODE_CLASSES``)
    ├── TransactionAbortedError                  a pending send dropped by abort_transaction
    ├── IllegalStateError                        a call the producer's state does not allow
    └── NotACoordinatorNodeError                 a bootstrap address is not a coordinator

Every code of :class:`raftcoord.protocol.errors.ErrorCode` except NONE maps to exactly one
class (:func:`error_for`); the classes a code maps to carry it in ``code``.
Whether an error is fatal or abortable can depend on who answered it: the
producer turns INVALID_PRODUCER_EPOCH on a transactional Produce into
:class:`ProducerFencedError`, and INVALID_TXN_STATE on a Produce into
:class:`TransactionAbortableError`, as Kafka's producer does.
"""

from __future__ import annotations

from typing import ClassVar

from raftcoord.protocol.errors import ErrorCode

__all__ = [
    "CODE_CLASSES",
    "ClusterAuthorizationFailedError",
    "ConcurrentTransactionsError",
    "CoordinatorLoadInProgressError",
    "CoordinatorNotAvailableError",
    "CorruptMessageError",
    "DuplicateSequenceError",
    "FatalError",
    "FencedInstanceIdError",
    "FencedLeaderEpochError",
    "GroupMaxSizeReachedError",
    "IllegalGenerationError",
    "IllegalStateError",
    "InconsistentGroupProtocolError",
    "IneligibleReplicaError",
    "InvalidConfigurationError",
    "InvalidPartitionsError",
    "InvalidProducerEpochError",
    "InvalidProducerIdMappingError",
    "InvalidRecordError",
    "InvalidReplicaAssignmentError",
    "InvalidReplicationFactorError",
    "InvalidRequestError",
    "InvalidSessionTimeoutError",
    "InvalidTimestampError",
    "InvalidTopicError",
    "InvalidTransactionTimeoutError",
    "InvalidTxnStateError",
    "InvalidUpdateVersionError",
    "KafkaConnectionError",
    "KafkaError",
    "KafkaStorageError",
    "KafkaTimeoutError",
    "LeaderNotAvailableError",
    "MemberIdRequiredError",
    "NoOffsetForPartitionError",
    "NotACoordinatorNodeError",
    "NotCoordinatorError",
    "NotEnoughReplicasAfterAppendError",
    "NotEnoughReplicasError",
    "NotLeaderOrFollowerError",
    "OffsetOutOfRangeError",
    "OperationNotAttemptedError",
    "OutOfOrderSequenceError",
    "ProducerFencedError",
    "RebalanceInProgressError",
    "RecordTooLargeError",
    "RequestTimedOutError",
    "RetriableError",
    "TopicAlreadyExistsError",
    "TransactionAbortableError",
    "TransactionAbortedError",
    "TransactionCoordinatorFencedError",
    "TransactionalIdAuthorizationFailedError",
    "TransactionalIdNotFoundError",
    "UnknownLeaderEpochError",
    "UnknownMemberIdError",
    "UnknownProducerIdError",
    "UnknownServerError",
    "UnknownTopicOrPartitionError",
    "UnstableOffsetCommitError",
    "error_for",
]


class KafkaError(Exception):
    """Base of every error the client raises.

    Attributes:
        code: the protocol error code this class stands for (None for errors
            the client raises on its own).
        message: the human-readable detail (the server's, when it gave one).
    """

    code: ClassVar[int | None] = None
    retriable: ClassVar[bool] = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message or self.__class__.__name__

    def again(self) -> KafkaError:
        """A fresh error of the same class and message (to raise once more
        without growing the original's traceback)."""
        return type(self)(self.message)


# --- the three reaction classes ------------------------------------------------------


class RetriableError(KafkaError):
    """The operation may succeed if it is tried again (the client retries these
    itself within its deadlines)."""

    retriable = True


class FatalError(KafkaError):
    """The producer cannot go on; close it (and create a new one)."""


class TransactionAbortableError(KafkaError):
    """The current transaction cannot commit: call ``abort_transaction`` and go on."""

    code = ErrorCode.TRANSACTION_ABORTABLE


# --- retriable -----------------------------------------------------------------------


class NotCoordinatorError(RetriableError):
    """The node does not lead the shard that owns the key."""

    code = ErrorCode.NOT_COORDINATOR


class CoordinatorNotAvailableError(RetriableError):
    """The shard that owns the key has no leader right now."""

    code = ErrorCode.COORDINATOR_NOT_AVAILABLE


class CoordinatorLoadInProgressError(RetriableError):
    """The shard leader is still loading its state."""

    code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS


class ConcurrentTransactionsError(RetriableError):
    """Another state change of this transactional id is in flight (for example
    the previous transaction's markers are still being written)."""

    code = ErrorCode.CONCURRENT_TRANSACTIONS


class RequestTimedOutError(RetriableError):
    """The server did not complete the request in time."""

    code = ErrorCode.REQUEST_TIMED_OUT


class NotLeaderOrFollowerError(RetriableError):
    """The partition-log node does not own the partition (metadata is stale)."""

    code = ErrorCode.NOT_LEADER_OR_FOLLOWER


class LeaderNotAvailableError(RetriableError):
    """The partition has no leader now: its in-sync replicas are fenced."""

    code = ErrorCode.LEADER_NOT_AVAILABLE


class UnknownTopicOrPartitionError(RetriableError):
    """The topic or partition does not exist (or the metadata is stale)."""

    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class KafkaStorageError(RetriableError):
    """The partition-log node could not read or write its disk (it stops and
    recovers; the request can be retried)."""

    code = ErrorCode.KAFKA_STORAGE_ERROR


class UnstableOffsetCommitError(RetriableError):
    """A transactional offset commit for the partition is still pending."""

    code = ErrorCode.UNSTABLE_OFFSET_COMMIT


class KafkaConnectionError(RetriableError):
    """A gRPC call failed in transport (node down, connection refused, deadline)."""


class KafkaTimeoutError(RetriableError):
    """A client-side deadline passed before the operation completed. The
    operation may still complete on the server; calling it again is safe.

    ``outcome_unknown`` is False when every attempt was answered with a
    refusal (nothing was done on the server), True when some attempt may have
    been applied without its answer arriving."""

    outcome_unknown: bool = True


# --- fatal ---------------------------------------------------------------------------


class ProducerFencedError(FatalError):
    """A newer producer with the same transactional id exists."""

    code = ErrorCode.PRODUCER_FENCED


class InvalidProducerEpochError(FatalError):
    """The producer's epoch is older than the current one."""

    code = ErrorCode.INVALID_PRODUCER_EPOCH


class InvalidTxnStateError(FatalError):
    """The request is not allowed in the transaction's current state."""

    code = ErrorCode.INVALID_TXN_STATE


class TransactionalIdAuthorizationFailedError(FatalError):
    """The client may not use this transactional id."""

    code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


# --- abortable -----------------------------------------------------------------------


class UnknownProducerIdError(TransactionAbortableError):
    """The partition or coordinator has no state for the producer id."""

    code = ErrorCode.UNKNOWN_PRODUCER_ID


class InvalidProducerIdMappingError(TransactionAbortableError):
    """The producer id is not the transactional id's current producer id."""

    code = ErrorCode.INVALID_PRODUCER_ID_MAPPING


# --- everything else -----------------------------------------------------------------


class UnknownServerError(KafkaError):
    """An unexpected server-side failure."""

    code = ErrorCode.UNKNOWN_SERVER_ERROR


class OffsetOutOfRangeError(KafkaError):
    """The fetch offset is outside the partition's log (raised by a consumer whose
    ``auto_offset_reset`` is "none"; otherwise it resets the position)."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE


class NoOffsetForPartitionError(KafkaError):
    """A consumer with ``auto_offset_reset="none"`` has no committed offset to start
    a partition from (Kafka's NoOffsetForPartitionException)."""


class CorruptMessageError(KafkaError):
    """A record batch failed its checksum or could not be encoded or decoded.

    Not retriable here (Kafka retries it): the client builds batches as
    protobuf messages, so a batch the server calls corrupt stays corrupt."""

    code = ErrorCode.CORRUPT_MESSAGE


class RecordTooLargeError(KafkaError):
    """A record is larger than the producer's ``max_request_size`` (raised
    without sending it), or a batch is larger than the partition-log node's
    ``message.max.bytes``. Kafka's RecordTooLargeException."""

    code = ErrorCode.MESSAGE_TOO_LARGE


class ClusterAuthorizationFailedError(KafkaError):
    """The caller's principal may not make an inter-node request (markers,
    the partition nodes' requests): only the cluster's nodes and super users
    may; or the ACLs do not let it act on the cluster (create topics or
    ACLs, an idempotent producer's id)."""

    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


class TopicAuthorizationFailedError(KafkaError):
    """The ACLs do not let the caller's principal read, write, describe or
    create the topic."""

    code = ErrorCode.TOPIC_AUTHORIZATION_FAILED


class GroupAuthorizationFailedError(KafkaError):
    """The ACLs do not let the caller's principal use the consumer group."""

    code = ErrorCode.GROUP_AUTHORIZATION_FAILED


class UnsupportedSaslMechanismError(KafkaError):
    """A Kafka gateway's listener does not offer the SASL mechanism."""

    code = ErrorCode.UNSUPPORTED_SASL_MECHANISM


class IllegalSaslStateError(KafkaError):
    """A SASL request out of order at a Kafka gateway."""

    code = ErrorCode.ILLEGAL_SASL_STATE


class SaslAuthenticationFailedError(KafkaError):
    """Wrong SASL credentials at a Kafka gateway."""

    code = ErrorCode.SASL_AUTHENTICATION_FAILED


class ResourceNotFoundError(KafkaError):
    """A SCRAM credential to delete does not exist."""

    code = ErrorCode.RESOURCE_NOT_FOUND


class InvalidUpdateVersionError(KafkaError):
    """AlterPartition named an older partition epoch than the controller's."""

    code = ErrorCode.INVALID_UPDATE_VERSION


class IneligibleReplicaError(KafkaError):
    """AlterPartition would add a fenced node to an ISR."""

    code = ErrorCode.INELIGIBLE_REPLICA


class SecurityDisabledError(KafkaError):
    """An ACL request to a cluster without an authorizer (no ``[tls]``)."""

    code = ErrorCode.SECURITY_DISABLED


class InvalidTimestampError(KafkaError):
    """A record's timestamp is out of range."""

    code = ErrorCode.INVALID_TIMESTAMP


class InvalidRecordError(KafkaError):
    """The partition-log node refused a batch that breaks the record format's rules."""

    code = ErrorCode.INVALID_RECORD


class InvalidTopicError(KafkaError):
    """The topic name is empty, too long or has characters outside [a-zA-Z0-9._-]."""

    code = ErrorCode.INVALID_TOPIC_EXCEPTION


class TopicAlreadyExistsError(KafkaError):
    """CreateTopics: the topic exists already."""

    code = ErrorCode.TOPIC_ALREADY_EXISTS


class InvalidPartitionsError(KafkaError):
    """CreateTopics: the partition count is out of range."""

    code = ErrorCode.INVALID_PARTITIONS


class InvalidReplicationFactorError(KafkaError):
    """CreateTopics: the replication factor is out of range."""

    code = ErrorCode.INVALID_REPLICATION_FACTOR


class InvalidReplicaAssignmentError(KafkaError):
    """A replica assignment is malformed."""

    code = ErrorCode.INVALID_REPLICA_ASSIGNMENT


class InvalidConfigurationError(KafkaError):
    """A configuration value is out of range (min.insync.replicas)."""

    code = ErrorCode.INVALID_CONFIG


class FencedLeaderEpochError(RetriableError):
    """The request names a leader epoch older than the partition's current one."""

    code = ErrorCode.FENCED_LEADER_EPOCH


class UnknownLeaderEpochError(RetriableError):
    """The request names a leader epoch newer than the node has learnt."""

    code = ErrorCode.UNKNOWN_LEADER_EPOCH


class NotEnoughReplicasError(RetriableError):
    """The partition has fewer in-sync replicas than its min.insync.replicas:
    nothing was appended."""

    code = ErrorCode.NOT_ENOUGH_REPLICAS


class NotEnoughReplicasAfterAppendError(RetriableError):
    """The batch was appended, but the in-sync replicas fell below
    min.insync.replicas before every one had it."""

    code = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


class InvalidRequestError(KafkaError):
    """The request is malformed."""

    code = ErrorCode.INVALID_REQUEST


class OutOfOrderSequenceError(KafkaError):
    """A produce batch's sequence number is not the next one the partition expects."""

    code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


class DuplicateSequenceError(KafkaError):
    """A produce batch was written already."""

    code = ErrorCode.DUPLICATE_SEQUENCE_NUMBER


class InvalidTransactionTimeoutError(KafkaError):
    """The transaction timeout is outside the range the coordinator allows."""

    code = ErrorCode.INVALID_TRANSACTION_TIMEOUT


class TransactionCoordinatorFencedError(KafkaError):
    """A marker carried an older coordinator epoch than the partition has seen."""

    code = ErrorCode.TRANSACTION_COORDINATOR_FENCED


class TransactionalIdNotFoundError(KafkaError):
    """The coordinator does not know the transactional id."""

    code = ErrorCode.TRANSACTIONAL_ID_NOT_FOUND


class OperationNotAttemptedError(KafkaError):
    """Not attempted because another part of the same request failed (e.g. the
    other partitions of an AddPartitionsToTxn naming an unknown partition)."""

    code = ErrorCode.OPERATION_NOT_ATTEMPTED


class IllegalGenerationError(KafkaError):
    """The consumer group's generation moved on: the member must rejoin, and
    its offset commits (transactional ones too, KIP-447) are refused."""

    code = ErrorCode.ILLEGAL_GENERATION


class InconsistentGroupProtocolError(KafkaError):
    """JoinGroup: the member's protocol type or protocols do not match the group's."""

    code = ErrorCode.INCONSISTENT_GROUP_PROTOCOL


class UnknownMemberIdError(KafkaError):
    """The member id is not a member of the consumer group: rejoin with an empty id."""

    code = ErrorCode.UNKNOWN_MEMBER_ID


class InvalidSessionTimeoutError(KafkaError):
    """JoinGroup: the session timeout is outside the coordinator's range."""

    code = ErrorCode.INVALID_SESSION_TIMEOUT


class RebalanceInProgressError(KafkaError):
    """The consumer group is rebalancing: the member must rejoin."""

    code = ErrorCode.REBALANCE_IN_PROGRESS


class MemberIdRequiredError(KafkaError):
    """JoinGroup: join again with the member id the coordinator assigned."""

    code = ErrorCode.MEMBER_ID_REQUIRED


class GroupMaxSizeReachedError(KafkaError):
    """JoinGroup: the consumer group has as many members as it may hold."""

    code = ErrorCode.GROUP_MAX_SIZE_REACHED


class FencedInstanceIdError(KafkaError):
    """Another member holds this group.instance.id now (static membership)."""

    code = ErrorCode.FENCED_INSTANCE_ID


# --- raised by the client on its own -------------------------------------------------


class TransactionAbortedError(KafkaError):
    """A send that was still pending when its transaction was aborted."""


class IllegalStateError(KafkaError):
    """A call the object's current state does not allow (API misuse), such as
    ``send`` before ``begin_transaction``."""


class NotACoordinatorNodeError(KafkaError):
    """A bootstrap address answers, but not the coordinator API (gRPC
    UNIMPLEMENTED: a partition-log node, say): a configuration error that no
    retry can fix."""


def _code_classes() -> dict[int, type[KafkaError]]:
    found: dict[int, type[KafkaError]] = {}
    pending: list[type[KafkaError]] = [KafkaError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        # A subclass inherits ``code``; only the class that sets it stands for it.
        if "code" in cls.__dict__ and cls.code is not None:
            if cls.code in found:
                raise TypeError(f"{cls.__name__} and {found[cls.code].__name__} share a code")
            found[cls.code] = cls
    return dict(sorted(found.items()))


#: Protocol error code -> the class that stands for it (every code but NONE).
CODE_CLASSES: dict[int, type[KafkaError]] = _code_classes()


def error_for(code: int, message: str = "") -> KafkaError:
    """The exception for a protocol error code.

    Args:
        code: an :class:`~raftcoord.protocol.errors.ErrorCode` value other than NONE.
        message: the server's detail, kept as the exception's message.

    Returns:
        An instance of the class that stands for ``code``; an
        :class:`UnknownServerError` naming the number for a code this client
        does not know (a newer server).

    Raises:
        ValueError: ``code`` is NONE (success is not an error).
    """
    if code == ErrorCode.NONE:
        raise ValueError("error code NONE is success, not an error")
    cls = CODE_CLASSES.get(code)
    if cls is None:
        return UnknownServerError(f"unknown error code {code}: {message}" if message else str(code))
    return cls(message or _name_of(code))


def _name_of(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)
