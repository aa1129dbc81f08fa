"""Retention: whole segments deleted by age or size, never past the last stable
offset or the active segment; the log start offset survives a restart; the
producer state and aborted index forget what was deleted; config parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsm.errors import ErrorCode
from partition_log import codec
from partition_log.log import FsyncPolicy, OffsetOutOfRange, PartitionLogStore
from partition_log.partition import BatchSpec, Partition
from partition_log.producer_state import Verdict
from raftcoord.protocol.config import ConfigError, TopicRetention, parse_config
from tests.reserved import reserved

NOW_MS = 1_800_000_000_000
COORDINATORS = [{"id": 1, "grpc": "127.0.0.1:7101", "raft": ["127.0.0.1:7201"]}]


def batch(value: bytes = b"v" * 100, timestamp_ms: int = NOW_MS) -> bytearray:
    record = codec.RecordData(key=None, value=value, headers=(), timestamp_ms=timestamp_ms)
    return codec.encode_batch(
        [record], producer_id=-1, producer_epoch=-1, base_sequence=-1, transactional=False
    )


def store_with(path: Path, timestamps: list[int]) -> PartitionLogStore:
    """One batch per timestamp, three batches per segment."""
    size = len(batch())
    store = PartitionLogStore(path, segment_bytes=3 * size, fsync=FsyncPolicy.NEVER)
    for ts in timestamps:
        store.append(batch(timestamp_ms=ts))
    return store


def test_size_retention_deletes_whole_old_segments_never_the_active_one(tmp_path: Path) -> None:
    store = store_with(tmp_path / "t-0", [NOW_MS] * 10)  # segments 0, 3, 6, 9 (active)
    size = len(batch())
    assert store.segment_base_offsets == (0, 3, 6, 9)
    assert store.apply_retention(NOW_MS, -1, 7 * size, below_offset=10) == 1
    assert store.log_start_offset == 3
    assert store.apply_retention(NOW_MS, -1, 0, below_offset=10) == 2
    assert store.segment_base_offsets == (9,)  # the active segment stays
    assert not (tmp_path / "t-0" / f"{0:020d}.log").exists()
    assert not (tmp_path / "t-0" / f"{0:020d}.index").exists()
    with pytest.raises(OffsetOutOfRange):
        store.read(8, 1 << 20, 10)
    assert len(store.read(9, 1 << 20, 10)) == 1
    store.close()
    reopened = PartitionLogStore(tmp_path / "t-0", segment_bytes=3 * size)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (9, 10)
    reopened.close()


def test_time_retention_uses_the_largest_timestamp_of_a_segment(tmp_path: Path) -> None:
    hour = 3_600_000
    old, new = NOW_MS - 10 * hour, NOW_MS - hour
    # Segment 0 is old; segment 3 has one new record among old ones; 6 is active.
    store = store_with(tmp_path / "t-0", [old, old, old, old, new, old, old])
    assert store.apply_retention(NOW_MS, 5 * hour, -1, below_offset=7) == 1
    assert store.log_start_offset == 3
    assert store.apply_retention(NOW_MS, -1, -1, below_offset=7) == 0  # both rules off
    assert store.apply_retention(NOW_MS, hour // 2, -1, below_offset=7) == 1
    assert store.log_start_offset == 6
    store.close()


def test_nothing_at_or_above_the_bound_is_deleted(tmp_path: Path) -> None:
    store = store_with(tmp_path / "t-0", [NOW_MS] * 10)
    assert store.apply_retention(NOW_MS, -1, 0, below_offset=5) == 1  # segment 3 ends at 6
    assert store.log_start_offset == 3
    store.close()


def test_an_index_left_by_a_deletion_cut_short_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    store = store_with(path, [NOW_MS] * 10)
    store.close()
    (path / f"{0:020d}.log").unlink()  # a crash between deleting the log and its index
    reopened = PartitionLogStore(path, segment_bytes=3 * len(batch()))
    assert reopened.log_start_offset == 3
    assert not (path / f"{0:020d}.index").exists()
    reopened.close()


def open_partition(path: Path) -> Partition:
    return reserved(
        Partition(
            "t", 0, path, segment_bytes=600, index_interval_bytes=256, fsync=FsyncPolicy.NEVER
        )
    )


def send(part: Partition, pid: int, seq: int, txn: bool, epoch: int = 0) -> int:
    record = codec.RecordData(key=None, value=b"x" * 100, headers=(), timestamp_ms=NOW_MS)
    encoded = codec.encode_batch(
        [record], producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=txn
    )
    check = part.append(BatchSpec(pid, epoch, seq, 1, txn), encoded, verified=True)
    assert check.ok and check.verdict is Verdict.APPEND, check
    return check.base_offset


def test_partition_retention_stops_at_the_lso_and_trims_the_state(tmp_path: Path) -> None:
    part = open_partition(tmp_path / "t-0")
    send(part, 1, 0, txn=True)  # offset 0: producer 1's transaction, aborted below
    send(part, 2, 0, txn=False)  # offset 1: producer 2, nothing more from it
    assert part.write_marker(1, 1, 1, False, NOW_MS) == (ErrorCode.NONE, "")  # offset 2
    send(part, 5, 0, txn=False)  # offset 3: producer 5, nothing more from it
    send(part, 3, 0, txn=True)  # offset 4: producer 3's transaction stays open
    for seq in range(8):
        send(part, 4, seq, txn=False)  # offsets 5..12
    bases = part.store.segment_base_offsets
    assert len(bases) > 3 and bases[1] == 4

    assert part.apply_retention(NOW_MS, -1, 0) == 1  # the open transaction pins the rest
    assert part.store.log_start_offset == bases[1]
    assert part.states.aborted == []
    assert set(part.states.producers) == {3, 4}  # 1, 2, 5 had nothing left; 3 is open
    assert part.offsets()[1] == 4  # the LSO
    assert part.fetch(0, 1 << 20, False).error is ErrorCode.OFFSET_OUT_OF_RANGE

    assert part.write_marker(3, 1, 1, True, NOW_MS) == (ErrorCode.NONE, "")
    assert part.apply_retention(NOW_MS, -1, 0) >= 1
    start = part.store.log_start_offset
    assert start > 4
    # Producer 4's last batches are still deduplicated.
    record = codec.RecordData(key=None, value=b"x" * 100, headers=(), timestamp_ms=NOW_MS)
    retry = codec.encode_batch(
        [record], producer_id=4, producer_epoch=0, base_sequence=7, transactional=False
    )
    check = part.append(BatchSpec(4, 0, 7, 1, False), retry, verified=True)
    assert (check.verdict, check.base_offset) == (Verdict.DUPLICATE, 12)
    state = part.states.snapshot()
    part.close()

    reopened = open_partition(tmp_path / "t-0")
    assert reopened.store.log_start_offset == start
    assert reopened.states.snapshot() == state
    assert all(o >= start for o in reopened.store.snapshot_offsets())
    reopened.close()


def test_retention_config_defaults_overrides_and_bad_values() -> None:
    config = parse_config({"coordinators": COORDINATORS, "shard_count": 1})
    assert config.retention("any") == TopicRetention(604_800_000, -1)
    assert config.settings.log_retention_check_interval_ms == 300_000
    config = parse_config(
        {
            "shard_count": 1,
            "coordinators": COORDINATORS,
            "settings": {"log.retention.ms": -1, "log.retention.bytes": 1 << 30},
            "topic_config": {"events": {"retention.ms": 60_000}},
        }
    )
    assert config.retention("events") == TopicRetention(60_000, 1 << 30)
    assert config.retention("other") == TopicRetention(-1, 1 << 30)
    bad: list[dict[str, object]] = [
        {"settings": {"log.retention.bytes": -2}},
        {"settings": {"log.retention.ms": 0}},
        {"settings": {"log.retention.check.interval.ms": -1}},
        {"topic_config": {"events": {"retention.ms": 0}}},
        {"topic_config": {"events": {"segment.bytes": 10}}},
        {"topic_config": {"bad topic": {"retention.ms": 10}}},
        {"topic_config": {"events": 5}},
    ]
    for extra in bad:
        with pytest.raises(ConfigError):
            parse_config({"shard_count": 1, "coordinators": COORDINATORS, **extra})
