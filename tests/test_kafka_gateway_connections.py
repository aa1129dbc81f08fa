"""A gateway's client connections, in-process: FindCoordinator names the
gateway asked and it answers any key's requests itself (a gateway keeps
nothing of a key), and a request whose answer cannot be made closes its
connection instead of leaving it hanging."""

from __future__ import annotations

import asyncio
import io
import types
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from raftcoord.cluster.launcher import free_ports
from raftcoord.kafka import connections
from raftcoord.kafka import messages as m
from raftcoord.kafka.apis import admin, common
from raftcoord.kafka.gateway import Gateway
from raftcoord.protocol.config import ClusterConfig, KafkaListener, NodeAddress
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.v1 import coordinator_pb2

pytestmark = pytest.mark.timeout(60)

#: Bounds every wait of these tests; none is reached when the gateway works.
WAIT_S = 10.0


def request_frame(api_key: int, version: int, correlation_id: int, body: dict[str, Any]) -> bytes:
    """A size-prefixed request frame, written with kio's schemas."""
    schema = load_request_schema(api_key, version)
    out = io.BytesIO()
    header = {
        "request_api_key": api_key,
        "request_api_version": version,
        "correlation_id": correlation_id,
        "client_id": "raw",
    }
    entity_writer(schema.__header_schema__)(out, m.build(schema.__header_schema__, header))
    entity_writer(schema)(out, m.build(schema, body))
    payload = out.getvalue()
    return len(payload).to_bytes(4, "big") + payload


def end_txn(transactional_id: str, correlation_id: int) -> bytes:
    body = {
        "transactional_id": transactional_id,
        "producer_id": 1,
        "producer_epoch": 0,
        "committed": True,
    }
    return request_frame(m.END_TXN, 1, correlation_id, body)


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    size = int.from_bytes(await reader.readexactly(4), "big")
    return await reader.readexactly(size)


async def with_gateway(test: Callable[[Gateway, str], Awaitable[None]]) -> None:
    """A gateway whose coordinator does not answer, beside a second gateway
    named in the config (nothing listens there)."""
    first, second = free_ports(2)
    listener = KafkaListener(node_id=1, address=f"127.0.0.1:{first}")
    config = ClusterConfig(
        shard_count=1,
        coordinators=(NodeAddress(node_id=1, grpc="127.0.0.1:1"),),
        kafka_listeners=(listener, KafkaListener(node_id=2, address=f"127.0.0.1:{second}")),
    )
    gateway = Gateway(config, listener)
    await gateway.start()
    try:
        await test(gateway, listener.address)
    finally:
        await gateway.stop()


