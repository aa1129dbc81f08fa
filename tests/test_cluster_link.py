"""Calls between the cluster's nodes over connections of their own
(raftcoord.protocol.cluster_link) on loopback: answers in order over one
connection, each method to its own answer, refuses what it cannot trust
(oversized or undecodable frames, unknown methods, strangers under TLS, too
many connections) without stopping for the others, and turns every failure
on the caller's side into a LinkError."""

from __future__ import annotations

import socket
import ssl
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from fsm.metadata import TopicPartition
from fsm.partitions import PartitionRegistration, TopicRegistration
from partition_log.replica_fetcher import ConnectionLink, GrpcLink
from raftcoord.cluster import certs
from raftcoord.coordinator.services.common import partition_result
from raftcoord.coordinator.services.topics import _missing
from raftcoord.protocol import cluster_link
from raftcoord.protocol.cluster_link import (
    ADD_PARTITIONS_TO_TXN,
    REPLICA_FETCH,
    WRITE_TXN_MARKERS,
    ClusterLink,
    ClusterListener,
    LinkError,
)
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2, partition_log_pb2

NODES = {"User:node-1", "User:node-2"}


def request(*partitions: int, max_bytes: int = 1024) -> Any:
    message = partition_log_pb2.ReplicaFetchRequest(
        replica_id=2, max_wait_ms=0, partition_max_bytes=max_bytes
    )
    for p in partitions:
        message.partitions.add(topic="t", partition=p, fetch_offset=p * 10)
    return message


class Echo:
    """Answers each fetch with its partitions, noting the thread that answered
    (a stranger's, ``refused``, gets CLUSTER_AUTHORIZATION_FAILED as the
    partition-log service answers it) and the timeout each caller named."""

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.refused: list[str] = []
        self.timeouts: list[float] = []
        self.records = b""

    def __call__(self, request: Any, refused: str | None = None, timeout_s: float = 0.0) -> Any:
        if refused is not None:
            self.refused.append(refused)
            return partition_log_pb2.ReplicaFetchResponse(
                error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=refused
            )
        self.threads.append(threading.get_ident())
        self.timeouts.append(timeout_s)
        answer = partition_log_pb2.ReplicaFetchResponse()
        for entry in request.partitions:
            answer.partitions.add(
                topic=entry.topic,
                partition=entry.partition,
                high_watermark=entry.fetch_offset,
                records=self.records,
            )
        return answer


def markers_answer(request: Any, refused: str | None, timeout_s: float) -> Any:
    """Each marker's partitions answered with NONE."""
    answer = partition_log_pb2.WriteTxnMarkersResponse()
    for marker in request.markers:
        result = answer.markers.add(producer_id=marker.producer_id)
        for topic in marker.topics:
            for index in topic.partitions:
                result.partitions.add(topic=topic.topic, partition=index)
    return answer


def fetch_link(address: str, tls: ssl.SSLContext | None) -> ConnectionLink:
    """A follower's link to a leader's replication address."""
    return ConnectionLink(ClusterLink(address, tls))


def listen(
    answer: Any, tls: Any = None, allowed: Any = None, max_connections: int = 4
) -> ClusterListener:
    listener = ClusterListener(
        ("127.0.0.1", 0),
        {REPLICA_FETCH: answer, WRITE_TXN_MARKERS: markers_answer},
        tls=tls,
        allowed=allowed or (lambda who: True),
        max_connections=max_connections,
        label="node=1",
    )
    listener.start()
    return listener


@pytest.fixture
def echo() -> Echo:
    return Echo()


@pytest.fixture
def listener(echo: Echo) -> Iterator[ClusterListener]:
    running = listen(echo)
    yield running
    running.stop()


def closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_fetches_are_answered_in_order_over_one_connection(
    listener: ClusterListener, echo: Echo
) -> None:
    link = fetch_link(f"127.0.0.1:{listener.port}", None)
    try:
        for i in range(5):
            answer = link.fetch(request(i, i + 1), timeout_s=5)
            assert [(p.partition, p.high_watermark) for p in answer.partitions] == [
                (i, i * 10),
                (i + 1, (i + 1) * 10),
            ]
    finally:
        link.close()
    assert len(set(echo.threads)) == 1, "one connection, one leader thread"


