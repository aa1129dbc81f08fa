"""A gateway's client connections, in-process against a scripted owner
gateway: relayed requests of different clients proceed independently and
fail independently, a client's relayed requests are pipelined, and a
request whose answer cannot be made closes its connection instead of
leaving it hanging."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kio.index import load_request_schema
from kio.serial import entity_writer

from raftcoord.cluster.launcher import free_ports
from raftcoord.kafka import messages as m
from raftcoord.kafka.gateway import Gateway
from raftcoord.protocol.config import ClusterConfig, KafkaListener, NodeAddress
from raftcoord.protocol.routing import stable_hash

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


def owned_by_second(prefix: str) -> str:
    """A transactional id that the second of two gateways owns."""
    return next(f"{prefix}-{i}" for i in range(100) if stable_hash(f"{prefix}-{i}") % 2 == 1)


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    size = int.from_bytes(await reader.readexactly(4), "big")
    return await reader.readexactly(size)


class ScriptedOwner:
    """The owner gateway: answers each request with its correlation id and
    the request's transactional id once ``gate(id)`` is set; closes the
    connection instead on an id that starts with "drop"."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.arrived = asyncio.Condition()
        self._released: dict[str, asyncio.Event] = {}
        self.server: asyncio.Server | None = None

    def gate(self, transactional_id: str) -> asyncio.Event:
        return self._released.setdefault(transactional_id, asyncio.Event())

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answering: list[asyncio.Task[None]] = []
        with_answers = asyncio.Lock()  # answers in request order, as Kafka's brokers do
        try:
            while True:
                frame = await read_frame(reader)
                request = m.decode_request(frame)
                transactional_id = str(request.body.transactional_id)
                async with self.arrived:
                    self.received.append(transactional_id)
                    self.arrived.notify_all()
                if transactional_id.startswith("drop"):
                    return
                answering.append(
                    asyncio.create_task(
                        self._answer(writer, with_answers, frame[4:8], transactional_id)
                    )
                )
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for task in answering:
                task.cancel()
            writer.close()

    async def _answer(
        self,
        writer: asyncio.StreamWriter,
        in_order: asyncio.Lock,
        correlation: bytes,
        transactional_id: str,
    ) -> None:
        async with in_order:
            await self.gate(transactional_id).wait()
            payload = correlation + transactional_id.encode()
            writer.write(len(payload).to_bytes(4, "big") + payload)

    async def wait_received(self, count: int) -> None:
        async with self.arrived:
            await asyncio.wait_for(
                self.arrived.wait_for(lambda: len(self.received) >= count), WAIT_S
            )


async def with_gateway(
    test: Callable[[Gateway, ScriptedOwner, str], Awaitable[None]], relay_timeout_s: float = 30.0
) -> None:
    owner = ScriptedOwner()
    owner_address = await owner.start()
    (port,) = free_ports(1)
    listener = KafkaListener(node_id=1, address=f"127.0.0.1:{port}")
    config = ClusterConfig(
        shard_count=1,
        coordinators=(NodeAddress(node_id=1, grpc="127.0.0.1:1"),),
        kafka_listeners=(listener, KafkaListener(node_id=2, address=owner_address)),
    )
    gateway = Gateway(config, listener)
    gateway.relay_timeout_s = relay_timeout_s
    await gateway.start()
    try:
        await test(gateway, owner, listener.address)
    finally:
        await gateway.stop()
        assert owner.server is not None
        owner.server.close()


async def connect(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = address.rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


def test_a_slow_relayed_request_holds_up_only_its_own_client() -> None:
    """Client A's request waits at the owner until its relay times out,
    which closes A's connection; client B's requests to the same owner are
    answered meanwhile and after, on a connection that stays open."""
    slow, quick = owned_by_second("slow"), owned_by_second("quick")

    async def test(gateway: Gateway, owner: ScriptedOwner, address: str) -> None:
        owner.gate(quick).set()
        a_reader, a_writer = await connect(address)
        b_reader, b_writer = await connect(address)
        a_writer.write(end_txn(slow, 1))
        await owner.wait_received(1)
        b_writer.write(end_txn(quick, 2))
        answer = await asyncio.wait_for(read_frame(b_reader), WAIT_S)
        assert answer == (2).to_bytes(4, "big") + quick.encode()
        with pytest.raises(asyncio.IncompleteReadError):
            await asyncio.wait_for(read_frame(a_reader), WAIT_S)  # closed at the timeout
        b_writer.write(end_txn(quick, 3))
        answer = await asyncio.wait_for(read_frame(b_reader), WAIT_S)
        assert answer == (3).to_bytes(4, "big") + quick.encode()
        a_writer.close()
        b_writer.close()

    asyncio.run(with_gateway(test, relay_timeout_s=2.0))


def test_a_clients_relayed_requests_are_pipelined_and_answered_in_order() -> None:
    """Three requests of one client are all at the owner before it answers
    the first: they are in flight together, not sent one at a time."""
    ids = [owned_by_second(f"pipelined{i}") for i in range(3)]

    async def test(gateway: Gateway, owner: ScriptedOwner, address: str) -> None:
        reader, writer = await connect(address)
        writer.write(b"".join(end_txn(t, 10 + i) for i, t in enumerate(ids)))
        await owner.wait_received(3)
        for t in reversed(ids):
            owner.gate(t).set()
        answers = [await asyncio.wait_for(read_frame(reader), WAIT_S) for _ in ids]
        assert answers == [(10 + i).to_bytes(4, "big") + t.encode() for i, t in enumerate(ids)]
        writer.close()

    asyncio.run(with_gateway(test))


def test_an_answer_that_cannot_be_encoded_closes_its_connection() -> None:
    """A handler's answer that does not fit its schema (an error code past
    int16) closes the connection, and the connection's task ends; other
    connections are served."""
    unencodable = {"error_code": 2**20, "api_keys": []}
    with pytest.raises(ValueError):
        m.encode_response(m.API_VERSIONS, 0, 1, unencodable)

    async def test(gateway: Gateway, owner: ScriptedOwner, address: str) -> None:
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


def test_an_owner_that_drops_the_relay_closes_only_its_clients_connection() -> None:
    """The owner closes the relay connection of client A with A's request
    unanswered (and a second one queued behind it): A's connection is
    closed; client B, connected before, is served, and so is A again on a
    new connection."""
    dropped, quick = owned_by_second("drop"), owned_by_second("quick")

    async def answered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(end_txn(quick, 3))
        answer = await asyncio.wait_for(read_frame(reader), WAIT_S)
        assert answer == (3).to_bytes(4, "big") + quick.encode()
        writer.close()

    async def test(gateway: Gateway, owner: ScriptedOwner, address: str) -> None:
        owner.gate(quick).set()
        a_reader, a_writer = await connect(address)
        b_reader, b_writer = await connect(address)
        a_writer.write(end_txn(dropped, 1) + end_txn(quick, 2))
        with pytest.raises(asyncio.IncompleteReadError):
            await asyncio.wait_for(read_frame(a_reader), WAIT_S)
        a_writer.close()
        await answered(b_reader, b_writer)
        await answered(*await connect(address))

    asyncio.run(with_gateway(test))
