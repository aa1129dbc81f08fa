"""The Kafka gateway: an asyncio server speaking Kafka's protocol to clients
and the cluster's gRPC API to the coordinators and partition-log nodes.

Each connection reads requests as they come and answers them in request
order (Kafka's pipelining): every request is handled in a task of its own,
and one writer awaits the tasks in arrival order. How Kafka's brokers,
partition leaders and coordinators map onto gateways is in docs/kafka.md.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import resource
import signal
import struct
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc.aio

from raftcoord.kafka import messages as m
from raftcoord.kafka.auth import (
    SaslExchange,
    certificate_principal,
    server_context,
)
from raftcoord.kafka.backend import CALLER, NOT_PROCESSED, Backend, Unreachable
from raftcoord.kafka.metrics import GatewayMetrics
from raftcoord.protocol.acl import Principal
from raftcoord.protocol.config import ClusterConfig, KafkaListener
from raftcoord.protocol.errors import REDISCOVER, STALE_METADATA, ErrorCode
from raftcoord.protocol.limits import GROUP_MAX_WAIT_S, GROUP_WAIT_GRACE_S
from raftcoord.protocol.metrics import Metrics
from raftcoord.protocol.process import LogLimiter, configure_logging
from raftcoord.protocol.scram import ScramCredential
from raftcoord.protocol.tls import ANONYMOUS, node_identity
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2, partition_log_pb2
from raftcoord.protocol.wire import wire_state

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
#: The largest request frame before a connection is authenticated (Kafka's
#: sasl.server.max.receive.size).
MAX_UNAUTHENTICATED_FRAME = 512 * 1024
#: Log lines about single connections (refused, closed, failed to
#: authenticate) per second, at most: a client that reconnects in a loop
#: (a gRPC client on the Kafka port) cannot flood the log.
CONNECTION_LOGS_PER_S = 5.0
#: Client addresses whose connection rate is tracked at most (beyond, the
#: idle ones are forgotten).
MAX_TRACKED_ADDRESSES = 10_000
#: Open files the gateway needs besides its clients' connections (gRPC
#: channels, relays, logs).
SPARE_DESCRIPTORS = 256
CLUSTER_ID = "raftcoord"
#: Kafka's timestamps for ListOffsets: latest and earliest.
_LATEST, _EARLIEST = -1, -2
#: Kafka's "authorized operations not asked for" (DescribeGroups v3+).
_NO_AUTHORIZED_OPERATIONS = -(2**31)

Data = dict[str, Any]


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


class Gateway:
    """One gateway: ``listener`` of ``config``'s [[kafka_listeners]]."""

    def __init__(self, config: ClusterConfig, listener: KafkaListener) -> None:
        self.config = config
        self.listener = listener
        identity = node_identity(config, listener.node_id)
        self.backend = Backend(
            config, credentials=None if identity is None else identity.channel_credentials()
        )
        settings = config.settings
        small = settings.queued_max_request_bytes // SMALL_SHARE
        self._small_frames = ByteBudget(small)
        self._large_frames = ByteBudget(settings.queued_max_request_bytes - small)
        self._largest_frame = min(MAX_REQUEST_BYTES, self._large_frames.total)
        self._idle_s = settings.connections_max_idle_ms / 1000
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        #: Open connections per client address (max.connections.per.ip).
        self._per_ip: collections.Counter[str] = collections.Counter()
        #: New connections per client address (max.connection.creation.rate.per.ip).
        self._creations = CreationRate(settings.max_connection_creation_rate_per_ip)
        #: TLS of the listener (SSL, SASL_SSL).
        self._tls = server_context(config, listener)
        self._handlers: dict[int, Callable[[m.Request], Awaitable[Data | None]]] = {
            m.API_VERSIONS: self.api_versions,
            m.METADATA: self.metadata,
            m.FIND_COORDINATOR: self.find_coordinator,
            m.INIT_PRODUCER_ID: self.init_producer_id,
            m.ADD_PARTITIONS_TO_TXN: self.add_partitions_to_txn,
            m.ADD_OFFSETS_TO_TXN: self.add_offsets_to_txn,
            m.END_TXN: self.end_txn,
            m.TXN_OFFSET_COMMIT: self.txn_offset_commit,
            m.OFFSET_COMMIT: self.offset_commit,
            m.OFFSET_FETCH: self.offset_fetch,
            m.JOIN_GROUP: self.join_group,
            m.SYNC_GROUP: self.sync_group,
            m.HEARTBEAT: self.heartbeat,
            m.LEAVE_GROUP: self.leave_group,
            m.DESCRIBE_GROUPS: self.describe_groups,
            m.PRODUCE: self.produce,
            m.FETCH: self.fetch,
            m.LIST_OFFSETS: self.list_offsets,
            m.CREATE_TOPICS: self.create_topics,
            m.CREATE_ACLS: self.create_acls,
            m.DESCRIBE_ACLS: self.describe_acls,
            m.DELETE_ACLS: self.delete_acls,
            m.DESCRIBE_TRANSACTIONS: self.describe_transactions,
            m.LIST_TRANSACTIONS: self.list_transactions,
        }
        # SaslHandshake and SaslAuthenticate are the connection's own (_sasl).
        assert set(self._handlers) | {m.SASL_HANDSHAKE, m.SASL_AUTHENTICATE} == set(m.SUPPORTED)
        #: The gateway's Prometheus registry, when its listener has a metrics address.
        self.registry: Metrics | None = None
        self.metrics: GatewayMetrics | None = None
        if listener.metrics is not None:
            self.registry = Metrics()
            self.metrics = GatewayMetrics(
                self.registry,
                lambda: len(self._connections),
                lambda: sum(b.total - b.free for b in (self._small_frames, self._large_frames)),
            )

    # --- serving -----------------------------------------------------------------------

    async def start(self) -> None:
        host, port = self.listener.address.rsplit(":", 1)
        self._server = await asyncio.start_server(
            self._connection,
            host,
            int(port),
            ssl=self._tls,
            ssl_handshake_timeout=FRAME_READ_TIMEOUT_S if self._tls else None,
        )
        if self.registry is not None and self.listener.metrics is not None:
            self.registry.serve(self.listener.metrics, self.config, self.listener.node_id)
        log.info(
            "event=listening node=%d address=%s security_protocol=%s metrics=%s",
            self.listener.node_id,
            self.listener.address,
            self.listener.security_protocol,
            self.listener.metrics or "-",
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        await self.backend.close()
        if self.registry is not None:
            self.registry.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read requests until the client closes; answer them in order."""
        this = asyncio.current_task()
        assert this is not None
        settings = self.config.settings
        address = writer.get_extra_info("peername")
        ip = str(address[0]) if isinstance(address, tuple) and address else ""
        refused: tuple[str, int] | None = None
        if len(self._connections) >= settings.max_connections:
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
            if self.metrics is not None:
                self.metrics.refused.labels(refused[0]).inc()
            writer.transport.abort()
            return
        self._connections.add(this)
        self._per_ip[ip] += 1
        if self.metrics is not None:
            self.metrics.opened.inc()
        # Who the client is (raftcoord.kafka.auth): anonymous on a PLAINTEXT
        # listener, its certificate's principal on SSL, SASL's on SASL_SSL.
        protocol = self.listener.security_protocol
        tls_principal = None
        if self._tls is not None:  # a certificate without a common name is anonymous
            tls_principal = certificate_principal(writer.get_extra_info("peercert"))
        sasl = SaslExchange(self.config, self.listener, self._credential)
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
                size_bytes = await asyncio.wait_for(reader.readexactly(_SIZE.size), self._idle_s)
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
                await asyncio.wait_for(budget.take(size), FRAME_READ_TIMEOUT_S)
                try:
                    frame = await asyncio.wait_for(reader.readexactly(size), FRAME_READ_TIMEOUT_S)
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
            self._connections.discard(this)
            self._per_ip[ip] -= 1
            if not self._per_ip[ip]:
                del self._per_ip[ip]
            writer.transport.abort()
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            while not answers.empty():
                answers.get_nowait().cancel()

    @staticmethod
    async def _send_in_order(
        answers: asyncio.Queue[asyncio.Task[bytes | None]], writer: asyncio.StreamWriter
    ) -> None:
        """Write each answer when its turn comes. A request that cannot be
        answered (malformed, its handler or relay failed) closes the
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

    async def _credential(self, user: str, mechanism: str) -> ScramCredential | None:
        """``user``'s SCRAM credential for ``mechanism`` from the coordinators, or None."""
        answer = await self.backend.accepting_coordinator(
            "DescribeUserScramCredentials",
            coordinator_pb2.DescribeUserScramCredentialsRequest(users=[user], include_keys=True),
        )
        for described in answer.results:
            for found in described.credentials:
                if described.user == user and found.mechanism == mechanism and found.stored_key:
                    return ScramCredential(
                        found.salt, found.iterations, found.stored_key, found.server_key
                    )
        return None

    async def _answer(self, frame: bytes) -> bytes | None:
        """The response frame of one request frame, or None when none is sent
        (acks=0 produce).

        Raises:
            CloseConnection: the frame is not a supported request, or its
                handler or the encoding of its answer failed.
        """
        try:
            api_key, version = m.api_of(frame)
        except m.MalformedRequest as exc:
            raise CloseConnection(str(exc)) from exc
        correlation_id = m.correlation_only(frame)
        if api_key == m.API_VERSIONS and not m.is_supported(api_key, version):
            # Kafka answers an unknown ApiVersions version with a v0 response
            # listing what it supports, so that the client can pick.
            if correlation_id is None:
                raise CloseConnection("an ApiVersions request without a correlation id")
            return m.encode_response(
                api_key, 0, correlation_id, self._api_versions(m.UNSUPPORTED_VERSION)
            )
        try:
            request = m.decode_request(frame)
        except m.MalformedRequest as exc:
            raise CloseConnection(str(exc)) from exc
        started = time.perf_counter()
        try:
            data = await self._handlers[api_key](request)
            if self.metrics is not None:
                self.metrics.answered(api_key, {} if data is None else data, started)
            if data is None:
                return None
            return m.encode_response(api_key, version, request.correlation_id, data)
        except Exception as exc:
            if self.metrics is not None:
                self.metrics.answered(api_key, None, started)
            log.exception("event=request_failed api=%d version=%d", api_key, version)
            raise CloseConnection(f"api {api_key} version {version} failed") from exc

    # --- brokers and coordinators --------------------------------------------------------

    def _api_versions(self, error: int) -> Data:
        return {
            "error_code": error,
            "api_keys": [
                {"api_key": key, "min_version": low, "max_version": high}
                for key, (low, high) in sorted(m.SUPPORTED.items())
            ],
        }

    async def api_versions(self, request: m.Request) -> Data:
        return self._api_versions(ErrorCode.NONE)

    def _gateway_of_coordinator(self, node_id: int) -> KafkaListener:
        """The gateway that fronts coordinator ``node_id``: it lists the
        transactions of the shards that coordinator leads (ListTransactions)."""
        return self._gateway_at([c.node_id for c in self.config.coordinators], node_id)

    def _gateway_of_partition_node(self, node_id: int) -> KafkaListener:
        """The gateway named as the leader of partition-log node ``node_id``'s partitions."""
        return self._gateway_at([n.node_id for n in self.config.partition_nodes], node_id)

    def _gateways_of_partition_nodes(self, node_ids: Iterable[int]) -> list[int]:
        """The gateways in front of partition-log nodes ``node_ids``, in their
        order, each once (fewer gateways than nodes front several each)."""
        gateways = (self._gateway_of_partition_node(n).node_id for n in node_ids)
        return list(dict.fromkeys(gateways))

    def _gateway_at(self, node_ids: list[int], node_id: int) -> KafkaListener:
        """Gateway i for the i-th of ``node_ids`` (by position, modulo the
        gateway count); the first for an id not among them."""
        position = node_ids.index(node_id) if node_id in node_ids else 0
        return self.config.kafka_listeners[position % len(self.config.kafka_listeners)]

    def _brokers(self) -> list[Data]:
        brokers = []
        for gateway in self.config.kafka_listeners:
            host, port = gateway.address.rsplit(":", 1)
            brokers.append({"node_id": gateway.node_id, "host": host, "port": int(port)})
        return brokers

    async def metadata(self, request: m.Request) -> Data:
        asked = request.body.topics
        names = None if asked is None else [t.name for t in asked]
        topics: list[Data] = []
        try:
            # Kafka: null asks for every topic, an empty list for none (brokers only).
            answer = (
                coordinator_pb2.MetadataResponse()
                if names == []
                else await self.backend.metadata(names)
            )
        except Unreachable:
            answer = coordinator_pb2.MetadataResponse()
            for name in names or ():
                topics.append({"name": name, "error_code": ErrorCode.REQUEST_TIMED_OUT})
        for topic in answer.topics:
            partitions = []
            for p in topic.partitions:
                partitions.append(
                    {
                        "error_code": p.error_code,
                        "partition_index": p.partition,
                        "leader_id": (
                            self._gateway_of_partition_node(p.node_id).node_id
                            if p.node_id >= 0
                            else -1
                        ),
                        "leader_epoch": p.leader_epoch,
                        "replica_nodes": self._gateways_of_partition_nodes(p.replicas),
                        "isr_nodes": self._gateways_of_partition_nodes(p.isr),
                    }
                )
            topics.append(
                {"error_code": topic.error_code, "name": topic.name, "partitions": partitions}
            )
        return {
            "brokers": self._brokers(),
            "cluster_id": CLUSTER_ID,
            "controller_id": self.config.kafka_listeners[0].node_id,
            "topics": topics,
        }

    async def find_coordinator(self, request: m.Request) -> Data:
        """This gateway, for any key: a gateway keeps nothing of a
        transactional id or a group (it forwards to the shard's leader), so
        the one the client reached serves it, and a gateway that is down is
        never named by another (the client asks again through one that is up).

        Answered here, without asking the coordinators, so that it never
        fails while a shard elects: librdkafka gives up a coordinator lookup
        of a TxnOffsetCommit or an admin request after three
        COORDINATOR_NOT_AVAILABLE answers and waits for a broker's
        connection to change state, which never comes while the gateways
        stay up (docs/kafka.md, "Coordinators").
        """
        key = request.body.key
        if not key:
            return {
                "error_code": ErrorCode.INVALID_REQUEST,
                "error_message": "key must not be empty",
                "node_id": -1,
                "host": "",
                "port": -1,
            }
        host, port = self.listener.address.rsplit(":", 1)
        return {"error_code": 0, "node_id": self.listener.node_id, "host": host, "port": int(port)}

    # --- transactions ----------------------------------------------------------------------

    async def init_producer_id(self, request: m.Request) -> Data:
        """Versions 5 and 6 as 4, with v6's two-phase commit (KIP-939's
        ``Enable2Pc`` and ``KeepPreparedTxn``) passed on; the transaction
        it keeps is then ended by the client's EndTxn as any other of
        transactions v1."""
        body = request.body
        grpc_request = coordinator_pb2.InitProducerIdRequest(
            transaction_timeout_ms=m.milliseconds(body.transaction_timeout),
            enable_two_phase_commit=getattr(body, "enable2_pc", False),
            keep_prepared_txn=getattr(body, "keep_prepared_txn", False),
        )
        if body.transactional_id is not None:
            grpc_request.transactional_id = body.transactional_id
        if getattr(body, "producer_id", -1) >= 0:
            grpc_request.producer_id = body.producer_id
            grpc_request.producer_epoch = body.producer_epoch
        key = body.transactional_id
        if key is None:
            answer = await self._any_coordinator("InitProducerId", grpc_request)
        else:
            answer = await self.backend.to_leader(
                key, coordinator_pb2.TRANSACTION, "InitProducerId", grpc_request
            )
        ok = answer.error_code == 0
        return {
            "error_code": answer.error_code,
            "producer_id": answer.producer_id if ok else -1,
            "producer_epoch": answer.producer_epoch if ok else -1,
            "ongoing_txn_producer_id": (
                answer.ongoing_txn_producer_id
                if ok and answer.HasField("ongoing_txn_producer_id")
                else -1
            ),
            "ongoing_txn_producer_epoch": (
                answer.ongoing_txn_producer_epoch
                if ok and answer.HasField("ongoing_txn_producer_epoch")
                else -1
            ),
        }

    async def _any_coordinator(self, method: str, grpc_request: Any) -> Any:
        try:
            return await self.backend.any_coordinator(
                lambda stub: getattr(stub, method)(grpc_request, timeout=self.backend.rpc_timeout_s)
            )
        except Unreachable as exc:
            response_type = getattr(coordinator_pb2, f"{method}Response")
            return response_type(
                error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE, error_message=str(exc)
            )

    async def add_partitions_to_txn(self, request: m.Request) -> Data:
        body = request.body
        transactional_id = body.v3_and_below_transactional_id
        topics = body.v3_and_below_topics
        grpc_request = coordinator_pb2.AddPartitionsToTxnRequest(
            transactional_id=transactional_id,
            producer_id=body.v3_and_below_producer_id,
            producer_epoch=body.v3_and_below_producer_epoch,
        )
        for topic in topics:
            grpc_request.topics.add(topic=topic.name, partitions=list(topic.partitions))
        answer = await self.backend.to_leader(
            transactional_id, coordinator_pb2.TRANSACTION, "AddPartitionsToTxn", grpc_request
        )
        per_partition = {(r.topic, r.partition): r.error_code for r in answer.results}
        return {
            "results_by_topic_v3_and_below": [
                {
                    "name": topic.name,
                    "results_by_partition": [
                        {
                            "partition_index": p,
                            "partition_error_code": per_partition.get(
                                (topic.name, p), answer.error_code
                            ),
                        }
                        for p in topic.partitions
                    ],
                }
                for topic in topics
            ]
        }

    async def add_offsets_to_txn(self, request: m.Request) -> Data:
        body = request.body
        answer = await self.backend.to_leader(
            body.transactional_id,
            coordinator_pb2.TRANSACTION,
            "AddOffsetsToTxn",
            coordinator_pb2.AddOffsetsToTxnRequest(
                transactional_id=body.transactional_id,
                producer_id=body.producer_id,
                producer_epoch=body.producer_epoch,
                group_id=body.group_id,
            ),
        )
        return {"error_code": answer.error_code}

    async def end_txn(self, request: m.Request) -> Data:
        """EndTxn below version 5: the client speaks transactions v1 (its
        epoch stays, its sequences go on), and so does the coordinator for
        it (docs/kafka.md, "Transactions v1")."""
        body = request.body
        answer = await self.backend.to_leader(
            body.transactional_id,
            coordinator_pb2.TRANSACTION,
            "EndTxn",
            coordinator_pb2.EndTxnRequest(
                transactional_id=body.transactional_id,
                producer_id=body.producer_id,
                producer_epoch=body.producer_epoch,
                committed=body.committed,
                transaction_version=1,
            ),
        )
        return {"error_code": answer.error_code}

    async def describe_transactions(self, request: m.Request) -> Data:
        ids = list(request.body.transactional_ids)

        async def describe(transactional_id: str) -> Data:
            def entry(answer: Any) -> Any:
                return next(
                    (t for t in answer.transactions if t.transactional_id == transactional_id),
                    None,
                )

            answer = await self.backend.to_leader(
                transactional_id,
                coordinator_pb2.TRANSACTION,
                "DescribeTransactions",
                coordinator_pb2.DescribeTransactionsRequest(transactional_ids=[transactional_id]),
                not_taken=lambda a: entry(a) is None or entry(a).error_code in NOT_PROCESSED,
            )
            found = entry(answer)
            if found is not None and found.error_code in REDISCOVER:
                self.backend.forget_leader(transactional_id)
            if found is None:
                return {
                    "transactional_id": transactional_id,
                    "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    "transaction_state": "",
                    "transaction_start_time": -1,
                    "producer_id": -1,
                    "producer_epoch": -1,
                }
            return {
                "transactional_id": transactional_id,
                "error_code": found.error_code,
                "transaction_state": kafka_state_name(found.state),
                "transaction_timeout": found.transaction_timeout_ms,
                "transaction_start_time": found.transaction_start_time_ms,
                "producer_id": found.producer_id,
                "producer_epoch": found.producer_epoch,
                "topics": [
                    {"topic": t.topic, "partitions": list(t.partitions)} for t in found.topics
                ],
            }

        return {"transaction_states": await _each_once(ids, describe)}

    async def list_transactions(self, request: m.Request) -> Data:
        """The transactions of the shards led by the coordinators this gateway
        fronts (Kafka's admin client asks every broker and merges the answers)."""
        body = request.body
        by_name = {kafka_state_name(n): n for n in common_pb2.TransactionState.values()}
        unknown = [s for s in body.state_filters if s not in by_name]
        grpc_request = coordinator_pb2.ListTransactionsRequest(
            state_filters=[wire_state(by_name[s]) for s in body.state_filters if s in by_name],
            producer_id_filters=list(body.producer_id_filters),
            duration_filter_ms=getattr(body, "duration_filter", -1),
        )
        listings: list[Data] = []
        error = ErrorCode.NONE
        for node in self._fronted_coordinators():
            try:
                answer = await self.backend.coordinator_stub(node).ListTransactions(
                    grpc_request, timeout=self.backend.rpc_timeout_s
                )
            except grpc.aio.AioRpcError as exc:
                # A coordinator that cannot be reached leads no shard the
                # others could not see: its shards have moved to live ones.
                log.info(
                    "event=coordinator_unreachable api=ListTransactions node=%s code=%s",
                    node,
                    exc.code().name,
                )
                continue
            if int(answer.error_code) != ErrorCode.NONE:
                error = ErrorCode(answer.error_code)
            listings += [
                {
                    "transactional_id": t.transactional_id,
                    "producer_id": t.producer_id,
                    "transaction_state": kafka_state_name(t.state),
                }
                for t in answer.transactions
            ]
        return {
            "error_code": error,
            "unknown_state_filters": unknown,
            "transaction_states": listings,
        }

    def _fronted_coordinators(self) -> list[str]:
        """The gRPC addresses of the coordinators this gateway fronts."""
        return [
            c.grpc
            for c in self.config.coordinators
            if self._gateway_of_coordinator(c.node_id) == self.listener
        ]

    @staticmethod
    def _offset_topics(topics: Any) -> list[coordinator_pb2.OffsetCommitTopic]:
        return [
            coordinator_pb2.OffsetCommitTopic(
                topic=topic.name,
                partitions=[
                    coordinator_pb2.OffsetCommitPartition(
                        partition=p.partition_index,
                        offset=p.committed_offset,
                        leader_epoch=getattr(p, "committed_leader_epoch", -1),
                        metadata=p.committed_metadata or "",
                    )
                    for p in topic.partitions
                ],
            )
            for topic in topics
        ]

    @staticmethod
    def _partition_errors(topics: Any, answer: Any) -> list[Data]:
        per_partition = {(r.topic, r.partition): r.error_code for r in answer.results}
        return [
            {
                "name": topic.name,
                "partitions": [
                    {
                        "partition_index": p.partition_index,
                        "error_code": per_partition.get(
                            (topic.name, p.partition_index), answer.error_code
                        ),
                    }
                    for p in topic.partitions
                ],
            }
            for topic in topics
        ]

    async def txn_offset_commit(self, request: m.Request) -> Data:
        body = request.body
        answer = await self.backend.to_leader(
            body.group_id,
            coordinator_pb2.GROUP,
            "TxnOffsetCommit",
            coordinator_pb2.TxnOffsetCommitRequest(
                transactional_id=body.transactional_id,
                group_id=body.group_id,
                producer_id=body.producer_id,
                producer_epoch=body.producer_epoch,
                generation_id=getattr(body, "generation_id", -1),
                member_id=getattr(body, "member_id", ""),
                group_instance_id=getattr(body, "group_instance_id", None) or "",
                topics=self._offset_topics(body.topics),
            ),
        )
        return {"topics": self._partition_errors(body.topics, answer)}

    async def offset_commit(self, request: m.Request) -> Data:
        body = request.body
        answer = await self.backend.to_leader(
            body.group_id,
            coordinator_pb2.GROUP,
            "OffsetCommit",
            coordinator_pb2.OffsetCommitRequest(
                group_id=body.group_id,
                generation_id=getattr(body, "generation_id_or_member_epoch", -1),
                member_id=body.member_id,
                group_instance_id=getattr(body, "group_instance_id", None) or "",
                topics=self._offset_topics(body.topics),
            ),
        )
        return {"topics": self._partition_errors(body.topics, answer)}

    async def offset_fetch(self, request: m.Request) -> Data:
        body = request.body
        grpc_request = coordinator_pb2.OffsetFetchRequest(
            group_id=body.group_id, require_stable=getattr(body, "require_stable", False)
        )
        for topic in body.topics or ():
            grpc_request.topics.add(topic=topic.name, partitions=list(topic.partition_indexes))
        answer = await self.backend.to_leader(
            body.group_id, coordinator_pb2.GROUP, "OffsetFetch", grpc_request
        )
        by_topic: dict[str, list[Data]] = {}
        for p in answer.partitions:
            by_topic.setdefault(p.topic, []).append(
                {
                    "partition_index": p.partition,
                    "committed_offset": p.offset,
                    "committed_leader_epoch": -1,
                    "metadata": p.metadata,
                    "error_code": p.error_code,
                }
            )
        if answer.error_code != ErrorCode.NONE:
            for topic in body.topics or ():
                by_topic[topic.name] = [
                    {
                        "partition_index": p,
                        "committed_offset": -1,
                        "committed_leader_epoch": -1,
                        "metadata": "",
                        "error_code": answer.error_code,
                    }
                    for p in topic.partition_indexes
                ]
        return {
            "error_code": answer.error_code,
            "topics": [{"name": name, "partitions": ps} for name, ps in by_topic.items()],
        }

    # --- consumer groups ---------------------------------------------------------------------

    async def join_group(self, request: m.Request) -> Data:
        """JoinGroup, answered when the coordinator completes the join: only
        this request's task waits (docs/kafka.md, "Consumer groups")."""
        body = request.body
        session_ms = m.milliseconds(body.session_timeout)
        # Version 0 has no rebalance timeout: Kafka uses the session timeout.
        rebalance_ms = m.milliseconds(body.rebalance_timeout) if request.api_version else session_ms
        grpc_request = coordinator_pb2.JoinGroupRequest(
            group_id=body.group_id,
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=rebalance_ms,
            member_id=body.member_id,
            group_instance_id=getattr(body, "group_instance_id", None) or "",
            protocol_type=body.protocol_type,
            protocols=[
                coordinator_pb2.JoinGroupProtocol(name=p.name, metadata=p.metadata)
                for p in body.protocols
            ],
            client_id=request.client_id or "",
        )
        wait_s = min(max(rebalance_ms, 0) / 1000 + GROUP_WAIT_GRACE_S, GROUP_MAX_WAIT_S)
        answer = await self.backend.to_leader(
            body.group_id, coordinator_pb2.GROUP, "JoinGroup", grpc_request, wait_s
        )
        if answer.error_code == ErrorCode.MEMBER_ID_REQUIRED and request.api_version < 4:
            # Versions before KIP-394 do not know MEMBER_ID_REQUIRED: as Kafka's
            # brokers do for them, join again at once with the assigned id.
            grpc_request.member_id = answer.member_id
            answer = await self.backend.to_leader(
                body.group_id, coordinator_pb2.GROUP, "JoinGroup", grpc_request, wait_s
            )
        return {
            "error_code": answer.error_code,
            "generation_id": answer.generation_id if answer.error_code == ErrorCode.NONE else -1,
            "protocol_type": answer.protocol_type or None,
            "protocol_name": answer.protocol_name,
            "leader": answer.leader,
            "member_id": answer.member_id or body.member_id,
            "members": [
                {
                    "member_id": x.member_id,
                    "group_instance_id": x.group_instance_id or None,
                    "metadata": x.metadata,
                }
                for x in answer.members
            ],
        }

    async def sync_group(self, request: m.Request) -> Data:
        """SyncGroup; a follower's waits for the leader's assignment."""
        body = request.body
        answer = await self.backend.to_leader(
            body.group_id,
            coordinator_pb2.GROUP,
            "SyncGroup",
            coordinator_pb2.SyncGroupRequest(
                group_id=body.group_id,
                generation_id=body.generation_id,
                member_id=body.member_id,
                group_instance_id=getattr(body, "group_instance_id", None) or "",
                protocol_type=getattr(body, "protocol_type", None) or "",
                protocol_name=getattr(body, "protocol_name", None) or "",
                assignments=[
                    coordinator_pb2.SyncGroupAssignment(
                        member_id=a.member_id, assignment=a.assignment
                    )
                    for a in body.assignments
                ],
            ),
            GROUP_MAX_WAIT_S,
        )
        return {
            "error_code": answer.error_code,
            "protocol_type": answer.protocol_type or None,
            "protocol_name": answer.protocol_name or None,
            "assignment": answer.assignment,
        }

    async def heartbeat(self, request: m.Request) -> Data:
        body = request.body
        answer = await self.backend.to_leader(
            body.group_id,
            coordinator_pb2.GROUP,
            "Heartbeat",
            coordinator_pb2.HeartbeatRequest(
                group_id=body.group_id,
                generation_id=body.generation_id,
                member_id=body.member_id,
                group_instance_id=getattr(body, "group_instance_id", None) or "",
            ),
        )
        return {"error_code": answer.error_code}

    async def leave_group(self, request: m.Request) -> Data:
        """LeaveGroup: one member before version 3, several from it on."""
        body = request.body
        if request.api_version < 3:
            members = [coordinator_pb2.LeaveGroupMember(member_id=body.member_id)]
        else:
            members = [
                coordinator_pb2.LeaveGroupMember(
                    member_id=x.member_id, group_instance_id=x.group_instance_id or ""
                )
                for x in body.members
            ]
        answer = await self.backend.to_leader(
            body.group_id,
            coordinator_pb2.GROUP,
            "LeaveGroup",
            coordinator_pb2.LeaveGroupRequest(group_id=body.group_id, members=members),
        )
        if request.api_version < 3:
            member_codes = [r.error_code for r in answer.members if r.error_code]
            return {"error_code": answer.error_code or next(iter(member_codes), ErrorCode.NONE)}
        return {
            "error_code": answer.error_code,
            "members": [
                {
                    "member_id": r.member_id,
                    "group_instance_id": r.group_instance_id or None,
                    "error_code": r.error_code,
                }
                for r in answer.members
            ],
        }

    async def describe_groups(self, request: m.Request) -> Data:
        """DescribeGroups, each group asked of its own shard's leader."""

        async def describe(group_id: str) -> Data:
            answer = await self.backend.to_leader(
                group_id,
                coordinator_pb2.GROUP,
                "DescribeGroups",
                coordinator_pb2.DescribeGroupsRequest(group_ids=[group_id]),
            )
            found = next((g for g in answer.groups if g.group_id == group_id), None)
            if found is not None and found.error_code in REDISCOVER:
                self.backend.forget_leader(group_id)
            if found is None:
                return {
                    "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    "group_id": group_id,
                    "authorized_operations": _NO_AUTHORIZED_OPERATIONS,
                }
            return {
                "error_code": found.error_code,
                "group_id": group_id,
                "group_state": found.state,
                "protocol_type": found.protocol_type,
                "protocol_data": found.protocol_name,
                "members": [
                    {
                        "member_id": x.member_id,
                        "group_instance_id": x.group_instance_id or None,
                        "client_id": x.client_id,
                        "client_host": "",
                        "member_metadata": x.metadata,
                        "member_assignment": x.assignment,
                    }
                    for x in found.members
                ],
                "authorized_operations": _NO_AUTHORIZED_OPERATIONS,
            }

        return {"groups": await _each_once(list(request.body.groups), describe)}

    async def create_topics(self, request: m.Request) -> Data:
        body = request.body
        answer = await self.backend.accepting_coordinator(
            "CreateTopics",
            coordinator_pb2.CreateTopicsRequest(
                topics=[
                    coordinator_pb2.CreatableTopic(
                        name=t.name,
                        num_partitions=t.num_partitions,
                        replication_factor=max(t.replication_factor, 0),
                        min_insync_replicas=_min_insync_replicas(t.configs),
                    )
                    for t in body.topics
                ],
                validate_only=body.validate_only,
            ),
        )
        by_name = {r.name: r for r in answer.results}
        topics = []
        for t in body.topics:
            result = by_name.get(t.name)
            code = ErrorCode.COORDINATOR_NOT_AVAILABLE if result is None else result.error_code
            topics.append(
                {
                    "name": t.name,
                    "error_code": code,
                    "error_message": None if result is None else result.error_message or None,
                    "num_partitions": t.num_partitions,
                    "replication_factor": t.replication_factor if t.replication_factor > 0 else 1,
                }
            )
        return {"topics": topics}

    # --- ACLs -------------------------------------------------------------------------------

    async def create_acls(self, request: m.Request) -> Data:
        answer = await self.backend.accepting_coordinator(
            "CreateAcls",
            coordinator_pb2.CreateAclsRequest(
                creations=[
                    common_pb2.AclBinding(
                        resource_type=c.resource_type,
                        resource_name=c.resource_name,
                        pattern_type=c.resource_pattern_type,
                        principal=c.principal,
                        host=c.host,
                        operation=c.operation,
                        permission_type=c.permission_type,
                    )
                    for c in request.body.creations
                ]
            ),
        )
        results = list(answer.results)
        if len(results) != len(request.body.creations):  # no coordinator accepted
            failed = {"error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE, "error_message": None}
            return {"results": [failed for _ in request.body.creations]}
        return {
            "results": [
                {"error_code": r.error_code, "error_message": r.error_message or None}
                for r in results
            ]
        }

    async def describe_acls(self, request: m.Request) -> Data:
        answer = await self.backend.accepting_coordinator(
            "DescribeAcls",
            coordinator_pb2.DescribeAclsRequest(filter=_acl_filter(request.body)),
        )
        resources: dict[tuple[int, str, int], list[Data]] = {}
        for a in answer.acls:
            resources.setdefault((a.resource_type, a.resource_name, a.pattern_type), []).append(
                {
                    "principal": a.principal,
                    "host": a.host,
                    "operation": a.operation,
                    "permission_type": a.permission_type,
                }
            )
        return {
            "error_code": answer.error_code,
            "error_message": answer.error_message or None,
            "resources": [
                {"resource_type": t, "resource_name": n, "pattern_type": p, "acls": acls}
                for (t, n, p), acls in resources.items()
            ],
        }

    async def delete_acls(self, request: m.Request) -> Data:
        filters = request.body.filters
        answer = await self.backend.accepting_coordinator(
            "DeleteAcls",
            coordinator_pb2.DeleteAclsRequest(filters=[_acl_filter(f) for f in filters]),
        )
        results = list(answer.results)
        if len(results) != len(filters):  # no coordinator accepted
            failed: Data = {
                "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
                "error_message": None,
                "matching_acls": [],
            }
            return {"filter_results": [failed for _ in filters]}
        return {
            "filter_results": [
                {
                    "error_code": r.error_code,
                    "error_message": r.error_message or None,
                    "matching_acls": [
                        {
                            "error_code": ErrorCode.NONE,
                            "error_message": None,
                            "resource_type": a.resource_type,
                            "resource_name": a.resource_name,
                            "pattern_type": a.pattern_type,
                            "principal": a.principal,
                            "host": a.host,
                            "operation": a.operation,
                            "permission_type": a.permission_type,
                        }
                        for a in r.deleted
                    ],
                }
                for r in results
            ]
        }

    # --- the partitions ----------------------------------------------------------------------

    async def produce(self, request: m.Request) -> Data | None:
        body = request.body
        items: list[tuple[str, int, partition_log_pb2.PartitionProduceData]] = []
        results: dict[tuple[str, int], Data] = {}
        for topic in body.topic_data:
            for p in topic.partition_data:
                # The batch goes to the node as it came; the node checks it.
                items.append(
                    (
                        topic.name,
                        p.index,
                        partition_log_pb2.PartitionProduceData(
                            topic=topic.name, partition=p.index, raw_batch=bytes(p.records or b"")
                        ),
                    )
                )

        async def call(stub: Any, parts: list[partition_log_pb2.PartitionProduceData]) -> Any:
            # acks passes through: all (-1) waits for the in-sync replicas.
            grpc_request = partition_log_pb2.ProduceRequest(partitions=parts, acks=body.acks)
            if body.transactional_id is not None:
                grpc_request.transactional_id = body.transactional_id
            return await stub.Produce(grpc_request, timeout=self.backend.rpc_timeout_s)

        done, failed = await self.backend.per_owner(items, call)
        for _, answer in done:
            for r in answer.partitions:
                if r.error_code in STALE_METADATA:
                    self.backend.forget_topic(r.topic)
                results[(r.topic, r.partition)] = {
                    "index": r.partition,
                    "error_code": r.error_code,
                    "base_offset": r.base_offset,
                    "log_start_offset": r.log_start_offset,
                    "error_message": r.error_message or None,
                }
        for topic_name, partition, code in failed:
            results[(topic_name, partition)] = _produce_error(partition, code, "")
        if body.acks == 0:
            return None
        return {
            "responses": [
                {
                    "name": topic.name,
                    "partition_responses": [
                        results[(topic.name, p.index)] for p in topic.partition_data
                    ],
                }
                for topic in body.topic_data
            ]
        }

    async def fetch(self, request: m.Request) -> Data:
        body = request.body
        isolation = wire_isolation(body.isolation_level)
        items: list[tuple[str, int, partition_log_pb2.FetchPartition]] = [
            (
                topic.topic,
                p.partition,
                partition_log_pb2.FetchPartition(
                    topic=topic.topic,
                    partition=p.partition,
                    fetch_offset=p.fetch_offset,
                    partition_max_bytes=p.partition_max_bytes,
                    current_leader_epoch=_current_leader_epoch(p),
                ),
            )
            for topic in body.topics
            for p in topic.partitions
        ]
        wait_ms = m.milliseconds(body.max_wait)

        async def call(stub: Any, parts: list[partition_log_pb2.FetchPartition]) -> Any:
            return await stub.Fetch(
                partition_log_pb2.FetchRequest(
                    isolation_level=isolation,
                    max_bytes=body.max_bytes,
                    partitions=parts,
                    max_wait_ms=wait_ms,
                    min_bytes=body.min_bytes,
                    raw=True,
                ),
                timeout=self.backend.rpc_timeout_s + wait_ms / 1000,
            )

        done, failed = await self.backend.per_owner(items, call)
        results: dict[tuple[str, int], Data] = {}
        read_committed = isolation == common_pb2.READ_COMMITTED
        for _, answer in done:
            for r in answer.partitions:
                if r.error_code in STALE_METADATA:
                    self.backend.forget_topic(r.topic)
                if r.error_code != ErrorCode.NONE:
                    results[(r.topic, r.partition)] = _fetch_error(r.partition, r.error_code)
                    continue
                results[(r.topic, r.partition)] = {
                    "partition_index": r.partition,
                    "error_code": 0,
                    "high_watermark": r.high_watermark,
                    "last_stable_offset": r.last_stable_offset,
                    "log_start_offset": r.log_start_offset,
                    # The stored batches as they are: the client skips the
                    # aborted transactions' records and the markers itself.
                    "aborted_transactions": (
                        [
                            {"producer_id": a.producer_id, "first_offset": a.first_offset}
                            for a in r.aborted_transactions
                        ]
                        if read_committed
                        else None
                    ),
                    "records": r.raw_batches,
                }
        for topic_name, partition, code in failed:
            results[(topic_name, partition)] = _fetch_error(partition, code)
        return {
            "error_code": 0,
            "session_id": 0,
            "responses": [
                {
                    "topic": topic.topic,
                    "partitions": [results[(topic.topic, p.partition)] for p in topic.partitions],
                }
                for topic in body.topics
            ],
        }

    async def list_offsets(self, request: m.Request) -> Data:
        body = request.body
        isolation = wire_isolation(getattr(body, "isolation_level", 0))
        items: list[tuple[str, int, partition_log_pb2.ListOffsetsPartition]] = []
        results: dict[tuple[str, int], Data] = {}
        for topic in body.topics:
            for p in topic.partitions:
                if p.timestamp == _EARLIEST:
                    spec = partition_log_pb2.OFFSET_SPEC_EARLIEST
                elif p.timestamp == _LATEST:
                    spec = partition_log_pb2.OFFSET_SPEC_LATEST
                else:
                    results[(topic.name, p.partition_index)] = _list_offsets_error(
                        p.partition_index, ErrorCode.INVALID_REQUEST
                    )
                    continue
                items.append(
                    (
                        topic.name,
                        p.partition_index,
                        partition_log_pb2.ListOffsetsPartition(
                            topic=topic.name,
                            partition=p.partition_index,
                            spec=spec,
                            current_leader_epoch=_current_leader_epoch(p),
                        ),
                    )
                )

        async def call(stub: Any, parts: list[partition_log_pb2.ListOffsetsPartition]) -> Any:
            return await stub.ListOffsets(
                partition_log_pb2.ListOffsetsRequest(isolation_level=isolation, partitions=parts),
                timeout=self.backend.rpc_timeout_s,
            )

        done, failed = await self.backend.per_owner(items, call)
        for _, answer in done:
            for r in answer.partitions:
                if r.error_code in STALE_METADATA:
                    self.backend.forget_topic(r.topic)
                results[(r.topic, r.partition)] = {
                    "partition_index": r.partition,
                    "error_code": r.error_code,
                    "timestamp": -1,
                    "offset": r.offset,
                    "leader_epoch": -1,  # unknown: the nodes do not say it
                }
        for topic_name, partition, code in failed:
            results[(topic_name, partition)] = _list_offsets_error(partition, code)
        return {
            "topics": [
                {
                    "name": topic.name,
                    "partitions": [
                        results[(topic.name, p.partition_index)] for p in topic.partitions
                    ],
                }
                for topic in body.topics
            ]
        }


def kafka_state_name(state: int) -> str:
    """Kafka's name of a transaction state (``TRANSACTION_STATE_COMPLETE_COMMIT``
    -> ``CompleteCommit``), as DescribeTransactions and ListTransactions carry it."""
    name = common_pb2.TransactionState.Name(state)
    return "".join(part.capitalize() for part in name.removeprefix("TRANSACTION_STATE_").split("_"))


def wire_isolation(level: int) -> common_pb2.IsolationLevel:
    """Kafka's isolation level (the same numbers) as the partition-log field."""
    return common_pb2.READ_COMMITTED if level == 1 else common_pb2.READ_UNCOMMITTED


def _current_leader_epoch(partition: Any) -> int | None:
    """The leader epoch a Fetch or ListOffsets partition names (KIP-320; the
    versions that carry it), None when it names none (-1): the node refuses
    an older one (FENCED_LEADER_EPOCH) or a newer one (UNKNOWN_LEADER_EPOCH)."""
    epoch = getattr(partition, "current_leader_epoch", -1)
    return int(epoch) if epoch >= 0 else None


def _min_insync_replicas(configs: Iterable[Any]) -> int:
    """A CreateTopics topic's ``min.insync.replicas`` config: 0 when it names
    none (the default), -1 when it is not a positive int32 (refused as
    INVALID_CONFIG)."""
    value = next((c.value for c in configs if c.name == "min.insync.replicas"), None)
    if value is None:
        return 0
    try:
        wanted = int(value)
    except ValueError:
        return -1
    return wanted if 0 < wanted < 2**31 else -1


def _produce_error(partition: int, code: int, message: str) -> Data:
    return {
        "index": partition,
        "error_code": code,
        "base_offset": -1,
        "log_start_offset": -1,
        "error_message": message or None,
    }


def _fetch_error(partition: int, code: int) -> Data:
    return {
        "partition_index": partition,
        "error_code": code,
        "high_watermark": -1,
        "last_stable_offset": -1,
        "log_start_offset": -1,
        # Empty, not null, as from Kafka's brokers: librdkafka refuses null records.
        "records": b"",
    }


def _list_offsets_error(partition: int, code: int) -> Data:
    return {"partition_index": partition, "error_code": code, "timestamp": -1, "offset": -1}


def run_gateway(config: ClusterConfig, listener: KafkaListener) -> int:
    """Serve until SIGTERM or SIGINT."""
    configure_logging()
    _allow_descriptors(config.settings.max_connections + SPARE_DESCRIPTORS)

    async def main() -> None:
        gateway = Gateway(config, listener)
        await gateway.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await gateway.stop()

    asyncio.run(main())
    return 0


def _allow_descriptors(wanted: int) -> None:
    """Raise the soft limit of open files towards ``wanted`` (within the hard
    limit), so that ``max.connections`` clients can connect; a lower limit
    is logged."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "event=open_files_limited limit=%d wanted=%d (max.connections plus spare)", soft, wanted
        )


def _acl_filter(body: Any) -> common_pb2.AclBindingFilter:
    """A Kafka ACL filter (DescribeAcls' body, one of DeleteAcls' filters) as
    the coordinators' message."""
    acl_filter = common_pb2.AclBindingFilter(
        resource_type=body.resource_type_filter,
        pattern_type=body.pattern_type_filter,
        operation=body.operation,
        permission_type=body.permission_type,
    )
    if body.resource_name_filter is not None:
        acl_filter.resource_name = body.resource_name_filter
    if body.principal_filter is not None:
        acl_filter.principal = body.principal_filter
    if body.host_filter is not None:
        acl_filter.host = body.host_filter
    return acl_filter


#: Coordinator calls one request makes at once when it names many ids.
MAX_CALLS_PER_REQUEST = 16


async def _each_once(keys: list[str], call: Callable[[str], Awaitable[Data]]) -> list[Data]:
    """``call`` of each key, in the keys' order, each distinct key asked once
    by one of at most :data:`MAX_CALLS_PER_REQUEST` workers (a request of
    half a million ids, a megabyte, would otherwise start as many calls, or
    tasks waiting for their turn, at once)."""
    answers: dict[str, Data] = {}
    pending = iter(dict.fromkeys(keys))

    async def worker() -> None:
        for key in pending:  # shared: each key goes to the first worker free
            answers[key] = await call(key)

    await asyncio.gather(*(worker() for _ in range(min(MAX_CALLS_PER_REQUEST, len(keys)))))
    return [answers[key] for key in keys]


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
    limit = _CONNECTION_LOG_LIMIT
    if not limit.allow():
        return
    if limit.suppressed:
        message, args = message + " suppressed=%d", (*args, limit.suppressed)
        limit.suppressed = 0
    log.log(level, message, *args)
