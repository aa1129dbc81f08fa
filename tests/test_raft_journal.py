"""raftcoord.coordinator.raft_journal: a durable pysyncobj journal with an fsync policy.

Long on purpose: the cases of one component, sharing this module's helpers
and fixtures.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObj, journal, replicated, syncobj

from raftcoord.cluster.launcher import free_ports
from raftcoord.coordinator import raft_journal
from raftcoord.coordinator.raft import raft_conf
from raftcoord.coordinator.raft_journal import DurableFileJournal

ROOT = Path(__file__).resolve().parents[1]
HEADER = raft_journal.HEADER_SIZE


def cmd(i: int) -> bytes:
    return b"command-%d-" % i + bytes([i % 256]) * (i % 7)


def record_size(command: bytes) -> int:
    return 4 + 16 + len(command) + 4 + 4  # n, idx, term, command, crc32c, n


def read_back(path: Path) -> tuple[list[Any], int, Any, int]:
    """What a fresh open of the journal sees."""
    j = DurableFileJournal(str(path), "never")
    try:
        entries = [(bytes(c), i, t) for c, i, t in j[:]]
        return entries, j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex()
    finally:
        j._destroy()


def last_record_offset(path: Path) -> int:
    with open(path, "rb") as f:
        f.seek(journal.LAST_RECORD_OFFSET_OFFSET)
        value: int = struct.unpack("<I", f.read(4))[0]
        return value


def fill(j: Any, n: int, first_idx: int = 1, term: int = 1) -> list[tuple[bytes, int, int]]:
    entries = [(cmd(i), first_idx + i, term) for i in range(n)]
    for e in entries:
        j.add(*e)
    return entries


# ------------------------------------------------------------ round trips


def test_entries_term_vote_and_commit_index_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    j = DurableFileJournal(str(path))
    assert len(j) == 0 and j.getCurrentTerm() == 0 and j.getVotedForNodeId() is None
    entries = fill(j, 50)
    j.setCurrentTerm(3, "127.0.0.1:4321")
    j.setRaftCommitIndex(40)
    j.onOneSecondTimer()
    j._destroy()

    again = DurableFileJournal(str(path))
    try:
        assert again[:] == entries
        assert again[0] == entries[0] and again[-1] == entries[-1]
        assert len(again) == 50
        assert again.getCurrentTerm() == 3
        assert again.getVotedForNodeId() == "127.0.0.1:4321"
        assert again.getRaftCommitIndex() == 40
    finally:
        again._destroy()

    assert read_back(path) == (entries, 3, "127.0.0.1:4321", 40)


def test_commit_index_is_stored_on_close_even_without_timer(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    j = DurableFileJournal(str(path))
    fill(j, 5)
    j.setRaftCommitIndex(4)
    j._destroy()
    j._destroy()  # idempotent
    again = DurableFileJournal(str(path))
    assert again.getRaftCommitIndex() == 4
    again._destroy()


def _apply(op: str, arg: int, journals: list[Any]) -> None:
    for j in journals:
        if op == "add":
            j.add(cmd(arg), arg, 2)
        elif op == "from":
            j.deleteEntriesFrom(arg)
        elif op == "to":
            j.deleteEntriesTo(arg)
        elif op == "clear":
            j.clear()


@pytest.mark.parametrize("policy", raft_journal.POLICIES)
@pytest.mark.parametrize(
    "ops",
    [
        [("from", 7)],
        [("from", 0)],
        [("from", 99)],
        [("to", 4)],
        [("to", 0)],
        [("to", 10)],
        [("clear", 0)],
        [("from", 6), ("add", 7), ("add", 8), ("to", 3), ("add", 9)],
        [("to", 5), ("from", 2), ("add", 8), ("clear", 0), ("add", 1), ("add", 2)],
    ],
    ids=repr,
)
def test_deletions_and_clear_match_memory_journal(
    tmp_path: Path, policy: str, ops: list[tuple[str, int]]
) -> None:
    path = tmp_path / "journal"
    model = journal.MemoryJournal()
    j = DurableFileJournal(str(path), policy)
    for e in fill(j, 10):
        model.add(*e)
    for op, arg in ops:
        _apply(op, arg, [j, model])
        assert j[:] == model[:]
    j.setCurrentTerm(5, None)
    j._destroy()

    expected = list(model[:])
    again = DurableFileJournal(str(path), policy)
    try:
        assert again[:] == expected
        assert again.getCurrentTerm() == 5 and again.getVotedForNodeId() is None
        assert again.dropped_tail_bytes == 0
    finally:
        again._destroy()
    entries, term, voted, _ = read_back(path)
    assert entries == expected and term == 5 and voted is None


def test_a_journal_written_by_pysyncobj_is_refused_by_name(tmp_path: Path) -> None:
    """pysyncobj's format 1 has no checksums (and the coordinators' entries
    were pickles then): a clear refusal, not a misread."""
    path = tmp_path / "journal"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        old = journal.FileJournal(str(path))
        fill(old, 3)
        old._destroy()
    with pytest.raises(raft_journal.JournalCorruptError, match="journal format 1"):
        DurableFileJournal(str(path))


def test_str_commands_are_stored_as_utf8_like_pysyncobj(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    j = DurableFileJournal(str(path))
    j.add("héllo", 1, 1)
    j._destroy()
    again = DurableFileJournal(str(path))
    assert again[0] == ("héllo".encode(), 1, 1)
    again._destroy()


def test_rejects_foreign_file_and_bad_policy(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    path.write_bytes(b"definitely not a journal, but long enough for a header")
    with pytest.raises(raft_journal.JournalCorruptError):
        DurableFileJournal(str(path))
    with pytest.raises(ValueError):
        DurableFileJournal(str(tmp_path / "other"), "sometimes")


def test_unreadable_meta_refuses_to_forget_the_vote(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    DurableFileJournal(str(path))._destroy()
    Path(str(path) + ".meta").write_bytes(b"")  # e.g. an unsynced rename after power loss
    with pytest.raises(raft_journal.JournalCorruptError):
        DurableFileJournal(str(path))
    never = DurableFileJournal(str(path), "never")  # pysyncobj's behaviour: start blank
    assert never.getCurrentTerm() == 0
    never._destroy()


# --------------------------------------------------------------- policies


def test_policy_always_syncs_every_change(tmp_path: Path) -> None:
    j = DurableFileJournal(str(tmp_path / "journal"), "always")
    try:
        total0, fs0 = raft_journal.fsync_total(), j.fsync_count
        for i in range(1, 21):
            j.add(cmd(i), i, 1)
            assert j.entry_sync_count == i
        assert j.fsync_count - fs0 == 20
        assert raft_journal.fsync_total() - total0 == 20

        before, metas = j.fsync_count, j.meta_sync_count
        j.setCurrentTerm(2, "x")  # meta file + its directory
        assert j.fsync_count - before == 2 and j.meta_sync_count == metas + 1

        ops: list[Callable[[], None]] = [
            lambda: j.deleteEntriesFrom(15),
            lambda: j.deleteEntriesTo(3),
            j.clear,
        ]
        for op in ops:
            syncs = j.entry_sync_count
            op()
            assert j.entry_sync_count == syncs + 1

        before = j.fsync_count
        j.onOneSecondTimer()  # nothing pending
        assert j.fsync_count == before
    finally:
        j._destroy()


def test_policy_never_does_not_fsync(tmp_path: Path) -> None:
    total0 = raft_journal.fsync_total()
    j = DurableFileJournal(str(tmp_path / "journal"), "never")
    fill(j, 20)
    j.setCurrentTerm(2, "x")
    j.deleteEntriesFrom(15)
    j.deleteEntriesTo(3)
    j.setRaftCommitIndex(5)
    j.onOneSecondTimer()
    j.clear()
    j._destroy()
    assert j.fsync_count == 0 and j.entry_sync_count == 0 and j.meta_sync_count == 0
    assert raft_journal.fsync_total() == total0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_policy_batch_syncs_at_most_once_per_interval(tmp_path: Path) -> None:
    clock = FakeClock()
    j = DurableFileJournal(str(tmp_path / "journal"), "batch", batch_interval_s=60.0, clock=clock)
    try:
        fill(j, 100)
        assert j.entry_sync_count == 0  # a burst inside one interval: no sync yet
        assert j.sync_if_due() is False

        clock.now += 60.0
        assert j.sync_if_due() is True
        assert j.entry_sync_count == 1
        assert j.sync_if_due() is False  # nothing dirty

        clock.now += 60.0
        fill(j, 100, first_idx=101)  # the first add after the interval syncs, the rest wait
        assert j.entry_sync_count == 2

        clock.now += 60.0
        j.onOneSecondTimer()  # pysyncobj's timer is a sync trigger too
        assert j.entry_sync_count == 3

        # Term and vote are synced before returning, whatever the entry policy.
        before = j.meta_sync_count
        j.setCurrentTerm(4, "y")
        assert j.meta_sync_count == before + 1

        j.add(cmd(0), 201, 4)
        syncs = j.entry_sync_count
        j.flush()  # explicit sync
        assert j.entry_sync_count == syncs + 1
    finally:
        j._destroy()
    again = DurableFileJournal(str(tmp_path / "journal"), "never")
    assert len(again) == 201
    again._destroy()


def test_batch_meta_store_syncs_pending_entries_first(tmp_path: Path) -> None:
    clock = FakeClock()
    j = DurableFileJournal(str(tmp_path / "journal"), "batch", batch_interval_s=60.0, clock=clock)
    try:
        fill(j, 10)
        j.setRaftCommitIndex(10)
        j.onOneSecondTimer()  # interval not over, but the commit index must not outrun the log
        # (and the meta file written when the journal was created)
        assert j.entry_sync_count == 1 and j.meta_sync_count == 2
    finally:
        j._destroy()


def test_snapshot_file_is_fsynced_before_compaction(tmp_path: Path) -> None:
    snap = tmp_path / "dump"
    snap.write_bytes(b"snapshot")
    j = DurableFileJournal(str(tmp_path / "journal"), snapshot_file=str(snap))
    try:
        fill(j, 10)
        before = j.fsync_count
        j.deleteEntriesTo(5)
        # tmp journal + snapshot + snapshot dir + journal dir
        assert j.fsync_count - before == 4
        assert [e[1] for e in j[:]] == [6, 7, 8, 9, 10]
    finally:
        j._destroy()


# ------------------------------------------------------------- kill -9


@pytest.mark.parametrize("policy", raft_journal.POLICIES)
def test_kill_minus_nine_loses_nothing(tmp_path: Path, policy: str) -> None:
    path = tmp_path / "journal"
    n = 300
    script = textwrap.dedent(
        f"""
        import os, signal
        from raftcoord.coordinator.raft_journal import DurableFileJournal
        j = DurableFileJournal({str(path)!r}, {policy!r}, batch_interval_s=3600.0)
        for i in range(1, {n} + 1):
            j.add(b"entry-%d" % i, i, 1 + i // 100)
        j.deleteEntriesFrom({n} - 10)
        for i in range({n} - 9, {n} + 1):
            j.add(b"again-%d" % i, i, 7)
        j.setCurrentTerm(7, "me:1")
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()

    j = DurableFileJournal(str(path))
    try:
        assert len(j) == n
        assert j[0] == (b"entry-1", 1, 1)
        assert j[n - 11] == (b"entry-%d" % (n - 10), n - 10, 1 + (n - 10) // 100)
        assert j[n - 1] == (b"again-%d" % n, n, 7)
        assert j.getCurrentTerm() == 7 and j.getVotedForNodeId() == "me:1"
        assert j.dropped_tail_bytes == 0
    finally:
        j._destroy()


# ------------------------------------------------------------ torn tails


def _write_five(path: Path) -> list[tuple[bytes, int, int]]:
    j = DurableFileJournal(str(path))
    entries = fill(j, 5)
    j.setCurrentTerm(1, None)
    j._destroy()
    return entries


def test_file_truncated_inside_last_record_drops_only_that_record(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    entries = _write_five(path)
    last_start = HEADER + sum(record_size(c) for c, _, _ in entries[:4])
    assert last_record_offset(path) == last_start + record_size(entries[4][0])
    os.truncate(path, last_start + 10)  # the header still points past the end

    j = DurableFileJournal(str(path))
    try:
        assert j[:] == entries[:4]
        assert j.dropped_tail_bytes == record_size(entries[4][0])
        assert last_record_offset(path) == last_start  # header repaired on open
        j.add(b"replacement", 5, 2)
    finally:
        j._destroy()
    assert read_back(path)[0] == [*entries[:4], (b"replacement", 5, 2)]


def _flip(path: Path, offset: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


@pytest.mark.parametrize("where", ["command", "term", "length", "checksum"])
def test_a_flipped_bit_before_the_last_record_stops_the_journal(tmp_path: Path, where: str) -> None:
    """One bit of record 3 of 5 (its command, term, length or checksum):
    never loaded as a different entry, never dropped with the two fsynced
    records after it; the error names the damage and the repair."""
    path = tmp_path / "journal"
    entries = _write_five(path)
    start = HEADER + sum(record_size(c) for c, _, _ in entries[:2])
    offset = {
        "length": start,
        "term": start + 4 + 8,
        "command": start + 20 + 3,
        "checksum": start + 20 + len(entries[2][0]),
    }[where]
    _flip(path, offset)
    with pytest.raises(raft_journal.JournalCorruptError, match="damaged, not torn") as raised:
        DurableFileJournal(str(path))
    assert "repair-shard" in str(raised.value)


@pytest.mark.parametrize("where", ["command", "term", "length", "checksum", "trailer"])
def test_a_flipped_bit_in_the_last_record_stops_the_journal(tmp_path: Path, where: str) -> None:
    """Under always the last record was fsynced in full before it could be
    acknowledged: a bit of it flipped (even its length, which then points
    past the log's end) is damage, never a torn tail to drop."""
    path = tmp_path / "journal"
    entries = _write_five(path)
    start = HEADER + sum(record_size(c) for c, _, _ in entries[:4])
    offset = {
        "length": start + 3,
        "term": start + 4 + 8,
        "command": start + 20 + 1,
        "checksum": start + 20 + len(entries[4][0]),
        "trailer": start + record_size(entries[4][0]) - 1,
    }[where]
    _flip(path, offset, 0x10)
    with pytest.raises(raft_journal.JournalCorruptError, match="damaged, not torn") as raised:
        DurableFileJournal(str(path))
    assert "the last record" in str(raised.value) and "repair-shard" in str(raised.value)
    j = DurableFileJournal(str(path), "batch")  # what batch risks anyway: dropped
    try:
        assert j[:] == entries[:4]
    finally:
        j._destroy()


@pytest.mark.parametrize("bit", [0x01, 0x02, 0x10, 0x80])
@pytest.mark.parametrize("byte", [0, 1, 2, 3])
def test_a_flipped_bit_in_the_header_offset_stops_the_journal(
    tmp_path: Path, byte: int, bit: int
) -> None:
    """The header's last-record offset is covered by its checksum: a flipped
    bit there neither drops acknowledged records nor reads garbage as records,
    whatever the policy."""
    path = tmp_path / "journal"
    _write_five(path)
    _flip(path, journal.LAST_RECORD_OFFSET_OFFSET + byte, bit)
    for policy in raft_journal.POLICIES:
        with pytest.raises(raft_journal.JournalCorruptError, match="header fails its checksum"):
            DurableFileJournal(str(path), policy)


def test_a_blank_header_before_records_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    _write_five(path)
    with open(path, "r+b") as f:
        f.write(bytes(HEADER))
    with pytest.raises(raft_journal.JournalCorruptError, match="header is blank"):
        DurableFileJournal(str(path))


def test_a_journal_of_format_2_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    _write_five(path)
    with open(path, "r+b") as f:
        f.seek(journal.LAST_RECORD_OFFSET_OFFSET - 4)
        f.write(struct.pack("<I", 2))
    with pytest.raises(raft_journal.JournalCorruptError, match="journal format 2"):
        DurableFileJournal(str(path))


@pytest.mark.parametrize("entries", [0, 5])
def test_a_missing_meta_file_beside_a_journal_is_refused(tmp_path: Path, entries: int) -> None:
    """The term/vote file is written before the journal is created: a journal
    found without it (even one without records: its node may have voted) has
    lost its vote, and starting would risk a second vote in that term."""
    path = tmp_path / "journal"
    j = DurableFileJournal(str(path))
    assert Path(str(path) + ".meta").exists()
    fill(j, entries)
    j._destroy()
    Path(str(path) + ".meta").unlink()
    with pytest.raises(raft_journal.JournalCorruptError, match="missing beside its journal"):
        DurableFileJournal(str(path))
    never = DurableFileJournal(str(path), "never")  # pysyncobj's behaviour: start blank
    assert never.getCurrentTerm() == 0 and len(never) == entries
    never._destroy()


def test_a_repaired_journal_keeps_its_meta_file(tmp_path: Path) -> None:
    """A journal set aside (repair) with its term/vote file kept: the new
    journal starts with the term and vote it had."""
    path = tmp_path / "journal"
    j = DurableFileJournal(str(path))
    fill(j, 3)
    j.setCurrentTerm(4, "peer:1")
    j._destroy()
    path.rename(tmp_path / "journal.damaged")
    again = DurableFileJournal(str(path))
    try:
        assert len(again) == 0
        assert again.getCurrentTerm() == 4 and again.getVotedForNodeId() == "peer:1"
    finally:
        again._destroy()


def test_a_flipped_bit_under_batch_drops_the_tail_from_there(tmp_path: Path) -> None:
    """Under batch several unsynced records can be torn in any order: the
    log ends at the first bad record (what batch may lose on power loss)."""
    path = tmp_path / "journal"
    entries = _write_five(path)
    _flip(path, HEADER + record_size(entries[0][0]) + 20)
    j = DurableFileJournal(str(path), "batch")
    try:
        assert j[:] == entries[:1]
    finally:
        j._destroy()


def test_a_flipped_meta_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    _write_five(path)
    meta = Path(str(path) + ".meta")
    _flip(meta, len(meta.read_bytes()) // 2)
    with pytest.raises(raft_journal.JournalCorruptError, match="term/vote"):
        DurableFileJournal(str(path))


def test_garbage_after_last_record_offset_is_ignored_and_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    entries = _write_five(path)
    end = last_record_offset(path)
    with open(path, "r+b") as f:
        f.seek(end)
        f.write(b"\xff" * 500)

    j = DurableFileJournal(str(path))
    try:
        assert j[:] == entries and j.dropped_tail_bytes == 0
        j.add(b"six", 6, 1)
    finally:
        j._destroy()
    again = DurableFileJournal(str(path))
    assert again[:] == [*entries, (b"six", 6, 1)]
    again._destroy()


@pytest.mark.parametrize("policy", raft_journal.POLICIES)
@pytest.mark.parametrize("written", ["none", "zeroed", "cut"])
def test_a_last_record_never_fully_written_is_dropped(
    tmp_path: Path, policy: str, written: str
) -> None:
    """What a power loss can leave under any policy when the header reached
    the disk but the record's bytes did not: zeros (the file is grown and cut
    to zeros), or a file that ends before the header's offset."""
    path = tmp_path / "journal"
    entries = _write_five(path)
    last_start = HEADER + sum(record_size(c) for c, _, _ in entries[:4])
    size = record_size(entries[4][0])
    if written == "cut":
        os.truncate(path, last_start + size - 1)
    else:
        with open(path, "r+b") as f:
            f.seek(last_start)
            f.write(bytes(size if written == "zeroed" else 1))
            if written == "none":  # the length's first byte zero, the rest intact
                f.seek(last_start + 4)
                f.write(bytes(size - 4))
    j = DurableFileJournal(str(path), policy)
    try:
        assert j[:] == entries[:4]
        assert j.dropped_tail_bytes == size
    finally:
        j._destroy()


@pytest.mark.parametrize("damage", ["bad-trailer", "stale-index", "length-past-offset"])
def test_a_complete_last_record_that_fails_is_dropped_only_under_batch(
    tmp_path: Path, damage: str
) -> None:
    path = tmp_path / "journal"
    entries = _write_five(path)
    last_start = HEADER + sum(record_size(c) for c, _, _ in entries[:4])
    size = record_size(entries[4][0])
    with open(path, "r+b") as f:
        if damage == "bad-trailer":
            f.seek(last_start + size - 4)
            f.write(struct.pack("<I", 12345))
        elif damage == "stale-index":
            f.seek(last_start + 4)
            f.write(struct.pack("<Q", 77))
        else:
            f.seek(last_start)
            f.write(struct.pack("<I", 10_000))
    with pytest.raises(raft_journal.JournalCorruptError, match="damaged, not torn"):
        DurableFileJournal(str(path))
    j = DurableFileJournal(str(path), "batch")
    try:
        assert j[:] == entries[:4]
        assert j.dropped_tail_bytes == size
    finally:
        j._destroy()


def test_truncations_leave_zeros_past_the_log(tmp_path: Path) -> None:
    """deleteEntriesFrom and clear cut the file at the log's end, so a record
    written there later and cut short reads back as never written."""
    path = tmp_path / "journal"
    j = DurableFileJournal(str(path))
    entries = fill(j, 10)
    j.deleteEntriesFrom(6)
    assert path.stat().st_size == last_record_offset(path)
    j.add(b"x" * 600, 7, 2)
    j._destroy()
    end = last_record_offset(path)
    # the new record's write was cut after its first bytes (a power loss)
    with open(path, "r+b") as f:
        start = end - record_size(b"x" * 600)
        f.seek(start + 20)
        f.write(bytes(end - start - 20))
    with pytest.raises(raft_journal.JournalCorruptError):
        DurableFileJournal(str(path))  # partly written: not zeros throughout
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(bytes(20))
    again = DurableFileJournal(str(path))
    try:
        assert again[:] == entries[:6]
        again.clear()
        assert path.stat().st_size == HEADER
    finally:
        again._destroy()


def test_empty_or_zero_header_file_opens_as_empty_journal(tmp_path: Path) -> None:
    for content in (b"", bytes(100), journal.APP_NAME[:5]):
        path = tmp_path / f"journal-{len(content)}"
        path.write_bytes(content)
        j = DurableFileJournal(str(path))
        assert len(j) == 0
        j.add(b"x", 1, 1)
        j._destroy()
        assert read_back(path)[0] == [(b"x", 1, 1)]


# -------------------------------------------------------------- install


@pytest.fixture
def installed() -> Iterator[None]:
    original = syncobj.createJournal
    raft_journal.install()
    try:
        yield
    finally:
        raft_journal.uninstall()
        raft_journal._registry.clear()
        assert syncobj.createJournal is original


def test_install_is_idempotent_and_routes_policies(installed: None, tmp_path: Path) -> None:
    raft_journal.install()  # again: still one wrapper, original kept for uninstall
    assert raft_journal.is_installed()
    assert isinstance(syncobj.createJournal(None), journal.MemoryJournal)

    raft_journal.register_journal(str(tmp_path / "a"), "batch", batch_interval_s=0.5)
    a = syncobj.createJournal(str(tmp_path / "a"))
    b = syncobj.createJournal(str(tmp_path / "b"))
    try:
        assert isinstance(a, DurableFileJournal) and a.policy == "batch"
        assert a.batch_interval_s == 0.5
        assert isinstance(b, DurableFileJournal) and b.policy == "always"
        assert raft_journal.journal_for(str(tmp_path / "a")) is a
    finally:
        a._destroy()
        b._destroy()

    raft_journal.install(lambda p: "never" if p.endswith("c") else None)
    c = syncobj.createJournal(str(tmp_path / "c"))
    d = syncobj.createJournal(str(tmp_path / "d"))
    try:
        assert c.policy == "never" and d.policy == "always"
    finally:
        c._destroy()
        d._destroy()


# ------------------------------------------------------------ real Raft


class Counter(SyncObj):  # type: ignore[misc]
    def __init__(self, self_addr: str, others: list[str], conf: Any) -> None:
        super().__init__(self_addr, others, conf)
        self._value = 0

    @replicated  # type: ignore[untyped-decorator]
    def add(self, n: int) -> int:
        self._value += n
        return self._value

    def value(self) -> int:
        return self._value


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def start_cluster(tmp_path: Path, addrs: list[str]) -> list[Counter]:
    nodes: list[Counter] = []
    for i, addr in enumerate(addrs):
        conf = raft_conf(
            0.005,
            (0.3, 0.6),
            str(tmp_path / f"node{i}.journal"),
            str(tmp_path / f"node{i}.dump"),
            auto_tick_s=0.002,
            bind_retry_s=0.05,
            connection_retry_s=0.05,
            commands_wait_leader=True,
        )
        nodes.append(Counter(addr, [a for a in addrs if a != addr], conf))
    return nodes


def stop_cluster(nodes: list[Counter]) -> None:
    for node in nodes:
        node.destroy()
    for node in nodes:
        node.destroy_synchronous()


@pytest.mark.slow
def test_pysyncobj_cluster_recovers_counter_from_durable_journals(
    installed: None, tmp_path: Path
) -> None:
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    for i in range(3):
        raft_journal.register_journal(
            str(tmp_path / f"node{i}.journal"),
            "always",
            snapshot_file=str(tmp_path / f"node{i}.dump"),
        )

    nodes = start_cluster(tmp_path, addrs)
    try:
        wait_until(lambda: all(n._getLeader() is not None for n in nodes), 8, "a leader")
        for i in range(1, 21):
            assert nodes[i % 3].add(i, sync=True, timeout=5) is not None
        expected = sum(range(1, 21))
        wait_until(lambda: all(n.value() == expected for n in nodes), 5, "replication")
        journals = [raft_journal.journal_for(str(tmp_path / f"node{i}.journal")) for i in range(3)]
        assert all(isinstance(j, DurableFileJournal) for j in journals)
        assert all(j is not None and j.entry_sync_count >= 20 for j in journals)
        assert all(j is not None and j.meta_sync_count >= 1 for j in journals)
    finally:
        stop_cluster(nodes)

    # No snapshot was taken (no compaction yet): the state can only come from the journals.
    assert not any((tmp_path / f"node{i}.dump").exists() for i in range(3))
    nodes = start_cluster(tmp_path, addrs)
    try:
        wait_until(lambda: all(n.value() == expected for n in nodes), 8, "the counter restored")
        assert nodes[0].add(1, sync=True, timeout=5) == expected + 1
    finally:
        stop_cluster(nodes)


def test_the_same_commit_index_again_is_not_stored_again(tmp_path: Path) -> None:
    """A follower hears the commit index with every heartbeat: only a new
    value rewrites the meta file (a file, a rename and two fsyncs)."""
    j = DurableFileJournal(str(tmp_path / "journal"), "always")
    try:
        fill(j, 10)
        j.setRaftCommitIndex(10)
        j.onOneSecondTimer()
        assert j.meta_sync_count == 2  # and the one of its creation
        for _ in range(3):
            j.setRaftCommitIndex(10)
            j.onOneSecondTimer()
        assert j.meta_sync_count == 2  # and the one of its creation
        j.setRaftCommitIndex(9)  # a new value, even a lower one, is stored
        j.onOneSecondTimer()
        assert j.meta_sync_count == 3 and j.getRaftCommitIndex() == 9
    finally:
        j._destroy()
