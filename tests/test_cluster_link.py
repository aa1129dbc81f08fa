"""Calls between the cluster's nodes over connections of their own
(raftcoord.protocol.cluster_link) on loopback: answers in order over one
connection, each method to its own answer, refuses what it cannot trust
(oversized or undecodable frames, unknown methods, strangers under TLS, too
many connections) without stopping for the others, and turns every failure
on the caller's side into a LinkError. Many calls at once on one
connection (ConcurrentLink): items answered as they are ready, a parked
one later; a connection cut fails every call at once, a timeout only its
call; calls in flight bounded on both sides; answer limits over all the
frames of a call; frames for requests never sent refused."""

from __future__ import annotations

import socket
import ssl
import struct
import threading
import time
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
    ITEM,
    REPLICA_FETCH,
    WRITE_TXN_MARKERS,
    ClusterLink,
    ClusterListener,
    ConcurrentLink,
    LinkError,
    Replies,
    request_frame,
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
    answer: Any,
    tls: Any = None,
    allowed: Any = None,
    max_connections: int = 4,
    node_hosts: frozenset[str] = frozenset(),
) -> ClusterListener:
    listener = ClusterListener(
        ("127.0.0.1", 0),
        {REPLICA_FETCH: answer, WRITE_TXN_MARKERS: markers_answer},
        tls=tls,
        allowed=allowed or (lambda method, who: True),
        max_connections=max_connections,
        label="node=1",
        node_hosts=node_hosts,
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
    running = listen(echo, tls=tls_files["server"], allowed=lambda method, who: who in NODES)
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
    monkeypatch.setattr(cluster_link, "MAX_HANDSHAKES_PER_SOURCE", 2)
    monkeypatch.setattr(cluster_link, "MAX_HANDSHAKES", 2)
    running = listen(echo, tls=tls_files["server"], allowed=lambda method, who: who in NODES)
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


def test_a_node_is_refused_a_method_it_does_not_send(echo: Echo, tls_files: dict[str, Any]) -> None:
    """A node let in for some methods (a coordinator's markers) is refused,
    as a whole answer, a method its kind does not send (a follower's fetch),
    and nothing of it reaches the method's work."""
    running = listen(
        echo,
        tls=tls_files["server"],
        allowed=lambda method, who: who in NODES and method is WRITE_TXN_MARKERS,
    )
    link = fetch_link(f"127.0.0.1:{running.port}", tls_files["node"])
    try:
        answer = link.fetch(request(0), timeout_s=5)
        assert answer.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        assert echo.threads == [] and len(echo.refused) == 1
        assert "may not call this" in echo.refused[0]
    finally:
        link.close()
        running.stop()


def silent_from(source: str, port: int, count: int) -> list[socket.socket]:
    """``count`` connections to ``port`` from address ``source`` that say nothing."""
    connections = []
    for _ in range(count):
        connection = socket.socket()
        connection.bind((source, 0))
        connection.connect(("127.0.0.1", port))
        connections.append(connection)
    return connections


def test_strangers_on_many_addresses_never_take_the_node_hosts_places(
    echo: Echo, tls_files: dict[str, Any]
) -> None:
    """Silent connections from addresses that are not the cluster's fill
    their places (8 per address, 64 in all: the next is turned away), while
    a node connecting from the cluster's host (127.0.0.1) still gets in."""
    running = listen(
        echo,
        tls=tls_files["server"],
        allowed=lambda method, who: who in NODES,
        node_hosts=frozenset({"127.0.0.1"}),
    )
    strangers: list[socket.socket] = []
    node = fetch_link(f"127.0.0.1:{running.port}", tls_files["node"])
    try:
        per_source = cluster_link.MAX_HANDSHAKES_PER_SOURCE
        one = silent_from("127.0.0.2", running.port, per_source + 1)
        strangers += one
        assert closed_by_peer(one[-1])  # over its address's share
        sources = cluster_link.MAX_HANDSHAKES // per_source
        for i in range(1, sources):
            strangers += silent_from(f"127.0.0.{2 + i}", running.port, per_source)
        late = silent_from(f"127.0.0.{2 + sources}", running.port, 1)
        strangers += late
        assert closed_by_peer(late[0])  # the strangers' places are all taken
        assert node.fetch(request(3), timeout_s=5).partitions[0].partition == 3
        assert echo.refused == []
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
    monkeypatch.setattr(cluster_link, "MAX_HANDSHAKES_PER_SOURCE", 1)
    monkeypatch.setattr(cluster_link, "MAX_HANDSHAKES", 1)
    running = listen(echo, tls=tls_files["server"], allowed=lambda method, who: who in NODES)
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


# --- many calls at once on one connection, answered item by item -------------------


class Adds:
    """Answers a batched add item by item, by each transaction's id: ``now``
    at once, ``park-*`` parked (answered by :meth:`release`), ``never`` not
    at all (until :meth:`release`), ``big-*`` at once with a message of
    ``big`` bytes; notes each connection's thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: list[tuple[Replies, int, str]] = []
        self.threads: set[int] = set()
        self.refused: list[str] = []
        self.big = 0

    def __call__(
        self, request: Any, refused: str | None, timeout_s: float, replies: Replies | None
    ) -> Any:
        if refused is not None:
            self.refused.append(refused)
            return coordinator_pb2.AddPartitionsToTxnResponse(
                error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=refused
            )
        assert replies is not None
        with self.lock:
            self.threads.add(threading.get_ident())
        for item, transaction in enumerate(request.transactions):
            tid = transaction.transactional_id
            if tid.startswith("park"):
                replies.parked(item)
            if tid.startswith(("park", "never")):
                with self.lock:
                    self.held.append((replies, item, tid))
            else:
                replies.answer(item, lambda tid=tid: self.answer(tid))
        return None

    def answer(self, tid: str) -> Any:
        message = "m" * self.big if tid.startswith("big") else ""
        return coordinator_pb2.AddPartitionsToTxnResponse(error_message=f"{tid}{message}")

    def release(self) -> None:
        with self.lock:
            held, self.held = self.held, []
        for replies, item, tid in held:
            replies.answer(item, lambda tid=tid: self.answer(tid))


def adds_request(*tids: str) -> Any:
    return coordinator_pb2.AddPartitionsToTxnRequest(
        transactions=[
            coordinator_pb2.AddPartitionsToTxnRequest(
                transactional_id=tid,
                topics=[common_pb2.TopicPartitions(topic="t", partitions=[0])],
            )
            for tid in tids
        ]
    )


class Delivered:
    """What a call's items were handed, by item."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.items: dict[int, Any] = {}

    def __call__(self, item: int, answer: Any) -> None:
        with self.cond:
            assert item not in self.items, f"item {item} handed twice"
            self.items[item] = answer
            self.cond.notify_all()

    def wait(self, count: int) -> dict[int, Any]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.items) >= count, 10), self.items
            return dict(self.items)

    def messages(self) -> dict[int, str]:
        with self.cond:
            return {
                i: a.error_message if not isinstance(a, LinkError) else "LinkError"
                for i, a in self.items.items()
            }


