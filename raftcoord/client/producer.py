"""Producers: the idempotent :class:`Producer` and the :class:`TransactionalProducer`.

``send`` appends a record to a per-partition batch and returns a future; a
background sender thread sends batches when they are full, after
``linger_ms``, or on ``flush``: one Produce request per partition-log node,
one batch per partition, at most one batch in flight per partition.
Retriable failures (transport, NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT,
UNKNOWN_TOPIC_OR_PARTITION after a metadata refresh) resend the batch with
the same sequence numbers until ``delivery_timeout_ms`` after the batch was
created; the partition deduplicates a retried batch.

Threading: a producer's methods are meant to be called from one
application thread. Futures are resolved, and their callbacks run, on the
sender thread; a callback must not call ``flush`` or ``commit_transaction``
(they wait for the sender thread).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any

import grpc

from partition_log.producer_state import MAX_EPOCH
from raftcoord.client._accumulator import (
    BATCH_HEADER_SIZE,
    PendingRecord,
    ProduceAction,
    ProducerBatch,
    RecordAccumulator,
    SequenceNumbers,
    produce_action,
)
from raftcoord.client._net import (
    Backoff,
    Channels,
    CoordinatorClient,
    Deadline,
    MetadataCache,
    transport_error,
)
from raftcoord.client._txn_state import TxnState, check_transition
from raftcoord.client.errors import (
    FatalError,
    IllegalStateError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFencedError,
    RecordTooLargeError,
    TransactionAbortableError,
    TransactionAbortedError,
    error_for,
)
from raftcoord.client.partitioner import DefaultPartitioner
from raftcoord.client.records import Headers, RecordMetadata, TopicPartition
from raftcoord.protocol.limits import id_error
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2, partition_log_pb2

__all__ = ["Producer", "TransactionalProducer"]

log = logging.getLogger("raftcoord.client.producer")
E = common_pb2.ErrorCode
S = TxnState

_FINAL_FAILURES = frozenset(
    {ProduceAction.FAIL, ProduceAction.FAIL_BUMP_EPOCH, ProduceAction.FATAL}
)
#: Longest the sender thread sleeps when nothing is due (it is woken on news).
_IDLE_WAIT_S = 0.5
#: Kafka's delivery.timeout.ms default.
DEFAULT_DELIVERY_TIMEOUT_MS = 120_000
#: Kafka's transaction.timeout.ms default (see TransactionalProducer for when
#: a longer one is used).
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
#: Kafka's max.request.size default, equal to the nodes' message.max.bytes default.
DEFAULT_MAX_REQUEST_SIZE = 1_048_576
_TIMESTAMP_MAX = 2**63 - 1


def _as_bytes(value: bytes | bytearray | memoryview | None, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"{what} must be bytes or None, not {type(value).__name__}")


def _check_int(name: str, value: object, minimum: int) -> int:
    """``value`` if it is an int (not a bool) >= ``minimum``, else TypeError or
    ValueError naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _as_headers(headers: Iterable[tuple[str, bytes]] | None) -> Headers:
    result: Headers = []
    for name, value in headers or ():
        if not isinstance(name, str):
            raise TypeError(f"header names must be str, not {type(name).__name__}")
        data = _as_bytes(value, f"header {name!r}")
        result.append((name, data if data is not None else b""))
    return result


def topic_partitions(tps: Iterable[TopicPartition]) -> list[common_pb2.TopicPartitions]:
    """``tps`` grouped by topic, as the protocol's TopicPartitions."""
    grouped: dict[str, list[int]] = {}
    for tp in sorted(set(tps)):
        grouped.setdefault(tp.topic, []).append(tp.partition)
    return [common_pb2.TopicPartitions(topic=t, partitions=ps) for t, ps in grouped.items()]


def offset_topics(offsets: Mapping[TopicPartition, int]) -> list[coordinator_pb2.OffsetCommitTopic]:
    """Offsets grouped by topic, as the protocol's OffsetCommitTopic."""
    grouped: dict[str, list[coordinator_pb2.OffsetCommitPartition]] = {}
    for key, offset in sorted(offsets.items()):
        tp = TopicPartition(*key)
        if offset < 0:
            raise ValueError(f"offset for {tp} must be >= 0, got {offset}")
        grouped.setdefault(tp.topic, []).append(
            coordinator_pb2.OffsetCommitPartition(
                partition=tp.partition, offset=offset, leader_epoch=-1
            )
        )
    return [coordinator_pb2.OffsetCommitTopic(topic=t, partitions=ps) for t, ps in grouped.items()]


def first_error(answer: Any) -> tuple[int, str]:
    """The request-level error of an answer, else its first per-partition error."""
    if answer.error_code != E.NONE:
        return int(answer.error_code), str(answer.error_message)
    for result in answer.results:
        if result.error_code != E.NONE:
            where = f"{result.topic}-{result.partition}"
            return int(result.error_code), result.error_message or f"partition {where}"
    return E.NONE, ""


