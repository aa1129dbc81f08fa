"""The partition log's storage layer: RecordBatch v2 codec, segments, index, recovery, fsync.

kafka-python is imported inside the tests that use its reader directly: importing it
first thing warns (legacy importlib.resources calls), and ``partition_log.codec``
imports it with those warnings silenced.

Long on purpose: the cases of one component, sharing this module's helpers
and fixtures.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_log import log as log_module
from partition_log.codec import (
    HEADER_SIZE,
    CorruptBatch,
    InvalidRecord,
    RecordData,
    StoredRecord,
    control_is_commit,
    crc_ok,
    encode_batch,
    encode_control_batch,
    parse_header,
    read_batch,
    read_marker,
    set_base_offset,
    set_partition_leader_epoch,
)
from partition_log.log import (
    CorruptLog,
    FsyncPolicy,
    LogFlusher,
    OffsetOutOfRange,
    PartitionLogStore,
    StoreFailed,
)

ROOT = Path(__file__).resolve().parents[1]
BIG = 1 << 30


def data_batch(label: str, n: int = 1, *, pad: int = 0) -> bytearray:
    """A non-transactional batch of ``n`` records whose values say ``label`` and their index."""
    records = [
        RecordData(None, f"{label}:{i}".encode() + b"x" * pad, (), 1_000 + i) for i in range(n)
    ]
    return encode_batch(
        records, producer_id=-1, producer_epoch=-1, base_sequence=-1, transactional=False
    )


def values(batches: list[bytes]) -> list[bytes | None]:
    return [r.value for b in batches for r in read_batch(b)]


def offsets(batches: list[bytes]) -> list[int]:
    return [r.offset for b in batches for r in read_batch(b)]


def fill(store: PartitionLogStore, count: int, n: int = 1, pad: int = 0) -> list[int]:
    return [store.append(data_batch(f"b{i}", n, pad=pad)) for i in range(count)]


def segment_files(directory: Path, suffix: str) -> list[Path]:
    return sorted(directory.glob(f"*{suffix}"))


# -- codec ---------------------------------------------------------------------------------------


def test_codec_round_trip_keeps_null_and_empty_apart() -> None:
    records = [
        RecordData(None, b"v0", (), 10),
        RecordData(b"", None, (("h", b"1"), ("h", b"2")), 12),
        RecordData(b"k", b"", (("", b""),), 5),
        RecordData(b"\x00" * 300, b"\xff" * 70_000, (("\u00e9t\u00e9", b"\x00"),), 2**41),
    ]
    batch = encode_batch(
        records, producer_id=7, producer_epoch=3, base_sequence=40, transactional=False
    )
    set_base_offset(batch, 1_000)
    assert crc_ok(batch)
    got = read_batch(bytes(batch))
    assert got == [
        StoredRecord(1_000 + i, r.timestamp_ms, r.key, r.value, r.headers)
        for i, r in enumerate(records)
    ]
    header = parse_header(batch)
    assert header.base_offset == 1_000
    assert header.size == len(batch)
    assert (header.last_offset, header.next_offset, header.record_count) == (1_003, 1_004, 4)
    assert (header.first_timestamp, header.max_timestamp) == (10, 2**41)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 3, 40)
    assert header.last_sequence == 43
    assert not header.is_transactional and not header.is_control


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.builds(
            RecordData,
            st.none() | st.binary(max_size=40),
            st.none() | st.binary(max_size=200),
            st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=3).map(tuple),
            st.integers(0, 2**50),
        ),
        min_size=1,
        max_size=20,
    ),
    st.integers(0, 2**62),
)
def test_codec_round_trip_property(records: list[RecordData], base: int) -> None:
    batch = encode_batch(
        records, producer_id=1, producer_epoch=0, base_sequence=0, transactional=True
    )
    set_base_offset(batch, base)
    assert crc_ok(batch)
    assert parse_header(batch).next_offset == base + len(records)
    assert read_batch(batch) == [
        StoredRecord(base + i, r.timestamp_ms, r.key, r.value, r.headers)
        for i, r in enumerate(records)
    ]


def test_last_sequence_wraps_like_kafka() -> None:
    five = [RecordData(None, b"v", (), 0)] * 5
    wrapped = encode_batch(
        five, producer_id=1, producer_epoch=0, base_sequence=2**31 - 3, transactional=False
    )
    assert parse_header(wrapped).last_sequence == 1  # MAX-2, MAX-1, MAX, 0, 1
    none = encode_batch(
        five, producer_id=-1, producer_epoch=-1, base_sequence=-1, transactional=False
    )
    assert parse_header(none).last_sequence == -1


def attributes(batch: bytes | bytearray) -> int:
    value: int = struct.unpack_from(">h", batch, 21)[0]
    return value


def test_attribute_bits_are_kafkas() -> None:
    plain = data_batch("p")
    txn = encode_batch(
        [RecordData(None, b"v", (), 0)],
        producer_id=4,
        producer_epoch=1,
        base_sequence=0,
        transactional=True,
    )
    marker = encode_control_batch(
        commit=True, producer_id=4, producer_epoch=1, coordinator_epoch=2, timestamp_ms=0
    )
    # bit 4 transactional, bit 5 control; create time (bit 3 clear), no compression (bits 0-2).
    assert attributes(plain) == 0
    assert attributes(txn) == 0x10
    assert attributes(marker) == 0x30
    assert parse_header(txn).is_transactional and not parse_header(txn).is_control
    header = parse_header(marker)
    assert header.is_transactional and header.is_control


@pytest.mark.parametrize("commit", [True, False])
def test_control_batch_is_a_kafka_end_transaction_marker(commit: bool) -> None:
    batch = encode_control_batch(
        commit=commit, producer_id=42, producer_epoch=5, coordinator_epoch=77, timestamp_ms=123
    )
    set_base_offset(batch, 9)
    assert crc_ok(batch)
    header = parse_header(batch)
    assert (header.base_offset, header.record_count, header.last_offset_delta) == (9, 1, 0)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 5, -1)
    assert header.first_timestamp == 123
    assert control_is_commit(bytes(batch)) is commit
    assert read_marker(batch) == (commit, 77, -1)  # no transaction number given

    # kafka-python's reader sees Kafka's control record layout.
    from kafka.record.default_records import ControlRecord, DefaultRecordBatch

    kafka_batch = DefaultRecordBatch(bytes(batch))
    assert kafka_batch.validate_crc()
    assert kafka_batch.is_control_batch and kafka_batch.is_transactional
    (record,) = list(kafka_batch)
    assert isinstance(record, ControlRecord)
    assert (record.version, record.commit, record.abort) == (0, commit, not commit)
    assert record.key == struct.pack(">hh", 0, 1 if commit else 0)
    assert record.value == struct.pack(">hi", 0, 77)
    assert record.offset == 9 and record.timestamp == 123


def test_a_marker_carries_its_transactions_number_after_kafkas_value() -> None:
    batch = encode_control_batch(
        commit=True,
        producer_id=42,
        producer_epoch=5,
        coordinator_epoch=77,
        timestamp_ms=123,
        txn_number=2**40,
    )
    assert read_marker(batch) == (True, 77, 2**40)
    from kafka.record.default_records import DefaultRecordBatch

    (record,) = list(DefaultRecordBatch(bytes(batch)))
    assert record.value[:6] == struct.pack(">hi", 0, 77)  # Kafka's readers read these
    assert record.value[6:] == struct.pack(">q", 2**40)


def test_kafka_python_reads_our_data_batches() -> None:
    from kafka.record.default_records import DefaultRecord, DefaultRecordBatch

    batch = encode_batch(
        [RecordData(b"k", b"v", (("a", b"b"),), 55)],
        producer_id=3,
        producer_epoch=2,
        base_sequence=8,
        transactional=True,
    )
    set_base_offset(batch, 4)
    kafka_batch = DefaultRecordBatch(bytes(batch))
    assert kafka_batch.validate_crc() and not kafka_batch.is_control_batch
    (record,) = list(kafka_batch)
    assert type(record) is DefaultRecord
    assert (record.offset, record.key, record.value, record.headers) == (
        4,
        b"k",
        b"v",
        [("a", b"b")],
    )


def test_kinds_are_not_mixed_up() -> None:
    marker = encode_control_batch(
        commit=False, producer_id=1, producer_epoch=0, coordinator_epoch=0, timestamp_ms=0
    )
    with pytest.raises(InvalidRecord, match="control"):
        read_batch(marker)
    with pytest.raises(CorruptBatch):
        read_marker(data_batch("d"))


def test_crc_covers_everything_after_the_crc_field() -> None:
    batch = data_batch("crc", 3)
    assert crc_ok(batch)
    for pos in range(len(batch)):
        flipped = bytearray(batch)
        flipped[pos] ^= 0x01
        # base offset, length, leader epoch, magic, CRC itself: outside the checksum
        if pos >= 21:
            assert not crc_ok(flipped), pos
    moved = bytearray(batch)
    set_base_offset(moved, 123_456)
    assert crc_ok(moved)
    assert not crc_ok(batch[:-1])
    assert not crc_ok(b"")


def test_parse_header_rejects_what_is_not_a_v2_batch() -> None:
    batch = data_batch("x")
    with pytest.raises(CorruptBatch, match="incomplete"):
        parse_header(batch[: HEADER_SIZE - 1])
    bad_magic = bytearray(batch)
    bad_magic[16] = 1
    with pytest.raises(CorruptBatch, match="magic"):
        parse_header(bad_magic)
    short = bytearray(batch)
    struct.pack_into(">i", short, 8, 10)
    with pytest.raises(CorruptBatch, match="length"):
        parse_header(short)
    gzip = bytearray(batch)
    struct.pack_into(">h", gzip, 21, 1)
    with pytest.raises(CorruptBatch, match="compressed"):
        parse_header(gzip)
    assert parse_header(bytes(8) + batch, 8).size == len(batch)


def test_encode_batch_needs_records_and_a_producer_for_transactions() -> None:
    with pytest.raises(ValueError):
        encode_batch([], producer_id=1, producer_epoch=0, base_sequence=0, transactional=False)
    with pytest.raises(ValueError):
        encode_batch(
            [RecordData(None, b"v", (), 0)],
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            transactional=True,
        )


# -- append and read -----------------------------------------------------------------------------


def test_append_read_round_trip_with_dense_offsets(tmp_path: Path) -> None:
    with PartitionLogStore(tmp_path / "p") as store:
        assert (store.log_start_offset, store.log_end_offset) == (0, 0)
        expected: list[int] = []
        for i in range(60):
            n = 1 + i % 4
            assert store.append(data_batch(f"b{i}", n)) == len(expected)
            expected.extend(range(len(expected), len(expected) + n))
        assert store.log_end_offset == len(expected)
        batches = store.read(0, BIG, store.log_end_offset)
        assert len(batches) == 60
        assert offsets(batches) == expected
        assert values(batches)[:3] == [b"b0:0", b"b1:0", b"b1:1"]
        assert all(crc_ok(b) for b in batches)


def test_read_from_inside_a_batch_returns_that_batch(tmp_path: Path) -> None:
    with PartitionLogStore(tmp_path) as store:
        store.append(data_batch("a", 3))  # 0..2
        store.append(data_batch("b", 4))  # 3..6
        store.append(data_batch("c", 2))  # 7..8
        for offset, first in [(0, 0), (2, 0), (3, 3), (5, 3), (6, 3), (8, 7)]:
            got = store.read(offset, BIG, store.log_end_offset)
            assert parse_header(got[0]).base_offset == first
        assert store.read(9, BIG, 9) == []
        with pytest.raises(OffsetOutOfRange):
            store.read(10, BIG, 100)
        with pytest.raises(OffsetOutOfRange):
            store.read(-1, BIG, 100)


def test_read_stops_at_upto_offset(tmp_path: Path) -> None:
    with PartitionLogStore(tmp_path) as store:
        store.append(data_batch("a", 3))  # 0..2
        store.append(data_batch("b", 4))  # 3..6
        store.append(data_batch("c", 2))  # 7..8
        assert offsets(store.read(0, BIG, 7)) == list(range(7))
        assert offsets(store.read(0, BIG, 6)) == [0, 1, 2]  # batch 3..6 ends past 6
        assert store.read(0, BIG, 2) == []
        assert store.read(4, BIG, 3) == []
        assert offsets(store.read(0, BIG, 1_000)) == list(range(9))  # capped at the end


def test_max_bytes_is_a_soft_limit(tmp_path: Path) -> None:
    with PartitionLogStore(tmp_path) as store:
        fill(store, 10, pad=50)
        size = len(store.read(0, BIG, 10)[0])
        assert len(store.read(0, 1, 10)) == 1  # the first batch even if it is too big
        assert len(store.read(0, 0, 10)) == 1
        assert len(store.read(0, 2 * size, 10)) == 2
        assert len(store.read(0, 2 * size + size // 2, 10)) == 2  # never past max_bytes
        assert len(store.read(0, 3 * size - 1, 10)) == 2
        assert len(store.read(4, 3 * size, 10)) == 3


def test_append_rejects_a_batch_that_is_not_whole(tmp_path: Path) -> None:
    with PartitionLogStore(tmp_path) as store:
        batch = data_batch("x")
        with pytest.raises(ValueError):
            store.append(batch + b"\x00")
        with pytest.raises(CorruptBatch):
            store.append(bytearray(b"nonsense"))
        assert store.log_end_offset == 0
        assert store.append(batch) == 0


def test_batches_yields_headers_and_control_bodies(tmp_path: Path) -> None:
    with PartitionLogStore(tmp_path, segment_bytes=300) as store:
        store.append(data_batch("a", 2))  # 0..1
        store.append(
            encode_control_batch(
                commit=True, producer_id=1, producer_epoch=0, coordinator_epoch=3, timestamp_ms=0
            )
        )
        store.append(data_batch("b", 3))  # 3..5
        store.append(
            encode_control_batch(
                commit=False, producer_id=2, producer_epoch=1, coordinator_epoch=4, timestamp_ms=0
            )
        )
        assert len(store.segment_base_offsets) > 1
        got = list(store.batches())
        assert [(h.base_offset, h.is_control) for h, _ in got] == [
            (0, False),
            (2, True),
            (3, False),
            (6, True),
        ]
        assert got[0][1] is None and got[2][1] is None
        assert got[1][1] is not None and read_marker(got[1][1]) == (True, 3, -1)
        assert got[3][1] is not None and read_marker(got[3][1]) == (False, 4, -1)
        assert [h.base_offset for h, _ in store.batches(4)] == [3, 6]
        assert [h.base_offset for h, _ in store.batches(7)] == []


# -- segments ------------------------------------------------------------------------------------


def test_segments_roll_by_size_and_reads_cross_them(tmp_path: Path) -> None:
    size = len(data_batch("b00", pad=20))
    with PartitionLogStore(tmp_path, segment_bytes=5 * size, index_interval_bytes=size) as store:
        bases = fill(store, 23, pad=20)
        assert bases == list(range(23))
        assert store.segment_base_offsets == (0, 5, 10, 15, 20)
        assert [p.name for p in segment_files(tmp_path, ".log")][:2] == [
            "00000000000000000000.log",
            "00000000000000000005.log",
        ]
        for path in segment_files(tmp_path, ".log"):
            assert path.stat().st_size <= 5 * size
        assert offsets(store.read(0, BIG, 23)) == list(range(23))
        assert offsets(store.read(3, 4 * size, 23)) == [3, 4, 5, 6]

    with PartitionLogStore(tmp_path, segment_bytes=5 * size, index_interval_bytes=size) as store:
        assert store.recovered.segments == 5
        assert store.recovered.bytes_truncated == 0
        assert store.log_end_offset == 23
        assert store.append(data_batch("b23", pad=20)) == 23
        assert store.append(data_batch("b24", pad=20)) == 24
        assert store.append(data_batch("b25", pad=20)) == 25
        assert store.segment_base_offsets == (0, 5, 10, 15, 20, 25)
        assert values(store.read(22, BIG, 26)) == [
            b"b22:0" + b"x" * 20,
            b"b23:0" + b"x" * 20,
            b"b24:0" + b"x" * 20,
            b"b25:0" + b"x" * 20,
        ]


def test_a_batch_larger_than_a_segment_gets_its_own(tmp_path: Path) -> None:
    with PartitionLogStore(tmp_path, segment_bytes=200) as store:
        store.append(data_batch("small"))
        store.append(data_batch("huge", pad=1_000))
        store.append(data_batch("small2"))
        assert store.segment_base_offsets == (0, 1, 2)
        assert values(store.read(1, 1, 3)) == [b"huge:0" + b"x" * 1_000]


# -- offset index --------------------------------------------------------------------------------


def index_entries(path: Path) -> list[tuple[int, int]]:
    return list(struct.iter_unpack(">II", path.read_bytes()))


def headers_read(store: PartitionLogStore, action: Callable[[], object]) -> int:
    before = store.headers_scanned
    action()
    return store.headers_scanned - before


def test_reads_start_at_the_nearest_index_entry(tmp_path: Path) -> None:
    size = len(data_batch("b0000"))
    with PartitionLogStore(tmp_path / "sparse", index_interval_bytes=256) as store:
        fill(store, 2_000)
        per_entry = 256 // size + 2
        assert headers_read(store, lambda: store.read(1_990, 1, 2_000)) <= per_entry
        assert headers_read(store, lambda: store.read(1_234, BIG, 1_235)) <= per_entry + 1
        assert values(store.read(1_990, 1, 2_000)) == [b"b1990:0"]
    with PartitionLogStore(tmp_path / "none", index_interval_bytes=1 << 30) as store:
        fill(store, 2_000)
        assert headers_read(store, lambda: store.read(1_990, 1, 2_000)) >= 1_990


def test_index_file_entries_point_at_batch_starts(tmp_path: Path) -> None:
    with PartitionLogStore(tmp_path, index_interval_bytes=500) as store:
        bases = fill(store, 100, n=2)
    data = (tmp_path / "00000000000000000000.log").read_bytes()
    entries = index_entries(tmp_path / "00000000000000000000.index")
    assert len(entries) > 5
    last_position = 0
    for relative, position in entries:
        assert parse_header(data, position).base_offset == relative
        assert relative in bases
        assert position - last_position >= 500
        last_position = position


def test_index_is_used_after_reopen_in_closed_and_active_segments(tmp_path: Path) -> None:
    open_store = partial(PartitionLogStore, segment_bytes=64 << 10, index_interval_bytes=256)
    with open_store(tmp_path) as store:
        fill(store, 1_500)
        assert len(store.segment_base_offsets) >= 2
        end = store.log_end_offset
    with open_store(tmp_path) as store:
        assert store.recovered.indexes_rebuilt == 0
        closed_end = store.segment_base_offsets[1]
        assert headers_read(store, lambda: store.read(closed_end - 2, 1, end)) <= 8
        assert headers_read(store, lambda: store.read(end - 2, 1, end)) <= 8


# -- recovery ------------------------------------------------------------------------------------


def damage_garbage(path: Path) -> None:
    with path.open("ab") as f:
        f.write(b"\xde\xad\xbe\xef" * 5)


def damage_half_batch(path: Path) -> None:
    batch = data_batch("torn", 3)
    set_base_offset(batch, 1_000_000)
    with path.open("ab") as f:
        f.write(batch[: len(batch) // 2])


def damage_header_only(path: Path) -> None:
    with path.open("ab") as f:
        f.write(data_batch("torn")[:30])


def damage_crc_of_last(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # a record byte of the last batch
    path.write_bytes(data)


def damage_truncate_last(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size - 7)


def damage_offset_gap(path: Path) -> None:
    batch = data_batch("gap")
    set_base_offset(batch, 10_000)  # valid CRC, wrong offset
    with path.open("ab") as f:
        f.write(batch)


@pytest.mark.parametrize(
    ("damage", "lost_batches"),
    [
        (damage_garbage, 0),
        (damage_half_batch, 0),
        (damage_header_only, 0),
        (damage_crc_of_last, 1),
        (damage_truncate_last, 1),
        (damage_offset_gap, 0),
    ],
)
def test_torn_tail_of_the_active_segment_is_cut(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    damage: Callable[[Path], None],
    lost_batches: int,
) -> None:
    size = len(data_batch("b00", 2))
    open_store = partial(PartitionLogStore, segment_bytes=8 * size, index_interval_bytes=size)
    with open_store(tmp_path) as store:
        fill(store, 20, n=2)  # three segments, the last one holds batches 16..19
        active = segment_files(tmp_path, ".log")[-1]
        good_size = active.stat().st_size
    damage(active)
    damaged_size = active.stat().st_size

    with open_store(tmp_path) as store:
        kept = 20 - lost_batches
        assert store.log_end_offset == 2 * kept
        expected_size = good_size - lost_batches * size
        assert active.stat().st_size == expected_size
        assert store.recovered.bytes_truncated == damaged_size - expected_size > 0
        assert "cut" in caplog.text
        assert offsets(store.read(0, BIG, store.log_end_offset)) == list(range(2 * kept))
        assert store.append(data_batch("new")) == 2 * kept
        assert values(store.read(2 * kept, BIG, 2 * kept + 1)) == [b"new:0"]
        assert all(
            e[1] < active.stat().st_size for e in index_entries(active.with_suffix(".index"))
        )

    with open_store(tmp_path) as store:
        assert store.recovered.bytes_truncated == 0
        assert store.log_end_offset == 2 * kept + 1


def test_a_corrupt_first_batch_empties_the_active_segment(tmp_path: Path) -> None:
    with PartitionLogStore(tmp_path, segment_bytes=200) as store:
        fill(store, 3)
    active = segment_files(tmp_path, ".log")[-1]
    data = bytearray(active.read_bytes())
    data[16] = 7  # magic of the first batch
    active.write_bytes(data)
    with PartitionLogStore(tmp_path, segment_bytes=200) as store:
        assert store.log_end_offset == int(active.stem)
        assert active.stat().st_size == 0
        assert store.append(data_batch("again")) == int(active.stem)


def test_empty_and_missing_directories_start_at_zero(tmp_path: Path) -> None:
    nested = tmp_path / "a" / "b" / "topic-0"
    with PartitionLogStore(nested) as store:
        assert (store.log_start_offset, store.log_end_offset) == (0, 0)
        assert store.recovered.segments == 1
        assert store.read(0, BIG, 0) == []
        assert list(store.batches()) == []
    assert [p.name for p in sorted(nested.iterdir())] == [
        "00000000000000000000.index",
        "00000000000000000000.log",
    ]
    with PartitionLogStore(nested) as store:
        assert store.log_end_offset == 0
        assert store.append(data_batch("first")) == 0


def closed_store(tmp_path: Path) -> tuple[Callable[[Path], PartitionLogStore], Path, bytes]:
    """Three segments of 20, 20 and 10 one-record batches; the first one's index file."""
    size = len(data_batch("b00"))
    open_store = partial(PartitionLogStore, segment_bytes=20 * size, index_interval_bytes=2 * size)
    with open_store(tmp_path) as store:
        fill(store, 50)
    assert store.segment_base_offsets == (0, 20, 40)
    index = segment_files(tmp_path, ".index")[0]
    return open_store, index, index.read_bytes()


