"""One topic-partition's append-only log: segment files, a sparse offset index, recovery.

Layout of a partition directory (docs/partition-log.md has the details)::

    00000000000000000000.log     batches (Kafka RecordBatch v2), back to back
    00000000000000000000.index   sparse index: (relative offset u32, position u32) pairs
    00000000000000004711.log     the next segment, starting at offset 4711
    00000000000000004711.index
    00000000000000004711.snapshot  producer state as of offset 4711 (written by the owner)
    offset-gaps                  ranges of offsets never handed out (``skip_to``), if any
    offsets-unsettled            present while the log may lack records whose offsets
                                 were handed out (its owner removes it once settled)
    leader-epoch-checkpoint      the leader epochs that appended and where each started
                                 (:mod:`partition_log.epochs`)

The newest segment is the *active* one; appends go to it through an
``O_APPEND`` file descriptor with ``os.write`` (no userspace buffer), so once
:meth:`PartitionLogStore.append` returns, the batch is in the kernel's page
cache and survives the death of the process. The :class:`FsyncPolicy` decides
when it reaches the disk, i.e. what a machine crash can lose.

One file on purpose (about 1,300 lines): :class:`PartitionLogStore` owns the
segment files, their index and their recovery; append, read, roll,
retention and recovery all keep the same on-disk invariants.
"""

from __future__ import annotations

import bisect
import enum
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol

import crc32c
import msgpack

from partition_log import epochs
from partition_log.codec import (
    HEADER_SIZE,
    BatchHeader,
    CorruptBatch,
    crc_ok,
    crc_ok_to_end,
    parse_header,
    set_base_offset,
)
from partition_log.epochs import LeaderEpochs

__all__ = [
    "SNAPSHOTS_KEPT",
    "CorruptLog",
    "Flushable",
    "FsyncPolicy",
    "LogFlusher",
    "OffsetOutOfRange",
    "PartitionLogStore",
    "RecoveryReport",
    "StoreFailed",
    "SyncTicket",
    "fsync_directory",
]

logger = logging.getLogger(__name__)

#: Called with the failed file's description and the error when an fsync
#: fails, before the error is raised; the node process sets it to stop (a
#: failed fsync is never retried: the kernel may have dropped the dirty
#: pages, so a later one that succeeds proves nothing). None: raise.
fsync_failure_handler: Callable[[str, OSError], None] | None = None


#: Called with the seconds each successful fsync took (the node's metrics).
fsync_observer: Callable[[float], None] | None = None


def _fsync(fd: int, what: Path | str) -> None:
    started = time.perf_counter()
    try:
        os.fsync(fd)
    except OSError as exc:
        if fsync_failure_handler is not None:
            fsync_failure_handler(str(what), exc)
        raise
    if fsync_observer is not None:
        fsync_observer(time.perf_counter() - started)


_INDEX_ENTRY = struct.Struct(">II")
_MAX_RELATIVE_OFFSET = 0xFFFFFFFF
_MAX_SEGMENT_BYTES = 2**31 - 1
_READAHEAD = 64 << 10
_RECOVERY_READAHEAD = 1 << 20
_NAME_DIGITS = 20
_SNAPSHOT_SUFFIX = ".snapshot"
#: msgpack [[from, to], ...] of the offsets :meth:`PartitionLogStore.skip_to`
#: skipped, then the CRC32C of those bytes (u32, little-endian).
_GAPS_FILE = "offset-gaps"
#: Present while the partition may have lost records whose offsets were handed
#: out, until its owner has continued above them (:meth:`PartitionLogStore.settle`).
_UNSETTLED_FILE = "offsets-unsettled"
#: The leader-epoch checkpoint (:func:`partition_log.epochs.encode`).
_EPOCHS_FILE = "leader-epoch-checkpoint"
#: Producer-state snapshots kept: the newest ones, older ones are deleted.
SNAPSHOTS_KEPT = 2


class FsyncPolicy(enum.Enum):
    """When appended batches are fsynced (``log.flush.policy``)."""

    ALWAYS = "always"
    """Every append is fsynced before it counts as stored: in :meth:`PartitionLogStore.append`,
    or by a later fsync several appends share (:meth:`PartitionLogStore.begin_sync`)."""
    INTERVAL = "interval"
    """Appends return after write(); :meth:`PartitionLogStore.flush` runs periodically."""
    NEVER = "never"
    """The operating system writes the page cache back when it chooses."""


class CorruptLog(RuntimeError):
    """The log is damaged where recovery may not repair it.

    Raised when a closed segment (fsynced when it rolled, so trusted) fails to
    parse, when segments are not contiguous, or when a batch of the active
    segment is damaged where no torn write explains it. Cutting such a log
    would drop acknowledged batches, so the store refuses to open instead.
    """


class OffsetOutOfRange(ValueError):
    """A read started below the log start offset or above the log end offset."""


class StoreFailed(RuntimeError):
    """An earlier write or fsync failed; the store must be closed and reopened."""


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What opening the log found and did."""

    segments: int
    """Segments in the log after recovery."""
    batches_scanned: int
    """Batches whose header was read (every batch of the active segment, CRC checked)."""
    bytes_truncated: int
    """Bytes cut from the end of the active segment (torn or corrupt tail)."""
    indexes_rebuilt: int
    """Index files rewritten because they were missing, damaged or stale."""
    seconds: float
    """Wall time recovery took."""
    created: bool = False
    """The directory did not exist: the log is new (or was lost with it)."""


@dataclass(slots=True)
class _Segment:
    base_offset: int
    log_fd: int
    size: int
    next_offset: int
    index_offsets: list[int]  # absolute offsets, increasing (for bisect)
    index_positions: list[int]
    index_fd: int | None  # open for appends only while the segment is active
    max_timestamp: int | None = None  # of a closed segment, read when retention first asks
    # Every batch in it passed its CRC in this process: created here (appends
    # are checked before), or the active segment recovery scanned with CRCs.
    verified: bool = False

    @property
    def last_indexed_position(self) -> int:
        return self.index_positions[-1] if self.index_positions else 0


@dataclass(frozen=True, slots=True)
class SyncTicket:
    """An fsync of a store's active segment up to :attr:`end_offset`, begun
    under the store owner's lock (:meth:`PartitionLogStore.begin_sync`) and
    run without it."""

    fd: int
    """A duplicate of the segment's file descriptor, closed by :meth:`run`."""
    end_offset: int
    cuts: int
    directory: Path

    def run(self) -> OSError | None:
        """Fsync (with the failure handler's fail-stop, :func:`_fsync`) and
        close the descriptor; returns the error of a failed fsync."""
        try:
            _fsync(self.fd, self.directory)
        except OSError as err:
            return err
        finally:
            os.close(self.fd)
        return None