def adds_listener(adds: Adds, tls: Any = None, allowed: Any = None) -> ClusterListener:
    listener = ClusterListener(
        ("127.0.0.1", 0),
        {ADD_PARTITIONS_TO_TXN: adds, REPLICA_FETCH: Echo()},
        tls=tls,
        allowed=allowed or (lambda method, who: True),
        max_connections=4,
        label="coordinator",
    )
    listener.start()
    return listener


@pytest.fixture
def adds() -> Adds:
    return Adds()


@pytest.fixture
def adds_at(adds: Adds) -> Iterator[str]:
    running = adds_listener(adds)
    yield f"127.0.0.1:{running.port}"
    adds.release()
    running.stop()


def test_items_are_answered_as_they_are_ready_a_parked_one_later(adds: Adds, adds_at: str) -> None:
    """A call returns once each item is answered or parked; the parked one
    comes later, and meanwhile another call on the same connection is
    answered whole."""
    link = ConcurrentLink(adds_at, None)
    first = Delivered()
    try:
        assert (
            link.call_items(ADD_PARTITIONS_TO_TXN, adds_request("a", "park-b", "c"), 5, first)
            is None
        )
        assert first.messages() == {0: "a", 2: "c"}
        second = Delivered()
        assert link.call_items(ADD_PARTITIONS_TO_TXN, adds_request("d"), 5, second) is None
        assert second.messages() == {0: "d"}
        assert link.call(REPLICA_FETCH, request(4), 5).partitions[0].partition == 4
        assert 1 not in first.messages()
        adds.release()
        first.wait(3)
        assert first.messages() == {0: "a", 1: "park-b", 2: "c"}
    finally:
        link.close()
    assert len(adds.threads) == 1, "one connection"


