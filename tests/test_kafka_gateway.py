"""Unmodified Kafka clients against a local cluster through its Kafka gateway.

confluent-kafka (librdkafka): transactions committed and aborted across
partitions, a second producer with the same transactional.id fencing the
first, and a read_committed consumer (assign(), no group membership) that
sees exactly the committed records; a coordinator leader killed in the
middle of a transaction. kafka-python and aiokafka: transactions committed
and aborted, read back with read_committed, and the same kill -9 survived.
Raw frames: bad input closes only its connection, answers come back in
request order.
"""

from __future__ import annotations

import asyncio
import io
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from raftcoord.cluster.launcher import LocalCluster
from raftcoord.kafka.messages import SUPPORTED, build
from raftcoord.protocol.routing import shard_for
from tests.local_cluster import running_cluster

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition  # noqa: E402

from tests.kafka_admin import create_kafka_topics  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TOPIC = "orders"
PARTITIONS = 3
TIMEOUT_S = 30.0


@pytest.fixture(scope="module", params=[1, 2], ids=["1-gateway", "2-gateways"])
def cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    """One cluster per gateway count: with two, partitions are led by both
    gateways and transactional requests that reach the gateway not owning
    their transactional id are relayed to its owner."""
    path: Path = tmp_path_factory.mktemp("kafka-cluster")
    with running_cluster(path, partition_nodes=2, kafka_listeners=request.param) as running:
        create_topic(running, TOPIC)
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
            error = msg.error()
            partition = msg.partition()
            assert partition is not None
            if error is not None:
                if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    at_end.add(partition)
                    continue
                raise KafkaException(error)
            at_end.discard(partition)
            value = msg.value()
            assert value is not None
            values.append(value)
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


def test_a_killed_coordinator_leader_is_survived_exactly_once(cluster: LocalCluster) -> None:
    """The leader of the producer's shard is killed with SIGKILL inside the
    fourth transaction, after its records are written; librdkafka
    rediscovers the coordinator by itself (COORDINATOR_NOT_AVAILABLE /
    NOT_COORDINATOR through the gateway) and every acknowledged commit is
    read exactly once."""
    transactional_id = "failover-writer"
    topic = "failover"
    create_topic(cluster, topic)
    p = producer(cluster, transactional_id)
    state = cluster.state
    assert state is not None
    leader = cluster.leaders()[shard_for(transactional_id, state.shard_count)]
    committed: list[bytes] = []
    try:
        write_rounds(cluster, p, topic, leader, committed)
    finally:
        cluster.start(leader)  # the cluster serves the module's other tests
    assert sorted(committed_values(cluster, topic, len(committed))) == sorted(committed)


def write_rounds(
    cluster: LocalCluster, p: Producer, topic: str, leader: int, committed: list[bytes]
) -> None:
    for round_ in range(8):
        values = [f"{round_}-{i}".encode() for i in range(PARTITIONS)]
        for attempt in range(20):
            try:
                p.begin_transaction()
                for i, value in enumerate(values):
                    p.produce(topic, value=value, partition=i)
                if round_ == 3 and attempt == 0:
                    p.flush(TIMEOUT_S)
                    cluster.kill(leader, "KILL")
                commit_or_retry(p)
                break
            except KafkaException as exc:
                error = exc.args[0]
                assert not error.fatal(), error
                assert error.txn_requires_abort(), error
                p.abort_transaction(TIMEOUT_S)
        else:
            pytest.fail(f"round {round_} never committed (last attempt {attempt})")
        committed += values


def commit_or_retry(p: Producer) -> None:
    """commit_transaction, again while it fails with a retriable error (as
    librdkafka's documentation asks)."""
    for _ in range(20):
        try:
            p.commit_transaction(TIMEOUT_S)
            return
        except KafkaException as exc:
            if not exc.args[0].retriable():
                raise
    pytest.fail("commit_transaction stayed retriable")


def create_topic(cluster: LocalCluster, topic: str) -> None:
    create_kafka_topics(cluster, PARTITIONS, topic, timeout_s=TIMEOUT_S)