def _mid_batch(data: bytes) -> bytes:
    relative, position = struct.unpack(">II", data[-8:])
    return data[:-8] + struct.pack(">II", relative, position + 3)


@pytest.mark.parametrize(
    ("damage", "rebuilt"),
    [
        pytest.param(lambda data: data + b"\x01\x02\x03", 1, id="torn-entry"),
        pytest.param(lambda data: data[:8] + data[:8] + data[16:], 1, id="not-increasing"),
        pytest.param(lambda data: data[:-8] + struct.pack(">II", 19, 1 << 20), 1, id="past-end"),
        pytest.param(_mid_batch, 1, id="mid-batch"),
        pytest.param(None, 1, id="missing"),
        # An empty index is merely sparse, not wrong: reads scan from the segment start.
        pytest.param(lambda data: b"", 0, id="emptied"),
    ],
)
def test_a_damaged_closed_index_is_rebuilt(
    tmp_path: Path, damage: Callable[[bytes], bytes] | None, rebuilt: int
) -> None:
    open_store, index, good = closed_store(tmp_path)
    if damage is None:
        index.unlink()
    else:
        index.write_bytes(damage(good))
    with open_store(tmp_path) as store:
        assert store.recovered.indexes_rebuilt == rebuilt
        if rebuilt:
            assert index.read_bytes() == good
        assert offsets(store.read(0, BIG, 50)) == list(range(50))
        assert offsets(store.read(17, 1, 50)) == [17]