async def connect(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = address.rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


def test_find_coordinator_names_the_gateway_asked_which_serves_the_key() -> None:
    """FindCoordinator of any key names this gateway, and an EndTxn for it is
    answered here: this gateway asks the coordinators itself (here none
    answers: COORDINATOR_NOT_AVAILABLE), on the same connection."""

    async def test(gateway: Gateway, address: str) -> None:
        reader, writer = await connect(address)
        writer.write(request_frame(m.FIND_COORDINATOR, 1, 6, {"key": "tx-1", "key_type": 1}))
        answer = await asyncio.wait_for(read_frame(reader), WAIT_S)
        found: Any = entity_reader(load_response_schema(m.FIND_COORDINATOR, 1))(answer, 4)[0]
        assert (int(found.error_code), found.node_id) == (0, gateway.listener.node_id)
        assert f"{found.host}:{found.port}" == address
        writer.write(end_txn("tx-1", 7))
        answer = await asyncio.wait_for(read_frame(reader), WAIT_S)
        assert answer[:4] == (7).to_bytes(4, "big")
        response: Any = entity_reader(load_response_schema(m.END_TXN, 1))(answer, 4)[0]
        assert int(response.error_code) == 15  # COORDINATOR_NOT_AVAILABLE
        writer.close()

    asyncio.run(with_gateway(test))


def test_an_answer_that_cannot_be_encoded_closes_its_connection() -> None:
    """A handler's answer that does not fit its schema (an error code past
    int16) closes the connection, and the connection's task ends; other
    connections are served."""
    unencodable = {"error_code": 2**20, "api_keys": []}
    with pytest.raises(ValueError):
        m.encode_response(m.API_VERSIONS, 0, 1, unencodable)

    async def test(gateway: Gateway, address: str) -> None:
        async def broken(request: m.Request) -> dict[str, Any]:
            return unencodable

        gateway._handlers[m.API_VERSIONS] = broken
        reader, writer = await connect(address)
        writer.write(request_frame(m.API_VERSIONS, 0, 1, {}))
        with pytest.raises(asyncio.IncompleteReadError):
            await asyncio.wait_for(read_frame(reader), WAIT_S)
        writer.close()

        async def connections_closed() -> None:
            while gateway._connections:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(connections_closed(), WAIT_S)
        reader, writer = await connect(address)
        writer.write(request_frame(m.METADATA, 1, 2, {"topics": []}))
        answer = await asyncio.wait_for(read_frame(reader), WAIT_S)
        assert answer[:4] == (2).to_bytes(4, "big")
        writer.close()

    asyncio.run(with_gateway(test))


def test_a_client_that_never_reads_its_answers_is_disconnected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An answer that the client does not take within the write timeout (its
    socket's buffers full: here every drain waits for good, as for a client
    that sends and never reads) closes the connection, and frees what it
    held."""
    monkeypatch.setattr(connections, "FRAME_WRITE_TIMEOUT_S", 0.3)

    async def never_drained(self: asyncio.StreamWriter) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(asyncio.StreamWriter, "drain", never_drained)

    async def test(gateway: Gateway, address: str) -> None:
        _, writer = await connect(address)
        writer.write(request_frame(m.API_VERSIONS, 0, 1, {}))  # no drain here either

        async def disconnected() -> None:
            while not gateway._connections:  # connected first
                await asyncio.sleep(0.01)
            while gateway._connections:
                await asyncio.sleep(0.01)

        try:
            await asyncio.wait_for(disconnected(), WAIT_S)
        finally:
            writer.close()

    asyncio.run(with_gateway(test))


def test_ids_named_many_times_are_asked_once_and_a_few_at_a_time() -> None:
    """DescribeGroups and DescribeTransactions answer every id named, in
    order, but ask the coordinators about each distinct id once, at most
    MAX_CALLS_PER_REQUEST at a time."""
    asked: list[str] = []
    running = [0, 0]  # now, most

    async def call(key: str) -> dict[str, Any]:
        asked.append(key)
        running[0] += 1
        running[1] = max(running)
        await asyncio.sleep(0.001)
        running[0] -= 1
        return {"id": key}

    keys = [f"g{i % 50}" for i in range(1_000)]
    answers = asyncio.run(common.each_once(keys, call))
    assert [a["id"] for a in answers] == keys
    assert sorted(asked) == sorted(set(keys))
    assert running[1] == common.MAX_CALLS_PER_REQUEST


def test_a_missing_topic_named_many_times_is_looked_up_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Fetch or Produce naming the partitions of a topic that does not
    exist asks the coordinators about it once, not once per partition."""

    async def test(gateway: Gateway, address: str) -> None:
        lookups: list[Any] = []

        async def metadata(topics: Any) -> Any:
            lookups.append(topics)
            return coordinator_pb2.MetadataResponse()

        monkeypatch.setattr(gateway.backend, "metadata", metadata)

        async def never(stub: Any, payloads: list[int]) -> Any:
            raise AssertionError("no partition-log node to call")

        items = [("absent", p, p) for p in range(500)]
        done, failed = await gateway.backend.per_owner(items, never)
        assert done == [] and len(failed) == 500
        assert {code for _, _, code in failed} == {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        assert lookups == [["absent"]]

    asyncio.run(with_gateway(test))


@pytest.mark.parametrize("value", ["2", "0", "-1", "two", "99999999999", str(2**31)])
def test_min_insync_replicas_of_a_new_topic_is_a_positive_int32_or_refused(value: str) -> None:
    """Out of range (past int32) is refused like any value that is not a
    positive number (INVALID_CONFIG), not an error building the call."""
    config = types.SimpleNamespace(name="min.insync.replicas", value=value)
    wanted = admin._min_insync_replicas([config])
    assert wanted == (2 if value == "2" else -1)
    coordinator_pb2.CreatableTopic(name="t", min_insync_replicas=wanted)  # fits the field