def test_kafka_python_commits_aborts_and_reads_committed(cluster: LocalCluster) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KafkaPythonPartition

    topic = "kafka-python"
    create_topic(cluster, topic)
    p = KafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap(),
        transactional_id="kafka-python-writer",
        enable_idempotence=True,
        acks="all",
        request_timeout_ms=int(TIMEOUT_S * 1000),
    )
    committed = []
    try:
        p.init_transactions()
        for round_ in range(3):
            p.begin_transaction()
            for i in range(2 * PARTITIONS):
                value = f"commit-{round_}-{i}".encode()
                p.send(topic, value=value, partition=i % PARTITIONS)
                committed.append(value)
            p.commit_transaction()
            p.begin_transaction()
            for i in range(2 * PARTITIONS):
                p.send(topic, value=f"abort-{round_}-{i}".encode(), partition=i % PARTITIONS)
            p.flush(timeout=TIMEOUT_S)
            p.abort_transaction()
    finally:
        p.close(timeout=TIMEOUT_S)
    consumer = KafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap(),
        isolation_level="read_committed",
        enable_auto_commit=False,
        consumer_timeout_ms=int(TIMEOUT_S * 1000),
    )
    try:
        consumer.assign([KafkaPythonPartition(topic, i) for i in range(PARTITIONS)])
        consumer.seek_to_beginning()
        values = []
        for message in consumer:
            values.append(message.value)
            if len(values) == len(committed):
                break
        assert sorted(values) == sorted(committed)
        assert consumer.poll(timeout_ms=500) == {}  # nothing more: no aborted record
    finally:
        consumer.close()


def test_aiokafka_commits_aborts_and_reads_committed(cluster: LocalCluster) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    topic = "aiokafka"
    create_topic(cluster, topic)

    async def run() -> tuple[list[bytes], list[bytes]]:
        p = AIOKafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap(),
            transactional_id="aiokafka-writer",
            enable_idempotence=True,
            request_timeout_ms=int(TIMEOUT_S * 1000),
        )
        committed = []
        await p.start()
        try:
            for round_ in range(3):
                async with p.transaction():
                    for i in range(2 * PARTITIONS):
                        value = f"commit-{round_}-{i}".encode()
                        await p.send_and_wait(topic, value=value, partition=i % PARTITIONS)
                        committed.append(value)
                await p.begin_transaction()
                for i in range(2 * PARTITIONS):
                    value = f"abort-{round_}-{i}".encode()
                    await p.send_and_wait(topic, value=value, partition=i % PARTITIONS)
                await p.abort_transaction()
        finally:
            await p.stop()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=cluster.kafka_bootstrap(),
            isolation_level="read_committed",
            enable_auto_commit=False,
        )
        await consumer.start()
        values: list[bytes] = []
        try:
            consumer.assign([TopicPartition(topic, i) for i in range(PARTITIONS)])
            await consumer.seek_to_beginning()
            for _ in range(200):
                batches = await consumer.getmany(timeout_ms=250)
                values += [m.value for ms in batches.values() for m in ms if m.value is not None]
                if len(values) >= len(committed):
                    break
            values += [
                m.value
                for ms in (await consumer.getmany(timeout_ms=500)).values()
                for m in ms
                if m.value is not None
            ]
        finally:
            await consumer.stop()
        return committed, values

    committed, values = asyncio.run(asyncio.wait_for(run(), TIMEOUT_S * 3))
    assert sorted(values) == sorted(committed)


