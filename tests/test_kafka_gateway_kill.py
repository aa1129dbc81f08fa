"""A Kafka gateway keeps nothing of a producer (transactions v1 live in the
coordinators: docs/kafka.md, "Transactions v1"): the gateway a
confluent-kafka transactional producer uses as its coordinator is killed
with SIGKILL in the middle of a transaction and started again, twice, and
the producer goes on without being fenced; every transaction it committed
is read exactly once, none it aborted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from raftcoord.cluster.launcher import LocalCluster
from tests.local_cluster import running_cluster

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition  # noqa: E402

from tests.kafka_admin import create_kafka_topics  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOPIC = "gateway-kill"
TIMEOUT_S = 30.0
ROUNDS = 8


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "cluster", partition_nodes=2, kafka_listeners=2) as running:
        create_kafka_topics(running, 3, TOPIC, timeout_s=TIMEOUT_S)
        yield running


def transaction(
    producer: Producer,
    values: list[bytes],
    commit: bool,
    between: Callable[[], None] | None = None,
) -> bool:
    """One transaction of ``values`` (one per partition), committed or
    aborted as asked; ``between`` runs after the first value was produced.
    An abortable error aborts and starts over, a retriable one is retried;
    a fatal error (the producer fenced) fails the test. Whether it committed."""
    for _ in range(10):
        producer.begin_transaction()
        try:
            for partition, value in enumerate(values):
                producer.produce(TOPIC, value=value, partition=partition)
                if between is not None:
                    between()
                    between = None
            _retrying(
                lambda: (
                    producer.commit_transaction(TIMEOUT_S)
                    if commit
                    else producer.abort_transaction(TIMEOUT_S)
                )
            )
            return commit
        except KafkaException as exc:
            error = exc.args[0]
            assert not error.fatal(), error
            assert error.txn_requires_abort(), error
            _retrying(lambda: producer.abort_transaction(TIMEOUT_S))
    pytest.fail("the transaction never ended")


def _retrying(end: Callable[[], None]) -> None:
    """``end`` (a commit or an abort) again while librdkafka says it may be."""
    for _ in range(10):
        try:
            end()
            return
        except KafkaException as exc:
            error = exc.args[0]
            if not error.retriable():
                raise
    pytest.fail("the end of the transaction was never answered")


def test_a_killed_gateway_fences_no_producer(cluster: LocalCluster) -> None:
    first, second = cluster.kafka_gateways()
    # Bootstrapped through the first gateway alone, the producer's first
    # FindCoordinator goes there, and a gateway names itself: the first is
    # its transaction coordinator.
    producer = Producer(
        {
            "bootstrap.servers": first.kafka,
            "transactional.id": "survives-its-gateway",
            "transaction.timeout.ms": 60_000,
        }
    )
    producer.init_transactions(TIMEOUT_S)
    metadata = producer.list_topics(TOPIC, timeout=TIMEOUT_S)
    assert set(metadata.brokers) == {first.node_id, second.node_id}

    def kill_and_restart() -> None:
        cluster.kill(first.node_id, "KILL")
        cluster.start(first.node_id)

    committed: list[bytes] = []
    aborted: list[bytes] = []
    for round_ in range(ROUNDS):
        values = [f"{round_}-{p}".encode() for p in range(3)]
        commit = round_ % 4 != 1
        between = kill_and_restart if round_ in (3, 6) else None
        (committed if transaction(producer, values, commit, between) else aborted).extend(values)
    producer.flush(TIMEOUT_S)
    assert len(aborted) == 3 * (ROUNDS // 4)

    read = _read_committed(cluster)
    assert Counter(read) == Counter(committed), "a committed record missing or read twice"
    assert not set(read) & set(aborted)


def _read_committed(cluster: LocalCluster) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "group.id": "gateway-kill-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(3)])
        read: list[bytes] = []
        idle = 0
        while idle < 6:
            batch = consumer.consume(1000, 0.5)
            idle = 0 if batch else idle + 1
            for message in batch:
                assert message.error() is None, message.error()
                read.append(message.value())
        return read
    finally:
        consumer.close()