def test_a_torn_active_index_is_rewritten(tmp_path: Path) -> None:
    size = len(data_batch("b00"))
    with PartitionLogStore(tmp_path, index_interval_bytes=2 * size) as store:
        fill(store, 30)
    index = tmp_path / "00000000000000000000.index"
    good = index.read_bytes()
    index.write_bytes(good[:-3])
    with PartitionLogStore(tmp_path, index_interval_bytes=2 * size) as store:
        assert store.recovered.indexes_rebuilt == 1
        assert store.recovered.bytes_truncated == 0
        assert index.read_bytes() == good
        assert store.append(data_batch("b30")) == 30
        assert offsets(store.read(29, BIG, 31)) == [29, 30]


def test_a_damaged_closed_segment_is_refused(tmp_path: Path) -> None:
    open_store, index, _ = closed_store(tmp_path)
    first = segment_files(tmp_path, ".log")[0]
    data = bytearray(first.read_bytes())
    data[16] = 0  # magic of the first batch: the index still looks fine
    first.write_bytes(data)
    index.unlink()
    with pytest.raises(CorruptLog, match="closed segment"):
        open_store(tmp_path)


def test_a_gap_between_segments_is_refused(tmp_path: Path) -> None:
    open_store, _, _ = closed_store(tmp_path)
    second = segment_files(tmp_path, ".log")[1]
    second.unlink()
    with pytest.raises(CorruptLog, match="does not follow"):
        open_store(tmp_path)


