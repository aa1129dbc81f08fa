"""Calls between the cluster's nodes over a TCP connection of their own.

Three calls go between nodes often enough that a unary gRPC call's cost
shows: a follower's ``ReplicaFetch`` to its leader (each append of a
replicated partition), a coordinator's ``WriteTxnMarkers`` to a
partition-log node (each transaction's markers) and a partition-log node's
``AddPartitionsToTxn`` to a coordinator (each transaction's first write to
a partition). A unary gRPC call hands every request and answer through
gRPC's poll and event engine threads and a fresh worker on both sides;
here the caller's thread and one listener thread per connection do most
of it. A partition-log node's replication address serves the first two, a
coordinator's link address the third (:class:`ClusterListener`). A
:class:`ClusterLink` sends one request after the other on its connection;
a :class:`ConcurrentLink` has up to :data:`MAX_OUTSTANDING` requests in
flight on one connection, their answers coming back as they are ready.

**Frames.** A request is a 13-byte header (its length, its request id,
its method's number, the caller's timeout in milliseconds; big-endian)
and the serialized protobuf request of the method's gRPC counterpart. An
answer frame is a 13-byte header (its length, the request id it answers,
its kind, an item number) and a serialized protobuf answer. Its kind is
:data:`WHOLE` (the request's whole answer: the request is done), or, for
a method answered item by item (:attr:`Method.items`: the transactions of
a batched add), :data:`ITEM` (the answer to item ``item`` alone, in the
method's answer type: the request is done once every item is answered)
or :data:`PARKED` (no body: item ``item`` waits for something, its
answer comes later). A method answered whole is answered on the
connection's thread, in arrival order; the items of a request are
answered as each is ready, whatever the order. A request over its
method's ``max_request_bytes``, answer frames of one request that add up
to more than it allows (``response_limit``), an unknown method, a frame
for a request the caller never sent (or of a kind or item it cannot
have), a message that does not parse, and a connection that sends
nothing for :data:`IDLE_TIMEOUT_S` end the connection before more is
read; a caller whose connection ends fails every call in flight on it at
once.

**Who may call.** With the cluster's ``[tls]`` the connection is mutual TLS
against the cluster's CA, as on every gRPC port, and only the cluster's
principals (its nodes and super users) are answered; anyone else gets one
answer, the method's refusal (CLUSTER_AUTHORIZATION_FAILED) as a whole
answer, and the connection is closed. Without ``[tls]`` (a lab), like the
gRPC ports, nothing is checked. A connection that is not let in within
:data:`HANDSHAKE_TIMEOUT_S` of its accept (its TLS handshake, and a
stranger's request and refusal, as a whole) is closed. The listener holds
``max_connections`` authenticated connections (those of the cluster), and
connections not yet authenticated counted per source address
(:class:`raftcoord.protocol.admission.HandshakeSlots`): at most
:data:`MAX_HANDSHAKES_PER_SOURCE` from one address that is not a host of
the cluster's nodes and :data:`MAX_HANDSHAKES` from all of those, apart
from :data:`MAX_HANDSHAKES_PER_NODE_HOST` per host of the cluster's. So
strangers, however many, cannot take the places of the cluster's own
connections; the connections turned away and the strangers refused are
logged at most :data:`REFUSALS_LOGGED_PER_S` times a second, with the
count of those not logged.
An authenticated connection has at most :data:`MAX_OUTSTANDING` requests
answered item by item under way; the listener reads its next request
once one of them is done or past its timeout.

A failed call (refused, cut, timed out) raises :class:`LinkError` (or, for
the items of a :class:`ConcurrentLink` call, hands it to each item not
yet answered); the caller backs off or retries, and the next call dials
again.
"""

from __future__ import annotations

import logging
import queue
import selectors
import socket
import ssl
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from google.protobuf.message import DecodeError

from raftcoord.protocol.admission import (
    HandshakeDeadline,
    HandshakeSlots,
    close_connection,
    cluster_sources,
)
from raftcoord.protocol.config import ClusterConfig
from raftcoord.protocol.metrics import RpcMetrics
from raftcoord.protocol.process import LogLimiter
from raftcoord.protocol.tls import (
    NodeKind,
    certificate_principal,
    node_ssl_context,
    sender_refusal,
    senders,
)
from raftcoord.protocol.v1 import coordinator_pb2, partition_log_pb2

log = logging.getLogger("raftcoord.cluster_link")

