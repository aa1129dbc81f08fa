"""A wrong bootstrap list is told at once: an address where nothing listens,
or where something that is not a gRPC server does, fails the first request
in about a second, naming the address, instead of after the request
timeout (the client library and `raftcoord txn`)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from raftcoord.client import Admin
from raftcoord.client.errors import KafkaConnectionError
from raftcoord.cluster.launcher import free_ports

#: Far below the client's 30 s request timeout.
QUICK_S = 5.0


@pytest.fixture
def not_grpc() -> Iterator[str]:
    """An address whose listener answers every connection with a few bytes
    that are not HTTP/2, then closes it (as a Kafka gateway's port would)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"\x00\x00\x00\x04nope")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=2)
        server.close()


def test_an_admin_of_a_closed_port_fails_at_once_naming_it(not_grpc: str) -> None:
    (port,) = free_ports(1)
    for address in (f"127.0.0.1:{port}", not_grpc):
        started = time.monotonic()
        with Admin([address]) as admin, pytest.raises(KafkaConnectionError, match=address):
            admin.list_topics()
        assert time.monotonic() - started < QUICK_S


def test_txn_list_of_a_closed_port_exits_1_naming_it() -> None:
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    result = subprocess.run(
        [sys.executable, "-m", "raftcoord.cli", "txn", "list", "--bootstrap-server", address],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stdout
    assert address in result.stderr and not result.stdout
