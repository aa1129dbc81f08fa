"""Every batch is checked completely before it is appended (codec.read_batch),
and a stored batch that cannot be read fails only its own partition's fetch.

The bytes-level cases build a valid batch, break one thing, and recompute the
CRC so that the check behind the CRC is the one exercised."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c

from fsm.errors import ErrorCode
from partition_log import codec
from partition_log.codec import (
    CorruptBatch,
    InvalidBatch,
    InvalidRecord,
    InvalidTimestamp,
    RecordData,
    StoredRecord,
    encode_batch,
    read_batch,
    set_base_offset,
)
from partition_log.log import FsyncPolicy, PartitionLogStore
from partition_log.partition import Partition
from partition_log.service import PartitionLogService
from raftcoord.protocol.v1 import common_pb2, partition_log_pb2
from tests.reserved import reserved

INT64_MAX = 2**63 - 1
#: The batch of the issue: answered NONE, then every fetch over it failed.
POISON_TIMESTAMPS = (-1, INT64_MAX)

# Header positions (see partition_log.codec).
LENGTH, MAGIC, CRC, ATTRIBUTES, LAST_DELTA, MAX_TS, PID, SEQUENCE, COUNT = (
    8,
    16,
    17,
    21,
    23,
    35,
    43,
    53,
    57,
)


def batch_of(*timestamps: int, pid: int = -1, txn: bool = False) -> bytearray:
    records = [RecordData(b"k", b"v%d" % i, (("h", b"x"),), ts) for i, ts in enumerate(timestamps)]
    return encode_batch(
        records,
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=0 if pid >= 0 else -1,
        transactional=txn,
    )


def recrc(batch: bytearray) -> bytearray:
    struct.pack_into(">I", batch, CRC, calc_crc32c(memoryview(batch)[ATTRIBUTES:]))
    return batch


def patched(fmt: str, pos: int, value: int, batch: bytearray | None = None) -> bytearray:
    """A valid three-record batch with one header field changed, CRC recomputed."""
    out = bytearray(batch if batch is not None else batch_of(10, 11, 12))
    struct.pack_into(fmt, out, pos, value)
    return recrc(out)


def built(offsets: list[int], timestamps: list[int]) -> bytearray:
    """A batch written by kafka-python's builder with the given offset deltas."""
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 2**31 - 1)
    for offset, ts in zip(offsets, timestamps, strict=True):
        builder.append(offset, ts, None, b"v", [])
    out: bytearray = builder.build()
    return out


def undecodable_record() -> bytearray:
    """The last byte of the batch (a record's header count) removed, length fixed."""
    out = batch_of(10, 11)[:-1]
    struct.pack_into(">i", out, LENGTH, len(out) - 12)
    return recrc(out)


def extra_bytes() -> bytearray:
    out = batch_of(10, 11) + b"\x00\x00"
    struct.pack_into(">i", out, LENGTH, len(out) - 12)
    return recrc(out)


