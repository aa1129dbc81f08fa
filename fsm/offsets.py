"""Consumer-group offsets held by a shard, with transactional offset commits.

Offsets committed inside a transaction stay pending, per producer id, until
the transaction's marker reaches this shard: COMMIT makes them the group's
committed offsets, ABORT drops them. While a partition has pending offsets,
a stable OffsetFetch answers UNSTABLE_OFFSET_COMMIT.

Fencing: the shard remembers the highest epoch it has seen per producer id
(from commits and markers); an offset commit with an older epoch is
PRODUCER_FENCED. A marker of transactions v2 closes pending offsets only
when its epoch is greater than theirs, so a late duplicate marker never
closes the next transaction's offsets. A marker of transactions v1 carries
the offsets' own epoch: it closes them unless its transaction number is one
the shard already applied a marker of for the producer (kept per producer
id), which is what a late duplicate's is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fsm.commands import GroupMarker, OffsetCommit, OffsetEntry, TxnOffsetCommit
from fsm.config import FsmConfig
from fsm.effects import Outcome, fail
from fsm.errors import CommandError, ErrorCode
from fsm.metadata import TopicPartition
from fsm.wire import as_int, as_list, as_str

NO_OFFSET = -1


@dataclass(frozen=True)
class CommittedOffset:
    """One partition's committed (or pending) offset."""

    offset: int
    metadata: str
    commit_ms: int


@dataclass(frozen=True)
class PendingOffsets:
    """Offsets one producer's open transaction has committed to this group."""

    producer_epoch: int
    transactional_id: str
    offsets: Mapping[TopicPartition, CommittedOffset]


@dataclass(frozen=True)
class GroupOffsets:
    """A consumer group's offsets. Treated as immutable: handlers build new ones."""

    committed: Mapping[TopicPartition, CommittedOffset] = field(default_factory=dict)
    pending: Mapping[int, PendingOffsets] = field(default_factory=dict)
    producer_epochs: Mapping[int, int] = field(default_factory=dict)
    #: Producer id -> the highest coordinator epoch of a marker applied for it:
    #: a marker from an older coordinator epoch is fenced, as a partition
    #: fences one (TRANSACTION_COORDINATOR_FENCED).
    coordinator_epochs: Mapping[int, int] = field(default_factory=dict)
    #: Producer id -> the highest transaction number of a marker applied for it.
    marker_txns: Mapping[int, int] = field(default_factory=dict)

    def to_wire(self) -> list[Any]:
        return [
            [
                [t, p, o.offset, o.metadata, o.commit_ms]
                for (t, p), o in sorted(self.committed.items())
            ],
            [
                [
                    pid,
                    po.producer_epoch,
                    po.transactional_id,
                    [
                        [t, p, o.offset, o.metadata, o.commit_ms]
                        for (t, p), o in sorted(po.offsets.items())
                    ],
                ]
                for pid, po in sorted(self.pending.items())
            ],
            sorted([pid, epoch] for pid, epoch in self.producer_epochs.items()),
            sorted([pid, epoch] for pid, epoch in self.coordinator_epochs.items()),
            sorted([pid, number] for pid, number in self.marker_txns.items()),
        ]

    @classmethod
    def from_wire(cls, data: Any) -> GroupOffsets:
        """Rebuild from :meth:`to_wire` output.

        Raises:
            CommandError: malformed data.
        """
        fields = as_list(data)
        if len(fields) == 3:  # written before markers' coordinator epochs were kept
            fields = [*fields, []]
        if len(fields) == 4:  # written before markers' transaction numbers were kept
            fields = [*fields, []]
        if len(fields) != 5:
            raise CommandError(f"malformed group offsets: {data!r}")
        committed, pending, epochs, coordinator_epochs, marker_txns = fields
        return cls(
            committed=_offsets_from_wire(committed),
            pending={
                as_int(pid): PendingOffsets(as_int(epoch), as_str(txn_id), _offsets_from_wire(rows))
                for pid, epoch, txn_id, rows in as_list(pending, 4)
            },
            producer_epochs={as_int(pid): as_int(epoch) for pid, epoch in as_list(epochs, 2)},
            coordinator_epochs={
                as_int(pid): as_int(epoch) for pid, epoch in as_list(coordinator_epochs, 2)
            },
            marker_txns={as_int(pid): as_int(n) for pid, n in as_list(marker_txns, 2)},
        )


def _offsets_from_wire(rows: Any) -> dict[TopicPartition, CommittedOffset]:
    return {
        TopicPartition(as_str(t), as_int(p)): CommittedOffset(as_int(o), as_str(m), as_int(ms))
        for t, p, o, m, ms in as_list(rows, 5)
    }


def _validate(group_id: str, offsets: tuple[OffsetEntry, ...], config: FsmConfig) -> str | None:
    if not group_id:
        return "group id must not be empty"
    return validate_offsets(offsets, config)


def validate_offsets(offsets: tuple[OffsetEntry, ...], config: FsmConfig) -> str | None:
    """Why an offset list is malformed, or None."""
    if not offsets:
        return "no offsets given"
    if len(offsets) > config.max_partitions_per_request:
        return f"{len(offsets)} offsets exceed the limit of {config.max_partitions_per_request}"
    for entry in offsets:
        if not entry.topic or entry.partition < 0 or entry.offset < 0:
            return f"invalid offset {entry.topic!r}-{entry.partition}@{entry.offset}"
    return None


def _as_map(offsets: Iterable[OffsetEntry], now_ms: int) -> dict[TopicPartition, CommittedOffset]:
    return {
        TopicPartition(e.topic, e.partition): CommittedOffset(e.offset, e.metadata, now_ms)
        for e in offsets
    }


