"""Kafka consumer groups through the Kafka gateway, with unmodified clients.

confluent-kafka (librdkafka): consume-transform-produce with ``subscribe()``
and ``send_offsets_to_transaction(offsets, consumer.consumer_group_metadata())``
while a second consumer joins the group in the middle, exactly once; the
same with the group's coordinator leader killed (SIGKILL) mid-run; a zombie
(a generation the group has left behind, or a static member replaced by a
newer instance) has its offsets fenced with ILLEGAL_GENERATION or
FENCED_INSTANCE_ID. kafka-python and aiokafka: consumer groups with
``subscribe()`` read a topic and commit their offsets.
"""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.serial import entity_reader

from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.routing import shard_for
from tests.local_cluster import running_cluster
from tests.test_kafka_gateway import gateway_socket, read_frame, request_frame

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import (  # noqa: E402
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]  # noqa: E402

from tests.kafka_admin import create_kafka_topics  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PARTITIONS = 4
TIMEOUT_S = 30.0
#: How long a test waits for its workers' progress.
PROGRESS_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """3 coordinators, 3 shards, 2 partition-log nodes, 2 gateways (so that
    group and transactional requests reach gateways that relay them)."""
    path: Path = tmp_path_factory.mktemp("kafka-groups")
    with running_cluster(path, partition_nodes=2, kafka_listeners=2) as running:
        yield running


def create_topics(cluster: LocalCluster, *topics: str) -> None:
    create_kafka_topics(cluster, PARTITIONS, *topics, timeout_s=TIMEOUT_S)


def produce_inputs(cluster: LocalCluster, topic: str, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": cluster.kafka_bootstrap(), "enable.idempotence": True})
    for i, value in enumerate(values):
        p.produce(topic, value=value, partition=i % PARTITIONS)
    assert p.flush(TIMEOUT_S) == 0


def group_consumer(cluster: LocalCluster, group: str, **extra: object) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            **extra,
        }
    )


