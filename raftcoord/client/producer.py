"""Producers: the idempotent :class:`Producer` and the :class:`TransactionalProducer`.

Both validate their settings and records here and compose a
:class:`~raftcoord.client._sender.Sender` (batches, sequences, retries, the
Produce wire path); the transactional one adds a
:class:`~raftcoord.client._transactions.TransactionManager` (the client's
transaction state machine and its coordinator calls).

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

import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any

from raftcoord.client._accumulator import BATCH_HEADER_SIZE, PendingRecord
from raftcoord.client._net import CoordinatorClient, Deadline, MetadataCache, client_channels
from raftcoord.client._sender import Sender, SenderSettings
from raftcoord.client._transactions import PreparedTxnState, TransactionManager
from raftcoord.client.errors import RecordTooLargeError
from raftcoord.client.partitioner import DefaultPartitioner
from raftcoord.client.records import Headers, RecordMetadata, TopicPartition
from raftcoord.protocol.channels import ChannelCache
from raftcoord.protocol.limits import id_error

__all__ = ["Producer", "TransactionalProducer"]

#: Kafka's delivery.timeout.ms default.
DEFAULT_DELIVERY_TIMEOUT_MS = 120_000
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
        ssl_cafile, ssl_certfile, ssl_keyfile: a cluster with TLS (its
            config's ``[tls]``): the cluster CA's certificate, and this
            client's certificate and key (PEM files; the principal is the
            certificate's ``User:<CN>``). Without them the client speaks
            plaintext.
    """

    #: Set by TransactionalProducer before this constructor runs.
    _transactions: TransactionManager | None = None

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
        channels: ChannelCache | None = None,
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
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
        settings = SenderSettings(
            request_timeout_s=request_timeout_ms / 1000,
            delivery_timeout_s=delivery_timeout_ms / 1000,
            max_request_size=max_request_size,
            batch_size=batch_size,
            linger_s=linger_ms / 1000,
            backoff_s=(retry_backoff_ms / 1000, max(retry_backoff_ms, retry_backoff_max_ms) / 1000),
        )
        self._max_block_s = max_block_ms / 1000
        channels = channels or client_channels(ssl_cafile, ssl_certfile, ssl_keyfile)
        coordinators = CoordinatorClient(bootstrap, channels, *settings.backoff_s)
        self._metadata = MetadataCache(coordinators)
        self._partitioner = partitioner or DefaultPartitioner(batch_size)
        self._sender = Sender(settings, channels, coordinators, self._metadata, self._transactions)
        if self._transactions is not None:
            self._transactions.attach(self._sender)
        self._sender.start()

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
        with self._sender.cond:
            identity = self._sender.identity
            return -1 if identity is None else identity[0]

    @property
    def producer_epoch(self) -> int:
        """The current producer epoch; -1 before a producer id was obtained."""
        with self._sender.cond:
            identity = self._sender.identity
            return -1 if identity is None else identity[1]

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
        with self._sender.cond:
            self._sender.check_can_send_locked()
        record = PendingRecord(key, value, record_headers, timestamp_ms)
        size = BATCH_HEADER_SIZE + record.size()
        max_request_size = self._sender.settings.max_request_size
        if size > max_request_size:
            error = RecordTooLargeError(
                f"the record is {size} bytes when serialized, more than "
                f"max_request_size={max_request_size}"
            )
            if self._transactions is not None:
                self._transactions.record_refused(error)
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
        self._sender.append(TopicPartition(topic, partition), record)
        return record.future

    def flush(self, timeout_s: float | None = None) -> None:
        """Send every queued record and wait until each is acknowledged or failed
        (each future is resolved).

        Raises:
            KafkaTimeoutError: ``timeout_s`` passed first.
        """
        self._sender.flush(timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        """Send what is queued (waiting at most ``timeout_s``), stop the sender
        thread and close the connections. Records still unsent after the
        timeout fail. A transactional producer aborts its open transaction
        first. Closing twice is a no-op."""
        if self._sender.closed:
            return
        if self._transactions is not None:
            self._transactions.close()
        self._sender.close(timeout_s)


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
        enable_two_phase_commit: take part in a two-phase commit run by an
            external transaction manager (KIP-939): the coordinator never
            times this producer's transactions out, ``prepare_transaction``
            holds one for the manager's decision and a new producer ends it
            after ``init_transactions(keep_prepared_txn=True)``. Needs
            ``transaction.two.phase.commit.enable`` on the cluster and, with
            ACLs, TWO_PHASE_COMMIT on the transactional id.
        **kwargs: as for :class:`Producer`.

    Two-phase commit::

        producer = TransactionalProducer(bootstrap, "tx-1", enable_two_phase_commit=True)
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("orders", value=b"v")
        state = producer.prepare_transaction()    # flushed; store str(state) with the
        ...                                       # external decision, then:
        producer.complete_transaction(state)      # commits (another state aborts)

        # after a crash, a new producer with the same id:
        producer.init_transactions(keep_prepared_txn=True)
        producer.complete_transaction(PreparedTxnState.parse(stored))
    """

    _transactions: TransactionManager

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        transactional_id: str,
        *,
        transaction_timeout_ms: int | None = None,
        enable_two_phase_commit: bool = False,
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
        self._transactions = TransactionManager(
            transactional_id, transaction_timeout_ms, bool(enable_two_phase_commit)
        )
        super().__init__(bootstrap, **kwargs)

    @property
    def transactional_id(self) -> str:
        """The transactional id given at construction."""
        return self._transactions.transactional_id

    @property
    def transaction_timeout_ms(self) -> int:
        """The transaction timeout sent to the coordinator (see the class docstring)."""
        return self._transactions.timeout_ms

    @property
    def state(self) -> str:
        """The producer's transaction state (for diagnostics)."""
        with self._sender.cond:
            return self._transactions.state.value

    # --- transactions ------------------------------------------------------------------

    def init_transactions(self, keep_prepared_txn: bool = False) -> None:
        """Register the transactional id with its coordinator: get the producer id
        and a new epoch, fencing every older producer with this id (an open
        transaction of theirs is aborted first).

        With ``keep_prepared_txn`` (KIP-939) an open transaction is kept
        instead: the producer is then in the prepared state, and only
        ``complete_transaction``, ``commit_transaction`` or
        ``abort_transaction`` end it (``prepared_state`` is its state).

        Raises:
            KafkaTimeoutError: not done within ``request_timeout_ms``; call again.
            ProducerFencedError, FatalError: the producer cannot be used.
            IllegalStateError: called twice.
        """
        self._transactions.init(keep_prepared_txn)

    @property
    def prepared_state(self) -> PreparedTxnState | None:
        """The prepared transaction's state (KIP-939), None when none is."""
        with self._sender.cond:
            return self._transactions.prepared

    def prepare_transaction(self) -> PreparedTxnState:
        """Flush every pending record and hold the transaction for an external
        transaction manager's decision (KIP-939's first phase). The
        transaction survives this producer's crash and coordinator
        failovers and never times out. Store ``str()`` of the answer with
        the decision; end the transaction with ``complete_transaction``.

        Raises:
            IllegalStateError: no transaction is open, or the producer was
                not created with ``enable_two_phase_commit=True``.
            TransactionAbortableError: a send failed; abort.
            FatalError: the producer was fenced.
        """
        return self._transactions.prepare()

    def complete_transaction(self, state: PreparedTxnState) -> bool | None:
        """End the prepared transaction: commit it if ``state`` is its state
        (the one ``prepare_transaction`` answered, or ``prepared_state``
        after ``init_transactions(keep_prepared_txn=True)``), else abort it.

        Returns:
            True when committed, False when aborted, None when no transaction
            was prepared (the coordinator had none to keep: nothing to do).

        Raises:
            KafkaTimeoutError: the outcome is not known yet; call again.
            FatalError: the producer was fenced.
            IllegalStateError: a transaction is open but not prepared.
        """
        return self._transactions.complete(state)

    def begin_transaction(self) -> None:
        """Start a transaction (local only: the coordinator learns of it with the
        first partition or offsets added).

        Raises:
            IllegalStateError: not initialized, or a transaction is open.
            FatalError: the producer was fenced or failed fatally.
        """
        self._transactions.begin()

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
        self._transactions.send_offsets(offsets, group_id)

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
        self._transactions.commit()

    def abort_transaction(self) -> None:
        """Abort the transaction: pending records are dropped (their futures fail
        with :class:`TransactionAbortedError`) and nothing of the transaction
        becomes visible to read_committed consumers.

        Raises:
            KafkaTimeoutError: the abort's outcome is not known yet; call again.
            FatalError: the producer was fenced.
            IllegalStateError: no transaction is open.
        """
        self._transactions.abort()