def test_offsets_sent_in_a_transaction_are_committed_with_it(cluster: LocalCluster) -> None:
    """send_offsets_to_transaction with an assign()-only consumer's group
    metadata (no membership: generation -1): AddOffsetsToTxn and
    TxnOffsetCommit through the gateway; the offsets are visible (OffsetFetch)
    after the commit only, and an aborted transaction's offsets never."""
    group = "copier"
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    p = producer(cluster, "copier-writer")
    try:
        p.begin_transaction()
        p.produce(TOPIC, value=b"copied", partition=0)
        p.send_offsets_to_transaction(
            [TopicPartition(TOPIC, 0, 7)], consumer.consumer_group_metadata(), TIMEOUT_S
        )
        p.abort_transaction(TIMEOUT_S)
        [aborted] = consumer.committed([TopicPartition(TOPIC, 0)], TIMEOUT_S)
        assert aborted.offset < 0  # nothing committed for the group
        p.begin_transaction()
        p.produce(TOPIC, value=b"copied", partition=0)
        p.send_offsets_to_transaction(
            [TopicPartition(TOPIC, 0, 9)], consumer.consumer_group_metadata(), TIMEOUT_S
        )
        p.commit_transaction(TIMEOUT_S)
        [committed] = consumer.committed([TopicPartition(TOPIC, 0)], TIMEOUT_S)
        assert committed.offset == 9
    finally:
        consumer.close()


def test_kafka_admin_tools_list_and_describe_transactions(cluster: LocalCluster) -> None:
    from kafka.admin import KafkaAdminClient

    p = producer(cluster, "described-writer")
    p.begin_transaction()
    p.produce(TOPIC, value=b"open", partition=2)
    p.flush(TIMEOUT_S)
    admin = KafkaAdminClient(
        bootstrap_servers=cluster.kafka_bootstrap(), request_timeout_ms=int(TIMEOUT_S * 1000)
    )
    try:
        listed = {
            t.transactional_id: t.state.value
            for listings in admin.list_transactions().values()
            for t in listings
        }
        assert listed["described-writer"] == "Ongoing"
        described = admin.describe_transactions(["described-writer"])["described-writer"]
        assert described.state.value == "Ongoing"
        assert {(tp.topic, tp.partition) for tp in described.topic_partitions} == {(TOPIC, 2)}
        p.commit_transaction(TIMEOUT_S)
        described = admin.describe_transactions(["described-writer"])["described-writer"]
        assert described.state.value in ("PrepareCommit", "CompleteCommit")
    finally:
        admin.close()


def test_metadata_shows_each_partitions_replicas_and_create_topics_takes_their_count(
    cluster: LocalCluster,
) -> None:
    """Metadata names the controller's replicas, ISR and leader epoch (each
    partition-log node as the gateway in front of it); CreateTopics takes the
    replication factor and min.insync.replicas, refusing what it cannot do."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap()})
    gateways = {b.id for b in admin.list_topics(timeout=TIMEOUT_S).brokers.values()}
    futures = admin.create_topics(
        [
            NewTopic("meta-default", 2, -1, config={"min.insync.replicas": "1"}),
            NewTopic("meta-three", 1, 3),
            NewTopic("meta-bad-isr", 1, 1, config={"min.insync.replicas": "0"}),
        ],
        request_timeout=TIMEOUT_S,
    )
    futures["meta-default"].result(timeout=TIMEOUT_S)
    refusals = {}
    for name in ("meta-three", "meta-bad-isr"):
        with pytest.raises(KafkaException) as info:
            futures[name].result(timeout=TIMEOUT_S)
        refusals[name] = info.value.args[0].code()
    assert refusals == {
        "meta-three": confluent_kafka.KafkaError.INVALID_REPLICATION_FACTOR,
        "meta-bad-isr": confluent_kafka.KafkaError.INVALID_CONFIG,
    }
    topic = admin.list_topics("meta-default", timeout=TIMEOUT_S).topics["meta-default"]
    assert len(topic.partitions) == 2
    for p in topic.partitions.values():  # the default factor: both partition-log nodes
        assert p.leader in gateways and p.leader == p.replicas[0]
        assert set(p.replicas) <= gateways and sorted(p.isrs) == sorted(p.replicas)
        assert p.error is None


# --- the wire itself: bad frames, pipelining ------------------------------------------


def request_frame(api_key: int, version: int, correlation_id: int, body: dict[str, Any]) -> bytes:
    """A size-prefixed request frame, written with kio's schemas."""
    schema = load_request_schema(api_key, version)
    out = io.BytesIO()
    entity_writer(schema.__header_schema__)(
        out,
        build(
            schema.__header_schema__,
            {
                "request_api_key": api_key,
                "request_api_version": version,
                "correlation_id": correlation_id,
                "client_id": "raw",
            },
        ),
    )
    entity_writer(schema)(out, build(schema, body))
    payload = out.getvalue()
    return len(payload).to_bytes(4, "big") + payload