#: A request's header: its length, request id, method and timeout (ms).
_REQUEST_HEADER = struct.Struct(">IIBI")
#: An answer frame's header: its length, request id, kind and item.
_ANSWER_HEADER = struct.Struct(">IIBI")
#: An answer frame's kinds: the whole answer, one item's answer, an item
#: that waits (no body).
WHOLE, ITEM, PARKED = 0, 1, 2
#: Requests answered item by item under way on one connection at most (a
#: :class:`ConcurrentLink` sends no more; a listener reads no more first).
MAX_OUTSTANDING = 64
#: A :class:`ConcurrentLink`'s connection that takes longer than this to
#: take a request or deliver the rest of an answer frame begun is closed.
IO_TIMEOUT_S = 10.0
#: Room in an answer beyond its batches (per partition: names, offsets, errors).
RESPONSE_OVERHEAD_BYTES = 64 << 10
PER_PARTITION_OVERHEAD_BYTES = 512
#: A connection that sends nothing for this long is closed.
IDLE_TIMEOUT_S = 60.0
#: How long a connecting peer has, from its accept, to be let in (its TLS
#: handshake) or refused (its request read and answered).
HANDSHAKE_TIMEOUT_S = 5.0
#: Connections not authenticated yet (in their TLS handshake) from one
#: address that is not a host of the cluster's nodes, and from all of them
#: (:class:`raftcoord.protocol.admission.HandshakeSlots`).
MAX_HANDSHAKES_PER_SOURCE = 8
MAX_HANDSHAKES = 64
#: Connections not authenticated yet from one host of the cluster's nodes
#: (in a lab, every node of the cluster on one address).
MAX_HANDSHAKES_PER_NODE_HOST = 64
#: Refused connections logged per second, at most (the others counted).
REFUSALS_LOGGED_PER_S = 1.0
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
    #: The largest answer a request may be given (all its frames together).
    response_limit: Callable[[Any], int]
    #: Which of the cluster's nodes send it (with the super users).
    senders: tuple[NodeKind, ...] = ()
    #: How many items a request has, each answered alone (:data:`ITEM`);
    #: None: answered whole.
    items: Callable[[Any], int] | None = None


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
    ("partition_nodes",),
)
#: A coordinator's markers for a partition-log node (gRPC's default limit).
WRITE_TXN_MARKERS = Method(
    2,
    "WriteTxnMarkers",
    partition_log_pb2.WriteTxnMarkersRequest,
    partition_log_pb2.WriteTxnMarkersResponse,
    4 << 20,
    _markers_response_limit,
    ("coordinators",),
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
    ("partition_nodes",),
    lambda request: len(request.transactions),
)

#: How a listener answers a method answered whole: ``answer(request,
#: refused, timeout_s)``, ``refused`` the reason the caller is refused (None
#: for the nodes that send the method), ``timeout_s`` what the caller waits. A method answered
#: item by item (:attr:`Method.items`) is answered ``answer(request,
#: refused, timeout_s, replies)``: it returns the whole answer (a refusal
#: of the request), or None once it has arranged for every item to be
#: answered through ``replies`` (:class:`Replies`), from any thread.
Answer = Callable[..., Any]