def closed_marker_store(directory: Path) -> tuple[int, int]:
    """A store whose first, closed, segment holds a transaction's batch and
    its COMMIT marker, then data in later segments, every batch indexed (so
    that opening reads only each closed segment's last batch); returns the
    marker's position in the first segment and its length."""
    store = PartitionLogStore(directory, segment_bytes=400, index_interval_bytes=1)
    store.append(
        encode_batch(
            [RecordData(b"k", b"v", (), 1)],
            producer_id=7,
            producer_epoch=0,
            base_sequence=0,
            transactional=True,
        )
    )
    marker = encode_control_batch(
        commit=True, producer_id=7, producer_epoch=0, coordinator_epoch=0, timestamp_ms=2
    )
    position = store._segments[-1].size
    store.append(marker)
    fill(store, 10, pad=50)
    assert len(store.segment_base_offsets) > 1
    store.close()
    return position, len(marker)


def test_a_flipped_marker_in_a_closed_segment_is_refused_not_replayed(tmp_path: Path) -> None:
    """Closed segments open without their CRCs read; the state rebuilt from
    them (no snapshot here) reads each batch's CRC: a COMMIT whose type bit
    turned it into an ABORT is damage, not an aborted transaction."""
    position, length = closed_marker_store(tmp_path)
    first = segment_files(tmp_path, ".log")[0]
    data = bytearray(first.read_bytes())
    assert read_marker(bytes(data[position : position + length])).commit
    data[position + length - 1 - 4] ^= 0x01  # inside the control record's value
    first.write_bytes(data)
    store = PartitionLogStore(tmp_path, segment_bytes=400, index_interval_bytes=1)
    with pytest.raises(CorruptLog, match="fails its CRC"):
        list(store.batches())
    store.close()


