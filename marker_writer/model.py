"""What the marker writer talks about: participants, destinations, the
markers sent to one destination and the answers that come back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, order=True)
class DataPartition:
    """A topic-partition in a transaction; its marker goes to the
    partition-log node that owns it."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, order=True)
class ConsumerGroup:
    """A consumer group whose offsets a transaction committed; its marker
    goes to the coordinator node leading the group's shard."""

    group_id: str

    def __str__(self) -> str:
        return f"group:{self.group_id}"


Participant = DataPartition | ConsumerGroup


@dataclass(frozen=True, order=True)
class TxnKey:
    """One transaction's markers: (producer id, marker epoch, transaction
    number) names exactly one transaction (under transactions v1 the epoch
    alone does not); the transactional.id is carried for logs and completion."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    txn_number: int = -1

    def __str__(self) -> str:
        return f"{self.transactional_id}/{self.producer_id}:{self.producer_epoch}#{self.txn_number}"


class DestinationKind(StrEnum):
    """Which protocol a destination speaks for WriteTxnMarkers."""

    PARTITION_LOG = "partition_log"
    COORDINATOR = "coordinator"


@dataclass(frozen=True, order=True)
class Destination:
    """A node markers are sent to. ``address`` is part of the identity, so a
    node that moves address is a new destination."""

    kind: DestinationKind
    node_id: int
    address: str

    def __str__(self) -> str:
        return f"{self.kind.value}-{self.node_id}"


@dataclass(frozen=True)
class MarkerRequest:
    """One transaction's marker for the participants one destination holds.

    ``coordinator_epoch`` is the epoch of the writer sending it (the shard's
    Raft term), so a partition fences markers from a deposed leader.
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    commit: bool
    partitions: tuple[DataPartition, ...]
    groups: tuple[ConsumerGroup, ...]
    #: See :class:`raftcoord.protocol.types.WriteMarkers`.
    transaction_version: int = 2
    txn_number: int = -1

    @property
    def participants(self) -> tuple[Participant, ...]:
        return (*self.partitions, *self.groups)


@dataclass(frozen=True)
class DeliveryProblem:
    """Why a participant's marker was not written on the last try: Kafka's
    error code and what it means here."""

    code: int
    message: str


@dataclass(frozen=True)
class MarkerResponse:
    """The answer to one :class:`MarkerRequest`: an error code per participant
    (Kafka's numbers; 0 = written). A participant missing from ``errors``
    counts as not written."""

    errors: Mapping[Participant, int]


@dataclass(frozen=True)
class Completion:
    """A transaction whose every participant acknowledged its marker: the
    MarkersWritten command to propose (it moves Prepare* to Complete*)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[DataPartition, ...]
    groups: tuple[ConsumerGroup, ...]
    txn_number: int = -1
