"""Produced record batches on their way to the partition logs.

The gateway passes a produced partition's bytes to its partition-log node
as they came (``raw_batch`` of the Produce RPC), and the node checks them
once (:mod:`partition_log.produced`). What the gateway may change is the
producer identity in the batch header, where its epoch book translates it
(:mod:`raftcoord.kafka.epochs`): those fields lie inside the CRC-32C, so
the checksum is computed again over the translated batch. Fetched batches
come back from the node as they are stored and go to the client unchanged.
"""

from __future__ import annotations

import struct
import warnings

with warnings.catch_warnings():
    # kafka-python 3 loads its protocol schemas through importlib.resources'
    # legacy read_text/open_text, which warn.
    warnings.filterwarnings(
        "ignore", message=r"(read|open)_text is deprecated", category=DeprecationWarning
    )
    from kafka.record.util import calc_crc32c

#: A v2 batch header up to its records count: the length of what follows
#: it at 8, magic at 16, CRC-32C at 17 (over everything from the attributes
#: at 21 on), producer id at 43, epoch at 51, base sequence at 53.
_HEADER_SIZE = 61
_LENGTH = struct.Struct(">i")
_LENGTH_AT = 8
_MAGIC_AT = 16
_CRC = struct.Struct(">I")
_CRC_AT = 17
_CHECKED_FROM = 21
_IDENTITY = struct.Struct(">qhi")
_IDENTITY_AT = 43


def producer_identity(data: bytes) -> tuple[int, int, int] | None:
    """(producer id, epoch, base sequence) of the v2 batch ``data``, or None
    when ``data`` is not one (the partition-log node refuses it then)."""
    if len(data) < _HEADER_SIZE or data[_MAGIC_AT] != 2:
        return None
    producer_id, epoch, sequence = _IDENTITY.unpack_from(data, _IDENTITY_AT)
    return producer_id, epoch, sequence


def with_identity(data: bytes, producer_id: int, epoch: int, sequence: int) -> bytes:
    """``data`` (a v2 batch, :func:`producer_identity` not None) with another
    producer identity and its CRC-32C computed again over the bytes its
    length field covers; a batch whose CRC did not match before still does
    not, so the node refuses it as it would have."""
    batch = bytearray(data)
    (length,) = _LENGTH.unpack_from(batch, _LENGTH_AT)
    end = min(len(batch), _LENGTH_AT + _LENGTH.size + max(length, 0))
    (stored,) = _CRC.unpack_from(batch, _CRC_AT)
    matched = stored == calc_crc32c(memoryview(batch)[_CHECKED_FROM:end])
    _IDENTITY.pack_into(batch, _IDENTITY_AT, producer_id, epoch, sequence)
    crc = calc_crc32c(memoryview(batch)[_CHECKED_FROM:end])
    _CRC.pack_into(batch, _CRC_AT, crc if matched else crc ^ 1)
    return bytes(batch)
