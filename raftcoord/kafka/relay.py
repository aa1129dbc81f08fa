"""Passing a request on to the gateway that owns its transactional id.

The epoch book of a transactional id (:mod:`raftcoord.kafka.epochs`) lives
in one gateway, its owner. A request about that id that reaches another
gateway (a transactional Produce to a partition this gateway leads, a
TxnOffsetCommit at the group's gateway) is sent on to the owner as it came,
over the owner's Kafka listener, and the owner's answer goes back to the
client. Only the correlation id is changed on the way (the header's
field, which every request and response version keeps at the same place),
so that the frames themselves stay the client's.

Each client connection relays over connections of its own (one per owner
gateway), as if the client were connected to the owner: its requests reach
the owner in the order they came, pipelined, and the owner answers them in
that order (a client's sequence numbers are rebased in arrival order, so
reordering them could rebase a batch on a later one). Requests of other
clients never wait behind them, and a failure or timeout closes only the
connection of the client whose request failed.

To a TLS listener (SSL or SASL_SSL) the relay connects with this gateway's
node certificate and first authenticates with
:data:`raftcoord.kafka.auth.RELAY_MECHANISM`, naming the client it acts for
(:mod:`raftcoord.kafka.auth`), so that the owner checks that client's rights.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct

from raftcoord.kafka import messages as m
from raftcoord.kafka.auth import RELAY_MECHANISM, relay_auth_bytes
from raftcoord.protocol.acl import Principal
from raftcoord.protocol.errors import ErrorCode

_SIZE = struct.Struct(">i")
#: Where a request's correlation id sits: after the api key and version.
_REQUEST_CORRELATION = 4


class PeerUnavailable(Exception):
    """The owner gateway could not be reached, closed the connection, or did
    not answer in time."""


class Peer:
    """One connection to another gateway, carrying the relayed requests of
    one client connection; requests are pipelined and each answer is matched
    to its request by correlation id."""

    def __init__(
        self,
        address: str,
        timeout_s: float,
        tls: ssl.SSLContext | None = None,
        client: Principal | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        #: The TLS of a connection to a TLS listener, and the client relayed for.
        self.tls = tls
        self.client = client
        #: Held while a request is written, so that requests go out in call order.
        self._sending = asyncio.Lock()
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        #: Our correlation id -> (the client's, the future of the answer).
        self._waiting: dict[int, tuple[int, asyncio.Future[bytes]]] = {}
        self._correlation = 0
        self._failure: PeerUnavailable | None = None

    async def call(self, frame: bytes, expect_answer: bool) -> bytes | None:
        """Send ``frame`` (a request without its size prefix); return the
        answer's payload with the frame's own correlation id, or None when
        no answer is expected.

        Raises:
            PeerUnavailable: the peer could not be reached, closed the
                connection, or did not answer within the timeout; the
                connection is closed and every request waiting on it fails.
        """
        (client_correlation,) = _SIZE.unpack_from(frame, _REQUEST_CORRELATION)
        try:
            async with asyncio.timeout(self.timeout_s):
                answer = await self._send(frame, client_correlation, expect_answer)
                return None if answer is None else await answer
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            failure = PeerUnavailable(f"gateway {self.address}: {exc!r}")
            self._fail(failure)
            raise failure from exc

    async def _send(
        self, frame: bytes, client_correlation: int, expect_answer: bool
    ) -> asyncio.Future[bytes] | None:
        async with self._sending:
            if self._failure is not None:
                raise self._failure
            if self._writer is None:
                host, port = self.address.rsplit(":", 1)
                reader, self._writer = await asyncio.open_connection(
                    host, int(port), ssl=self.tls, server_hostname=host if self.tls else None
                )
                if self.tls is not None and self.client is not None:
                    await self._authenticate(reader, self._writer, self.client)
                self._reading = asyncio.create_task(self._read_answers(reader))
            self._correlation = (self._correlation + 1) % 2**31
            answer: asyncio.Future[bytes] | None = None
            if expect_answer:
                answer = asyncio.get_running_loop().create_future()
                self._waiting[self._correlation] = (client_correlation, answer)
            sent = bytearray(frame)
            _SIZE.pack_into(sent, _REQUEST_CORRELATION, self._correlation)
            self._writer.write(_SIZE.pack(len(sent)) + sent)
            await self._writer.drain()
            return answer

    @staticmethod
    async def _authenticate(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client: Principal
    ) -> None:
        """Name ``client`` to the owner (SaslHandshake v1, SaslAuthenticate v2).

        Raises:
            OSError: the owner refused or answered something else.
        """
        steps: tuple[tuple[int, int, dict[str, object]], ...] = (
            (m.SASL_HANDSHAKE, 1, {"mechanism": RELAY_MECHANISM}),
            (m.SASL_AUTHENTICATE, 2, {"auth_bytes": relay_auth_bytes(client)}),
        )
        for correlation, (api_key, version, body) in enumerate(steps):
            writer.write(m.encode_request(api_key, version, correlation, "relay", body))
            await writer.drain()
            (size,) = _SIZE.unpack(await reader.readexactly(_SIZE.size))
            try:
                answer = m.decode_response(api_key, version, await reader.readexactly(size))
            except m.MalformedRequest as exc:
                raise OSError(str(exc)) from exc
            if int(answer.error_code) != ErrorCode.NONE:
                raise OSError(f"relay authentication refused: {int(answer.error_code)}")

    async def _read_answers(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                (size,) = _SIZE.unpack(await reader.readexactly(_SIZE.size))
                answer = bytearray(await reader.readexactly(size))
                (correlation,) = _SIZE.unpack_from(answer, 0)
                client_correlation, waiting = self._waiting.pop(correlation, (0, None))
                if waiting is None:
                    raise OSError(f"an answer to request {correlation}, which was not sent")
                _SIZE.pack_into(answer, 0, client_correlation)
                if not waiting.done():
                    waiting.set_result(bytes(answer))
        except (OSError, asyncio.IncompleteReadError, struct.error) as exc:
            self._fail(PeerUnavailable(f"gateway {self.address}: {exc!r}"))

    def _fail(self, failure: PeerUnavailable) -> None:
        """Close the connection; every request still waiting on it fails."""
        if self._failure is None:
            self._failure = failure
        for _, waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(failure)
        self._waiting.clear()
        if self._writer is not None:
            self._writer.transport.abort()
        if self._reading is not None and self._reading is not asyncio.current_task():
            self._reading.cancel()

    async def close(self) -> None:
        self._fail(PeerUnavailable(f"gateway {self.address}: closed"))
        if self._reading is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
