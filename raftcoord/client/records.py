"""Value types the client hands to and returns from applications."""

from __future__ import annotations

from dataclasses import dataclass, field

from raftcoord.protocol.types import TopicPartition as TopicPartition

#: Record headers: (name, value) pairs in order.
Headers = list[tuple[str, bytes]]


@dataclass(frozen=True)
class RecordMetadata:
    """Where an acknowledged record was written."""

    topic: str
    partition: int
    offset: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True)
class ConsumerRecord:
    """A record read by :class:`~raftcoord.client.Consumer`."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers = field(default_factory=list)
    timestamp_ms: int = -1

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True)
class TransactionListing:
    """One transactional id in :meth:`Admin.list_transactions`."""

    transactional_id: str
    producer_id: int
    state: str
    #: How long the current transaction has been running (ms); -1 when none is open.
    duration_ms: int


@dataclass(frozen=True)
class PendingMarker:
    """A marker a PrepareCommit/PrepareAbort transaction still owes one
    participant, with the last problem its delivery met."""

    #: The data partition, or None for a consumer group's offsets.
    partition: TopicPartition | None
    #: The consumer group, or None for a data partition.
    group_id: str | None
    #: The last error's name (e.g. UNKNOWN_TOPIC_OR_PARTITION); NONE when no
    #: delivery failed yet.
    last_error: str
    last_error_message: str

    def __str__(self) -> str:
        where = (
            f"group {self.group_id}"
            if self.partition is None
            else f"{self.partition.topic}-{self.partition.partition}"
        )
        if self.last_error == "NONE":
            return where
        detail = f" ({self.last_error_message})" if self.last_error_message else ""
        return f"{where}: {self.last_error}{detail}"


@dataclass(frozen=True)
class TransactionDescription:
    """The coordinator's state of one transactional id
    (:meth:`Admin.describe_transactions`)."""

    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    #: Start of the current transaction (ms since the epoch); -1 when none is open.
    transaction_start_time_ms: int
    last_update_time_ms: int
    partitions: frozenset[TopicPartition]
    groups: frozenset[str]
    #: The answering shard leader's Raft term.
    coordinator_epoch: int
    #: In PrepareCommit/PrepareAbort: the markers not delivered yet.
    pending_markers: tuple[PendingMarker, ...] = ()
    #: KIP-939: the producer that initialized last takes part in a two-phase
    #: commit (its transactions never time out).
    two_phase_commit: bool = False
    #: KIP-939: the producer id and epoch of the records of a transaction
    #: that InitProducerId kept (open, or the last one ended); -1 when none.
    ongoing_txn_producer_id: int = -1
    ongoing_txn_producer_epoch: int = -1


@dataclass(frozen=True)
class MemberDescription:
    """One member of a consumer group (:class:`ConsumerGroupDescription`)."""

    member_id: str
    #: group.instance.id of a static member; None for a dynamic one.
    group_instance_id: str | None
    client_id: str
    #: The member's assignment as the group's leader encoded it.
    assignment: bytes


@dataclass(frozen=True)
class ConsumerGroupDescription:
    """A consumer group's membership (:meth:`Admin.describe_consumer_groups`)."""

    group_id: str
    #: Kafka's state name: Empty, PreparingRebalance, CompletingRebalance,
    #: Stable (Empty too for a group that only has offsets), or Dead for a
    #: group that neither joined nor has offsets.
    state: str
    protocol_type: str
    #: The chosen protocol (the partition assignor's name); empty without members.
    partition_assignor: str
    generation_id: int
    #: The leader's member id; empty without members.
    leader: str
    members: tuple[MemberDescription, ...]


@dataclass(frozen=True)
class ProducerState:
    """One producer id's state on a partition (:meth:`Admin.describe_producers`)."""

    producer_id: int
    #: The producer's latest epoch on the partition.
    producer_epoch: int
    #: Sequence of its last appended record; -1 when none is remembered.
    last_sequence: int
    #: Timestamp of its last batch or marker (ms since the epoch); -1 when none.
    last_timestamp_ms: int
    #: Coordinator epoch of its last marker; -1 when it has none.
    coordinator_epoch: int
    #: First offset of its open transaction on the partition; -1 when none is open.
    current_transaction_start_offset: int


@dataclass(frozen=True)
class AbortTransactionSpec:
    """What :meth:`Admin.abort_transaction` aborts: the open transaction of
    ``producer_id`` on ``topic_partition``, whose data has ``producer_epoch``
    (as :class:`ProducerState` shows it). ``coordinator_epoch`` must not be
    older than the partition's (its ProducerState's, or 0 when that is -1)."""

    topic_partition: TopicPartition
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int


@dataclass(frozen=True)
class ShardReplicaDescription:
    """One coordinator node's replica of a shard, as the node tells it
    (:meth:`Admin.describe_coordinators`)."""

    shard: int
    #: True while this replica is the shard's Raft leader (and has applied its log).
    is_leader: bool
    #: The replica's current Raft term (the coordinator epoch while leader).
    term: int
    #: The leader this replica knows: node id (-1 when none) and address ("" when none).
    leader_node_id: int
    leader_address: str
    #: Raft commit index this replica knows, and the last index it applied.
    commit_index: int
    applied_index: int
    #: Transactional ids the shard holds.
    transactional_ids: int
    #: Requests the leader holds until their id's previous transaction completes.
    parked_requests: int


@dataclass(frozen=True)
class CoordinatorDescription:
    """A coordinator node and its shard replicas (:meth:`Admin.describe_coordinators`)."""

    node_id: int
    address: str
    #: Why the node did not answer; None when it did.
    error: str | None
    #: Its replicas, by shard; empty when it did not answer.
    shards: tuple[ShardReplicaDescription, ...] = ()


@dataclass(frozen=True)
class TopicPartitionDescription:
    """One partition's leader and replicas (:meth:`Admin.describe_topics`)."""

    partition: int
    #: The partition-log node that leads it; -1 while none does.
    leader: int
    leader_epoch: int
    #: Every node holding a replica, the preferred leader first.
    replicas: tuple[int, ...]
    #: The replicas holding every acknowledged record.
    isr: tuple[int, ...]

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)


@dataclass(frozen=True)
class TopicDescription:
    """A topic as the coordinators' controller records it (:meth:`Admin.describe_topics`)."""

    name: str
    min_insync_replicas: int
    partitions: tuple[TopicPartitionDescription, ...]

    @property
    def replication_factor(self) -> int:
        return len(self.partitions[0].replicas) if self.partitions else 0


@dataclass(frozen=True)
class PartitionNodeDescription:
    """A partition-log node's state (:meth:`Admin.describe_partition_nodes`)."""

    node_id: int
    address: str
    #: Why the node did not answer; None when it did.
    error: str | None
    #: Its data directory's id, and "serving", "registering" or "replaced".
    directory_id: str = ""
    directory_state: str = ""
    #: The partitions it refuses to serve, and why.
    refused: tuple[tuple[TopicPartition, str], ...] = ()