def host_port(address: str) -> tuple[str, int]:
    """(host, port) of a ``host:port`` address (an IPv6 host in brackets)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def request_frame(method: Method, message: Any, timeout_s: float, request_id: int = 0) -> bytes:
    data: bytes = message.SerializeToString()
    timeout_ms = max(0, min(MAX_TIMEOUT_MS, int(timeout_s * 1000)))
    return _REQUEST_HEADER.pack(len(data), request_id, method.number, timeout_ms) + data


def answer_frame(request_id: int, kind: int, item: int, message: Any | None) -> bytes:
    """An answer frame (``message`` None: no body, a :data:`PARKED` frame)."""
    data: bytes = b"" if message is None else message.SerializeToString()
    return _ANSWER_HEADER.pack(len(data), request_id, kind, item) + data


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
        allowed: Callable[[Method, str | None], bool],
        max_connections: int,
        label: str,
        node_hosts: frozenset[str] = frozenset(),
    ) -> None:
        """``allowed``: whether a peer of that principal (None: no TLS) is
        answered a method (a peer allowed none is refused whole, its
        connection closed); ``node_hosts``: the IP addresses of the
        cluster's nodes."""
        self._answers = {method.number: (method, answer) for method, answer in answers.items()}
        self._tls = tls
        self._allowed = allowed
        self._label = label
        self._handshakes = HandshakeSlots(
            MAX_HANDSHAKES_PER_SOURCE,
            MAX_HANDSHAKES,
            node_hosts,
            MAX_HANDSHAKES_PER_NODE_HOST,
        )
        self._refusals = LogLimiter(REFUSALS_LOGGED_PER_S)
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
        close_connection(self._socket)  # shutdown wakes the thread blocked in accept()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            close_connection(connection)
        self._thread.join(timeout=2.0)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, peer = self._socket.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                continue
            if not self._handshakes.take(peer[0]):
                self._refusals.log(
                    log,
                    logging.WARNING,
                    "%s event=link_connection_refused peer=%s: too many connections "
                    "in their handshake from that address, or from addresses that are "
                    "not the cluster's",
                    self._label,
                    peer,
                )
                close_connection(connection)
                continue
            threading.Thread(
                target=self._serve, args=(connection, peer), name="cluster-link", daemon=True
            ).start()

    def _serve(self, connection: socket.socket, peer: Any) -> None:
        with self._lock:
            self._connections.add(connection)
        handshake = True  # its place in self._handshakes is held
        slot: threading.BoundedSemaphore | None = None
        expiry = HandshakeDeadline(connection, HANDSHAKE_TIMEOUT_S)
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
            who = _socket_principal(connection)
            if not any(self._allowed(method, who) for method, _ in self._answers.values()):
                self._refuse(connection, peer, who)
                return
            if not expiry.disarm():
                raise ConnectionError("not let in within the handshake's time")
            self._handshakes.give_back(peer[0])
            handshake = False
            if not self._slots.acquire(blocking=False):
                raise ConnectionError(f"over {self._label}'s limit of cluster connections")
            slot = self._slots
            self._converse(connection, who)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            if self._stopping.is_set():
                pass
            elif handshake:  # a stranger's, maybe one of many
                self._refusals.log(
                    log,
                    logging.INFO,
                    "%s event=link_connection_closed peer=%s: %s",
                    self._label,
                    peer,
                    exc,
                )
            else:
                log.info("%s event=link_connection_closed peer=%s: %s", self._label, peer, exc)
        finally:
            expiry.disarm()
            with self._lock:
                self._connections.discard(connection)
            close_connection(connection)
            if handshake:
                self._handshakes.give_back(peer[0])
            if slot is not None:
                slot.release()

    def _converse(self, connection: socket.socket, who: str | None) -> None:
        """Answer the connection's requests (of principal ``who``): those
        answered whole in turn, on this thread; those answered item by item
        as their items are ready (:class:`_Conversation`); those of a method
        ``who`` does not send, refused whole."""
        conversation = _Conversation(connection)
        try:
            while not self._stopping.is_set():
                frame = conversation.next_request(self._request_limit)
                if frame is None:
                    continue
                (_length, request_id, number, timeout_ms), body = frame
                method, answer = self._answers[number]
                request = _parse(method.request, body)
                timeout_s = min(timeout_ms, MAX_TIMEOUT_MS) / 1000
                if not self._allowed(method, who):
                    refused = sender_refusal(who)
                    if method.items is None:
                        whole = answer(request, refused, timeout_s)
                    else:
                        whole = answer(request, refused, timeout_s, None)
                elif method.items is None:
                    whole = answer(request, None, timeout_s)
                else:
                    replies = conversation.begin(request_id, method.items(request), timeout_s)
                    whole = answer(request, None, timeout_s, replies)
                    if whole is None:
                        continue
                    conversation.end(request_id)
                conversation.send(answer_frame(request_id, WHOLE, 0, whole))
        finally:
            conversation.close()

    def _refuse(self, connection: socket.socket, peer: Any, who: str | None) -> None:
        """Answer the first request of a peer that is not of the cluster with
        its method's refusal, whole (the connection is closed then)."""
        self._refusals.log(
            log,
            logging.WARNING,
            "%s event=link_refused peer=%s principal=%s",
            self._label,
            peer,
            who or "-",
        )
        request_id, method, answer, request, timeout_s = self._request(connection)
        refused = sender_refusal(who)
        if method.items is None:
            whole = answer(request, refused, timeout_s)
        else:
            whole = answer(request, refused, timeout_s, None)
        connection.sendall(answer_frame(request_id, WHOLE, 0, whole))

    def _request_limit(self, header: tuple[int, ...]) -> int:
        """The largest request of the method a request ``header`` names.

        Raises:
            ValueError: an unknown method.
        """
        known = self._answers.get(header[2])
        if known is None:
            raise ValueError(f"a request of unknown method {header[2]}")
        return known[0].max_request_bytes

    def _request(self, connection: socket.socket) -> tuple[int, Method, Answer, Any, float]:
        """The next request on ``connection``: its id, its method, how to
        answer it, it, and its timeout.

        Raises:
            ValueError: an unknown method, or a request that does not parse.
            ConnectionError, OSError: the connection closed, failed or timed
                out, or announced a request over its method's limit.
        """
        length, request_id, number, timeout_ms = _REQUEST_HEADER.unpack(
            _read_exactly(connection, _REQUEST_HEADER.size)
        )
        known = self._answers.get(number)
        if known is None:
            raise ValueError(f"a request of unknown method {number}")
        method, answer = known
        request = _parse(method.request, _read_body(connection, length, method.max_request_bytes))
        return request_id, method, answer, request, min(timeout_ms, MAX_TIMEOUT_MS) / 1000


