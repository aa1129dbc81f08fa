"""Passing a request on to the gateway that owns its transactional id.

The epoch book of a transactional id (:mod:`raftcoord.kafka.epochs`) lives
in one gateway, its owner. A request about that id that reaches another
gateway (a transactional Produce to a partition this gateway leads, a
TxnOffsetCommit at the group's gateway) is sent on to the owner as it came,
over the owner's Kafka listener, and the owner's answer goes back to the
client. Only the correlation id is changed on the way (the header's
field, which every request and response version keeps at the same place),
so that the frames themselves stay the client's.
"""

from __future__ import annotations

import asyncio
import struct

_SIZE = struct.Struct(">i")
#: Where a request's correlation id sits: after the api key and version.
_REQUEST_CORRELATION = 4


class PeerUnavailable(Exception):
    """The owner gateway could not be reached or closed the connection."""


class Peer:
    """One connection to another gateway, one request at a time on it."""

    def __init__(self, address: str, timeout_s: float) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._lock = asyncio.Lock()
        self._stream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._correlation = 0

    async def call(self, frame: bytes, expect_answer: bool) -> bytes | None:
        """Send ``frame`` (a request without its size prefix); return the
        answer's payload with the frame's own correlation id, or None when
        no answer is expected.

        Raises:
            PeerUnavailable: the peer could not be reached, closed the
                connection, or did not answer within the timeout.
        """
        (client_correlation,) = _SIZE.unpack_from(frame, _REQUEST_CORRELATION)
        async with self._lock:
            try:
                return await asyncio.wait_for(
                    self._exchange(frame, client_correlation, expect_answer), self.timeout_s
                )
            except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                await self.close()
                raise PeerUnavailable(f"gateway {self.address}: {exc!r}") from exc

    async def _exchange(
        self, frame: bytes, client_correlation: int, expect_answer: bool
    ) -> bytes | None:
        if self._stream is None:
            host, port = self.address.rsplit(":", 1)
            self._stream = await asyncio.open_connection(host, int(port))
        reader, writer = self._stream
        self._correlation = (self._correlation + 1) % 2**31
        sent = bytearray(frame)
        _SIZE.pack_into(sent, _REQUEST_CORRELATION, self._correlation)
        writer.write(_SIZE.pack(len(sent)) + sent)
        await writer.drain()
        if not expect_answer:
            return None
        (size,) = _SIZE.unpack(await reader.readexactly(_SIZE.size))
        answer = bytearray(await reader.readexactly(size))
        (correlation,) = _SIZE.unpack_from(answer, 0)
        if correlation != self._correlation:
            raise OSError(f"answer for request {correlation}, expected {self._correlation}")
        _SIZE.pack_into(answer, 0, client_correlation)
        return bytes(answer)

    async def close(self) -> None:
        if self._stream is not None:
            _, writer = self._stream
            self._stream = None
            writer.close()
