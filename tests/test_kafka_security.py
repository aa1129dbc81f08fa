"""The Kafka gateways' TLS listeners with unmodified confluent-kafka.

SASL_SSL (two gateways, so that transactional requests are relayed to the
gateway owning their transactional id, as the client they came from):
alice (SCRAM-SHA-256) runs transactions on her topic and reads them back
with SASL PLAIN; bob (SCRAM-SHA-512) may not write her topic; a wrong
password is refused. SSL: the ``client`` certificate runs a transaction;
a connection without a certificate gets nothing.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator

import confluent_kafka
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from raftcoord.client import Admin
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.kafka import messages as m
from raftcoord.kafka.connections import AUTHENTICATION_TIMEOUT_S
from raftcoord.protocol.acl import Acl, Operation, PatternType, Permission, ResourceType
from raftcoord.protocol.config import load_config
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.routing import stable_hash
from tests.local_cluster import running_cluster
from tests.test_kafka_bounds import rss_bytes
from tests.test_kafka_gateway import read_frame

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TIMEOUT_S = 30.0
PARTITIONS = 4
ALICE = ("SCRAM-SHA-256", "alice", "alice-secret")
BOB = ("SCRAM-SHA-512", "bob", "bob-secret")


@pytest.fixture(scope="module")
def sasl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    path = tmp_path_factory.mktemp("kafka-sasl")
    with running_cluster(
        path, shards=2, partition_nodes=2, kafka_listeners=2, tls=True, kafka_security="SASL_SSL"
    ) as running:
        with Admin(running.bootstrap(), **running.client_tls("admin")) as admin:
            # ACLs first: the writes after them carry them to every coordinator's replica.
            admin.create_acls(
                [
                    Acl(
                        kind,
                        PatternType.PREFIXED,
                        "alice-",
                        "User:alice",
                        "*",
                        Operation.ALL,
                        Permission.ALLOW,
                    )
                    for kind in (
                        ResourceType.TOPIC,
                        ResourceType.TRANSACTIONAL_ID,
                        ResourceType.GROUP,
                    )
                ]
            )
            for mechanism, user, password in (ALICE, BOB):
                admin.upsert_scram_credential(user, mechanism, password)
            admin.create_topics({"alice-orders": PARTITIONS})
        yield running


def transactions(settings: dict[str, str], topic: str, count: int, transactional_id: str) -> None:
    producer = Producer(
        {**settings, "transactional.id": transactional_id, "transaction.timeout.ms": 60_000}
    )
    producer.init_transactions(TIMEOUT_S)
    for n in range(count):
        producer.begin_transaction()
        for partition in range(PARTITIONS):
            producer.produce(topic, f"{transactional_id}-{n}".encode(), partition=partition)
        producer.commit_transaction(TIMEOUT_S)
    producer.flush(TIMEOUT_S)


def committed(settings: dict[str, str], topic: str, expected: int) -> list[bytes]:
    consumer = Consumer(
        {
            **settings,
            "group.id": "alice-readers",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        values: list[bytes] = []
        for _ in range(400):
            if len(values) >= expected:
                break
            msg = consumer.poll(0.25)
            if msg is None:
                continue
            if msg.error() is not None:
                raise KafkaException(msg.error())
            value = msg.value()
            assert value is not None
            values.append(value)
        return values
    finally:
        consumer.close()


def test_sasl_scram_and_plain_users_get_what_their_acls_grant(sasl_cluster: LocalCluster) -> None:
    alice = sasl_cluster.kafka_client_config(sasl=ALICE)
    assert alice["security.protocol"] == "SASL_SSL"
    transactions(alice, "alice-orders", 3, "alice-tx")
    plain = sasl_cluster.kafka_client_config(sasl=("PLAIN", "alice", "alice-secret"))
    values = committed(plain, "alice-orders", 3 * PARTITIONS)
    assert sorted(values) == sorted(f"alice-tx-{n}".encode() for n in range(3) for _ in range(4))

    errors: list[str] = []
    bob = Producer(
        {
            **sasl_cluster.kafka_client_config(sasl=BOB),
            "enable.idempotence": False,
            "message.timeout.ms": 10_000,
        }
    )
    bob.produce(
        "alice-orders",
        b"bob",
        partition=0,
        on_delivery=lambda error, _msg: errors.append(str(error)),
    )
    bob.flush(TIMEOUT_S)
    assert len(errors) == 1 and "TOPIC_AUTHORIZATION_FAILED" in errors[0]


def test_a_wrong_password_is_refused(sasl_cluster: LocalCluster) -> None:
    wrong = sasl_cluster.kafka_client_config(sasl=("SCRAM-SHA-256", "alice", "guess"))
    admin = AdminClient({**wrong, "socket.timeout.ms": 5_000})
    with pytest.raises(KafkaException) as refused:
        admin.list_topics(timeout=5)
    assert refused.value.args[0].code() in (
        confluent_kafka.KafkaError._AUTHENTICATION,
        confluent_kafka.KafkaError._TRANSPORT,
        confluent_kafka.KafkaError._TIMED_OUT,
    )


def gateway_address(cluster: LocalCluster) -> tuple[str, int]:
    host, port = cluster.kafka_gateways()[0].kafka.rsplit(":", 1)
    return host, int(port)


def strangers(address: tuple[str, int], count: int, source: str) -> list[socket.socket]:
    """``count`` connections to ``address`` from ``source`` that say nothing."""
    made = []
    for _ in range(count):
        connection = socket.socket()
        connection.bind((source, 0))
        connection.connect(address)
        made.append(connection)
    return made


def test_strangers_announcing_frames_before_sasl_hold_up_no_logged_in_client(
    sasl_cluster: LocalCluster,
) -> None:
    """80 connections that finish TLS and announce a frame before SASL
    (Kafka's bound, 512 KiB, over this gateway's, or this gateway's 64 KiB),
    then send one byte of it: the first are closed at once, the others'
    frames draw on a budget of their own, so alice's logins and
    transactions go on; and the gateway closes them all by the
    authentication deadline."""
    address = gateway_address(sasl_cluster)
    settings = sasl_cluster.kafka_client_config(sasl=ALICE)
    context = ssl.create_default_context(cafile=settings["ssl.ca.location"])
    context.check_hostname = False
    held = []
    try:
        for _ in range(80):
            raw = socket.create_connection(address, timeout=TIMEOUT_S)
            wrapped = context.wrap_socket(raw, server_hostname=address[0])
            announced = (512 if len(held) % 2 else 64) * 1024
            wrapped.sendall(announced.to_bytes(4, "big") + b"\x00")
            held.append(wrapped)
        transactions(settings, "alice-orders", 2, "alice-held-up")
        closed_by = time.monotonic() + AUTHENTICATION_TIMEOUT_S + 5
        for connection in held:  # by the deadline (10 s from the accept), each is closed
            connection.settimeout(max(0.1, closed_by - time.monotonic()))
            try:
                assert connection.recv(1) == b""
            except (ConnectionResetError, ssl.SSLError):
                pass
    finally:
        for connection in held:
            connection.close()


#: What 2,000 connections that never start TLS may cost the gateway, at most:
#: 256 in their handshake (a 256 KiB buffer each), the rest closed at once.
MEMORY_BOUND = 128 << 20


def test_two_thousand_silent_connections_are_closed_at_the_deadline(
    sasl_cluster: LocalCluster,
) -> None:
    """2,000 TCP connections that never start TLS: counted from the accept
    (the TLS handshake after), those beyond the places for handshakes (64
    per address, 256 in all) closed at once, the others by the
    authentication deadline; the gateway's memory stays bounded (asyncio
    gives a connection in its TLS handshake a 256 KiB buffer), and logins
    work again then."""
    address = gateway_address(sasl_cluster)
    gateway = sasl_cluster.kafka_gateways()[0]
    silent: list[socket.socket] = []
    try:
        before = rss_bytes(gateway.pid)
        for source in range(4):
            silent += strangers(address, 500, f"127.0.0.{10 + source}")
        grown = rss_bytes(gateway.pid) - before
        print(f"2,000 connections that never start TLS: the gateway grew {grown >> 10} KiB")
        assert grown < MEMORY_BOUND
        closed_by = time.monotonic() + AUTHENTICATION_TIMEOUT_S + 5
        for connection in silent:
            connection.settimeout(max(0.1, closed_by - time.monotonic()))
            try:
                assert connection.recv(1) == b""
            except ConnectionResetError:
                pass
    finally:
        for connection in silent:
            connection.close()
    transactions(sasl_cluster.kafka_client_config(sasl=ALICE), "alice-orders", 1, "alice-after")


@pytest.fixture(scope="module")
def ssl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    path = tmp_path_factory.mktemp("kafka-ssl")
    with running_cluster(
        path, shards=1, partition_nodes=1, kafka_listeners=2, tls=True, kafka_security="SSL"
    ) as running:
        with Admin(running.bootstrap(), **running.client_tls("admin")) as admin:
            admin.create_topics({"orders": PARTITIONS})
        yield running


def test_an_ssl_client_certificate_runs_a_transaction(ssl_cluster: LocalCluster) -> None:
    settings = ssl_cluster.kafka_client_config("client")  # granted a workload's rights
    assert settings["security.protocol"] == "SSL"
    transactions(settings, "orders", 2, "ssl-tx")
    assert len(committed(settings, "orders", 2 * PARTITIONS)) == 2 * PARTITIONS
    without_certificate = {
        k: v for k, v in settings.items() if not k.startswith(("ssl.certificate", "ssl.key"))
    }
    admin = AdminClient({**without_certificate, "socket.timeout.ms": 5_000})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)


def test_a_relayed_request_keeps_its_clients_rights(ssl_cluster: LocalCluster) -> None:
    """A certificate with no ACLs asks the gateway that does not own a
    transactional id for its producer id: the request is relayed to the
    owner, which must judge it as that client's, not as the relaying node's."""
    files = ssl_cluster.client_tls("dave")  # no rights
    gateways = ssl_cluster.kafka_gateways()
    for asked in gateways:
        other = next(g for g in gateways if g is not asked)
        listeners = load_config(ssl_cluster.data_dir / "cluster.toml").kafka_listeners
        index = [k.node_id for k in listeners].index(other.node_id)
        transactional_id = next(
            f"dave-{i}" for i in range(1000) if stable_hash(f"dave-{i}") % len(listeners) == index
        )
        context = ssl.create_default_context(cafile=files["ssl_cafile"])
        context.load_cert_chain(files["ssl_certfile"], files["ssl_keyfile"])
        host, port = asked.kafka.rsplit(":", 1)
        with (
            socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as raw,
            context.wrap_socket(raw, server_hostname=host) as sock,
        ):
            body = {"transactional_id": transactional_id, "transaction_timeout": 60_000}
            sock.sendall(m.encode_request(m.INIT_PRODUCER_ID, 1, 7, "raw", body))
            answer = m.decode_response(m.INIT_PRODUCER_ID, 1, read_frame(sock))
        assert int(answer.error_code) == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