def test_an_oversized_or_undecodable_request_ends_only_its_connection(
    listener: ClusterListener,
) -> None:
    for garbage in (
        struct.pack(">IIBI", REPLICA_FETCH.max_request_bytes + 1, 1, REPLICA_FETCH.number, 0),
        struct.pack(">IIBI", 2, 1, REPLICA_FETCH.number, 0) + b"\xff\xff",
        struct.pack(">IIBI", 0, 1, 99, 0),  # no such method
    ):
        with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as stranger:
            stranger.sendall(garbage)
            assert closed_by_peer(stranger)
    link = fetch_link(f"127.0.0.1:{listener.port}", None)
    try:
        assert link.fetch(request(3), timeout_s=5).partitions[0].partition == 3
    finally:
        link.close()


def test_an_answer_over_what_the_request_allows_is_not_read(
    listener: ClusterListener, echo: Echo
) -> None:
    echo.records = b"r" * (REPLICA_FETCH.response_limit(request(0, max_bytes=10)) + 1)
    link = fetch_link(f"127.0.0.1:{listener.port}", None)
    try:
        with pytest.raises(LinkError, match="at most"):
            link.fetch(request(0, max_bytes=10), timeout_s=5)
        echo.records = b""
        assert link.fetch(request(1), timeout_s=5).partitions[0].partition == 1  # dials again
    finally:
        link.close()


def test_no_listener_or_a_stopped_one_is_a_link_error(echo: Echo) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]  # nobody listens there
        with pytest.raises(LinkError):
            fetch_link(f"127.0.0.1:{port}", None).fetch(request(0), timeout_s=5)
    running = listen(echo)
    link = fetch_link(f"127.0.0.1:{running.port}", None)
    try:
        link.fetch(request(0), timeout_s=5)
        running.stop()
        with pytest.raises(LinkError):
            link.fetch(request(0), timeout_s=5)
    finally:
        link.close()


def test_connections_over_the_limit_are_closed_at_once(echo: Echo) -> None:
    running = listen(echo, max_connections=1)
    first = fetch_link(f"127.0.0.1:{running.port}", None)
    try:
        first.fetch(request(0), timeout_s=5)
        with pytest.raises(LinkError):
            fetch_link(f"127.0.0.1:{running.port}", None).fetch(request(0), timeout_s=5)
        assert first.fetch(request(1), timeout_s=5).partitions[0].partition == 1
    finally:
        first.close()
        running.stop()


def test_a_silent_connection_is_closed_after_the_handshake_timeout(
    echo: Echo, monkeypatch: pytest.MonkeyPatch, tls_files: dict[str, Any]
) -> None:
    monkeypatch.setattr(cluster_link, "HANDSHAKE_TIMEOUT_S", 0.2)
    running = listen(echo, tls=tls_files["server"])
    try:
        with socket.create_connection(("127.0.0.1", running.port), timeout=5) as silent:
            assert closed_by_peer(silent)
    finally:
        running.stop()


# --- TLS -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("certs")
    ca = certs.make_ca(directory)
    certs.issue(ca, directory, "node-1", "node-1", ["127.0.0.1"])
    certs.issue(ca, directory, "node-2", "node-2", ["127.0.0.1"])
    certs.issue(ca, directory, "client", "client", [])
    other = tmp_path_factory.mktemp("other")
    certs.issue(certs.make_ca(other, "another CA"), other, "node-2", "node-2", [])

    def context(server: bool, name: str, where: Path = directory) -> ssl.SSLContext:
        made = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
        made.load_cert_chain(where / f"{name}.pem", where / f"{name}.key")
        made.load_verify_locations(cafile=directory / "ca.pem")
        made.verify_mode = ssl.CERT_REQUIRED
        return made

    return {
        "server": context(True, "node-1"),
        "node": context(False, "node-2"),
        "client": context(False, "client"),
        "foreign": context(False, "node-2", other),
    }


@pytest.fixture
def tls_listener(echo: Echo, tls_files: dict[str, Any]) -> Iterator[ClusterListener]:
    running = listen(echo, tls=tls_files["server"], allowed=lambda who: who in NODES)
    yield running
    running.stop()


