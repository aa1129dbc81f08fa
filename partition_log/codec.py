"""Kafka RecordBatch v2 (magic 2) encoding, through kafka-python's codec.

A partition log stores batches exactly as Kafka lays them out on disk, so the
records, the per-batch CRC-32C and the control batches that carry transaction
markers are Kafka's own format::

    offset  size  field
         0     8  base offset            (assigned by the log; outside the CRC)
         8     4  length                 (bytes after this field)
        12     4  partition leader epoch (outside the CRC)
        16     1  magic = 2
        17     4  CRC-32C of bytes 21..end
        21     2  attributes             (bit 4 transactional, bit 5 control,
                                          bit 3 timestamp type, bits 0-2 codec)
        23     4  last offset delta
        27     8  first timestamp
        35     8  max timestamp
        43     8  producer id
        51     2  producer epoch
        53     4  base sequence
        57     4  records count
        61     -  records

This module only builds and reads batches; kafka-python's
``DefaultRecordBatchBuilder`` / ``DefaultRecordBatch`` do the record-level
work (varints, headers). Only uncompressed batches are written, and
:func:`parse_header` rejects any other compression type. :func:`read_batch`
checks a data batch completely (the checks Kafka's broker makes on a
produced batch, and that every value fits the protocol's types), so that
what is appended can always be read back and served.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from raftcoord.protocol.errors import ErrorCode

with warnings.catch_warnings():
    # Importing kafka-python 3 loads its protocol schemas through importlib.resources'
    # legacy read_text/open_text, which warn (an error under the test suite's filters).
    warnings.filterwarnings(
        "ignore", message=r"(read|open)_text is deprecated", category=DeprecationWarning
    )
    from kafka.errors import CorruptRecordError
    from kafka.record.default_records import (
        ControlRecord,
        DefaultRecordBatch,
        DefaultRecordBatchBuilder,
    )
    from kafka.record.util import calc_crc32c

__all__ = [
    "HEADER_SIZE",
    "BatchHeader",
    "ControlMarker",
    "CorruptBatch",
    "InvalidBatch",
    "InvalidRecord",
    "InvalidTimestamp",
    "RecordData",
    "StoredRecord",
    "control_is_commit",
    "crc_ok",
    "crc_ok_to_end",
    "encode_batch",
    "encode_control_batch",
    "parse_header",
    "read_batch",
    "read_marker",
    "set_base_offset",
]

Buffer = bytes | bytearray | memoryview

_HEADER: struct.Struct = DefaultRecordBatch.HEADER_STRUCT
HEADER_SIZE: int = _HEADER.size
"""Size of the v2 batch header, records count included (61 bytes)."""

LOG_OVERHEAD = 12
"""The base offset and length fields in front of what the length counts."""

_MAGIC = 2
_CRC_POS: int = DefaultRecordBatch.CRC_OFFSET
_ATTRIBUTES_POS: int = DefaultRecordBatch.ATTRIBUTES_OFFSET
_CODEC_MASK: int = DefaultRecordBatch.CODEC_MASK
_TIMESTAMP_TYPE: int = DefaultRecordBatch.TIMESTAMP_TYPE_MASK
_TRANSACTIONAL: int = DefaultRecordBatch.TRANSACTIONAL_MASK
_CONTROL: int = DefaultRecordBatch.CONTROL_MASK
_KNOWN_ATTRIBUTES = _CODEC_MASK | _TIMESTAMP_TYPE | _TRANSACTIONAL | _CONTROL
_INT32_MAX = 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_NO_SEQUENCE = -1
_NO_TIMESTAMP = -1

# Kafka's control record key (version, type) and end-transaction-marker value
# (version, coordinator epoch).
_CONTROL_KEY = struct.Struct(">hh")
_MARKER_VALUE = struct.Struct(">hi")
#: What this node writes after the marker value: the transaction's number.
_TXN_NUMBER = struct.Struct(">q")
_ABORT, _COMMIT = 0, 1

_BASE_OFFSET = struct.Struct(">q")
_LEADER_EPOCH = struct.Struct(">i")
_LEADER_EPOCH_AT = 12
_CRC = struct.Struct(">I")


class InvalidBatch(ValueError):
    """A batch that may not be appended (or, read from a log, cannot be served);
    ``code`` is the error code Kafka answers for it."""

    code: ClassVar[ErrorCode]


class CorruptBatch(InvalidBatch):
    """A batch is not a readable uncompressed v2 batch (bad magic, length or CRC)."""

    code = ErrorCode.CORRUPT_MESSAGE


class InvalidRecord(InvalidBatch):
    """A readable batch breaks the format's rules: its records cannot be decoded,
    their count or offsets disagree with the header, or its attributes or
    producer fields are not allowed in a produced batch."""

    code = ErrorCode.INVALID_RECORD


class InvalidTimestamp(InvalidBatch):
    """A record's timestamp is neither -1 (none) nor in 0..2**63-1, its delta from
    the batch's first timestamp does not fit in 64 bits, or the batch claims
    log-append time (which only a broker may set)."""

    code = ErrorCode.INVALID_TIMESTAMP


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed header of one v2 batch.

    ``size`` counts every byte of the batch, the 12-byte base offset and
    length prefix included, so the next batch in a segment starts at
    ``position + size``.
    """

    base_offset: int
    size: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_transactional: bool
    is_control: bool
    record_count: int
    #: The leader epoch of the leader that appended the batch.
    partition_leader_epoch: int = 0

    @property
    def last_offset(self) -> int:
        """Offset of the batch's last record."""
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        """Offset right after the batch (the next batch's base offset)."""
        return self.base_offset + self.last_offset_delta + 1

    @property
    def last_sequence(self) -> int:
        """Sequence number of the last record, wrapping past int32 max as Kafka does.

        -1 when the batch carries no sequence (``base_sequence == -1``).
        """
        if self.base_sequence == _NO_SEQUENCE:
            return _NO_SEQUENCE
        if self.base_sequence > _INT32_MAX - self.last_offset_delta:
            return self.last_offset_delta - (_INT32_MAX - self.base_sequence) - 1
        return self.base_sequence + self.last_offset_delta


