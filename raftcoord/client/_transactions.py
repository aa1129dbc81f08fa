"""The transactional producer's transaction manager (Kafka's TransactionManager).

It owns the client side of a transaction: the state (:mod:`._producer_txn_state`),
the producer id and epoch the coordinator hands out, the partitions and
groups added, and the coordinator calls (InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, TxnOffsetCommit, EndTxn). The :class:`~._sender.Sender`
asks it when batches may go and tells it when one failed; it shares the
sender's lock.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raftcoord.client._net import Deadline
from raftcoord.client._producer_txn_state import ProducerTxnState, check_transition
from raftcoord.client._sender import Sender, now
from raftcoord.client._wire import first_error, offset_topics, topic_partitions
from raftcoord.client.errors import (
    FatalError,
    IllegalStateError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    error_for,
)
from raftcoord.client.records import TopicPartition
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.v1 import coordinator_pb2

__all__ = ["DEFAULT_TRANSACTION_TIMEOUT_MS", "PreparedTxnState", "TransactionManager"]

log = logging.getLogger("raftcoord.client.producer")

#: Kafka's transaction.timeout.ms default (see TransactionalProducer for when
#: a longer one is used).
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000


@dataclass(frozen=True)
class PreparedTxnState:
    """What an external transaction manager stores when a producer prepared
    a transaction (KIP-939): the producer id and epoch of its records.
    ``str()`` gives the form to store, :meth:`parse` reads it back."""

    producer_id: int
    producer_epoch: int

    def __str__(self) -> str:
        return f"{self.producer_id}:{self.producer_epoch}"

    @classmethod
    def parse(cls, text: str) -> PreparedTxnState:
        """The state ``str()`` wrote.

        Raises:
            ValueError: ``text`` is not ``<producer id>:<epoch>``.
        """
        pid, sep, epoch = text.partition(":")
        if not sep or not pid.isdigit() or not epoch.isdigit():
            raise ValueError(f"not a prepared transaction state: {text!r}")
        return cls(int(pid), int(epoch))


class TransactionManager:
    """The transaction state machine of one transactional producer.

    ``timeout_ms`` None means the default: Kafka's 60000, or
    ``delivery_timeout + request_timeout`` of the sender when longer.
    ``two_phase`` is KIP-939's transaction.two.phase.commit.enable.
    """

    sender: Sender

    def __init__(self, transactional_id: str, timeout_ms: int | None, two_phase: bool) -> None:
        self.transactional_id = transactional_id
        self.two_phase = two_phase
        #: The prepared transaction's state (KIP-939), while one is.
        self.prepared: PreparedTxnState | None = None
        self._requested_timeout_ms = timeout_ms
        #: transaction.timeout.ms as sent to the coordinator (resolved by :meth:`attach`).
        self.timeout_ms = DEFAULT_TRANSACTION_TIMEOUT_MS if timeout_ms is None else timeout_ms
        self.state = ProducerTxnState.UNINITIALIZED
        self._partitions: set[TopicPartition] = set()
        self._groups: set[str] = set()
        # Whether the coordinator may know of the transaction (something was
        # added, or an add's outcome is unknown): then it must be ended by
        # EndTxn. Otherwise, as Kafka's client does, commit and abort end it
        # locally: an EndTxn would be judged against the previous transaction.
        self._started = False
        self._error: KafkaError | None = None
        #: When the coordinator may have opened the transaction (monotonic s).
        self._opened_at: float | None = None
        #: KIP-890 part 2, as InitProducerId tells: the partition-log nodes add
        #: a partition to the transaction with its first batch, so this
        #: manager does not call AddPartitionsToTxn.
        self._produce_adds_partitions = False
        #: Those partitions, the ones the latest flush added to the
        #: transaction: every Produce request names them all
        #: (``transaction_partitions``), so that the partition-log nodes of
        #: one flush ask the coordinator for the same add, one Raft entry.
        self.flush_partitions: tuple[TopicPartition, ...] = ()

    def attach(self, sender: Sender) -> None:
        """Work with ``sender`` (its lock guards this manager's state too)."""
        self.sender = sender
        if self._requested_timeout_ms is None:
            settings = sender.settings
            needed = round((settings.delivery_timeout_s + settings.request_timeout_s) * 1000)
            self.timeout_ms = max(DEFAULT_TRANSACTION_TIMEOUT_MS, needed)

    def _deadline(self, what: str) -> Deadline:
        return Deadline(self.sender.settings.request_timeout_s, what)

    def _call(self, method: str, request: Any, what: str) -> Any:
        return self.sender.coordinators.call(
            coordinator_pb2.TRANSACTION,
            self.transactional_id,
            method,
            request,
            self._deadline(what),
        )

    # --- the application's calls -------------------------------------------------------

    def init(self, keep_prepared_txn: bool) -> None:
        cond = self.sender.cond
        with cond:
            self._raise_if_fatal()
            check_transition(self.state, ProducerTxnState.INITIALIZING, "init_transactions")
            self.state = ProducerTxnState.INITIALIZING
        request = coordinator_pb2.InitProducerIdRequest(
            transactional_id=self.transactional_id,
            transaction_timeout_ms=self.timeout_ms,
            enable_two_phase_commit=self.two_phase,
            keep_prepared_txn=keep_prepared_txn,
        )
        answer = self._call("InitProducerId", request, "init_transactions")
        if answer.error_code != ErrorCode.NONE:
            raise self._fail_fatally(self._coordinator_error(answer))
        with cond:
            self.sender.identity = (int(answer.producer_id), int(answer.producer_epoch))
            self._produce_adds_partitions = bool(answer.produce_adds_partitions)
            self._reset_locked()
            if answer.HasField("ongoing_txn_producer_id") and answer.ongoing_txn_producer_id >= 0:
                # A transaction was kept open for this producer to end.
                self.prepared = PreparedTxnState(
                    int(answer.ongoing_txn_producer_id), int(answer.ongoing_txn_producer_epoch)
                )
                self._mark_started_locked()
                self.state = ProducerTxnState.PREPARED_TRANSACTION
            else:
                self.state = ProducerTxnState.READY

    def prepare(self) -> PreparedTxnState:
        """KIP-939's first phase: flush, then hold the transaction for the
        external transaction manager's decision."""
        cond = self.sender.cond
        with cond:
            self._raise_if_fatal()
            if not self.two_phase:
                raise IllegalStateError(
                    "cannot prepare_transaction: the producer was not created with "
                    "enable_two_phase_commit=True"
                )
            if self.state is ProducerTxnState.ABORTABLE_ERROR:
                raise self._abortable("cannot prepare")
            check_transition(
                self.state, ProducerTxnState.PREPARED_TRANSACTION, "prepare_transaction"
            )
        self.sender.flush(None)
        with cond:
            self._raise_if_fatal()
            if self._error is not None:
                self.state = ProducerTxnState.ABORTABLE_ERROR
                raise self._abortable("cannot prepare")
            assert self.sender.identity is not None
            self.prepared = PreparedTxnState(*self.sender.identity)
            self.state = ProducerTxnState.PREPARED_TRANSACTION
            return self.prepared

    def complete(self, state: PreparedTxnState) -> bool | None:
        """KIP-939's second phase: commit the prepared transaction if ``state``
        is its state, else abort it; None when no transaction is prepared."""
        with self.sender.cond:
            self._raise_if_fatal()
            prepared = self.prepared
            if prepared is None and self.state is ProducerTxnState.READY:
                return None
            if prepared is None:
                raise IllegalStateError(
                    f"cannot complete_transaction in state {self.state.value} "
                    "(no transaction is prepared)"
                )
        commit = state == prepared
        if commit:
            self.commit()
        else:
            self.abort()
        return commit

    def begin(self) -> None:
        with self.sender.cond:
            self._raise_if_fatal()
            check_transition(self.state, ProducerTxnState.IN_TRANSACTION, "begin_transaction")
            self._reset_locked()
            self.state = ProducerTxnState.IN_TRANSACTION

    def send_offsets(self, offsets: Mapping[TopicPartition, int], group_id: str) -> None:
        topics = offset_topics(offsets)
        with self.sender.cond:
            self.check_in_transaction_locked("send_offsets_to_transaction")
            assert self.sender.identity is not None
            producer_id, epoch = self.sender.identity
            new_group = group_id not in self._groups
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
                if answer.error_code != ErrorCode.NONE:
                    raise self._coordinator_error(answer)
                with self.sender.cond:
                    self._groups.add(group_id)
            answer = self.sender.coordinators.call(
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
                self._deadline("TxnOffsetCommit"),
            )
            code, message = first_error(answer)
            if code != ErrorCode.NONE:
                raise self._coordinator_error_code(code, message)
        except KafkaError as exc:
            raise self._transaction_failed(exc) from None

    def commit(self) -> None:
        cond = self.sender.cond
        with cond:
            self._raise_if_fatal()
            if self.state is ProducerTxnState.ABORTABLE_ERROR:
                raise self._abortable("cannot commit")
            check_transition(self.state, ProducerTxnState.COMMITTING, "commit_transaction")
            self.state = ProducerTxnState.COMMITTING
        self.sender.flush(None)
        with cond:
            self._raise_if_fatal()
            if self._error is not None:
                self.state = ProducerTxnState.ABORTABLE_ERROR
                raise self._abortable("cannot commit")
            if not self._started:  # nothing reached the coordinator: nothing to end
                self._reset_locked()
                self.state = ProducerTxnState.READY
                return
        self._end(commit=True)

    def abort(self) -> None:
        sender = self.sender
        with sender.cond:
            self._raise_if_fatal()
            check_transition(self.state, ProducerTxnState.ABORTING, "abort_transaction")
            self.state = ProducerTxnState.ABORTING
        sender.drop_undrained(
            TransactionAbortedError("the transaction was aborted before the batch was sent")
        )
        with sender.cond:
            # Batches in flight still get their answers (or fail: no retries now).
            while len(sender.accumulator) or sender.busy:
                sender.cond.wait(0.1)
            self._raise_if_fatal()
            if not self._started:
                self._reset_locked()
                self.state = ProducerTxnState.READY
                return
        self._end(commit=False)

    def close(self) -> None:
        """Abort an open transaction, then refuse everything (before the sender closes)."""
        with self.sender.cond:
            open_transaction = self.state in (
                ProducerTxnState.IN_TRANSACTION,
                ProducerTxnState.ABORTABLE_ERROR,
                ProducerTxnState.ABORTING,
            )
        # A prepared transaction is left to the external transaction manager
        # (KIP-939): a new producer ends it after init_transactions(keep_prepared_txn=True).
        if open_transaction:
            try:
                self.abort()
            except KafkaError as exc:
                log.warning("could not abort the open transaction on close: %s", exc)
        with self.sender.cond:
            if self.state is not ProducerTxnState.FATAL_ERROR:
                self.state = ProducerTxnState.CLOSED
        # Nothing of an unfinished transaction will be sent any more.
        self.sender.drop_undrained(KafkaError("the producer was closed before the batch was sent"))

    def record_refused(self, error: KafkaError) -> None:
        """``send`` refused a record without queueing it. As Kafka's producer:
        the transaction can no longer commit. Nothing reached the
        coordinator, so this alone needs no EndTxn."""
        with self.sender.cond:
            if self.state is ProducerTxnState.IN_TRANSACTION:
                self._error = error
                self.state = ProducerTxnState.ABORTABLE_ERROR

    def check_in_transaction_locked(self, operation: str) -> None:
        self._raise_if_fatal()
        if self.state is ProducerTxnState.ABORTABLE_ERROR:
            raise self._abortable(f"cannot {operation}")
        if self.state is not ProducerTxnState.IN_TRANSACTION:
            raise IllegalStateError(
                f"cannot {operation} in state {self.state.value} (call begin_transaction first)"
            )

    # --- the sender's questions and news ---------------------------------------------

    def may_send_locked(self) -> bool:
        return self.state in (ProducerTxnState.IN_TRANSACTION, ProducerTxnState.COMMITTING)

    def has_partition(self, tp: TopicPartition) -> bool:
        """Whether ``tp`` was added to the transaction (lock held)."""
        return tp in self._partitions

    def add_queued_partitions(self) -> bool:
        """Once some batch is ready to go, add the partitions of every queued
        batch that are not yet in the transaction, all in one
        AddPartitionsToTxn call (sender thread, lock not held). Returns
        whether batches may be sent.

        When the partition-log nodes add partitions themselves (KIP-890
        part 2), no call is made: the partitions count as added, and the
        transaction as started, from the moment their batches may go (a
        Produce may open it on the coordinator).
        """
        sender = self.sender
        with sender.cond:
            if not self.may_send_locked() or sender.identity is None:
                return False
            new = sorted(sender.accumulator.partitions() - self._partitions)
            if not new:
                return True
            flush = sender.flushing > 0 or sender.closing
            if not sender.accumulator.ready(now(), flush):
                return True
            if self._produce_adds_partitions:
                self._partitions.update(new)
                self.flush_partitions = tuple(new)
                self._mark_started_locked()
                return True
            producer_id, epoch = sender.identity
            sender.busy += 1
        try:
            error = self._add_partitions(new, producer_id, epoch)
        finally:
            with sender.cond:
                sender.busy -= 1
                sender.cond.notify_all()
        if error is not None:
            self._transaction_failed(error)
            return False
        with sender.cond:
            self._partitions.update(new)
        return True

    def produce_error(self, code: int, message: str) -> KafkaError:
        """The error of a Produce answer. As Kafka's producer: a partition that
        refuses a batch because of the transaction's state (older nodes'
        answer to a failed KIP-890 verification) only makes the transaction
        abortable."""
        if code == ErrorCode.INVALID_TXN_STATE:
            return TransactionAbortableError(message or "INVALID_TXN_STATE")
        return self._coordinator_error_code(code, message)

    @staticmethod
    def not_retried_error(error: KafkaError) -> KafkaError:
        """A retriable batch failure that is not retried: the transaction is ending."""
        return TransactionAbortedError(f"not retried: the transaction is ending ({error})")

    def batch_failed(self, error: KafkaError) -> None:
        """A batch failed for good (sender thread, lock not held)."""
        if isinstance(error, TransactionAbortedError):
            return  # the transaction is being aborted anyway
        self._transaction_failed(error)

    # --- internals -----------------------------------------------------------------

    def _end(self, commit: bool) -> None:
        with self.sender.cond:
            assert self.sender.identity is not None
            producer_id, epoch = self.sender.identity
        request = coordinator_pb2.EndTxnRequest(
            transactional_id=self.transactional_id,
            producer_id=producer_id,
            producer_epoch=epoch,
            committed=commit,
        )
        answer = self._call(
            "EndTxn", request, "commit_transaction" if commit else "abort_transaction"
        )
        if answer.error_code != ErrorCode.NONE:
            error = self._coordinator_error(answer)
            if commit and not isinstance(error, FatalError):
                raise self._transaction_failed(error)
            raise self._fail_fatally(error)
        with self.sender.cond:
            # KIP-890: EndTxn bumped the epoch; the next transaction uses the new
            # id/epoch, and its sequences start at 0.
            self.sender.identity = (int(answer.producer_id), int(answer.producer_epoch))
            self._reset_locked()
            self.state = ProducerTxnState.READY

    def _reset_locked(self) -> None:
        self.prepared = None
        self._partitions.clear()
        self.flush_partitions = ()
        self._groups.clear()
        self._started = False
        self._opened_at = None
        self._error = None

    def _raise_if_fatal(self) -> None:
        fatal = self.sender.fatal
        if fatal is not None:
            raise fatal.again() from fatal
        if self.state is ProducerTxnState.CLOSED:
            raise IllegalStateError("the producer is closed")

    def _abortable(self, what: str) -> TransactionAbortableError:
        cause = self._error
        error = TransactionAbortableError(
            f"{what}: the transaction must be aborted"
            + (f" ({type(cause).__name__}: {cause})" if cause is not None else "")
        )
        error.__cause__ = cause
        return error

    def _coordinator_error(self, answer: Any) -> KafkaError:
        return self._coordinator_error_code(int(answer.error_code), answer.error_message)

    def _coordinator_error_code(self, code: int, message: str) -> KafkaError:
        # As Kafka's transactional producer: an old epoch means another
        # producer with this transactional id took over, or the coordinator
        # aborted the transaction for running too long (and bumped the epoch).
        if code == ErrorCode.INVALID_PRODUCER_EPOCH:
            error: KafkaError = ProducerFencedError(message or "INVALID_PRODUCER_EPOCH")
        else:
            error = error_for(code, message)
        opened_at = self._opened_at
        if isinstance(error, ProducerFencedError) and opened_at is not None:
            open_ms = (now() - opened_at) * 1000
            if open_ms >= self.timeout_ms:
                timed_out = ProducerFencedError(
                    f"the transaction timed out: it was open {open_ms / 1000:.1f} s, longer "
                    f"than transaction_timeout_ms={self.timeout_ms}, so the "
                    f"coordinator aborted it and fenced this producer ({error})"
                )
                timed_out.__cause__ = error
                return timed_out
        return error

    def _fail_fatally(self, error: KafkaError) -> KafkaError:
        """Enter the fatal state with ``error`` (unless ``error`` is a timeout,
        which leaves the state for a retry); returns ``error`` to raise."""
        if isinstance(error, KafkaTimeoutError):
            return error
        with self.sender.cond:
            if self.sender.fatal is None:
                self.sender.fatal = error
            self.state = ProducerTxnState.FATAL_ERROR
        self.sender.drop_undrained(error)
        return error

    def _transaction_failed(self, error: KafkaError) -> KafkaError:
        """A part of the transaction failed: fatal errors end the producer, any
        other error makes the transaction abortable. Returns the error to raise."""
        if isinstance(error, FatalError):
            return self._fail_fatally(error)
        with self.sender.cond:
            if self._error is None:
                self._error = error
            if self.state in (ProducerTxnState.IN_TRANSACTION, ProducerTxnState.COMMITTING):
                self.state = ProducerTxnState.ABORTABLE_ERROR
            dropped = self.sender.accumulator.take_undrained()
            self.sender.wake_locked()
        if dropped:
            abortable = self._abortable("batch not sent")
            for batch in dropped:
                batch.fail(abortable)
        if isinstance(error, TransactionAbortableError):
            return error
        abortable = TransactionAbortableError(f"the transaction must be aborted: {error}")
        abortable.__cause__ = error
        return abortable

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
        return None if code == ErrorCode.NONE else self._coordinator_error_code(code, message)

    def _add_to_transaction(self, method: str, request: Any) -> Any:
        """AddPartitionsToTxn or AddOffsetsToTxn; notes that the transaction
        has started once the coordinator may have opened it (a success, or a
        timeout whose outcome is unknown)."""
        try:
            answer = self._call(method, request, method)
        except KafkaTimeoutError as exc:
            if exc.outcome_unknown:
                with self.sender.cond:
                    self._mark_started_locked()
            raise
        if answer.error_code == ErrorCode.NONE:  # all or nothing on the coordinator
            with self.sender.cond:
                self._mark_started_locked()
        return answer

    def _mark_started_locked(self) -> None:
        self._started = True
        if self._opened_at is None:
            self._opened_at = now()