def read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    return exactly(int.from_bytes(exactly(4), "big"))


def gateway_socket(cluster: LocalCluster) -> socket.socket:
    host, port = cluster.kafka_bootstrap().split(",")[0].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
    return sock


@pytest.mark.parametrize(
    "frame",
    [
        (4).to_bytes(4, "big") + b"\x7f\x00\x00\x00",  # an unknown api key
        (2**31 - 1).to_bytes(4, "big"),  # a frame larger than accepted
        (8).to_bytes(4, "big") + b"\x00\x00\x00\x09" + b"\x00" * 4,  # Produce v9, cut short
    ],
    ids=["unknown-api", "huge-frame", "truncated-produce"],
)
def test_a_bad_frame_closes_its_connection_and_nothing_else(
    cluster: LocalCluster, frame: bytes
) -> None:
    with gateway_socket(cluster) as bad:
        bad.sendall(frame)
        with pytest.raises(ConnectionError):
            read_frame(bad)
    with gateway_socket(cluster) as good:
        good.sendall(request_frame(18, 0, 5, {}))
        assert read_frame(good)[:4] == (5).to_bytes(4, "big")


def test_a_corrupt_batch_is_refused_with_invalid_record(cluster: LocalCluster) -> None:
    with gateway_socket(cluster) as sock:
        partition = {"index": 0, "records": b"\x00" * 70}
        sock.sendall(
            request_frame(
                0,
                3,
                11,
                {
                    "acks": -1,
                    "timeout": 5000,
                    "topic_data": [{"name": TOPIC, "partition_data": [partition]}],
                },
            )
        )
        answer = read_frame(sock)
    response: Any = entity_reader(load_response_schema(0, 3))(answer, 4)[0]
    [topic] = response.responses
    [result] = topic.partition_responses
    assert int(result.error_code) == 87  # INVALID_RECORD
    assert result.base_offset == -1


def test_pipelined_requests_are_answered_in_order(cluster: LocalCluster) -> None:
    """A Fetch that waits (an empty partition, min_bytes not reached) first,
    then two quick requests on the same connection: the answers come back
    in request order."""
    create_topic(cluster, "idle")
    fetch = {
        "max_wait": 1000,
        "min_bytes": 1_000_000,
        "max_bytes": 1_000_000,
        "isolation_level": 1,
        "topics": [
            {
                "topic": "idle",
                "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1000}],
            }
        ],
    }
    with gateway_socket(cluster) as sock:
        sock.sendall(
            request_frame(1, 4, 1, fetch)
            + request_frame(18, 0, 2, {})
            + request_frame(3, 1, 3, {"topics": None})
        )
        order = [int.from_bytes(read_frame(sock)[:4], "big") for _ in range(3)]
    assert order == [1, 2, 3]


def test_kafka_python_survives_a_killed_coordinator_leader_exactly_once(
    cluster: LocalCluster,
) -> None:
    from kafka import KafkaProducer

    transactional_id = "kafka-python-failover"
    topic = "kafka-python-failover"
    create_topic(cluster, topic)
    state = cluster.state
    assert state is not None
    leader = cluster.leaders()[shard_for(transactional_id, state.shard_count)]
    p = KafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap(),
        transactional_id=transactional_id,
        enable_idempotence=True,
        acks="all",
        request_timeout_ms=int(TIMEOUT_S * 1000),
    )
    committed: list[bytes] = []
    try:
        p.init_transactions()
        for round_ in range(6):
            p.begin_transaction()
            values = [f"{round_}-{i}".encode() for i in range(PARTITIONS)]
            for i, value in enumerate(values):
                p.send(topic, value=value, partition=i)
            if round_ == 2:
                p.flush(timeout=TIMEOUT_S)
                cluster.kill(leader, "KILL")
            p.commit_transaction()
            committed += values
    finally:
        p.close(timeout=TIMEOUT_S)
        cluster.start(leader)
    assert sorted(committed_values(cluster, topic, len(committed))) == sorted(committed)


