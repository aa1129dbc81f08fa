"""gRPC health checking and server reflection, on every node's gRPC port.

:class:`Health` registers the standard ``grpc.health.v1.Health`` service
(what load balancers and Kubernetes probes call) and server reflection (so
that ``grpcurl list`` and ``grpcurl describe`` work), and keeps the health
of the whole server ("") and of each of the node's services up to date
from a check of the node's own: SERVING only while the node can do its job
(a coordinator: every shard has a leader and the shards it leads have
applied their logs; a partition-log node: its data directory is the one on
record and it knows the topic map), else NOT_SERVING.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

log = logging.getLogger("raftcoord.health")

#: How often the node's check is run.
CHECK_INTERVAL_S = 0.5


class Health:
    """The health service of one server, and its reflection."""

    def __init__(self, server: grpc.Server, services: Sequence[str], check: Callable[[], bool]):
        self._servicer = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, server)
        reflection.enable_server_reflection(
            (*services, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        self._services = ("", *services)
        self._check = check
        self.serving = False
        self._set(False)

    def _set(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in self._services:
            self._servicer.set(service, status)
        self.serving = serving

    def run(self, stopping: threading.Event) -> None:
        """Check every :data:`CHECK_INTERVAL_S` until ``stopping`` is set; then
        NOT_SERVING (a node that stops tells its probes first)."""
        while not stopping.is_set():
            try:
                serving = self._check()
            except Exception:  # a check that fails says the node cannot serve
                if self.serving:  # logged once, when it stops serving for it
                    log.exception("event=health_check_failed")
                serving = False
            if serving != self.serving:
                self._set(serving)
            stopping.wait(CHECK_INTERVAL_S)
        self._set(False)

    def start(self, stopping: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stopping,), name="health", daemon=True)
        thread.start()
        return thread
