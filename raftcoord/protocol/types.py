"""Value types every component shares: a topic-partition, and the markers a
coordinator asks the partition-log nodes to write. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class TopicPartition(NamedTuple):
    """A topic and a partition index (0-based)."""

    topic: str
    partition: int


@dataclass(frozen=True)
class WriteMarkers:
    """Write a COMMIT or ABORT marker to every listed participant."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    commit: bool
    partitions: tuple[TopicPartition, ...]
    groups: tuple[str, ...]
    #: How the transaction ended (Kafka's transaction.version): 2 with an
    #: epoch bump, so the markers' epoch is above the data's; 1 without, so
    #: the markers carry the data's own epoch. And the transaction's number
    #: (-1: unknown), which tells its markers from another transaction's of
    #: the same producer id and epoch.
    transaction_version: int = 2
    txn_number: int = -1
