"""Record batching and sequence bookkeeping for the producers (no I/O).

Records are appended to a queue of batches per partition. A partition has
at most one batch in flight, always the head of its queue, so sequence
numbers are simple: a batch gets ``base_sequence`` = the partition's next
sequence when it is first sent, keeps it (and the producer id and epoch it
was numbered under) for every retry (the partition-log node deduplicates a
retried batch and answers with the original offsets), and the partition's
next sequence advances only when the batch is acknowledged. A batch that is
refused for good leaves the sequence where it was, so the next batch reuses
it.

As in Kafka since KIP-360, a producer that loses track of a partition's
sequence (a batch of unknown outcome expired) bumps its epoch; each
partition moves to the new epoch, from sequence 0, only once it has no
batch numbered under the old one left to retry.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from enum import Enum

from raftcoord.client.errors import KafkaError
from raftcoord.client.records import Headers, RecordMetadata, TopicPartition
from raftcoord.protocol.errors import STALE_METADATA, ErrorCode
from raftcoord.protocol.limits import MAX_SEQUENCE

__all__ = [
    "BATCH_HEADER_SIZE",
    "PendingRecord",
    "ProduceAction",
    "ProducerBatch",
    "RecordAccumulator",
    "SequenceNumbers",
    "produce_action",
]

#: Size of a Kafka v2 record batch's header: what a batch adds to its records.
BATCH_HEADER_SIZE = 61
#: A record's fixed fields at their widest: attributes, timestamp delta
#: (varlong) and offset delta (varint).
_RECORD_FIELDS_MAX = 1 + 10 + 5


def _varint_size(value: int) -> int:
    """Bytes of ``value`` as a zigzag varint (Kafka's record encoding)."""
    zigzag = (value << 1) ^ (value >> 63)
    return max(1, (zigzag.bit_length() + 6) // 7)


def _bytes_size(data: bytes | None) -> int:
    """A nullable byte string in a record: its length varint (-1 for null) and the bytes."""
    return 1 if data is None else _varint_size(len(data)) + len(data)


@dataclass
class PendingRecord:
    """A record waiting in a batch, with the future its sender holds."""

    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int
    future: Future[RecordMetadata] = field(default_factory=Future)

    def size(self) -> int:
        """An upper bound of the record's bytes in a v2 record batch (exact but
        for the timestamp and offset deltas, counted at their widest), so
        ``BATCH_HEADER_SIZE + size()`` bounds the batch the partition-log node
        builds for this record alone and checks against ``message.max.bytes``."""
        body = (
            _RECORD_FIELDS_MAX
            + _bytes_size(self.key)
            + _bytes_size(self.value)
            + _varint_size(len(self.headers))
            + sum(_bytes_size(k.encode()) + _bytes_size(v) for k, v in self.headers)
        )
        return _varint_size(body) + body


class ProducerBatch:
    """Records for one partition, sent and acknowledged together."""

    def __init__(self, tp: TopicPartition, created_s: float) -> None:
        self.tp = tp
        self.created_s = created_s
        self.records: list[PendingRecord] = []
        self.size_bytes = 0
        #: Fixed when the batch is first sent; kept for every retry.
        self.base_sequence: int | None = None
        self.producer_id = -1
        self.producer_epoch = -1
        self.attempts = 0
        #: Monotonic time before which a retry is not sent.
        self.retry_at_s = 0.0
        self.last_error: KafkaError | None = None
        self.done = threading.Event()

    def __repr__(self) -> str:
        return (
            f"ProducerBatch({self.tp.topic}-{self.tp.partition}, records={len(self.records)}, "
            f"base_sequence={self.base_sequence}, attempts={self.attempts})"
        )

    def append(self, record: PendingRecord) -> None:
        self.records.append(record)
        self.size_bytes += record.size()

    @property
    def sent(self) -> bool:
        """Whether the batch was ever handed to the network (its outcome may be unknown)."""
        return self.attempts > 0

    def complete(self, base_offset: int) -> None:
        """Resolve every record's future with its offset."""
        for i, record in enumerate(self.records):
            offset = base_offset + i if base_offset >= 0 else -1
            _settle(record.future, RecordMetadata(self.tp.topic, self.tp.partition, offset))
        self.done.set()

    def fail(self, error: BaseException) -> None:
        """Fail every record's future with ``error``."""
        for record in self.records:
            _settle(record.future, None, error)
        self.done.set()


def _settle(
    future: Future[RecordMetadata],
    result: RecordMetadata | None,
    error: BaseException | None = None,
) -> None:
    try:
        if error is not None:
            future.set_exception(error)
        elif result is not None:
            future.set_result(result)
    except InvalidStateError:  # already settled: a batch is settled once
        pass


class SequenceNumbers:
    """Per partition: the producer identity (id, epoch) its sequences belong
    to, and the next sequence."""

    def __init__(self) -> None:
        self._next: dict[TopicPartition, tuple[tuple[int, int], int]] = {}

    def number(self, tp: TopicPartition, identity: tuple[int, int]) -> int:
        """The sequence of the partition's next batch under ``identity``. A
        partition still on another identity restarts at 0 under this one:
        call this only when no batch of the partition numbered under the old
        identity is left to retry."""
        current = self._next.get(tp)
        if current is None or current[0] != identity:
            self._next[tp] = (identity, 0)
            return 0
        return current[1]

    def advance(self, tp: TopicPartition, identity: tuple[int, int], count: int) -> None:
        """A batch of ``count`` records numbered under ``identity`` was
        acknowledged: move past it (wrapping), unless the partition has
        moved on to another identity."""
        current = self._next.get(tp)
        if current is not None and current[0] == identity:
            self._next[tp] = (identity, (current[1] + count) % (MAX_SEQUENCE + 1))

    def forget(self, tp: TopicPartition) -> None:
        """The partition's sequence is unknown (a batch's outcome was lost, or
        the partition refused our numbering): it restarts at 0 under the next
        identity, which the producer must take before numbering again."""
        self._next.pop(tp, None)

    def snapshot(self) -> dict[TopicPartition, tuple[tuple[int, int], int]]:
        return dict(self._next)


class RecordAccumulator:
    """Per-partition queues of batches. Not thread-safe: the producer guards it
    with its lock."""

    def __init__(self, batch_size: int = 16384, linger_s: float = 0.005) -> None:
        self.batch_size = batch_size
        self.linger_s = linger_s
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        self._in_flight: dict[TopicPartition, ProducerBatch] = {}

    # --- appending -----------------------------------------------------------------

    def append(self, tp: TopicPartition, record: PendingRecord, now_s: float) -> bool:
        """Add ``record`` to the partition's last batch, or to a new batch when the
        last one is full or already sent.

        Returns:
            Whether the sender should look at the queues now: a batch is full,
            or a new batch started (its linger time begins).
        """
        queue = self._queues.setdefault(tp, deque())
        last = queue[-1] if queue else None
        # A batch that was sent (in flight or waiting to be retried) is frozen:
        # its retries must carry exactly the records of the first attempt.
        if (
            last is None
            or last.sent
            or (last.records and last.size_bytes + record.size() > self.batch_size)
        ):
            last = ProducerBatch(tp, now_s)
            queue.append(last)
            last.append(record)
            return True
        last.append(record)
        return last.size_bytes >= self.batch_size

    # --- sending -------------------------------------------------------------------

    def _head_ready(self, batch: ProducerBatch, now_s: float, flush: bool, more: bool) -> bool:
        if batch.attempts:
            return now_s >= batch.retry_at_s
        return (
            flush
            or more
            or batch.size_bytes >= self.batch_size
            or now_s - batch.created_s >= self.linger_s
        )

    def ready(self, now_s: float, flush: bool = False) -> list[TopicPartition]:
        """Partitions whose head batch may be sent now (full, lingered long enough,
        flushing, or a retry whose backoff passed) and that have nothing in flight."""
        return [
            tp
            for tp, queue in self._queues.items()
            if queue
            and tp not in self._in_flight
            and self._head_ready(queue[0], now_s, flush, len(queue) > 1)
        ]

    def next_ready_s(self, now_s: float) -> float | None:
        """When the next head batch not in flight becomes ready (None: none waits)."""
        times = []
        for tp, queue in self._queues.items():
            if not queue or tp in self._in_flight:
                continue
            head = queue[0]
            times.append(head.retry_at_s if head.attempts else head.created_s + self.linger_s)
        return min(times, default=None)

    def drain(self, tps: Iterable[TopicPartition]) -> list[ProducerBatch]:
        """Mark the head batches of ``tps`` in flight and return them."""
        batches = []
        for tp in tps:
            queue = self._queues.get(tp)
            if not queue or tp in self._in_flight:
                continue
            self._in_flight[tp] = queue[0]
            batches.append(queue[0])
        return batches

    def retry(self, batch: ProducerBatch, at_s: float) -> None:
        """The in-flight ``batch`` failed retriably: send it again at ``at_s``
        (same sequence, still at the head of its queue)."""
        if self._in_flight.get(batch.tp) is batch:
            del self._in_flight[batch.tp]
        batch.retry_at_s = at_s

    def remove(self, batch: ProducerBatch) -> None:
        """``batch`` is settled (acknowledged or failed): drop it from its queue."""
        if self._in_flight.get(batch.tp) is batch:
            del self._in_flight[batch.tp]
        queue = self._queues.get(batch.tp)
        if queue is not None:
            try:
                queue.remove(batch)
            except ValueError:
                pass
            if not queue:
                del self._queues[batch.tp]

    # --- bulk changes --------------------------------------------------------------

    def undrained(self) -> list[ProducerBatch]:
        """Every batch not in flight."""
        return [
            b
            for tp, queue in self._queues.items()
            for i, b in enumerate(queue)
            if i > 0 or tp not in self._in_flight
        ]

    def take_undrained(self) -> list[ProducerBatch]:
        """Remove and return every batch not in flight (to fail them)."""
        taken = self.undrained()
        for batch in taken:
            self.remove(batch)
        return taken

    def expired(self, now_s: float, delivery_timeout_s: float) -> list[ProducerBatch]:
        """Remove and return batches not in flight created more than
        ``delivery_timeout_s`` ago."""
        taken = [b for b in self.undrained() if now_s - b.created_s >= delivery_timeout_s]
        for batch in taken:
            self.remove(batch)
        return taken

    def partitions(self) -> set[TopicPartition]:
        """Partitions with queued batches."""
        return {tp for tp, queue in self._queues.items() if queue}

    def incomplete(self) -> list[ProducerBatch]:
        """Every batch not yet settled, in flight or not."""
        return [b for queue in self._queues.values() for b in queue]

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())


class ProduceAction(Enum):
    """What the producer does with a batch after a Produce answer."""

    #: Acknowledged: resolve the futures, advance the sequence.
    COMPLETE = "complete"
    #: Send the batch again with the same sequence after a backoff.
    RETRY = "retry"
    #: As RETRY, but refresh the metadata first (the node does not own it).
    RETRY_REFRESH = "retry-refresh"
    #: The partition lost the producer's state (the batch was not written):
    #: an idempotent producer bumps its epoch and sends the batch again from
    #: sequence 0.
    RETRY_BUMP_EPOCH = "retry-bump-epoch"
    #: Fail the batch; it was not written.
    FAIL = "fail"
    #: Fail the batch; the producer's sequence state is out of step with the
    #: partition: an idempotent producer bumps its epoch.
    FAIL_BUMP_EPOCH = "fail-bump-epoch"
    #: Fail the batch and the producer: it has been fenced.
    FATAL = "fatal"


_RETRIABLE_PRODUCE = frozenset(
    {
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.CONCURRENT_TRANSACTIONS,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    }
)
#: Produce answers that end a transactional producer. Any other refusal
#: (INVALID_TXN_STATE or TRANSACTION_ABORTABLE included, as in Kafka's
#: producer) only makes the transaction abortable.
_FATAL_TRANSACTIONAL = frozenset(
    {
        ErrorCode.PRODUCER_FENCED,
        ErrorCode.INVALID_PRODUCER_EPOCH,
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)
_OUT_OF_STEP = frozenset(
    {
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
        ErrorCode.INVALID_PRODUCER_EPOCH,
        ErrorCode.PRODUCER_FENCED,
        ErrorCode.UNKNOWN_SERVER_ERROR,
    }
)


def produce_action(code: int | None, transactional: bool) -> ProduceAction:
    """The producer's reaction to a per-partition Produce answer.

    Args:
        code: the partition's error code; None for a transport failure of the
            whole request (the batch may or may not have been written).
        transactional: whether the producer is transactional. For it every
            failure that is not retried also makes the transaction abortable
            (or the producer fatal); the caller does that.
    """
    if code in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
        return ProduceAction.COMPLETE
    if code is None or code in _RETRIABLE_PRODUCE:
        return ProduceAction.RETRY
    if code in STALE_METADATA:
        return ProduceAction.RETRY_REFRESH
    if transactional:
        return ProduceAction.FATAL if code in _FATAL_TRANSACTIONAL else ProduceAction.FAIL
    if code == ErrorCode.UNKNOWN_PRODUCER_ID:
        return ProduceAction.RETRY_BUMP_EPOCH
    if code in _OUT_OF_STEP:
        return ProduceAction.FAIL_BUMP_EPOCH
    return ProduceAction.FAIL
