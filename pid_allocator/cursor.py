"""The leader-side half of the allocator: serves ids from granted blocks."""

from __future__ import annotations

from collections import deque

from pid_allocator.blocks import PidBlock

REFILL_RATIO = 0.9


class PidCursor:
    """Hands out producer ids from the blocks granted to this leader.

    Not replicated and not thread-safe: the owner serialises calls. On every
    leadership change the owner calls :meth:`reset`, which forgets the
    remaining ids (they are skipped, never reused) and invalidates requests
    made before it: a block granted to such a request is ignored, because
    another leader may have served higher ids in between and the ids a shard
    stamps into its log must only increase.
    """

    def __init__(self, refill_ratio: float = REFILL_RATIO) -> None:
        if not 0.0 < refill_ratio <= 1.0:
            raise ValueError(f"refill ratio must be in (0, 1], got {refill_ratio}")
        self._refill_ratio = refill_ratio
        self._blocks: deque[PidBlock] = deque()
        self._next = -1
        self._generation = 0
        self._requested = False

    def reset(self) -> None:
        """Drop every block and outstanding request (leadership changed)."""
        self._blocks.clear()
        self._next = -1
        self._generation += 1
        self._requested = False

    def mark_requested(self) -> int:
        """Record that a block request is being proposed; returns its token."""
        self._requested = True
        return self._generation

    def request_failed(self, token: int) -> None:
        """The request identified by ``token`` was not granted; allow a new one."""
        if token == self._generation:
            self._requested = False

    def add_block(self, block: PidBlock, token: int) -> bool:
        """Accept a block granted to the request identified by ``token``.

        Returns False (and keeps nothing) when the request predates the last
        :meth:`reset` or the block is not above the blocks already held.
        """
        if token != self._generation:
            return False
        self._requested = False
        if self._blocks and block.first < self._blocks[-1].end:
            return False
        self._blocks.append(block)
        return True

    def take(self) -> int | None:
        """The next unused id, or None when no granted id is left."""
        while self._blocks:
            head = self._blocks[0]
            self._next = max(self._next, head.first)
            if self._next < head.end:
                pid = self._next
                self._next += 1
                return pid
            self._blocks.popleft()
        return None

    def remaining(self) -> int:
        """How many ids can still be served without a new block."""
        return sum(block.end - max(block.first, self._next) for block in self._blocks)

    def needs_block(self) -> bool:
        """Whether the owner should ask for another block now.

        True when no request is outstanding and the ids left are at most
        ``1 - refill_ratio`` of a block (so at 90% use by default).
        """
        if self._requested:
            return False
        if not self._blocks:
            return True
        block_size = self._blocks[-1].size
        # Integer threshold: (1 - 0.9) * 10 is 0.999... in floating point.
        return self.remaining() <= block_size - round(self._refill_ratio * block_size)