def test_under_tls_a_node_of_the_cluster_fetches(
    tls_listener: ClusterListener, tls_files: dict[str, Any]
) -> None:
    link = fetch_link(f"127.0.0.1:{tls_listener.port}", tls_files["node"])
    try:
        for i in range(3):
            assert link.fetch(request(i), timeout_s=5).partitions[0].partition == i
    finally:
        link.close()


def test_under_tls_another_principal_is_refused_once_and_cut_off(
    tls_listener: ClusterListener, tls_files: dict[str, Any], echo: Echo
) -> None:
    link = fetch_link(f"127.0.0.1:{tls_listener.port}", tls_files["client"])
    try:
        answer = link.fetch(request(0), timeout_s=5)
        assert answer.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        assert "User:client" in answer.error_message and not answer.partitions
        with pytest.raises(LinkError):
            link.fetch(request(0), timeout_s=5)
    finally:
        link.close()
    assert echo.threads == [], "nothing was answered for a stranger"
    assert len(echo.refused) == 1 and "User:client" in echo.refused[0]


@pytest.mark.parametrize("who", ["foreign", "plaintext"])
def test_under_tls_a_peer_without_a_certificate_of_the_ca_gets_nothing(
    tls_listener: ClusterListener, tls_files: dict[str, Any], echo: Echo, who: str
) -> None:
    link = fetch_link(
        f"127.0.0.1:{tls_listener.port}", None if who == "plaintext" else tls_files[who]
    )
    try:
        with pytest.raises(LinkError):
            link.fetch(request(0), timeout_s=5)
    finally:
        link.close()
    assert echo.threads == []


def test_strangers_in_their_handshake_do_not_take_a_connected_nodes_place(
    echo: Echo, tls_files: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_link, "MAX_HANDSHAKES", 2)
    running = listen(echo, tls=tls_files["server"], allowed=lambda who: who in NODES)
    node = fetch_link(f"127.0.0.1:{running.port}", tls_files["node"])
    strangers = []
    try:
        node.fetch(request(0), timeout_s=5)
        # Silent connections fill the handshake places, then one more is turned away.
        strangers = [socket.create_connection(("127.0.0.1", running.port)) for _ in range(3)]
        assert closed_by_peer(strangers[-1])
        assert node.fetch(request(1), timeout_s=5).partitions[0].partition == 1
    finally:
        for stranger in strangers:
            stranger.close()
        node.close()
        running.stop()


def test_the_grpc_link_of_a_config_without_replication_addresses() -> None:
    class Unavailable(grpc.RpcError):
        pass

    class Stub:
        def __init__(self) -> None:
            self.fail = False

        def ReplicaFetch(self, request: Any, timeout: float) -> Any:
            if self.fail:
                raise Unavailable("UNAVAILABLE")
            return Echo()(request)

    stub = Stub()
    link = GrpcLink(lambda: stub)
    assert link.fetch(request(4), timeout_s=1).partitions[0].partition == 4
    stub.fail = True
    with pytest.raises(LinkError, match="UNAVAILABLE"):
        link.fetch(request(4), timeout_s=1)
    link.close()


def test_each_method_is_answered_by_its_own_answer_on_one_connection(
    listener: ClusterListener, echo: Echo
) -> None:
    """A coordinator's markers and a fetch share a listener; each request
    carries the caller's timeout to its answer."""
    link = ClusterLink(f"127.0.0.1:{listener.port}", None)
    markers = partition_log_pb2.WriteTxnMarkersRequest()
    marker = markers.markers.add(producer_id=7)
    marker.topics.add(topic="t", partitions=[0, 1])
    try:
        answered = link.call(WRITE_TXN_MARKERS, markers, 5.0)
        assert [(p.topic, p.partition) for p in answered.markers[0].partitions] == [
            ("t", 0),
            ("t", 1),
        ]
        fetched = link.call(REPLICA_FETCH, request(2), 2.5)
        assert fetched.partitions[0].partition == 2
    finally:
        link.close()
    assert echo.timeouts == [2.5]


