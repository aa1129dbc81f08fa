"""Producer and transaction state of one partition (pure: no I/O, no clock).

What Kafka's ProducerStateManager keeps, rebuilt from the log on start:

* per producer id: the epoch, the coordinator epoch of its last marker, the
  last five appended batches (sequence range and offsets) for deduplication,
  and the first offset of its open transaction on this partition;
* the open transactions, whose smallest first offset is the last stable
  offset (LSO);
* the aborted transactions (producer id, first offset, marker offset) that a
  read_committed reader must skip.

Every decision is a pure function of this state and the request, so the same
rules run when a batch is appended and when the log is replayed at start.
The epoch rules follow KIP-890: under transactions v2 a transaction's markers
carry an epoch strictly greater than its data's, so a marker closes the
producer's open transaction only if that transaction's epoch is lower. Under
transactions v1 the markers carry the data's own epoch; each marker also
carries its transaction's number (kept per producer, and in the control
record, so it survives a restart), and a marker of a number already written
is not written again: a late duplicate never closes the next transaction.
"""

from __future__ import annotations

import bisect
import json
import struct
import zlib
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.limits import MAX_SEQUENCE

#: Batches remembered per producer for deduplication (Kafka's constant).
DEDUP_WINDOW = 5


def next_sequence(sequence: int, increment: int = 1) -> int:
    """``sequence + increment`` with Kafka's int32 wrap-around to 0."""
    return (sequence + increment) % (MAX_SEQUENCE + 1)


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """What deduplication needs about one appended batch."""

    first_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    """One producer id's state on this partition."""

    producer_id: int
    epoch: int
    coordinator_epoch: int = -1
    batches: deque[BatchInfo] = field(default_factory=lambda: deque(maxlen=DEDUP_WINDOW))
    #: First offset of the producer's open transaction here, or None.
    txn_first_offset: int | None = None
    #: Largest timestamp of its last appended batch or marker (-1: none).
    last_timestamp_ms: int = -1
    #: Offset of the producer's last batch or marker here (-1: none).
    last_offset: int = -1
    #: The highest transaction number of a marker written here (-1: none known).
    marker_txn: int = -1

    def set_epoch(self, epoch: int) -> None:
        """A new epoch restarts sequences: forget the old epoch's batches."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.batches.clear()


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """An aborted transaction: its records lie in [first_offset, last_offset]
    (``last_offset`` is the ABORT marker's offset)."""

    producer_id: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class ActiveProducer:
    """What DescribeProducers tells about one producer id (Kafka's ProducerState)."""

    producer_id: int
    producer_epoch: int
    #: Sequence of its last appended record; -1 when none is remembered.
    last_sequence: int
    #: Timestamp of its last batch or marker (ms since the epoch); -1 when none.
    last_timestamp_ms: int
    #: Coordinator epoch of its last marker; -1 when it has none.
    coordinator_epoch: int
    #: First offset of its open transaction here; -1 when none is open.
    current_txn_start_offset: int
    #: The highest transaction number of its markers here; -1 when none is known.
    marker_txn: int = -1


class Verdict(Enum):
    """How an append is to be handled when it is not an error."""

    APPEND = "append"
    #: The same batch was appended before: answer with its original offsets.
    DUPLICATE = "duplicate"
    #: The first transactional batch of this (producer id, epoch) here: ask
    #: the coordinator that the partition is in the ongoing transaction first.
    VERIFY = "verify"


@dataclass(frozen=True, slots=True)
class AppendCheck:
    """The answer of :meth:`ProducerStates.check_append`."""

    verdict: Verdict | None
    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    #: For DUPLICATE: the original batch's base offset.
    base_offset: int = -1

    @property
    def ok(self) -> bool:
        return self.error is ErrorCode.NONE


class MarkerAction(Enum):
    """What a transaction marker does on this partition."""

    #: Append the control record (closing the open transaction, if any).
    WRITE = "write"
    #: Already applied (a retried marker of a closed transaction): acknowledge only.
    NOOP = "noop"
    #: A coordinator with a newer epoch has written markers for this producer.
    FENCED = "fenced"


def _fail(error: ErrorCode, message: str) -> AppendCheck:
    return AppendCheck(None, error, message)


class ProducerStates:
    """The producer/transaction state of one partition."""

    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        #: producer id -> first offset of its open transaction.
        self.open_txns: dict[int, int] = {}
        #: Aborted transactions in marker order (so sorted by last_offset).
        self.aborted: list[AbortedTxn] = []
        self._aborted_last: list[int] = []

    # --- appends -------------------------------------------------------------------

    def check_append(
        self,
        producer_id: int,
        epoch: int,
        first_sequence: int,
        record_count: int,
        transactional: bool,
        verified: bool = False,
    ) -> AppendCheck:
        """Decide a producer batch: append, duplicate, verify first, or an error.

        ``verified`` says the coordinator already confirmed that this
        partition is in the producer's ongoing transaction at ``epoch``.
        Batches without a producer id are always appended.
        """
        if producer_id < 0:
            return AppendCheck(Verdict.APPEND)
        last_sequence = next_sequence(first_sequence, record_count - 1)
        entry = self.producers.get(producer_id)
        if entry is None:
            if first_sequence != 0:
                return _fail(
                    ErrorCode.UNKNOWN_PRODUCER_ID,
                    f"producer {producer_id} has no state here; its first batch must have "
                    f"sequence 0, got {first_sequence}",
                )
            return self._transaction_check(None, epoch, transactional, verified)
        if epoch < entry.epoch:
            return _fail(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {producer_id} epoch {epoch} is older than {entry.epoch}",
            )
        if epoch == entry.epoch:
            for batch in entry.batches:
                if (batch.first_sequence, batch.last_sequence) == (first_sequence, last_sequence):
                    return AppendCheck(Verdict.DUPLICATE, base_offset=batch.base_offset)
            # No batch of this epoch here (only its markers: a transaction
            # whose batches were all refused, say as too large, then aborted):
            # nothing to be in sequence with, nor to duplicate, so any
            # sequence starts it, as a producer with no state starts.
            expected = (
                next_sequence(entry.batches[-1].last_sequence) if entry.batches else first_sequence
            )
        else:
            expected = 0
        if first_sequence != expected:
            return _fail(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {producer_id} epoch {epoch}: expected sequence {expected}, "
                f"got {first_sequence}",
            )
        return self._transaction_check(entry, epoch, transactional, verified)

    def _transaction_check(
        self, entry: ProducerEntry | None, epoch: int, transactional: bool, verified: bool
    ) -> AppendCheck:
        open_txn = entry is not None and entry.txn_first_offset is not None
        if not transactional:
            if open_txn:
                return _fail(
                    ErrorCode.INVALID_TXN_STATE,
                    "a non-transactional batch from a producer with an open transaction here",
                )
            return AppendCheck(Verdict.APPEND)
        if open_txn:
            assert entry is not None
            if entry.epoch != epoch:
                # The next transaction (a newer epoch) raced the marker that
                # closes the previous one here. The coordinator adds this
                # partition to the new transaction only once the previous one
                # is complete, that is once its marker is here: ask it.
                if not verified:
                    return AppendCheck(Verdict.VERIFY)
                return _fail(
                    ErrorCode.CONCURRENT_TRANSACTIONS,
                    f"the producer's transaction at epoch {entry.epoch} is still open here "
                    "(its marker has not arrived yet); retry",
                )
            return AppendCheck(Verdict.APPEND)
        return AppendCheck(Verdict.APPEND if verified else Verdict.VERIFY)

    def on_append(
        self,
        producer_id: int,
        epoch: int,
        first_sequence: int,
        base_offset: int,
        last_offset: int,
        transactional: bool,
        *,
        timestamp_ms: int = -1,
    ) -> None:
        """Record an appended producer batch (also used when replaying the log);
        ``timestamp_ms`` is the batch's largest record timestamp."""
        if producer_id < 0:
            return
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(producer_id, epoch)
        entry.set_epoch(epoch)
        entry.last_timestamp_ms = timestamp_ms
        if first_sequence >= 0:
            last_sequence = next_sequence(first_sequence, last_offset - base_offset)
            entry.batches.append(BatchInfo(first_sequence, last_sequence, base_offset, last_offset))
        if transactional and entry.txn_first_offset is None:
            entry.txn_first_offset = base_offset
            self.open_txns[producer_id] = base_offset
        entry.last_offset = last_offset

    # --- markers -------------------------------------------------------------------

    def check_marker(
        self,
        producer_id: int,
        epoch: int,
        coordinator_epoch: int,
        transaction_version: int = 2,
        txn_number: int = -1,
    ) -> MarkerAction:
        """Decide a COMMIT/ABORT marker for ``producer_id`` at marker ``epoch``
        of a transaction that ended under ``transaction_version``, numbered
        ``txn_number`` (-1: unknown)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return MarkerAction.WRITE
        if coordinator_epoch < entry.coordinator_epoch:
            return MarkerAction.FENCED
        if 0 <= txn_number <= entry.marker_txn:
            return MarkerAction.NOOP  # this transaction's marker (or a later one's) is here
        if transaction_version == 1:
            # The data's own epoch: it closes the open transaction of that
            # epoch, and is written even with none open (every participant
            # holds one marker per transaction, as Kafka's do).
            return MarkerAction.WRITE if epoch >= entry.epoch else MarkerAction.NOOP
        if entry.txn_first_offset is not None and entry.epoch < epoch:
            return MarkerAction.WRITE  # closes the open transaction
        if epoch > entry.epoch:
            return MarkerAction.WRITE  # nothing open here, but the epoch moves on
        return MarkerAction.NOOP

    def check_admin_abort(
        self, producer_id: int, epoch: int, coordinator_epoch: int
    ) -> tuple[ErrorCode, str]:
        """Whether an administrator's ABORT marker at marker ``epoch`` may be
        written: only for the producer's open transaction here, whose data
        epoch must be ``epoch - 1``, and not from an older coordinator epoch
        than this partition has seen for the producer. (NONE, "") if so."""
        entry = self.producers.get(producer_id)
        if entry is None or entry.txn_first_offset is None:
            return (
                ErrorCode.INVALID_TXN_STATE,
                f"producer {producer_id} has no open transaction here",
            )
        if coordinator_epoch < entry.coordinator_epoch:
            return (
                ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                f"coordinator epoch {coordinator_epoch} is older than {entry.coordinator_epoch}",
            )
        if entry.epoch != epoch - 1:
            return (
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"the open transaction of producer {producer_id} here is at epoch "
                f"{entry.epoch}, not {epoch - 1}",
            )
        return ErrorCode.NONE, ""

    def on_marker(
        self,
        producer_id: int,
        epoch: int,
        coordinator_epoch: int,
        commit: bool,
        offset: int,
        *,
        timestamp_ms: int = -1,
        txn_number: int = -1,
    ) -> None:
        """Record a marker appended at ``offset`` (also used when replaying the
        log). Every marker written closes the producer's open transaction of
        an epoch not above its own (:meth:`check_marker` wrote none that
        should not)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(producer_id, epoch)
        entry.last_timestamp_ms = timestamp_ms
        entry.marker_txn = max(entry.marker_txn, txn_number)
        first = entry.txn_first_offset
        if first is not None and entry.epoch <= epoch:
            entry.txn_first_offset = None
            del self.open_txns[producer_id]
            if not commit:
                self.aborted.append(AbortedTxn(producer_id, first, offset))
                self._aborted_last.append(offset)
        entry.set_epoch(max(entry.epoch, epoch))
        entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)
        entry.last_offset = offset

    # --- reads ---------------------------------------------------------------------

    def last_stable_offset(self, high_watermark: int) -> int:
        """The first offset of the oldest open transaction, at most the high watermark."""
        return min([high_watermark, *self.open_txns.values()])

    def active_producers(self) -> list[ActiveProducer]:
        """Every producer id this partition keeps state for, by producer id."""
        return [
            ActiveProducer(
                producer_id=e.producer_id,
                producer_epoch=e.epoch,
                last_sequence=e.batches[-1].last_sequence if e.batches else -1,
                last_timestamp_ms=e.last_timestamp_ms,
                coordinator_epoch=e.coordinator_epoch,
                current_txn_start_offset=-1 if e.txn_first_offset is None else e.txn_first_offset,
                marker_txn=e.marker_txn,
            )
            for _, e in sorted(self.producers.items())
        ]

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions with records in [start, end)."""
        i = bisect.bisect_left(self._aborted_last, start)
        return [t for t in self.aborted[i:] if t.first_offset < end]

    # --- retention -----------------------------------------------------------------

    def trim(self, log_start_offset: int) -> None:
        """Forget what lies wholly below ``log_start_offset`` after retention deleted it.

        As Kafka: a producer whose last batch or marker is below the new log
        start and that has no open transaction is removed; the others keep
        their state (their last five batches included, for deduplication).
        Aborted transactions whose marker is below the log start are dropped.
        """
        gone = [
            pid
            for pid, entry in self.producers.items()
            if entry.last_offset < log_start_offset and entry.txn_first_offset is None
        ]
        for pid in gone:
            del self.producers[pid]
        i = bisect.bisect_left(self._aborted_last, log_start_offset)
        del self.aborted[:i]
        del self._aborted_last[:i]

    # --- snapshots -----------------------------------------------------------------

    def snapshot(self) -> dict[str, object]:
        """The whole state as plain data (what :func:`encode_snapshot` stores)."""
        return {
            "producers": [
                [
                    e.producer_id,
                    e.epoch,
                    e.coordinator_epoch,
                    e.txn_first_offset,
                    e.last_offset,
                    e.last_timestamp_ms,
                    [
                        [b.first_sequence, b.last_sequence, b.base_offset, b.last_offset]
                        for b in e.batches
                    ],
                    e.marker_txn,
                ]
                for e in sorted(self.producers.values(), key=lambda e: e.producer_id)
            ],
            "aborted": [[t.producer_id, t.first_offset, t.last_offset] for t in self.aborted],
        }

    @classmethod
    def from_snapshot(cls, data: object) -> ProducerStates:
        """Rebuild the state from :meth:`snapshot`'s data.

        Raises:
            SnapshotError: the data does not have the snapshot's shape.
        """
        states = cls()
        try:
            if not isinstance(data, dict):
                raise TypeError(f"a {type(data).__name__}, not an object")
            for row in data["producers"]:
                # A row of 7 was written before markers carried their number.
                pid, epoch, coord, txn_first, last, timestamp, batches = row[:7]
                entry = ProducerEntry(_int(pid), _int(epoch), _int(coord))
                if len(row) == 8:
                    entry.marker_txn = _int(row[7])
                elif len(row) != 7:
                    raise ValueError(f"a producer row of {len(row)} fields")
                entry.last_offset = _int(last)
                entry.last_timestamp_ms = _int(timestamp)
                for first_seq, last_seq, base, end in batches:
                    entry.batches.append(
                        BatchInfo(_int(first_seq), _int(last_seq), _int(base), _int(end))
                    )
                if txn_first is not None:
                    entry.txn_first_offset = _int(txn_first)
                    states.open_txns[entry.producer_id] = entry.txn_first_offset
                states.producers[entry.producer_id] = entry
            for pid, first, last in data["aborted"]:
                states.aborted.append(AbortedTxn(_int(pid), _int(first), _int(last)))
                states._aborted_last.append(_int(last))
        except (KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"not a producer-state snapshot: {exc!r}") from None
        if states._aborted_last != sorted(states._aborted_last):
            raise SnapshotError("aborted transactions out of order")
        return states


class SnapshotError(ValueError):
    """A producer-state snapshot is damaged (CRC mismatch, bad shape) or of another offset."""


_SNAPSHOT_MAGIC = b"RCPS"
_SNAPSHOT_VERSION = 1
#: magic, version, CRC-32 of the rest, log offset the state is at.
_SNAPSHOT_HEADER = struct.Struct(">4sHIq")


def encode_snapshot(states: ProducerStates, offset: int) -> bytes:
    """The snapshot file's bytes: ``states`` as it is after every batch below ``offset``."""
    payload = json.dumps(states.snapshot(), separators=(",", ":")).encode()
    body = struct.pack(">q", offset) + payload
    return _SNAPSHOT_HEADER.pack(_SNAPSHOT_MAGIC, _SNAPSHOT_VERSION, zlib.crc32(body), offset) + (
        payload
    )


def decode_snapshot(data: bytes) -> tuple[int, ProducerStates]:
    """(offset, state) of a snapshot file's bytes.

    Raises:
        SnapshotError: a short file, another magic or version, a CRC mismatch, or a
            payload that is not a snapshot.
    """
    if len(data) < _SNAPSHOT_HEADER.size:
        raise SnapshotError(f"{len(data)} bytes is shorter than the snapshot header")
    magic, version, crc, offset = _SNAPSHOT_HEADER.unpack_from(data)
    if magic != _SNAPSHOT_MAGIC or version != _SNAPSHOT_VERSION:
        raise SnapshotError(f"unknown snapshot magic {magic!r} or version {version}")
    payload = data[_SNAPSHOT_HEADER.size :]
    if zlib.crc32(struct.pack(">q", offset) + payload) != crc:
        raise SnapshotError("CRC mismatch")
    try:
        parsed = json.loads(payload)
    except ValueError as exc:
        raise SnapshotError(f"payload is not JSON: {exc}") from None
    return offset, ProducerStates.from_snapshot(parsed)


def _int(value: object) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {value!r}")
    return value
