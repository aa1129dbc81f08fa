"""The coordinators' Raft transport: pysyncobj's messages over our own TCP framing.

pysyncobj hands every message to a ``Transport``; :class:`RaftTransport` is
the one the shards use (``SyncObj(..., transportClass=...)``, see
:class:`raftcoord.coordinator.raft.RaftGroup`). The bytes are
:mod:`raftcoord.coordinator.raft_wire`'s; this module owns the sockets,
driven by pysyncobj's poller on the shard's tick thread (non-blocking
throughout).

* **Peers authenticate before anything they send is decoded.** An incoming
  connection gets :data:`raft_wire.HANDSHAKE_FRAME_BYTES`-sized frames
  until its HELLO names a member of this shard's Raft group and, with a
  cluster key, its AUTH proves the key; then every frame is tagged with the
  connection's session key. Anything else (a stranger's address, a wrong
  MAC or tag, an oversized frame, bytes that do not decode, a handshake
  not done within the connection timeout) drops the connection and is
  logged with the peer's address. There is no read-only peer and no
  utility command.
* **Bounded.** Frames are capped before they are read
  (:data:`raft_wire.MAX_FRAME_BYTES` once authenticated), a message
  reassembled from fragments at :attr:`RaftTransportSettings.max_message_bytes`,
  accepted connections not yet authenticated per source address
  (:attr:`RaftTransportSettings.max_handshakes_per_source` from one that is
  not a member's host, :attr:`RaftTransportSettings.max_handshakes` from all
  of those and from each member's host: strangers cannot take the members'
  places), and each peer's unsent bytes
  at :attr:`RaftTransportSettings.max_send_queue_bytes`: over it a message
  is not queued and :meth:`send` says so. A dropped AppendEntries costs
  nothing but time: the follower refuses the next one (its log does not
  reach the ``prevLogIdx``) and the leader resends from where it is.
* **One write per peer per tick.** :meth:`send` queues; the queue goes to
  the socket when the tick's own work is done (pysyncobj's tick callback,
  just before it polls) and after each batch of received messages (their
  answers), so the AppendEntries of a new entry and the one carrying the
  commit index of the entry applied in the same tick leave in one write.
* **Reconnects** of the member that dials (the one with the greater address,
  as in pysyncobj) back off from a quarter of ``connectionRetryTime`` to
  ``connectionRetryTime`` (0.2 s), doubling, with jitter, and start over
  once a connection opens. The ceiling stays below the election timeout:
  a member that restarts hears from its leader before its own timeout
  passes (its pre-vote would be refused while the leader is alive, see
  :mod:`raftcoord.coordinator.election`, but costs a round of messages).
* **Directory ids.** Votes, vote requests, pre-votes and their answers, and
  acknowledgements go out with this member's data directory id
  (:attr:`RaftTransportSettings.directory_id`), inside the authenticated
  frames; the shard decides what they count for
  (:mod:`raftcoord.coordinator.voters`).
* **A follower never forwards a command to the leader** (pysyncobj's
  ``apply_command``): the coordinator proposes only on the leader, and a
  proposal that meets a leadership change in the queue is answered
  NOT_LEADER here, at once, instead of being sent.
* **Large entries**: pysyncobj sends an entry of ``appendEntriesBatchSizeBytes``
  or more as chunks of its pickle. The transport joins the chunks of the
  entry on the sending side (they are this process's own bytes, from its
  own log) and sends the entry as one message, fragmented into frames; the
  receiving side never sees a pickle.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import socket
import time
from dataclasses import dataclass
from typing import Any

from pysyncobj.config import FAIL_REASON
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.transport import Transport, TransportNotReadyError

from raftcoord.coordinator import raft_wire
from raftcoord.coordinator.raft_wire import FrameReader, FrameSeal, WireError
from raftcoord.protocol.admission import HandshakeSlots, host_addresses
from raftcoord.protocol.process import LogLimiter

log = logging.getLogger("raftcoord.coordinator.raft_transport")

#: Bytes read from one socket per poller event, so that one busy peer does
#: not starve the others in a tick.
READ_PER_EVENT = 4 << 20
RECV_BYTES = 256 << 10
#: Unknown-peer and handshake failures logged per second, at most.
LOGS_PER_S = 5.0

CONNECTING, HANDSHAKE, OPEN, CLOSED = "connecting", "handshake", "open", "closed"
#: pysyncobj's messages that go out with the sender's directory id.
DIRECTORY_MESSAGES = frozenset(
    {"next_node_idx", "request_vote", "response_vote", "pre_vote", "pre_vote_answer"}
)


@dataclass(frozen=True)
class RaftTransportSettings:
    """How a shard's Raft members talk: the cluster key (None: unauthenticated,
    ``--insecure-raft``), this member's data directory id and the bounds."""

    key: bytes | None
    #: The member's data directory id, sent with its votes, vote requests,
    #: pre-votes and acknowledgements (empty: a member without one, as in
    #: tests of plain pysyncobj groups).
    directory_id: str = ""
    #: The largest message (an AppendEntries with its entries) reassembled from
    #: frames: above the largest entry the shard proposes (32 request threads
    #: of at most 4 MiB each), and a few MiB more.
    max_message_bytes: int = 136 << 20
    #: Unsent bytes per peer; a message that would go past it is not queued.
    max_send_queue_bytes: int = 256 << 20
    #: Accepted connections not yet authenticated from one address that is
    #: not a member's host, and from all of those (a member's host has
    #: ``max_handshakes`` of its own: :class:`HandshakeSlots`).
    max_handshakes_per_source: int = 8
    max_handshakes: int = 64