@dataclass(frozen=True, slots=True)
class RecordData:
    """One record as a producer sends it.

    ``None`` and ``b""`` are different keys (and values): ``None`` is Kafka's
    null, a ``None`` value is a tombstone.
    """

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """One record of a data batch as read back from the log."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


class ControlMarker(NamedTuple):
    """The transaction marker in a control batch: COMMIT (``commit``) or ABORT,
    and its transaction's number (-1 when the marker does not carry one)."""

    commit: bool
    coordinator_epoch: int
    txn_number: int = -1


class _ControlBatchBuilder(DefaultRecordBatchBuilder):  # type: ignore[misc]
    """kafka-python's builder with the control bit set (it only ever sets transactional)."""

    __slots__ = ()

    def _get_attributes(self, include_compression_type: bool = True) -> int:
        attributes: int = super()._get_attributes(include_compression_type)
        return attributes | _CONTROL


def encode_batch(
    records: Sequence[RecordData],
    *,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    transactional: bool,
) -> bytearray:
    """Build an uncompressed data batch with base offset 0 and offset deltas 0..n-1.

    Returns:
        The batch bytes, CRC included; the log assigns the base offset on append
        (:func:`set_base_offset`).

    Raises:
        ValueError: ``records`` is empty, or a transactional batch has no producer id.
    """
    if not records:
        raise ValueError("a batch needs at least one record")
    if transactional and producer_id < 0:
        raise ValueError("a transactional batch needs a producer id")
    builder = DefaultRecordBatchBuilder(
        magic=_MAGIC,
        compression_type=0,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=_INT32_MAX,
    )
    for delta, record in enumerate(records):
        builder.append(delta, record.timestamp_ms, record.key, record.value, list(record.headers))
    batch: bytearray = builder.build()
    return batch


def encode_control_batch(
    *,
    commit: bool,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    timestamp_ms: int,
    txn_number: int = -1,
) -> bytearray:
    """Build Kafka's end-transaction control batch (a COMMIT or ABORT marker).

    Attributes are transactional | control; the batch has no sequence (-1) and
    one record whose key is ``(version 0, type)`` (type 0 abort, 1 commit) and
    whose value is ``(version 0, coordinator_epoch)``, followed, when the
    transaction's number is known, by that number (int64): Kafka's readers
    read the first two fields and no further, and this node reads the number
    back when it rebuilds its state, so a marker once written is never
    written again for the same transaction.

    Returns:
        The batch bytes with base offset 0.
    """
    builder = _ControlBatchBuilder(
        magic=_MAGIC,
        compression_type=0,
        is_transactional=True,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=_NO_SEQUENCE,
        batch_size=_INT32_MAX,
    )
    key = _CONTROL_KEY.pack(0, _COMMIT if commit else _ABORT)
    value = _MARKER_VALUE.pack(0, coordinator_epoch)
    if txn_number >= 0:
        value += _TXN_NUMBER.pack(txn_number)
    builder.append(0, timestamp_ms, key, value, [])
    batch: bytearray = builder.build()
    return batch