def committed_values(cluster: LocalCluster, topic: str, expected: int) -> list[bytes]:
    """Every committed value of ``topic`` (read_committed, assign(), no group)."""
    consumer = group_consumer(cluster, "reader", **{"enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        values: list[bytes] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        while len(at_end) < PARTITIONS or len(values) < expected:
            assert time.monotonic() < deadline, f"read {len(values)} of {expected} records"
            msg = consumer.poll(0.25)
            if msg is None:
                continue
            error, partition = msg.error(), msg.partition()
            assert partition is not None
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
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


def group_offsets(cluster: LocalCluster, group: str, topic: str) -> list[int]:
    """The group's committed offset per partition of ``topic`` (OffsetFetch)."""
    consumer = group_consumer(cluster, group)
    try:
        found = committed(consumer, [TopicPartition(topic, p) for p in range(PARTITIONS)])
        return [tp.offset for tp in found]
    finally:
        consumer.close()


#: What OffsetFetch answers while the group's coordinator moves: librdkafka
#: hands these to the caller of committed(), which asks again.
COORDINATOR_MOVING = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError._TIMED_OUT,
)


def committed(consumer: Consumer, partitions: list[TopicPartition]) -> list[TopicPartition]:
    """The group's committed offsets of ``partitions``, asked again while the
    group's coordinator moves."""
    deadline = time.monotonic() + PROGRESS_TIMEOUT_S
    while True:
        try:
            return consumer.committed(partitions, TIMEOUT_S)
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() not in COORDINATOR_MOVING or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


@dataclass
class Worker:
    """A consume-transform-produce loop in a thread: a group member reading
    ``source`` and a transactional producer writing ``b"out:" + value`` to
    ``sink``, the consumed offsets sent in the same transaction."""

    cluster: LocalCluster
    name: str
    group: str
    source: str
    sink: str
    stop: threading.Event = field(default_factory=threading.Event)
    assigned: list[list[int]] = field(default_factory=list)
    revoked: int = 0
    commits: int = 0
    aborts: int = 0
    failure: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(TIMEOUT_S * 2)
        assert not self.thread.is_alive(), f"{self.name} did not stop"
        if self.failure is not None:
            raise self.failure

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # reported by join()
            self.failure = exc

    def _loop(self) -> None:
        consumer = group_consumer(self.cluster, self.group)
        producer = Producer(
            {
                "bootstrap.servers": self.cluster.kafka_bootstrap(),
                "transactional.id": f"{self.group}-{self.name}",
                "transaction.timeout.ms": 60_000,
            }
        )
        producer.init_transactions(TIMEOUT_S)

        def on_assign(c: Consumer, partitions: list[TopicPartition]) -> None:
            self.assigned.append(sorted(tp.partition for tp in partitions))

        def on_revoke(c: Consumer, partitions: list[TopicPartition]) -> None:
            self.revoked += 1

        consumer.subscribe([self.source], on_assign=on_assign, on_revoke=on_revoke)
        try:
            while not self.stop.is_set():
                messages = consumer.consume(5, 0.2)
                records = [m for m in messages if m.error() is None]
                if not records:
                    continue
                try:
                    producer.begin_transaction()
                    for m in records:
                        producer.produce(self.sink, value=b"out:" + (m.value() or b""))
                    positions = consumer.position(consumer.assignment())
                    metadata = consumer.consumer_group_metadata()
                    retrying(producer.send_offsets_to_transaction, positions, metadata, TIMEOUT_S)
                    retrying(producer.commit_transaction, TIMEOUT_S)
                    self.commits += 1
                except KafkaException as exc:
                    error = exc.args[0]
                    if error.fatal() or not error.txn_requires_abort():
                        raise
                    retrying(producer.abort_transaction, TIMEOUT_S)
                    self.aborts += 1
                    rewind(consumer)
        finally:
            consumer.close()


def retrying(call: Callable[..., None], *args: Any) -> None:
    """``call(*args)``, made again while it fails with a retriable error that does
    not require an abort (as librdkafka's documentation asks)."""
    for _ in range(20):
        try:
            call(*args)
            return
        except KafkaException as exc:
            error = exc.args[0]
            if not error.retriable() or error.txn_requires_abort():
                raise
    pytest.fail("a transactional call stayed retriable")


def rewind(consumer: Consumer) -> None:
    """Seek every assigned partition back to the group's committed offset
    (after an aborted transaction, its records must be read again)."""
    assignment = consumer.assignment()
    if not assignment:
        return
    for tp in committed(consumer, assignment):
        if tp.offset < 0:
            tp.offset = confluent_kafka.OFFSET_BEGINNING
        consumer.seek(tp)


def wait_until(condition: object, what: str, workers: list[Worker]) -> None:
    deadline = time.monotonic() + PROGRESS_TIMEOUT_S
    while not condition():  # type: ignore[operator]
        for w in workers:
            if w.failure is not None:
                raise w.failure
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def run_with_a_rebalance(
    cluster: LocalCluster, group: str, kill: int | None = None
) -> tuple[list[bytes], list[Worker]]:
    """Half of the input read by one worker, then a second worker joins while
    the other half is written (``kill``: that node is killed with SIGKILL
    when the second half starts). Returns the input and the workers."""
    source, sink = f"{group}-in", f"{group}-out"
    create_topics(cluster, source, sink)
    inputs = [f"{group}-{i}".encode() for i in range(120)]
    half = len(inputs) // 2
    produce_inputs(cluster, source, inputs[:half])
    first = Worker(cluster, "first", group, source, sink)
    second = Worker(cluster, "second", group, source, sink)
    workers = [first, second]
    first.start()
    try:
        wait_until(
            lambda: sum(max(o, 0) for o in group_offsets(cluster, group, source)) >= half // 2,
            "the first worker's progress",
            workers,
        )
        second.start()
        if kill is not None:
            cluster.kill(kill, "KILL")
        produce_inputs(cluster, source, inputs[half:])
        wait_until(lambda: bool(second.assigned and second.assigned[-1]), "a rebalance", workers)
        ends = [len(range(p, len(inputs), PARTITIONS)) for p in range(PARTITIONS)]
        wait_until(
            lambda: group_offsets(cluster, group, source) == ends,
            "every input's offset committed",
            workers,
        )
    finally:
        for w in workers:
            if w.thread is not None:
                w.join()
    return inputs, workers


def assert_exactly_once(cluster: LocalCluster, group: str, inputs: list[bytes]) -> None:
    outputs = committed_values(cluster, f"{group}-out", len(inputs))
    assert sorted(outputs) == sorted(b"out:" + v for v in inputs)


def test_consume_transform_produce_with_a_rebalance_is_exactly_once(
    cluster: LocalCluster,
) -> None:
    group = "ctp"
    inputs, (first, second) = run_with_a_rebalance(cluster, group)
    assert first.revoked >= 1, "the first worker's partitions were never revoked"
    assert second.assigned[-1], "the second worker never got a partition"
    assert_exactly_once(cluster, group, inputs)


def test_a_killed_group_coordinator_leader_is_survived_exactly_once(
    cluster: LocalCluster,
) -> None:
    group = "ctp-failover"
    state = cluster.state
    assert state is not None
    leader = cluster.leaders()[shard_for(group, state.shard_count)]
    try:
        inputs, _ = run_with_a_rebalance(cluster, group, kill=leader)
    finally:
        cluster.start(leader)  # the cluster serves the module's other tests
    assert_exactly_once(cluster, group, inputs)


def joined(consumer: Consumer, what: str) -> None:
    """Poll ``consumer`` until the group gave it an assignment."""
    deadline = time.monotonic() + PROGRESS_TIMEOUT_S
    while not consumer.assignment():
        assert time.monotonic() < deadline, f"{what} never joined"
        consumer.poll(0.1)


def fenced_offsets(
    cluster: LocalCluster, group: str, metadata: object, code: int, topic: str
) -> None:
    """A transaction sending offsets with the zombie's ``metadata`` fails
    with ``code`` and commits no offset."""
    producer = Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "transactional.id": f"{group}-zombie",
            "transaction.timeout.ms": 60_000,
        }
    )
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    with pytest.raises(KafkaException) as raised:
        producer.send_offsets_to_transaction([TopicPartition(topic, 0, 1)], metadata, TIMEOUT_S)
    assert raised.value.args[0].code() == code, raised.value.args[0]
    producer.abort_transaction(TIMEOUT_S)
    assert group_offsets(cluster, group, topic)[0] < 0