MALFORMED: dict[str, tuple[Callable[[], bytes | bytearray], type[InvalidBatch], str]] = {
    "short header": (lambda: batch_of(1)[:40], CorruptBatch, "incomplete"),
    "magic 1": (lambda: patched(">b", MAGIC, 1), CorruptBatch, "magic"),
    "length beyond the buffer": (
        lambda: patched(">i", LENGTH, len(batch_of(10, 11, 12))),
        CorruptBatch,
        "declares",
    ),
    "truncated": (lambda: batch_of(10, 11, 12)[:-3], CorruptBatch, "declares"),
    "trailing garbage": (lambda: batch_of(10, 11, 12) + b"x", CorruptBatch, "declares"),
    "flipped bit": (
        lambda: bytes(b ^ (i == 70) for i, b in enumerate(batch_of(10, 11, 12))),
        CorruptBatch,
        "CRC",
    ),
    "gzip": (lambda: patched(">h", ATTRIBUTES, 1), CorruptBatch, "compressed"),
    "control bit": (lambda: patched(">h", ATTRIBUTES, 0x20), InvalidRecord, "control"),
    "unknown attribute": (lambda: patched(">h", ATTRIBUTES, 0x40), InvalidRecord, "attribute"),
    "log-append time": (lambda: patched(">h", ATTRIBUTES, 0x08), InvalidTimestamp, "log-append"),
    "producer id without sequence": (
        lambda: patched(">i", SEQUENCE, -1, batch_of(1, 2, pid=4)),
        InvalidRecord,
        "base sequence",
    ),
    "transactional without producer id": (
        lambda: patched(">h", ATTRIBUTES, 0x10),
        InvalidRecord,
        "producer id",
    ),
    "count 0": (lambda: patched(">i", COUNT, 0), InvalidRecord, "record count"),
    "count above the offsets": (lambda: patched(">i", COUNT, 4), InvalidRecord, "record count"),
    "count and offsets one too many": (
        lambda: patched(">i", COUNT, 4, patched(">i", LAST_DELTA, 3)),
        InvalidRecord,
        "undecodable",
    ),
    "count and offsets one too few": (
        lambda: patched(">i", COUNT, 2, patched(">i", LAST_DELTA, 1)),
        InvalidRecord,
        "undecodable",
    ),
    "negative count": (lambda: patched(">i", COUNT, -1), CorruptBatch, "negative"),
    "record cut short": (undecodable_record, InvalidRecord, "undecodable"),
    "bytes after the records": (extra_bytes, InvalidRecord, "undecodable"),
    "offset delta not its index": (lambda: built([1, 1], [5, 5]), InvalidRecord, "offset delta"),
    "max timestamp not the records'": (
        lambda: patched(">q", MAX_TS, 99),
        InvalidRecord,
        "max timestamp",
    ),
    "timestamps -1 and 2**63-1": (lambda: batch_of(*POISON_TIMESTAMPS), InvalidTimestamp, "delta"),
    "timestamp below -1": (lambda: batch_of(5, -2), InvalidTimestamp, "invalid timestamp -2"),
    "first timestamp below -1": (lambda: batch_of(-7), InvalidTimestamp, "invalid timestamp -7"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_batches_are_refused_with_kafkas_code(name: str) -> None:
    make, error, match = MALFORMED[name]
    with pytest.raises(error, match=match) as raised:
        read_batch(make())
    expected = {
        CorruptBatch: ErrorCode.CORRUPT_MESSAGE,
        InvalidRecord: ErrorCode.INVALID_RECORD,
        InvalidTimestamp: ErrorCode.INVALID_TIMESTAMP,
    }[error]
    assert raised.value.code is expected


def test_extreme_timestamps_that_fit_are_accepted() -> None:
    for timestamps in [(INT64_MAX, -1), (0, INT64_MAX), (-1, -1), (INT64_MAX, 0, INT64_MAX)]:
        assert [r.timestamp_ms for r in read_batch(batch_of(*timestamps))] == list(timestamps)


def fetchable(records: list[StoredRecord]) -> None:
    """Every record fits the Fetch answer's protobuf fields (raises if not)."""
    for r in records:
        partition_log_pb2.FetchedRecord(
            offset=r.offset,
            timestamp_ms=r.timestamp_ms,
            headers=[partition_log_pb2.RecordHeader(key=k, value=v) for k, v in r.headers],
        )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(-(2**63), INT64_MAX), min_size=1, max_size=6),
    st.integers(0, 2**62),
)
def test_any_timestamps_are_accepted_whole_or_refused_as_invalid_timestamp(
    timestamps: list[int], base: int
) -> None:
    batch = batch_of(*timestamps)
    set_base_offset(batch, base)
    try:
        records = read_batch(batch)
    except InvalidBatch as exc:
        assert isinstance(exc, InvalidTimestamp), exc
        return
    assert [r.timestamp_ms for r in records] == timestamps
    assert [r.offset for r in records] == list(range(base, base + len(timestamps)))
    fetchable(records)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=8),
    st.booleans(),
    st.integers(0, 4),
)
def test_mutated_batches_are_read_whole_or_refused_never_crash(
    changes: list[tuple[int, int]], fix_crc: bool, cut: int
) -> None:
    batch = batch_of(1_700_000_000_000, -1, 5)
    for position, value in changes:
        batch[position % len(batch)] = value
    del batch[len(batch) - cut :]
    if fix_crc and len(batch) >= codec.HEADER_SIZE:
        recrc(batch)
    try:
        records = read_batch(batch)
    except InvalidBatch:
        return
    header = codec.parse_header(batch)
    assert header.size == len(batch)
    assert [r.offset for r in records] == list(
        range(header.base_offset, header.base_offset + header.record_count)
    )
    assert all(r.timestamp_ms == -1 or 0 <= r.timestamp_ms <= INT64_MAX for r in records)
    fetchable(records)


# --- a partition holding an unreadable batch (appended before the checks existed) ---------------


def open_partition(path: Path, topic: str = "t") -> Partition:
    return reserved(
        Partition(
            topic, 0, path, segment_bytes=1 << 20, index_interval_bytes=256, fsync=FsyncPolicy.NEVER
        )
    )


