"""Prometheus metrics: one registry per process, its HTTP endpoint, and what
every node measures the same way (docs/metrics.md lists every metric).

A process makes one :class:`Metrics` when its config gives it a metrics
address (``metrics = "host:port"`` in its ``[[coordinators]]``,
``[[partition_nodes]]`` or ``[[kafka_listeners]]`` entry) and serves it with
:meth:`Metrics.serve`: plain HTTP without ``[tls]``; with ``[tls]``, HTTPS
with the node's certificate, answered only to clients that present a
certificate of the cluster's CA naming one of the cluster's principals or
of ``[tls] metrics_users`` (a Prometheus server's): what the node's
metrics say about topics and transactional ids is not for every client of
the cluster (others get 403). Each connection's TLS handshake runs on its
own thread under a deadline, the connections in their handshake counted
per source address, so a silent connection holds up no scrape.

What every process exports: the standard ``process_*`` (CPU seconds, RSS,
open files) and ``python_gc_*`` families, the garbage collector's pauses
(``raftcoord_gc_pause_seconds``, the frozen heap's collections included),
and, on the gRPC servers, ``raftcoord_rpc_*`` per method and error code
(:class:`RpcMetrics`). Each node kind adds its own (collected when scraped).
"""

from __future__ import annotations

import gc
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from raftcoord.protocol.admission import (
    HandshakeDeadline,
    HandshakeSlots,
    close_connection,
    cluster_sources,
)
from raftcoord.protocol.config import ClusterConfig
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.process import LogLimiter
from raftcoord.protocol.tls import certificate_principal, cluster_principals, node_ssl_context

log = logging.getLogger("raftcoord.metrics")

#: Buckets of request latencies (seconds): 0.5 ms to 10 s.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
#: Buckets of fsyncs and collector pauses (seconds): 50 us to 1 s.
PAUSE_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)


