"""A gateway's client connections: who may connect, how requests are read
and their answers written, and authentication on the connection.

Each connection reads requests as they come and answers them in request
order (Kafka's pipelining): every request is handled in a task of its own,
and one writer awaits the tasks in arrival order. Reading waits when
:data:`MAX_IN_FLIGHT` answers are pending or when the listener's budget of
request bytes (``queued.max.request.bytes``) has no room for the next frame.
Who the client is comes from :mod:`raftcoord.kafka.auth`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import struct
import time
from collections.abc import Callable, Coroutine
from typing import Any

from raftcoord.kafka import messages as m
from raftcoord.kafka.apis.common import Data
from raftcoord.kafka.auth import (
    CredentialLookup,
    SaslExchange,
    server_context,
)
from raftcoord.kafka.backend import CALLER
from raftcoord.kafka.metrics import GatewayMetrics
from raftcoord.protocol.acl import Principal
from raftcoord.protocol.admission import HandshakeSlots
from raftcoord.protocol.config import ClusterConfig, KafkaListener
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.process import LogLimiter
from raftcoord.protocol.tls import ANONYMOUS, certificate_principal

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
#: Largest request frame accepted (Kafka's socket.request.max.bytes).
MAX_REQUEST_BYTES = 100 * 1024 * 1024
#: A request frame's body must arrive within this many seconds of its size
#: (and of room for it in the budget), else the connection is closed: a
#: client trickling a frame cannot hold its share of memory for long.
FRAME_READ_TIMEOUT_S = 30.0
#: An answer must be taken by the client (written to the socket) within this
#: many seconds, else the connection is closed: a client that sends and never
#: reads cannot pin its answers, and its share of memory, for good.
FRAME_WRITE_TIMEOUT_S = 30.0
#: Requests of one connection handled or answered and waiting to be sent,
#: at most, before reading waits.
MAX_IN_FLIGHT = 64
#: Frames up to this size draw on a share of ``queued.max.request.bytes`` of
#: their own (:data:`SMALL_SHARE`), so that big frames waiting for room never
#: hold up small requests.
SMALL_FRAME_BYTES = 1 << 20
SMALL_SHARE = 8
#: The largest request frame before a connection is authenticated: an
#: ApiVersions, SaslHandshake or SaslAuthenticate request, well under 1 KiB
#: from every client (Kafka's sasl.server.max.receive.size is 512 KiB).
MAX_UNAUTHENTICATED_FRAME = 64 * 1024
#: The bytes of frames of connections not authenticated yet, all together:
#: a budget of their own, so that strangers announcing frames they never
#: send hold up nobody who has logged in (only each other's logins).
UNAUTHENTICATED_BUDGET = 8 << 20
#: A connection must be authenticated (its TLS handshake done and, on a
#: SASL_SSL listener, its SASL exchange) within this many seconds of its
#: accept, else it is closed.
AUTHENTICATION_TIMEOUT_S = 10.0
#: Connections in their TLS handshake from one client address, and from all
#: (:class:`raftcoord.protocol.admission.HandshakeSlots`); more are closed at
#: once. asyncio gives each a read buffer of 256 KiB from its accept, so
#: these bound what connections that never finish TLS hold: about 75 MiB.
MAX_HANDSHAKES_PER_IP = 64
MAX_HANDSHAKES = 256
#: Log lines about single connections (refused, closed, failed to
#: authenticate) per second, at most: a client that reconnects in a loop
#: (a gRPC client on the Kafka port) cannot flood the log.
CONNECTION_LOGS_PER_S = 5.0
#: Client addresses whose connection rate is tracked at most (beyond, the
#: idle ones are forgotten).
MAX_TRACKED_ADDRESSES = 10_000

#: The response frame of one request frame, or None when none is sent
#: (acks=0 produce); raises :class:`CloseConnection` when it cannot be made.
Answerer = Callable[[bytes], Coroutine[Any, Any, bytes | None]]


class ByteBudget:
    """Bytes of request frames held at once, at most :attr:`total`; a frame
    waits until there is room for it (not first come, first served: a smaller
    frame may pass a bigger one, which then waits up to its read limit)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._room = asyncio.Condition()

    async def take(self, n: int) -> None:
        async with self._room:
            await self._room.wait_for(lambda: self.free >= n)
            self.free -= n

    def give(self, n: int) -> None:
        self.free += n
        asyncio.get_running_loop().create_task(self._wake())

    async def _wake(self) -> None:
        async with self._room:
            self._room.notify_all()