class _FrameReader:
    """The frames that have arrived on a connection, read without waiting
    (a connection's own thread also has answers to send): each
    :meth:`fill` takes what is there, :meth:`frame` gives the next frame
    once it is whole. A frame's length is checked against its limit as soon
    as its header is in, before its body is waited for."""

    def __init__(self, connection: socket.socket, header: struct.Struct, timeout_s: float) -> None:
        self._connection = connection
        self._header = header
        #: The socket's timeout for everything else (sends).
        self._timeout_s = timeout_s
        self._buffer = bytearray()
        connection.settimeout(timeout_s)

    def pending(self) -> bool:
        """Whether TLS holds decrypted bytes not read yet (the socket may not
        show them as readable)."""
        return isinstance(self._connection, ssl.SSLSocket) and self._connection.pending() > 0

    def fill(self) -> bool:
        """Read what has arrived; whether anything had.

        Raises:
            ConnectionError: the peer closed the connection.
            OSError: the connection failed.
        """
        self._connection.settimeout(0.0)
        try:
            chunk = self._connection.recv(1 << 16)
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return False  # nothing yet, or only TLS's own records
        finally:
            self._connection.settimeout(self._timeout_s)
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        self._buffer += chunk
        return True

    def frame(
        self, limit: Callable[[tuple[int, ...]], int]
    ) -> tuple[tuple[int, ...], bytes] | None:
        """The next frame, its header and body, once whole; None before.

        Raises:
            ValueError: a frame over ``limit(header)`` bytes (``limit`` may
                raise it too).
        """
        if len(self._buffer) < self._header.size:
            return None
        header: tuple[int, ...] = self._header.unpack_from(self._buffer)
        length, allowed = header[0], limit(header)
        if length > allowed:
            raise ValueError(f"a message of {length} bytes (at most {allowed})")
        end = self._header.size + length
        if len(self._buffer) < end:
            return None
        body = bytes(self._buffer[self._header.size : end])
        del self._buffer[:end]
        return header, body


class Replies:
    """How the items of one request reach its caller: :meth:`answer` and
    :meth:`parked` may be called from any thread and only queue a frame
    (the connection's own thread sends it, :class:`_Conversation`). Each
    item is answered once; a second answer, and a :data:`PARKED` after its
    answer or a first :data:`PARKED`, are not sent. Items of a request that
    is past its timeout are not sent."""

    def __init__(self, conversation: _Conversation, request_id: int) -> None:
        self._conversation = conversation
        self._request_id = request_id

    def answer(self, item: int, build: Callable[[], Any]) -> None:
        """Answer ``item`` with ``build()`` (called on the connection's thread)."""
        self._conversation.queue(self._request_id, ITEM, item, build)

    def parked(self, item: int) -> None:
        """Tell the caller that ``item`` waits (its answer comes later)."""
        self._conversation.queue(self._request_id, PARKED, item, None)


@dataclass
class _Open:
    """A request answered item by item, under way: its deadline
    (monotonic) and each item's state (0: not answered, PARKED, ITEM)."""

    deadline: float
    states: bytearray
    left: int


