"""Which shard owns a transactional.id or a consumer group id, and which
coordinator a shard prefers as its leader."""

from __future__ import annotations

import zlib


def stable_hash(key: str) -> int:
    """CRC-32 of ``key``'s UTF-8 bytes: the same in every process and
    version (never Python's salted ``hash``)."""
    return zlib.crc32(key.encode("utf-8"))


def shard_for(key: str, shard_count: int) -> int:
    """The shard of ``key``: its :func:`stable_hash` modulo ``shard_count``."""
    if shard_count < 1:
        raise ValueError(f"shard_count must be positive, got {shard_count}")
    return stable_hash(key) % shard_count


def preferred_leader(shard: int, coordinator_count: int) -> int:
    """The position (in the order of ``[[coordinators]]``) of the coordinator
    that ``shard`` prefers as its leader (auto.leader.rebalance.enable):
    shard ``s`` prefers the ``s mod n``-th of ``n``."""
    return shard % coordinator_count