def _release(budget: ByteBudget, size: int, _answered: asyncio.Task[bytes | None]) -> None:
    """A frame's bytes leave the budget once its answer is done (or cancelled)."""
    budget.give(size)


class CreationRate:
    """New connections per client address: at most ``rate`` a second, in
    bursts of ``rate`` (a token bucket per address); a negative rate lets
    every one through. Addresses whose bucket is full again are forgotten
    once :data:`MAX_TRACKED_ADDRESSES` are tracked."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._buckets: dict[str, tuple[float, float]] = {}  # ip -> (tokens, when)

    def allow(self, ip: str, now: float | None = None) -> bool:
        if self.rate < 0:
            return True
        now = time.monotonic() if now is None else now
        tokens, when = self._buckets.get(ip, (float(self.rate), now))
        tokens = min(float(self.rate), tokens + (now - when) * self.rate)
        allowed = tokens >= 1.0
        self._buckets[ip] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > MAX_TRACKED_ADDRESSES:
            self._buckets = {
                a: (t, w)
                for a, (t, w) in self._buckets.items()
                if t + (now - w) * self.rate < self.rate
            }
        return allowed


class CloseConnection(Exception):
    """The connection must be closed instead of answered."""


class Connections:
    """The open client connections of one listener (``len()`` counts them)
    and how each is served: the limits on opening one, the listener's
    budget of request bytes, reading requests, writing answers in order."""

    def __init__(
        self,
        config: ClusterConfig,
        listener: KafkaListener,
        answer: Answerer,
        credentials: CredentialLookup,
        metrics: GatewayMetrics | None,
    ) -> None:
        self.config = config
        self.listener = listener
        self._answer = answer
        self._credentials = credentials
        self._metrics = metrics
        #: TLS of the listener (SSL, SASL_SSL).
        self._tls = server_context(config, listener)
        settings = config.settings
        small = settings.queued_max_request_bytes // SMALL_SHARE
        self._small_frames = ByteBudget(small)
        self._large_frames = ByteBudget(settings.queued_max_request_bytes - small)
        self._unauthenticated_frames = ByteBudget(UNAUTHENTICATED_BUDGET)
        self._handshakes = HandshakeSlots(MAX_HANDSHAKES_PER_IP, MAX_HANDSHAKES)
        self._largest_frame = min(MAX_REQUEST_BYTES, self._large_frames.total)
        self._idle_s = settings.connections_max_idle_ms / 1000
        self._open: set[asyncio.Task[None]] = set()
        #: Open connections per client address (max.connections.per.ip).
        self._per_ip: collections.Counter[str] = collections.Counter()
        #: New connections per client address (max.connection.creation.rate.per.ip).
        self._creations = CreationRate(settings.max_connection_creation_rate_per_ip)

    def __len__(self) -> int:
        return len(self._open)

    def held_bytes(self) -> int:
        """Bytes of request frames held now (read, not yet answered)."""
        budgets = (self._small_frames, self._large_frames, self._unauthenticated_frames)
        return sum(b.total - b.free for b in budgets)

    async def listen(self) -> asyncio.Server:
        """Serve the listener's address (a connection's TLS handshake, if
        any, is made once it is counted: :meth:`serve`)."""
        host, port = self.listener.address.rsplit(":", 1)
        return await asyncio.start_server(self.serve, host, int(port))

    async def close(self) -> None:
        """Close every open connection."""
        for task in list(self._open):
            task.cancel()
        await asyncio.gather(*self._open, return_exceptions=True)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read requests until the client closes; answer them in order."""
        this = asyncio.current_task()
        assert this is not None
        settings = self.config.settings
        address = writer.get_extra_info("peername")
        ip = str(address[0]) if isinstance(address, tuple) and address else ""
        refused: tuple[str, int] | None = None
        if len(self._open) >= settings.max_connections:
            refused = ("max.connections", settings.max_connections)
        elif self._per_ip[ip] >= settings.max_connections_per_ip:
            refused = ("max.connections.per.ip", settings.max_connections_per_ip)
        elif not self._creations.allow(ip):
            refused = (
                "max.connection.creation.rate.per.ip",
                settings.max_connection_creation_rate_per_ip,
            )
        if refused is not None:
            _connection_log(
                logging.WARNING,
                "event=connection_refused ip=%s reason=%s limit=%d",
                ip,
                *refused,
            )
            if self._metrics is not None:
                self._metrics.refused.labels(refused[0]).inc()
            writer.transport.abort()
            return
        self._open.add(this)
        self._per_ip[ip] += 1
        if self._metrics is not None:
            self._metrics.opened.inc()
        # Counted from the accept: the TLS handshake and the login come after,
        # within AUTHENTICATION_TIMEOUT_S of it.
        deadline = time.monotonic() + AUTHENTICATION_TIMEOUT_S
        if self._tls is not None:
            if not self._handshakes.take(ip):
                self._forget(this, ip)
                writer.transport.abort()
                _connection_log(
                    logging.WARNING,
                    "event=connection_refused ip=%s reason=tls_handshakes limit=%d",
                    ip,
                    MAX_HANDSHAKES_PER_IP,
                )
                if self._metrics is not None:
                    self._metrics.refused.labels("tls.handshakes").inc()
                return
            try:
                await writer.start_tls(self._tls, ssl_handshake_timeout=AUTHENTICATION_TIMEOUT_S)
            except (OSError, TimeoutError, asyncio.CancelledError) as exc:
                self._forget(this, ip)
                writer.transport.abort()
                _connection_log(
                    logging.INFO, "event=connection_closed ip=%s reason=tls_handshake %r", ip, exc
                )
                return
            finally:
                self._handshakes.give_back(ip)
        # Who the client is (raftcoord.kafka.auth): anonymous on a PLAINTEXT
        # listener, its certificate's principal on SSL, SASL's on SASL_SSL.
        protocol = self.listener.security_protocol
        tls_principal = None
        if self._tls is not None:  # a certificate without a common name is anonymous
            tls_principal = certificate_principal(writer.get_extra_info("peercert"))
        sasl = SaslExchange(self.config, self.listener, self._credentials)
        known: str | None = None
        if protocol == "PLAINTEXT":
            known = ANONYMOUS
        elif protocol == "SSL":
            known = tls_principal or ANONYMOUS
        authenticated = known is not None
        if known is not None:
            CALLER.set(Principal(known, ip))
        answers: asyncio.Queue[asyncio.Task[bytes | None]] = asyncio.Queue(MAX_IN_FLIGHT)
        sender = asyncio.create_task(self._send_in_order(answers, writer))
        try:
            while True:
                # Until it is authenticated, a connection's every wait ends by
                # its deadline.
                wait_s = self._idle_s if authenticated else deadline - time.monotonic()
                size_bytes = await asyncio.wait_for(reader.readexactly(_SIZE.size), wait_s)
                (size,) = _SIZE.unpack(size_bytes)
                largest = self._largest_frame if authenticated else MAX_UNAUTHENTICATED_FRAME
                if not 0 < size <= largest:
                    _connection_log(
                        logging.INFO,
                        "event=connection_closed ip=%s reason=frame_size size=%d",
                        ip,
                        size,
                    )
                    break
                small = size <= min(SMALL_FRAME_BYTES, self._small_frames.total)
                budget = self._small_frames if small else self._large_frames
                read_s = FRAME_READ_TIMEOUT_S
                if not authenticated:
                    budget = self._unauthenticated_frames
                    read_s = deadline - time.monotonic()
                await asyncio.wait_for(budget.take(size), read_s)
                if not authenticated:
                    read_s = deadline - time.monotonic()
                try:
                    frame = await asyncio.wait_for(reader.readexactly(size), read_s)
                except BaseException:
                    budget.give(size)
                    raise
                api_key = m.api_of(frame)[0] if len(frame) >= 4 else -1
                if api_key in (m.SASL_HANDSHAKE, m.SASL_AUTHENTICATE):
                    budget.give(size)
                    try:
                        response, failed = await self._sasl(frame, sasl)
                    except CloseConnection as exc:
                        _connection_log(
                            logging.INFO,
                            "event=connection_closed ip=%s reason=bad_sasl_request error=%r",
                            ip,
                            str(exc),
                        )
                        break
                    await answers.put(asyncio.create_task(_ready(response)))
                    if sasl.principal is not None and not authenticated:
                        authenticated = True
                        CALLER.set(Principal(sasl.principal, ip))
                    if failed and not authenticated:  # Kafka closes after a failed attempt
                        _connection_log(logging.INFO, "event=authentication_failed ip=%s", ip)
                        await answers.put(asyncio.create_task(_closing("authentication failed")))
                        await _closed(writer, FRAME_READ_TIMEOUT_S)  # the answer is sent first
                        break
                    continue
                if not authenticated and api_key != m.API_VERSIONS:
                    log.info(
                        "event=connection_closed reason=unauthenticated_request api=%d", api_key
                    )
                    budget.give(size)
                    break
                answer = asyncio.create_task(self._answer(frame))
                answer.add_done_callback(functools.partial(_release, budget, size))
                await answers.put(answer)
        except TimeoutError:
            _connection_log(
                logging.INFO, "event=connection_closed ip=%s reason=idle_or_slow_frame", ip
            )
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._forget(this, ip)
            writer.transport.abort()
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            while not answers.empty():
                answers.get_nowait().cancel()

    def _forget(self, connection: asyncio.Task[None], ip: str) -> None:
        """``connection`` (from ``ip``) is closed."""
        self._open.discard(connection)
        self._per_ip[ip] -= 1
        if not self._per_ip[ip]:
            del self._per_ip[ip]

    @staticmethod
    async def _send_in_order(
        answers: asyncio.Queue[asyncio.Task[bytes | None]], writer: asyncio.StreamWriter
    ) -> None:
        """Write each answer when its turn comes. A request that cannot be
        answered (malformed, its handler failed) closes the
        connection, as Kafka's brokers do; the client then retries on a new
        one. So does any failure to write: the reader then meets the closed
        connection, and until it does, what it queues is cancelled, so that
        it never waits for room in ``answers``."""
        try:
            while True:
                frame = await (await answers.get())
                if frame is not None:
                    writer.write(frame)
                    await asyncio.wait_for(writer.drain(), FRAME_WRITE_TIMEOUT_S)
        except TimeoutError:
            _connection_log(logging.INFO, "event=connection_closed reason=answers_not_read")
        except CloseConnection as exc:
            _connection_log(logging.INFO, "event=connection_closed reason=%r", str(exc))
        except ConnectionError as exc:
            _connection_log(
                logging.INFO, "event=connection_closed reason=send_failed error=%r", str(exc)
            )
        except Exception:
            log.exception("event=connection_closed reason=answer_not_sent")
        writer.transport.abort()
        while True:
            (await answers.get()).cancel()

    async def _sasl(self, frame: bytes, sasl: SaslExchange) -> tuple[bytes, bool]:
        """The response frame of a SaslHandshake or SaslAuthenticate, and
        whether the step failed.

        Raises:
            CloseConnection: the frame does not decode.
        """
        try:
            request = m.decode_request(frame)
        except m.MalformedRequest as exc:
            raise CloseConnection(str(exc)) from exc
        if request.api_key == m.SASL_HANDSHAKE:
            code = sasl.handshake(request.body.mechanism)
            data: Data = {"error_code": code, "mechanisms": list(sasl.offered)}
            message = ""
        else:
            code, message, server_bytes = await sasl.authenticate(bytes(request.body.auth_bytes))
            data = {
                "error_code": code,
                "error_message": message or None,
                "auth_bytes": server_bytes,
                "session_lifetime": 0,
            }
        response = m.encode_response(
            request.api_key, request.api_version, request.correlation_id, data
        )
        return response, code is not ErrorCode.NONE


async def _ready(frame: bytes) -> bytes:
    return frame


async def _closing(why: str) -> bytes:
    raise CloseConnection(why)


async def _closed(writer: asyncio.StreamWriter, timeout_s: float) -> None:
    """Wait (at most ``timeout_s``) until the connection's sender closed it."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not writer.transport.is_closing() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)


_CONNECTION_LOG_LIMIT = LogLimiter(CONNECTION_LOGS_PER_S)


def _connection_log(level: int, message: str, *args: object) -> None:
    """A log line about one connection, within :data:`CONNECTION_LOGS_PER_S`
    (the first line after a quiet spell says how many were left out)."""
    _CONNECTION_LOG_LIMIT.log(log, level, message, *args)
