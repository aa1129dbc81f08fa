"""Producer-id allocation in blocks.

Producer ids are handed out in blocks. Every shard (transaction-log
partition) owns a disjoint stripe of the 64-bit id space: with S shards and a
block size B, the n-th block of shard s is global block ``n * S + s`` and
covers ids ``[(n * S + s) * B, (n * S + s + 1) * B)``. The replicated part
(:class:`PidBlockRecord`) is one counter per shard, replicated by that
shard's Raft group; the leader-side part (:class:`PidCursor`) serves ids from
the blocks it was granted and asks for the next block at 90% use.

Because the stripes never overlap and a shard's counter only moves forward,
a block is never granted twice, across shards and across restarts. A new
leader starts with an empty cursor and asks for a fresh block, so the ids
left in a deposed leader's block are skipped, never reused. Idempotent
producers (no transactional.id) draw from the same cursor.

The shard count and block size are fixed for the life of a cluster (they are
recorded in the replicated record and a mismatch is refused), exactly as the
number of transaction-log partitions is fixed in Kafka.
"""

from pid_allocator.blocks import (
    DEFAULT_BLOCK_SIZE,
    MAX_PRODUCER_ID,
    PidBlock,
    PidBlockRecord,
    PidExhausted,
    PidLayout,
)
from pid_allocator.cursor import REFILL_RATIO, PidCursor

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "MAX_PRODUCER_ID",
    "REFILL_RATIO",
    "PidBlock",
    "PidBlockRecord",
    "PidCursor",
    "PidExhausted",
    "PidLayout",
]
