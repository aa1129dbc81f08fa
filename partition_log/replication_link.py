"""The followers' fetches over a TCP connection of their own.

A follower fetches from each leader node it follows through one connection
to that node's replication address: it sends a ``ReplicaFetchRequest`` and
reads the ``ReplicaFetchResponse``, one at a time, over and over. A unary
gRPC call per fetch hands every request and answer through gRPC's poll and
event engine threads and a fresh worker on both sides; here the follower's
fetcher thread and one leader thread per connection do all of it.

**Frames.** Each message is a 4-byte big-endian length and that many bytes
of the serialized protobuf message. A request over :data:`MAX_REQUEST_BYTES`
or an answer over the size the request allows (:func:`response_limit`)
ends the connection before it is read; so does a message that does not
parse, and a connection that sends nothing for :data:`IDLE_TIMEOUT_S` (a
follower asks at least every ``max_wait_ms`` plus its round trip).

**Who may fetch.** With the cluster's ``[tls]`` the connection is mutual TLS
against the cluster's CA, as on every gRPC port, and only the cluster's
principals (its nodes and super users) are answered; anyone else gets one
answer, CLUSTER_AUTHORIZATION_FAILED, and the connection is closed. Without
``[tls]`` (a lab), like the gRPC ports, nothing is checked. A connection
that has not finished its TLS handshake in :data:`HANDSHAKE_TIMEOUT_S` is
closed. The listener holds at most :data:`MAX_HANDSHAKES` connections that
are not yet authenticated and ``max_connections`` authenticated ones (those
of the cluster): under ``[tls]`` a stranger's connections cannot take the
followers' places.

A failed fetch (refused, cut, timed out) raises :class:`LinkError`; the
fetcher backs off and the next fetch dials again.
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError

from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.v1 import partition_log_pb2
from raftcoord.protocol.wire import wire_error

log = logging.getLogger("raftcoord.partition_log.replication")

_LENGTH = struct.Struct(">I")
#: The largest request a leader reads (a request names each partition
#: followed on the leader in about 40 bytes).
MAX_REQUEST_BYTES = 1 << 20
#: Room in an answer beyond its batches (per partition: names, offsets, errors).
RESPONSE_OVERHEAD_BYTES = 64 << 10
PER_PARTITION_OVERHEAD_BYTES = 512
#: A connection that sends nothing for this long is closed.
IDLE_TIMEOUT_S = 60.0
#: How long a connecting peer has to finish its TLS handshake.
HANDSHAKE_TIMEOUT_S = 10.0
#: Connections not authenticated yet (in their TLS handshake), at most.
MAX_HANDSHAKES = 16
#: How long the follower waits for a connection to open.
CONNECT_TIMEOUT_S = 5.0


class LinkError(Exception):
    """A fetch got no answer: the connection failed, timed out or was refused."""


def response_limit(request: Any) -> int:
    """The largest answer ``request`` can be given: every partition's
    ``partition_max_bytes`` of batches and room for the rest."""
    partitions = len(request.partitions)
    return RESPONSE_OVERHEAD_BYTES + partitions * (
        int(request.partition_max_bytes) + PER_PARTITION_OVERHEAD_BYTES
    )


def host_port(address: str) -> tuple[str, int]:
    """(host, port) of a ``host:port`` address (an IPv6 host in brackets)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def frame(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return _LENGTH.pack(len(data)) + data


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    chunks = []
    while count:
        chunk = sock.recv(min(count, 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket, limit: int) -> bytes:
    """The next message's bytes.

    Raises:
        ConnectionError: the peer closed the connection or announced a
            message over ``limit`` bytes (nothing of it is read).
        OSError: the socket failed or timed out.
    """
    (length,) = _LENGTH.unpack(_read_exactly(sock, _LENGTH.size))
    if length > limit:
        raise ConnectionError(f"a message of {length} bytes (at most {limit})")
    return _read_exactly(sock, length)


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


class ReplicationListener:
    """The leader's side: one thread per follower connection, each answering
    the fetches that arrive on it with ``answer`` (which may wait up to the
    request's ``max_wait_ms``)."""

    def __init__(
        self,
        address: tuple[str, int],
        answer: Callable[[Any], Any],
        *,
        tls: ssl.SSLContext | None,
        allowed: Callable[[str | None], bool],
        max_connections: int,
        label: str,
    ) -> None:
        """``allowed``: whether a peer of that principal (None: no TLS) is answered."""
        self._answer = answer
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
        self._thread = threading.Thread(target=self._accept, name="replication", daemon=True)

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
                    "%s event=replication_connection_refused peer=%s: too many connections "
                    "in their handshake",
                    self._label,
                    peer,
                )
                _close(connection)
                continue
            threading.Thread(
                target=self._serve, args=(connection, peer), name="replication", daemon=True
            ).start()

    def _serve(self, connection: socket.socket, peer: Any) -> None:
        with self._lock:
            self._connections.add(connection)
        slot: threading.BoundedSemaphore | None = self._handshakes
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                connection.settimeout(HANDSHAKE_TIMEOUT_S)
                wrapped = self._tls.wrap_socket(connection, server_side=True)
                with self._lock:  # the TLS socket owns the connection from now on
                    self._connections.discard(connection)
                    self._connections.add(wrapped)
                connection = wrapped
            who = _principal(connection)
            if not self._allowed(who):
                self._refuse(connection, peer, who)
                return
            self._handshakes.release()
            slot = None
            if not self._slots.acquire(blocking=False):
                raise ConnectionError(f"over {self._label}'s limit of replication connections")
            slot = self._slots
            self._converse(connection)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            if not self._stopping.is_set():
                log.info(
                    "%s event=replication_connection_closed peer=%s: %s", self._label, peer, exc
                )
        finally:
            with self._lock:
                self._connections.discard(connection)
            _close(connection)
            if slot is not None:
                slot.release()

    def _converse(self, connection: socket.socket) -> None:
        connection.settimeout(IDLE_TIMEOUT_S)
        while not self._stopping.is_set():
            connection.sendall(frame(self._answer(_request(connection))))

    def _refuse(self, connection: socket.socket, peer: Any, who: str | None) -> None:
        """Answer the first request of a peer that is not of the cluster
        CLUSTER_AUTHORIZATION_FAILED (the connection is closed then)."""
        log.warning(
            "%s event=replication_refused peer=%s principal=%s", self._label, peer, who or "-"
        )
        _request(connection)
        response = partition_log_pb2.ReplicaFetchResponse(
            error_code=wire_error(ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
            error_message=f"{who} may not fetch as a replica",
        )
        connection.sendall(frame(response))


def _request(connection: socket.socket) -> Any:
    """The next request on ``connection``.

    Raises:
        ValueError: it does not parse.
        OSError: see :func:`read_frame`.
    """
    request = partition_log_pb2.ReplicaFetchRequest()
    try:
        request.ParseFromString(read_frame(connection, MAX_REQUEST_BYTES))
    except DecodeError as exc:
        raise ValueError(f"a request that does not parse ({exc})") from None
    return request


class ReplicationLink:
    """The follower's side: one connection to one leader's replication
    address, dialled on the first fetch and again after a failure."""

    def __init__(self, address: str, tls: ssl.SSLContext | None) -> None:
        self._host, self._port = host_port(address)
        self._tls = tls
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()

    def fetch(self, request: Any, timeout_s: float) -> Any:
        """The leader's answer to ``request``.

        Raises:
            LinkError: no answer within ``timeout_s`` (the connection is closed).
        """
        with self._lock:
            try:
                connection = self._connected()
                connection.settimeout(timeout_s)
                connection.sendall(frame(request))
                response = partition_log_pb2.ReplicaFetchResponse()
                response.ParseFromString(read_frame(connection, response_limit(request)))
                return response
            except (OSError, DecodeError) as exc:
                self._drop()
                raise LinkError(f"{self._host}:{self._port}: {exc}") from None

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _connected(self) -> socket.socket:
        if self._socket is None:
            connection = socket.create_connection(
                (self._host, self._port), timeout=CONNECT_TIMEOUT_S
            )
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                try:
                    connection = self._tls.wrap_socket(connection, server_hostname=self._host)
                except OSError:
                    _close(connection)
                    raise
            self._socket = connection
        return self._socket

    def _drop(self) -> None:
        if self._socket is not None:
            _close(self._socket)
            self._socket = None


def _close(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    connection.close()