def test_a_zombie_generation_has_its_offsets_fenced(cluster: LocalCluster) -> None:
    """A generation left behind is ILLEGAL_GENERATION; Kafka's admin client
    then describes the group with both members (DescribeGroups)."""
    group, topic = "zombie-generation", "zombie-generation-in"
    create_topics(cluster, topic)
    zombie = group_consumer(cluster, group)
    successor = group_consumer(cluster, group)
    try:
        zombie.subscribe([topic])
        joined(zombie, "the first member")
        stale = zombie.consumer_group_metadata()
        successor.subscribe([topic])
        deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        while not (zombie.assignment() and successor.assignment()):  # a new generation
            assert time.monotonic() < deadline, "no rebalance"
            zombie.poll(0.1)
            successor.poll(0.1)
        fenced_offsets(cluster, group, stale, KafkaError.ILLEGAL_GENERATION, topic)
        admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap()})
        [described] = admin.describe_consumer_groups([group], request_timeout=TIMEOUT_S).values()
        description = described.result(timeout=TIMEOUT_S)
        assert len(description.members) == 2
        assert str(description.state).endswith("STABLE"), description.state
    finally:
        zombie.close()
        successor.close()


def test_a_replaced_static_member_has_its_offsets_fenced(cluster: LocalCluster) -> None:
    group, topic = "zombie-instance", "zombie-instance-in"
    create_topics(cluster, topic)
    zombie = group_consumer(cluster, group, **{"group.instance.id": "static-1"})
    try:
        zombie.subscribe([topic])
        joined(zombie, "the static member")
        stale = zombie.consumer_group_metadata()
    finally:
        # Closing a static member does not leave the group (KIP-345).
        zombie.close()
    successor = group_consumer(cluster, group, **{"group.instance.id": "static-1"})
    try:
        successor.subscribe([topic])
        joined(successor, "the new instance")
        fenced_offsets(cluster, group, stale, KafkaError.FENCED_INSTANCE_ID, topic)
    finally:
        successor.close()


