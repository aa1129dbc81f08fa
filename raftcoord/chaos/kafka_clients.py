"""The workload's client operations on Kafka's own client, confluent-kafka
(librdkafka), through the cluster's Kafka gateways (``--client kafka``).

The workload (``raftcoord/chaos/workload.py``) uses a few operations of
raftcoord's client library: these classes give it the same ones, with the
same names and the same error classes, so that the one workload drives
either client. Errors are mapped by what they mean for the history
(docs/chaos.md, "Kafka clients"):

* librdkafka's fatal errors (a fenced producer) are :class:`FatalError`;
* errors that require aborting the transaction are
  :class:`TransactionAbortableError`, whose cause tells whether the refused
  operation may still have happened (a retriable cause: outcome unknown);
* retriable errors (timeouts, a coordinator moving) are
  :class:`KafkaTimeoutError`: librdkafka asks for the same call again, as
  the workload does for raftcoord's client timeouts;
* everything else is a non-retriable :class:`KafkaError`: the operation
  did not happen.

A send is waited for by flushing the producer; librdkafka does not say
whether a failed message may have been written, so every failed send is
recorded with an unknown outcome. librdkafka does not expose the producer
id and epoch: the history's events carry none (the checker and the audit
match transactions by the history's transaction names).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterable, Mapping
from typing import Any

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from raftcoord.client import (
    ConsumerRecord,
    FatalError,
    KafkaError,
    KafkaTimeoutError,
    RecordMetadata,
    TopicPartition,
    TransactionAbortableError,
)

__all__ = ["Admin", "Consumer", "Producer", "TransactionalProducer", "error_of"]

#: Most records one poll returns.
POLL_RECORDS = 100
#: A consumer without a group still needs a group id in librdkafka.
_NO_GROUP = "raftcoord-workload-reader"


def error_of(exc: confluent_kafka.KafkaException | confluent_kafka.KafkaError) -> KafkaError:
    """The workload's error class for a librdkafka error (see the module's text)."""
    error = exc.args[0] if isinstance(exc, confluent_kafka.KafkaException) else exc
    if not isinstance(error, confluent_kafka.KafkaError):
        return KafkaError(str(exc))
    message = f"{error.name()}: {error.str()}"
    if error.fatal():
        return FatalError(message)
    if error.txn_requires_abort():
        mapped = TransactionAbortableError(message)
        mapped.__cause__ = KafkaTimeoutError(message) if error.retriable() else KafkaError(message)
        return mapped
    if error.retriable() or error.code() in _RETRIABLE:
        return KafkaTimeoutError(message)
    return KafkaError(message)


#: Errors asked again (or, from a send or a transaction's end, of unknown
#: outcome) whatever librdkafka's retriable flag says.
_RETRIABLE = frozenset(
    {
        confluent_kafka.KafkaError._TIMED_OUT,
        confluent_kafka.KafkaError._MSG_TIMED_OUT,
        confluent_kafka.KafkaError._TRANSPORT,
        confluent_kafka.KafkaError.REQUEST_TIMED_OUT,
        confluent_kafka.KafkaError.NETWORK_EXCEPTION,
        confluent_kafka.KafkaError.NOT_COORDINATOR,
        confluent_kafka.KafkaError.COORDINATOR_NOT_AVAILABLE,
        confluent_kafka.KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        confluent_kafka.KafkaError.UNSTABLE_OFFSET_COMMIT,
    }
)


def _settings(bootstrap: Iterable[str], settings: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka's configuration for the workload's client settings."""
    names = {
        "request_timeout_ms": "socket.timeout.ms",
        "retry_backoff_max_ms": "retry.backoff.max.ms",
        "delivery_timeout_ms": "message.timeout.ms",
        "linger_ms": "linger.ms",
        "batch_size": "batch.size",
        "transaction_timeout_ms": "transaction.timeout.ms",
        "isolation_level": "isolation.level",
        "group_id": "group.id",
    }
    config: dict[str, Any] = {"bootstrap.servers": ",".join(bootstrap)}
    for name, value in settings.items():
        if name in names:  # fetch sizes: librdkafka bounds polls by POLL_RECORDS
            config[names[name]] = value
    return config


