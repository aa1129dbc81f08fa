"""The Kafka gateway's bounds (docs/kafka.md, "Bounds"): what one client
sends cannot take the gateway's memory or stop the other clients.

* Big request frames wait for room in ``queued.max.request.bytes`` before
  their bodies are read: 64 clients each sending what they can of a 50 MiB
  frame (and never the rest) leave the gateway's memory within the budget
  and one frame of where it was, and a small request of another client is
  still answered.
* 2,000 connections (``max.connections``' default) held open cost the
  gateway less than :data:`CONNECTIONS_BOUND` and another client is served.
* A produced batch may declare at most 100,000 records, checked before it is
  decompressed: a few kilobytes that claim a million records are refused
  (INVALID_RECORD) instead of being decoded.
* ``max.connections`` and ``max.connections.per.ip``: the connections past
  them are closed at once (clients from 127.0.0.1, .2 and .3).
"""

from __future__ import annotations

import contextlib
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_response_schema
from kio.serial import entity_reader

from raftcoord.cluster.launcher import LocalCluster
from tests.local_cluster import running_cluster
from tests.test_kafka_gateway import gateway_socket, read_frame, request_frame

pytestmark = pytest.mark.slow

MIB = 1 << 20
QUEUED_BYTES = 64 * MIB
MAX_CONNECTIONS = 80
MAX_CONNECTIONS_PER_IP = 70
TOPIC = "bounded"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    path: Path = tmp_path_factory.mktemp("bounds")
    settings = {
        "queued.max.request.bytes": QUEUED_BYTES,
        "max.connections": MAX_CONNECTIONS,
        "max.connections.per.ip": MAX_CONNECTIONS_PER_IP,
    }
    with running_cluster(
        path, shards=1, partition_nodes=1, kafka_listeners=1, settings=settings
    ) as running:
        from raftcoord.client import Admin

        with Admin(running.bootstrap()) as admin:
            admin.create_topics({TOPIC: 1})
        yield running


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def api_versions_answered(cluster: LocalCluster) -> bool:
    with gateway_socket(cluster) as good:
        good.sendall(request_frame(18, 0, 5, {}))
        return read_frame(good)[:4] == (5).to_bytes(4, "big")


def connect_from(cluster: LocalCluster, source: str) -> socket.socket:
    host, port = cluster.kafka_bootstrap().split(",")[0].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))


def answered(sock: socket.socket) -> socket.socket:
    """``sock`` once the gateway has served a request on it (it counts it)."""
    sock.sendall(request_frame(18, 0, 5, {}))
    assert read_frame(sock)[:4] == (5).to_bytes(4, "big")
    return sock


def refused(sock: socket.socket) -> bool:
    """Whether the gateway closed ``sock`` instead of answering."""
    with sock:
        sock.sendall(request_frame(18, 0, 5, {}))
        try:
            read_frame(sock)
        except ConnectionError:
            return True
        return False


def test_connections_past_max_connections_and_per_ip_are_closed(cluster: LocalCluster) -> None:
    # First in the module: the other tests leave connections the gateway
    # drops only when their frames' read limit passes.
    held = [answered(connect_from(cluster, "127.0.0.1")) for _ in range(MAX_CONNECTIONS_PER_IP)]
    try:
        # The address's limit: one more from 127.0.0.1 is closed, others still come in.
        assert refused(connect_from(cluster, "127.0.0.1"))
        held += [answered(connect_from(cluster, "127.0.0.2")) for _ in range(10)]
        assert refused(connect_from(cluster, "127.0.0.3"))  # the gateway's limit
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while True:  # the gateway notices the closed connections
        try:
            if api_versions_answered(cluster):
                break
        except ConnectionError:
            pass
        assert time.monotonic() < deadline, "the gateway never took connections again"
        time.sleep(0.1)


