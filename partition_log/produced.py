"""A record batch as a Kafka producer encoded it, checked once and made
what a partition log stores.

The Kafka gateway passes a produced batch's bytes through unchanged
(``raw_batch`` of the Produce RPC), so this is the one place they are
checked: exactly one RecordBatch v2 whose length field covers the bytes
given, its CRC-32C, not a control batch, at most ``max_records`` records,
then everything :func:`partition_log.codec.read_batch` checks. An
uncompressed batch is stored as it came. A compressed one (gzip, snappy,
lz4, zstd) is stored as an uncompressed batch of its records (the logs hold
only uncompressed batches), after its records' inflated size was found to
be within ``max_bytes`` without inflating more than that: a few kilobytes
that would inflate to gigabytes are refused first.
"""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from collections.abc import Callable
from typing import Any

import lz4.frame
import zstandard

from partition_log import codec
from partition_log.codec import CorruptBatch, InvalidBatch, InvalidRecord, RecordData
from raftcoord.protocol.errors import ErrorCode

with warnings.catch_warnings():
    warnings.filterwarnings(
        "ignore", message=r"(read|open)_text is deprecated", category=DeprecationWarning
    )
    from kafka.errors import KafkaError
    from kafka.record.default_records import DefaultRecordBatch

__all__ = ["BatchTooLarge", "accept_produced", "decompressed_size"]

_HEADER = DefaultRecordBatch.HEADER_STRUCT
_CODEC_MASK: int = DefaultRecordBatch.CODEC_MASK
_CONTROL: int = DefaultRecordBatch.CONTROL_MASK
_MAGIC = 2
#: A v2 batch's records start after its 61-byte header.
_RECORDS_AT = codec.HEADER_SIZE
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


class BatchTooLarge(InvalidBatch):
    """A batch whose records inflate to more than message.max.bytes."""

    code = ErrorCode.MESSAGE_TOO_LARGE


def accept_produced(data: bytes, max_records: int, max_bytes: int) -> bytearray:
    """The batch to append for the produced bytes ``data`` (the partition
    stamps its leader epoch and the log its base offset, both outside the CRC).

    Raises:
        CorruptBatch: shorter than a header or than its length field, or a
            CRC mismatch.
        InvalidRecord: another magic than 2, more than one batch, a control
            batch, more than ``max_records`` records,
            compressed records that do not decode, or whatever
            :func:`partition_log.codec.read_batch` refuses.
        InvalidTimestamp: as :func:`partition_log.codec.read_batch`.
        BatchTooLarge: more than ``max_bytes``, or records inflating to more.
    """
    if len(data) < codec.HEADER_SIZE:
        raise CorruptBatch(f"a record batch of {len(data)} bytes, shorter than its header")
    fields = _HEADER.unpack_from(data)
    length, magic, attributes, record_count = fields[1], fields[3], fields[5], fields[12]
    if magic != _MAGIC:  # Kafka's answer for produce requests from version 3 on
        raise InvalidRecord(f"record batch magic {magic}; only magic 2 is accepted")
    size = length + codec.LOG_OVERHEAD
    if size < len(data):
        raise InvalidRecord("more than one record batch for one partition")
    if size > len(data):
        raise CorruptBatch(f"the batch declares {size} bytes but has {len(data)}")
    if not codec.crc_ok(data):
        raise CorruptBatch("record batch CRC mismatch")
    if attributes & _CONTROL:
        raise InvalidRecord("a client may not produce a control batch")
    if not 0 < record_count <= max_records:
        raise InvalidRecord(f"the batch declares {record_count} records, not 1..{max_records}")
    if not attributes & _CODEC_MASK:
        if len(data) > max_bytes:
            raise BatchTooLarge(f"batch of {len(data)} bytes exceeds {max_bytes}")
        batch = bytearray(data)
        codec.read_batch(batch)
        return batch
    if decompressed_size(data, max_bytes) > max_bytes:
        raise BatchTooLarge(f"the batch's records decompress to more than {max_bytes} bytes")
    try:
        records = [
            RecordData(
                key=r.key,
                value=r.value,
                headers=tuple((k, b"" if v is None else v) for k, v in r.headers),
                timestamp_ms=r.timestamp,
            )
            for r in DefaultRecordBatch(bytes(data))
        ]
        if len(records) != record_count:
            raise ValueError(f"{len(records)} records where the header declares {record_count}")
        batch = codec.encode_batch(
            records,
            producer_id=fields[9],
            producer_epoch=fields[10],
            base_sequence=fields[11],
            transactional=bool(attributes & DefaultRecordBatch.TRANSACTIONAL_MASK),
        )
    except (KafkaError, ValueError, struct.error, IndexError, TypeError, OverflowError) as exc:
        raise InvalidRecord(f"compressed records do not decode: {exc}") from exc
    codec.read_batch(batch)
    return batch