class Metrics:
    """One process's registry and the metrics every node kind has."""

    def __init__(self) -> None:
        # No ``_created`` series: they double what is scraped and nothing here uses them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.gc_pause = Histogram(
            "raftcoord_gc_pause_seconds",
            "Pauses of the garbage collector, by generation",
            ["generation"],
            buckets=PAUSE_BUCKETS,
            registry=self.registry,
        )
        self._gc_started = 0.0
        self._server: Any = None

    def add(self, collector: Collector) -> None:
        """Register ``collector`` (read when the endpoint is scraped)."""
        self.registry.register(collector)

    def counter(self, name: str, documentation: str, labels: Iterable[str] = ()) -> Counter:
        return Counter(name, documentation, list(labels), registry=self.registry)

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: Iterable[str] = (),
        buckets: tuple[float, ...] = LATENCY_BUCKETS,
    ) -> Histogram:
        return Histogram(name, documentation, list(labels), buckets=buckets, registry=self.registry)

    def fsyncs(self) -> Callable[[float], None]:
        """What a node's logs call with the seconds each fsync took."""
        return self.histogram(
            "raftcoord_fsync_duration_seconds",
            "Time of each fsync of a log (Raft journal or partition log)",
            buckets=PAUSE_BUCKETS,
        ).observe

    def _on_gc(self, phase: str, info: Mapping[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started:
            pause = time.perf_counter() - self._gc_started
            self.gc_pause.labels(str(info.get("generation", ""))).observe(pause)

    def serve(self, address: str, config: ClusterConfig, node_id: int) -> None:
        """Serve the registry on ``address`` (``host:port``) and start timing
        the collector's pauses; over mutual TLS when ``config`` has ``[tls]``
        (node ``node_id``'s certificate).

        Raises:
            OSError: it cannot listen there, or a certificate file is unreadable.
        """
        host, port = address.rsplit(":", 1)
        host = host.strip("[]")
        tls = None
        if config.tls is not None:
            context = node_ssl_context(config, node_id, server=True)
            assert context is not None  # [tls] is set
            tls = (context, cluster_principals(config) | set(config.tls.metrics_users))
        slots = HandshakeSlots(
            HANDSHAKES_PER_SOURCE, MAX_HANDSHAKES, cluster_sources(config), MAX_HANDSHAKES
        )
        server_class = _MetricsServer6 if ":" in host else _MetricsServer
        server = server_class((host, int(port)), tls, slots)
        server.set_app(make_wsgi_app(self.registry))
        self._server = server
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
        gc.callbacks.append(self._on_gc)

    def close(self) -> None:
        """Stop serving (the process is stopping)."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


#: How long a metrics connection has, from its accept, to finish its TLS
#: handshake (as a whole); then the rest of its request, each read.
HANDSHAKE_TIMEOUT_S = 5.0
IO_TIMEOUT_S = 10.0
#: Connections in their TLS handshake from one address that is not a host of
#: the cluster's nodes, from all of those, and from each node host.
HANDSHAKES_PER_SOURCE = 4
MAX_HANDSHAKES = 32

_REFUSAL = b"only the cluster's principals and [tls] metrics_users may read metrics\n"
_FORBIDDEN = (
    b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_REFUSAL), _REFUSAL)
)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the base's name
        """Requests are not logged (Prometheus scrapes every few seconds)."""


class _MetricsServer(ThreadingWSGIServer):
    """The metrics endpoint: one thread per connection; with ``tls`` set
    (the node's context and the principals answered) each connection's TLS
    handshake runs on its own thread under :data:`HANDSHAKE_TIMEOUT_S`, not
    in the accept, and the connections in their handshake are counted per
    source address (``slots``): a silent connection holds up nobody."""

    def __init__(
        self,
        address: tuple[str, int],
        tls: tuple[ssl.SSLContext, frozenset[str]] | None,
        slots: HandshakeSlots,
    ) -> None:
        super().__init__(address, _QuietHandler)
        self.tls = tls
        self.slots = slots
        self.refusals = LogLimiter(1.0)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        if self.tls is None or self.slots.take(client_address[0]):
            return True
        self.refusals.log(
            log,
            logging.WARNING,
            "event=metrics_connection_refused peer=%s: too many connections in their handshake",
            client_address,
        )
        return False

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        context, scrapers = self.tls
        deadline = HandshakeDeadline(request, HANDSHAKE_TIMEOUT_S)
        try:
            request.settimeout(HANDSHAKE_TIMEOUT_S)
            connection = context.wrap_socket(request, server_side=True)
            deadline.follow(connection)
            if not deadline.disarm():
                connection.close()
                return
        except (OSError, ValueError):  # ssl.SSLError is an OSError
            return
        finally:
            deadline.disarm()
            self.slots.give_back(client_address[0])
        try:
            connection.settimeout(IO_TIMEOUT_S)
            if certificate_principal(connection.getpeercert()) not in scrapers:
                connection.sendall(_FORBIDDEN)
                return
            super().finish_request(connection, client_address)
        except OSError:
            return
        finally:
            close_connection(connection)


class _MetricsServer6(_MetricsServer):
    address_family = socket.AF_INET6


def error_name(code: int) -> str:
    """The name of error ``code`` (a number it does not know: the number)."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


def _error_reader(descriptor: Any) -> Callable[[Any], int]:
    """How to read the error of a response of message type ``descriptor``:
    its ``error_code`` field, else the first error of its first repeated
    field whose entries have one (per-partition answers), else none."""
    fields = descriptor.fields_by_name
    if "error_code" in fields:
        return lambda response: int(response.error_code)
    for field in descriptor.fields:
        entry = field.message_type
        if field.is_repeated and entry and "error_code" in entry.fields_by_name:
            name = field.name
            return lambda response: next(
                (int(e.error_code) for e in getattr(response, name) if e.error_code), 0
            )
    return lambda response: 0


class RpcMetrics(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc is untyped
    """Counts and times every unary call of a gRPC server by method and by
    the error code of its answer (``grpc_<STATUS>`` when the call failed at
    the gRPC level), with the bytes received and sent.

    gRPC asks the interceptor for every call; the measured handler of a
    method (with its metrics' children) is made once and kept, as the
    servers' handlers depend on the method only."""

    def __init__(self, metrics: Metrics) -> None:
        self._requests = metrics.counter(
            "raftcoord_rpc_requests_total",
            "Calls answered (gRPC, or a cluster link), by method and error code",
            ["method", "code"],
        )
        self._latency = metrics.histogram(
            "raftcoord_rpc_duration_seconds", "Time to answer a call, by method", ["method"]
        )
        self._received = metrics.counter(
            "raftcoord_rpc_received_bytes_total", "Bytes of requests, by method", ["method"]
        )
        self._sent = metrics.counter(
            "raftcoord_rpc_sent_bytes_total", "Bytes of answers, by method", ["method"]
        )
        self._readers: dict[str, Callable[[Any], int]] = {}
        self._unreadable: set[str] = set()
        #: Full method name -> its handler as this interceptor returns it
        #: (the server's methods only).
        self._handlers: dict[str, Any] = {}

    def _reader(self, response: Any) -> Callable[[Any], int]:
        descriptor = response.DESCRIPTOR
        reader = self._readers.get(descriptor.full_name)
        if reader is None:
            reader = self._readers[descriptor.full_name] = _error_reader(descriptor)
        return reader

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        try:
            return self._handlers[details.method]
        except KeyError:
            pass
        handler = continuation(details)
        if handler is None:  # no such method: nothing kept for names callers make up
            return None
        if handler.unary_unary is not None:
            handler = self._measured(handler, details.method.rsplit("/", 1)[-1])
        self._handlers[details.method] = handler
        return handler

    def measure(
        self,
        method: str,
        behavior: Callable[..., Any],
        failure: Callable[..., str] = lambda *call: "RAISED",
    ) -> Callable[..., Any]:
        """``behavior(request, ...)`` counted and timed as a call of
        ``method``; one that raises is counted with the code ``failure``
        names for its arguments (``RAISED``: the calls that arrive over a
        cluster link, :mod:`raftcoord.protocol.cluster_link`). One that
        returns None (a cluster link's call answered item by item, timed to
        its items' start) is counted ``NONE``."""
        latency = self._latency.labels(method)
        received = self._received.labels(method)
        sent = self._sent.labels(method)
        by_code: dict[str, Any] = {}

        def count(failed: str | None, request: Any, response: Any) -> None:
            """Count one call; a response this cannot read is counted
            ``UNKNOWN`` (and logged once): measuring never fails a call."""
            code = failed or "NONE"
            try:
                received.inc(request.ByteSize())
                if response is not None:
                    code = failed or "UNKNOWN"
                    sent.inc(response.ByteSize())
                    code = error_name(self._reader(response)(response))
            except Exception:
                if method not in self._unreadable:
                    self._unreadable.add(method)
                    log.exception("event=metrics_failed method=%s", method)
            requests = by_code.get(code)
            if requests is None:
                requests = by_code[code] = self._requests.labels(method, code)
            requests.inc()

        def measured(request: Any, *rest: Any) -> Any:
            started = time.perf_counter()
            try:
                response = behavior(request, *rest)
            except BaseException:
                count(failure(request, *rest), request, None)
                latency.observe(time.perf_counter() - started)
                raise
            latency.observe(time.perf_counter() - started)
            count(None, request, response)
            return response

        return measured

    def _measured(self, handler: Any, method: str) -> Any:
        def failure(request: Any, context: Any) -> str:
            status = context.code()  # set by abort(); None: the handler raised
            return f"grpc_{getattr(status, 'name', 'UNKNOWN')}"

        measured = self.measure(method, handler.unary_unary, failure)
        return grpc.unary_unary_rpc_method_handler(
            measured,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
