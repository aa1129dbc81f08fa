"""A durable Raft journal for pysyncobj, with a configurable fsync policy.

Why
---
pysyncobj's ``FileJournal`` writes log entries through an ``mmap`` and never
calls ``msync``/``fsync`` while running; ``currentTerm``/``votedFor`` go to
``<journal>.meta`` by writing a temporary file and renaming it, with no fsync
of the file or of its directory. A follower therefore acknowledges
AppendEntries (and the leader counts its own entry) while the entry may exist
only in the page cache, and after a power loss the meta file can even come
back empty, forgetting the vote. Process death (``kill -9``) is harmless in
both cases, because the page cache outlives the process; a machine crash is
not.

Approach
--------
This module *reimplements* the small ``FileJournal`` instead of subclassing it
and reaching into its name-mangled ``mmap``/file objects. Its format is
pysyncobj's with a checksum per record and one over the header (format 3;
pysyncobj's format 1 and the header without a checksum, format 2, are refused
by name)::

    header (44 bytes): b"PYSYNCOBJ" padded to 24 | pysyncobj version padded to 8
                       | uint32 format version (3) | uint32 last-record offset
                       | uint32 crc32c(the 40 bytes before it)
    records:           uint32 n | uint64 idx | uint64 term | command (n - 16 bytes)
                       | uint32 crc32c(n, idx, term, command) | uint32 n

(all little-endian). The meta file (term, vote, commit index) is ``RCM2``, a
msgpack map and the CRC32C of both. Writes go through ``os.pwrite`` on a plain file
descriptor (no mmap), so the fsync points are explicit:

* ``add`` writes the record, then the header's last-record offset and
  checksum; one ``fdatasync`` (``fsync`` when the file was grown since the
  last sync) makes both durable. The file grows by preallocation
  (``posix_fallocate``, doubling, at most 16 MiB per step), so most syncs
  overwrite already-allocated blocks; what lies past the log's end always
  reads as zeros (see Torn tails).
* ``deleteEntriesFrom`` / ``clear`` rewrite the header's offset, cut the
  file there and sync.
* ``deleteEntriesTo`` (log compaction) writes the kept suffix to
  ``<journal>.compact.tmp``, fsyncs it, renames it over the journal and fsyncs
  the directory: crash-atomic, unlike pysyncobj's clear-then-re-add, where a
  crash in the middle loses the tail of the log. When a ``snapshot_file`` (the
  ``SyncObjConf.fullDumpFile``) is registered, it and its directory are
  fsynced *before* the journal prefix is dropped (pysyncobj writes that file
  without fsync).
* ``setCurrentTerm`` (term and vote) writes ``<journal>.meta.tmp``, fsyncs it,
  ``os.replace``-s it onto ``<journal>.meta`` and fsyncs the directory before
  returning. The commit index (``setRaftCommitIndex``) is stored lazily by
  ``onOneSecondTimer`` like pysyncobj does, with the same fsyncs, only when
  it changed (followers are told it with every heartbeat), and only after
  any unsynced journal data (so a stored commit index never points past the
  durable log).

Policies
--------
``"always"`` (default)
    Every ``add`` / ``deleteEntriesFrom`` / ``deleteEntriesTo`` / ``clear`` is
    durable before the method returns. pysyncobj calls ``add`` before a
    follower sends its AppendEntries acknowledgement and before the leader
    counts itself towards the commit quorum, so no acknowledged entry can be
    lost by a power failure.
``"batch"``
    Journal writes are synced at most once per ``batch_interval_s`` (default
    5 ms): ``add`` calls :meth:`DurableFileJournal.sync_if_due`, and so does
    ``onOneSecondTimer``. A *power loss* can lose the entries acknowledged in
    the last interval (and, when traffic stops, those written since the last
    sync until the next ``add`` or timer call, at most ~1 s; call
    :func:`attach_tick_sync` to sync on every pysyncobj tick instead). A
    ``kill -9`` loses nothing: the data is in the page cache. Term and vote are
    still synced before ``setCurrentTerm`` returns: Raft's election safety
    needs that regardless of the entry policy.
``"never"``
    pysyncobj's behaviour: no fsync at all (renames and the header ordering are
    kept, so ``kill -9`` is still safe).

Torn tails
----------
The header's last-record offset is the authority, and its checksum makes a
flipped bit in it damage, not a shorter log: records before it are
validated when the journal is opened (each record's leading and trailing
lengths must agree, fit before the offset, its checksum must match, and
indexes must be consecutive with non-decreasing terms); bytes after it (a
record whose header update never reached the disk) are cut off. When a
record fails, what may be dropped depends on the policy:

* Under ``always``, each add is durable before the next one starts (and
  before pysyncobj acknowledges it), so only the last record can be torn,
  and only if its bytes never fully reached the file: the file ends before
  the header's offset (an add that grew the file was cut), or the record's
  bytes up to that offset read as zeros (the header reached the disk, the
  record did not; the file past the log's end is always zeros, as it is
  grown by preallocation and cut on truncation and on open). Such a tail is
  dropped with a warning, ``dropped_tail_bytes`` says how much, and the
  header is rewritten. Any other failing record (one with intact records
  after it, or a last record the file holds in full) may have been
  acknowledged: opening raises :class:`JournalCorruptError` instead of
  applying or dropping it. So does a header whose checksum fails, and a
  term/vote file that is missing beside a journal (it is written before the
  journal is created, so a journal without one has lost its vote).
* Under ``batch`` and ``never``, several unsynced records can be torn in any
  order, so the log ends at the first failing one, as a torn tail.

Integration
-----------
``install()`` replaces ``pysyncobj.syncobj.createJournal`` (the name
``SyncObj.__init__`` calls), so ``SyncObjConf(journalFile=path)`` gets a
:class:`DurableFileJournal` whose options come from :func:`register_journal`,
else from ``install``'s ``policy_for_path``, else ``default_policy``.
``journalFile=None`` still gives pysyncobj's ``MemoryJournal``. ``install`` is
idempotent; ``uninstall`` restores the original factory.

Note that with ``journalFile`` set but no ``fullDumpFile`` pysyncobj keeps its
snapshots in memory only, yet still truncates the journal after compaction: a
restarted node then has neither. Always set both.

Fsyncs are counted per journal (``fsync_count``, ``entry_sync_count``,
``meta_sync_count``) and for the process (:func:`fsync_total`), so tests can
check that a policy is honoured.

One file on purpose (about 900 lines): one class implements pysyncobj's
journal interface over one file format, and its recovery, append, truncate
and fsync paths must agree on that format byte for byte.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Final, Literal, overload

import crc32c
import msgpack
import pysyncobj.journal
import pysyncobj.syncobj
from pysyncobj.pickle import to_bytes as _to_bytes

from raftcoord.coordinator.raft_wire import MAX_TERM, TERM_WARNING

__all__ = [
    "POLICIES",
    "DurableFileJournal",
    "JournalCorruptError",
    "Policy",
    "attach_tick_sync",
    "create_journal",
    "fsync_total",
    "install",
    "is_installed",
    "journal_for",
    "register_journal",
    "uninstall",
    "unregister_journal",
]

logger = logging.getLogger(__name__)

Policy = Literal["always", "batch", "never"]
POLICIES: Final[tuple[str, ...]] = ("always", "batch", "never")
DEFAULT_BATCH_INTERVAL_S: Final = 0.005

# pysyncobj.journal's format, taken from the module so the two cannot drift.
_NAME_SIZE: Final[int] = pysyncobj.journal.NAME_SIZE
_VERSION_SIZE: Final[int] = pysyncobj.journal.VERSION_SIZE
_APP_NAME: Final[bytes] = pysyncobj.journal.APP_NAME
_APP_VERSION: Final[bytes] = pysyncobj.journal.APP_VERSION
#: 1 is pysyncobj's (no checksums, pickled entries); 2 added a CRC32C per
#: record; 3 adds one over the header's fields.
_FORMAT_VERSION: Final[int] = 3
_LAST_RECORD_OFFSET_OFFSET: Final[int] = pysyncobj.journal.LAST_RECORD_OFFSET_OFFSET
#: Where the header's checksum is: after the last-record offset.
_HEADER_CRC_OFFSET: Final[int] = _LAST_RECORD_OFFSET_OFFSET + 4
#: The header's size: pysyncobj's 40 bytes and the CRC32C of them.
HEADER_SIZE: Final[int] = _HEADER_CRC_OFFSET + 4
_RECORD_HEAD: Final = struct.Struct("<IQQ")  # n, idx, term
_RECORD_TAIL: Final = struct.Struct("<II")  # crc32c of head and command, n
_U32: Final = struct.Struct("<I")
#: The meta file (term, vote, commit index): magic, msgpack map, crc32c of both.
_META_MAGIC: Final = b"RCM2"
_MIN_RECORD_BODY: Final = 16  # idx + term
_MIN_FILE_SIZE: Final = 64 * 1024
_MAX_GROWTH: Final = 16 * 1024 * 1024

Entry = tuple[Any, int, int]  # (command, idx, term); command is bytes

_fsync_lock = threading.Lock()
_fsync_total = 0

#: Called with the journal's path and the error when an fsync fails, before
#: the error is raised; a node sets it to stop the process (a failed fsync is
#: never retried: the kernel may have dropped the dirty pages, so a later
#: fsync that succeeds proves nothing). None (tests of this module): raise.
fsync_failure_handler: Callable[[str, OSError], None] | None = None


#: Called with the seconds each successful fsync took (a node's metrics).
fsync_observer: Callable[[float], None] | None = None


def fsync_total() -> int:
    """Number of fsync/fdatasync calls made by this module in this process."""
    return _fsync_total


def _count_fsync() -> None:
    global _fsync_total
    with _fsync_lock:
        _fsync_total += 1


class TermExhausted(Exception):
    """A term past the coordinator epoch's range (Kafka's int32) was to be stored."""


class JournalCorruptError(Exception):
    """The journal or its meta file cannot be read safely."""


_HEADER_PREFIX: Final = (
    _APP_NAME
    + b"\0" * (_NAME_SIZE - len(_APP_NAME))
    + _APP_VERSION
    + b"\0" * (_VERSION_SIZE - len(_APP_VERSION))
    + _U32.pack(_FORMAT_VERSION)
)


_REPAIR: Final = (
    "Repair: with this shard's other replicas serving, `raftcoord repair-shard` (see "
    "docs/coordinator.md, Durability) sets this replica's log aside and it catches up "
    "from the leader."
)


def _offset_and_crc(last_record_offset: int) -> bytes:
    """The header's last 8 bytes: the last-record offset and the CRC32C of
    the header up to it."""
    offset = _U32.pack(last_record_offset)
    return offset + _U32.pack(crc32c.crc32c(_HEADER_PREFIX + offset))


def _default_header(last_record_offset: int = HEADER_SIZE) -> bytes:
    return _HEADER_PREFIX + _offset_and_crc(last_record_offset)


def _encode_record(command: Any, idx: int, term: int) -> bytes:
    cmd: bytes = _to_bytes(command)
    n = _MIN_RECORD_BODY + len(cmd)
    body = _RECORD_HEAD.pack(n, idx, term) + cmd
    return body + _RECORD_TAIL.pack(crc32c.crc32c(body), n)


def _record_at(data: bytes | memoryview, pos: int) -> tuple[int, int, int] | None:
    """(end, idx, term) of the record at ``pos`` in ``data`` when its framing
    and checksum hold, else None."""
    if pos + _RECORD_HEAD.size > len(data):
        return None
    n, idx, term = _RECORD_HEAD.unpack_from(data, pos)
    end = pos + 4 + n + _RECORD_TAIL.size
    if n < _MIN_RECORD_BODY or end > len(data):
        return None
    crc, trailing = _RECORD_TAIL.unpack_from(data, end - _RECORD_TAIL.size)
    if trailing != n or crc != crc32c.crc32c(data[pos : pos + 4 + n]):
        return None
    return end, idx, term


def _intact_record_after(data: bytes, pos: int, prev_idx: int | None) -> int | None:
    """The position of the first intact record after ``pos`` in ``data`` that
    continues the log (a later index than ``prev_idx``), or None."""
    for q in range(pos + 1, len(data) - _RECORD_HEAD.size - _RECORD_TAIL.size + 1):
        found = _record_at(data, q)
        if found is not None and (prev_idx is None or found[1] > prev_idx):
            return q
    return None


def encode_meta(meta: dict[str, Any]) -> bytes:
    """The meta file's bytes."""
    body = _META_MAGIC + bytes(msgpack.packb(meta, use_bin_type=True))
    return body + _U32.pack(crc32c.crc32c(body))


