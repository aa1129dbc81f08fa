"""RecordBatch v2 between Kafka clients and the partition-log API.

A produced batch is read with kafka-python's record codec (the one the
partition logs store their segments with) into the partition-log
``RecordBatch`` message, keeping its producer id, epoch, base sequence,
transactional flag and every record's key, value, headers and timestamp;
the partition log writes it back as a v2 batch. Fetched records are put into
v2 batches again, one batch per run of records of one producer epoch, with
their log offsets (gaps allowed, as after compaction); the last batch's last
offset delta covers the offsets the log skipped after the last record
(COMMIT/ABORT markers, aborted records under read_committed) so that the
client's next fetch starts where the log's would.
"""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import lz4.frame
import zstandard

from raftcoord.protocol.v1 import partition_log_pb2

with warnings.catch_warnings():
    # kafka-python 3 loads its protocol schemas through importlib.resources'
    # legacy read_text/open_text, which warn.
    warnings.filterwarnings(
        "ignore", message=r"(read|open)_text is deprecated", category=DeprecationWarning
    )
    from kafka.errors import KafkaError
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafka.record.memory_records import MemoryRecords

_INT32_MAX = 2**31 - 1
_BASE_OFFSET = struct.Struct(">q")
_MAGIC = 2


class BadBatch(ValueError):
    """Produced bytes that are not exactly one readable v2 record batch."""


class BatchTooLarge(BadBatch):
    """A batch whose records decompress to more bytes than allowed."""


#: A v2 batch's records start after its 61-byte header; its attributes
#: (the codec in their low 3 bits) sit at offset 21.
_RECORDS_AT = 61
_ATTRIBUTES = struct.Struct(">h")
_ATTRIBUTES_AT = 21
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def decompressed_size(data: bytes, limit: int) -> int:
    """How many bytes the records of the v2 batch ``data`` decompress to,
    found without holding more than ``limit`` + 1 of them (a larger answer
    is ``limit`` + 1): a few kilobytes that would inflate to gigabytes are
    refused before they are inflated.

    Raises:
        BadBatch: the compressed records do not decode.
    """
    if len(data) < _RECORDS_AT:
        raise BadBatch("a record batch shorter than its header")
    (attributes,) = _ATTRIBUTES.unpack_from(data, _ATTRIBUTES_AT)
    payload = memoryview(data)[_RECORDS_AT:]
    codec = attributes & 0x7
    try:
        if codec == 0:
            return min(len(payload), limit + 1)
        if codec == 1:  # gzip, maybe several members (the reader inflates them all)
            return _members_size(
                bytes(payload),
                limit,
                lambda data, most: _unused_after(
                    zlib.decompressobj(16 + zlib.MAX_WBITS), data, most
                ),
            )
        if codec == 2:  # snappy: raw, or xerial blocks; each block's length leads it
            return min(_snappy_size(bytes(payload)), limit + 1)
        if codec == 3:  # lz4, maybe several frames
            return _members_size(
                bytes(payload),
                limit,
                lambda data, most: _unused_after(lz4.frame.LZ4FrameDecompressor(), data, most),
            )
        if codec == 4:  # zstd, maybe several frames
            reader = zstandard.ZstdDecompressor().stream_reader(
                io.BytesIO(payload), read_across_frames=True
            )
            return len(reader.read(limit + 1))
    except (zlib.error, RuntimeError, zstandard.ZstdError, ValueError, struct.error) as exc:
        raise BadBatch(f"compressed records do not decode: {exc}") from exc
    raise BadBatch(f"unknown compression codec {codec}")


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
    """The uncompressed size of kafka-python's snappy payload: raw snappy, or
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


def produced_batch(data: bytes, max_records: int, max_bytes: int) -> partition_log_pb2.RecordBatch:
    """The one v2 batch of a Produce request's partition as the partition-log message.

    Raises:
        BatchTooLarge: its records decompress to more than ``max_bytes``.
        BadBatch: ``data`` holds no batch, more than one (Kafka accepts exactly
            one per partition from version 3 on), another magic, a control
            batch, more than ``max_records`` records (checked, like the
            size, before anything is decompressed), or bytes that do not decode.
    """
    try:
        records = MemoryRecords(data)
        batch = records.next_batch()
        if batch is None:
            raise BadBatch("no record batch")
        if records.has_next():
            raise BadBatch("more than one record batch for one partition")
        if batch.magic != _MAGIC:
            raise BadBatch(f"record batch magic {batch.magic}; only magic 2 is accepted")
        if batch.is_control_batch:
            raise BadBatch("a client may not produce a control batch")
        if not batch.validate_crc():
            raise BadBatch("record batch CRC mismatch")
        if batch.records_count > max_records:
            raise BadBatch(
                f"the batch declares {batch.records_count} records, more than {max_records}"
            )
        if decompressed_size(data, max_bytes) > max_bytes:
            raise BatchTooLarge(f"the batch's records decompress to more than {max_bytes} bytes")
        out = partition_log_pb2.RecordBatch(
            producer_id=batch.producer_id,
            producer_epoch=batch.producer_epoch,
            base_sequence=batch.base_sequence,
            is_transactional=batch.is_transactional,
        )
        for record in batch:
            out.records.append(
                partition_log_pb2.Record(
                    key=record.key,
                    value=record.value,
                    headers=[
                        partition_log_pb2.RecordHeader(key=k, value=v or b"")
                        for k, v in record.headers
                    ],
                    timestamp_ms=record.timestamp,
                )
            )
    except (KafkaError, ValueError, struct.error, IndexError, TypeError) as exc:
        if isinstance(exc, BadBatch):
            raise
        raise BadBatch(f"record batch does not decode: {exc}") from exc
    return out


class _CoveringBuilder(DefaultRecordBatchBuilder):  # type: ignore[misc]
    """kafka-python's builder whose batch may end past its last record."""

    def cover(self, last_offset_delta: int) -> None:
        """Make the batch's last offset delta ``last_offset_delta`` (not lower than now)."""
        self._last_offset: int = max(self._last_offset, last_offset_delta)


