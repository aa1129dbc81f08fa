"""The producers' sender: batches, sequence numbers, retries and the Produce wire path.

Records are appended to per-partition batches; a background thread sends
batches when they are full, after ``linger_ms``, or on ``flush``: one
Produce request per partition-log node, one batch per partition, at most
one batch in flight per partition. Retriable failures (transport,
NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, UNKNOWN_TOPIC_OR_PARTITION after a
metadata refresh) resend the batch with the same sequence numbers until
``delivery_timeout_s`` after the batch was created; the partition
deduplicates a retried batch.

Without a transaction manager (:class:`Transactions`, which
:class:`~raftcoord.client._transactions.TransactionManager` is) the
sender is an idempotent producer's: it gets its producer id with
InitProducerId and bumps the epoch itself when a partition's sequence is
lost (KIP-360). With one, the manager owns the producer id and decides when
batches may go (a transaction is open, its partitions were added) and what
a failed batch means for the transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

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
    JITTER,
    CallThreads,
    CoordinatorClient,
    Deadline,
    MetadataCache,
    concurrent_backoff,
    transport_error,
)
from raftcoord.client._wire import produce_request
from raftcoord.client.errors import (
    IllegalStateError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    error_for,
)
from raftcoord.client.records import TopicPartition
from raftcoord.protocol.backoff import Backoff
from raftcoord.protocol.channels import ChannelCache
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.limits import KAFKA_MAX_PRODUCER_EPOCH
from raftcoord.protocol.v1 import coordinator_pb2

__all__ = ["Sender", "SenderSettings", "Transactions", "now"]

log = logging.getLogger("raftcoord.client.producer")


class Transactions(Protocol):
    """What the sender asks of a transactional producer's transaction manager
    (methods ending in ``_locked`` run under the producer's lock)."""

    transactional_id: str
    #: The partitions added to the transaction since the last flush.
    flush_partitions: tuple[TopicPartition, ...]

    def check_in_transaction_locked(self, operation: str) -> None: ...

    def may_send_locked(self) -> bool: ...

    def has_partition(self, tp: TopicPartition) -> bool: ...

    def add_queued_partitions(self) -> bool: ...

    def produce_error(self, code: int, message: str) -> KafkaError: ...

    def not_retried_error(self, error: KafkaError) -> KafkaError: ...

    def batch_failed(self, error: KafkaError) -> None: ...


FINAL_FAILURES = frozenset({ProduceAction.FAIL, ProduceAction.FAIL_BUMP_EPOCH, ProduceAction.FATAL})
#: Longest the sender thread sleeps when nothing is due (it is woken on news).
_IDLE_WAIT_S = 0.5
#: Threads a producer makes its Produce calls on (one per node it writes to,
#: typically); more calls at once than that go out as futures.
PRODUCE_CALL_THREADS = 8


def now() -> float:
    """The producers' clock (monotonic seconds)."""
    return time.monotonic()


@dataclass(frozen=True)
class SenderSettings:
    """The sender's share of a producer's settings, in seconds and bytes."""

    request_timeout_s: float
    delivery_timeout_s: float
    max_request_size: int
    batch_size: int
    linger_s: float
    backoff_s: tuple[float, float]


class Sender:
    """Owns the batches and the sender thread of one producer.

    ``cond`` (an RLock condition) guards everything the sender thread
    shares with the application thread and with the transaction manager.
    """

    def __init__(
        self,
        settings: SenderSettings,
        channels: ChannelCache,
        coordinators: CoordinatorClient,
        metadata: MetadataCache,
        transactions: Transactions | None,
    ) -> None:
        self.settings = settings
        self.channels = channels
        self.coordinators = coordinators
        self.metadata = metadata
        self.transactions = transactions

        self.cond = threading.Condition()
        self.accumulator = RecordAccumulator(
            min(settings.batch_size, settings.max_request_size - BATCH_HEADER_SIZE),
            settings.linger_s,
        )
        self._sequences = SequenceNumbers()
        #: The producer id and epoch batches are numbered under; None before one is known.
        self.identity: tuple[int, int] | None = None
        #: A partition's sequence was lost: bump the epoch before numbering again.
        self._epoch_bump_needed = False
        self._identity_retry_at = 0.0
        self._identity_backoff = Backoff(*settings.backoff_s, jitter=JITTER)
        self._completions: list[Callable[[], None]] = []
        self.flushing = 0
        self._wakeup = False
        self.closing = False
        self._force_close = False
        self.closed = False
        #: Coordinator calls the sender thread has under way (waited for by an abort).
        self.busy = 0
        self.fatal: KafkaError | None = None

        self._thread = threading.Thread(
            target=self._run, name=f"raftcoord-producer-sender-{id(self):x}", daemon=True
        )
        #: Where Produce calls are made (several nodes' at once).
        self._calls = CallThreads(PRODUCE_CALL_THREADS, f"raftcoord-producer-io-{id(self):x}")

    def start(self) -> None:
        self._thread.start()

    # --- the application thread ------------------------------------------------------

    def check_can_send_locked(self) -> None:
        """Raise unless a record may be queued now (lock held)."""
        if self.closing or self.closed:
            raise IllegalStateError("cannot send: the producer is closed")
        if self.fatal is not None:
            raise self.fatal.again() from self.fatal
        if self.transactions is not None:
            self.transactions.check_in_transaction_locked("send")

    def append(self, tp: TopicPartition, record: PendingRecord) -> None:
        """Queue ``record`` for ``tp`` (its future already running)."""
        with self.cond:
            self.check_can_send_locked()
            if self.accumulator.append(tp, record, now()):
                self.wake_locked()

    def flush(self, timeout_s: float | None) -> None:
        """Send every queued batch and wait until each is acknowledged or failed.

        Raises:
            KafkaTimeoutError: ``timeout_s`` passed first.
        """
        with self.cond:
            batches = self.accumulator.incomplete()
            self.flushing += 1
            self.wake_locked()
        try:
            deadline = None if timeout_s is None else Deadline(timeout_s, "flush")
            for batch in batches:
                left = None if deadline is None else deadline.remaining()
                if not batch.done.wait(left):
                    raise KafkaTimeoutError(f"flush did not complete in {timeout_s} s")
        finally:
            with self.cond:
                self.flushing -= 1

    def close(self, timeout_s: float | None) -> None:
        """Send what is queued (waiting at most ``timeout_s``), stop the sender
        thread, fail what is left and close the connections."""
        with self.cond:
            self.closing = True
            self.wake_locked()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            with self.cond:
                self._force_close = True
                self.wake_locked()
            self._thread.join(self.settings.request_timeout_s)
        with self.cond:
            leftovers = self.accumulator.incomplete()
            for batch in leftovers:
                self.accumulator.remove(batch)
            self.closed = True
        for batch in leftovers:
            batch.fail(KafkaError("the producer was closed before the batch was acknowledged"))
        self._calls.close()
        self.channels.close()

    def drop_undrained(self, error: KafkaError) -> None:
        """Fail every batch not sent yet with ``error`` (lock not held)."""
        with self.cond:
            dropped = self.accumulator.take_undrained()
            self.wake_locked()
        for batch in dropped:
            batch.fail(error)

    def wake_locked(self) -> None:
        self._wakeup = True
        self.cond.notify_all()

    # --- the sender thread -----------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._sender_iteration():
                pass
        except BaseException as exc:  # a bug: fail every future rather than hang them
            log.exception("producer sender thread failed")
            error = KafkaError(f"the producer's sender thread failed: {exc!r}")
            with self.cond:
                self.fatal = self.fatal or error
                batches = self.accumulator.incomplete()
                for batch in batches:
                    self.accumulator.remove(batch)
                self.cond.notify_all()
            for batch in batches:
                batch.fail(error)

    def _sender_iteration(self) -> bool:
        with self.cond:
            completions, self._completions = self._completions, []
        for handle in completions:
            handle()
        self._expire_batches()
        with self.cond:
            if self.closing and (not len(self.accumulator) or self._force_close):
                return False
        timeout_s = self.settings.request_timeout_s
        self.metadata.maybe_refresh(Deadline(min(timeout_s, 5.0), "metadata"))
        progressed = bool(completions)
        if self._prepare_to_send():
            progressed = self._send_ready() > 0 or progressed
        with self.cond:
            if self._wakeup or self._completions:
                self._wakeup = False
                return True
            current = now()
            wait = _IDLE_WAIT_S
            next_ready = self.accumulator.next_ready_s(current)
            if next_ready is not None:
                delay = next_ready - current
                if delay <= 0 and not progressed:
                    # Due but unable to go (node or producer id unknown so far):
                    # look again soon rather than spin.
                    delay = self.metadata.min_refresh_s
                wait = min(wait, max(0.0, delay))
            if (self.flushing or self.closing) and len(self.accumulator):
                wait = min(wait, self.metadata.min_refresh_s)
            if self._identity_retry_at > current:
                wait = min(wait, self._identity_retry_at - current)
            if wait > 0:
                self.cond.wait(wait)
            self._wakeup = False
        return True

    def _may_send_locked(self) -> bool:
        """Whether batches may be sent now (lock held)."""
        if self.transactions is not None:
            return self.identity is not None and self.transactions.may_send_locked()
        return self.identity is not None and not self._epoch_bump_needed

    def _may_retry_locked(self) -> bool:
        """Whether a retriably failed batch may be sent again (lock held)."""
        if self._force_close:
            return False
        return self.transactions is None or self._may_send_locked()

    def _prepare_to_send(self) -> bool:
        """Lock not held: get what sending needs (a producer id; in a
        transaction, its partitions added). Returns whether batches may go."""
        if self.transactions is not None:
            return self.transactions.add_queued_partitions()
        with self.cond:
            if self._epoch_bump_needed:
                self._bump_epoch_locked()
            if self.identity is not None:
                return True
            if not len(self.accumulator) or now() < self._identity_retry_at:
                return False
            self.busy += 1
        try:
            identity = self._init_idempotent_producer_id()
        except KafkaError as exc:
            log.warning("no producer id yet: %s", exc)
            with self.cond:
                self._identity_retry_at = now() + self._identity_backoff.next_delay()
            return False
        finally:
            with self.cond:
                self.busy -= 1
                self.cond.notify_all()
        with self.cond:
            self.identity = identity
            self._identity_backoff.reset()
        return True

    def _bump_epoch_locked(self) -> None:
        """As Kafka's idempotent producer (KIP-360): bump the epoch locally, or
        take a new producer id once the epoch is exhausted. Batches numbered
        under the old epoch keep their numbers for their retries; each
        partition moves to the new epoch once those are settled (see
        ``_send_ready``)."""
        self._epoch_bump_needed = False
        if self.identity is None:
            return
        producer_id, epoch = self.identity
        self.identity = (producer_id, epoch + 1) if epoch < KAFKA_MAX_PRODUCER_EPOCH else None
        log.info("producer %d: epoch bumped, now %s", producer_id, self.identity)

    def _init_idempotent_producer_id(self) -> tuple[int, int]:
        deadline = Deadline(self.settings.request_timeout_s, "InitProducerId")
        backoff = self.coordinators.backoff()
        while True:
            answer = self.coordinators.call_any(
                "InitProducerId", coordinator_pb2.InitProducerIdRequest(), deadline
            )
            if answer.error_code == ErrorCode.NONE:
                return int(answer.producer_id), int(answer.producer_epoch)
            error = error_for(answer.error_code, answer.error_message)
            if not error.retriable:
                raise error
            deadline.back_off(backoff, error)

    def _expire_batches(self) -> None:
        delivery_timeout_s = self.settings.delivery_timeout_s
        with self.cond:
            expired = self.accumulator.expired(now(), delivery_timeout_s)
        for batch in expired:
            detail = f"; last error: {batch.last_error}" if batch.last_error else ""
            error = KafkaTimeoutError(
                f"expiring {len(batch.records)} record(s) for {batch.tp.topic}-"
                f"{batch.tp.partition}: {delivery_timeout_s:.3g} s have passed since "
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
        with self.cond:
            if not self._may_send_locked() or self.identity is None:
                return 0
            flush = self.flushing > 0 or self.closing
            by_node: dict[str, list[TopicPartition]] = {}
            for tp in self.accumulator.ready(now(), flush):
                if self.transactions is not None and not self.transactions.has_partition(tp):
                    continue
                address = self.metadata.leader(tp)
                if address is None:
                    continue
                by_node.setdefault(address, []).append(tp)
            identity = self.identity
            for address, tps in by_node.items():
                batches = self.accumulator.drain(tps)
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

    def _split(self, batches: list[ProducerBatch]) -> list[list[ProducerBatch]]:
        """``batches`` in requests of at most ``max_request_size`` batch bytes
        (a request takes at least one batch; no batch is larger)."""
        requests: list[list[ProducerBatch]] = []
        size = 0
        for batch in batches:
            batch_bytes = BATCH_HEADER_SIZE + batch.size_bytes
            if not requests or size + batch_bytes > self.settings.max_request_size:
                requests.append([])
                size = 0
            requests[-1].append(batch)
            size += batch_bytes
        return requests

    # --- the Produce wire path -------------------------------------------------------

    def _send_produce(self, address: str, batches: list[ProducerBatch]) -> None:
        transactions = self.transactions
        epoch = self.metadata.leader_epoch
        request = (
            produce_request(batches, None, leader_epoch=epoch)
            if transactions is None
            else produce_request(
                batches, transactions.transactional_id, transactions.flush_partitions, epoch
            )
        )
        try:
            call = self._calls.start(
                self.channels.partition_log(address).Produce,
                request,
                self.settings.request_timeout_s,
            )
        except (KafkaConnectionError, ValueError, RuntimeError) as exc:
            # The channel is closed (the producer is closing): fail like transport.
            error = KafkaConnectionError(f"{address}: {exc}")
            self._post(lambda: self._produce_failed(batches, error))
            return
        call.add_done_callback(
            lambda done: self._post(lambda: self._produced(address, batches, done))
        )

    def _post(self, handle: Callable[[], None]) -> None:
        """Hand work to the sender thread (from a gRPC callback thread)."""
        with self.cond:
            self._completions.append(handle)
            self.wake_locked()

    def _produced(self, address: str, batches: list[ProducerBatch], call: Any) -> None:
        try:
            response = call.result()
        except grpc.RpcError as exc:
            self._produce_failed(batches, transport_error(exc, address))
            return
        except Exception as exc:  # cancelled when the channel closed
            self._produce_failed(batches, KafkaConnectionError(f"{address}: {exc!r}"))
            return
        answers = {(p.topic, p.partition): p for p in response.partitions}
        for batch in batches:
            answer = answers.get((batch.tp.topic, batch.tp.partition))
            if answer is None:
                missing = KafkaConnectionError(f"{address}: no answer for {batch.tp}")
                self._handle_batch(batch, None, missing, -1)
            elif answer.error_code in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
                self._handle_batch(batch, int(answer.error_code), None, int(answer.base_offset))
            else:
                error = self._produce_error(int(answer.error_code), answer.error_message)
                self._handle_batch(batch, int(answer.error_code), error, -1)

    def _produce_error(self, code: int, message: str) -> KafkaError:
        if self.transactions is not None:
            return self.transactions.produce_error(code, message)
        return error_for(code, message)

    def _produce_failed(self, batches: list[ProducerBatch], error: KafkaError) -> None:
        self.metadata.request_update()
        for batch in batches:
            self._handle_batch(batch, None, error, -1)

    def _handle_batch(
        self, batch: ProducerBatch, code: int | None, error: KafkaError | None, base_offset: int
    ) -> None:
        action = produce_action(code, self.transactions is not None)
        with self.cond:
            if action is ProduceAction.COMPLETE:
                self._sequences.advance(
                    batch.tp, (batch.producer_id, batch.producer_epoch), len(batch.records)
                )
                self.accumulator.remove(batch)
            elif action not in FINAL_FAILURES and self._may_retry_locked():
                if action is ProduceAction.RETRY_REFRESH:
                    self.metadata.request_update()
                if action is ProduceAction.RETRY_BUMP_EPOCH:
                    # Not written (the partition has no state of ours): send
                    # it again, renumbered under the new epoch.
                    batch.base_sequence = None
                    self._sequences.forget(batch.tp)
                    self._epoch_bump_needed = True
                batch.last_error = error
                delay = self._retry_delay(code, batch.attempts)
                self.accumulator.retry(batch, now() + delay)
                log.debug("retrying %r after %s", batch, error)
                return
            else:
                self.accumulator.remove(batch)
        if action is ProduceAction.COMPLETE:
            batch.complete(base_offset)
            return
        if error is None:
            error = KafkaError("the batch was not acknowledged")
        if action not in FINAL_FAILURES and self.transactions is not None:
            # Retriable, but retrying is no longer allowed: the transaction is ending.
            error = self.transactions.not_retried_error(error)
        self._batch_failed(batch, error, action)
        batch.fail(error)

    def _retry_delay(self, code: int | None, attempts: int) -> float:
        """How long a batch waits before it is sent again. CONCURRENT_TRANSACTIONS
        (the partition asked the coordinator to add it to a transaction while
        the previous one is completing) clears in milliseconds: the short
        backoff the coordinator calls use for it."""
        if code == ErrorCode.CONCURRENT_TRANSACTIONS:
            return concurrent_backoff(*self.settings.backoff_s).nominal(attempts)
        return Backoff(*self.settings.backoff_s).nominal(attempts)

    def _batch_failed(self, batch: ProducerBatch, error: KafkaError, action: ProduceAction) -> None:
        """A batch failed for good (sender thread, lock not held)."""
        if self.transactions is not None:
            self.transactions.batch_failed(error)
            return
        outcome_unknown = batch.sent and (
            isinstance(error, KafkaTimeoutError) or action not in FINAL_FAILURES
        )
        if action is ProduceAction.FAIL_BUMP_EPOCH or outcome_unknown:
            # The partition refused our numbering, or the batch may have been
            # written: its sequence there is unknown. It restarts from 0
            # under a new epoch; other partitions keep theirs until then.
            with self.cond:
                self._sequences.forget(batch.tp)
                self._epoch_bump_needed = True
