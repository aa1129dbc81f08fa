"""Calls between the cluster's nodes over a TCP connection of their own.

Three calls go between nodes often enough that a unary gRPC call's cost
shows: a follower's ``ReplicaFetch`` to its leader (each append of a
replicated partition), a coordinator's ``WriteTxnMarkers`` to a
partition-log node (each transaction's markers) and a partition-log node's
``AddPartitionsToTxn`` to a coordinator (each transaction's first write to
a partition). A unary gRPC call hands every request and answer through
gRPC's poll and event engine threads and a fresh worker on both sides;
here the caller's thread and one listener thread per connection do all of
it. A partition-log node's replication address serves the first two, a
coordinator's link address the third (:class:`ClusterListener`); a caller
sends one request after the other on a connection (:class:`ClusterLink`).

**Frames.** A request is a 9-byte header (its length, its method's number,
the caller's timeout in milliseconds; big-endian) and the serialized
protobuf request of the method's gRPC counterpart; an answer is a 4-byte
length and the serialized protobuf answer. A request over its method's
``max_request_bytes``, an answer over what the request allows
(``response_limit``), an unknown method, a message that does not parse,
and a connection that sends nothing for :data:`IDLE_TIMEOUT_S` end the
connection before more is read.

**Who may call.** With the cluster's ``[tls]`` the connection is mutual TLS
against the cluster's CA, as on every gRPC port, and only the cluster's
principals (its nodes and super users) are answered; anyone else gets one
answer, the method's refusal (CLUSTER_AUTHORIZATION_FAILED), and the
connection is closed. Without ``[tls]`` (a lab), like the gRPC ports,
nothing is checked. A connection that is not let in within
:data:`HANDSHAKE_TIMEOUT_S` of its accept (its TLS handshake, and a
stranger's request and refusal, as a whole) is closed. The listener holds at most
:data:`MAX_HANDSHAKES` connections that are not yet authenticated and
``max_connections`` authenticated ones (those of the cluster): under
``[tls]`` a stranger's connections cannot take the cluster's places.

A failed call (refused, cut, timed out) raises :class:`LinkError`; the
caller backs off or retries, and the next call dials again.
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from google.protobuf.message import DecodeError

from raftcoord.protocol.config import ClusterConfig
from raftcoord.protocol.metrics import RpcMetrics
from raftcoord.protocol.tls import cluster_principals, node_ssl_context
from raftcoord.protocol.v1 import coordinator_pb2, partition_log_pb2

log = logging.getLogger("raftcoord.cluster_link")

_LENGTH = struct.Struct(">I")
_REQUEST_HEADER = struct.Struct(">IBI")
#: Room in an answer beyond its batches (per partition: names, offsets, errors).
RESPONSE_OVERHEAD_BYTES = 64 << 10
PER_PARTITION_OVERHEAD_BYTES = 512
#: A connection that sends nothing for this long is closed.
IDLE_TIMEOUT_S = 60.0
#: How long a connecting peer has, from its accept, to be let in (its TLS
#: handshake) or refused (its request read and answered).
HANDSHAKE_TIMEOUT_S = 10.0
#: Connections not authenticated yet (in their TLS handshake), at most.
MAX_HANDSHAKES = 16
#: How long a caller waits for a connection to open (within its call's timeout).
CONNECT_TIMEOUT_S = 5.0
#: The longest timeout a request may name.
MAX_TIMEOUT_MS = 600_000


class LinkError(Exception):
    """A call got no answer: the connection failed, timed out or was refused."""


class Method(NamedTuple):
    """A call the link carries: its number on the wire, its protobuf
    messages (those of its gRPC counterpart) and the sizes it allows."""

    number: int
    name: str
    request: type
    response: type
    max_request_bytes: int
    #: The largest answer a request may be given.
    response_limit: Callable[[Any], int]


def _fetch_response_limit(request: Any) -> int:
    """Every partition's ``partition_max_bytes`` of batches and room for the rest."""
    partitions = len(request.partitions)
    return RESPONSE_OVERHEAD_BYTES + partitions * (
        int(request.partition_max_bytes) + PER_PARTITION_OVERHEAD_BYTES
    )


def _named_bytes(topics: Any) -> int:
    """Room for a result (and a message) of each partition of ``topics``
    (TopicPartitions): each may name its topic twice."""
    return sum(
        len(t.partitions) * (PER_PARTITION_OVERHEAD_BYTES + 2 * len(t.topic.encode()))
        for t in topics
    )


def _markers_response_limit(request: Any) -> int:
    """A result (and a message) for each partition and group a marker names."""
    named = sum(
        (1 + len(m.groups)) * PER_PARTITION_OVERHEAD_BYTES + _named_bytes(m.topics)
        for m in request.markers
    )
    return RESPONSE_OVERHEAD_BYTES + named