@pytest.fixture
def poisoned(tmp_path: Path) -> Iterator[tuple[Partition, Partition]]:
    """Partition "bad" holds good, poison, good batches (offsets 0, 1-2, 3);
    partition "good" holds one batch."""
    # The store itself does not check records.
    with PartitionLogStore(tmp_path / "bad-0") as store:
        for batch in (batch_of(1), batch_of(*POISON_TIMESTAMPS), batch_of(3)):
            store.append(batch)
    with PartitionLogStore(tmp_path / "good-0") as store:
        store.append(batch_of(7, 8))
    bad, good = open_partition(tmp_path / "bad-0", "bad"), open_partition(tmp_path / "good-0")
    try:
        yield bad, good
    finally:
        bad.close()
        good.close()


@pytest.mark.parametrize("committed", [False, True])
def test_an_unreadable_stored_batch_fails_only_fetches_that_start_at_it(
    poisoned: tuple[Partition, Partition], committed: bool
) -> None:
    bad, _ = poisoned
    before = bad.fetch(0, 1 << 20, committed)
    assert before.error is ErrorCode.NONE
    assert [r.offset for b in before.batches for r in b.records] == [0]
    assert before.next_fetch_offset == 1  # stops in front of the unreadable batch
    for offset in (1, 2):
        at = bad.fetch(offset, 1 << 20, committed)
        assert at.error is ErrorCode.CORRUPT_MESSAGE
        assert "offsets 1..2" in at.message
        assert (at.next_fetch_offset, at.batches, at.high_watermark) == (offset, [], 4)
    after = bad.fetch(3, 1 << 20, committed)
    assert after.error is ErrorCode.NONE
    assert [r.offset for b in after.batches for r in b.records] == [3]


def service_over(*partitions: Partition) -> PartitionLogService:
    by_topic = {p.topic: p for p in partitions}
    return PartitionLogService(
        lambda topic, i, _epoch: (
            by_topic.get(topic) or (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no")
        ),
        None,  # type: ignore[arg-type]  # no transactional batches here
        1 << 20,
    )


@pytest.mark.parametrize("isolation", [common_pb2.READ_UNCOMMITTED, common_pb2.READ_COMMITTED])
def test_a_fetch_serves_the_healthy_partition_beside_an_unreadable_one(
    poisoned: tuple[Partition, Partition], isolation: int
) -> None:
    service = service_over(*poisoned)
    answer = service.Fetch(
        partition_log_pb2.FetchRequest(
            isolation_level=isolation,  # type: ignore[arg-type]
            partitions=[
                partition_log_pb2.FetchPartition(topic="bad", partition=0, fetch_offset=1),
                partition_log_pb2.FetchPartition(topic="t", partition=0, fetch_offset=0),
            ],
        ),
        None,
    )
    bad, good = answer.partitions
    assert (bad.error_code, list(bad.records)) == (ErrorCode.CORRUPT_MESSAGE, [])
    assert good.error_code == ErrorCode.NONE
    assert [(r.offset, r.timestamp_ms) for r in good.records] == [(0, 7), (1, 8)]


def test_produce_refuses_the_poison_batch_and_appends_nothing(tmp_path: Path) -> None:
    part = open_partition(tmp_path / "t-0")
    service = service_over(part)

    def produce(*timestamps: int) -> partition_log_pb2.PartitionProduceResponse:
        batch = partition_log_pb2.RecordBatch(
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            records=[partition_log_pb2.Record(value=b"v", timestamp_ms=ts) for ts in timestamps],
        )
        request = partition_log_pb2.ProduceRequest(
            partitions=[partition_log_pb2.PartitionProduceData(topic="t", partition=0, batch=batch)]
        )
        answer: partition_log_pb2.PartitionProduceResponse = service.Produce(
            request, None
        ).partitions[0]
        return answer

    try:
        for timestamps in (POISON_TIMESTAMPS, (3, -5)):
            refused = produce(*timestamps)
            assert (refused.error_code, refused.base_offset) == (ErrorCode.INVALID_TIMESTAMP, -1)
            assert "timestamp" in refused.error_message
        assert part.offsets() == (0, 0, 0)
        assert produce(INT64_MAX, -1).error_code == ErrorCode.NONE
        assert [
            r.timestamp_ms for b in part.fetch(0, 1 << 20, False).batches for r in b.records
        ] == [
            INT64_MAX,
            -1,
        ]
    finally:
        part.close()
