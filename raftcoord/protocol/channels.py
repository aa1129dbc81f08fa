"""Cached gRPC channels, for every component that calls another: the client,
the coordinator's marker writers, the partition-log nodes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from raftcoord.protocol.v1 import coordinator_pb2_grpc, partition_log_pb2_grpc

#: The one reconnect and keepalive policy of every gRPC channel between
#: components (marker writers, partition-log nodes to coordinators, the Kafka
#: gateway, the client library, forwarding between coordinators). A node that
#: restarts is found again within about a second, not after gRPC's default
#: reconnect back-off of up to two minutes (an owed COMMIT marker then waited
#: 11-24 s for its partition node); keepalive pings, only while calls are
#: outstanding, find a peer that vanished without closing its connections.
CHANNEL_POLICY: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 0),
]


def open_channel(
    address: str,
    credentials: grpc.ChannelCredentials | None = None,
    options: Sequence[tuple[str, Any]] = tuple(CHANNEL_POLICY),
) -> grpc.Channel:
    """A channel to ``address``: over TLS with ``credentials``
    (:meth:`raftcoord.protocol.tls.Identity.channel_credentials`), else plaintext."""
    if credentials is None:
        return grpc.insecure_channel(address, options=list(options))
    return grpc.secure_channel(address, credentials, options=list(options))


def _closed() -> Exception:
    return RuntimeError("the channels are closed")


class ChannelCache:
    """One gRPC channel per address, shared by every stub made on it; thread-safe.

    Args:
        options: the gRPC channel options of every channel (default
            :data:`CHANNEL_POLICY`; callers add message size limits to it).
        closed_error: makes the exception raised when a channel or stub is
            asked for after :meth:`close`.
        credentials: TLS credentials of every channel; None: plaintext.
    """

    def __init__(
        self,
        options: Sequence[tuple[str, Any]] = tuple(CHANNEL_POLICY),
        closed_error: Callable[[], Exception] = _closed,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.options = list(options)
        self.credentials = credentials
        self._closed_error = closed_error
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[tuple[str, str], Any] = {}
        self._closed = False

    def _channel(self, address: str) -> grpc.Channel:
        if self._closed:
            raise self._closed_error()
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(
                address, self.credentials, self.options
            )
        return channel

    def channel(self, address: str) -> grpc.Channel:
        """The channel to ``address``, opened on first use."""
        with self._lock:
            return self._channel(address)

    def _stub(self, address: str, kind: str, make: Callable[[grpc.Channel], Any]) -> Any:
        with self._lock:
            stub = self._stubs.get((address, kind))
            if stub is None:
                stub = self._stubs[(address, kind)] = make(self._channel(address))
            return stub

    def coordinator(self, address: str) -> Any:
        """A TransactionCoordinator stub for ``address``."""
        return self._stub(address, "coordinator", coordinator_pb2_grpc.TransactionCoordinatorStub)

    def partition_log(self, address: str) -> Any:
        """A PartitionLog stub for ``address``."""
        return self._stub(address, "partition_log", partition_log_pb2_grpc.PartitionLogStub)

    def close(self) -> None:
        """Close every channel; asking for one afterwards raises ``closed_error()``."""
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
        for channel in channels:
            channel.close()
