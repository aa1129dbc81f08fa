"""A replica's leader-epoch history: which leader epoch appended from which offset.

Kafka's leader-epoch checkpoint (KIP-101): an ordered list of
``(leader epoch, start offset)`` entries, one per leader epoch that appended
to the log, each the offset of that epoch's first batch. A follower that
comes back asks its leader where the epoch of its last batch ended there
(:meth:`LeaderEpochs.end_offset_for`) and cuts its log at the first offset
the two logs may differ, never by high watermark alone.

The entries are kept in the file ``leader-epoch-checkpoint`` of the
partition's directory (:func:`encode`, :func:`decode`: msgpack, then the
CRC-32C of those bytes); :class:`partition_log.log.PartitionLogStore`
writes it before the first batch of a new epoch reaches the log, and cuts it
with the log.
"""

from __future__ import annotations

import bisect
import itertools
from typing import NamedTuple

import crc32c
import msgpack

#: Kafka's "no epoch" / "no offset" answers (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET).
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1
_VERSION = 1


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class EpochEnd(NamedTuple):
    """Where an epoch ends in a log: the largest epoch at or below the one asked
    for, and the offset after its last record (the next epoch's start, or the
    log end for the latest epoch)."""

    epoch: int
    end_offset: int


UNDEFINED = EpochEnd(UNDEFINED_EPOCH, UNDEFINED_OFFSET)


class CheckpointError(ValueError):
    """The checkpoint's bytes are damaged or not a valid epoch history."""


class LeaderEpochs:
    """The entries, epochs and start offsets both strictly increasing. Not thread-safe."""

    def __init__(self, entries: list[EpochEntry] | None = None) -> None:
        self.entries: list[EpochEntry] = list(entries or [])

    @property
    def latest_epoch(self) -> int:
        """The newest epoch (:data:`UNDEFINED_EPOCH` for an empty history)."""
        return self.entries[-1].epoch if self.entries else UNDEFINED_EPOCH

    def is_new(self, epoch: int) -> bool:
        """Whether a batch of ``epoch`` starts a new entry: its epoch is newer than
        every entry's (a negative epoch, a batch without one, never is)."""
        return epoch >= 0 and epoch > self.latest_epoch

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` appended from ``start_offset`` if the epoch is new,
        forgetting entries that start at or past it (as Kafka's cache does);
        returns whether the entries changed."""
        if not self.is_new(epoch):
            return False
        # Entries at or past the new start appended nothing that is still in the log.
        self.truncate_from_end(start_offset)
        self.entries.append(EpochEntry(epoch, start_offset))
        return True

    def end_offset_for(self, epoch: int, log_end_offset: int) -> EpochEnd:
        """Kafka's OffsetsForLeaderEpoch answer for ``epoch``: the latest epoch
        answers the log end; an older one the largest epoch at or below it with
        the start of the next epoch; one below every entry, or above the latest,
        :data:`UNDEFINED`."""
        if not self.entries or epoch > self.entries[-1].epoch:
            return UNDEFINED
        if epoch == self.entries[-1].epoch:
            return EpochEnd(epoch, log_end_offset)
        epochs = [e.epoch for e in self.entries]
        after = bisect.bisect_right(epochs, epoch)
        if after == 0:
            return UNDEFINED
        return EpochEnd(self.entries[after - 1].epoch, self.entries[after].start_offset)

    def epoch_at(self, offset: int) -> int:
        """The epoch of the entry covering ``offset`` (:data:`UNDEFINED_EPOCH` when none)."""
        starts = [e.start_offset for e in self.entries]
        at = bisect.bisect_right(starts, offset)
        return self.entries[at - 1].epoch if at else UNDEFINED_EPOCH

    def truncate_from_end(self, end_offset: int) -> bool:
        """Forget the entries of epochs that start at or after ``end_offset`` (the
        log was cut there); returns whether any went."""
        keep = len(self.entries)
        while keep and self.entries[keep - 1].start_offset >= end_offset:
            keep -= 1
        changed = keep != len(self.entries)
        del self.entries[keep:]
        return changed

    def truncate_from_start(self, start_offset: int) -> bool:
        """The log now starts at ``start_offset``: drop the entries wholly below
        it and move the one covering it there; returns whether any changed."""
        starts = [e.start_offset for e in self.entries]
        covering = bisect.bisect_right(starts, start_offset) - 1
        if covering < 0 or (covering == 0 and self.entries[0].start_offset == start_offset):
            return False
        epoch = self.entries[covering].epoch
        self.entries[: covering + 1] = [EpochEntry(epoch, start_offset)]
        return True


def encode(epochs: LeaderEpochs) -> bytes:
    """The checkpoint file's bytes."""
    body: bytes = msgpack.packb([_VERSION, [list(e) for e in epochs.entries]])
    return body + crc32c.crc32c(body).to_bytes(4, "little")


def decode(data: bytes) -> LeaderEpochs:
    """The history in a checkpoint file's bytes.

    Raises:
        CheckpointError: damaged bytes (checksum), another version, or entries
            that are not strictly increasing non-negative integers.
    """
    body, tail = data[:-4], data[-4:]
    if len(data) < 4 or crc32c.crc32c(body) != int.from_bytes(tail, "little"):
        raise CheckpointError("checksum mismatch")
    try:
        version, raw = msgpack.unpackb(body)
        entries = [EpochEntry(int(epoch), int(start)) for epoch, start in raw]
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CheckpointError(f"unreadable: {exc}") from None
    if version != _VERSION:
        raise CheckpointError(f"version {version}, expected {_VERSION}")
    for before, after in itertools.pairwise(entries):
        if not (before.epoch < after.epoch and before.start_offset < after.start_offset):
            raise CheckpointError(f"entries out of order: {before} then {after}")
    if any(e.epoch < 0 or e.start_offset < 0 for e in entries):
        raise CheckpointError("a negative epoch or offset")
    return LeaderEpochs(entries)