def _wire(tp: TopicPartition, offset: int | None = None) -> confluent_kafka.TopicPartition:
    if offset is None:
        return confluent_kafka.TopicPartition(tp.topic, tp.partition)
    return confluent_kafka.TopicPartition(tp.topic, tp.partition, offset)


class Producer:
    """A producer of plain records (the input pre-fill): ``send`` returns a
    future completed by ``flush``."""

    def __init__(self, bootstrap: Iterable[str], **settings: Any) -> None:
        self.timeout_s = settings.get("request_timeout_ms", 30_000) / 1000
        self._producer = confluent_kafka.Producer(
            {**_settings(bootstrap, settings), "enable.idempotence": True}
        )

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(
        self, topic: str, value: bytes, partition: int
    ) -> concurrent.futures.Future[RecordMetadata]:
        future: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()

        def delivered(error: confluent_kafka.KafkaError | None, msg: Any) -> None:
            if error is not None:
                future.set_exception(error_of(error))
            else:
                future.set_result(RecordMetadata(msg.topic(), msg.partition(), msg.offset()))

        while True:
            try:
                self._producer.produce(
                    topic, value=value, partition=partition, on_delivery=delivered
                )
                return future
            except BufferError:  # the local queue is full: let it drain
                self._producer.poll(0.1)

    def flush(self) -> None:
        if self._producer.flush(self.timeout_s * 10) > 0:
            raise KafkaTimeoutError("records not delivered in time")

    def close(self, timeout_s: float = 5.0) -> None:
        self._producer.flush(timeout_s)


class TransactionalProducer(Producer):
    """A transactional producer; each send is waited for."""

    producer_id = -1
    producer_epoch = -1

    def __init__(self, bootstrap: Iterable[str], transactional_id: str, **settings: Any) -> None:
        self.timeout_s = settings.get("request_timeout_ms", 30_000) / 1000
        self._producer = confluent_kafka.Producer(
            {**_settings(bootstrap, settings), "transactional.id": transactional_id}
        )

    def _call(self, method: str, *args: Any) -> None:
        try:
            getattr(self._producer, method)(*args)
        except confluent_kafka.KafkaException as exc:
            raise error_of(exc) from None

    def init_transactions(self) -> None:
        self._call("init_transactions", self.timeout_s * 2)

    def begin_transaction(self) -> None:
        self._call("begin_transaction")

    def send(
        self, topic: str, value: bytes, partition: int
    ) -> concurrent.futures.Future[RecordMetadata]:
        future = super().send(topic, value, partition)
        self._producer.flush(self.timeout_s * 2)
        if not future.done():
            future.set_exception(KafkaTimeoutError("no delivery report in time"))
        elif isinstance(future.exception(), KafkaError):
            # librdkafka does not say whether a failed message was written.
            cause = future.exception()
            unknown: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
            unknown.set_exception(KafkaTimeoutError(str(cause)))
            return unknown
        return future

    def send_offsets_to_transaction(
        self, offsets: Mapping[TopicPartition, int], group_metadata: Any
    ) -> None:
        wire = [_wire(tp, offset) for tp, offset in offsets.items()]
        self._call("send_offsets_to_transaction", wire, group_metadata, self.timeout_s * 2)

    def commit_transaction(self) -> None:
        self._call("commit_transaction", self.timeout_s * 2)

    def abort_transaction(self) -> None:
        self._call("abort_transaction", self.timeout_s * 2)

    def close(self, timeout_s: float = 5.0) -> None:
        """Drop the producer (a fenced or failed one cannot flush)."""
        self._producer.purge()
        self._producer.flush(timeout_s)


