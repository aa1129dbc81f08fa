"""Producer identities between Kafka clients and the coordinators.

The coordinators run Kafka's transactions v2 (KIP-890): every EndTxn bumps
the producer epoch, and a partition expects a new epoch's first batch at
sequence 0. The Kafka clients the gateway serves speak EndTxn below version
5: they keep the epoch InitProducerId gave them for the producer's whole
life and continue their sequence numbers across transactions. The gateway
translates, the one place that knows both sides:

* the client's identity (producer id, epoch) maps to the coordinators'
  current one, learnt from InitProducerId (the same) and each EndTxn (the
  bumped one it answers);
* per partition, a produced batch's sequence is rebased to the first
  sequence the client sent there under the current server identity, so
  that each server epoch starts at 0.

A zombie keeps its own, older client identity: it maps to an epoch the
coordinator has fenced (or to none), so fencing is unchanged. The book
lives in one gateway's memory (docs/kafka.md, "Epochs").
"""

from __future__ import annotations

from dataclasses import dataclass, field

_SEQUENCE_SPAN = 2**31
#: Identities remembered before the oldest are forgotten.
MAX_PRODUCERS = 100_000


@dataclass
class EpochBook:
    """Client identity -> server identity, and the sequence bases per partition."""

    _server: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    _bases: dict[tuple[int, int, str, int], int] = field(default_factory=dict)

    def started(self, producer_id: int, epoch: int) -> None:
        """InitProducerId handed out (``producer_id``, ``epoch``): the client uses it as is."""
        self._remember((producer_id, epoch), (producer_id, epoch))

    def server(self, producer_id: int, epoch: int) -> tuple[int, int]:
        """The server identity of the client identity (itself when unknown)."""
        return self._server.get((producer_id, epoch), (producer_id, epoch))

    def ended(self, client: tuple[int, int], server_after: tuple[int, int]) -> None:
        """EndTxn answered ``server_after`` for the client identity ``client``."""
        self._remember(client, server_after)

    def sequence(self, server: tuple[int, int], topic: str, partition: int, sequence: int) -> int:
        """``sequence`` (a client batch's base sequence) under the server identity."""
        if sequence < 0:
            return sequence
        key = (*server, topic, partition)
        base = self._bases.setdefault(key, sequence)
        if len(self._bases) > MAX_PRODUCERS:
            del self._bases[next(iter(self._bases))]
        return (sequence - base) % _SEQUENCE_SPAN

    def _remember(self, client: tuple[int, int], server: tuple[int, int]) -> None:
        self._server.pop(client, None)
        self._server[client] = server
        if len(self._server) > MAX_PRODUCERS:
            del self._server[next(iter(self._server))]