def test_replay_checks_the_crcs_of_closed_segments_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The active segment's batches passed their CRCs when recovery scanned
    it (and appends are checked before they are written): replay reads its
    data batches' headers alone, the closed segments' batches whole."""
    closed_marker_store(tmp_path)
    store = PartitionLogStore(tmp_path, segment_bytes=400, index_interval_bytes=1)
    checked: list[int] = []
    real = log_module.crc_ok

    def counting(batch: Any) -> bool:
        checked.append(parse_header(bytes(batch)).base_offset)
        return real(batch)

    monkeypatch.setattr(log_module, "crc_ok", counting)
    replayed = [header.base_offset for header, _ in store.batches()]
    active = store.segment_base_offsets[-1]
    assert checked == [offset for offset in replayed if offset < active]
    assert len(checked) < len(replayed)
    store.close()


def test_a_damaged_batch_length_in_a_closed_segment_is_refused_not_skipped(
    tmp_path: Path,
) -> None:
    """A length field that now points past the next batches would make reads
    skip them without a word; each batch must follow the one before."""
    closed_marker_store(tmp_path)
    first = segment_files(tmp_path, ".log")[0]
    data = bytearray(first.read_bytes())
    second = parse_header(data).size
    data[second + 8] ^= 0x01  # the second batch's length: 16 MiB more
    first.write_bytes(data)
    store = PartitionLogStore(tmp_path, segment_bytes=400, index_interval_bytes=1)
    with pytest.raises(CorruptLog, match="past the segment's end"):
        store.read(0, BIG, 1 << 20)
    with pytest.raises(CorruptLog):
        list(store.batches())
    store.close()


def test_a_leader_epoch_newer_than_the_checkpoint_is_damage(tmp_path: Path) -> None:
    """The checkpoint is written before a new epoch's first batch: with a
    readable one, a header naming a newer epoch (a field outside the CRC)
    was damaged, and the batch is not taken as appended by that epoch."""
    store = PartitionLogStore(tmp_path)
    for label in ("a", "b", "c"):
        batch = data_batch(label)
        set_partition_leader_epoch(batch, 3)
        store.append(batch)
    store.close()
    (log,) = segment_files(tmp_path, ".log")
    data = bytearray(log.read_bytes())
    second = parse_header(data).size
    data[second + 12] ^= 0x40  # the second batch's partition leader epoch
    log.write_bytes(data)
    with pytest.raises(CorruptLog, match="newer than the checkpoint"):
        PartitionLogStore(tmp_path)


def test_a_log_whose_segment_files_are_gone_is_refused_not_restarted(tmp_path: Path) -> None:
    """A snapshot at a roll's offset proves records below it: with every
    segment file missing the log is damaged, not new (a new log would hand
    out those offsets again)."""
    store = PartitionLogStore(tmp_path, segment_bytes=400)
    fill(store, 10, pad=50)
    store.write_snapshot(store.log_end_offset, b"state")
    store.close()
    for log in segment_files(tmp_path, ".log"):
        log.unlink()
    with pytest.raises(CorruptLog, match="no segment file"):
        PartitionLogStore(tmp_path, segment_bytes=400)


# -- fsync policies ------------------------------------------------------------------------------


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every fd passed to os.fsync (the real fsync still runs)."""
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