class _Conversation:
    """One authenticated connection, from its own thread: the requests
    answered item by item under way (at most :data:`MAX_OUTSTANDING`), the
    answer frames other threads queued for them, and sending them. Only
    the connection's thread reads and writes the socket (an SSL socket is
    not safe for a read and a write at once from two threads); another
    thread wakes it through a socket pair when it queues a frame."""

    def __init__(self, connection: socket.socket) -> None:
        self._connection = connection
        self._lock = threading.Lock()
        self._open: dict[int, _Open] = {}
        self._frames: queue.SimpleQueue[tuple[int, int, int, Callable[[], Any] | None]] = (
            queue.SimpleQueue()
        )
        self._wake_in, self._wake_out = socket.socketpair()
        self._wake_in.setblocking(False)
        self._wake_out.setblocking(False)
        #: Waits for a request or a queued frame; ``_full`` for a frame only.
        self._selector = selectors.DefaultSelector()
        self._selector.register(connection, selectors.EVENT_READ)
        self._selector.register(self._wake_out, selectors.EVENT_READ)
        self._full = selectors.DefaultSelector()
        self._full.register(self._wake_out, selectors.EVENT_READ)
        self._reader = _FrameReader(connection, _REQUEST_HEADER, IDLE_TIMEOUT_S)
        self._idle_since = time.monotonic()

    def next_request(
        self, limit: Callable[[tuple[int, ...]], int]
    ) -> tuple[tuple[int, ...], bytes] | None:
        """Send the answers queued meanwhile, and the next request (its
        header and body) if one has come whole (None: look again). While
        :data:`MAX_OUTSTANDING` requests are under way, none is read.

        Raises:
            ConnectionError: the connection closed, or was idle for
                :data:`IDLE_TIMEOUT_S` (no request under way).
            ValueError: a request of an unknown method (``limit`` raised)
                or over its method's limit.
            OSError: the connection failed.
        """
        with self._lock:
            full = len(self._open) >= MAX_OUTSTANDING
        if not full:
            frame = self._reader.frame(limit)
            if frame is not None:
                return frame
        timeout = 0.0 if not full and self._reader.pending() else self._next_timeout()
        events = (self._full if full else self._selector).select(timeout)
        self._send_queued()
        self._expire()
        if not full and (
            self._reader.pending() or any(key.fileobj is self._connection for key, _ in events)
        ):
            if self._reader.fill():
                self._idle_since = time.monotonic()
            return self._reader.frame(limit)
        if not self._open and time.monotonic() - self._idle_since >= IDLE_TIMEOUT_S:
            raise ConnectionError(f"no request for {IDLE_TIMEOUT_S:.0f} s")
        return None

    def _next_timeout(self) -> float:
        """How long to wait for the socket or a queued frame: to the first
        deadline of a request under way, else the idle time left."""
        now = time.monotonic()
        with self._lock:
            deadlines = [o.deadline for o in self._open.values()]
        if deadlines:
            return max(0.0, min(deadlines) - now)
        return max(0.0, self._idle_since + IDLE_TIMEOUT_S - now)

    def begin(self, request_id: int, items: int, timeout_s: float) -> Replies:
        """A request of ``items`` items to answer item by item.

        Raises:
            ValueError: its id is that of a request under way.
        """
        with self._lock:
            if request_id in self._open:
                raise ValueError(f"request id {request_id} is already under way")
            self._open[request_id] = _Open(time.monotonic() + timeout_s, bytearray(items), items)
        return Replies(self, request_id)

    def end(self, request_id: int) -> None:
        """The request is answered whole: its items are not."""
        with self._lock:
            self._open.pop(request_id, None)

    def queue(self, request_id: int, kind: int, item: int, build: Callable[[], Any] | None) -> None:
        self._frames.put((request_id, kind, item, build))
        try:
            self._wake_in.send(b"\0")
        except (BlockingIOError, OSError):  # already awake, or closed
            pass

    def send(self, frame: bytes) -> None:
        self._connection.sendall(frame)

    def _send_queued(self) -> None:
        try:
            while self._wake_out.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                request_id, kind, item, build = self._frames.get_nowait()
            except queue.Empty:
                return
            if not self._take(request_id, kind, item):
                continue
            self.send(answer_frame(request_id, kind, item, None if build is None else build()))

    def _take(self, request_id: int, kind: int, item: int) -> bool:
        """Whether to send a frame of ``kind`` for ``item`` of the request
        (noting it sent, the request done with its last item)."""
        with self._lock:
            under_way = self._open.get(request_id)
            if under_way is None or not 0 <= item < len(under_way.states):
                return False
            state = under_way.states[item]
            if state == ITEM or (kind == PARKED and state == PARKED):
                return False
            under_way.states[item] = kind
            if kind == ITEM:
                under_way.left -= 1
                if under_way.left == 0:
                    del self._open[request_id]
            return True

    def _expire(self) -> None:
        """Drop the requests past their timeout (their caller gave up)."""
        now = time.monotonic()
        with self._lock:
            for request_id in [i for i, o in self._open.items() if o.deadline <= now]:
                del self._open[request_id]

    def close(self) -> None:
        with self._lock:
            self._open.clear()
        self._selector.close()
        self._full.close()
        self._wake_in.close()
        self._wake_out.close()


