"""Running the console: check that the cluster answers, listen, ask the
cluster in rounds on a thread of its own and serve the pages with uvicorn
until SIGINT or SIGTERM."""

from __future__ import annotations

import socket
import sys

import uvicorn

from raftcoord.client import KafkaError
from raftcoord.console.app import create_app
from raftcoord.console.collect import Collector, ConsoleOptions, admin

__all__ = ["ConsoleError", "check_cluster", "listen", "serve"]

#: How long the first question to the cluster may take before the console
#: says it cannot reach it.
STARTUP_TIMEOUT_MS = 10_000


class ConsoleError(Exception):
    """The console cannot start; the message says why."""


def check_cluster(options: ConsoleOptions) -> dict[str, dict[int, str]]:
    """The cluster's nodes, or ConsoleError when no coordinator answers
    (an unreachable bootstrap list fails within a second or so)."""
    timeout = min(options.request_timeout_ms, STARTUP_TIMEOUT_MS)
    try:
        with admin(options, request_timeout_ms=timeout) as client:
            return client.describe_cluster()
    except (KafkaError, OSError, ValueError) as exc:
        raise ConsoleError(
            f"no coordinator of {','.join(options.bootstrap)} answered: {exc}"
        ) from None


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: a free port)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family = infos[0][0]
        sock = socket.create_server((host, port), family=family, backlog=128)
    except OSError as exc:
        raise ConsoleError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def serve(options: ConsoleOptions, host: str, port: int) -> int:
    """Serve the console until SIGINT or SIGTERM; 0 then."""
    nodes = check_cluster(options)
    sock = listen(host, port)
    collector = Collector(options, nodes)
    collector.start()
    app = create_app(lambda: collector.latest, options)
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", server_header=False
    )
    print(
        f"raftcoord console: {url_of(sock)} ({len(nodes['coordinators'])} coordinators, "
        f"{len(nodes['partition_nodes'])} partition-log nodes; Ctrl-C stops it)",
        flush=True,
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        collector.stop()
        sock.close()
    print("raftcoord console: stopped", file=sys.stderr, flush=True)
    return 0
