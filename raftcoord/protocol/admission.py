"""Places for connections that have not authenticated yet, counted per
source address.

A listener that authenticates its peers (a TLS handshake, the Raft
transport's HELLO and AUTH) holds each accepted connection for a while
before it knows who sent it: those places are what a stranger with no
credentials can take. :class:`HandshakeSlots` counts them per source
address. An address that is not the cluster's own holds at most
``per_source`` at a time, and all of them at most ``total`` together; an
address of the cluster's (``reserved``: the hosts of the cluster's nodes)
holds at most ``per_reserved`` of its own, apart from them. So strangers
elsewhere, however many addresses they use, never take the places of the
cluster's own connections; a stranger sharing a node's host shares that
host's places.

:func:`cluster_sources` gives the cluster's own addresses: those of its
nodes' hosts, as resolved when the listener starts. :class:`HandshakeSlots`
is thread-safe. :class:`HandshakeDeadline` closes a connection that has
not authenticated within its time, as a whole (a socket's timeout bounds
each read alone: a peer trickling a byte at a time would pass it).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable

from raftcoord.protocol.config import ClusterConfig

__all__ = [
    "HandshakeDeadline",
    "HandshakeSlots",
    "close_connection",
    "cluster_sources",
    "host_addresses",
]


def cluster_sources(config: ClusterConfig) -> frozenset[str]:
    """The IP addresses of the hosts of ``config``'s nodes."""
    nodes = (*config.coordinators, *config.partition_nodes)
    addresses = [n.grpc for n in nodes] + [a for n in nodes for a in n.raft]
    addresses += [a for n in nodes for a in (n.replication, n.link) if a is not None]
    addresses += [k.address for k in config.kafka_listeners]
    return host_addresses(addresses)


def host_addresses(addresses: Iterable[str]) -> frozenset[str]:
    """The IP addresses of the hosts of ``addresses`` (``host:port``); a name
    that does not resolve is left out (its connections count as a stranger's)."""
    found: set[str] = set()
    for host in {address.rsplit(":", 1)[0].strip("[]") for address in addresses}:
        try:
            found.update(str(info[4][0]) for info in socket.getaddrinfo(host, None))
        except (OSError, UnicodeError):
            continue
    return frozenset(found)


class HandshakeSlots:
    """See the module docstring."""

    def __init__(
        self, per_source: int, total: int, reserved: Iterable[str] = (), per_reserved: int = 0
    ) -> None:
        if per_source < 1 or total < per_source:
            raise ValueError("a listener needs places for handshakes, per source and in all")
        self.per_source = per_source
        self.total = total
        self.reserved = frozenset(reserved)
        self.per_reserved = max(per_reserved, per_source)
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._strangers = 0  # held by addresses outside ``reserved``

    def take(self, source: str) -> bool:
        """Take a place for a connection from ``source`` (its IP address);
        whether there was one. Each place taken is given back once."""
        with self._lock:
            held = self._held.get(source, 0)
            stranger = source not in self.reserved
            if held >= (self.per_source if stranger else self.per_reserved):
                return False
            if stranger:
                if self._strangers >= self.total:
                    return False
                self._strangers += 1
            self._held[source] = held + 1
            return True

    def give_back(self, source: str) -> None:
        """The connection from ``source`` authenticated or ended."""
        with self._lock:
            held = self._held.get(source, 0)
            if held <= 0:
                raise ValueError(f"no place is held for {source}")
            if held == 1:
                del self._held[source]
            else:
                self._held[source] = held - 1
            if source not in self.reserved:
                self._strangers -= 1

    def held(self, source: str | None = None) -> int:
        """Places held by ``source``, or by every address (None)."""
        with self._lock:
            if source is not None:
                return self._held.get(source, 0)
            return sum(self._held.values())


class HandshakeDeadline:
    """Closes a connection that is not let in (:meth:`disarm`) within
    ``seconds``: a bound on the handshake and on a stranger's refused
    request as a whole, where socket timeouts bound each read alone."""

    def __init__(self, connection: socket.socket, seconds: float) -> None:
        self._lock = threading.Lock()
        self._connection = connection
        self._armed = True
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def follow(self, connection: socket.socket) -> None:
        """The connection is ``connection`` from now on (wrapped in TLS;
        closed now if the time ran out while the old one was being wrapped)."""
        with self._lock:
            self._connection = connection
            expired = not self._armed
        if expired:
            close_connection(connection)

    def disarm(self) -> bool:
        """Whether it was still armed (the connection not closed for its
        time); it closes nothing from now on."""
        with self._lock:
            armed, self._armed = self._armed, False
        self._timer.cancel()
        return armed

    def _expire(self) -> None:
        with self._lock:
            if not self._armed:
                return
            self._armed = False
            connection = self._connection
        close_connection(connection)


def close_connection(connection: socket.socket) -> None:
    """Shut ``connection`` down both ways (a thread blocked reading it wakes) and close it."""
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    connection.close()