class Producer:
    """An idempotent producer (no transactional id): it gets a producer id with
    InitProducerId, numbers every batch per partition, and retries failed
    batches with the same numbers so that no batch is written twice.

    Args:
        bootstrap: coordinator gRPC addresses: a list of "host:port", or one
            comma-separated string as Kafka's ``bootstrap.servers``; any one
            suffices.
        request_timeout_ms: deadline of each coordinator operation (all its
            retries) and of each Produce request.
        delivery_timeout_ms: how long a batch may take, from its creation to
            its acknowledgement, retries included; then its futures fail with
            :class:`KafkaTimeoutError`. As in Kafka, at least ``linger_ms +
            request_timeout_ms`` (ValueError otherwise); by default 120000,
            or that sum when larger.
        max_block_ms: how long ``send`` waits for a topic's metadata.
        linger_ms: how long a batch waits for more records before it is sent.
        batch_size: bytes after which a batch is sent without waiting.
        max_request_size: the largest Produce request, in record-batch bytes
            (Kafka's ``max.request.size``): a record whose batch alone would
            be larger is refused by ``send`` with :class:`RecordTooLargeError`
            without being sent, batches are closed before they grow past it,
            and the batches sent to one node are split into requests of at
            most this size. Keep it at or below the partition-log nodes'
            ``message.max.bytes`` (both default to 1 MiB).
        retry_backoff_ms, retry_backoff_max_ms: exponential backoff between
            retries (jittered).
        partitioner: chooses partitions for records sent without one.
        channels: where gRPC stubs come from (one channel per address by
            default); tests pass one whose stubs inject faults.
    """

    _transactional = False

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        request_timeout_ms: int = 30_000,
        delivery_timeout_ms: int | None = None,
        max_block_ms: int = 60_000,
        linger_ms: float = 5,
        batch_size: int = 16_384,
        max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
        retry_backoff_ms: int = 20,
        retry_backoff_max_ms: int = 1_000,
        partitioner: DefaultPartitioner | None = None,
        channels: Channels | None = None,
    ) -> None:
        for name, value in (
            ("request_timeout_ms", request_timeout_ms),
            ("max_block_ms", max_block_ms),
            ("batch_size", batch_size),
            ("max_request_size", max_request_size),
            ("retry_backoff_ms", retry_backoff_ms),
            ("retry_backoff_max_ms", retry_backoff_max_ms),
        ):
            _check_int(name, value, 1)
        if not isinstance(linger_ms, int | float) or isinstance(linger_ms, bool):
            raise TypeError(f"linger_ms must be a number, not {type(linger_ms).__name__}")
        if linger_ms < 0:
            raise ValueError(f"linger_ms must be >= 0, got {linger_ms}")
        # As Kafka's ProducerConfig: a batch must get at least one full attempt.
        least = int(linger_ms + request_timeout_ms)
        if delivery_timeout_ms is None:
            delivery_timeout_ms = max(DEFAULT_DELIVERY_TIMEOUT_MS, least)
        elif _check_int("delivery_timeout_ms", delivery_timeout_ms, 1) < least:
            raise ValueError(
                f"delivery_timeout_ms ({delivery_timeout_ms}) must be at least linger_ms + "
                f"request_timeout_ms ({linger_ms:g} + {request_timeout_ms} = {least})"
            )
        self._request_timeout_s = request_timeout_ms / 1000
        self._delivery_timeout_s = delivery_timeout_ms / 1000
        self._max_block_s = max_block_ms / 1000
        self._max_request_size = max_request_size
        self._backoff_s = (
            retry_backoff_ms / 1000,
            max(retry_backoff_ms, retry_backoff_max_ms) / 1000,
        )
        self._channels = channels or Channels()
        self._coordinators = CoordinatorClient(bootstrap, self._channels, *self._backoff_s)
        self._metadata = MetadataCache(self._coordinators)
        self._partitioner = partitioner or DefaultPartitioner(batch_size)

        # Guarded by _cond (an RLock): everything the sender thread shares.
        self._cond = threading.Condition()
        self._accumulator = RecordAccumulator(
            min(batch_size, max_request_size - BATCH_HEADER_SIZE), linger_ms / 1000
        )
        self._sequences = SequenceNumbers()
        self._identity: tuple[int, int] | None = None
        #: A partition's sequence was lost: bump the epoch before numbering again.
        self._epoch_bump_needed = False
        self._identity_retry_at = 0.0
        self._identity_backoff = Backoff(*self._backoff_s)
        self._completions: list[Callable[[], None]] = []
        self._flushing = 0
        self._wakeup = False
        self._closing = False
        self._force_close = False
        self._closed = False
        self._sender_busy = 0
        self._fatal: KafkaError | None = None

        self._thread = threading.Thread(
            target=self._run, name=f"raftcoord-producer-sender-{id(self):x}", daemon=True
        )
        self._thread.start()

    # --- context manager -----------------------------------------------------------

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- public API ----------------------------------------------------------------

    @property
    def producer_id(self) -> int:
        """The current producer id; -1 before one was obtained."""
        with self._cond:
            return -1 if self._identity is None else self._identity[0]

    @property
    def producer_epoch(self) -> int:
        """The current producer epoch; -1 before a producer id was obtained."""
        with self._cond:
            return -1 if self._identity is None else self._identity[1]

    def partitions_for(self, topic: str) -> list[int]:
        """The partition indexes of ``topic``.

        Raises:
            KafkaTimeoutError: the topic is not in the metadata within ``max_block_ms``.
        """
        count = self._metadata.wait_for_topic(topic, Deadline(self._max_block_s, "metadata"))
        return list(range(count))

    def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Iterable[tuple[str, bytes]] | None = None,
        timestamp_ms: int | None = None,
    ) -> Future[RecordMetadata]:
        """Queue a record for sending.

        Blocks only to learn the topic's partitions the first time a topic is
        used (at most ``max_block_ms``).

        Args:
            timestamp_ms: the record's creation time in ms since the epoch,
                0..2**63-1; None (the default) for now.

        Returns:
            A future resolving to the record's :class:`RecordMetadata` once
            its batch is acknowledged, or failing with a :class:`KafkaError`:
            at once with :class:`RecordTooLargeError` when the record is
            larger than ``max_request_size`` allows (it is not sent; a
            transactional producer's transaction must then be aborted, as
            in Kafka).

        Raises:
            KafkaTimeoutError: the topic is not in the metadata in time.
            ValueError, TypeError: an invalid partition, key, value, header
                or timestamp.
            IllegalStateError, TransactionAbortableError, FatalError: the
                producer cannot send now (see TransactionalProducer).
        """
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, not {type(topic).__name__}")
        if not topic:
            raise ValueError("topic must not be empty")
        if partition is not None:
            _check_int("partition", partition, 0)
        key = _as_bytes(key, "key")
        value = _as_bytes(value, "value")
        record_headers = _as_headers(headers)
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        elif not isinstance(timestamp_ms, int) or isinstance(timestamp_ms, bool):
            raise TypeError(
                f"timestamp_ms must be an int or None, not {type(timestamp_ms).__name__}"
            )
        elif not 0 <= timestamp_ms <= _TIMESTAMP_MAX:
            raise ValueError(f"timestamp_ms must be in 0..2**63-1 or None, got {timestamp_ms}")
        with self._cond:
            self._check_can_send()
        record = PendingRecord(key, value, record_headers, timestamp_ms)
        size = BATCH_HEADER_SIZE + record.size()
        if size > self._max_request_size:
            error = RecordTooLargeError(
                f"the record is {size} bytes when serialized, more than "
                f"max_request_size={self._max_request_size}"
            )
            self._record_refused(error)
            record.future.set_running_or_notify_cancel()
            record.future.set_exception(error)
            return record.future
        count = self._metadata.partition_count(topic)
        if count is None:
            count = self._metadata.wait_for_topic(
                topic, Deadline(self._max_block_s, f"metadata of topic {topic!r}")
            )
        if partition is None:
            partition = self._partitioner.partition(topic, key, count, record.size())
        elif not 0 <= partition < count:
            raise ValueError(f"partition {partition} of topic {topic!r} not in [0, {count})")
        # A queued send cannot be cancelled: the future is running from now on.
        record.future.set_running_or_notify_cancel()
        with self._cond:
            self._check_can_send()
            if self._accumulator.append(TopicPartition(topic, partition), record, _now()):
                self._wake_locked()
        return record.future

    def flush(self, timeout_s: float | None = None) -> None:
        """Send every queued record and wait until each is acknowledged or failed
        (each future is resolved).

        Raises:
            KafkaTimeoutError: ``timeout_s`` passed first.
        """
        with self._cond:
            batches = self._accumulator.incomplete()
            self._flushing += 1
            self._wake_locked()
        try:
            deadline = None if timeout_s is None else Deadline(timeout_s, "flush")
            for batch in batches:
                left = None if deadline is None else deadline.remaining()
                if not batch.done.wait(left):
                    raise KafkaTimeoutError(f"flush did not complete in {timeout_s} s")
        finally:
            with self._cond:
                self._flushing -= 1

    def close(self, timeout_s: float | None = None) -> None:
        """Send what is queued (waiting at most ``timeout_s``), stop the sender
        thread and close the connections. Records still unsent after the
        timeout fail. Closing twice is a no-op."""
        if self._closed:
            return
        self._before_close(timeout_s)
        with self._cond:
            self._closing = True
            self._wake_locked()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            with self._cond:
                self._force_close = True
                self._wake_locked()
            self._thread.join(self._request_timeout_s)
        with self._cond:
            leftovers = self._accumulator.incomplete()
            for batch in leftovers:
                self._accumulator.remove(batch)
            self._closed = True
        for batch in leftovers:
            batch.fail(KafkaError("the producer was closed before the batch was acknowledged"))
        self._channels.close()

    # --- hooks for the transactional producer ----------------------------------------

    def _before_close(self, timeout_s: float | None) -> None:
        """Runs first in close()."""

    def _record_refused(self, error: KafkaError) -> None:
        """``send`` refused a record without queueing it (application thread)."""

    def _check_can_send(self) -> None:
        """Raise unless a record may be queued now (called with the lock held)."""
        if self._closing or self._closed:
            raise IllegalStateError("cannot send: the producer is closed")
        if self._fatal is not None:
            raise self._fatal.again() from self._fatal

    def _may_send_locked(self) -> bool:
        """Whether batches may be sent now (lock held)."""
        return self._identity is not None and not self._epoch_bump_needed

    def _may_retry_locked(self) -> bool:
        """Whether a retriably failed batch may be sent again (lock held)."""
        return not self._force_close

    def _prepare_to_send(self) -> bool:
        """Sender thread, lock not held: get what sending needs (a producer id).

        Returns:
            Whether batches may be sent now.
        """
        with self._cond:
            if self._epoch_bump_needed:
                self._bump_epoch_locked()
            if self._identity is not None:
                return True
            if not len(self._accumulator) or _now() < self._identity_retry_at:
                return False
            self._sender_busy += 1
        try:
            identity = self._init_idempotent_producer_id()
        except KafkaError as exc:
            log.warning("no producer id yet: %s", exc)
            with self._cond:
                self._identity_retry_at = _now() + self._identity_backoff.next_delay()
            return False
        finally:
            with self._cond:
                self._sender_busy -= 1
                self._cond.notify_all()
        with self._cond:
            self._identity = identity
            self._identity_backoff.reset()
        return True

    def _bump_epoch_locked(self) -> None:
        """As Kafka's idempotent producer (KIP-360): bump the epoch locally, or
        take a new producer id once the epoch is exhausted. Batches numbered
        under the old epoch keep their numbers for their retries; each
        partition moves to the new epoch once those are settled (see
        ``_send_ready``)."""
        self._epoch_bump_needed = False
        if self._identity is None:
            return
        producer_id, epoch = self._identity
        self._identity = (producer_id, epoch + 1) if epoch < MAX_EPOCH else None
        log.info("producer %d: epoch bumped, now %s", producer_id, self._identity)

    def _init_idempotent_producer_id(self) -> tuple[int, int]:
        deadline = Deadline(self._request_timeout_s, "InitProducerId")
        backoff = self._coordinators.backoff()
        while True:
            answer = self._coordinators.call_any(
                "InitProducerId", coordinator_pb2.InitProducerIdRequest(), deadline
            )
            if answer.error_code == E.NONE:
                return int(answer.producer_id), int(answer.producer_epoch)
            error = error_for(answer.error_code, answer.error_message)
            if not error.retriable:
                raise error
            backoff.sleep(deadline, error)

    def _batch_failed(self, batch: ProducerBatch, error: KafkaError, action: ProduceAction) -> None:
        """A batch failed for good (sender thread, lock not held)."""
        outcome_unknown = batch.sent and (
            isinstance(error, KafkaTimeoutError) or action not in _FINAL_FAILURES
        )
        if action is ProduceAction.FAIL_BUMP_EPOCH or outcome_unknown:
            # The partition refused our numbering, or the batch may have been
            # written: its sequence there is unknown. It restarts from 0
            # under a new epoch; other partitions keep theirs until then.
            with self._cond:
                self._sequences.forget(batch.tp)
                self._epoch_bump_needed = True

    def _produce_error(self, code: int, message: str) -> KafkaError:
        return error_for(code, message)

    def _produce_request(self, batches: list[ProducerBatch]) -> Any:
        return partition_log_pb2.ProduceRequest(
            partitions=[
                partition_log_pb2.PartitionProduceData(
                    topic=b.tp.topic, partition=b.tp.partition, batch=self._record_batch(b)
                )
                for b in batches
            ]
        )

    def _record_batch(self, batch: ProducerBatch) -> partition_log_pb2.RecordBatch:
        records = []
        for r in batch.records:
            record = partition_log_pb2.Record(
                headers=[partition_log_pb2.RecordHeader(key=k, value=v) for k, v in r.headers],
                timestamp_ms=r.timestamp_ms,
            )
            if r.key is not None:
                record.key = r.key
            if r.value is not None:
                record.value = r.value
            records.append(record)
        assert batch.base_sequence is not None
        return partition_log_pb2.RecordBatch(
            producer_id=batch.producer_id,
            producer_epoch=batch.producer_epoch,
            base_sequence=batch.base_sequence,
            is_transactional=self._transactional,
            records=records,
        )

    # --- the sender thread -----------------------------------------------------------

    def _wake_locked(self) -> None:
        self._wakeup = True
        self._cond.notify_all()

    def _run(self) -> None:
        try:
            while self._sender_iteration():
                pass
        except BaseException as exc:  # a bug: fail every future rather than hang them
            log.exception("producer sender thread failed")
            error = KafkaError(f"the producer's sender thread failed: {exc!r}")
            with self._cond:
                self._fatal = self._fatal or error
                batches = self._accumulator.incomplete()
                for batch in batches:
                    self._accumulator.remove(batch)
                self._cond.notify_all()
            for batch in batches:
                batch.fail(error)

    def _sender_iteration(self) -> bool:
        with self._cond:
            completions, self._completions = self._completions, []
        for handle in completions:
            handle()
        self._expire_batches()
        with self._cond:
            if self._closing and (not len(self._accumulator) or self._force_close):
                return False
        self._metadata.maybe_refresh(Deadline(min(self._request_timeout_s, 5.0), "metadata"))
        progressed = bool(completions)
        if self._prepare_to_send():
            progressed = self._send_ready() > 0 or progressed
        with self._cond:
            if self._wakeup or self._completions:
                self._wakeup = False
                return True
            now = _now()
            wait = _IDLE_WAIT_S
            next_ready = self._accumulator.next_ready_s(now)
            if next_ready is not None:
                delay = next_ready - now
                if delay <= 0 and not progressed:
                    # Due but unable to go (node or producer id unknown so far):
                    # look again soon rather than spin.
                    delay = self._metadata.min_refresh_s
                wait = min(wait, max(0.0, delay))
            if (self._flushing or self._closing) and len(self._accumulator):
                wait = min(wait, self._metadata.min_refresh_s)
            if self._identity_retry_at > now:
                wait = min(wait, self._identity_retry_at - now)
            if wait > 0:
                self._cond.wait(wait)
            self._wakeup = False
        return True

    def _expire_batches(self) -> None:
        with self._cond:
            expired = self._accumulator.expired(_now(), self._delivery_timeout_s)
        for batch in expired:
            detail = f"; last error: {batch.last_error}" if batch.last_error else ""
            error = KafkaTimeoutError(
                f"expiring {len(batch.records)} record(s) for {batch.tp.topic}-"
                f"{batch.tp.partition}: {self._delivery_timeout_s:.3g} s have passed since "
                f"batch creation{detail}"
            )
            error.__cause__ = batch.last_error
            self._batch_failed(batch, error, ProduceAction.FAIL)
            batch.fail(error)

    def _send_ready(self) -> int:
        """Send every ready batch whose node is known.

        Returns:
            How many batches were sent.
        """
        requests: list[tuple[str, list[ProducerBatch]]] = []
        with self._cond:
            if not self._may_send_locked() or self._identity is None:
                return 0
            flush = self._flushing > 0 or self._closing
            by_node: dict[str, list[TopicPartition]] = {}
            for tp in self._accumulator.ready(_now(), flush):
                if not self._may_send_partition_locked(tp):
                    continue
                address = self._metadata.leader(tp)
                if address is None:
                    continue
                by_node.setdefault(address, []).append(tp)
            identity = self._identity
            for address, tps in by_node.items():
                batches = self._accumulator.drain(tps)
                for b in batches:
                    # A numbered batch keeps its numbers, even under an older
                    # epoch: an earlier attempt may have been written.
                    if b.base_sequence is None:
                        b.base_sequence = self._sequences.number(b.tp, identity)
                        b.producer_id, b.producer_epoch = identity
                    b.attempts += 1
                requests += [(address, part) for part in self._split(batches)]
        for address, batches in requests:
            self._send_produce(address, batches)
        return sum(len(batches) for _, batches in requests)

    def _may_send_partition_locked(self, tp: TopicPartition) -> bool:
        return True

    def _split(self, batches: list[ProducerBatch]) -> list[list[ProducerBatch]]:
        """``batches`` in requests of at most ``max_request_size`` batch bytes
        (a request takes at least one batch; no batch is larger)."""
        requests: list[list[ProducerBatch]] = []
        size = 0
        for batch in batches:
            batch_bytes = BATCH_HEADER_SIZE + batch.size_bytes
            if not requests or size + batch_bytes > self._max_request_size:
                requests.append([])
                size = 0
            requests[-1].append(batch)
            size += batch_bytes
        return requests

    def _send_produce(self, address: str, batches: list[ProducerBatch]) -> None:
        request = self._produce_request(batches)
        try:
            call = self._channels.partition_log(address).Produce.future(
                request, timeout=self._request_timeout_s
            )
        except (KafkaConnectionError, ValueError, RuntimeError) as exc:
            # The channel is closed (the producer is closing): fail like transport.
            error = KafkaConnectionError(f"{address}: {exc}")
            self._post(lambda: self._produce_failed(address, batches, error))
            return
        call.add_done_callback(
            lambda done: self._post(lambda: self._produced(address, batches, done))
        )

    def _post(self, handle: Callable[[], None]) -> None:
        """Hand work to the sender thread (from a gRPC callback thread)."""
        with self._cond:
            self._completions.append(handle)
            self._wake_locked()

    def _produced(self, address: str, batches: list[ProducerBatch], call: Any) -> None:
        try:
            response = call.result()
        except grpc.RpcError as exc:
            self._produce_failed(address, batches, transport_error(exc, address))
            return
        except Exception as exc:  # cancelled when the channel closed
            self._produce_failed(address, batches, KafkaConnectionError(f"{address}: {exc!r}"))
            return
        answers = {(p.topic, p.partition): p for p in response.partitions}
        for batch in batches:
            answer = answers.get((batch.tp.topic, batch.tp.partition))
            if answer is None:
                missing = KafkaConnectionError(f"{address}: no answer for {batch.tp}")
                self._handle_batch(batch, None, missing, -1)
            elif answer.error_code in (E.NONE, E.DUPLICATE_SEQUENCE_NUMBER):
                self._handle_batch(batch, int(answer.error_code), None, int(answer.base_offset))
            else:
                error = self._produce_error(int(answer.error_code), answer.error_message)
                self._handle_batch(batch, int(answer.error_code), error, -1)

    def _produce_failed(
        self, address: str, batches: list[ProducerBatch], error: KafkaError
    ) -> None:
        self._metadata.request_update()
        for batch in batches:
            self._handle_batch(batch, None, error, -1)

    def _handle_batch(
        self, batch: ProducerBatch, code: int | None, error: KafkaError | None, base_offset: int
    ) -> None:
        action = produce_action(code, self._transactional)
        with self._cond:
            if action is ProduceAction.COMPLETE:
                self._sequences.advance(
                    batch.tp, (batch.producer_id, batch.producer_epoch), len(batch.records)
                )
                self._accumulator.remove(batch)
            elif action not in _FINAL_FAILURES and self._may_retry_locked():
                if action is ProduceAction.RETRY_REFRESH:
                    self._metadata.request_update()
                if action is ProduceAction.RETRY_BUMP_EPOCH:
                    # Not written (the partition has no state of ours): send
                    # it again, renumbered under the new epoch.
                    batch.base_sequence = None
                    self._sequences.forget(batch.tp)
                    self._epoch_bump_needed = True
                batch.last_error = error
                backoff = Backoff(*self._backoff_s)
                delay = min(backoff.max_s, backoff.initial_s * 2 ** min(batch.attempts - 1, 30))
                self._accumulator.retry(batch, _now() + delay)
                log.debug("retrying %r after %s", batch, error)
                return
            else:
                self._accumulator.remove(batch)
        if action is ProduceAction.COMPLETE:
            batch.complete(base_offset)
            return
        if error is None:
            error = KafkaError("the batch was not acknowledged")
        if action not in _FINAL_FAILURES:
            # Retriable, but retrying is no longer allowed (aborting or closing).
            error = self._not_retried_error(error)
        self._batch_failed(batch, error, action)
        batch.fail(error)

    def _not_retried_error(self, error: KafkaError) -> KafkaError:
        return error