def test_always_fsyncs_every_append(tmp_path: Path, fsyncs: list[int]) -> None:
    with PartitionLogStore(tmp_path, fsync=FsyncPolicy.ALWAYS) as store:
        store.append(data_batch("first"))  # also writes the leader-epoch checkpoint
        fsyncs.clear()
        for i in range(10):
            store.append(data_batch(f"a{i}"))
            assert len(fsyncs) == i + 1
            assert not store.dirty
        store.flush()
        assert len(fsyncs) == 10


def test_never_does_not_fsync_appends(tmp_path: Path, fsyncs: list[int]) -> None:
    with PartitionLogStore(tmp_path, fsync=FsyncPolicy.NEVER) as store:
        store.append(data_batch("first"))  # writes the leader-epoch checkpoint
        store.flush()
        fsyncs.clear()
        fill(store, 10)
        assert fsyncs == []
        assert store.dirty


def test_interval_fsyncs_only_in_flush(tmp_path: Path, fsyncs: list[int]) -> None:
    with PartitionLogStore(tmp_path, fsync=FsyncPolicy.INTERVAL) as store:
        store.append(data_batch("first"))  # writes the leader-epoch checkpoint
        store.flush()
        fsyncs.clear()
        fill(store, 10)
        assert fsyncs == [] and store.dirty
        store.flush()
        assert len(fsyncs) == 1 and not store.dirty  # the log (no index entries yet)
        store.flush()
        assert len(fsyncs) == 1  # nothing new
        store.append(data_batch("more"))
        store.flush()
        assert len(fsyncs) == 2


def test_a_rolled_segment_is_fsynced_under_every_policy(tmp_path: Path, fsyncs: list[int]) -> None:
    size = len(data_batch("b0"))
    with PartitionLogStore(tmp_path, segment_bytes=3 * size, fsync=FsyncPolicy.NEVER) as store:
        fill(store, 3)
        fsyncs.clear()
        store.append(data_batch("b3"))  # rolls
        assert len(fsyncs) == 3  # closed log, closed index, directory
        fsyncs.clear()
        store.append(data_batch("b4"))
        assert fsyncs == []


def test_log_flusher_flushes_periodically_and_stops_promptly(
    tmp_path: Path, fsyncs: list[int]
) -> None:
    flushed = threading.Event()

    class Owner:
        def __init__(self, store: PartitionLogStore) -> None:
            self.store = store
            self.lock = threading.Lock()

        def flush(self) -> None:
            with self.lock:
                self.store.flush()
                flushed.set()

    with PartitionLogStore(tmp_path, fsync=FsyncPolicy.INTERVAL) as store:
        owner = Owner(store)
        with owner.lock:
            fill(store, 3)
        fsyncs.clear()
        flusher = LogFlusher(lambda: [owner], 0.01)
        flusher.start()
        try:
            assert flushed.wait(10)
        finally:
            flusher.stop(timeout=10)
        assert not flusher.is_alive()
        assert fsyncs and not store.dirty


def test_log_flusher_survives_a_failing_target_and_stop_does_not_wait_a_period() -> None:
    calls: list[str] = []
    done = threading.Event()

    class Broken:
        def flush(self) -> None:
            calls.append("broken")
            raise OSError(errno.EIO, "disk gone")

    class Fine:
        def flush(self) -> None:
            calls.append("fine")
            done.set()

    flusher = LogFlusher(lambda: [Broken(), Fine()], 3_600.0)
    flusher.flush_now()
    assert calls == ["broken", "fine"] and done.is_set()
    flusher.start()
    flusher.stop(timeout=10)  # an hour-long period must not delay stopping
    assert not flusher.is_alive()