def test_a_connection_closed_midway_fails_every_call_in_flight_at_once(adds: Adds) -> None:
    running = adds_listener(adds)
    link = ConcurrentLink(f"127.0.0.1:{running.port}", None)
    calls = [Delivered() for _ in range(3)]
    try:
        for i, delivered in enumerate(calls):
            link.call_items(ADD_PARTITIONS_TO_TXN, adds_request(f"park-{i}", "now"), 30, delivered)
        assert [d.messages() for d in calls] == [{1: "now"}] * 3
        running.stop()  # closes the connection: every parked item fails, at once
        for delivered in calls:
            assert isinstance(delivered.wait(2)[0], LinkError)
    finally:
        link.close()
        adds.release()
    closed = Delivered()
    link.call_items(ADD_PARTITIONS_TO_TXN, adds_request("now"), 5, closed)
    assert isinstance(closed.wait(1)[0], LinkError)


def test_closing_a_concurrent_link_ends_its_calls_in_flight_at_once(
    adds: Adds, adds_at: str
) -> None:
    link = ConcurrentLink(adds_at, None)
    delivered = Delivered()
    link.call_items(ADD_PARTITIONS_TO_TXN, adds_request("park-a"), 30, delivered)
    failed: list[BaseException] = []

    def whole() -> None:
        try:
            link.call(REPLICA_FETCH, request(1), 30)
        except LinkError as exc:
            failed.append(exc)

    link.close()
    assert isinstance(delivered.wait(1)[0], LinkError)
    caller = threading.Thread(target=whole)
    caller.start()
    caller.join(5)
    assert not caller.is_alive() and len(failed) == 1 and "closed" in str(failed[0])


def test_a_call_past_its_timeout_fails_alone_and_its_late_answer_is_dropped(
    adds: Adds, adds_at: str
) -> None:
    link = ConcurrentLink(adds_at, None)
    try:
        slow = Delivered()
        started = time.monotonic()
        link.call_items(ADD_PARTITIONS_TO_TXN, adds_request("never", "now"), 0.3, slow)
        assert isinstance(slow.wait(2)[0], LinkError) and slow.messages()[1] == "now"
        assert time.monotonic() - started < 5
        adds.release()  # the answer comes after all: read and dropped
        for i in range(3):  # the connection goes on
            fine = Delivered()
            link.call_items(ADD_PARTITIONS_TO_TXN, adds_request(f"n{i}"), 5, fine)
            assert fine.messages() == {0: f"n{i}"}
    finally:
        link.close()
    assert len(adds.threads) == 1, "one connection throughout"


def test_calls_in_flight_on_a_link_are_bounded(
    adds: Adds, adds_at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_link, "MAX_OUTSTANDING", 2)
    link = ConcurrentLink(adds_at, None)
    try:
        for i in range(2):
            link.call_items(ADD_PARTITIONS_TO_TXN, adds_request(f"park-{i}"), 30, Delivered())
        third = Delivered()
        link.call_items(ADD_PARTITIONS_TO_TXN, adds_request("now"), 0.3, third)
        assert "2 calls in flight" in str(third.wait(1)[0])
        adds.release()  # both done: room again
        fourth = Delivered()
        link.call_items(ADD_PARTITIONS_TO_TXN, adds_request("now"), 5, fourth)
        assert fourth.messages() == {0: "now"}
    finally:
        link.close()