@dataclass(slots=True)
class _Scan:
    end: int  # position after the last good batch
    next_offset: int
    batches: int
    index_offsets: list[int]
    index_positions: list[int]
    problem: str | None  # why the scan stopped before ``file_size``
    # It stopped at a batch whose bytes run past the end of the file (or at
    # fewer bytes than a header): a write that never completed.
    incomplete: bool = False


class _SegmentReader:
    """Positional reads of one segment file through a read-ahead buffer."""

    __slots__ = ("_buf", "_fd", "_readahead", "_start")

    def __init__(self, fd: int, readahead: int) -> None:
        self._fd = fd
        self._readahead = readahead
        self._buf = b""
        self._start = 0

    def window(self, pos: int, n: int) -> tuple[bytes, int]:
        """A buffer holding file bytes ``[pos, pos + n)`` (fewer at end of file), and where
        ``pos`` is in it."""
        rel = pos - self._start
        if rel >= 0 and rel + n <= len(self._buf):
            return self._buf, rel
        self._buf = _pread_full(self._fd, max(n, self._readahead), pos)
        self._start = pos
        return self._buf, 0


class PartitionLogStore:
    """The segments of one partition in one directory.

    Opening the store recovers it (see :attr:`recovered`). Offsets are dense:
    each appended batch gets ``log_end_offset`` as its base offset.

    Not thread-safe: the caller serialises every call (appends, reads, flushes,
    iteration of :meth:`batches`) with its own lock.
    """

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int = 64 << 20,
        index_interval_bytes: int = 4096,
        fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
    ) -> None:
        """Open the log in ``directory`` (created if missing) and recover it.

        Raises:
            ValueError: ``segment_bytes`` outside [61, 2**31 - 1] or a negative
                ``index_interval_bytes``.
            CorruptLog: a closed segment is damaged or segments have gaps.
            OSError: the directory or its files cannot be used.
        """
        if not HEADER_SIZE <= segment_bytes <= _MAX_SEGMENT_BYTES:
            raise ValueError(f"segment_bytes must be in [{HEADER_SIZE}, {_MAX_SEGMENT_BYTES}]")
        if index_interval_bytes < 0:
            raise ValueError("index_interval_bytes must not be negative")
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.index_interval_bytes = index_interval_bytes
        self.fsync = fsync
        self.headers_scanned = 0
        """Batch headers parsed so far (recovery, reads, :meth:`batches`); for tests and
        diagnostics."""
        self.epochs = LeaderEpochs()
        """The leader epochs that appended to the log and where each started: read
        from the checkpoint and checked against the log by recovery, kept by
        :meth:`append`, :meth:`truncate_to` and retention."""
        self._segments: list[_Segment] = []
        self._bases: list[int] = []
        #: Whether recovery read a checkpoint of the leader epochs (then a
        #: header naming a newer epoch is damage).
        self._epochs_read = False
        #: Where :meth:`verify_next` goes on: (segment base offset, offset).
        self._verify_from: tuple[int, int] | None = None
        #: The log end as of the last fsync of the active segment: every
        #: batch below it is on disk (closed segments were fsynced at roll).
        self._synced_end = 0
        #: Moves when the log is cut: a sync begun before then covers bytes
        #: that may no longer be in the log (:meth:`finish_sync`).
        self._cuts = 0
        self._index_dirty = False
        self._failure: BaseException | None = None
        self._closed = False
        try:
            self.recovered = self._recover()
        except BaseException:
            self._close_fds()
            raise
        self._synced_end = self.log_end_offset

    # -- properties ---------------------------------------------------------------------------

    @property
    def latest_leader_epoch(self) -> int:
        """The leader epoch of the log's newest epoch (0 for a log without any)."""
        return max(self.epochs.latest_epoch, 0)

    @property
    def log_start_offset(self) -> int:
        """Base offset of the first segment."""
        return self._segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended record gets (the log end offset, LEO)."""
        return self._segments[-1].next_offset

    @property
    def active_base_offset(self) -> int:
        """Base offset of the active (newest) segment; it changes when the log rolls."""
        return self._segments[-1].base_offset

    @property
    def dirty(self) -> bool:
        """Whether log bytes were written since the last fsync of the active segment."""
        return self._synced_end < self.log_end_offset

    @property
    def synced_end_offset(self) -> int:
        """The offset below which every batch is on disk (fsynced); the log end
        when nothing was written since the last fsync."""
        return self._synced_end

    @property
    def segment_base_offsets(self) -> tuple[int, ...]:
        """Base offsets of the segments, oldest first."""
        return tuple(self._bases)

    # -- writing ------------------------------------------------------------------------------

    def append(self, batch: bytearray, sync: bool = True) -> int:
        """Append one batch, stamping ``log_end_offset`` into it as its base offset.

        Rolls to a new segment first when the active one is not empty and the
        batch would take it past ``segment_bytes``. Under
        :attr:`FsyncPolicy.ALWAYS` the segment is fsynced before returning,
        unless ``sync`` is False: then the caller calls :meth:`sync` (or
        :meth:`begin_sync`) before it counts the batch as stored (several
        appends, one fsync); under every policy the batch is in the page
        cache once this returns.

        Returns:
            The batch's base offset.

        Raises:
            CorruptBatch: ``batch`` has no valid v2 header.
            ValueError: ``len(batch)`` differs from the size its header declares.
            StoreFailed: an earlier write or fsync failed.
            OSError: writing failed (nothing was appended) or fsync failed (the
                store is failed from then on).
        """
        self._check_usable()
        header = parse_header(batch)
        if header.size != len(batch):
            raise ValueError(f"batch declares {header.size} bytes but has {len(batch)}")
        base_offset = self.log_end_offset
        active = self._segments[-1]
        too_big = active.size + len(batch) > self.segment_bytes
        last_relative = base_offset + header.last_offset_delta - active.base_offset
        if active.size > 0 and (too_big or last_relative > _MAX_RELATIVE_OFFSET):
            self._roll()
            active = self._segments[-1]
        if self.epochs.is_new(header.partition_leader_epoch):
            # The checkpoint first: a log never holds an epoch it does not name.
            newer = LeaderEpochs(self.epochs.entries)
            newer.assign(header.partition_leader_epoch, base_offset)
            self._write_epochs(newer)
        set_base_offset(batch, base_offset)
        position = active.size
        self._write_log(active, batch)
        active.size += len(batch)
        active.next_offset = base_offset + header.last_offset_delta + 1
        try:
            if position - active.last_indexed_position >= self.index_interval_bytes:
                self._add_index_entry(active, base_offset, position)
            if self.fsync is FsyncPolicy.ALWAYS and sync:
                _fsync(active.log_fd, self.directory)
                self._synced_end = self.log_end_offset
        except OSError as err:
            self._failure = err
            raise
        return base_offset

    def sync(self) -> None:
        """Fsync the active segment's log if anything was written since its
        last fsync: what :attr:`FsyncPolicy.ALWAYS` does after each append
        (the active index is rebuilt from the log at recovery).

        Raises:
            StoreFailed: an earlier write or fsync failed.
            OSError: fsync failed (the store is failed from then on).
        """
        self._check_usable()
        if not self.dirty:
            return
        try:
            _fsync(self._segments[-1].log_fd, self.directory)
        except OSError as err:
            self._failure = err
            raise
        self._synced_end = self.log_end_offset

    def begin_sync(self) -> SyncTicket | None:
        """Start an fsync of what the active segment holds now, to be run
        without the owner's lock (:meth:`SyncTicket.run`, then
        :meth:`finish_sync` under the lock again): appends may go on
        meanwhile. None when nothing was written since the last fsync.

        Raises:
            StoreFailed: an earlier write or fsync failed.
            OSError: the segment's file could not be duplicated.
        """
        self._check_usable()
        if not self.dirty:
            return None
        # A file descriptor of its own: a roll, cut or close may close the
        # segment's while the fsync runs (the file stays the same).
        fd = os.dup(self._segments[-1].log_fd)
        return SyncTicket(fd, self.log_end_offset, self._cuts, self.directory)

    def finish_sync(self, ticket: SyncTicket, error: OSError | None) -> None:
        """Record the outcome of ``ticket``'s fsync (the owner's lock held):
        everything below its offset is on disk, unless the log was cut since
        (the offsets may hold other batches now); a failed fsync fails the
        store, as one in :meth:`append` does."""
        if error is not None:
            self._failure = error
        elif ticket.cuts == self._cuts and not self._closed:
            self._synced_end = max(self._synced_end, ticket.end_offset)

    def flush(self) -> None:
        """Fsync the active segment (and its index) if anything was written since the last
        flush.

        Raises:
            StoreFailed: an earlier write or fsync failed.
            OSError: fsync failed (the store is failed from then on).
        """
        self._check_usable()
        active = self._segments[-1]
        try:
            if self.dirty:
                _fsync(active.log_fd, self.directory)
                self._synced_end = self.log_end_offset
            if self._index_dirty and active.index_fd is not None:
                _fsync(active.index_fd, self.directory)
                self._index_dirty = False
        except OSError as err:
            self._failure = err
            raise

    def close(self) -> None:
        """Fsync the active segment and index (under every policy) and close the files.

        Closing twice is harmless. After a failure the files are closed without syncing.
        """
        if self._closed:
            return
        try:
            if self._failure is None and self._segments:
                active = self._segments[-1]
                _fsync(active.log_fd, self.directory)
                if active.index_fd is not None:
                    _fsync(active.index_fd, self.directory)
                self._synced_end = self.log_end_offset
                self._index_dirty = False
        finally:
            self._closed = True
            self._close_fds()

    def __enter__(self) -> PartitionLogStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- retention ----------------------------------------------------------------------------

    def apply_retention(
        self, now_ms: int, retention_ms: int, retention_bytes: int, below_offset: int
    ) -> int:
        """Delete the oldest segments that retention no longer keeps, whole, as Kafka does.

        A segment goes when its largest record timestamp is more than
        ``retention_ms`` before ``now_ms`` (a segment without timestamps uses its
        file's modification time), or when the log without it is still at least
        ``retention_bytes`` long; -1 disables either rule. Deletion goes from the
        oldest segment and stops at the first one that stays, at the active
        segment, and at the first segment that does not end at or below
        ``below_offset`` (the caller passes the last stable offset, so no open
        transaction loses records). Snapshots below the new log start offset are
        deleted with them. The log start offset is the first remaining segment's
        base offset, so the file names carry it across restarts.

        Returns:
            How many segments were deleted.

        Raises:
            StoreFailed: an earlier write or fsync failed.
            OSError: a segment could not be deleted (the ones before it were).
        """
        self._check_usable()
        size = sum(segment.size for segment in self._segments)
        count = 0
        for segment in self._segments[:-1]:
            if segment.next_offset > below_offset:
                break
            expired = retention_ms >= 0 and now_ms - self._max_timestamp(segment) > retention_ms
            too_big = retention_bytes >= 0 and size - segment.size >= retention_bytes
            if not (expired or too_big):
                break
            size -= segment.size
            count += 1
        try:
            for _ in range(count):
                self._delete_oldest_segment()
        finally:
            if count:
                fsync_directory(self.directory)
                for offset in self.snapshot_offsets():
                    if offset < self.log_start_offset:
                        self.delete_snapshot(offset)
                kept = LeaderEpochs(self.epochs.entries)
                if kept.truncate_from_start(self.log_start_offset):
                    self._write_epochs(kept)
        return count

    def _max_timestamp(self, segment: _Segment) -> int:
        if segment.max_timestamp is None:
            reader = _SegmentReader(segment.log_fd, _RECOVERY_READAHEAD)
            largest = -1
            for _, header in self._headers_from(segment, reader, segment.base_offset):
                largest = max(largest, header.max_timestamp)
            if largest < 0:
                largest = int(os.fstat(segment.log_fd).st_mtime * 1000)
            segment.max_timestamp = largest
        return segment.max_timestamp

    def _delete_oldest_segment(self) -> None:
        segment = self._segments[0]
        # The log file first: a crash after it leaves an index without a log, which
        # recovery removes; the other way round it would rebuild the index.
        self._log_path(segment.base_offset).unlink()
        self._segments.pop(0)
        self._bases.pop(0)
        os.close(segment.log_fd)
        self._index_path(segment.base_offset).unlink(missing_ok=True)

    # -- producer-state snapshots -------------------------------------------------------------

    def snapshot_offsets(self) -> list[int]:
        """Offsets of the snapshot files in the directory, oldest first."""
        return sorted(
            int(path.name[: -len(_SNAPSHOT_SUFFIX)])
            for path in self.directory.glob("*" + _SNAPSHOT_SUFFIX)
            if len(path.name) == _NAME_DIGITS + len(_SNAPSHOT_SUFFIX)
            and path.name[:_NAME_DIGITS].isdigit()
        )

    def read_snapshot(self, offset: int) -> bytes:
        """The bytes of the snapshot file at ``offset``.

        Raises:
            OSError: it cannot be read (FileNotFoundError: there is none).
        """
        return self._snapshot_path(offset).read_bytes()

    def write_snapshot(self, offset: int, data: bytes) -> None:
        """Store ``data`` as the snapshot at ``offset`` atomically (temporary file, fsync,
        rename, directory fsync), then delete all but the newest :data:`SNAPSHOTS_KEPT`.

        Raises:
            ValueError: ``offset`` is outside [log start offset, log end offset].
            OSError: it could not be written (an older snapshot is still there).
        """
        if not self.log_start_offset <= offset <= self.log_end_offset:
            raise ValueError(f"snapshot offset {offset} is outside the log")
        path = self._snapshot_path(offset)
        _write_atomically(path, data)
        for old in self.snapshot_offsets()[:-SNAPSHOTS_KEPT]:
            self._snapshot_path(old).unlink(missing_ok=True)

    def delete_snapshot(self, offset: int) -> None:
        """Remove the snapshot file at ``offset`` (if any)."""
        self._snapshot_path(offset).unlink(missing_ok=True)

    def _snapshot_path(self, offset: int) -> Path:
        return self.directory / f"{offset:0{_NAME_DIGITS}d}{_SNAPSHOT_SUFFIX}"

    # -- reading ------------------------------------------------------------------------------

    def read(
        self, from_offset: int, max_bytes: int, upto_offset: int, verify: bool = False
    ) -> list[bytes]:
        """Whole batches in offset order, starting with the one that contains ``from_offset``.

        Only batches that end at or below ``upto_offset`` (``next_offset <=
        upto_offset``) are returned. ``max_bytes`` is a soft limit as in Kafka:
        the first qualifying batch is returned whatever its size, later ones only
        while the total stays within ``max_bytes``.

        The segment is found by bisection on base offsets, the start position by
        the sparse offset index; the scan forward from there reads headers only
        until it reaches ``from_offset``. With ``verify``, each batch of a
        segment opened without checking its batches (a closed one) is checked
        against its CRC-32C. The batches before one that fails a check are
        returned; a read that starts at it raises.

        Raises:
            OffsetOutOfRange: ``from_offset`` is below :attr:`log_start_offset`
                or above :attr:`log_end_offset`.
            StoreFailed: an earlier write or fsync failed.
            CorruptLog: the index or a batch header does not match the log, or
                (``verify``) the first batch fails its CRC.
        """
        self._check_usable()
        if not self.log_start_offset <= from_offset <= self.log_end_offset:
            raise OffsetOutOfRange(
                f"offset {from_offset} outside [{self.log_start_offset}, {self.log_end_offset}]"
            )
        upto = min(upto_offset, self.log_end_offset)
        out: list[bytes] = []
        if from_offset >= upto:
            return out
        total = 0
        first = bisect.bisect_right(self._bases, from_offset) - 1
        try:
            for segment in self._segments[first:]:
                reader = _SegmentReader(segment.log_fd, _READAHEAD)
                for pos, header in self._headers_from(segment, reader, from_offset):
                    if header.next_offset > upto:
                        return out
                    if out and total + header.size > max_bytes:
                        return out
                    buf, rel = reader.window(pos, header.size)
                    batch = buf[rel : rel + header.size]
                    if verify and not segment.verified and not crc_ok(batch):
                        raise CorruptLog(
                            f"{self._log_path(segment.base_offset)}: the batch at position "
                            f"{pos} (offset {header.base_offset}) fails its CRC"
                        )
                    out.append(batch)
                    total += header.size
                    if total >= max_bytes:
                        return out
        except CorruptLog:
            if out:  # the batches before the damage
                return out
            raise
        return out

    def batches(self, from_offset: int = 0) -> Iterator[tuple[BatchHeader, bytes | None]]:
        """Every batch from the one containing ``from_offset`` to the end of the log, in order.

        Data batches come as ``(header, None)``, control batches as
        ``(header, batch_bytes)`` so the caller can read the marker
        (:func:`partition_log.codec.control_is_commit`). Used to rebuild
        producer and transaction state (at start-up without a usable
        snapshot, and after a truncation): the CRC-32C of each batch of a
        segment recovery opened without checking them (the closed ones) is
        checked first, since a flipped bit in a header's producer fields or
        a marker's type would change a transaction's outcome. Offsets below
        :attr:`log_start_offset` start at the first batch.

        Raises:
            StoreFailed: an earlier write or fsync failed.
            CorruptLog: the index or a batch header does not match the log,
                or a batch fails its CRC.
        """
        self._check_usable()
        from_offset = max(from_offset, self.log_start_offset)
        i = max(bisect.bisect_right(self._bases, from_offset) - 1, 0)
        while i < len(self._segments):
            segment = self._segments[i]
            reader = _SegmentReader(segment.log_fd, _READAHEAD)
            for pos, header in self._headers_from(segment, reader, from_offset):
                body: bytes | None = None
                if header.is_control or not segment.verified:
                    buf, rel = reader.window(pos, header.size)
                    batch = buf[rel : rel + header.size]
                    if not segment.verified and not crc_ok(batch):
                        raise CorruptLog(
                            f"{self._log_path(segment.base_offset)}: the batch at position "
                            f"{pos} (offset {header.base_offset}) fails its CRC"
                        )
                    body = batch if header.is_control else None
                yield header, body
            i += 1

    def verify_next(self, max_bytes: int) -> bool:
        """Check the CRC-32C of about ``max_bytes`` more batches of the oldest
        segment opened without checking them (a closed one), from where the
        last call stopped, and each batch to follow the one before; a
        segment all of whose batches passed counts as checked (reads and
        :meth:`batches` then check it no more). Returns False when every
        segment is checked.

        Raises:
            StoreFailed: an earlier write or fsync failed.
            CorruptLog: a batch fails its CRC or does not follow the one before.
        """
        self._check_usable()
        segment = next((s for s in self._segments if not s.verified), None)
        if segment is None:
            return False
        base, offset = self._verify_from or (segment.base_offset, segment.base_offset)
        if base != segment.base_offset:
            offset = segment.base_offset
        reader = _SegmentReader(segment.log_fd, _READAHEAD)
        checked = 0
        for pos, header in self._headers_from(segment, reader, offset):
            if checked >= max_bytes:
                self._verify_from = (segment.base_offset, header.base_offset)
                return True
            buf, rel = reader.window(pos, header.size)
            if not crc_ok(buf[rel : rel + header.size]):
                raise CorruptLog(
                    f"{self._log_path(segment.base_offset)}: the batch at position {pos} "
                    f"(offset {header.base_offset}) fails its CRC"
                )
            checked += header.size
        segment.verified = True
        self._verify_from = None
        return True

    def _headers_from(
        self, segment: _Segment, reader: _SegmentReader, from_offset: int
    ) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of each batch of ``segment`` that ends past ``from_offset``,
        starting the scan at the closest index entry at or below ``from_offset``."""
        entry = bisect.bisect_right(segment.index_offsets, from_offset) - 1
        pos = segment.index_positions[entry] if entry >= 0 else 0
        expected = segment.index_offsets[entry] if entry >= 0 else segment.base_offset
        says = "the index says" if entry >= 0 else "the segment starts at"
        while pos < segment.size:
            header = self._header_at(reader, pos)
            # A segment's batches follow each other (recovery holds the active
            # one to it): a length or offset field that was damaged since
            # would otherwise skip batches without a word.
            if header.base_offset != expected:
                raise CorruptLog(
                    f"segment {segment.base_offset}: batch at position {pos} has base "
                    f"offset {header.base_offset}, {says} {expected}"
                )
            if pos + header.size > segment.size:
                raise CorruptLog(
                    f"segment {segment.base_offset}: the batch at position {pos} declares "
                    f"{header.size} bytes, past the segment's end ({segment.size})"
                )
            if header.next_offset > from_offset:
                yield pos, header
            expected, says = header.next_offset, "the previous batch ends at"
            pos += header.size

    def _header_at(self, reader: _SegmentReader, pos: int) -> BatchHeader:
        buf, rel = reader.window(pos, HEADER_SIZE)
        try:
            header = parse_header(buf, rel)
        except CorruptBatch as err:
            raise CorruptLog(f"unreadable batch header at position {pos}: {err}") from err
        self.headers_scanned += 1
        return header

    # -- segments and index -------------------------------------------------------------------

    def _log_path(self, base_offset: int) -> Path:
        return self.directory / f"{base_offset:0{_NAME_DIGITS}d}.log"

    def _index_path(self, base_offset: int) -> Path:
        return self.directory / f"{base_offset:0{_NAME_DIGITS}d}.index"

    def _write_log(self, segment: _Segment, batch: bytearray) -> None:
        written = 0
        try:
            with memoryview(batch) as view:
                while written < len(batch):
                    n = os.write(segment.log_fd, view[written:])
                    if n <= 0:
                        raise OSError(f"write to segment {segment.base_offset} made no progress")
                    written += n
        except OSError:
            if written:
                # A partial batch would be cut by recovery, but later appends would land
                # after it; take it back now or stop using the store.
                try:
                    os.ftruncate(segment.log_fd, segment.size)
                except OSError as err:
                    self._failure = err
            raise

    def _add_index_entry(self, segment: _Segment, offset: int, position: int) -> None:
        assert segment.index_fd is not None
        entry = _INDEX_ENTRY.pack(offset - segment.base_offset, position)
        if os.write(segment.index_fd, entry) != len(entry):
            raise OSError(f"short write to the index of segment {segment.base_offset}")
        segment.index_offsets.append(offset)
        segment.index_positions.append(position)
        self._index_dirty = True

    def _roll(self, base_offset: int | None = None) -> None:
        """Close the active segment and start the next one, at ``base_offset``
        (a recorded gap, :meth:`skip_to`) or where the active one ends."""
        old = self._segments[-1]
        try:
            # A closed segment is trusted by recovery, so it is made durable whatever the
            # policy, before the next segment exists.
            _fsync(old.log_fd, self.directory)
            assert old.index_fd is not None
            _fsync(old.index_fd, self.directory)
            os.close(old.index_fd)
            old.index_fd = None
            self._index_dirty = False
            self._add_segment(
                self._create_segment(old.next_offset if base_offset is None else base_offset)
            )
            self._synced_end = self.log_end_offset
        except OSError as err:
            self._failure = err
            raise

    def _create_segment(self, base_offset: int) -> _Segment:
        index_fd = os.open(
            self._index_path(base_offset),
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
            0o644,
        )
        try:
            log_fd = os.open(
                self._log_path(base_offset), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644
            )
        except OSError:
            os.close(index_fd)
            raise
        fsync_directory(self.directory)
        return _Segment(base_offset, log_fd, 0, base_offset, [], [], index_fd, verified=True)

    def _add_segment(self, segment: _Segment) -> None:
        self._segments.append(segment)
        self._bases.append(segment.base_offset)

    # -- recovery -----------------------------------------------------------------------------

    def _recover(self) -> RecoveryReport:
        started = time.monotonic()
        created = not self.directory.is_dir()
        if created:
            self.directory.mkdir(parents=True)
            fsync_directory(self.directory.parent)
        for pattern in (
            "*.index.tmp",
            "*" + _SNAPSHOT_SUFFIX + ".tmp",
            _GAPS_FILE + ".tmp",
            _EPOCHS_FILE + ".tmp",
        ):
            for leftover in self.directory.glob(pattern):
                leftover.unlink()
        bases = sorted(
            int(path.stem)
            for path in self.directory.glob("*.log")
            if len(path.stem) == _NAME_DIGITS and path.stem.isdigit()
        )
        for index in self.directory.glob("*.index"):
            if index.stem.isdigit() and int(index.stem) not in bases:
                index.unlink()  # its log was deleted by retention just before a crash
        if not bases:
            past = [offset for offset in self.snapshot_offsets() if offset > 0]
            if past:  # taken at a roll: records below them were in the log
                raise CorruptLog(
                    f"{self.directory}: no segment file, but a producer-state snapshot "
                    f"at offset {past[-1]}: the log's files are missing"
                )
            self._add_segment(self._create_segment(0))
            (self.directory / _EPOCHS_FILE).unlink(missing_ok=True)
            return RecoveryReport(1, 0, 0, 0, time.monotonic() - started, created)
        on_disk = self._read_epochs()
        self._epochs_read = on_disk is not None
        gaps = self._read_gaps()
        scanned = truncated = rebuilt = 0
        expected = bases[0]
        for i, base in enumerate(bases):
            if base != expected and (expected, base) not in gaps:
                raise CorruptLog(
                    f"{self.directory}: segment {base} does not follow the previous segment, "
                    f"which ends at offset {expected}"
                )
            if i < len(bases) - 1:
                segment, n, fixed = self._open_closed_segment(base)
                cut = 0
            else:
                segment, n, fixed, cut = self._open_active_segment(base)
            self._add_segment(segment)
            scanned += n
            rebuilt += fixed
            truncated += cut
            expected = segment.next_offset
        for offset in self.snapshot_offsets():
            if not bases[0] <= offset <= expected:  # describes records no longer in the log
                self.delete_snapshot(offset)
        self._recover_epochs(on_disk)
        return RecoveryReport(
            len(bases), scanned, truncated, rebuilt, time.monotonic() - started, created
        )

    def _read_epochs(self) -> bytes | None:
        """The checkpoint's bytes, after loading them into :attr:`epochs`; None when
        there is no checkpoint or it is damaged (:meth:`_recover_epochs` rebuilds it)."""
        path = self.directory / _EPOCHS_FILE
        try:
            data = path.read_bytes()
            self.epochs = epochs.decode(data)
        except FileNotFoundError:
            return None
        except epochs.CheckpointError as exc:
            logger.warning("%s is damaged (%s); rebuilt from the log", path, exc)
            return None
        return data

    def _recover_epochs(self, on_disk: bytes | None) -> None:
        """Make :attr:`epochs` describe the recovered log and write it back where
        it changed: without a readable checkpoint, from every batch header;
        with one, without the epochs of a tail cut by recovery."""
        if on_disk is None:
            self.epochs = LeaderEpochs()
            for header, _ in self.batches():
                self.epochs.assign(header.partition_leader_epoch, header.base_offset)
        self.epochs.truncate_from_end(self.log_end_offset)
        self.epochs.truncate_from_start(self.log_start_offset)
        if epochs.encode(self.epochs) != on_disk:
            self._write_epochs(self.epochs)

    def _write_epochs(self, history: LeaderEpochs) -> None:
        """Store ``history`` as the checkpoint (atomically) and keep it.

        Raises:
            OSError: it could not be written (the store is failed: the file may
                be renamed over while the directory was not synced).
        """
        try:
            _write_atomically(self.directory / _EPOCHS_FILE, epochs.encode(history))
        except OSError as err:
            self._failure = err
            raise
        self.epochs = history

    def _read_gaps(self) -> set[tuple[int, int]]:
        """The recorded gaps (:meth:`skip_to`) as (from, to) offsets.

        Raises:
            CorruptLog: the file is damaged (its checksum does not match).
        """
        path = self.directory / _GAPS_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return set()
        body, tail = data[:-4], data[-4:]
        if len(data) < 4 or crc32c.crc32c(body) != int.from_bytes(tail, "little"):
            raise CorruptLog(f"{path} is damaged (checksum mismatch)")
        try:
            pairs = msgpack.unpackb(body)
            return {(int(a), int(b)) for a, b in pairs}
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise CorruptLog(f"{path} is damaged: {exc}") from None

    def _write_gaps(self, gaps: set[tuple[int, int]]) -> None:
        body = msgpack.packb([list(gap) for gap in sorted(gaps)])
        _write_atomically(
            self.directory / _GAPS_FILE, body + crc32c.crc32c(body).to_bytes(4, "little")
        )

    @property
    def unsettled(self) -> bool:
        """Whether the log was marked as possibly missing records whose offsets
        were handed out (:meth:`mark_unsettled`), across restarts."""
        return (self.directory / _UNSETTLED_FILE).exists()

    def mark_unsettled(self) -> None:
        """Record durably that the log may miss records whose offsets were
        handed out, until :meth:`settle`.

        Raises:
            OSError: the file could not be made durable.
        """
        path = self.directory / _UNSETTLED_FILE
        if not path.exists():
            path.touch()
            fsync_directory(self.directory)

    def settle(self) -> None:
        """The owner continues above every offset handed out: remove the mark."""
        path = self.directory / _UNSETTLED_FILE
        if path.exists():
            path.unlink()
            fsync_directory(self.directory)

    def skip_to(self, offset: int) -> None:
        """Continue the log at ``offset``: the offsets from :attr:`log_end_offset`
        up to it are never handed out (they may have been, before a loss).

        An empty log simply starts there (its log start offset). Otherwise the
        gap is written to the ``offset-gaps`` file (checksummed, fsynced) and a
        new segment starts at ``offset``; recovery accepts a jump between two
        segments only where that file records it, and reads from an offset in
        the gap return the batches after it.

        Raises:
            ValueError: ``offset`` is not past :attr:`log_end_offset`.
            StoreFailed: an earlier write or fsync failed.
            OSError: the files could not be written (the store is failed).
        """
        self._check_usable()
        end = self.log_end_offset
        if offset <= end:
            raise ValueError(f"offset {offset} is not past the log end {end}")
        try:
            if len(self._segments) == 1 and self._segments[0].size == 0:
                empty = self._segments.pop()
                self._bases.pop()
                os.close(empty.log_fd)
                if empty.index_fd is not None:
                    os.close(empty.index_fd)
                self._log_path(empty.base_offset).unlink()
                self._index_path(empty.base_offset).unlink(missing_ok=True)
                self._add_segment(self._create_segment(offset))
                self._synced_end = offset
                return
            self._write_gaps(self._read_gaps() | {(end, offset)})
            self._roll(offset)
        except OSError as err:
            self._failure = err
            raise

    def truncate_to(self, offset: int) -> None:
        """Cut the log so that it ends at ``offset`` (a follower's log where it may
        differ from its leader's, KIP-101): later segments are deleted, the one
        holding ``offset`` is cut there and becomes the active one, and the
        snapshots, gaps and leader epochs past it are dropped. An ``offset``
        in a recorded gap cuts at the gap's start.

        Raises:
            ValueError: ``offset`` is outside [log start offset, log end offset]
                or inside a batch.
            StoreFailed: an earlier write or fsync failed.
            OSError: the files could not be cut (the store is failed).
        """
        self._check_usable()
        if not self.log_start_offset <= offset <= self.log_end_offset:
            raise ValueError(
                f"offset {offset} is outside [{self.log_start_offset}, {self.log_end_offset}]"
            )
        if offset == self.log_end_offset:
            return
        holder = self._segments[bisect.bisect_right(self._bases, offset) - 1]
        cut = holder.size
        for pos, header in self._headers_from(
            holder, _SegmentReader(holder.log_fd, _READAHEAD), offset
        ):
            if header.base_offset != offset:
                raise ValueError(
                    f"offset {offset} is inside the batch at "
                    f"{header.base_offset}..{header.last_offset}"
                )
            cut = pos
            break
        self._cuts += 1
        try:
            while self._segments[-1] is not holder:
                dropped = self._segments.pop()
                self._bases.pop()
                for fd in (dropped.log_fd, dropped.index_fd):
                    if fd is not None:
                        os.close(fd)
                self._log_path(dropped.base_offset).unlink()
                self._index_path(dropped.base_offset).unlink(missing_ok=True)
            # The later segments' removal is durable before the holder is cut:
            # else a crash between could bring them back after a shorter holder.
            fsync_directory(self.directory)
            if holder.index_fd is None:  # it was closed: reopen it for appends
                os.close(holder.log_fd)
                holder.log_fd = os.open(self._log_path(holder.base_offset), os.O_RDWR | os.O_APPEND)
            else:
                os.close(holder.index_fd)
                holder.index_fd = None
            os.ftruncate(holder.log_fd, cut)
            _fsync(holder.log_fd, self.directory)
            kept = bisect.bisect_left(holder.index_positions, cut)
            del holder.index_offsets[kept:], holder.index_positions[kept:]
            self._write_index_file(holder.base_offset, holder.index_offsets, holder.index_positions)
            holder.index_fd = os.open(
                self._index_path(holder.base_offset), os.O_WRONLY | os.O_APPEND
            )
            holder.size = cut
            holder.next_offset = min(offset, holder.next_offset)
            holder.max_timestamp = None
            self._synced_end = holder.next_offset
            self._index_dirty = False
            fsync_directory(self.directory)
            end = holder.next_offset
            gaps = self._read_gaps()
            if any(to > end for _, to in gaps):
                self._write_gaps({gap for gap in gaps if gap[1] <= end})
            for snapshot in self.snapshot_offsets():
                if snapshot > end:
                    self.delete_snapshot(snapshot)
            kept_epochs = LeaderEpochs(self.epochs.entries)
            if kept_epochs.truncate_from_end(end):
                self._write_epochs(kept_epochs)
        except OSError as err:
            self._failure = err
            raise

    def _open_closed_segment(self, base: int) -> tuple[_Segment, int, int]:
        """Open a closed segment, trusting its contents; returns (segment, headers read,
        indexes rebuilt)."""
        fd = os.open(self._log_path(base), os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            scanned = 0
            index = self._load_index(base, size)
            if index is not None:
                offsets, positions = index
                # Reading from the last entry to the end both checks that entry and finds
                # where the segment ends.
                start_offset, start_pos = (offsets[-1], positions[-1]) if offsets else (base, 0)
                tail = self._scan(fd, start_pos, start_offset, size, verify_crc=False)
                scanned += tail.batches
                if tail.problem is None:
                    segment = _Segment(base, fd, size, tail.next_offset, offsets, positions, None)
                    return segment, scanned, 0
            scan = self._scan(fd, 0, base, size, verify_crc=False)
            scanned += scan.batches
            if scan.problem is not None:
                raise CorruptLog(
                    f"{self._log_path(base)} is a closed segment but is damaged at position "
                    f"{scan.end}: {scan.problem}"
                )
            logger.warning("%s: offset index missing or damaged; rebuilt", self._index_path(base))
            self._write_index_file(base, scan.index_offsets, scan.index_positions)
            segment = _Segment(
                base, fd, size, scan.next_offset, scan.index_offsets, scan.index_positions, None
            )
            return segment, scanned, 1
        except BaseException:
            os.close(fd)
            raise

    def _open_active_segment(self, base: int) -> tuple[_Segment, int, int, int]:
        """Open the newest segment, validating every batch and cutting a bad tail; returns
        (segment, batches read, indexes rebuilt, bytes cut)."""
        path = self._log_path(base)
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
        index_fd: int | None = None
        try:
            size = os.fstat(fd).st_size
            scan = self._scan(fd, 0, base, size, verify_crc=True)
            cut = size - scan.end
            intact = _intact_batch_after(fd, scan.end, scan.next_offset, size) if cut else None
            if intact is not None and self.fsync is FsyncPolicy.ALWAYS:
                # A bad batch with intact ones after it is damage: cutting
                # would drop batches that may have been acknowledged (and
                # reuse their offsets). A machine crash may also tear appends
                # that shared an fsync and were never acknowledged; from here
                # the two cannot be told apart, so both are refused, and the
                # node fetches the log anew from a replica that holds it
                # whole (with no such replica, an operator decides).
                raise CorruptLog(
                    f"{path}: the batch at position {scan.end} (offset {scan.next_offset}) is "
                    f"damaged ({scan.problem}) and intact batches follow it (offset "
                    f"{intact[1]} at position {intact[0]}): refusing to cut acknowledged data"
                )
            if cut and self.fsync is FsyncPolicy.ALWAYS and not _never_written(fd, scan, size):
                # A torn write leaves a batch whose bytes run past the end of
                # the file. A whole batch that fails its checks (its CRC, its
                # base offset, its leader epoch) may have been fsynced and
                # acknowledged: that is damage, not a tail.
                raise CorruptLog(
                    f"{path}: the last batch, at position {scan.end} (offset "
                    f"{scan.next_offset}), is damaged ({scan.problem}); under "
                    "log.flush.policy=always only a batch never written whole is cut"
                )
            if intact is not None:
                logger.critical(
                    "%s event=acknowledged_data_lost: cut %d bytes at position %d (%s), "
                    "offsets %d to %d, of which intact batches from offset %d were unsynced "
                    "under log.flush.policy=%s; those offsets will be used again",
                    path,
                    cut,
                    scan.end,
                    scan.problem,
                    scan.next_offset,
                    _last_offset_in(fd, intact[0], size),
                    intact[1],
                    self.fsync.value,
                )
            elif cut:
                logger.warning(
                    "%s: cut %d bytes at position %d (%s); kept %d batches, log end offset %d",
                    path,
                    cut,
                    scan.end,
                    scan.problem,
                    scan.batches,
                    scan.next_offset,
                )
            if cut:
                os.ftruncate(fd, scan.end)
            if cut or (scan.end and self.fsync is FsyncPolicy.ALWAYS):
                # Under always, also what a process killed between its write
                # and its fsync left in the page cache: it may be served now.
                _fsync(fd, path)
            # The active index is always derived from the scan: its file may lag the log
            # (it is fsynced only at roll) or point past a cut tail.
            wanted = _pack_index(base, scan.index_offsets, scan.index_positions)
            index_path = self._index_path(base)
            try:
                on_disk: bytes | None = index_path.read_bytes()
            except FileNotFoundError:
                on_disk = None
            rebuilt = 0
            if on_disk != wanted:
                if on_disk is not None:
                    logger.warning("%s: offset index did not match the log; rebuilt", index_path)
                    rebuilt = 1
                self._write_index_file(base, scan.index_offsets, scan.index_positions)
            index_fd = os.open(index_path, os.O_WRONLY | os.O_APPEND)
            segment = _Segment(
                base,
                fd,
                scan.end,
                scan.next_offset,
                scan.index_offsets,
                scan.index_positions,
                index_fd,
                verified=True,
            )
            return segment, scan.batches, rebuilt, cut
        except BaseException:
            os.close(fd)
            if index_fd is not None:
                os.close(index_fd)
            raise

    def _load_index(self, base: int, log_size: int) -> tuple[list[int], list[int]] | None:
        """The index file's entries, or None if it is missing or not plausible (torn
        entry, entries not increasing, a position outside the log)."""
        try:
            data = self._index_path(base).read_bytes()
        except FileNotFoundError:
            return None
        if len(data) % _INDEX_ENTRY.size:
            return None
        offsets: list[int] = []
        positions: list[int] = []
        for relative, position in _INDEX_ENTRY.iter_unpack(data):
            if position >= log_size or (
                positions and (relative <= offsets[-1] - base or position <= positions[-1])
            ):
                return None
            offsets.append(base + relative)
            positions.append(position)
        return offsets, positions

    def _scan(
        self, fd: int, start_pos: int, start_offset: int, file_size: int, *, verify_crc: bool
    ) -> _Scan:
        """Walk the batches of a segment file from ``start_pos``, stopping at the first one
        that is incomplete, unparsable, out of offset sequence or (``verify_crc``) fails its
        CRC. Index entries are derived as appends make them (valid when ``start_pos`` is 0)."""
        reader = _SegmentReader(fd, _RECOVERY_READAHEAD)
        pos, expected, batches = start_pos, start_offset, 0
        offsets: list[int] = []
        positions: list[int] = []
        last_indexed = 0
        problem: str | None = None
        incomplete = False
        while pos < file_size:
            buf, rel = reader.window(pos, HEADER_SIZE)
            try:
                header = parse_header(buf, rel)
            except CorruptBatch as err:
                problem = str(err)
                incomplete = file_size - pos < HEADER_SIZE
                break
            self.headers_scanned += 1
            if header.base_offset != expected:
                problem = f"base offset {header.base_offset}, expected {expected}"
                break
            if pos + header.size > file_size:
                problem = f"incomplete batch: {file_size - pos} of {header.size} bytes"
                incomplete = True
                break
            if verify_crc:
                buf, rel = reader.window(pos, header.size)
                if not crc_ok(memoryview(buf)[rel : rel + header.size]):
                    problem = f"CRC mismatch in the batch at offset {header.base_offset}"
                    break
            if pos - last_indexed >= self.index_interval_bytes:
                offsets.append(header.base_offset)
                positions.append(pos)
                last_indexed = pos
            # The checkpoint is written before the first batch of a new epoch
            # (and a truncation cuts the log before it): with a readable one,
            # a newer epoch in a header (a field outside the CRC) is damage.
            # Without one it is rebuilt from the headers (_recover_epochs).
            if self._epochs_read and self.epochs.is_new(header.partition_leader_epoch):
                problem = (
                    f"the batch at offset {header.base_offset} names leader epoch "
                    f"{header.partition_leader_epoch}, newer than the checkpoint's"
                )
                break
            batches += 1
            expected = header.next_offset
            pos += header.size
        return _Scan(pos, expected, batches, offsets, positions, problem, incomplete)

    def _write_index_file(self, base: int, offsets: list[int], positions: list[int]) -> None:
        _write_atomically(self._index_path(base), _pack_index(base, offsets, positions))

    # -- state --------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise StoreFailed(f"{self.directory}: the store is closed")
        if self._failure is not None:
            raise StoreFailed(f"{self.directory}: an earlier write or fsync failed") from (
                self._failure
            )

    def _close_fds(self) -> None:
        for segment in self._segments:
            for fd in (segment.log_fd, segment.index_fd):
                if fd is not None:
                    try:
                        os.close(fd)
                    except OSError:
                        logger.exception("closing a segment file of %s", self.directory)
            segment.index_fd = None


class Flushable(Protocol):
    """Anything with a ``flush()``: a store, or an object that locks and flushes one."""

    def flush(self) -> None: ...


class LogFlusher(threading.Thread):
    """Flushes stores every ``interval_s`` seconds (``log.flush.interval.ms``) until stopped.

    Each period it calls ``targets()`` and then ``flush()`` on every object it
    returns. The stores are not thread-safe, so a target is typically the owner
    of a store, whose ``flush()`` takes the store's lock and calls
    :meth:`PartitionLogStore.flush`. An exception from one target is logged
    and the others are still flushed; the thread keeps running.
    """

    def __init__(
        self,
        targets: Callable[[], Iterable[Flushable]],
        interval_s: float,
        *,
        name: str = "log-flusher",
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        super().__init__(name=name, daemon=True)
        self._targets = targets
        self._interval_s = interval_s
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            self.flush_now()

    def flush_now(self) -> None:
        """Flush every target once, on the calling thread."""
        try:
            targets = list(self._targets())
        except Exception:
            logger.exception("periodic log flush: listing the stores failed")
            return
        for target in targets:
            try:
                target.flush()
            except Exception:
                logger.exception("periodic log flush failed for %r", target)

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread and wait for it; it exits as soon as a flush in progress ends."""
        self._stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)


def _pack_index(base: int, offsets: list[int], positions: list[int]) -> bytes:
    return b"".join(
        _INDEX_ENTRY.pack(offset - base, position)
        for offset, position in zip(offsets, positions, strict=True)
    )


def _pread_full(fd: int, n: int, pos: int) -> bytes:
    data = os.pread(fd, n, pos)
    if len(data) == n or not data:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        more = os.pread(fd, n - got, pos + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data``: a temporary file, fsynced, renamed over it, and the
    directory fsynced, so a crash leaves the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with memoryview(data) as view:
            written = 0
            while written < len(data):
                written += os.write(fd, view[written:])
        _fsync(fd, tmp)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(path.parent)


def _intact_batch_after(fd: int, position: int, offset: int, size: int) -> tuple[int, int] | None:
    """(position, base offset) of the first batch after ``position`` that parses,
    passes its CRC and starts at or after ``offset``, or None."""
    data = os.pread(fd, size - position, position)
    magic_at = 16  # the magic byte's place in a v2 batch header
    pos = data.find(b"\x02", 1 + magic_at) - magic_at
    while 0 < pos <= len(data) - HEADER_SIZE:
        try:
            header = parse_header(data, pos)
        except CorruptBatch:
            header = None
        if (
            header is not None
            and header.base_offset >= offset
            and pos + header.size <= len(data)
            and crc_ok(memoryview(data)[pos : pos + header.size])
        ):
            return position + pos, header.base_offset
        pos = data.find(b"\x02", pos + magic_at + 1) - magic_at
    return None


def _never_written(fd: int, scan: _Scan, size: int) -> bool:
    """Whether the bytes after ``scan`` stopped are a batch whose write never
    completed: fewer than a header, or a batch at the expected offset whose
    length runs past the end of the file, unless those bytes are a whole
    batch with a damaged length field (they match the batch's CRC)."""
    return scan.incomplete and not crc_ok_to_end(os.pread(fd, size - scan.end, scan.end))


def _last_offset_in(fd: int, position: int, size: int) -> int:
    """The last offset of the batches that follow each other from ``position``."""
    data = os.pread(fd, size - position, position)
    pos, last = 0, -1
    while pos + HEADER_SIZE <= len(data):
        try:
            header = parse_header(data, pos)
        except CorruptBatch:
            break
        last = header.next_offset - 1
        pos += header.size
    return last


def fsync_directory(directory: Path) -> None:
    """Make the directory's entries (files created, renamed or removed) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        _fsync(fd, directory)
    finally:
        os.close(fd)