def serve_cluster(
    config: ClusterConfig,
    node_id: int,
    address: str,
    answers: Mapping[Method, Answer],
    rpc: RpcMetrics | None,
    max_connections: int,
) -> ClusterListener:
    """A started listener of node ``node_id`` at ``address``: under the
    config's ``[tls]`` mutual TLS with the node's certificate, answering each
    method only to the principals of the nodes that send it
    (:attr:`Method.senders`) and the super users; each call counted in the
    RPC metrics (``rpc``; None: the node has none) as its gRPC counterpart is."""
    if rpc is not None:
        answers = {method: rpc.measure(method.name, a) for method, a in answers.items()}
    allowed = {method: senders(config, *method.senders) for method in answers}

    def may_send(method: Method, who: str | None) -> bool:
        return config.tls is None or who in allowed[method]

    listener = ClusterListener(
        host_port(address),
        answers,
        tls=node_ssl_context(config, node_id, server=True),
        allowed=may_send,
        max_connections=max_connections,
        label=f"node={node_id}",
        node_hosts=cluster_sources(config),
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
        self._next_id = 0

    def call(self, method: Method, request: Any, timeout_s: float) -> Any:
        """The node's answer to ``request`` (a method answered whole).

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
                self._next_id = (self._next_id + 1) & 0xFFFFFFFF
                connection.sendall(request_frame(method, request, timeout_s, self._next_id))
                length, request_id, kind, _item = _ANSWER_HEADER.unpack(
                    _read_exactly(connection, _ANSWER_HEADER.size, deadline)
                )
                if request_id != self._next_id or kind != WHOLE:
                    raise ValueError(f"an answer frame of kind {kind} for request {request_id}")
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
            close_connection(connection)

    def _connected(self, deadline: float) -> socket.socket:
        """The connection, dialled (and its TLS handshake done) by the
        earlier of ``deadline`` and :data:`CONNECT_TIMEOUT_S` from now if
        there is none."""
        if self._socket is None:
            self._socket = _dial(self._host, self._port, self._tls, deadline)
            if self._closed:  # closed while dialling: close() did not see this socket
                self._drop()
                raise ConnectionError("the link is closed")
        return self._socket

    def _drop(self) -> None:
        if self._socket is not None:
            close_connection(self._socket)
            self._socket = None


def _dial(host: str, port: int, tls: ssl.SSLContext | None, deadline: float) -> socket.socket:
    """A connection to ``host:port``, dialled (and its TLS handshake done)
    by the earlier of ``deadline`` and :data:`CONNECT_TIMEOUT_S` from now."""
    dial_by = min(deadline, time.monotonic() + CONNECT_TIMEOUT_S)
    connection = socket.create_connection((host, port), timeout=_remaining(dial_by))
    try:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            connection.settimeout(_remaining(dial_by))
            connection = tls.wrap_socket(connection, server_hostname=host)
    except OSError:
        close_connection(connection)
        raise
    return connection


#: What a :class:`ConcurrentLink` call hands each item: its answer, or the
#: :class:`LinkError` that ended the call before it was answered.
Deliver = Callable[[int, Any], None]


@dataclass(eq=False)
class _Call:
    """A request of a :class:`ConcurrentLink` in flight."""

    method: Method
    frame: bytes
    deadline: float
    #: Room left for its answer frames (``response_limit`` less what came).
    room: int
    #: Each item's state (0: not answered, PARKED, ITEM); empty: answered whole.
    states: bytearray
    deliver: Deliver | None
    #: Frees its place among the link's calls in flight (once, when it ends).
    release: Callable[[], None]
    #: Items not answered yet, and of those not parked either.
    left: int = 0
    unsettled: int = 0
    #: Every item answered or parked, or the whole answer or the failure came.
    settled: threading.Event = field(default_factory=threading.Event)
    #: Held while an answer is handed over or the call ends (from another
    #: thread when the link is closed).
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: bool = False
    whole: Any = None
    error: LinkError | None = None


class ConcurrentLink:
    """The calling side with many calls at once on one connection: up to
    :data:`MAX_OUTSTANDING` requests in flight, each with its own id and
    timeout, answered whole or item by item as the node's answers come. The
    connection is dialled by the first call (and after a failure) and read
    and written by a thread of its own; a call's frame is queued for it. A
    connection that fails or is closed fails every call in flight on it at
    once; a call past its timeout fails alone (an answer to it that still
    comes is read and dropped)."""

    def __init__(self, address: str, tls: ssl.SSLContext | None) -> None:
        self._host, self._port = host_port(address)
        self._tls = tls
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_OUTSTANDING)
        self._dialling = threading.Lock()
        self._io: _LinkConnection | None = None
        self._closed = False
        self._next_id = 0

    def call(self, method: Method, request: Any, timeout_s: float) -> Any:
        """The node's answer to ``request`` (a method answered whole).

        Raises:
            LinkError: no answer within ``timeout_s``.
        """
        call = self._start(method, request, timeout_s, None)
        self._settle(call)
        if call.error is not None:
            raise call.error
        return call.whole

    def call_items(
        self, method: Method, request: Any, timeout_s: float, deliver: Deliver
    ) -> Any | None:
        """Send ``request`` of a method answered item by item; return once
        every item is answered or waits (:data:`PARKED`), or the call failed:
        the whole answer if the node answered the request whole (no item is
        delivered then), else None. ``deliver(item, answer)`` is called once
        for each item (on the connection's thread, so it must be quick): with
        its answer as it comes, before or after this returns, or with the
        :class:`LinkError` that ended the call before it was answered."""
        try:
            call = self._start(method, request, timeout_s, deliver)
        except LinkError as exc:
            for item in range(method.items(request) if method.items else 0):
                deliver(item, exc)
            return None
        self._settle(call)
        return call.whole

    def close(self) -> None:
        """Close the connection and call no more: the calls in flight end at
        once with :class:`LinkError` (this does not wait for them)."""
        with self._lock:
            self._closed = True
            io = self._io
        if io is not None:
            io.fail(ConnectionError("the link is closed"))

    def _start(
        self, method: Method, request: Any, timeout_s: float, deliver: Deliver | None
    ) -> _Call:
        deadline = time.monotonic() + timeout_s
        where = f"{self._host}:{self._port}"
        if not self._slots.acquire(timeout=max(0.0, timeout_s)):
            raise LinkError(f"{where}: {MAX_OUTSTANDING} calls in flight")
        try:
            io = self._connection(deadline)
            with self._lock:
                self._next_id = (self._next_id + 1) & 0xFFFFFFFF
                request_id = self._next_id
            items = 0 if method.items is None else method.items(request)
            call = _Call(
                method,
                request_frame(method, request, timeout_s, request_id),
                deadline,
                method.response_limit(request),
                bytearray(items),
                deliver,
                self._slots.release,
                left=items,
                unsettled=items,
            )
            io.add(request_id, call)
        except (OSError, ValueError) as exc:
            self._slots.release()
            raise LinkError(f"{where}: {exc}") from None
        return call

    def _settle(self, call: _Call) -> None:
        """Wait until ``call`` settled: the connection's thread ends it at
        its deadline, or, should that thread be held up (a send waiting for
        a slow peer), this does a second later."""
        if not call.settled.wait(max(0.0, call.deadline - time.monotonic()) + 1.0):
            _end(call, LinkError(f"{self._host}:{self._port}: timed out"))

    def _connection(self, deadline: float) -> _LinkConnection:
        """The connection's thread, the connection dialled first if there is
        none (one caller dials at a time)."""
        with self._dialling:
            with self._lock:
                if self._closed:
                    raise ConnectionError("the link is closed")
                io = self._io
            if io is not None and io.alive:
                return io
            connection = _dial(self._host, self._port, self._tls, deadline)
            io = _LinkConnection(connection, f"{self._host}:{self._port}")
            with self._lock:
                closed = self._closed
                if not closed:
                    self._io = io
            if closed:  # closed while dialling: close() did not see this one
                io.fail(ConnectionError("the link is closed"))
                raise ConnectionError("the link is closed")
            io.start()
            return io


class _LinkConnection:
    """One connection of a :class:`ConcurrentLink` and the thread that alone
    reads and writes it: it sends the frames of calls as they are added,
    reads answer frames and hands them to their calls, and fails calls past
    their deadline."""

    def __init__(self, connection: socket.socket, where: str) -> None:
        self._connection = connection
        self._where = where
        self._lock = threading.Lock()
        self._calls: dict[int, _Call] = {}
        #: Requests that timed out here, with the room their answers had
        #: left: frames for them may still come, and are read and dropped.
        self._late: OrderedDict[int, int] = OrderedDict()
        self._outbox: list[bytes] = []
        self._wake_in, self._wake_out = socket.socketpair()
        self._wake_in.setblocking(False)
        self._wake_out.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(connection, selectors.EVENT_READ)
        self._selector.register(self._wake_out, selectors.EVENT_READ)
        self._failed: LinkError | None = None
        self._thread = threading.Thread(target=self._run, name="cluster-link-io", daemon=True)

    @property
    def alive(self) -> bool:
        return self._failed is None

    def start(self) -> None:
        self._thread.start()

    def add(self, request_id: int, call: _Call) -> None:
        """Send ``call``'s frame.

        Raises:
            ConnectionError: the connection failed meanwhile.
        """
        with self._lock:
            if self._failed is not None:
                raise ConnectionError(str(self._failed))
            self._calls[request_id] = call
            self._outbox.append(call.frame)
        self._wake()

    def fail(self, error: Exception) -> None:
        """End the connection: every call in flight fails with ``error``."""
        with self._lock:
            if self._failed is None:
                self._failed = LinkError(f"{self._where}: {error}")
            failed = self._failed
            calls, self._calls = list(self._calls.values()), {}
        close_connection(self._connection)
        self._wake()
        for call in calls:
            _end(call, failed)

    def expire(self, now: float) -> None:
        """Fail the calls whose deadline is before ``now``, each alone."""
        with self._lock:
            due = [i for i, call in self._calls.items() if call.deadline <= now]
            expired = [self._calls.pop(i) for i in due]
            for request_id, call in zip(due, expired, strict=True):
                self._late[request_id] = call.room
                if len(self._late) > MAX_OUTSTANDING:
                    self._late.popitem(last=False)
        for call in expired:
            _end(call, LinkError(f"{self._where}: timed out"))

    def _wake(self) -> None:
        try:
            self._wake_in.send(b"\0")
        except OSError:  # already awake, or closed
            pass

    def _run(self) -> None:
        try:
            reader = _FrameReader(self._connection, _ANSWER_HEADER, IO_TIMEOUT_S)
            while self._failed is None:
                while (frame := reader.frame(self._room)) is not None:
                    self._take(*frame)
                pending = reader.pending()
                events = self._selector.select(0.0 if pending else self._next_timeout())
                self._send_outbox()
                if pending or any(key.fileobj is self._connection for key, _ in events):
                    reader.fill()
                self.expire(time.monotonic())
        except (OSError, ValueError) as exc:
            self.fail(exc)
        finally:
            self.fail(ConnectionError("the connection ended"))
            self._selector.close()
            self._wake_in.close()
            self._wake_out.close()

    def _next_timeout(self) -> float | None:
        with self._lock:
            deadlines = [call.deadline for call in self._calls.values()]
        return None if not deadlines else max(0.0, min(deadlines) - time.monotonic())

    def _send_outbox(self) -> None:
        try:
            while self._wake_out.recv(4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            frames, self._outbox = self._outbox, []
        for frame in frames:
            self._connection.sendall(frame)

    def _room(self, header: tuple[int, ...]) -> int:
        """The room the answers of the request an answer ``header`` names
        have left.

        Raises:
            ValueError: a request never sent (or past its timeout long ago).
        """
        request_id = header[1]
        with self._lock:
            call = self._calls.get(request_id)
            if call is not None:
                return call.room
            late_room = self._late.get(request_id)
        if late_room is None:
            raise ValueError(f"an answer frame for request {request_id}, not in flight")
        return late_room

    def _take(self, header: tuple[int, ...], data: bytes) -> None:
        """Hand an answer frame to its call (one past its timeout: dropped).

        Raises:
            ValueError: a frame of a kind or item its request cannot have,
                or that does not parse.
        """
        length, request_id, kind, item = header
        with self._lock:
            call = self._calls.get(request_id)
            if call is None:
                if request_id in self._late:
                    self._late[request_id] -= length
                return
        call.room -= length
        if kind == WHOLE:
            self._finish(request_id)
            whole = _parse(call.method.response, data)
            with call.lock:
                call.whole = whole
            _end(call, None)
            return
        if kind not in (ITEM, PARKED) or not 0 <= item < len(call.states):
            raise ValueError(f"an answer frame of kind {kind} for item {item}")
        answer = _parse(call.method.response, data) if kind == ITEM else None
        with call.lock:
            state = call.states[item]
            if state == ITEM or (kind == PARKED and (state == PARKED or length)):
                raise ValueError(f"a frame of kind {kind} for item {item} in state {state}")
            if call.done:  # failed meanwhile (the link was closed)
                return
            call.states[item] = kind
            if state == 0:
                call.unsettled -= 1
            if kind == ITEM:
                call.left -= 1
                assert call.deliver is not None
                call.deliver(item, answer)
            last = call.left == 0
            if call.unsettled == 0 and not last:
                call.settled.set()
        if last:
            self._finish(request_id)
            _end(call, None)

    def _finish(self, request_id: int) -> None:
        with self._lock:
            self._calls.pop(request_id, None)


def _end(call: _Call, error: LinkError | None) -> None:
    """``call`` is done: answered (``error`` None), or failed with ``error``
    (each item not answered yet gets it)."""
    with call.lock:
        if call.done:
            return
        call.done = True
        if error is not None:
            call.error = error
            if call.deliver is not None:
                for item, state in enumerate(call.states):
                    if state != ITEM:
                        call.deliver(item, error)
        call.settled.set()
    call.release()


def _socket_principal(sock: socket.socket) -> str | None:
    """``User:<common name>`` of a TLS peer's certificate, None without TLS."""
    return certificate_principal(sock.getpeercert()) if isinstance(sock, ssl.SSLSocket) else None
