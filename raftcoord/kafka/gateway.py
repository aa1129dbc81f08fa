"""The Kafka gateway: an asyncio server speaking Kafka's protocol to clients
and the cluster's gRPC API to the coordinators and partition-log nodes.

A gateway is its client connections (:mod:`raftcoord.kafka.connections`,
who the client is from :mod:`raftcoord.kafka.auth`), the handler of each
Kafka API (:mod:`raftcoord.kafka.apis`, one module per family) and its
calls to the cluster (:mod:`raftcoord.kafka.backend`). How Kafka's brokers,
partition leaders and coordinators map onto gateways is in docs/kafka.md.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import resource
import signal
import time

from raftcoord.kafka import messages as m
from raftcoord.kafka.apis import handlers
from raftcoord.kafka.apis.brokers import api_versions_data
from raftcoord.kafka.auth import stored_credential
from raftcoord.kafka.backend import Backend
from raftcoord.kafka.connections import CloseConnection, Connections
from raftcoord.kafka.metrics import GatewayMetrics
from raftcoord.protocol.config import ClusterConfig, KafkaListener
from raftcoord.protocol.metrics import Metrics
from raftcoord.protocol.process import configure_logging, warn_if_plaintext
from raftcoord.protocol.tls import node_identity

log = logging.getLogger(__name__)

#: Open files the gateway needs besides its clients' connections (gRPC
#: channels, logs).
SPARE_DESCRIPTORS = 256


class Gateway:
    """One gateway: ``listener`` of ``config``'s [[kafka_listeners]]."""

    def __init__(self, config: ClusterConfig, listener: KafkaListener) -> None:
        self.config = config
        self.listener = listener
        identity = node_identity(config, listener.node_id)
        self.backend = Backend(
            config, credentials=None if identity is None else identity.channel_credentials()
        )
        self._server: asyncio.Server | None = None
        self._handlers = handlers(config, listener, self.backend)
        # SaslHandshake and SaslAuthenticate are the connection's own.
        assert set(self._handlers) | {m.SASL_HANDSHAKE, m.SASL_AUTHENTICATE} == set(m.SUPPORTED)
        #: The gateway's Prometheus registry, when its listener has a metrics address.
        self.registry: Metrics | None = None
        self.metrics: GatewayMetrics | None = None
        if listener.metrics is not None:
            self.registry = Metrics()
            self.metrics = GatewayMetrics(
                self.registry,
                lambda: len(self._connections),
                lambda: self._connections.held_bytes(),
            )
        self._connections = Connections(
            config,
            listener,
            self._answer,
            functools.partial(stored_credential, self.backend),
            self.metrics,
        )

    async def start(self) -> None:
        self._server = await self._connections.listen()
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
        await self._connections.close()
        if self._server is not None:
            await self._server.wait_closed()
        await self.backend.close()
        if self.registry is not None:
            self.registry.close()

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
                api_key, 0, correlation_id, api_versions_data(m.UNSUPPORTED_VERSION)
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


def run_gateway(config: ClusterConfig, listener: KafkaListener) -> int:
    """Serve until SIGTERM or SIGINT."""
    configure_logging()
    warn_if_plaintext(config, log, listener.node_id)
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
