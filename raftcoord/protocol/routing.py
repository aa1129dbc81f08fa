"""Which shard owns a transactional.id or a consumer group id."""

from __future__ import annotations

import zlib


def shard_for(key: str, shard_count: int) -> int:
    """The shard of ``key``: CRC-32 of its UTF-8 bytes modulo ``shard_count``.

    Stable across processes and versions (never Python's salted ``hash``).
    """
    if shard_count < 1:
        raise ValueError(f"shard_count must be positive, got {shard_count}")
    return zlib.crc32(key.encode("utf-8")) % shard_count