def txn_offset_commit(
    group: GroupOffsets | None, cmd: TxnOffsetCommit, config: FsmConfig
) -> tuple[GroupOffsets | None, Outcome]:
    """Record offsets as pending for the producer's transaction."""
    problem = _validate(cmd.group_id, cmd.offsets, config)
    if problem is None and not cmd.transactional_id:
        problem = "transactional.id must not be empty"
    if problem is None and (cmd.producer_id < 0 or cmd.producer_epoch < 0):
        problem = "a transactional offset commit needs a producer id and epoch"
    if problem is not None:
        return group, fail(ErrorCode.INVALID_REQUEST, problem)
    current = group or GroupOffsets()
    if cmd.producer_epoch < current.producer_epochs.get(cmd.producer_id, -1):
        return group, fail(ErrorCode.PRODUCER_FENCED, "a newer epoch of this producer was seen")
    before = current.pending.get(cmd.producer_id)
    merged = _as_map(cmd.offsets, cmd.now_ms)
    if before is not None and before.producer_epoch == cmd.producer_epoch:
        merged = {**before.offsets, **merged}
    # Offsets pending under an older epoch belong to a transaction that ended
    # without this group as a participant; no marker will come for them.
    pending = {
        **current.pending,
        cmd.producer_id: PendingOffsets(cmd.producer_epoch, cmd.transactional_id, merged),
    }
    epochs = {**current.producer_epochs, cmd.producer_id: cmd.producer_epoch}
    return replace(current, pending=pending, producer_epochs=epochs), Outcome()


def group_marker(
    group: GroupOffsets | None, cmd: GroupMarker
) -> tuple[GroupOffsets | None, Outcome]:
    """Apply a COMMIT/ABORT marker to the producer's pending offsets."""
    if not cmd.group_id or cmd.producer_id < 0 or cmd.producer_epoch < 0:
        return group, fail(
            ErrorCode.INVALID_REQUEST, "a marker needs a group id, producer id and epoch"
        )
    current = group or GroupOffsets()
    fenced_below = current.coordinator_epochs.get(cmd.producer_id, -1)
    if cmd.coordinator_epoch < fenced_below:
        return group, fail(
            ErrorCode.TRANSACTION_COORDINATOR_FENCED,
            f"coordinator epoch {cmd.coordinator_epoch} is older than {fenced_below}",
        )
    seen = current.producer_epochs.get(cmd.producer_id, -1)
    pending = current.pending.get(cmd.producer_id)
    applied = current.marker_txns.get(cmd.producer_id, -1)
    if 0 <= cmd.txn_number <= applied:
        return group, Outcome()  # this transaction's marker (or a later one's) was applied
    if cmd.transaction_version == 1:  # the marker carries the offsets' own epoch
        closes = pending is not None and pending.producer_epoch <= cmd.producer_epoch
    else:
        closes = pending is not None and pending.producer_epoch < cmd.producer_epoch
    if not closes and seen >= cmd.producer_epoch:
        return group, Outcome()  # a duplicate or stale marker: nothing to do
    committed = dict(current.committed)
    remaining = dict(current.pending)
    if closes and pending is not None:
        del remaining[cmd.producer_id]
        if cmd.commit:
            committed.update(pending.offsets)
    epochs = {**current.producer_epochs, cmd.producer_id: max(seen, cmd.producer_epoch)}
    coordinator_epochs = {**current.coordinator_epochs, cmd.producer_id: cmd.coordinator_epoch}
    marker_txns = {**current.marker_txns, cmd.producer_id: max(applied, cmd.txn_number)}
    return (
        GroupOffsets(committed, remaining, epochs, coordinator_epochs, marker_txns),
        Outcome(),
    )


def offset_commit(
    group: GroupOffsets | None, cmd: OffsetCommit, config: FsmConfig
) -> tuple[GroupOffsets | None, Outcome]:
    """A plain consumer commit: the offsets are committed at once."""
    problem = _validate(cmd.group_id, cmd.offsets, config)
    if problem is not None:
        return group, fail(ErrorCode.INVALID_REQUEST, problem)
    current = group or GroupOffsets()
    committed = {**current.committed, **_as_map(cmd.offsets, cmd.now_ms)}
    return replace(current, committed=committed), Outcome()


@dataclass(frozen=True)
class FetchedOffset:
    """OffsetFetch's answer for one partition (offset -1 when none is committed)."""

    topic: str
    partition: int
    offset: int
    metadata: str
    error: ErrorCode


def offset_fetch(
    group: GroupOffsets | None,
    partitions: Iterable[TopicPartition] | None,
    require_stable: bool,
) -> list[FetchedOffset]:
    """Committed offsets of ``partitions`` (all the group knows when None).

    With ``require_stable`` a partition with pending transactional offsets
    answers UNSTABLE_OFFSET_COMMIT (the caller retries), as Kafka does.
    """
    current = group or GroupOffsets()
    unstable = {tp for po in current.pending.values() for tp in po.offsets}
    wanted = sorted(current.committed) if partitions is None else list(partitions)
    answers = []
    for topic, partition in wanted:
        if require_stable and (topic, partition) in unstable:
            answers.append(
                FetchedOffset(topic, partition, NO_OFFSET, "", ErrorCode.UNSTABLE_OFFSET_COMMIT)
            )
            continue
        found = current.committed.get(TopicPartition(topic, partition))
        answers.append(
            FetchedOffset(
                topic,
                partition,
                NO_OFFSET if found is None else found.offset,
                "" if found is None else found.metadata,
                ErrorCode.NONE,
            )
        )
    return answers