def _builder(producer_id: int, producer_epoch: int, transactional: bool) -> _CoveringBuilder:
    return _CoveringBuilder(
        magic=_MAGIC,
        compression_type=0,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=-1,
        batch_size=_INT32_MAX,
    )


def fetched_batches(
    records: Sequence[partition_log_pb2.FetchedRecord], fetch_offset: int, next_fetch_offset: int
) -> bytes:
    """The v2 batches a Kafka client reads for ``records``, ending at ``next_fetch_offset``.

    An empty answer whose next fetch offset moved (the log skipped markers or
    aborted records) is one empty batch over the skipped offsets, as Kafka
    leaves after compaction.
    """
    out = bytearray()

    def flush(builder: _CoveringBuilder, base: int) -> None:
        batch = builder.build()
        _BASE_OFFSET.pack_into(batch, 0, base)
        out.extend(batch)

    builder: _CoveringBuilder | None = None
    base = fetch_offset
    key: tuple[int, int, bool] | None = None
    for record in records:
        this = (record.producer_id, record.producer_epoch, record.is_transactional)
        if builder is None or this != key:
            if builder is not None:
                flush(builder, base)
            builder, base, key = _builder(*this), record.offset, this
        builder.append(
            record.offset - base,
            record.timestamp_ms,
            record.key if record.HasField("key") else None,
            record.value if record.HasField("value") else None,
            [(h.key, h.value) for h in record.headers],
        )
    if builder is None:
        if next_fetch_offset <= fetch_offset:
            return b""
        builder = _builder(-1, -1, False)
    builder.cover(next_fetch_offset - 1 - base)
    flush(builder, base)
    return bytes(out)