#: A follower's fetch from its leader (a request names each partition
#: followed on the leader in about 40 bytes).
REPLICA_FETCH = Method(
    1,
    "ReplicaFetch",
    partition_log_pb2.ReplicaFetchRequest,
    partition_log_pb2.ReplicaFetchResponse,
    1 << 20,
    _fetch_response_limit,
)
#: A coordinator's markers for a partition-log node (gRPC's default limit).
WRITE_TXN_MARKERS = Method(
    2,
    "WriteTxnMarkers",
    partition_log_pb2.WriteTxnMarkersRequest,
    partition_log_pb2.WriteTxnMarkersResponse,
    4 << 20,
    _markers_response_limit,
)


def _adds_response_limit(request: Any) -> int:
    """A result (and a message) for each transaction and partition named; a
    partition's result and the message of a refused one each name its topic
    (up to 249 characters, or what the request sent)."""
    named = sum(
        PER_PARTITION_OVERHEAD_BYTES + _named_bytes(transaction.topics)
        for transaction in request.transactions
    )
    return RESPONSE_OVERHEAD_BYTES + named


#: A partition-log node's adds of partitions to transactions (Kafka's v4+
#: form: ``transactions``), for a coordinator (gRPC's default limit).
ADD_PARTITIONS_TO_TXN = Method(
    3,
    "AddPartitionsToTxn",
    coordinator_pb2.AddPartitionsToTxnRequest,
    coordinator_pb2.AddPartitionsToTxnResponse,
    4 << 20,
    _adds_response_limit,
)

#: How a listener answers a method: ``answer(request, refused, timeout_s)``,
#: ``refused`` the reason a stranger is refused (None for the cluster),
#: ``timeout_s`` what the caller waits.
Answer = Callable[[Any, "str | None", float], Any]