# -- failures ------------------------------------------------------------------------------------


def test_a_failed_write_leaves_no_partial_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PartitionLogStore(tmp_path) as store:
        fill(store, 2)
        real_write = os.write
        calls = 0

        def half_then_enospc(fd: int, data: bytes | memoryview) -> int:
            nonlocal calls
            calls += 1
            if calls == 1:
                return real_write(fd, bytes(data)[:20])
            raise OSError(errno.ENOSPC, "no space left")

        monkeypatch.setattr(os, "write", half_then_enospc)
        with pytest.raises(OSError, match="no space"):
            store.append(data_batch("lost"))
        monkeypatch.setattr(os, "write", real_write)
        assert store.log_end_offset == 2
        assert store.append(data_batch("b2")) == 2
        assert values(store.read(0, BIG, 3)) == [b"b0:0", b"b1:0", b"b2:0"]
    with PartitionLogStore(tmp_path) as store:
        assert store.recovered.bytes_truncated == 0 and store.log_end_offset == 3


def test_a_failed_fsync_fails_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = PartitionLogStore(tmp_path)
    try:

        def broken(fd: int) -> None:
            raise OSError(errno.EIO, "I/O error")

        monkeypatch.setattr(os, "fsync", broken)
        with pytest.raises(OSError, match="I/O"):
            store.append(data_batch("x"))
        with pytest.raises(StoreFailed):
            store.append(data_batch("y"))
        with pytest.raises(StoreFailed):
            store.read(0, BIG, 1)
    finally:
        store.close()


# -- a model-based property ----------------------------------------------------------------------

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 5), st.integers(0, 120)),
        st.tuples(st.just("read"), st.floats(0, 1), st.integers(0, 2_000)),
        st.tuples(st.just("reopen"), st.just(0), st.just(0)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=40, deadline=None)
