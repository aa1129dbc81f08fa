"""Hanging transactions: open on a partition while no coordinator will ever
write their marker there, so that the partition's last stable offset stays at
their first offset and read_committed consumers never get past it.

This is the decision of Kafka's ``kafka-transactions.sh find-hanging``
(KIP-664), shared by ``raftcoord txn find-hanging`` and ``raftcoord
console``: a producer with an open transaction on a partition that has
written nothing there for longer than the longest transaction timeout is a
*candidate*; it is *hanging* unless a coordinator still owes that partition a
marker that closes it. :func:`find_hanging` asks the coordinators, then looks
at the partitions a second time, so that a transaction that ended meanwhile is
not reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from raftcoord.client.admin import Admin
from raftcoord.client.errors import TransactionalIdNotFoundError
from raftcoord.client.records import ProducerState, TopicPartition, TransactionDescription

__all__ = ["OpenTransaction", "find_hanging", "is_candidate", "is_hanging"]

#: Coordinator states in which the transaction's markers are still to be
#: written, and the epoch they will carry (Ongoing: the next one).
_MARKER_EPOCH_BUMP = {
    "Ongoing": 1,
    "PrepareCommit": 0,
    "PrepareAbort": 0,
    "PrepareEpochFence": 0,
}


@dataclass(frozen=True)
class OpenTransaction:
    """A producer's open transaction on one partition."""

    topic_partition: TopicPartition
    producer: ProducerState


def is_candidate(producer: ProducerState, now_ms: int, max_transaction_timeout_ms: int) -> bool:
    """Whether the producer has an open transaction on the partition and has
    written nothing there for longer than the longest transaction timeout (as
    Kafka's find-hanging: a live transaction ends, or is aborted, before)."""
    return (
        producer.current_transaction_start_offset >= 0
        and now_ms - producer.last_timestamp_ms > max_transaction_timeout_ms
    )


def is_hanging(txn: OpenTransaction, descriptions: Iterable[TransactionDescription]) -> bool:
    """Whether no coordinator will end ``txn``: none of ``descriptions`` (the
    coordinators' transactions of its producer id) has this partition in a
    transaction whose markers are still to come with an epoch above the
    partition's (a marker closes a transaction only if its epoch is greater
    than the transaction's data epoch)."""
    producer = txn.producer
    for d in descriptions:
        bump = _MARKER_EPOCH_BUMP.get(d.state)
        if (
            bump is not None
            and d.producer_id == producer.producer_id
            and txn.topic_partition in d.partitions
            and d.producer_epoch + bump > producer.producer_epoch
        ):
            return False
    return True


def find_hanging(
    admin: Admin,
    producers: Mapping[TopicPartition, Sequence[ProducerState]],
    now_ms: int,
    max_transaction_timeout_ms: int,
) -> list[OpenTransaction]:
    """The hanging transactions among ``producers`` (an answer of
    :meth:`Admin.describe_producers`), sorted by partition and producer id.

    The coordinators are asked about the candidates' producer ids, and the
    partitions of those no coordinator will end are described again: a
    transaction that ended between the two looks is not hanging.

    Raises:
        KafkaError: a coordinator or partition-log node could not be asked.
    """
    candidates = [
        OpenTransaction(tp, producer)
        for tp, states in producers.items()
        for producer in states
        if is_candidate(producer, now_ms, max_transaction_timeout_ms)
    ]
    hanging = _not_ended(admin, candidates)
    if hanging:
        again = admin.describe_producers({t.topic_partition for t in hanging})
        still = {(tp, _open_key(p)) for tp, states in again.items() for p in states}
        hanging = [t for t in hanging if (t.topic_partition, _open_key(t.producer)) in still]
    return sorted(hanging, key=lambda t: (t.topic_partition, t.producer.producer_id))


def _open_key(producer: ProducerState) -> tuple[int, int, int]:
    """What names a producer's open transaction on a partition."""
    return (
        producer.producer_id,
        producer.producer_epoch,
        producer.current_transaction_start_offset,
    )


def _not_ended(admin: Admin, candidates: Sequence[OpenTransaction]) -> list[OpenTransaction]:
    """The candidates no coordinator will end (asking the coordinators about
    the candidates' producer ids)."""
    if not candidates:
        return []
    producer_ids = {c.producer.producer_id for c in candidates}
    described: dict[int, list[TransactionDescription]] = {}
    for listing in admin.list_transactions(producer_ids=producer_ids):
        try:
            found = admin.describe_transactions([listing.transactional_id])
        except TransactionalIdNotFoundError:
            continue  # expired since it was listed: it ends nothing
        for d in found.values():
            described.setdefault(d.producer_id, []).append(d)
    return [c for c in candidates if is_hanging(c, described.get(c.producer.producer_id, []))]