def test_aiokafka_survives_a_killed_coordinator_leader_exactly_once(cluster: LocalCluster) -> None:
    from aiokafka import AIOKafkaProducer

    transactional_id = "aiokafka-failover"
    topic = "aiokafka-failover"
    create_topic(cluster, topic)
    state = cluster.state
    assert state is not None
    leader = cluster.leaders()[shard_for(transactional_id, state.shard_count)]

    async def run() -> list[bytes]:
        p = AIOKafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap(),
            transactional_id=transactional_id,
            enable_idempotence=True,
            request_timeout_ms=int(TIMEOUT_S * 1000),
        )
        committed: list[bytes] = []
        await p.start()
        try:
            for round_ in range(6):
                values = [f"{round_}-{i}".encode() for i in range(PARTITIONS)]
                async with p.transaction():
                    for i, value in enumerate(values):
                        await p.send_and_wait(topic, value=value, partition=i)
                    if round_ == 2:
                        cluster.kill(leader, "KILL")
                committed += values
        finally:
            await p.stop()
        return committed

    try:
        committed = asyncio.run(asyncio.wait_for(run(), TIMEOUT_S * 3))
    finally:
        cluster.start(leader)
    assert sorted(committed_values(cluster, topic, len(committed))) == sorted(committed)


#: A small valid request body per API (fields of other versions are dropped).
MINIMAL_REQUESTS: dict[int, dict[str, Any]] = {
    0: {"acks": -1, "timeout": 1000, "topic_data": []},
    1: {"max_wait": 0, "min_bytes": 0, "max_bytes": 1000, "isolation_level": 1, "topics": []},
    2: {"replica_id": -1, "isolation_level": 1, "topics": []},
    3: {"topics": None},
    8: {"group_id": "g", "generation_id_or_member_epoch": -1, "member_id": "", "topics": []},
    9: {"group_id": "g", "topics": []},
    10: {"key": "k", "key_type": 1},
    # Group requests of a member the group does not know: answered at once.
    11: {
        "group_id": "g",
        "session_timeout": 10_000,
        "rebalance_timeout": 10_000,
        "member_id": "raw-unknown",
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b""}],
    },
    12: {"group_id": "g", "generation_id": 1, "member_id": "raw-unknown"},
    13: {"group_id": "g", "member_id": "raw-unknown", "members": [{"member_id": "raw-unknown"}]},
    14: {"group_id": "g", "generation_id": 1, "member_id": "raw-unknown", "assignments": []},
    15: {"groups": ["g"]},
    # SASL on a PLAINTEXT listener: UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE.
    17: {"mechanism": "PLAIN"},
    18: {"client_software_name": "raw", "client_software_version": "1"},
    19: {"topics": [], "timeout": 1000},
    22: {"transactional_id": None, "transaction_timeout": 1000},
    24: {
        "v3_and_below_transactional_id": "raw",
        "v3_and_below_producer_id": 1,
        "v3_and_below_producer_epoch": 0,
        "v3_and_below_topics": [],
    },
    25: {"transactional_id": "raw", "producer_id": 1, "producer_epoch": 0, "group_id": "g"},
    26: {"transactional_id": "raw", "producer_id": 1, "producer_epoch": 0, "committed": False},
    36: {"auth_bytes": b""},
    # On a cluster without TLS: SECURITY_DISABLED, at once.
    29: {
        "resource_type_filter": 1,
        "resource_name_filter": None,
        "pattern_type_filter": 1,
        "principal_filter": None,
        "host_filter": None,
        "operation": 1,
        "permission_type": 1,
    },
    30: {"creations": []},
    31: {"filters": []},
    28: {
        "transactional_id": "raw",
        "group_id": "g",
        "producer_id": 1,
        "producer_epoch": 0,
        "generation_id": -1,
        "member_id": "",
        "topics": [],
    },
    65: {"transactional_ids": ["raw-described"]},
    66: {"state_filters": [], "producer_id_filters": [], "duration_filter": -1},
}


