"""Unmodified Kafka clients against a local cluster through its Kafka gateway.

confluent-kafka (librdkafka): transactions committed and aborted across
partitions, a second producer with the same transactional.id fencing the
first, and a read_committed consumer (assign(), no group membership) that
sees exactly the committed records.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from raftcoord.cluster.launcher import LocalCluster
from tests.local_cluster import running_cluster

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TOPIC = "orders"
PARTITIONS = 3
TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    path: Path = tmp_path_factory.mktemp("kafka-cluster")
    with running_cluster(path, partition_nodes=2, kafka_listeners=1) as running:
        bootstrap = running.kafka_bootstrap()
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics(
            [NewTopic(TOPIC, PARTITIONS, 1)], request_timeout=TIMEOUT_S
        ).values():
            future.result(timeout=TIMEOUT_S)
        yield running


def producer(cluster: LocalCluster, transactional_id: str) -> Producer:
    made = Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 60_000,
        }
    )
    made.init_transactions(TIMEOUT_S)
    return made


def committed_values(cluster: LocalCluster, topic: str, expected: int) -> list[bytes]:
    """The values a read_committed consumer reads from every partition of
    ``topic`` up to the last stable offset."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "group.id": "reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        values: list[bytes] = []
        at_end: set[int] = set()
        polls = 0
        while len(at_end) < PARTITIONS or len(values) < expected:
            polls += 1
            assert polls < 400, f"read {len(values)} of {expected} records"
            msg = consumer.poll(0.25)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                    continue
                raise KafkaException(msg.error())
            at_end.discard(msg.partition())
            values.append(msg.value())
        return values
    finally:
        consumer.close()


def test_committed_and_aborted_transactions_across_partitions(cluster: LocalCluster) -> None:
    p = producer(cluster, "orders-writer")
    committed = []
    for round_ in range(3):
        p.begin_transaction()
        for i in range(2 * PARTITIONS):
            value = f"commit-{round_}-{i}".encode()
            p.produce(TOPIC, value=value, partition=i % PARTITIONS)
            committed.append(value)
        p.commit_transaction(TIMEOUT_S)
        p.begin_transaction()
        for i in range(2 * PARTITIONS):
            p.produce(TOPIC, value=f"abort-{round_}-{i}".encode(), partition=i % PARTITIONS)
        p.flush(TIMEOUT_S)  # the aborted records reach the log before the abort
        p.abort_transaction(TIMEOUT_S)
    values = committed_values(cluster, TOPIC, len(committed))
    assert sorted(values) == sorted(committed)


def test_a_second_producer_fences_the_first(cluster: LocalCluster) -> None:
    first = producer(cluster, "fenced-writer")
    first.begin_transaction()
    first.produce(TOPIC, value=b"zombie", partition=0)
    first.flush(TIMEOUT_S)
    second = producer(cluster, "fenced-writer")  # aborts the first one's transaction
    second.begin_transaction()
    second.produce(TOPIC, value=b"successor", partition=1)
    second.commit_transaction(TIMEOUT_S)
    with pytest.raises(KafkaException) as raised:
        first.produce(TOPIC, value=b"zombie-2", partition=2)
        first.commit_transaction(TIMEOUT_S)
    error = raised.value.args[0]
    assert error.fatal(), error
    assert error.code() in (
        confluent_kafka.KafkaError._FENCED,
        confluent_kafka.KafkaError.PRODUCER_FENCED,
        confluent_kafka.KafkaError.INVALID_PRODUCER_EPOCH,
    ), error
