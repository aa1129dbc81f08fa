"""What the families of Kafka APIs share: the shape of a handler, which
gateway fronts which node, and asking the coordinators about many ids."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from raftcoord.kafka import messages as m
from raftcoord.protocol.config import ClusterConfig, KafkaListener

#: A Kafka response's fields, as :func:`raftcoord.kafka.messages.encode_response` takes them.
Data = dict[str, Any]
#: A Kafka API's handler: the response to a request, or None when none is
#: sent (acks=0 produce).
Handler = Callable[[m.Request], Awaitable[Data | None]]
#: Coordinator calls one request makes at once when it names many ids.
MAX_CALLS_PER_REQUEST = 16


class Gateways:
    """Which gateway stands in front of which node: gateway i for the i-th
    coordinator and for the i-th partition-log node (modulo the gateway
    count), as seen from ``listener``, the gateway serving the request."""

    def __init__(self, config: ClusterConfig, listener: KafkaListener) -> None:
        self.config = config
        self.listener = listener

    def of_coordinator(self, node_id: int) -> KafkaListener:
        """The gateway that fronts coordinator ``node_id``: it lists the
        transactions of the shards that coordinator leads (ListTransactions)."""
        return self._at([c.node_id for c in self.config.coordinators], node_id)

    def of_partition_node(self, node_id: int) -> KafkaListener:
        """The gateway named as the leader of partition-log node ``node_id``'s partitions."""
        return self._at([n.node_id for n in self.config.partition_nodes], node_id)

    def of_partition_nodes(self, node_ids: Iterable[int]) -> list[int]:
        """The gateways in front of partition-log nodes ``node_ids``, in their
        order, each once (fewer gateways than nodes front several each)."""
        gateways = (self.of_partition_node(n).node_id for n in node_ids)
        return list(dict.fromkeys(gateways))

    def fronted_coordinators(self) -> list[str]:
        """The gRPC addresses of the coordinators this gateway fronts."""
        return [
            c.grpc
            for c in self.config.coordinators
            if self.of_coordinator(c.node_id) == self.listener
        ]

    def brokers(self) -> list[Data]:
        """Every gateway, as Metadata's brokers."""
        brokers = []
        for gateway in self.config.kafka_listeners:
            host, port = gateway.address.rsplit(":", 1)
            brokers.append({"node_id": gateway.node_id, "host": host, "port": int(port)})
        return brokers

    def _at(self, node_ids: list[int], node_id: int) -> KafkaListener:
        """Gateway i for the i-th of ``node_ids`` (by position, modulo the
        gateway count); the first for an id not among them."""
        position = node_ids.index(node_id) if node_id in node_ids else 0
        return self.config.kafka_listeners[position % len(self.config.kafka_listeners)]


async def each_once(keys: list[str], call: Callable[[str], Awaitable[Data]]) -> list[Data]:
    """``call`` of each key, in the keys' order, each distinct key asked once
    by one of at most :data:`MAX_CALLS_PER_REQUEST` workers (a request of
    half a million ids, a megabyte, would otherwise start as many calls, or
    tasks waiting for their turn, at once)."""
    answers: dict[str, Data] = {}
    pending = iter(dict.fromkeys(keys))

    async def worker() -> None:
        for key in pending:  # shared: each key goes to the first worker free
            answers[key] = await call(key)

    await asyncio.gather(*(worker() for _ in range(min(MAX_CALLS_PER_REQUEST, len(keys)))))
    return [answers[key] for key in keys]