class Consumer:
    """A consumer of assigned partitions, positioned by ``seek``.

    librdkafka moves its position only past records it hands out, not past
    offsets a read skips (transaction markers, aborted records: the gateway
    steps over them, docs/kafka.md "Fetch"). The partition's end-of-partition
    event says how far a read got, so :meth:`position` is the furthest of
    the last seek, librdkafka's position and that event's offset.
    """

    def __init__(self, bootstrap: Iterable[str], **settings: Any) -> None:
        self.timeout_s = settings.get("request_timeout_ms", 30_000) / 1000
        config = _settings(bootstrap, settings)
        config.setdefault("group.id", _NO_GROUP)
        self._consumer = confluent_kafka.Consumer(
            {**config, "enable.auto.commit": False, "enable.partition.eof": True}
        )
        self._assigned: list[TopicPartition] = []
        self._seeked: dict[TopicPartition, int] = {}
        #: Partitions read to their end, with the end offset, since their last record.
        self._at_end: dict[TopicPartition, int] = {}

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def group_metadata(self) -> Any:
        """What ``send_offsets_to_transaction`` takes for this consumer's group."""
        return self._consumer.consumer_group_metadata()

    def assign(self, partitions: list[TopicPartition]) -> None:
        self._assigned = list(partitions)
        self._consumer.assign([_wire(tp) for tp in partitions])

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._consumer.incremental_unassign([_wire(tp)])
        self._consumer.incremental_assign([_wire(tp, offset)])
        self._seeked[tp] = offset
        self._at_end.pop(tp, None)

    def poll(self, timeout_ms: int) -> list[ConsumerRecord]:
        """The records that arrive within ``timeout_ms`` (at most POLL_RECORDS):
        returns at the first ones, or once every partition is at its end.

        Raises:
            KafkaError: librdkafka reported an error and no record came (it
                retries by itself; records delivered with an error are kept).
        """
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            messages = self._consumer.consume(1, max(0.0, deadline - time.monotonic()))
            if messages:
                messages += self._consumer.consume(POLL_RECORDS - 1, 0)
            records: list[ConsumerRecord] = []
            errors: list[KafkaError] = []
            for msg in messages:
                self._take(msg, records, errors)
            if records:
                return records
            if errors:
                raise errors[0]
            if (
                not messages
                or time.monotonic() >= deadline
                or all(tp in self._at_end for tp in self._assigned)
            ):
                return records

    def _take(self, msg: Any, records: list[ConsumerRecord], errors: list[KafkaError]) -> None:
        """Adds a librdkafka message to ``records``, an error to ``errors``;
        an end-of-partition event moves the partition's position."""
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        error = msg.error()
        if error is not None:
            if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                self._at_end[TopicPartition(topic, partition)] = offset
            else:
                errors.append(error_of(error))
            return
        assert topic is not None and partition is not None and offset is not None
        self._at_end.pop(TopicPartition(topic, partition), None)
        records.append(ConsumerRecord(topic, partition, offset, msg.key(), msg.value()))

    def position(self, tp: TopicPartition) -> int:
        [found] = self._consumer.position([_wire(tp)])
        return max(int(found.offset), self._seeked.get(tp, 0), self._at_end.get(tp, 0))

    def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset; asked again while the group's
        coordinator moves (librdkafka gives up on NOT_COORDINATOR)."""
        deadline = time.monotonic() + self.timeout_s * 4
        while True:
            try:
                [found] = self._consumer.committed([_wire(tp)], self.timeout_s)
            except confluent_kafka.KafkaException as exc:
                error = error_of(exc)
                if error.retriable and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise error from None
            return None if found.offset < 0 else int(found.offset)

    def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's end: the last stable offset under read_committed."""
        ends = {}
        for tp in partitions:
            try:
                _, high = self._consumer.get_watermark_offsets(_wire(tp), self.timeout_s, False)
            except confluent_kafka.KafkaException as exc:
                raise error_of(exc) from None
            ends[tp] = int(high)
        return ends

    def close(self) -> None:
        self._consumer.close()


class Admin:
    """Topic listing and creation."""

    def __init__(self, bootstrap: Iterable[str], **settings: Any) -> None:
        self.timeout_s = settings.get("request_timeout_ms", 30_000) / 1000
        self._admin = AdminClient({"bootstrap.servers": ",".join(bootstrap)})

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def list_topics(self) -> list[str]:
        try:
            return list(self._admin.list_topics(timeout=self.timeout_s * 2).topics)
        except confluent_kafka.KafkaException as exc:
            raise error_of(exc) from None

    def create_topics(self, topics: Mapping[str, int]) -> None:
        futures = self._admin.create_topics(
            [NewTopic(name, count) for name, count in topics.items()],  # the default RF
            request_timeout=self.timeout_s * 2,
        )
        for future in futures.values():
            try:
                future.result(timeout=self.timeout_s * 4)
            except confluent_kafka.KafkaException as exc:
                raise error_of(exc) from None