def decompressed_size(data: bytes, limit: int) -> int:
    """How many bytes the records of the v2 batch ``data`` decompress to,
    found without holding more than ``limit`` + 1 of them (a larger answer
    is ``limit`` + 1).

    Raises:
        InvalidRecord: the compressed records do not decode, or an unknown codec.
    """
    if len(data) < _RECORDS_AT:
        raise CorruptBatch("a record batch shorter than its header")
    attributes = _HEADER.unpack_from(data)[5]
    payload = memoryview(data)[_RECORDS_AT:]
    kind = attributes & _CODEC_MASK
    try:
        if kind == 0:
            return min(len(payload), limit + 1)
        if kind == 1:  # gzip, maybe several members (the reader inflates them all)
            return _members_size(
                bytes(payload),
                limit,
                lambda data, most: _unused_after(
                    zlib.decompressobj(16 + zlib.MAX_WBITS), data, most
                ),
            )
        if kind == 2:  # snappy: raw, or xerial blocks; each block's length leads it
            return min(_snappy_size(bytes(payload)), limit + 1)
        if kind == 3:  # lz4, maybe several frames
            return _members_size(
                bytes(payload),
                limit,
                lambda data, most: _unused_after(lz4.frame.LZ4FrameDecompressor(), data, most),
            )
        if kind == 4:  # zstd, maybe several frames
            reader = zstandard.ZstdDecompressor().stream_reader(
                io.BytesIO(payload), read_across_frames=True
            )
            return len(reader.read(limit + 1))
    except (zlib.error, RuntimeError, zstandard.ZstdError, ValueError, struct.error) as exc:
        raise InvalidRecord(f"compressed records do not decode: {exc}") from exc
    raise InvalidRecord(f"unknown compression codec {kind}")


def _unused_after(decompressor: Any, data: bytes, most: int) -> tuple[int, bytes]:
    """(bytes ``decompressor`` inflates the first member of ``data`` to, at
    most ``most``; what follows that member, b"" when it is not finished)."""
    if isinstance(decompressor, lz4.frame.LZ4FrameDecompressor):
        size = len(decompressor.decompress(data, max_length=most))
        return size, decompressor.unused_data if decompressor.eof else b""
    size = len(decompressor.decompress(data, most))
    return size, decompressor.unused_data if decompressor.eof else b""


def _members_size(data: bytes, limit: int, first: Callable[[bytes, int], tuple[int, bytes]]) -> int:
    """The inflated size of concatenated members (gzip members, lz4 frames),
    ``limit`` + 1 when larger; ``first`` inflates one member."""
    total = 0
    while data and total <= limit:
        size, data = first(data, limit + 1 - total)
        total += size
    return min(total, limit + 1)


def _snappy_size(payload: bytes) -> int:
    """The uncompressed size of a Kafka snappy payload: raw snappy, or
    Xerial's framing (a 16-byte header, then blocks each led by its length)."""
    if not payload.startswith(_XERIAL_MAGIC):
        return _snappy_block_size(payload)
    total, cursor = 0, 16
    while cursor < len(payload):
        (size,) = struct.unpack_from(">i", payload, cursor)
        cursor += 4
        if size < 0:
            raise ValueError("negative snappy block size")
        total += _snappy_block_size(payload[cursor : cursor + size])
        cursor += size
    return total


def _snappy_block_size(block: bytes) -> int:
    """A raw snappy block's uncompressed length: the varint it starts with."""
    size = 0
    for i, byte in enumerate(block[:5]):
        size |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return size
    raise ValueError("a snappy block without its length")