def set_base_offset(batch: bytearray, base_offset: int) -> None:
    """Stamp ``base_offset`` into ``batch`` in place (it is outside the CRC)."""
    _BASE_OFFSET.pack_into(batch, 0, base_offset)


def set_partition_leader_epoch(batch: bytearray, leader_epoch: int) -> None:
    """Stamp ``leader_epoch`` into ``batch`` in place (it is outside the CRC)."""
    _LEADER_EPOCH.pack_into(batch, _LEADER_EPOCH_AT, leader_epoch)


def parse_header(buf: Buffer, pos: int = 0) -> BatchHeader:
    """Read the header of the batch that starts at ``buf[pos]``.

    Only the 61 header bytes need to be present; the body is not checked (see
    :func:`crc_ok`).

    Raises:
        CorruptBatch: fewer than 61 bytes, magic other than 2, a length too
            small for the header, a negative offset delta or record count, or a
            compressed batch.
    """
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptBatch(f"incomplete batch header: {len(buf) - pos} of {HEADER_SIZE} bytes")
    (
        base_offset,
        length,
        leader_epoch,
        magic,
        _crc,
        attributes,
        last_offset_delta,
        first_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    ) = _HEADER.unpack_from(buf, pos)
    if magic != _MAGIC:
        raise CorruptBatch(f"unsupported magic {magic} (only v2 batches)")
    if length < HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptBatch(f"batch length {length} is shorter than its header")
    if last_offset_delta < 0 or record_count < 0:
        raise CorruptBatch(
            f"negative last offset delta ({last_offset_delta}) or record count ({record_count})"
        )
    if attributes & _CODEC_MASK:
        raise CorruptBatch(f"compressed batch (codec {attributes & _CODEC_MASK}) not supported")
    return BatchHeader(
        base_offset=base_offset,
        size=length + LOG_OVERHEAD,
        last_offset_delta=last_offset_delta,
        first_timestamp=first_timestamp,
        max_timestamp=max_timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        is_transactional=bool(attributes & _TRANSACTIONAL),
        is_control=bool(attributes & _CONTROL),
        record_count=record_count,
        partition_leader_epoch=leader_epoch,
    )


def crc_ok(buf: Buffer) -> bool:
    """Whether the batch at the start of ``buf`` is whole and matches its CRC-32C.

    The batch's own length field bounds the checked bytes; a buffer shorter
    than that length, or than a header, is not OK.
    """
    if len(buf) < HEADER_SIZE:
        return False
    size = int.from_bytes(buf[8:12], "big", signed=True) + LOG_OVERHEAD
    if size < HEADER_SIZE or len(buf) < size:
        return False
    stored: int = _CRC.unpack_from(buf, _CRC_POS)[0]
    with memoryview(buf) as view:
        actual: int = calc_crc32c(view[_ATTRIBUTES_POS:size])
    return stored == actual


def crc_ok_to_end(buf: Buffer) -> bool:
    """Whether all of ``buf``, taken as one batch whatever its length field
    says, matches the batch's CRC-32C: a whole batch whose length field
    (which the CRC does not cover) was damaged."""
    if len(buf) < HEADER_SIZE:
        return False
    stored: int = _CRC.unpack_from(buf, _CRC_POS)[0]
    with memoryview(buf) as view:
        actual: int = calc_crc32c(view[_ATTRIBUTES_POS:])
    return stored == actual


