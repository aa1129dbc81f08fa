"""Produced record batches as Kafka producers encode them, which the Kafka
gateway passes on as they came: checked once by the partition-log node
(partition_log.produced). Batches are made with kafka-python, an
independent implementation of the format."""

from __future__ import annotations

import gzip
import warnings

import lz4.frame
import pytest
import zstandard

from partition_log import codec
from partition_log.produced import BatchTooLarge, accept_produced, decompressed_size
from raftcoord.protocol.errors import ErrorCode

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafka.record.util import calc_crc32c

MIB = 1 << 20
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def batch_bytes(
    values: list[bytes],
    producer_id: int = 7,
    epoch: int = 2,
    sequence: int = 0,
    compression: int = 0,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        2, compression, True, producer_id, epoch, sequence, 2**31 - 1
    )
    for i, value in enumerate(values):
        builder.append(i, 1_000 + i, b"k" if i == 0 else None, value, [("h", b"v")])
    data = bytearray(builder.build())
    data[12:16] = (-1).to_bytes(4, "big", signed=True)  # as producers send it
    return bytes(data)


@pytest.mark.parametrize("compression", CODECS.values(), ids=CODECS.keys())
def test_a_produced_batch_is_stored_uncompressed_with_its_producer_fields(
    compression: int,
) -> None:
    data = batch_bytes([b"a", b"b"], producer_id=7, epoch=2, sequence=5, compression=compression)
    stored = accept_produced(data, 10, MIB)
    header = codec.parse_header(stored)  # refuses a compressed batch
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 5)
    assert header.is_transactional and header.record_count == 2
    records = codec.read_batch(stored)
    assert [(r.key, r.value, r.headers, r.timestamp_ms) for r in records] == [
        (b"k", b"a", (("h", b"v"),), 1_000),
        (None, b"b", (("h", b"v"),), 1_001),
    ]
    if compression == 0:
        assert stored[16:] == data[16:]  # stored as it came


def test_produced_bytes_that_are_not_one_good_v2_batch_are_refused() -> None:
    one = batch_bytes([b"a"])
    cases: dict[str, tuple[bytes, ErrorCode, str]] = {
        "two batches": (one + one, ErrorCode.INVALID_RECORD, "more than one"),
        "empty": (b"", ErrorCode.CORRUPT_MESSAGE, "shorter than its header"),
        "truncated": (one[:-1], ErrorCode.CORRUPT_MESSAGE, "declares"),
        "bit flip": (one[:-1] + bytes([one[-1] ^ 1]), ErrorCode.CORRUPT_MESSAGE, "CRC"),
        "magic 1": (one[:16] + b"\x01" + one[17:], ErrorCode.INVALID_RECORD, "magic"),
        "too many records": (batch_bytes([b"x"] * 11), ErrorCode.INVALID_RECORD, "11 records"),
    }
    for name, (data, code, text) in cases.items():
        with pytest.raises(codec.InvalidBatch, match=text) as caught:
            accept_produced(data, 10, MIB)
        assert caught.value.code is code, name


def test_a_control_batch_or_log_append_time_is_refused() -> None:
    control = codec.encode_control_batch(
        producer_id=7, producer_epoch=3, coordinator_epoch=1, commit=True, timestamp_ms=1_000
    )
    with pytest.raises(codec.InvalidRecord, match="control batch"):
        accept_produced(bytes(control), 10, MIB)
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 2**31 - 1)
    builder.append(0, 1_000, None, b"v", [])
    data = bytearray(builder.build())
    data[22] |= 0x08  # log-append time, which only a broker sets
    data[17:21] = int(calc_crc32c(bytes(data[21:]))).to_bytes(4, "big")
    with pytest.raises(codec.InvalidTimestamp):
        accept_produced(bytes(data), 10, MIB)


@pytest.mark.parametrize("compression", CODECS.values(), ids=CODECS.keys())
def test_a_batch_that_inflates_past_the_limit_is_refused_before_it_is_inflated(
    compression: int,
) -> None:
    """2 MiB of zeros compress to a few kilobytes; with a 1 MiB limit the
    batch is BatchTooLarge (MESSAGE_TOO_LARGE), found holding at most 1 MiB
    + 1 of it."""
    builder = DefaultRecordBatchBuilder(2, compression, True, 7, 2, 0, 2**31 - 1)
    builder.append(0, 1_000, None, bytes(2 * MIB), [])
    data = bytes(builder.build())
    if compression:
        assert len(data) < 200_000
    assert decompressed_size(data, MIB) == MIB + 1
    with pytest.raises(BatchTooLarge) as caught:
        accept_produced(data, 10, MIB)
    assert caught.value.code is ErrorCode.MESSAGE_TOO_LARGE
    size = decompressed_size(data, 8 * MIB)
    assert 2 * MIB < size < 2 * MIB + 100  # the record's bytes and its framing
    (record,) = codec.read_batch(accept_produced(data, 10, 8 * MIB))
    assert record.value is not None and len(record.value) == 2 * MIB


@pytest.mark.parametrize("compression", [1, 3, 4], ids=["gzip", "lz4", "zstd"])
def test_every_member_of_a_compressed_payload_counts(compression: int) -> None:
    """Concatenated gzip members, lz4 or zstd frames are all inflated by the
    reader, so the bound counts them all: three 1 MiB members are 3 MiB."""
    compress = {
        1: gzip.compress,
        3: lz4.frame.compress,
        4: zstandard.ZstdCompressor().compress,
    }[compression]
    header = bytearray(61)
    header[21:23] = compression.to_bytes(2, "big")
    data = bytes(header) + compress(bytes(MIB)) * 3
    assert decompressed_size(data, 2 * MIB) == 2 * MIB + 1
    assert decompressed_size(data, 8 * MIB) == 3 * MIB
