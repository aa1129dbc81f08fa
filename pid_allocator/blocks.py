"""The replicated half of the allocator: block layout and the per-shard counter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_BLOCK_SIZE = 1000
MAX_PRODUCER_ID = 2**63 - 1


class PidExhausted(Exception):
    """The shard's stripe of the 64-bit producer-id space is used up."""


@dataclass(frozen=True, order=True)
class PidBlock:
    """A contiguous range of producer ids: ``first`` inclusive, ``end`` exclusive."""

    first: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.first < self.end <= MAX_PRODUCER_ID + 1:
            raise ValueError(f"invalid producer-id block [{self.first}, {self.end})")

    @property
    def size(self) -> int:
        return self.end - self.first

    def __contains__(self, pid: object) -> bool:
        return isinstance(pid, int) and self.first <= pid < self.end


@dataclass(frozen=True)
class PidLayout:
    """How one shard's blocks sit in the id space (see the package docstring)."""

    shard: int
    shard_count: int
    block_size: int = DEFAULT_BLOCK_SIZE

    def __post_init__(self) -> None:
        if self.shard_count < 1 or not 0 <= self.shard < self.shard_count:
            raise ValueError(f"shard {self.shard} out of range for {self.shard_count} shards")
        if self.block_size < 1:
            raise ValueError(f"block size must be positive, got {self.block_size}")

    def block(self, seq: int) -> PidBlock:
        """The ``seq``-th block of this shard.

        Raises:
            PidExhausted: the block would pass the largest producer id.
        """
        if seq < 0:
            raise ValueError(f"block sequence must be >= 0, got {seq}")
        first = (seq * self.shard_count + self.shard) * self.block_size
        end = first + self.block_size
        if end > MAX_PRODUCER_ID + 1:
            raise PidExhausted(f"shard {self.shard} has no producer-id block {seq}")
        return PidBlock(first, end)

    def block_seq(self, pid: int) -> int | None:
        """The sequence number of this shard's block holding ``pid``, or None."""
        if pid < 0:
            return None
        global_index, _ = divmod(pid, self.block_size)
        seq, shard = divmod(global_index, self.shard_count)
        return seq if shard == self.shard else None


@dataclass
class PidBlockRecord:
    """The replicated "next free block" record of one shard.

    Applied identically on every replica of the shard; ``allocate`` is the
    only mutation and is driven by a replicated command.
    """

    layout: PidLayout
    next_seq: int = 0

    def allocate(self) -> PidBlock:
        """Grant the next block of this shard and advance the counter.

        Raises:
            PidExhausted: the stripe is used up (the counter does not move).
        """
        block = self.layout.block(self.next_seq)
        self.next_seq += 1
        return block

    def granted(self, pid: int) -> bool:
        """Whether ``pid`` lies in a block this record has already granted."""
        seq = self.layout.block_seq(pid)
        return seq is not None and seq < self.next_seq

    def to_wire(self) -> list[int]:
        return [
            self.layout.shard,
            self.layout.shard_count,
            self.layout.block_size,
            self.next_seq,
        ]

    @classmethod
    def from_wire(cls, data: Any) -> PidBlockRecord:
        """Rebuild a record from :meth:`to_wire` output.

        Raises:
            ValueError: the data is not a valid record.
        """
        if (
            not isinstance(data, list)
            or len(data) != 4
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in data)
        ):
            raise ValueError(f"malformed producer-id block record: {data!r}")
        shard, shard_count, block_size, next_seq = data
        if next_seq < 0:
            raise ValueError(f"negative block counter in {data!r}")
        return cls(PidLayout(shard, shard_count, block_size), next_seq)