def test_closing_a_link_ends_a_call_in_flight_at_once(echo: Echo) -> None:
    """A coordinator whose leadership ended closes its writer's links from
    another thread: the call waiting for its answer ends, and none follows."""
    answering = threading.Event()
    release = threading.Event()

    def slow(request: Any, refused: str | None, timeout_s: float) -> Any:
        answering.set()
        release.wait(10)
        return echo(request, refused, timeout_s)

    running = listen(slow)
    link = fetch_link(f"127.0.0.1:{running.port}", None)
    failed: list[BaseException] = []

    def call() -> None:
        try:
            link.fetch(request(0), timeout_s=30)
        except LinkError as exc:
            failed.append(exc)

    caller = threading.Thread(target=call)
    try:
        caller.start()
        assert answering.wait(10)
        link.close()
        caller.join(5)
        assert not caller.is_alive() and len(failed) == 1
        with pytest.raises(LinkError, match="closed"):
            link.fetch(request(0), timeout_s=5)
    finally:
        release.set()
        caller.join(5)
        running.stop()


def test_a_strangers_trickled_request_is_cut_off_within_the_handshake_time(
    echo: Echo, tls_files: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stranger's refused request is read under one deadline from its
    accept: one byte at a time, each within the socket's timeout, it still
    loses its connection (and its handshake place) at the deadline."""
    monkeypatch.setattr(cluster_link, "HANDSHAKE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(cluster_link, "MAX_HANDSHAKES", 1)
    running = listen(echo, tls=tls_files["server"], allowed=lambda who: who in NODES)
    raw = socket.create_connection(("127.0.0.1", running.port), timeout=5)
    stranger = tls_files["client"].wrap_socket(raw, server_hostname="127.0.0.1")
    try:
        body = request(0).SerializeToString()
        stranger.sendall(struct.pack(">IIBI", len(body), 1, REPLICA_FETCH.number, 1000))
        cut = False
        for i in range(len(body)):  # 0.1 s a byte: a whole second or more in all
            try:
                stranger.sendall(body[i : i + 1])
            except OSError:
                cut = True
                break
            threading.Event().wait(0.1)
        assert cut or closed_by_peer(stranger)
        assert echo.refused == [] and echo.threads == []
        # Its place is free: a node of the cluster gets in.
        node = fetch_link(f"127.0.0.1:{running.port}", tls_files["node"])
        try:
            assert node.fetch(request(1), timeout_s=5).partitions[0].partition == 1
        finally:
            node.close()
    finally:
        stranger.close()
        running.stop()


def test_a_call_dialling_a_peer_that_never_answers_ends_at_its_timeout(
    tls_files: dict[str, Any],
) -> None:
    """The connect and TLS handshake of a call count against its timeout,
    not only :data:`CONNECT_TIMEOUT_S`."""
    mute = socket.create_server(("127.0.0.1", 0))  # connections queue, nobody speaks
    link = ClusterLink(f"127.0.0.1:{mute.getsockname()[1]}", tls_files["node"])
    try:
        failed = threading.Event()

        def call() -> None:
            with pytest.raises(LinkError):
                link.call(REPLICA_FETCH, request(0), 0.3)
            failed.set()

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        assert failed.wait(cluster_link.CONNECT_TIMEOUT_S / 2)
    finally:
        link.close()
        mute.close()


def test_a_refused_add_of_long_topic_names_fits_its_answers_limit() -> None:
    """A producer's flush names up to 1,000 partitions of topics up to 249
    characters; refused, each partition's result and its part of the message
    name the topic. Two such transactions in one batched add (other
    producers' beside them) are answered within the limit the caller reads."""
    topic = "t" * 249
    registered = {topic: TopicRegistration((PartitionRegistration((1,), (1,), 1),))}
    wanted = tuple(TopicPartition(topic, p) for p in range(1, 1001))
    missing = _missing(registered, wanted)
    assert len(missing) == 1000
    refused = coordinator_pb2.AddPartitionsToTxnResponse(
        error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        error_message="; ".join(missing.values()) + "; nothing was added",
        results=[partition_result(tp, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) for tp in wanted],
    )
    adds = coordinator_pb2.AddPartitionsToTxnRequest(
        transactions=[
            coordinator_pb2.AddPartitionsToTxnRequest(
                transactional_id=f"id-{i}",
                producer_id=i,
                producer_epoch=0,
                topics=[common_pb2.TopicPartitions(topic=topic, partitions=range(1, 1001))],
            )
            for i in range(2)
        ]
    )
    answer = coordinator_pb2.AddPartitionsToTxnResponse(transactions=[refused, refused])
    assert answer.ByteSize() <= ADD_PARTITIONS_TO_TXN.response_limit(adds)
