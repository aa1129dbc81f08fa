"""Recovery through the Kafka gateway after a coordinator comes back: the
leader of a confluent-kafka producer's shard is killed with SIGKILL, a
transaction commits through its new leader, the killed node is started again
(`cluster start`), and the next transaction, begun once it answers, commits
within 1 s (median of five rounds; usually tens of milliseconds). The
restarted node is the shard's preferred leader, but it does not take the
shard back before an imbalance check, so the restart moves no leadership.
And an abort that comes while the previous transaction's commit waits for a
partition-log node that is down waits for it instead of being refused."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.routing import shard_for
from tests.local_cluster import after_first_checks, running_cluster
from tests.test_end_to_end import state_of
from tests.test_two_phase_commit import kafka_call

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Producer  # noqa: E402

from tests.kafka_admin import create_kafka_topics  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOPIC = "recovery"
TIMEOUT_S = 30.0
ROUNDS = 5
TRANSACTIONAL_ID = "recovering"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "cluster", partition_nodes=1, kafka_listeners=1) as running:
        create_kafka_topics(running, 2, TOPIC, timeout_s=TIMEOUT_S)
        yield running


def transaction(producer: Producer, value: bytes) -> None:
    """One transaction of a record on each partition, retried as librdkafka
    asks while it fails with an abortable or retriable error."""
    for _ in range(20):
        try:
            producer.begin_transaction()
            for partition in (0, 1):
                producer.produce(TOPIC, value=value, partition=partition)
            producer.commit_transaction(TIMEOUT_S)
            return
        except confluent_kafka.KafkaException as exc:
            error = exc.args[0]
            assert not error.fatal(), error
            if error.txn_requires_abort():
                producer.abort_transaction(TIMEOUT_S)
    pytest.fail("the transaction never committed")


def test_the_next_transaction_after_a_coordinator_restart_is_prompt(
    cluster: LocalCluster,
) -> None:
    ready = time.monotonic()
    state = cluster.state
    assert state is not None
    shard = shard_for(TRANSACTIONAL_ID, state.shard_count)
    producer = Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "transactional.id": TRANSACTIONAL_ID,
            "transaction.timeout.ms": 60_000,
        }
    )
    producer.init_transactions(TIMEOUT_S)
    after_first_checks(ready)
    took = []
    for round_ in range(ROUNDS):
        cluster.elect_preferred_leaders()
        leader = cluster.leaders()[shard]
        transaction(producer, f"{round_}-before".encode())
        cluster.kill(leader, "KILL")
        transaction(producer, f"{round_}-failover".encode())  # through the new leader
        moved = cluster.leaders()
        cluster.start(leader)
        started = time.monotonic()
        transaction(producer, f"{round_}-after".encode())
        took.append(time.monotonic() - started)
        assert cluster.leaders() == moved, "the restart moved a leadership"
    producer.flush(TIMEOUT_S)
    print("after each restart, the next transaction took (s):", [round(t, 3) for t in took])
    assert statistics.median(took) < 1.0, took


def test_a_leader_the_gateway_remembers_that_moved_is_not_the_clients_problem(
    cluster: LocalCluster,
) -> None:
    """The gateway remembers the leader of a group's shard; that node is
    killed and started again while no call goes through the gateway, so the
    gateway still names it although another node leads the shard now.
    librdkafka's committed() (OffsetFetch) does not retry NOT_COORDINATOR: the
    gateway asks the coordinators again itself and the offsets are read."""
    state = cluster.state
    assert state is not None
    group = "remembered"
    shard = shard_for(group, state.shard_count)
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "group.id": group,
            "enable.auto.commit": False,
        }
    )
    try:
        offsets = [confluent_kafka.TopicPartition(TOPIC, 0, 7)]
        consumer.commit(offsets=offsets, asynchronous=False)
        leader = cluster.leaders()[shard]
        cluster.kill(leader, "KILL")
        cluster.wait_until(
            lambda: cluster.leaders().get(shard) not in (None, leader),
            30,
            f"shard {shard} did not elect another leader",
        )
        cluster.start(leader)
        cluster.wait_until(
            lambda: cluster.node_status(leader) is not None, 30, f"node {leader} did not answer"
        )
        (read,) = consumer.committed([confluent_kafka.TopicPartition(TOPIC, 0)], TIMEOUT_S)
        assert read.error is None and read.offset == 7
    finally:
        consumer.close()


def test_an_abort_while_the_previous_commit_waits_for_a_down_node_waits(
    cluster: LocalCluster,
) -> None:
    """librdkafka aborts a transaction whose AddPartitionsToTxn timed out, with
    an EndTxn, also while its previous transaction's commit is still writing
    markers to a partition-log node that is down. That abort is not refused
    with INVALID_TXN_STATE (fatal to librdkafka): it waits for the commit,
    parked, and once the commit is complete it succeeds, aborting nothing."""
    tid = "abort-while-committing"
    init = kafka_call(cluster, 22, 4, {"transactional_id": tid, "transaction_timeout": 60_000})
    assert int(init.error_code) == 0, init
    identity = {"producer_id": int(init.producer_id), "producer_epoch": int(init.producer_epoch)}
    added = kafka_call(
        cluster,
        24,
        3,
        {
            "v3_and_below_transactional_id": tid,
            "v3_and_below_producer_id": identity["producer_id"],
            "v3_and_below_producer_epoch": identity["producer_epoch"],
            "v3_and_below_topics": [{"name": TOPIC, "partitions": [0]}],
        },
    )
    [result] = added.results_by_topic_v3_and_below[0].results_by_partition
    assert int(result.partition_error_code) == 0, added
    [node] = cluster.partition_nodes()
    end = {"transactional_id": tid, **identity}
    cluster.kill(node.node_id, "STOP")
    try:
        committed = kafka_call(cluster, 26, 3, {**end, "committed": True})
        assert int(committed.error_code) == 0, committed
        assert state_of(cluster, tid) == "PrepareCommit"  # its markers wait for the node
        started = time.monotonic()
        aborted = kafka_call(cluster, 26, 3, {**end, "committed": False})
        # Held until transaction.park.timeout.ms (1 s), then retriable.
        assert int(aborted.error_code) == ErrorCode.CONCURRENT_TRANSACTIONS, aborted
        assert time.monotonic() - started >= 0.9
    finally:
        cluster.kill(node.node_id, "CONT")
    cluster.wait_until(lambda: state_of(cluster, tid) == "CompleteCommit", 30, "no completion")
    aborted = kafka_call(cluster, 26, 3, {**end, "committed": False})
    assert int(aborted.error_code) == 0, aborted
    assert state_of(cluster, tid) == "CompleteCommit"


def test_a_transaction_after_a_record_refused_as_too_large_commits(
    cluster: LocalCluster,
) -> None:
    """confluent-kafka's record refused as too large (MSG_SIZE_TOO_LARGE:
    never appended, its sequence spent) makes librdkafka abort; the next
    transaction goes on at the next sequence of the same epoch, and the
    partition, which holds only the ABORT marker of the producer, takes it
    (as Kafka's brokers do), so it commits at once."""
    producer = Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "transactional.id": "outlives-a-refusal",
            "message.max.bytes": 10_000_000,
        }
    )
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    failed: list[Any] = []
    producer.produce(
        TOPIC, value=b"x" * 3_000_000, partition=0, on_delivery=lambda e, _m: failed.append(e)
    )
    producer.flush(TIMEOUT_S)
    assert [e.code() for e in failed] == [confluent_kafka.KafkaError.MSG_SIZE_TOO_LARGE]
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        producer.commit_transaction(TIMEOUT_S)
    assert refused.value.args[0].txn_requires_abort()
    producer.abort_transaction(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(TOPIC, value=b"after-the-refusal", partition=0)
    producer.commit_transaction(TIMEOUT_S)  # raised OUT_OF_ORDER_SEQUENCE_NUMBER