@given(_OPS, st.integers(150, 1_500), st.integers(0, 400))
def test_store_matches_a_list_of_batches(
    ops: list[tuple[str, float, int]], segment_bytes: int, index_interval: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        open_store = partial(
            PartitionLogStore, segment_bytes=segment_bytes, index_interval_bytes=index_interval
        )
        store = open_store(Path(tmp))
        model: list[tuple[int, bytes]] = []  # (base offset, bytes)
        try:
            for op, a, b in ops:
                end = store.log_end_offset
                if op == "append":
                    batch = data_batch(f"m{len(model)}", int(a), pad=b)
                    assert store.append(batch) == end
                    model.append((end, bytes(batch)))
                elif op == "read":
                    start = int(a * end)
                    got = store.read(start, b, end)
                    want = [data for base, data in model if parse_header(data).next_offset > start]
                    assert got == want[: len(got)]
                    assert bool(got) == bool(want)
                    if len(got) < len(want):
                        extra = len(want[len(got)])
                        assert sum(map(len, got)) + extra > b
                else:
                    store.close()
                    store = open_store(Path(tmp))
                    assert store.recovered.bytes_truncated == 0
                    assert store.log_end_offset == end
            headers = [h for h, _ in store.batches()]
            assert [h.base_offset for h in headers] == [base for base, _ in model]
        finally:
            store.close()


# -- kill -9 -------------------------------------------------------------------------------------

_CHILD = r"""
import sys
from pathlib import Path

from partition_log.codec import RecordData, encode_batch
from partition_log.log import FsyncPolicy, PartitionLogStore

store = PartitionLogStore(Path(sys.argv[1]), segment_bytes=8192, index_interval_bytes=512,
                          fsync=FsyncPolicy.NEVER)
print("start", store.log_end_offset, flush=True)
i = 0
while True:
    records = [RecordData(None, b"record-%d-%d" % (i, k), (), i) for k in range(1 + i % 3)]
    batch = encode_batch(records, producer_id=-1, producer_epoch=-1, base_sequence=-1,
                         transactional=False)
    offset = store.append(batch)
    sys.stdout.write(f"{offset} {i}\n")
    sys.stdout.flush()
    i += 1
"""


class _LineReader:
    """Lines from a child's stdout with a deadline, without blocking past it."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self._fd = proc.stdout.fileno()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._fd, selectors.EVENT_READ)
        self._pending = b""
        self.eof = False

    def lines(self, deadline: float) -> Iterator[str]:
        while not self.eof:
            while b"\n" in self._pending:
                line, self._pending = self._pending.split(b"\n", 1)
                yield line.decode()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the child did not answer in time")
            if self._selector.select(remaining):
                chunk = os.read(self._fd, 65_536)
                if chunk:
                    self._pending += chunk
                else:
                    self.eof = True

    def close(self) -> None:
        self._selector.close()


def test_kill_9_loses_no_acknowledged_append(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    acked: dict[int, int] = {}  # base offset -> batch number
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    stderr_path = tmp_path / "child.stderr"
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(directory)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    reader = _LineReader(proc)
    try:
        for line in reader.lines(time.monotonic() + 60):
            if line.startswith("start"):
                continue
            offset, number = map(int, line.split())
            acked[offset] = number
            if len(acked) >= 400:
                break
        assert len(acked) >= 400, stderr_path.read_text()
        os.kill(proc.pid, signal.SIGKILL)
        # Lines written before the kill were acknowledged too.
        for line in reader.lines(time.monotonic() + 30):
            acked_offset, _, acked_number = line.partition(" ")
            if acked_number:
                acked[int(acked_offset)] = int(acked_number)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        reader.close()
        assert proc.stdout is not None
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL

    with PartitionLogStore(directory, segment_bytes=8192, index_interval_bytes=512) as store:
        assert len(store.segment_base_offsets) > 1
        last = max(acked)
        assert store.log_end_offset >= last + 1
        for offset, number in sorted(acked.items()):
            (batch,) = store.read(offset, 1, store.log_end_offset)
            records = read_batch(batch)
            assert records[0].offset == offset
            assert [r.value for r in records] == [
                b"record-%d-%d" % (number, k) for k in range(1 + number % 3)
            ]


def _flip_middle_batch(tmp_path: Path, size: int) -> Path:
    active = segment_files(tmp_path, ".log")[-1]
    data = bytearray(active.read_bytes())
    data[size + size // 2] ^= 0x20  # inside the second of four batches
    active.write_bytes(bytes(data))
    return active


def test_a_damaged_batch_with_intact_ones_after_it_is_refused_under_fsync_always(
    tmp_path: Path,
) -> None:
    """Every append was fsynced: only the last batch can be torn. A bad batch
    in the middle is damage, and cutting there would drop acknowledged
    batches and hand their offsets out again."""
    size = len(data_batch("b00", 2))
    open_store = partial(PartitionLogStore, segment_bytes=100 * size)
    with open_store(tmp_path) as store:
        fill(store, 4, n=2)
    _flip_middle_batch(tmp_path, size)
    with pytest.raises(CorruptLog, match="intact batches follow"):
        open_store(tmp_path)


def test_a_damaged_batch_under_fsync_interval_is_cut_and_the_loss_is_critical(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    size = len(data_batch("b00", 2))
    open_store = partial(PartitionLogStore, segment_bytes=100 * size, fsync=FsyncPolicy.INTERVAL)
    with open_store(tmp_path) as store:
        fill(store, 4, n=2)
    _flip_middle_batch(tmp_path, size)
    with caplog.at_level(logging.CRITICAL), open_store(tmp_path) as store:
        assert store.log_end_offset == 2
    assert "event=acknowledged_data_lost" in caplog.text and "offsets 2 to 7" in caplog.text


# -- skipped offsets -----------------------------------------------------------------------------


def test_an_empty_log_skipped_ahead_starts_there(tmp_path: Path) -> None:
    with PartitionLogStore(tmp_path / "p") as store:
        assert store.recovered.created
        store.skip_to(1_000)
        assert (store.log_start_offset, store.log_end_offset) == (1_000, 1_000)
        assert store.append(data_batch("a")) == 1_000
    with PartitionLogStore(tmp_path / "p") as store:
        assert not store.recovered.created
        assert (store.log_start_offset, store.log_end_offset) == (1_000, 1_001)
        assert not (tmp_path / "p" / "offset-gaps").exists()


def test_a_skip_is_recorded_survives_recovery_and_reads_continue_across_it(
    tmp_path: Path,
) -> None:
    with PartitionLogStore(tmp_path / "p") as store:
        fill(store, 3)  # 0..2
        store.skip_to(500)
        assert store.append(data_batch("after", 2)) == 500
        with pytest.raises(ValueError):
            store.skip_to(501)
    with PartitionLogStore(tmp_path / "p") as store:
        assert (store.log_start_offset, store.log_end_offset) == (0, 502)
        assert offsets(store.read(0, BIG, 502)) == [0, 1, 2, 500, 501]
        assert offsets(store.read(3, BIG, 502)) == [500, 501]  # from inside the gap
        assert offsets(store.read(400, BIG, 502)) == [500, 501]
        assert [h.base_offset for h, _ in store.batches(1)] == [1, 2, 500]


def test_a_jump_between_segments_that_no_record_explains_is_damage(tmp_path: Path) -> None:
    with PartitionLogStore(tmp_path / "p") as store:
        fill(store, 3)
        store.skip_to(500)
        store.append(data_batch("after"))
    gaps = tmp_path / "p" / "offset-gaps"
    damaged = bytearray(gaps.read_bytes())
    damaged[1] ^= 0x01
    gaps.write_bytes(bytes(damaged))
    with pytest.raises(CorruptLog, match="offset-gaps is damaged"):
        PartitionLogStore(tmp_path / "p")
    gaps.unlink()
    with pytest.raises(CorruptLog, match="does not follow"):
        PartitionLogStore(tmp_path / "p")


# -- leader epochs --------------------------------------------------------------------------------


def test_the_latest_leader_epoch_survives_a_restart_and_a_torn_tail(tmp_path: Path) -> None:
    """The store knows the partition leader epoch of its last batch: after
    appends, after recovery over closed segments and an empty active one, and
    after recovery cut a torn batch (whose epoch is then not the log's)."""

    def at_epoch(epoch: int, label: str) -> bytearray:
        batch = data_batch(label, pad=300)
        set_partition_leader_epoch(batch, epoch)
        return batch

    path = tmp_path / "p"
    with PartitionLogStore(path, segment_bytes=1024, fsync=FsyncPolicy.NEVER) as store:
        assert store.latest_leader_epoch == 0
        for i, epoch in enumerate((0, 0, 2, 2, 5, 6)):  # two batches per segment
            store.append(at_epoch(epoch, f"e{i}"))
        assert store.latest_leader_epoch == 6
    with PartitionLogStore(path, segment_bytes=1024, fsync=FsyncPolicy.NEVER) as store:
        assert store.latest_leader_epoch == 6
        store.append(at_epoch(7, "last"))  # rolls: the active segment holds only it
        assert store.segment_base_offsets == (0, 2, 4, 6)
    active = segment_files(path, ".log")[-1]
    with active.open("r+b") as f:  # tear it: recovery cuts it, the active segment is empty
        f.truncate(active.stat().st_size - 10)
    with PartitionLogStore(path, segment_bytes=1024, fsync=FsyncPolicy.NEVER) as store:
        assert store.log_end_offset == 6
        assert store.latest_leader_epoch == 6
