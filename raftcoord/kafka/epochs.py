"""Producer identities between Kafka clients and the coordinators.

The coordinators run Kafka's transactions v2 (KIP-890): every EndTxn bumps
the producer epoch, and a partition expects a new epoch's first batch at
sequence 0. The Kafka clients the gateway serves speak EndTxn below version
5: they keep the epoch InitProducerId gave them for the producer's whole
life and continue their sequence numbers across transactions. The gateway
translates, the one place that knows both sides:

* the client's identity (producer id, epoch) maps to the coordinators'
  current one, learnt from each EndTxn (the bumped identity it answers);
  until its first EndTxn an identity is its own server identity, so
  nothing is stored for it (nor ever for an idempotent producer);
* per partition, a produced batch's sequence is rebased to the first
  sequence the client sent there under the current server identity, so
  that each server epoch starts at 0.

The bases of a server identity live with its mapping and go with it: an
EndTxn drops the ended epoch's bases, and the book forgets whole client
identities, least recently used first, past :data:`MAX_IDENTITIES`. So a
forgotten identity is passed on untranslated, under an epoch the
coordinator has fenced: the producer is fenced, but no batch is ever
rebased on a wrong base (which could ack it as a duplicate, or refuse it
as out of order).

A zombie keeps its own, older client identity: it maps to an epoch the
coordinator has fenced (or to none), so fencing is unchanged. The book
lives in one gateway's memory (docs/kafka.md, "Epochs").
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

_SEQUENCE_SPAN = 2**31
#: Client identities remembered, each with its server identity and the
#: sequence bases (one per partition written to under that identity),
#: before the least recently used is forgotten.
MAX_IDENTITIES = 100_000

Identity = tuple[int, int]


@dataclass
class _Mapping:
    server: Identity
    #: (topic, partition) -> the first client sequence sent there under ``server``.
    bases: dict[tuple[str, int], int] = field(default_factory=dict)


@dataclass
class EpochBook:
    """Client identity -> server identity, and its sequence bases per partition."""

    capacity: int = MAX_IDENTITIES
    _mappings: OrderedDict[Identity, _Mapping] = field(default_factory=OrderedDict)

    def __len__(self) -> int:
        return len(self._mappings)

    def server(self, producer_id: int, epoch: int) -> Identity:
        """The server identity of the client identity (itself when unknown)."""
        found = self._use((producer_id, epoch))
        return (producer_id, epoch) if found is None else found.server

    def ended(self, client: Identity, server_after: Identity) -> None:
        """EndTxn answered ``server_after`` for the client identity ``client``:
        the ended epoch's bases are dropped, the next batches rebase anew."""
        self._mappings.pop(client, None)
        self._mappings[client] = _Mapping(server_after)
        if len(self._mappings) > self.capacity:
            self._mappings.popitem(last=False)

    def sequence(self, client: Identity, topic: str, partition: int, sequence: int) -> int:
        """``sequence`` (a batch's base sequence from the client identity
        ``client``) under its server identity; unchanged when ``client`` is
        unknown (its own server identity) or the sequence is unset."""
        found = self._use(client)
        if found is None or sequence < 0:
            return sequence
        base = found.bases.setdefault((topic, partition), sequence)
        return (sequence - base) % _SEQUENCE_SPAN

    def _use(self, client: Identity) -> _Mapping | None:
        found = self._mappings.get(client)
        if found is not None:
            self._mappings.move_to_end(client)
        return found