def host_port(address: str) -> tuple[str, int]:
    """(host, port) of a ``host:port`` address (an IPv6 host in brackets)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def request_frame(method: Method, message: Any, timeout_s: float) -> bytes:
    data: bytes = message.SerializeToString()
    timeout_ms = max(0, min(MAX_TIMEOUT_MS, int(timeout_s * 1000)))
    return _REQUEST_HEADER.pack(len(data), method.number, timeout_ms) + data


def response_frame(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return _LENGTH.pack(len(data)) + data


def _remaining(deadline: float) -> float:
    """Seconds left until ``deadline`` (monotonic). A socket timeout of 0
    would make it non-blocking: none left is a timeout.

    Raises:
        TimeoutError: the deadline has passed.
    """
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


def _read_exactly(sock: socket.socket, count: int, deadline: float | None = None) -> bytes:
    """``count`` bytes; by ``deadline`` (monotonic) as a whole when given,
    else within the socket's timeout for each read."""
    chunks = []
    while count:
        if deadline is not None:
            sock.settimeout(_remaining(deadline))
        chunk = sock.recv(min(count, 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def _read_body(
    sock: socket.socket, length: int, limit: int, deadline: float | None = None
) -> bytes:
    if length > limit:
        raise ConnectionError(f"a message of {length} bytes (at most {limit})")
    return _read_exactly(sock, length, deadline)


def _parse(message_type: type, data: bytes) -> Any:
    message = message_type()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise ValueError(f"a message that does not parse ({exc})") from None
    return message


def _principal(sock: socket.socket) -> str | None:
    """``User:<common name>`` of a TLS peer's certificate, None without one."""
    if not isinstance(sock, ssl.SSLSocket):
        return None
    certificate: dict[str, Any] = dict(sock.getpeercert() or {})
    for attributes in certificate.get("subject", ()):
        for attribute in attributes:
            if attribute[0] == "commonName":
                return f"User:{attribute[1]}"
    return None


class ClusterListener:
    """The answering side: one thread per connection, each answering the
    requests that arrive on it with the ``answers`` of their methods (which
    may wait, a parked fetch up to its ``max_wait_ms``)."""

    def __init__(
        self,
        address: tuple[str, int],
        answers: Mapping[Method, Answer],
        *,
        tls: ssl.SSLContext | None,
        allowed: Callable[[str | None], bool],
        max_connections: int,
        label: str,
    ) -> None:
        """``allowed``: whether a peer of that principal (None: no TLS) is answered."""
        self._answers = {method.number: (method, answer) for method, answer in answers.items()}
        self._tls = tls
        self._allowed = allowed
        self._label = label
        self._handshakes = threading.BoundedSemaphore(MAX_HANDSHAKES)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._socket = socket.create_server(address, backlog=64)
        self.port: int = self._socket.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="cluster-link", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting and close every connection (their threads end)."""
        self._stopping.set()
        _close(self._socket)  # shutdown wakes the thread blocked in accept()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            _close(connection)
        self._thread.join(timeout=2.0)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, peer = self._socket.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                continue
            if not self._handshakes.acquire(blocking=False):
                log.warning(
                    "%s event=link_connection_refused peer=%s: too many connections "
                    "in their handshake",
                    self._label,
                    peer,
                )
                _close(connection)
                continue
            threading.Thread(
                target=self._serve, args=(connection, peer), name="cluster-link", daemon=True
            ).start()

    def _serve(self, connection: socket.socket, peer: Any) -> None:
        with self._lock:
            self._connections.add(connection)
        slot: threading.BoundedSemaphore | None = self._handshakes
        expiry = _Expiry(connection, HANDSHAKE_TIMEOUT_S)
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                connection.settimeout(HANDSHAKE_TIMEOUT_S)
                wrapped = self._tls.wrap_socket(connection, server_side=True)
                with self._lock:  # the TLS socket owns the connection from now on
                    self._connections.discard(connection)
                    self._connections.add(wrapped)
                connection = wrapped
                expiry.follow(connection)
            who = _principal(connection)
            if not self._allowed(who):
                self._refuse(connection, peer, who)
                return
            if not expiry.disarm():
                raise ConnectionError("not let in within the handshake's time")
            self._handshakes.release()
            slot = None
            if not self._slots.acquire(blocking=False):
                raise ConnectionError(f"over {self._label}'s limit of cluster connections")
            slot = self._slots
            self._converse(connection)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            if not self._stopping.is_set():
                log.info("%s event=link_connection_closed peer=%s: %s", self._label, peer, exc)
        finally:
            expiry.disarm()
            with self._lock:
                self._connections.discard(connection)
            _close(connection)
            if slot is not None:
                slot.release()

    def _converse(self, connection: socket.socket) -> None:
        connection.settimeout(IDLE_TIMEOUT_S)
        while not self._stopping.is_set():
            answer, request, timeout_s = self._request(connection)
            connection.sendall(response_frame(answer(request, None, timeout_s)))

    def _refuse(self, connection: socket.socket, peer: Any, who: str | None) -> None:
        """Answer the first request of a peer that is not of the cluster with
        its method's refusal (the connection is closed then)."""
        log.warning("%s event=link_refused peer=%s principal=%s", self._label, peer, who or "-")
        answer, request, timeout_s = self._request(connection)
        refused = f"{who} may not call this: only the cluster's nodes and super users may"
        connection.sendall(response_frame(answer(request, refused, timeout_s)))

    def _request(self, connection: socket.socket) -> tuple[Answer, Any, float]:
        """The next request on ``connection``: how to answer it, it, and its timeout.

        Raises:
            ValueError: an unknown method, or a request that does not parse.
            ConnectionError, OSError: the connection closed, failed or timed
                out, or announced a request over its method's limit.
        """
        length, number, timeout_ms = _REQUEST_HEADER.unpack(
            _read_exactly(connection, _REQUEST_HEADER.size)
        )
        known = self._answers.get(number)
        if known is None:
            raise ValueError(f"a request of unknown method {number}")
        method, answer = known
        request = _parse(method.request, _read_body(connection, length, method.max_request_bytes))
        return answer, request, min(timeout_ms, MAX_TIMEOUT_MS) / 1000


def serve_cluster(
    config: ClusterConfig,
    node_id: int,
    address: str,
    answers: Mapping[Method, Answer],
    rpc: RpcMetrics | None,
    max_connections: int,
) -> ClusterListener:
    """A started listener of node ``node_id`` at ``address``: under the
    config's ``[tls]`` mutual TLS with the node's certificate, answering only
    the cluster's principals; each call counted in the RPC metrics (``rpc``;
    None: the node has none) as its gRPC counterpart is."""
    if rpc is not None:
        answers = {method: rpc.measure(method.name, a) for method, a in answers.items()}
    allowed = None if config.tls is None else cluster_principals(config)
    listener = ClusterListener(
        host_port(address),
        answers,
        tls=node_ssl_context(config, node_id, server=True),
        allowed=lambda who: allowed is None or who in allowed,
        max_connections=max_connections,
        label=f"node={node_id}",
    )
    listener.start()
    return listener


class ClusterLink:
    """The calling side: one connection to one node's address, dialled on
    the first call and again after a failure; one call at a time."""

    def __init__(self, address: str, tls: ssl.SSLContext | None) -> None:
        self._host, self._port = host_port(address)
        self._tls = tls
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        self._closed = False

    def call(self, method: Method, request: Any, timeout_s: float) -> Any:
        """The node's answer to ``request``.

        Raises:
            LinkError: no answer within ``timeout_s`` (the connection is closed).
        """
        deadline = time.monotonic() + timeout_s
        with self._lock:
            try:
                if self._closed:
                    raise ConnectionError("the link is closed")
                connection = self._connected(deadline)
                connection.settimeout(_remaining(deadline))
                connection.sendall(request_frame(method, request, timeout_s))
                (length,) = _LENGTH.unpack(_read_exactly(connection, _LENGTH.size, deadline))
                limit = method.response_limit(request)
                data = _read_body(connection, length, limit, deadline)
                return _parse(method.response, data)
            except (OSError, ValueError) as exc:
                self._drop()
                raise LinkError(f"{self._host}:{self._port}: {exc}") from None

    def close(self) -> None:
        """Close the connection and call no more; a call in flight ends at
        once with :class:`LinkError` (this does not wait for it)."""
        self._closed = True
        connection = self._socket
        if connection is not None:
            _close(connection)

    def _connected(self, deadline: float) -> socket.socket:
        """The connection, dialled (and its TLS handshake done) by the
        earlier of ``deadline`` and :data:`CONNECT_TIMEOUT_S` from now if
        there is none."""
        if self._socket is None:
            dial_by = min(deadline, time.monotonic() + CONNECT_TIMEOUT_S)
            connection = socket.create_connection(
                (self._host, self._port), timeout=_remaining(dial_by)
            )
            try:
                connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self._tls is not None:
                    connection.settimeout(_remaining(dial_by))
                    connection = self._tls.wrap_socket(connection, server_hostname=self._host)
            except OSError:
                _close(connection)
                raise
            self._socket = connection
            if self._closed:  # closed while dialling: close() did not see this socket
                self._drop()
                raise ConnectionError("the link is closed")
        return self._socket

    def _drop(self) -> None:
        if self._socket is not None:
            _close(self._socket)
            self._socket = None


class _Expiry:
    """Closes a connection that is not let in (:meth:`disarm`) within
    ``seconds``: a bound on the handshake and on a stranger's refused
    request as a whole, where socket timeouts bound each read alone."""

    def __init__(self, connection: socket.socket, seconds: float) -> None:
        self._lock = threading.Lock()
        self._connection = connection
        self._armed = True
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def follow(self, connection: socket.socket) -> None:
        """The connection is ``connection`` from now on (wrapped in TLS;
        closed now if the time ran out while the old one was being wrapped)."""
        with self._lock:
            self._connection = connection
            expired = not self._armed
        if expired:
            _close(connection)

    def disarm(self) -> bool:
        """Whether it was still armed (the connection not closed for its
        time); it closes nothing from now on."""
        with self._lock:
            armed, self._armed = self._armed, False
        self._timer.cancel()
        return armed

    def _expire(self) -> None:
        with self._lock:
            if not self._armed:
                return
            self._armed = False
            connection = self._connection
        _close(connection)


def _close(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    connection.close()


class LinkPool:
    """Up to ``size`` links to one node's address, for callers whose calls
    may run at once (a call that waits does not hold up the others): a call
    takes an idle link, dials a new one while there are fewer than
    ``size``, or waits for one to be free within its timeout."""

    def __init__(self, address: str, tls: ssl.SSLContext | None, size: int) -> None:
        self._address = address
        self._tls = tls
        self._free = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._idle: list[ClusterLink] = []
        self._all: list[ClusterLink] = []
        self._closed = False

    def call(self, method: Method, request: Any, timeout_s: float) -> Any:
        """The node's answer to ``request`` over one of the links.

        Raises:
            LinkError: no link free within ``timeout_s``, or no answer.
        """
        deadline = time.monotonic() + timeout_s
        if not self._free.acquire(timeout=max(0.0, timeout_s)):
            raise LinkError(f"{self._address}: every link is busy")
        try:
            with self._lock:
                if self._closed:
                    raise LinkError(f"{self._address}: the links are closed")
                if self._idle:
                    link = self._idle.pop()
                else:
                    link = ClusterLink(self._address, self._tls)
                    self._all.append(link)
            try:
                return link.call(method, request, max(0.0, deadline - time.monotonic()))
            finally:
                with self._lock:
                    self._idle.append(link)
        finally:
            self._free.release()

    def close(self) -> None:
        """Close every link; calls in flight end at once with :class:`LinkError`."""
        with self._lock:
            self._closed = True
            links, self._all, self._idle = self._all, [], []
        for link in links:
            link.close()