def test_a_listener_reads_no_request_past_its_bound_until_one_is_done(
    adds: Adds, adds_at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller that sends more requests than the bound (not a
    ConcurrentLink): the listener leaves the third unread until one of the
    first two is done."""
    monkeypatch.setattr(cluster_link, "MAX_OUTSTANDING", 2)
    host, port = adds_at.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        for request_id, tid in ((1, "never-1"), (2, "never-2"), (3, "now")):
            raw.sendall(request_frame(ADD_PARTITIONS_TO_TXN, adds_request(tid), 30, request_id))
        raw.settimeout(0.5)
        with pytest.raises(TimeoutError):
            raw.recv(1)  # nothing answered: the third request waits unread
        adds.release()
        raw.settimeout(10)
        frames = []
        while len(frames) < 3:
            length, request_id, kind, item = struct.unpack(">IIBI", read_exactly(raw, 13))
            read_exactly(raw, length)
            frames.append((request_id, kind, item))
        assert sorted(frames) == [(1, ITEM, 0), (2, ITEM, 0), (3, ITEM, 0)]


def read_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        assert chunk, "closed"
        data += chunk
    return data


def test_item_answers_past_what_the_request_allows_end_the_connection(
    adds: Adds, adds_at: str
) -> None:
    """Each answer fits alone; together they are over the limit."""
    limit = ADD_PARTITIONS_TO_TXN.response_limit(adds_request("big-1", "big-2"))
    adds.big = limit // 2 + 10
    link = ConcurrentLink(adds_at, None)
    try:
        delivered = Delivered()
        link.call_items(ADD_PARTITIONS_TO_TXN, adds_request("big-1", "big-2"), 5, delivered)
        answers = delivered.wait(2)
        assert isinstance(answers[1], LinkError) and "at most" in str(answers[1])
        adds.big = 0
        fine = Delivered()
        link.call_items(ADD_PARTITIONS_TO_TXN, adds_request("now"), 5, fine)  # dials again
        assert fine.messages() == {0: "now"}
    finally:
        link.close()


def test_an_answer_frame_for_a_request_never_sent_ends_the_connection() -> None:
    """A peer that answers a request id it was never sent (or an item of a
    call answered whole) is not trusted further: every call in flight fails."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer_wrongly() -> None:
        connection, _ = server.accept()
        with connection:
            read_exactly(connection, 13)
            body = coordinator_pb2.AddPartitionsToTxnResponse().SerializeToString()
            connection.sendall(struct.pack(">IIBI", len(body), 999, ITEM, 0) + body)
            connection.recv(1)

    peer = threading.Thread(target=answer_wrongly, daemon=True)
    peer.start()
    link = ConcurrentLink(f"127.0.0.1:{port}", None)
    try:
        delivered = Delivered()
        link.call_items(ADD_PARTITIONS_TO_TXN, adds_request("a"), 5, delivered)
        failure = delivered.wait(1)[0]
        assert isinstance(failure, LinkError) and "999" in str(failure)
    finally:
        link.close()
        server.close()
        peer.join(5)


def test_under_tls_a_stranger_gets_only_the_whole_refusal_of_its_add(
    adds: Adds, tls_files: dict[str, Any]
) -> None:
    running = adds_listener(adds, tls=tls_files["server"], allowed=lambda method, who: who in NODES)
    stranger = ConcurrentLink(f"127.0.0.1:{running.port}", tls_files["client"])
    node = ConcurrentLink(f"127.0.0.1:{running.port}", tls_files["node"])
    try:
        delivered = Delivered()
        whole = stranger.call_items(
            ADD_PARTITIONS_TO_TXN, adds_request("now", "park-a"), 5, delivered
        )
        assert whole is not None and whole.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        assert delivered.items == {} and adds.held == [] and len(adds.refused) == 1
        mine = Delivered()
        node.call_items(ADD_PARTITIONS_TO_TXN, adds_request("now"), 5, mine)
        assert mine.messages() == {0: "now"}
    finally:
        stranger.close()
        node.close()
        running.stop()


def test_a_call_ends_by_its_timeout_while_its_request_cannot_be_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A peer that reads nothing: a request of 40 MiB (more than loopback's
    buffers take) holds the connection's thread in its send, and the call
    still ends a second after its timeout, not after the send's own."""
    monkeypatch.setattr(cluster_link, "IO_TIMEOUT_S", 120.0)  # the send's own timeout
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    peer = threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True)
    peer.start()
    link = ConcurrentLink(f"127.0.0.1:{server.getsockname()[1]}", None)
    try:
        delivered = Delivered()
        started = time.monotonic()
        link.call_items(ADD_PARTITIONS_TO_TXN, adds_request("x" * (40 << 20)), 0.5, delivered)
        failure = delivered.wait(1)[0]
        assert isinstance(failure, LinkError) and "timed out" in str(failure)
        assert time.monotonic() - started < 60
    finally:
        link.close()
        peer.join(5)
        for connection in accepted:
            connection.close()
        server.close()
