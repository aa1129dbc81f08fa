"""Value types the client hands to and returns from applications."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

#: Record headers: (name, value) pairs in order.
Headers = list[tuple[str, bytes]]


class TopicPartition(NamedTuple):
    """A topic and a partition index (0-based)."""

    topic: str
    partition: int


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