def decode_meta(raw: bytes) -> dict[str, Any]:
    """The meta file's map; ValueError when it is not one, intact."""
    body, tail = raw[:-4], raw[-4:]
    if not body.startswith(_META_MAGIC) or len(tail) != 4:
        raise ValueError("not a meta file of this format")
    if _U32.unpack(tail)[0] != crc32c.crc32c(body):
        raise ValueError("checksum mismatch")
    meta = msgpack.unpackb(body[len(_META_MAGIC) :], raw=False)
    if not isinstance(meta, dict):
        raise ValueError("not a map")
    return meta


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


class DurableFileJournal(pysyncobj.journal.Journal):  # type: ignore[misc]  # pysyncobj is untyped
    """pysyncobj ``Journal`` on a file, with fsync points chosen by ``policy``.

    pysyncobj's on-disk format with a checksum per record; see the module
    docstring for the policies and recovery rules. Not used concurrently by
    pysyncobj (its tick thread is the only caller); a lock still serialises
    writes against :meth:`sync_if_due` called from elsewhere.
    """

    def __init__(
        self,
        journal_file: str,
        policy: str = "always",
        batch_interval_s: float = DEFAULT_BATCH_INTERVAL_S,
        *,
        snapshot_file: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"fsync policy must be one of {POLICIES}, got {policy!r}")
        if batch_interval_s < 0:
            raise ValueError("batch_interval_s must be >= 0")
        self.path: Final[str] = os.path.abspath(journal_file)
        self.policy: Final[str] = policy
        self.batch_interval_s: Final[float] = batch_interval_s
        self.snapshot_file: Final[str | None] = (
            os.path.abspath(snapshot_file) if snapshot_file is not None else None
        )
        self._clock = clock
        self._dir = os.path.dirname(self.path)
        self._meta_path = self.path + ".meta"
        self._lock = threading.RLock()
        self._durable = policy != "never"

        #: every fsync/fdatasync of this journal (files and directories)
        self.fsync_count = 0
        #: syncs of the journal file itself (entries, truncations)
        self.entry_sync_count = 0
        #: durable writes of the meta file (term, vote, commit index)
        self.meta_sync_count = 0
        #: bytes after the last valid record that were dropped when opening
        self.dropped_tail_bytes = 0

        self._entries: list[Entry] = []
        self._offsets: list[int] = []
        self._end = HEADER_SIZE
        self._dirty = False
        self._grown = False
        self._closed = False
        self._last_sync = clock()

        for leftover in (self._meta_path + ".tmp", self.path + ".compact.tmp"):
            if os.path.exists(leftover):
                os.remove(leftover)

        self._meta: dict[str, Any] = {}
        self._meta_dirty = False
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._file_size = os.fstat(self._fd).st_size
            created = self._load()
            self._meta = self._read_meta(required=not created)
        except BaseException:
            os.close(self._fd)
            raise

    # ----------------------------------------------------------------- opening

    def _load(self) -> bool:
        """Read the records; whether the journal was created now."""
        header = os.pread(self._fd, HEADER_SIZE, 0)
        if len(header) < HEADER_SIZE or header == bytes(HEADER_SIZE):
            # A new file, or one whose header never (fully) reached the disk, so
            # no record can have been written after it either: start empty.
            # (pysyncobj reads an all-zero header as an empty journal too.)
            if header.strip(b"\0") and not _default_header().startswith(header):
                raise JournalCorruptError(f"{self.path}: truncated journal header")
            if self._file_size > HEADER_SIZE and os.pread(
                self._fd, self._file_size - HEADER_SIZE, HEADER_SIZE
            ).strip(b"\0"):
                raise JournalCorruptError(
                    f"{self.path}: the journal header is blank but records follow it: "
                    "the header is damaged. " + _REPAIR
                )
            if not os.path.exists(self._meta_path):
                # The term/vote file first: a journal found without one later
                # is a journal whose term and vote were lost.
                self._store_meta()
            _pwrite_all(self._fd, _default_header(), 0)
            self._truncate(HEADER_SIZE)
            if self._durable:
                self._fsync_fd(self._fd, full=True)
                self._fsync_dir(self._dir)
            return True
        if header[:_NAME_SIZE].rstrip(b"\0") != _APP_NAME:
            raise JournalCorruptError(f"{self.path}: not a pysyncobj journal")
        fmt = _U32.unpack_from(header, _LAST_RECORD_OFFSET_OFFSET - 4)[0]
        if fmt != _FORMAT_VERSION:
            raise JournalCorruptError(
                f"{self.path}: journal format {fmt}, this version reads format "
                f"{_FORMAT_VERSION} (format 1, pysyncobj's, has no checksums and "
                "pickled entries; format 2 has no checksum over its header; a data "
                "directory written before them cannot be used)"
            )
        if _U32.unpack_from(header, _HEADER_CRC_OFFSET)[0] != crc32c.crc32c(
            header[:_HEADER_CRC_OFFSET]
        ):
            raise JournalCorruptError(
                f"{self.path}: the journal header fails its checksum: where the log "
                "ends is unknown, so no record after the header can be trusted to be "
                "the last one. " + _REPAIR
            )
        last = max(_U32.unpack_from(header, _LAST_RECORD_OFFSET_OFFSET)[0], HEADER_SIZE)
        limit = min(last, self._file_size)
        data = os.pread(self._fd, limit - HEADER_SIZE, HEADER_SIZE)
        base = HEADER_SIZE
        pos = 0
        prev_idx: int | None = None
        prev_term = -1
        while base + pos < last:
            found = _record_at(data, pos)
            if found is None:
                break
            end, idx, term = found
            if (prev_idx is not None and idx != prev_idx + 1) or term < prev_term:
                break
            self._entries.append((bytes(data[pos + 20 : end - _RECORD_TAIL.size]), idx, term))
            self._offsets.append(base + pos)
            prev_idx, prev_term = idx, term
            pos = end
        self._end = base + pos
        if self._end < last:
            self._check_torn(data, pos, last, prev_idx)
            self.dropped_tail_bytes = last - self._end
            logger.warning(
                "%s: torn journal tail, dropped %d bytes after offset %d (%d records kept)",
                self.path,
                self.dropped_tail_bytes,
                self._end,
                len(self._entries),
            )
            self._write_last_offset(self._end)
        # Bytes after the log (a record whose write was cut, one that the
        # header never pointed at) go: the next record is written over zeros
        # only, so that a write of it cut short reads back as never written.
        if self._end < last or self._file_size > self._end:
            self._truncate(self._end)
            if self._durable:
                self._sync_journal()
        return False

    def _check_torn(self, data: bytes, pos: int, last: int, prev_idx: int | None) -> None:
        """Raise JournalCorruptError unless the record at ``pos`` in ``data``
        (the records' bytes up to the header's ``last``), which fails its
        checks, and what follows it up to ``last`` may be dropped as a torn
        tail."""
        at = HEADER_SIZE + pos
        if self.policy != "always":
            # Under "batch" and "never" several unsynced records can be torn,
            # in any order: the log ends at the first bad one.
            return
        # Each add is fsynced before the next one starts, so only the last
        # record can be torn: a bad record with intact ones after it is damage.
        intact = _intact_record_after(data, pos, prev_idx)
        if intact is not None:
            raise JournalCorruptError(
                f"{self.path}: the record at offset {at} (after index {prev_idx}) fails "
                f"its checksum or framing, and intact records follow it (one at offset "
                f"{HEADER_SIZE + intact}): the journal is damaged, not torn. Refusing to "
                "apply or to drop acknowledged entries. " + _REPAIR
            )
        # The last record may be dropped only when its bytes were never fully
        # written: the file ends before the header's end of the log (an add
        # that grew the file and was cut), or they read back as the zeros the
        # file was grown with (the header reached the disk, the record did
        # not). A complete record that fails its checksum may have been
        # acknowledged: the node must not go on without it.
        if last > self._file_size or not data[pos:].strip(b"\0"):
            return
        raise JournalCorruptError(
            f"{self.path}: the last record, at offset {at} (after index {prev_idx}), "
            f"fails its checksum or framing although all its bytes up to the header's "
            f"end of the log ({last}) are in the file: under fsync=always it was written "
            "in full and may have been acknowledged, so the journal is damaged, not "
            "torn. Refusing to drop it. " + _REPAIR
        )

    def _read_meta(self, *, required: bool) -> dict[str, Any]:
        """The term/vote file's map. A journal that was not created now has
        one (it is written before the journal); ``required``: a missing one
        is refused under the durable policies (the vote it held is lost)."""
        try:
            with open(self._meta_path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            if required and self._durable:
                raise JournalCorruptError(
                    f"{self._meta_path} is missing beside its journal: this node's term "
                    "and vote are lost, and starting without them could vote twice in a "
                    "term. " + _REPAIR
                ) from None
            return {}
        try:
            meta = decode_meta(raw)
        except Exception as exc:
            if self._durable:
                raise JournalCorruptError(
                    f"{self._meta_path}: unreadable term/vote file ({exc!r}); refusing to "
                    "start with a forgotten vote. " + _REPAIR
                ) from exc
            logger.warning("%s: unreadable meta file ignored (%r)", self._meta_path, exc)
            return {}
        return meta

    # ------------------------------------------------------------- low level

    def _fsync_fd(self, fd: int, *, full: bool) -> None:
        started = time.perf_counter()
        try:
            if full or not hasattr(os, "fdatasync"):
                os.fsync(fd)
            else:
                os.fdatasync(fd)
        except OSError as exc:
            if fsync_failure_handler is not None:
                fsync_failure_handler(self.path, exc)
            raise
        if fsync_observer is not None:
            fsync_observer(time.perf_counter() - started)
        self.fsync_count += 1
        _count_fsync()

    def _fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            self._fsync_fd(fd, full=True)
        finally:
            os.close(fd)

    def _fsync_path(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            self._fsync_fd(fd, full=True)
        finally:
            os.close(fd)

    def _sync_journal(self) -> None:
        self._fsync_fd(self._fd, full=self._grown)
        self._grown = False
        self._dirty = False
        self.entry_sync_count += 1
        self._last_sync = self._clock()

    def _write_last_offset(self, offset: int) -> None:
        _pwrite_all(self._fd, _offset_and_crc(offset), _LAST_RECORD_OFFSET_OFFSET)

    def _truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes (synced with the next journal sync)."""
        os.ftruncate(self._fd, size)
        self._file_size = size
        self._grown = True

    def _ensure_capacity(self, needed: int) -> None:
        if needed <= self._file_size:
            return
        new_size = max(needed, _MIN_FILE_SIZE, min(self._file_size * 2, needed + _MAX_GROWTH))
        try:
            os.posix_fallocate(self._fd, self._file_size, new_size - self._file_size)
        except (AttributeError, OSError):
            os.ftruncate(self._fd, new_size)
        self._file_size = new_size
        self._grown = True

    def _after_write(self) -> None:
        self._dirty = True
        if self.policy == "always":
            self._sync_journal()
        elif self.policy == "batch":
            self._sync_if_due_locked()

    def _sync_if_due_locked(self) -> bool:
        if not self._dirty or self._closed or not self._durable:
            return False
        if self._clock() - self._last_sync < self.batch_interval_s:
            return False
        self._sync_journal()
        return True

    def _sync_snapshot(self) -> None:
        snap = self.snapshot_file
        if snap is not None and self._durable and os.path.exists(snap):
            self._fsync_path(snap)
            self._fsync_dir(os.path.dirname(snap))

    def _store_meta(self) -> None:
        if self._dirty and self._durable:
            # Never let a stored commit index point past the durable log.
            self._sync_journal()
        tmp = self._meta_path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(encode_meta(self._meta))
            f.flush()
            if self._durable:
                self._fsync_fd(f.fileno(), full=True)
        os.replace(tmp, self._meta_path)
        if self._durable:
            self._fsync_dir(self._dir)
            self.meta_sync_count += 1
        self._meta_dirty = False

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"journal {self.path} is closed")

    # ------------------------------------------------------ Journal interface

    def add(self, command: Any, idx: int, term: int) -> None:
        record = _encode_record(command, idx, term)
        with self._lock:
            self._check_open()
            offset = self._end
            self._ensure_capacity(offset + len(record))
            _pwrite_all(self._fd, record, offset)
            self._write_last_offset(offset + len(record))
            self._end = offset + len(record)
            self._offsets.append(offset)
            self._entries.append((command, idx, term))
            self._after_write()

    def clear(self) -> None:
        with self._lock:
            self._check_open()
            self._sync_snapshot()
            self._write_last_offset(HEADER_SIZE)
            self._truncate(HEADER_SIZE)
            self._end = HEADER_SIZE
            self._entries = []
            self._offsets = []
            self._after_write()

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        with self._lock:
            self._check_open()
            start = range(len(self._entries))[entryFrom:].start
            if start >= len(self._entries):
                return
            self._end = self._offsets[start]
            self._write_last_offset(self._end)
            # The next record is written over zeros (see _check_torn).
            self._truncate(self._end)
            del self._entries[start:]
            del self._offsets[start:]
            self._after_write()

    def deleteEntriesTo(self, entryTo: int) -> None:
        with self._lock:
            self._check_open()
            keep_from = range(len(self._entries))[entryTo:].start
            if keep_from <= 0:
                return
            kept = self._entries[keep_from:]
            records = [_encode_record(*entry) for entry in kept]
            offsets: list[int] = []
            end = HEADER_SIZE
            for rec in records:
                offsets.append(end)
                end += len(rec)
            tmp = self.path + ".compact.tmp"
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _pwrite_all(fd, _default_header(end) + b"".join(records), 0)
                if self._durable:
                    self._fsync_fd(fd, full=True)
                # The snapshot that replaces the dropped prefix must be durable first.
                self._sync_snapshot()
                os.replace(tmp, self.path)
            except BaseException:
                os.close(fd)
                if os.path.exists(tmp):
                    os.remove(tmp)
                raise
            old_fd, self._fd = self._fd, fd
            os.close(old_fd)
            if self._durable:
                self._fsync_dir(self._dir)
                self.entry_sync_count += 1
                self._last_sync = self._clock()
            self._dirty = False
            self._grown = False
            self._file_size = end
            self._end = end
            self._entries = kept
            self._offsets = offsets

    @overload
    def __getitem__(self, item: int) -> Entry: ...

    @overload
    def __getitem__(self, item: slice) -> list[Entry]: ...

    def __getitem__(self, item: int | slice) -> Entry | list[Entry]:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                if self._dirty and self._durable:
                    self._sync_journal()
                if self._meta_dirty:
                    self._store_meta()
            finally:
                self._closed = True
                os.close(self._fd)

    close = _destroy

    def flush(self) -> None:
        """Make all journal writes durable now (whatever the policy)."""
        with self._lock:
            if self._dirty and not self._closed:
                self._sync_journal()

    sync = flush

    def sync_if_due(self) -> bool:
        """Under ``batch``: sync if there are unsynced writes and the interval has
        passed since the last sync. Returns whether it synced."""
        with self._lock:
            return self._sync_if_due_locked()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        # pysyncobj's followers set it on every AppendEntries, heartbeats
        # included: only a new value makes the meta file due for a rewrite.
        with self._lock:
            if self._meta.get("raftCommitIndex") != raftCommitIndex:
                self._meta["raftCommitIndex"] = raftCommitIndex
                self._meta_dirty = True

    def getRaftCommitIndex(self) -> int:
        # A stored commit index past the end of the log (possible with journals
        # written without fsync) is clamped: the commit index is volatile Raft
        # state and the leader re-sends it.
        value = int(self._meta.get("raftCommitIndex", 1))
        if self._entries:
            value = min(value, int(self._entries[-1][1]))
        return value

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        # A shard's term is its coordinator epoch, an int32 in Kafka's markers:
        # a member never stores (so never campaigns in or votes for) a term
        # past it, and says so long before. Peers cannot send such terms (the
        # transport refuses them); only ~2^31 elections reach it.
        if term > MAX_TERM:
            logger.critical(
                "%s event=term_exhausted term=%d max=%d: this shard cannot elect a leader "
                "any more; its transactions must move to a new cluster",
                self.path,
                term,
                MAX_TERM,
            )
            raise TermExhausted(f"term {term} is past the coordinator epoch's range")
        if term >= TERM_WARNING and term != self.getCurrentTerm():
            logger.warning("%s event=term_running_out term=%d max=%d", self.path, term, MAX_TERM)
        with self._lock:
            self._check_open()
            self._meta["currentTerm"] = term
            self._meta["votedForNodeId"] = votedForNodeId
            # Raft: term and vote must be durable before any message reflecting
            # them is sent; pysyncobj sends right after this returns.
            self._store_meta()

    def getCurrentTerm(self) -> int:
        return int(self._meta.get("currentTerm", 0))

    def getVotedForNodeId(self) -> Any:
        return self._meta.get("votedForNodeId", None)

    def onOneSecondTimer(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._sync_if_due_locked()
            if self._meta_dirty:
                self._store_meta()

    def __repr__(self) -> str:
        return (
            f"DurableFileJournal({self.path!r}, policy={self.policy!r}, "
            f"entries={len(self._entries)}, fsyncs={self.fsync_count})"
        )


# ----------------------------------------------------------------- install


class _Options:
    __slots__ = ("batch_interval_s", "policy", "snapshot_file")

    def __init__(self, policy: str, batch_interval_s: float, snapshot_file: str | None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"fsync policy must be one of {POLICIES}, got {policy!r}")
        self.policy = policy
        self.batch_interval_s = batch_interval_s
        self.snapshot_file = snapshot_file


_install_lock = threading.Lock()
_registry: dict[str, _Options] = {}
_live: weakref.WeakValueDictionary[str, DurableFileJournal] = weakref.WeakValueDictionary()
_original_create_journal: Callable[..., Any] | None = None
_policy_for_path: Callable[[str], str | None] | None = None
_default_policy = "always"


def register_journal(
    path: str,
    policy: str = "always",
    *,
    batch_interval_s: float = DEFAULT_BATCH_INTERVAL_S,
    snapshot_file: str | None = None,
) -> None:
    """Set the fsync policy (and the snapshot file to fsync before compaction)
    for the journal at ``path``; used by the factory that :func:`install` sets."""
    opts = _Options(policy, batch_interval_s, snapshot_file)
    with _install_lock:
        _registry[os.path.abspath(path)] = opts


def unregister_journal(path: str) -> None:
    with _install_lock:
        _registry.pop(os.path.abspath(path), None)


def create_journal(journalFile: str | None = None) -> Any:
    """Drop-in for ``pysyncobj.journal.createJournal``."""
    if journalFile is None:
        return pysyncobj.journal.MemoryJournal()
    path = os.path.abspath(journalFile)
    with _install_lock:
        opts = _registry.get(path)
        chooser = _policy_for_path
        default = _default_policy
    if opts is None:
        policy = chooser(path) if chooser is not None else None
        opts = _Options(policy or default, DEFAULT_BATCH_INTERVAL_S, None)
    journal = DurableFileJournal(
        path, opts.policy, opts.batch_interval_s, snapshot_file=opts.snapshot_file
    )
    with _install_lock:
        _live[path] = journal
    return journal


def install(
    policy_for_path: Callable[[str], str | None] | None = None,
    *,
    default_policy: str = "always",
) -> None:
    """Make pysyncobj create :class:`DurableFileJournal` for ``journalFile``.

    Idempotent; a later call replaces ``policy_for_path`` and
    ``default_policy``. Registered paths (:func:`register_journal`) win over
    ``policy_for_path``, which wins over ``default_policy``.
    """
    global _original_create_journal, _policy_for_path, _default_policy
    if default_policy not in POLICIES:
        raise ValueError(f"fsync policy must be one of {POLICIES}, got {default_policy!r}")
    with _install_lock:
        _policy_for_path = policy_for_path
        _default_policy = default_policy
        if _original_create_journal is None:
            _original_create_journal = pysyncobj.syncobj.createJournal
            pysyncobj.syncobj.createJournal = create_journal


def uninstall() -> None:
    """Restore pysyncobj's own ``createJournal``."""
    global _original_create_journal, _policy_for_path, _default_policy
    with _install_lock:
        if _original_create_journal is not None:
            pysyncobj.syncobj.createJournal = _original_create_journal
            _original_create_journal = None
        _policy_for_path = None
        _default_policy = "always"


def is_installed() -> bool:
    return pysyncobj.syncobj.createJournal is create_journal


def journal_for(path: str) -> DurableFileJournal | None:
    """The live journal the installed factory created for ``path``, if any."""
    with _install_lock:
        return _live.get(os.path.abspath(path))


def attach_tick_sync(syncobj: Any, journal_file: str) -> bool:
    """Under ``batch``, also sync on every pysyncobj tick (``addOnTickCallback``),
    bounding unsynced data by the batch interval even when traffic stops.
    Returns whether a callback was added."""
    journal = journal_for(journal_file)
    if journal is None or journal.policy != "batch":
        return False
    syncobj.addOnTickCallback(journal.sync_if_due)
    return True
