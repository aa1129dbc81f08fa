"""What a new user's mistakes look like against a real cluster: each fails
fast (well under the 30 s of a request timeout) with an error that names
the address, topic or partition at fault, or says that the transaction
timed out."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from raftcoord.client import (
    Admin,
    Consumer,
    KafkaConnectionError,
    KafkaTimeoutError,
    NotACoordinatorNodeError,
    Producer,
    ProducerFencedError,
    TopicPartition,
    TransactionalProducer,
    UnknownTopicOrPartitionError,
)
from raftcoord.cluster.launcher import LocalCluster
from tests.local_cluster import running_cluster
from tests.test_end_to_end import state_of, wait_for

pytestmark = pytest.mark.slow

#: Generous: each of these used to take a 30 s request timeout or more.
FAST_S = 10.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    path = tmp_path_factory.mktemp("fail-fast")
    with running_cluster(
        path, coordinators=1, shards=1, partition_nodes=1, fsync="never", log_flush="never"
    ) as cluster:
        with Admin(cluster.bootstrap()) as admin:
            admin.create_topics({"present": 2})
        yield cluster


def test_a_partition_log_node_as_bootstrap_fails_at_once_naming_it(
    cluster: LocalCluster,
) -> None:
    address = cluster.partition_nodes()[0].grpc
    with Producer([address]) as producer:
        start = time.monotonic()
        with pytest.raises(NotACoordinatorNodeError, match=f"{address} is not a coordinator"):
            producer.send("present", b"v")
        assert time.monotonic() - start < FAST_S
    with Consumer(address) as consumer:
        consumer.assign([TopicPartition("present", 0)])
        start = time.monotonic()
        with pytest.raises(NotACoordinatorNodeError, match=address):
            consumer.poll(100)
        assert time.monotonic() - start < FAST_S


def test_a_comma_separated_bootstrap_string_works(cluster: LocalCluster) -> None:
    joined = ",".join(cluster.bootstrap() * 2)
    with Producer(joined) as producer:
        assert producer.send("present", b"v", partition=0).result(FAST_S).offset >= 0


def test_sending_to_a_missing_topic_names_it_after_max_block_ms(cluster: LocalCluster) -> None:
    with Producer(cluster.bootstrap(), max_block_ms=1_000) as producer:
        start = time.monotonic()
        with pytest.raises(
            KafkaTimeoutError, match="topic 'absent' not present in metadata after 1000 ms"
        ):
            producer.send("absent", b"v")
        assert time.monotonic() - start < FAST_S


@pytest.mark.parametrize(
    ("tp", "named"),
    [
        (TopicPartition("absent", 0), "topic 'absent' does not exist"),
        (TopicPartition("present", 999), "present-999 does not exist: .* partitions 0..1"),
    ],
)
def test_polling_a_missing_partition_raises_naming_it(
    cluster: LocalCluster, tp: TopicPartition, named: str
) -> None:
    with Consumer(cluster.bootstrap()) as consumer:
        consumer.assign([tp])
        start = time.monotonic()
        with pytest.raises(UnknownTopicOrPartitionError, match=named):
            consumer.poll(100)
        assert time.monotonic() - start < FAST_S


def test_polling_with_a_dead_bootstrap_fails_at_once_naming_it(cluster: LocalCluster) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    with Consumer(dead) as consumer:  # the default 30 s request timeout
        consumer.assign([TopicPartition("present", 0)])
        start = time.monotonic()
        with pytest.raises(KafkaConnectionError, match=f"no coordinator answers at {dead}"):
            while time.monotonic() - start < FAST_S:
                assert consumer.poll(100) == []
        assert time.monotonic() - start < FAST_S


def test_a_timed_out_transaction_says_so(cluster: LocalCluster) -> None:
    with TransactionalProducer(
        cluster.bootstrap(), "fail-fast-timeout", transaction_timeout_ms=1_000
    ) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("present", b"abandoned", partition=0)
        producer.flush()
        wait_for(
            lambda: state_of(cluster, "fail-fast-timeout") == "CompleteAbort",
            20,
            "the coordinator did not abort the timed-out transaction",
        )
        with pytest.raises(ProducerFencedError, match="the transaction timed out") as raised:
            producer.send("present", b"late", partition=1)
            producer.commit_transaction()
        assert "transaction_timeout_ms=1000" in str(raised.value)