def test_a_waiting_join_holds_up_no_other_connection(cluster: LocalCluster) -> None:
    """A second member's JoinGroup waits until the first member joins again;
    meanwhile the gateway answers other connections, and the first member's
    heartbeat is told to rejoin (REBALANCE_IN_PROGRESS)."""
    group = "raw-waiting"

    def join(sock: Any, member_id: str, correlation_id: int) -> None:
        body = {
            "group_id": group,
            "session_timeout": 60_000,
            "rebalance_timeout": 60_000,
            "member_id": member_id,
            "group_instance_id": None,
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}],
        }
        sock.sendall(request_frame(11, 5, correlation_id, body))

    def join_with_id(sock: Any) -> str:
        join(sock, "", 1)
        first_answer = answer(sock, 11, 5)
        assert int(first_answer.error_code) == ErrorCode.MEMBER_ID_REQUIRED
        return str(first_answer.member_id)

    with gateway_socket(cluster) as first, gateway_socket(cluster) as second:
        first_id = join_with_id(first)
        join(first, first_id, 2)
        joined_first = answer(first, 11, 5)
        assert int(joined_first.error_code) == ErrorCode.NONE
        second_id = join_with_id(second)
        join(second, second_id, 2)  # waits for the first member
        heartbeat = {
            "group_id": group,
            "generation_id": joined_first.generation_id,
            "member_id": first_id,
            "group_instance_id": None,
        }
        deadline = time.monotonic() + TIMEOUT_S
        while int(answer_of(first, request_frame(12, 3, 3, heartbeat), 12, 3)) == 0:
            assert time.monotonic() < deadline, "the first member was never asked to rejoin"
        with gateway_socket(cluster) as other:
            other.sendall(request_frame(3, 1, 7, {"topics": None}))
            assert read_frame(other)[:4] == (7).to_bytes(4, "big")
        assert select.select([second], [], [], 0)[0] == [], "the second join did not wait"
        join(first, first_id, 4)
        rejoined = answer(first, 11, 5)
        joined_second = answer(second, 11, 5)
    assert int(rejoined.error_code) == int(joined_second.error_code) == ErrorCode.NONE
    assert rejoined.generation_id == joined_second.generation_id > joined_first.generation_id


@pytest.mark.parametrize("version", [0, 3])
def test_a_join_of_a_version_before_member_ids_were_required_completes(
    cluster: LocalCluster, version: int
) -> None:
    """JoinGroup before v4 knows no MEMBER_ID_REQUIRED: a first join with an
    empty member id completes with the member id the coordinator assigned."""
    body = {
        "group_id": f"raw-old-join-{version}",
        "session_timeout": 10_000,
        "rebalance_timeout": 10_000,
        "member_id": "",
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b""}],
    }
    with gateway_socket(cluster) as sock:
        sock.sendall(request_frame(11, version, 1, body))
        joined = answer(sock, 11, version)
    assert int(joined.error_code) == ErrorCode.NONE
    assert joined.member_id and joined.leader == joined.member_id
    assert joined.generation_id >= 1


