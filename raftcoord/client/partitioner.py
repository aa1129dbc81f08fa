"""Kafka's default partitioner: murmur2 of the key, sticky partitions for null keys.

A record with a key goes to ``to_positive(murmur2(key)) % num_partitions``,
the formula of Kafka's Java producer, so the same key lands in the same
partition as it would with a Kafka client. Records without a key stick to
one partition until about ``batch_size`` bytes went there, then move to
another one (KIP-794's uniform sticky partitioner, without its load
weighting): batches fill up instead of many tiny ones being sent.
"""

from __future__ import annotations

import random

__all__ = ["DefaultPartitioner", "murmur2", "to_positive"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """MurmurHash2 (32-bit) as Kafka's ``Utils.murmur2`` computes it.

    Returns:
        The hash as a signed 32-bit integer, like Java's ``int``.
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(number: int) -> int:
    """Kafka's ``Utils.toPositive``: clears the sign bit of a 32-bit int
    (not ``abs``: ``abs(-2**31)`` would overflow in Java)."""
    return number & 0x7FFFFFFF


class DefaultPartitioner:
    """Chooses the partition of a record sent without an explicit one.

    Not thread-safe: the producer calls it from the application thread.
    """

    def __init__(self, batch_size: int = 16384, rng: random.Random | None = None) -> None:
        self.batch_size = batch_size
        self._rng = rng or random.Random()
        self._sticky: dict[str, int] = {}
        self._sticky_bytes: dict[str, int] = {}

    def partition(
        self, topic: str, key: bytes | None, num_partitions: int, record_size: int = 0
    ) -> int:
        """The partition for a record of ``record_size`` bytes.

        Raises:
            ValueError: ``num_partitions`` is not positive.
        """
        if num_partitions <= 0:
            raise ValueError(f"topic {topic!r} has no partitions")
        if key is not None:
            return to_positive(murmur2(key)) % num_partitions
        current = self._sticky.get(topic)
        if current is None or current >= num_partitions:
            current = self._next_sticky(topic, num_partitions, current)
        elif self._sticky_bytes.get(topic, 0) >= self.batch_size:
            current = self._next_sticky(topic, num_partitions, current)
        self._sticky_bytes[topic] = self._sticky_bytes.get(topic, 0) + max(record_size, 1)
        return current

    def _next_sticky(self, topic: str, num_partitions: int, previous: int | None) -> int:
        choice = self._rng.randrange(num_partitions)
        if num_partitions > 1 and choice == previous:
            choice = (choice + 1 + self._rng.randrange(num_partitions - 1)) % num_partitions
        self._sticky[topic] = choice
        self._sticky_bytes[topic] = 0
        return choice