def _now() -> float:
    return time.monotonic()


class TransactionalProducer(Producer):
    """A transactional producer: atomic writes to many partitions, plus
    consumer offsets (``send_offsets_to_transaction``), with zombie fencing
    by ``transactional_id``.

    Lifecycle: ``init_transactions()`` once, then per transaction
    ``begin_transaction()``, ``send()``..., optionally
    ``send_offsets_to_transaction()``, and ``commit_transaction()`` or
    ``abort_transaction()``.

    Errors:
        * :class:`ProducerFencedError` (and every :class:`FatalError`): the
          producer is unusable; every later call raises it again. Close it.
        * :class:`TransactionAbortableError`: the transaction cannot commit;
          call ``abort_transaction()`` and start a new one.
        * :class:`KafkaTimeoutError` from ``init_transactions``,
          ``commit_transaction`` or ``abort_transaction``: the outcome is not
          known yet; call the same method again.

    Args:
        transactional_id: the id that survives restarts of the application;
            1 to ``raftcoord.protocol.limits.MAX_ID_BYTES`` bytes of UTF-8 (else ValueError).
        transaction_timeout_ms: the coordinator aborts a transaction open
            longer, and fences this producer: every later call raises
            :class:`ProducerFencedError` saying the transaction timed out.
            By default Kafka's 60000, or ``delivery_timeout_ms +
            request_timeout_ms`` when that is longer (150000 with the
            defaults), so that a batch that cannot be delivered expires, and
            the transaction can be aborted, before the coordinator times the
            transaction out. Given together with ``delivery_timeout_ms``, it
            must be longer than it (ValueError otherwise).
        **kwargs: as for :class:`Producer`.
    """

    _transactional = True

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        transactional_id: str,
        *,
        transaction_timeout_ms: int | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(transactional_id, str):
            raise TypeError(
                f"transactional_id must be a str, not {type(transactional_id).__name__}"
            )
        problem = id_error("transactional_id", transactional_id)
        if problem is not None:
            raise ValueError(problem)
        delivery_timeout_ms = kwargs.get("delivery_timeout_ms")
        if transaction_timeout_ms is not None and delivery_timeout_ms is not None:
            _check_int("transaction_timeout_ms", transaction_timeout_ms, 1)
            _check_int("delivery_timeout_ms", delivery_timeout_ms, 1)
            if transaction_timeout_ms <= delivery_timeout_ms:
                raise ValueError(
                    f"transaction_timeout_ms ({transaction_timeout_ms}) must be longer than "
                    f"delivery_timeout_ms ({delivery_timeout_ms}): a batch still retrying when "
                    "the coordinator aborts the timed-out transaction fences the producer"
                )
        elif transaction_timeout_ms is not None:
            _check_int("transaction_timeout_ms", transaction_timeout_ms, 1)
        self.transactional_id = transactional_id
        self._state = S.UNINITIALIZED
        self._txn_partitions: set[TopicPartition] = set()
        self._txn_groups: set[str] = set()
        # Whether the coordinator may know of the transaction (something was
        # added, or an add's outcome is unknown): then it must be ended by
        # EndTxn. Otherwise, as Kafka's client does, commit and abort end it
        # locally: an EndTxn would be judged against the previous transaction.
        self._txn_started = False
        self._txn_error: KafkaError | None = None
        #: When the coordinator may have opened the transaction (monotonic s).
        self._txn_opened_at: float | None = None
        super().__init__(bootstrap, **kwargs)
        if transaction_timeout_ms is None:
            needed = round((self._delivery_timeout_s + self._request_timeout_s) * 1000)
            transaction_timeout_ms = max(DEFAULT_TRANSACTION_TIMEOUT_MS, needed)
        self.transaction_timeout_ms = transaction_timeout_ms

    @property
    def state(self) -> str:
        """The producer's transaction state (for diagnostics)."""
        with self._cond:
            return self._state.value

    # --- transactions ------------------------------------------------------------------

    def init_transactions(self) -> None:
        """Register the transactional id with its coordinator: get the producer id
        and a new epoch, fencing every older producer with this id (an open
        transaction of theirs is aborted first).

        Raises:
            KafkaTimeoutError: not done within ``request_timeout_ms``; call again.
            ProducerFencedError, FatalError: the producer cannot be used.
            IllegalStateError: called twice.
        """
        with self._cond:
            self._raise_if_fatal()
            check_transition(self._state, S.INITIALIZING, "init_transactions")
            self._state = S.INITIALIZING
        request = coordinator_pb2.InitProducerIdRequest(
            transactional_id=self.transactional_id,
            transaction_timeout_ms=self.transaction_timeout_ms,
        )
        answer = self._coordinators.call(
            coordinator_pb2.TRANSACTION,
            self.transactional_id,
            "InitProducerId",
            request,
            Deadline(self._request_timeout_s, "init_transactions"),
        )
        if answer.error_code != E.NONE:
            raise self._fail_fatally(self._coordinator_error(answer))
        with self._cond:
            self._identity = (int(answer.producer_id), int(answer.producer_epoch))
            self._state = S.READY

    def begin_transaction(self) -> None:
        """Start a transaction (local only: the coordinator learns of it with the
        first partition or offsets added).

        Raises:
            IllegalStateError: not initialized, or a transaction is open.
            FatalError: the producer was fenced or failed fatally.
        """
        with self._cond:
            self._raise_if_fatal()
            check_transition(self._state, S.IN_TRANSACTION, "begin_transaction")
            self._reset_transaction_locked()
            self._state = S.IN_TRANSACTION

    def send_offsets_to_transaction(
        self, offsets: Mapping[TopicPartition, int], group_id: str
    ) -> None:
        """Commit consumer offsets as part of the transaction: they become the
        group's committed offsets if, and only if, the transaction commits.

        Args:
            offsets: partition -> next offset to consume (last processed + 1).
            group_id: the consumer group.

        Raises:
            TransactionAbortableError: the transaction must be aborted (also
                after a timeout: the offsets' fate is unknown).
            FatalError: the producer was fenced.
        """
        problem = id_error("group_id", group_id)
        if problem is not None:
            raise ValueError(problem)
        topics = offset_topics(offsets)
        with self._cond:
            self._check_in_transaction("send_offsets_to_transaction")
            assert self._identity is not None
            producer_id, epoch = self._identity
            new_group = group_id not in self._txn_groups
        if not topics:
            return
        try:
            if new_group:
                answer = self._add_to_transaction(
                    "AddOffsetsToTxn",
                    coordinator_pb2.AddOffsetsToTxnRequest(
                        transactional_id=self.transactional_id,
                        producer_id=producer_id,
                        producer_epoch=epoch,
                        group_id=group_id,
                    ),
                )
                if answer.error_code != E.NONE:
                    raise self._coordinator_error(answer)
                with self._cond:
                    self._txn_groups.add(group_id)
            answer = self._coordinators.call(
                coordinator_pb2.GROUP,
                group_id,
                "TxnOffsetCommit",
                coordinator_pb2.TxnOffsetCommitRequest(
                    transactional_id=self.transactional_id,
                    group_id=group_id,
                    producer_id=producer_id,
                    producer_epoch=epoch,
                    generation_id=-1,
                    member_id="",
                    topics=topics,
                ),
                Deadline(self._request_timeout_s, "TxnOffsetCommit"),
            )
            code, message = first_error(answer)
            if code != E.NONE:
                raise self._coordinator_error_code(code, message)
        except KafkaError as exc:
            raise self._transaction_failed(exc) from None

    def commit_transaction(self) -> None:
        """Flush every pending record, then commit the transaction.

        Raises:
            TransactionAbortableError: a send of this transaction failed (its
                error is the cause) or the coordinator refused; only
                ``abort_transaction`` is allowed now.
            KafkaTimeoutError: the commit's outcome is not known yet; call
                ``commit_transaction`` again.
            FatalError: the producer was fenced.
            IllegalStateError: no transaction is open.
        """
        with self._cond:
            self._raise_if_fatal()
            if self._state is S.ABORTABLE_ERROR:
                raise self._abortable("cannot commit")
            check_transition(self._state, S.COMMITTING, "commit_transaction")
            self._state = S.COMMITTING
        self.flush()
        with self._cond:
            self._raise_if_fatal()
            if self._txn_error is not None:
                self._state = S.ABORTABLE_ERROR
                raise self._abortable("cannot commit")
            if not self._txn_started:  # nothing reached the coordinator: nothing to end
                self._reset_transaction_locked()
                self._state = S.READY
                return
        self._end_transaction(commit=True)

    def abort_transaction(self) -> None:
        """Abort the transaction: pending records are dropped (their futures fail
        with :class:`TransactionAbortedError`) and nothing of the transaction
        becomes visible to read_committed consumers.

        Raises:
            KafkaTimeoutError: the abort's outcome is not known yet; call again.
            FatalError: the producer was fenced.
            IllegalStateError: no transaction is open.
        """
        with self._cond:
            self._raise_if_fatal()
            check_transition(self._state, S.ABORTING, "abort_transaction")
            self._state = S.ABORTING
            dropped = self._accumulator.take_undrained()
            self._wake_locked()
        aborted = TransactionAbortedError("the transaction was aborted before the batch was sent")
        for batch in dropped:
            batch.fail(aborted)
        with self._cond:
            # Batches in flight still get their answers (or fail: no retries now).
            while len(self._accumulator) or self._sender_busy:
                self._cond.wait(0.1)
            self._raise_if_fatal()
            if not self._txn_started:
                self._reset_transaction_locked()
                self._state = S.READY
                return
        self._end_transaction(commit=False)

    # --- internals -----------------------------------------------------------------

    def _end_transaction(self, commit: bool) -> None:
        with self._cond:
            assert self._identity is not None
            producer_id, epoch = self._identity
        what = "commit_transaction" if commit else "abort_transaction"
        answer = self._coordinators.call(
            coordinator_pb2.TRANSACTION,
            self.transactional_id,
            "EndTxn",
            coordinator_pb2.EndTxnRequest(
                transactional_id=self.transactional_id,
                producer_id=producer_id,
                producer_epoch=epoch,
                committed=commit,
            ),
            Deadline(self._request_timeout_s, what),
        )
        if answer.error_code != E.NONE:
            error = self._coordinator_error(answer)
            if commit and not isinstance(error, FatalError):
                raise self._transaction_failed(error)
            raise self._fail_fatally(error)
        with self._cond:
            # KIP-890: EndTxn bumped the epoch; the next transaction uses the new
            # id/epoch, and its sequences start at 0.
            self._identity = (int(answer.producer_id), int(answer.producer_epoch))
            self._reset_transaction_locked()
            self._state = S.READY

    def _reset_transaction_locked(self) -> None:
        self._txn_partitions.clear()
        self._txn_groups.clear()
        self._txn_started = False
        self._txn_opened_at = None
        self._txn_error = None

    def _raise_if_fatal(self) -> None:
        if self._fatal is not None:
            raise self._fatal.again() from self._fatal
        if self._state is S.CLOSED:
            raise IllegalStateError("the producer is closed")

    def _abortable(self, what: str) -> TransactionAbortableError:
        cause = self._txn_error
        error = TransactionAbortableError(
            f"{what}: the transaction must be aborted"
            + (f" ({type(cause).__name__}: {cause})" if cause is not None else "")
        )
        error.__cause__ = cause
        return error

    def _check_in_transaction(self, operation: str) -> None:
        self._raise_if_fatal()
        if self._state is S.ABORTABLE_ERROR:
            raise self._abortable(f"cannot {operation}")
        if self._state is not S.IN_TRANSACTION:
            raise IllegalStateError(
                f"cannot {operation} in state {self._state.value} (call begin_transaction first)"
            )

    def _check_can_send(self) -> None:
        super()._check_can_send()
        self._check_in_transaction("send")

    def _record_refused(self, error: KafkaError) -> None:
        # As Kafka's producer: the transaction can no longer commit. Nothing
        # reached the coordinator, so this alone needs no EndTxn.
        with self._cond:
            if self._state is S.IN_TRANSACTION:
                self._txn_error = error
                self._state = S.ABORTABLE_ERROR

    def _coordinator_error(self, answer: Any) -> KafkaError:
        return self._coordinator_error_code(int(answer.error_code), answer.error_message)

    def _coordinator_error_code(self, code: int, message: str) -> KafkaError:
        # As Kafka's transactional producer: an old epoch means another
        # producer with this transactional id took over, or the coordinator
        # aborted the transaction for running too long (and bumped the epoch).
        if code == E.INVALID_PRODUCER_EPOCH:
            error: KafkaError = ProducerFencedError(message or "INVALID_PRODUCER_EPOCH")
        else:
            error = error_for(code, message)
        opened_at = self._txn_opened_at
        if isinstance(error, ProducerFencedError) and opened_at is not None:
            open_ms = (_now() - opened_at) * 1000
            if open_ms >= self.transaction_timeout_ms:
                timed_out = ProducerFencedError(
                    f"the transaction timed out: it was open {open_ms / 1000:.1f} s, longer "
                    f"than transaction_timeout_ms={self.transaction_timeout_ms}, so the "
                    f"coordinator aborted it and fenced this producer ({error})"
                )
                timed_out.__cause__ = error
                return timed_out
        return error

    def _produce_error(self, code: int, message: str) -> KafkaError:
        # As Kafka's producer: a partition that refuses a batch because of the
        # transaction's state (older nodes' answer to a failed KIP-890
        # verification) only makes the transaction abortable.
        if code == E.INVALID_TXN_STATE:
            return TransactionAbortableError(message or "INVALID_TXN_STATE")
        return self._coordinator_error_code(code, message)

    def _produce_request(self, batches: list[ProducerBatch]) -> Any:
        request = super()._produce_request(batches)
        request.transactional_id = self.transactional_id
        return request

    def _fail_fatally(self, error: KafkaError) -> KafkaError:
        """Enter the fatal state with ``error`` (unless ``error`` is a timeout,
        which leaves the state for a retry); returns ``error`` to raise."""
        if isinstance(error, KafkaTimeoutError):
            return error
        with self._cond:
            if self._fatal is None:
                self._fatal = error
            self._state = S.FATAL_ERROR
            dropped = self._accumulator.take_undrained()
            self._wake_locked()
        for batch in dropped:
            batch.fail(error)
        return error

    def _transaction_failed(self, error: KafkaError) -> KafkaError:
        """A part of the transaction failed: fatal errors end the producer, any
        other error makes the transaction abortable. Returns the error to raise."""
        if isinstance(error, FatalError):
            return self._fail_fatally(error)
        with self._cond:
            if self._txn_error is None:
                self._txn_error = error
            if self._state in (S.IN_TRANSACTION, S.COMMITTING):
                self._state = S.ABORTABLE_ERROR
            dropped = self._accumulator.take_undrained()
            self._wake_locked()
        if dropped:
            abortable = self._abortable("batch not sent")
            for batch in dropped:
                batch.fail(abortable)
        if isinstance(error, TransactionAbortableError):
            return error
        abortable = TransactionAbortableError(f"the transaction must be aborted: {error}")
        abortable.__cause__ = error
        return abortable

    def _before_close(self, timeout_s: float | None) -> None:
        with self._cond:
            open_transaction = self._state in (S.IN_TRANSACTION, S.ABORTABLE_ERROR, S.ABORTING)
        if open_transaction:
            try:
                self.abort_transaction()
            except KafkaError as exc:
                log.warning("could not abort the open transaction on close: %s", exc)
        with self._cond:
            if self._state is not S.FATAL_ERROR:
                self._state = S.CLOSED
            # Nothing of an unfinished transaction will be sent any more.
            dropped = self._accumulator.take_undrained()
        closed = KafkaError("the producer was closed before the batch was sent")
        for batch in dropped:
            batch.fail(closed)

    # --- sender-thread hooks -------------------------------------------------------

    def _may_send_locked(self) -> bool:
        return self._identity is not None and self._state in (S.IN_TRANSACTION, S.COMMITTING)

    def _may_retry_locked(self) -> bool:
        return super()._may_retry_locked() and self._may_send_locked()

    def _not_retried_error(self, error: KafkaError) -> KafkaError:
        return TransactionAbortedError(f"not retried: the transaction is ending ({error})")

    def _may_send_partition_locked(self, tp: TopicPartition) -> bool:
        return tp in self._txn_partitions

    def _prepare_to_send(self) -> bool:
        """Once some batch is ready to go, add the partitions of every queued
        batch that are not yet in the transaction, all in one
        AddPartitionsToTxn call."""
        with self._cond:
            if not self._may_send_locked() or self._identity is None:
                return False
            new = sorted(self._accumulator.partitions() - self._txn_partitions)
            if not new:
                return True
            flush = self._flushing > 0 or self._closing
            if not self._accumulator.ready(_now(), flush):
                return True
            producer_id, epoch = self._identity
            self._sender_busy += 1
        try:
            error = self._add_partitions(new, producer_id, epoch)
        finally:
            with self._cond:
                self._sender_busy -= 1
                self._cond.notify_all()
        if error is not None:
            self._transaction_failed(error)
            return False
        with self._cond:
            self._txn_partitions.update(new)
        return True

    def _add_partitions(
        self, tps: list[TopicPartition], producer_id: int, epoch: int
    ) -> KafkaError | None:
        request = coordinator_pb2.AddPartitionsToTxnRequest(
            transactional_id=self.transactional_id,
            producer_id=producer_id,
            producer_epoch=epoch,
            topics=topic_partitions(tps),
        )
        try:
            answer = self._add_to_transaction("AddPartitionsToTxn", request)
        except KafkaError as exc:
            return exc
        code, message = first_error(answer)
        return None if code == E.NONE else self._coordinator_error_code(code, message)

    def _add_to_transaction(self, method: str, request: Any) -> Any:
        """AddPartitionsToTxn or AddOffsetsToTxn; notes that the transaction
        has started once the coordinator may have opened it (a success, or a
        timeout whose outcome is unknown)."""
        try:
            answer = self._coordinators.call(
                coordinator_pb2.TRANSACTION,
                self.transactional_id,
                method,
                request,
                Deadline(self._request_timeout_s, method),
            )
        except KafkaTimeoutError as exc:
            if exc.outcome_unknown:
                with self._cond:
                    self._mark_txn_started_locked()
            raise
        if answer.error_code == E.NONE:  # all or nothing on the coordinator
            with self._cond:
                self._mark_txn_started_locked()
        return answer

    def _mark_txn_started_locked(self) -> None:
        self._txn_started = True
        if self._txn_opened_at is None:
            self._txn_opened_at = _now()

    def _batch_failed(self, batch: ProducerBatch, error: KafkaError, action: ProduceAction) -> None:
        if isinstance(error, TransactionAbortedError):
            return  # the transaction is being aborted anyway
        self._transaction_failed(error)
