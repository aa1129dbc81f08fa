"""A partition's reserved offsets (Partition.grant): when it continues above
every offset handed out before, and that the reason survives a restart
before the coordinators answered."""

from __future__ import annotations

from pathlib import Path

from partition_log import codec
from partition_log.log import FsyncPolicy
from partition_log.partition import BatchSpec, Partition

BIG = 1 << 40


def open_partition(path: Path, *, clean_start: bool = True) -> Partition:
    """The partition opened and led here, as a node's lookup leaves it."""
    part = Partition(
        "t",
        0,
        path,
        segment_bytes=1 << 20,
        index_interval_bytes=256,
        fsync=FsyncPolicy.ALWAYS,
        clean_start=clean_start,
    )
    assert part.lead(part.leader_epoch)
    return part


def send(part: Partition, pid: int, seq: int) -> int:
    record = codec.RecordData(key=None, value=b"v", headers=(), timestamp_ms=1)
    batch = codec.encode_batch(
        [record], producer_id=pid, producer_epoch=0, base_sequence=seq, transactional=False
    )
    check = part.append(BatchSpec(pid, 0, seq, 1, False), batch, verified=True)
    assert check.ok, check
    return check.base_offset


def test_nothing_is_appended_before_the_first_grant(tmp_path: Path) -> None:
    part = open_partition(tmp_path / "t-0")
    record = codec.RecordData(key=None, value=b"v", headers=(), timestamp_ms=1)
    batch = codec.encode_batch(
        [record], producer_id=-1, producer_epoch=-1, base_sequence=-1, transactional=False
    )
    check = part.append(BatchSpec(-1, -1, -1, 1, False), batch, verified=True)
    assert not check.ok and "not reserved" in check.message
    part.close()


def test_a_new_directory_restarted_before_its_first_grant_still_skips(tmp_path: Path) -> None:
    """A replaced disk: the partition's directory is new, and the node stops
    (cleanly) before the coordinators answered. The next start must still
    know the log may lack what was handed out before."""
    part = open_partition(tmp_path / "t-0")
    assert part.may_have_lost and part.store.unsettled
    part.close()
    again = open_partition(tmp_path / "t-0", clean_start=True)
    assert again.may_have_lost  # from the mark on disk, not from the start
    assert again.grant(previous=5_000, ceiling=6_000) == 0
    assert send(again, 7, 0) == 5_000
    assert not again.store.unsettled
    again.close()
    third = open_partition(tmp_path / "t-0")
    assert not third.may_have_lost
    assert third.grant(previous=6_000, ceiling=7_000) is None
    assert send(third, 7, 1) == 5_001  # the producer's sequence state was kept
    third.close()


def test_a_new_partition_with_nothing_reserved_before_skips_nothing(tmp_path: Path) -> None:
    part = open_partition(tmp_path / "t-0")
    assert part.grant(previous=0, ceiling=BIG) is None
    assert send(part, 7, 0) == 0
    assert part.check_markers_until is None  # an empty log has no transaction to check
    part.close()


def test_an_accepted_directory_continues_above_the_ceiling_though_its_log_is_whole(
    tmp_path: Path,
) -> None:
    """An old disk put back and accepted: its log is intact but behind."""
    part = open_partition(tmp_path / "t-0")
    part.grant(previous=0, ceiling=BIG)
    for seq in range(3):
        send(part, 7, seq)
    part.close()
    old = open_partition(tmp_path / "t-0")
    assert not old.may_have_lost
    old.assume_lost()
    assert old.grant(previous=100, ceiling=BIG) == 3
    assert send(old, 8, 0) == 100
    assert old.check_markers_until is not None  # its open transactions are checked
    old.close()