def test_every_advertised_version_is_answered_in_its_own_version(cluster: LocalCluster) -> None:
    """One request of each API in each version ApiVersions advertises: each
    gets an answer that decodes as that version's response."""
    assert set(MINIMAL_REQUESTS) == set(SUPPORTED)
    # An open transaction to describe: kio's reader refuses the -1 start time
    # Kafka (and the gateway) answer for an id without one.
    described = producer(cluster, "raw-described")
    described.begin_transaction()
    described.produce(TOPIC, value=b"described", partition=0)
    described.flush(TIMEOUT_S)
    correlation_id = 0
    with gateway_socket(cluster) as sock:
        for api_key, (low, high) in sorted(SUPPORTED.items()):
            for version in range(low, high + 1):
                correlation_id += 1
                sock.sendall(
                    request_frame(api_key, version, correlation_id, MINIMAL_REQUESTS[api_key])
                )
                answer = read_frame(sock)
                schema = load_response_schema(api_key, version)
                header, used = entity_reader(schema.__header_schema__)(answer, 0)
                assert header.correlation_id == correlation_id, (api_key, version)
                entity_reader(schema)(answer, used)


def list_offsets(cluster: LocalCluster, topic: str, isolation: int, timestamp: int) -> int:
    """ListOffsets v2 for partition 0 of ``topic`` over a raw connection."""
    body = {
        "replica_id": -1,
        "isolation_level": isolation,
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "timestamp": timestamp}]}],
    }
    with gateway_socket(cluster) as sock:
        sock.sendall(request_frame(2, 2, 7, body))
        answer = read_frame(sock)
    response: Any = entity_reader(load_response_schema(2, 2))(answer, 4)[0]
    [result] = response.topics[0].partitions
    assert int(result.error_code) == 0, result
    return int(result.offset)


def test_list_offsets_answers_the_last_stable_offset_under_read_committed(
    cluster: LocalCluster,
) -> None:
    topic = "stable"
    create_topic(cluster, topic)
    p = producer(cluster, "stable-writer")
    p.begin_transaction()
    p.produce(topic, value=b"committed", partition=0)
    p.commit_transaction(TIMEOUT_S)  # offsets 0 (record) and 1 (marker)
    p.begin_transaction()
    p.produce(topic, value=b"open", partition=0)  # offset 2, still open
    p.flush(TIMEOUT_S)
    earliest, latest, committed = -2, -1, 1
    assert list_offsets(cluster, topic, 0, earliest) == 0
    assert list_offsets(cluster, topic, 0, latest) == 3
    assert list_offsets(cluster, topic, committed, latest) == 2  # the open transaction's start
    p.commit_transaction(TIMEOUT_S)
    # EndTxn answers before the markers are written (as Kafka's): wait for them.
    cluster.wait_until(
        lambda: list_offsets(cluster, topic, committed, latest) == 4,
        TIMEOUT_S,
        "the last stable offset did not pass the committed transaction",
    )


def test_a_simple_consumer_commits_and_fetches_its_offsets(cluster: LocalCluster) -> None:
    """OffsetCommit and OffsetFetch without group membership (assign() only)."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "group.id": "simple-consumer",
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = [TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        consumer.commit(
            offsets=[TopicPartition(TOPIC, 1, 3), TopicPartition(TOPIC, 2, 5)], asynchronous=False
        )
        found = consumer.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], TIMEOUT_S)
        assert [(tp.partition, tp.offset) for tp in found] == [(0, -1001), (1, 3), (2, 5)]
    finally:
        consumer.close()


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_are_read_back_exactly(cluster: LocalCluster, codec: str) -> None:
    topic = f"compressed-{codec}"
    create_topic(cluster, topic)
    p = Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "transactional.id": f"compressing-{codec}",
            "compression.type": codec,
        }
    )
    p.init_transactions(TIMEOUT_S)
    values = [f"{codec}-{i}-".encode() * 20 for i in range(30)]
    p.begin_transaction()
    for i, value in enumerate(values):
        p.produce(topic, value=value, partition=i % PARTITIONS)
    p.commit_transaction(TIMEOUT_S)
    assert sorted(committed_values(cluster, topic, len(values))) == sorted(values)
