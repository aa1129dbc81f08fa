"""A partition opened by a test alone, without a node and its coordinators."""

from __future__ import annotations

from partition_log.partition import Partition
from raftcoord.protocol.limits import MAX_OFFSET


def reserved(partition: Partition) -> Partition:
    """``partition`` led by its only replica, with every offset reserved, as a
    node's coordinators would grant them (:meth:`Partition.grant`)."""
    partition.lead(partition.leader_epoch)
    partition.grant(0, MAX_OFFSET)
    return partition