def test_big_partial_frames_wait_for_room_and_small_requests_are_still_answered(
    cluster: LocalCluster,
) -> None:
    (gateway,) = cluster.kafka_gateways()
    before = rss_bytes(gateway.pid)
    attackers: list[socket.socket] = []
    sent = 0
    chunk = b"\x00" * MIB
    try:
        for _ in range(64):
            sock = gateway_socket(cluster)
            attackers.append(sock)
            sock.sendall((50 * MIB).to_bytes(4, "big"))
            sock.settimeout(0.1)
            for _ in range(45):  # most of the frame, never all of it
                try:
                    sock.sendall(chunk)
                except TimeoutError:
                    break  # the gateway does not read this one (no room yet)
                sent += MIB
        assert api_versions_answered(cluster)
        grown = rss_bytes(gateway.pid) - before
        print(
            f"sent {sent / MIB:.0f} MiB of partial frames; the gateway grew {grown / MIB:.0f} MiB"
        )
        assert grown < 120 * MIB
    finally:
        for sock in attackers:
            sock.close()
    assert api_versions_answered(cluster)


def claimed_records_batch(claimed: int) -> bytes:
    """A gzip batch of 10 records whose header claims ``claimed``, CRC fixed up."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=1,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i in range(10):
        builder.append(i, timestamp=1_000, key=None, value=b"v", headers=[])
    data = bytearray(builder.build())
    data[57:61] = claimed.to_bytes(4, "big")
    data[17:21] = crc32c.crc32c(bytes(data[21:])).to_bytes(4, "big")
    return bytes(data)


def produce_error(cluster: LocalCluster, records: bytes) -> int:
    with gateway_socket(cluster) as sock:
        partition = {"index": 0, "records": records}
        body = {
            "acks": -1,
            "timeout": 5000,
            "topic_data": [{"name": TOPIC, "partition_data": [partition]}],
        }
        sock.sendall(request_frame(0, 3, 11, body))
        answer = read_frame(sock)
    response: Any = entity_reader(load_response_schema(0, 3))(answer, 4)[0]
    return int(response.responses[0].partition_responses[0].error_code)


def test_a_batch_claiming_a_million_records_is_refused_before_it_is_decoded(
    cluster: LocalCluster,
) -> None:
    began = time.monotonic()
    assert produce_error(cluster, claimed_records_batch(1_000_000)) == 87  # INVALID_RECORD
    refused_s = time.monotonic() - began
    began = time.monotonic()
    assert api_versions_answered(cluster)  # another client meanwhile (measured, not asserted)
    print(
        f"refused in {refused_s:.3f} s; another client answered in {time.monotonic() - began:.3f} s"
    )
    assert produce_error(cluster, claimed_records_batch(10)) == 0


#: What 2,000 idle connections may cost the gateway (docs/kafka.md, "Bounds").
CONNECTIONS_BOUND = 64 * MIB


@pytest.fixture(scope="module")
def roomy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A gateway with the default connection limits (2,000; 1,000 per address)."""
    path: Path = tmp_path_factory.mktemp("roomy")
    with running_cluster(path, shards=1, partition_nodes=1, kafka_listeners=1) as running:
        yield running


def test_two_thousand_connections_stay_within_a_bound_and_others_are_served(
    roomy: LocalCluster,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4096)), hard))
    (gateway,) = roomy.kafka_gateways()
    before = rss_bytes(gateway.pid)
    held: list[socket.socket] = []
    try:
        for source in ("127.0.0.2", "127.0.0.3"):
            held += [answered(connect_from(roomy, source)) for _ in range(995)]
        grown = rss_bytes(gateway.pid) - before
        print(f"{len(held)} connections; the gateway grew {grown / MIB:.1f} MiB")
        assert grown < CONNECTIONS_BOUND
        assert api_versions_answered(roomy)
    finally:
        for sock in held:
            sock.close()


def test_a_client_speaking_another_protocol_cannot_flood_the_log(cluster: LocalCluster) -> None:
    """100 connections that open with HTTP/2's preface (a gRPC client on the
    Kafka port) are closed at their first frame size; the gateway logs a few
    key=value lines about them, not 100."""
    (gateway,) = cluster.kafka_gateways()
    log = Path(gateway.log)
    before = len(log.read_text().splitlines())
    host, port = gateway.kafka.rsplit(":", 1)
    for _ in range(100):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            sock.settimeout(5)
            with contextlib.suppress(ConnectionError):
                sock.recv(1)  # until the gateway closes it
    deadline = time.monotonic() + 5
    while len(log.read_text().splitlines()) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = log.read_text().splitlines()[before:]
    print(f"{len(lines)} log lines for 100 connections")
    assert 1 <= len(lines) <= 20
    assert all("event=connection_closed" in line and "reason=frame_size" in line for line in lines)