def answer(sock: Any, api_key: int, version: int) -> Any:
    """The next answer on ``sock``, of a non-flexible ``version`` of ``api_key``."""
    return entity_reader(load_response_schema(api_key, version))(read_frame(sock), 4)[0]


def answer_of(sock: Any, frame: bytes, api_key: int, version: int) -> int:
    """The error code of the answer to ``frame``."""
    sock.sendall(frame)
    code = int(answer(sock, api_key, version).error_code)
    assert code in (ErrorCode.NONE, ErrorCode.REBALANCE_IN_PROGRESS), code
    return code


def test_kafka_python_consumer_group_reads_and_commits(cluster: LocalCluster) -> None:
    kafka = pytest.importorskip("kafka")
    group, topic = "kafka-python-group", "kafka-python-group-in"
    create_topics(cluster, topic)
    inputs = [f"kp-{i}".encode() for i in range(20)]
    produce_inputs(cluster, topic, inputs)
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap(),
        group_id=group,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
    )
    try:
        consumer.subscribe([topic])
        values: list[bytes] = []
        deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        while len(values) < len(inputs):
            assert time.monotonic() < deadline, f"read {len(values)} of {len(inputs)}"
            for records in consumer.poll(timeout_ms=200).values():
                values += [r.value for r in records]
        consumer.commit()
    finally:
        consumer.close()
    assert sorted(values) == sorted(inputs)
    assert group_offsets(cluster, group, topic) == [5] * PARTITIONS


def test_aiokafka_consumer_group_reads_and_commits(cluster: LocalCluster) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    group, topic = "aiokafka-group", "aiokafka-group-in"
    create_topics(cluster, topic)
    inputs = [f"aio-{i}".encode() for i in range(20)]
    produce_inputs(cluster, topic, inputs)

    async def run() -> list[bytes]:
        consumer = aiokafka.AIOKafkaConsumer(
            topic,
            bootstrap_servers=cluster.kafka_bootstrap(),
            group_id=group,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )
        await consumer.start()
        values: list[bytes] = []
        try:
            while len(values) < len(inputs):
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    values += [r.value for r in records]
            await consumer.commit()
        finally:
            await consumer.stop()
        return values

    values = asyncio.run(asyncio.wait_for(run(), PROGRESS_TIMEOUT_S))
    assert sorted(values) == sorted(inputs)
    assert group_offsets(cluster, group, topic) == [5] * PARTITIONS


def test_find_coordinator_answers_while_no_coordinator_can(cluster: LocalCluster) -> None:
    """FindCoordinator names the gateway asked, for any key, without asking
    the coordinators, so that it answers while a shard elects its leader
    (here: with every coordinator down). librdkafka gives up the coordinator lookup
    of a TxnOffsetCommit after three COORDINATOR_NOT_AVAILABLE answers, and
    a producer then hung in ``send_offsets_to_transaction`` (docs/kafka.md,
    "Coordinators"). Last in the module: it restarts every coordinator."""
    coordinators = [n.node_id for n in cluster.coordinators()]
    gateways = cluster.kafka_gateways()
    for node_id in coordinators:
        cluster.kill(node_id, "KILL")
    try:
        for key_type, key in ((0, "a-group"), (1, "a-transactional-id")):
            for gateway in gateways:  # each gateway names itself
                host, port = gateway.kafka.rsplit(":", 1)
                with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
                    sock.sendall(request_frame(10, 1, 1, {"key": key, "key_type": key_type}))
                    found = answer(sock, 10, 1)
                assert int(found.error_code) == ErrorCode.NONE, found
                assert (found.node_id, f"{found.host}:{found.port}") == (
                    gateway.node_id,
                    gateway.kafka,
                )
    finally:
        for node_id in coordinators:
            cluster.start(node_id)
        cluster.wait_for_leaders()