class _Connection:
    """One TCP connection to a peer, dialled (``initiator``) or accepted."""

    def __init__(self, sock: socket.socket, initiator: bool, peer: str, started: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.initiator = initiator
        self.peer = peer  # host:port the socket is connected to (accepted: the remote end)
        self.node: Any = None  # the pysyncobj node, once known
        self.state = CONNECTING if initiator else HANDSHAKE
        self.started = started
        self.last_read = started
        self.last_sent = started  # the last time a Raft message was queued (not handshakes)
        self.reader = FrameReader(raft_wire.HANDSHAKE_FRAME_BYTES)
        self.seal: FrameSeal | None = None
        self.out = bytearray()
        self.nonce = os.urandom(raft_wire.NONCE_BYTES)
        #: Accepted: the address holding a place in the handshake slots
        #: until the connection opens or closes (None once given back).
        self.source: str | None = None
        self.peer_nonce = b""
        self.fragments: list[bytes] = []
        self.fragment_bytes = 0
        self.events = 0  # what the poller watches the socket for


class RaftTransport(Transport):  # type: ignore[misc]  # pysyncobj is untyped
    """pysyncobj's transport for one shard's member (see the module docstring)."""

    def __init__(
        self, syncObj: Any, selfNode: Any, otherNodes: Any, *, settings: RaftTransportSettings
    ) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        if selfNode is None:
            raise ValueError("a coordinator's Raft member has an address (no read-only members)")
        self._sync = syncObj
        self._conf = syncObj.conf
        self._poller = syncObj._poller  # pysyncobj's poller, ticked by the shard's thread
        self._settings = settings
        self._key = settings.key
        self._self = selfNode
        self._address: str = selfNode.address
        self._members: dict[str, Any] = {n.address: n for n in otherNodes}
        self._open: dict[Any, _Connection] = {}
        self._by_fd: dict[int, _Connection] = {}
        self._retry_at: dict[Any, float] = {}
        self._retry_s: dict[Any, float] = {}
        self._chunks: dict[Any, bytearray] = {}
        self._unsent: set[_Connection] = set()  # messages queued, not yet handed to the socket
        self._server: socket.socket | None = None
        self._bind_failures = 0
        self._log_limit = LogLimiter(LOGS_PER_S)
        self._handshakes = HandshakeSlots(
            settings.max_handshakes_per_source,
            settings.max_handshakes,
            host_addresses(self._members),
            settings.max_handshakes,
        )
        self._destroyed = False
        syncObj.addOnTickCallback(self._on_tick)

    # --- pysyncobj's Transport -----------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._server is not None

    def tryGetReady(self) -> None:
        if self._server is not None:
            return
        host, port = self._address.rsplit(":", 1)
        server = socket.socket(_family(host), socket.SOCK_STREAM)
        try:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind((host, int(port)))
            server.listen(16)
            server.setblocking(False)
        except OSError as exc:
            server.close()
            self._bind_failures += 1
            retries = self._conf.maxBindRetries
            log.warning("event=raft_bind_failed address=%s error=%s", self._address, exc)
            if retries and self._bind_failures >= retries:
                raise TransportNotReadyError from exc
            time.sleep(self._conf.bindRetryTime)
            return
        self._server = server
        self._poller.subscribe(
            server.fileno(), self._on_accept, POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
        )

    def waitReady(self) -> None:
        if self._server is None:
            raise TransportNotReadyError

    def addNode(self, node: Any) -> None:
        raise ValueError("Raft membership is fixed by the cluster config")

    def dropNode(self, node: Any) -> None:
        raise ValueError("Raft membership is fixed by the cluster config")

    def send(self, node: Any, message: Any) -> bool:
        kind = message.get("type")
        if kind == "apply_command":
            self._refuse_forward(node, message)
            return False
        if kind == "append_entries" and "transmission" in message:
            message = self._joined_entry(node, message)
            if message is None:
                return True
        elif kind in DIRECTORY_MESSAGES:
            message = {**message, "directory": self._settings.directory_id}
        conn = self._open.get(node)
        if conn is None:
            return False
        try:
            payload = raft_wire.encode_message(message)
        except WireError:
            log.error("event=raft_send_refused peer=%s kind=%s", node.address, kind)
            return False
        if len(payload) > self._settings.max_message_bytes:
            log.error(
                "event=raft_message_too_large peer=%s bytes=%d max=%d: not sent",
                node.address,
                len(payload),
                self._settings.max_message_bytes,
            )
            return False
        if len(conn.out) + len(payload) > self._settings.max_send_queue_bytes:
            return False  # back-pressure: the peer is this far behind reading
        for data in raft_wire.frames_of(payload, conn.seal):
            conn.out += data
        conn.last_sent = time.monotonic()
        self._unsent.add(conn)
        return True

    def destroy(self) -> None:
        self._destroyed = True
        self.setOnMessageReceivedCallback(None)
        self.setOnNodeConnectedCallback(None)
        self.setOnNodeDisconnectedCallback(None)
        for conn in list(self._by_fd.values()):
            self._close(conn, None)
        if self._server is not None:
            self._poller.unsubscribe(self._server.fileno())
            self._server.close()
            self._server = None

    # --- what pysyncobj asks that is not sent ---------------------------------------------

    def _refuse_forward(self, node: Any, message: dict[str, Any]) -> None:
        """A follower's command for the leader: answered NOT_LEADER here."""
        if "request_id" in message:
            self._onMessageReceived(
                node,
                {
                    "type": "apply_command_response",
                    "request_id": message["request_id"],
                    "error": FAIL_REASON.NOT_LEADER,
                },
            )

    def _joined_entry(self, node: Any, message: dict[str, Any]) -> dict[str, Any] | None:
        """A chunk of a large entry; the AppendEntries carrying the whole entry
        once its last chunk is here (see the module docstring)."""
        kind, data = message["transmission"], message["data"]
        if kind == "start":
            self._chunks[node] = bytearray(data)
            return None
        chunks = self._chunks.get(node)
        if chunks is None:
            return None
        chunks += data
        if kind != "finish":
            return None
        try:
            # This process's own pickle of an entry of its own log (a tuple of
            # bytes and two ints): nothing here came from a socket.
            entry = pickle.loads(chunks)
        except (EOFError, pickle.UnpicklingError):
            # pysyncobj marks the end by the entry's length, not its pickle's,
            # so "finish" can come before the last chunk.
            return None
        del self._chunks[node]
        whole = {k: v for k, v in message.items() if k not in ("transmission", "data")}
        return {**whole, "entries": [tuple(entry)]}

    # --- connections ----------------------------------------------------------------------

    def _on_tick(self) -> None:
        if self._destroyed or self._server is None:
            return
        self._flush_unsent()
        now = time.monotonic()
        timeout = self._conf.connectionTimeout
        for conn in list(self._by_fd.values()):
            if conn.state == OPEN:
                # Silent after being written to (a leader's AppendEntries, a
                # candidate's RequestVote): the peer is gone or stuck. Two
                # followers have nothing to say to each other; that is no
                # reason to drop their connection.
                if conn.last_sent > conn.last_read and now - conn.last_read > timeout:
                    # A member, not an intruder: reconnecting is routine (a
                    # refused vote has no answer in pysyncobj), so INFO.
                    self._close(conn, "no answer within the connection timeout", logging.INFO)
            elif now - conn.started > timeout:
                self._close(conn, f"not authenticated within {timeout:.1f} s")
        for address, node in self._members.items():
            if address < self._address and node not in self._open and not self._dialling(node):
                if now >= self._retry_at.get(node, 0.0):
                    self._dial(node, now)

    def _dialling(self, node: Any) -> bool:
        return any(c.node is node and c.initiator for c in self._by_fd.values())

    def _dial(self, node: Any, now: float) -> None:
        ceiling = self._conf.connectionRetryTime
        wait = min(ceiling, max(ceiling / 4, 2 * self._retry_s.get(node, 0.0)))
        self._retry_s[node] = wait
        self._retry_at[node] = now + wait * random.uniform(0.5, 1.0)
        host, port = node.address.rsplit(":", 1)
        sock = socket.socket(_family(host), socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.connect((host, int(port)))
        except BlockingIOError:
            pass
        except OSError:
            sock.close()
            return
        conn = _Connection(sock, True, node.address, now)
        conn.node = node
        self._register(conn)

    def _on_accept(self, fd: int, event: int) -> None:
        if self._server is None or fd != self._server.fileno():
            return
        for _ in range(16):
            try:
                sock, remote = self._server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("event=raft_accept_failed address=%s error=%s", self._address, exc)
                return
            peer = f"{remote[0]}:{remote[1]}"
            if not self._handshakes.take(remote[0]):
                self._log(
                    logging.WARNING,
                    "event=raft_peer_refused peer=%s reason=too many handshakes from that "
                    "address, or from addresses that are not the members'",
                    peer,
                )
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(sock, False, peer, time.monotonic())
            conn.source = remote[0]
            self._register(conn)

    def _register(self, conn: _Connection) -> None:
        self._by_fd[conn.fd] = conn
        self._subscribe(conn)

    def _subscribe(self, conn: _Connection) -> None:
        """Poll ``conn`` for reading, and for writing while it has unsent bytes
        (re-registered only when that changes)."""
        events = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
        if conn.out or conn.state == CONNECTING:
            events |= POLL_EVENT_TYPE.WRITE
        if events != conn.events:
            conn.events = events
            self._poller.subscribe(conn.fd, self._on_event, events)

    def _on_event(self, fd: int, event: int) -> None:
        conn = self._by_fd.get(fd)
        if conn is None or conn.state == CLOSED:
            return
        if conn.state == CONNECTING:
            error = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if error or event & POLL_EVENT_TYPE.ERROR:
                self._close(conn, None)  # the peer is down: retried with back-off
                return
            conn.state = HANDSHAKE
            hello = raft_wire.encode_hello(
                self._address, conn.node.address, conn.nonce, self._key is not None
            )
            conn.out += raft_wire.frame(0, hello, None)
            if self._key is None:
                self._opened(conn, None, None)
        if event & POLL_EVENT_TYPE.READ:
            self._read(conn)
        elif event & POLL_EVENT_TYPE.ERROR:
            self._close(conn, None)
        if conn.state != CLOSED:
            self._flush(conn)
        self._flush_unsent()  # the answers to what was read

    def _flush_unsent(self) -> None:
        while self._unsent:
            self._flush(self._unsent.pop())

    def _read(self, conn: _Connection) -> None:
        received = 0
        while received < READ_PER_EVENT:
            try:
                data = conn.sock.recv(RECV_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._close(conn, None)
                return
            if not data:
                self._close(conn, None)
                return
            received += len(data)
            conn.last_read = time.monotonic()
            conn.reader.feed(data)
            try:
                while conn.state != CLOSED:
                    frame = conn.reader.next_frame()
                    if frame is None:
                        break
                    self._on_frame(conn, *frame)
            except WireError as exc:
                self._close(conn, str(exc))
                return
            if conn.state == CLOSED or len(data) < RECV_BYTES:
                return  # a short read: the socket is drained (no EAGAIN round trip)

    def _on_frame(self, conn: _Connection, flags: int, payload: bytes) -> None:
        if conn.state == OPEN:
            self._on_message_frame(conn, flags, payload)
        elif conn.initiator:
            self._on_challenge(conn, payload)
        elif conn.node is None:
            self._on_hello(conn, payload)
        else:
            self._on_auth(conn, payload)

    def _on_hello(self, conn: _Connection, payload: bytes) -> None:
        initiator, dialled, nonce, authenticates = raft_wire.decode_hello(payload)
        node = self._members.get(initiator)
        if node is None or initiator <= self._address:
            raise WireError(f"HELLO from {initiator!r:.80}, not a member that dials this one")
        if dialled != self._address:
            raise WireError(f"HELLO for {dialled!r:.80}, this member is {self._address}")
        if authenticates != (self._key is not None):
            mode = "authenticates" if authenticates else "runs with --insecure-raft"
            raise WireError(f"the peer {mode} and this member does not")
        conn.node = node
        conn.peer_nonce = nonce
        if self._key is None:
            self._opened(conn, None, None)
            return
        mac = raft_wire.handshake_mac(
            self._key, "acceptor", nonce, conn.nonce, initiator, self._address
        )
        conn.out += raft_wire.frame(0, raft_wire.encode_challenge(conn.nonce, mac), None)

    def _on_challenge(self, conn: _Connection, payload: bytes) -> None:
        assert self._key is not None
        nonce, mac = raft_wire.decode_challenge(payload)
        peer = conn.node.address
        expected = raft_wire.handshake_mac(
            self._key, "acceptor", conn.nonce, nonce, self._address, peer
        )
        if not raft_wire.macs_equal(mac, expected):
            raise WireError("CHALLENGE with a wrong MAC: the peer does not hold the cluster key")
        own = raft_wire.handshake_mac(
            self._key, "initiator", conn.nonce, nonce, self._address, peer
        )
        conn.out += raft_wire.frame(0, raft_wire.encode_auth(own), None)
        send, receive = raft_wire.session_keys(self._key, conn.nonce, nonce, self._address, peer)
        self._opened(conn, send, receive)

    def _on_auth(self, conn: _Connection, payload: bytes) -> None:
        assert self._key is not None
        mac = raft_wire.decode_auth(payload)
        peer = conn.node.address
        expected = raft_wire.handshake_mac(
            self._key, "initiator", conn.peer_nonce, conn.nonce, peer, self._address
        )
        if not raft_wire.macs_equal(mac, expected):
            raise WireError("AUTH with a wrong MAC: the peer does not hold the cluster key")
        to_us, to_peer = raft_wire.session_keys(
            self._key, conn.peer_nonce, conn.nonce, peer, self._address
        )
        self._opened(conn, to_peer, to_us)

    def _opened(self, conn: _Connection, send_key: bytes | None, receive_key: bytes | None) -> None:
        if send_key is not None and receive_key is not None:
            conn.seal = FrameSeal(send_key)
            conn.reader.seal = FrameSeal(receive_key)
        conn.reader.max_frame = raft_wire.MAX_FRAME_BYTES
        conn.state = OPEN
        self._give_back(conn)
        conn.last_read = time.monotonic()
        node = conn.node
        old = self._open.get(node)
        if old is not None:
            self._close(old, None)  # the peer restarted: its new connection wins
        self._open[node] = conn
        self._retry_s.pop(node, None)
        self._onNodeConnected(node)

    def _on_message_frame(self, conn: _Connection, flags: int, payload: bytes) -> None:
        cap = self._settings.max_message_bytes
        if flags & ~raft_wire.MORE:
            raise WireError(f"unknown frame flags {flags}")
        if flags & raft_wire.MORE or conn.fragments:
            conn.fragment_bytes += len(payload)
            if conn.fragment_bytes > cap:
                raise WireError(f"a message of more than {cap} bytes")
            conn.fragments.append(payload)
            if flags & raft_wire.MORE:
                return
            payload = b"".join(conn.fragments)
            conn.fragments, conn.fragment_bytes = [], 0
        message = raft_wire.decode_message(payload, cap)
        self._onMessageReceived(conn.node, message)

    def _flush(self, conn: _Connection) -> None:
        self._unsent.discard(conn)
        if conn.state in (CONNECTING, CLOSED):
            return
        while conn.out:
            try:
                sent = conn.sock.send(conn.out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._close(conn, None)
                return
            del conn.out[:sent]
        if conn.state != CLOSED:
            self._subscribe(conn)

    def _close(self, conn: _Connection, reason: str | None, level: int = logging.WARNING) -> None:
        if conn.state == CLOSED:
            return
        was_open = conn.state == OPEN
        conn.state = CLOSED
        self._give_back(conn)
        self._by_fd.pop(conn.fd, None)
        self._unsent.discard(conn)
        self._poller.unsubscribe(conn.fd)
        try:
            conn.sock.close()
        except OSError:
            pass
        if reason is not None:
            self._log(
                level,
                "event=raft_peer_dropped peer=%s member=%s reason=%s",
                conn.peer,
                conn.node.address if conn.node is not None else "-",
                reason,
            )
        node = conn.node
        if was_open and self._open.get(node) is conn:
            del self._open[node]
            self._chunks.pop(node, None)
            self._onNodeDisconnected(node)

    def _give_back(self, conn: _Connection) -> None:
        """``conn``'s place among the connections in their handshake, if it holds one."""
        if conn.source is not None:
            self._handshakes.give_back(conn.source)
            conn.source = None

    def _log(self, level: int, fmt: str, *args: Any) -> None:
        self._log_limit.log(log, level, fmt, *args)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
