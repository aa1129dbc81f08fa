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