def read_batch(batch: Buffer) -> list[StoredRecord]:
    """Check a data batch completely and decode its records.

    A batch that passes can be appended, and every record of it fits a Fetch
    answer. Checked, in this order: the header (:func:`parse_header`), that
    the length field covers exactly ``batch``, the CRC, the attributes, the
    producer fields, the record count against the offsets, then every record
    (decodable, offset delta = its index, timestamp).

    Raises:
        CorruptBatch: an unreadable header, a length other than ``len(batch)``
            or a CRC mismatch.
        InvalidRecord: a control batch, unknown attribute bits, a producer id
            without a base sequence or a transactional batch without a producer
            id, a record count that is not positive or disagrees with the last
            offset delta or with the records present, an undecodable record, an
            offset delta other than the record's index, or a max timestamp
            other than the records' largest.
        InvalidTimestamp: a log-append-time batch, a timestamp delta outside
            int64, or a timestamp other than -1 and outside 0..2**63-1.
    """
    header = parse_header(batch)
    if header.size != len(batch):
        raise CorruptBatch(f"the batch declares {header.size} bytes but has {len(batch)}")
    if not crc_ok(batch):
        raise CorruptBatch("CRC-32C mismatch")
    attributes: int = struct.unpack_from(">h", batch, _ATTRIBUTES_POS)[0]
    if header.is_control:
        raise InvalidRecord("a control batch where a data batch was expected")
    if attributes & ~_KNOWN_ATTRIBUTES:
        raise InvalidRecord(f"unknown attribute bits 0x{attributes & ~_KNOWN_ATTRIBUTES:x}")
    if attributes & _TIMESTAMP_TYPE:
        raise InvalidTimestamp("log-append time is set by a broker, never by a producer")
    if header.producer_id >= 0 and header.base_sequence < 0:
        raise InvalidRecord(f"producer id {header.producer_id} without a base sequence")
    if header.is_transactional and header.producer_id < 0:
        raise InvalidRecord("a transactional batch without a producer id")
    if header.record_count <= 0 or header.record_count != header.last_offset_delta + 1:
        raise InvalidRecord(
            f"record count {header.record_count} does not match the offset range "
            f"0..{header.last_offset_delta}"
        )
    try:
        decoded = list(DefaultRecordBatch(batch))
    except (CorruptRecordError, ValueError, IndexError) as err:
        raise InvalidRecord(f"undecodable records: {err}") from err
    out: list[StoredRecord] = []
    for index, record in enumerate(decoded):
        delta = record.offset - header.base_offset
        if delta != index:
            raise InvalidRecord(f"record {index} has offset delta {delta}")
        timestamp: int = record.timestamp
        if not _INT64_MIN <= timestamp - header.first_timestamp <= _INT64_MAX:
            raise InvalidTimestamp(
                f"record {index}: the timestamp delta does not fit in 64 bits "
                f"(the batch's timestamps are too far apart)"
            )
        if timestamp != _NO_TIMESTAMP and not 0 <= timestamp <= _INT64_MAX:
            raise InvalidTimestamp(f"record {index}: invalid timestamp {timestamp}")
        headers = tuple((k, b"" if v is None else v) for k, v in record.headers)
        out.append(StoredRecord(record.offset, timestamp, record.key, record.value, headers))
    largest = max(r.timestamp_ms for r in out)
    if header.max_timestamp != largest:
        raise InvalidRecord(
            f"max timestamp {header.max_timestamp} in the header, {largest} in the records"
        )
    return out


def read_marker(batch: Buffer) -> ControlMarker:
    """Read the COMMIT/ABORT marker of a control batch.

    Raises:
        CorruptBatch: not a control batch, not exactly one record, or an
            unknown key version, marker type or value version.
    """
    header = parse_header(batch)
    if not header.is_control:
        raise CorruptBatch("not a control batch")
    try:
        records = list(DefaultRecordBatch(batch[: header.size]))
    except (CorruptRecordError, ValueError, IndexError, struct.error) as err:
        raise CorruptBatch(f"undecodable control batch: {err}") from err
    if len(records) != 1 or not isinstance(records[0], ControlRecord):
        raise CorruptBatch(f"a control batch holds one record, found {len(records)}")
    record = records[0]
    if record.version != 0 or record.type not in (_ABORT, _COMMIT):
        raise CorruptBatch(f"unknown control record version {record.version} type {record.type}")
    value = record.value
    if value is None or len(value) < _MARKER_VALUE.size:
        raise CorruptBatch("control record without an end-transaction-marker value")
    version, coordinator_epoch = _MARKER_VALUE.unpack_from(value)
    if version != 0:
        raise CorruptBatch(f"unknown end-transaction-marker version {version}")
    txn_number = -1
    if len(value) >= _MARKER_VALUE.size + _TXN_NUMBER.size:
        (txn_number,) = _TXN_NUMBER.unpack_from(value, _MARKER_VALUE.size)
    return ControlMarker(record.type == _COMMIT, coordinator_epoch, txn_number)


def control_is_commit(batch: Buffer) -> bool:
    """True for a COMMIT marker batch, False for ABORT.

    Raises:
        CorruptBatch: as :func:`read_marker`.
    """
    return read_marker(batch).commit
