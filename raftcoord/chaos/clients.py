"""The client operations the workload uses, as protocols: raftcoord's client
library (``raftcoord.client``) and the Kafka adapter
(``raftcoord.chaos.kafka_clients``) both provide them, and mypy checks that
each does (a module satisfies :class:`ClientModule`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Protocol, Self

from raftcoord.client import ConsumerRecord, RecordMetadata, TopicPartition


class WorkloadProducer(Protocol):
    """The input pre-fill's producer."""

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def send(self, topic: str, *, value: bytes, partition: int) -> Future[RecordMetadata]: ...

    def flush(self) -> None: ...


class WorkloadTransactionalProducer(Protocol):
    """A producer or worker process's producer."""

    @property
    def producer_id(self) -> int: ...

    @property
    def producer_epoch(self) -> int: ...

    def init_transactions(self) -> None: ...

    def begin_transaction(self) -> None: ...

    def send(self, topic: str, *, value: bytes, partition: int) -> Future[RecordMetadata]: ...

    def send_offsets_to_transaction(
        self, offsets: Mapping[TopicPartition, int], group_id: Any
    ) -> None: ...

    def commit_transaction(self) -> None: ...

    def abort_transaction(self) -> None: ...

    def close(self, *, timeout_s: float) -> None: ...


class WorkloadConsumer(Protocol):
    """A consumer of assigned partitions."""

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def assign(self, partitions: list[TopicPartition], /) -> None: ...

    def seek(self, tp: TopicPartition, offset: int, /) -> None: ...

    def poll(self, *, timeout_ms: int) -> list[ConsumerRecord]: ...

    def position(self, tp: TopicPartition, /) -> int: ...

    def committed(self, tp: TopicPartition, /) -> int | None: ...

    def end_offsets(self, partitions: list[TopicPartition], /) -> dict[TopicPartition, int]: ...

    def close(self) -> None: ...


class WorkloadAdmin(Protocol):
    """Topic listing and creation."""

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def list_topics(self) -> Mapping[str, int] | list[str]: ...

    def create_topics(self, topics: Mapping[str, int], /) -> None: ...


class ClientModule(Protocol):
    """A module the workload makes its clients of."""

    @property
    def Producer(self) -> Callable[..., WorkloadProducer]: ...

    @property
    def TransactionalProducer(self) -> Callable[..., WorkloadTransactionalProducer]: ...

    @property
    def Consumer(self) -> Callable[..., WorkloadConsumer]: ...

    @property
    def Admin(self) -> Callable[..., WorkloadAdmin]: ...
