"""Kafka request and response messages, through kio's schemas.

kio's classes are generated from Kafka's own message schemas, one class per
API, version and direction, flexible versions and tagged fields included.
This module frames them (size prefix, request and response headers), keeps
the table of the versions the gateway implements (what ApiVersions
advertises), and builds a response of any version from one plain
description: :func:`build` fills the fields that the chosen version has and
drops the others, so that a handler is written once for all its versions.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import io
import struct
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.serial import entity_reader, entity_writer
from kio.serial._introspect import (
    EntityTupleField,
    PrimitiveField,
    classify_field,
    get_schema_field_type,
    is_optional,
)
from kio.serial._parse import get_field_reader, get_reader
from kio.serial.readers import (
    read_compact_array_length,
    read_int8,
    read_legacy_array_length,
    read_unsigned_varint,
)

# API keys, Kafka's numbers.
PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
SASL_HANDSHAKE = 17
API_VERSIONS = 18
CREATE_TOPICS = 19
INIT_PRODUCER_ID = 22
ADD_PARTITIONS_TO_TXN = 24
ADD_OFFSETS_TO_TXN = 25
END_TXN = 26
TXN_OFFSET_COMMIT = 28
DESCRIBE_ACLS = 29
CREATE_ACLS = 30
DELETE_ACLS = 31
SASL_AUTHENTICATE = 36
DESCRIBE_TRANSACTIONS = 65
LIST_TRANSACTIONS = 66

#: api key -> (lowest, highest) version the gateway implements; ApiVersions
#: advertises exactly these (docs/kafka.md says why each range ends where it does).
SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 9),
    FETCH: (4, 12),
    LIST_OFFSETS: (1, 7),
    METADATA: (1, 8),
    OFFSET_COMMIT: (2, 8),
    OFFSET_FETCH: (1, 7),
    FIND_COORDINATOR: (0, 3),
    JOIN_GROUP: (0, 9),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    SYNC_GROUP: (0, 5),
    DESCRIBE_GROUPS: (0, 5),
    SASL_HANDSHAKE: (1, 1),
    API_VERSIONS: (0, 3),
    CREATE_TOPICS: (2, 7),
    INIT_PRODUCER_ID: (0, 6),
    ADD_PARTITIONS_TO_TXN: (0, 3),
    ADD_OFFSETS_TO_TXN: (0, 3),
    END_TXN: (0, 3),
    TXN_OFFSET_COMMIT: (0, 3),
    DESCRIBE_ACLS: (1, 3),
    CREATE_ACLS: (1, 3),
    DELETE_ACLS: (1, 3),
    SASL_AUTHENTICATE: (0, 2),
    DESCRIBE_TRANSACTIONS: (0, 0),
    LIST_TRANSACTIONS: (0, 1),
}

#: Kafka's UNSUPPORTED_VERSION (not one of the transaction paths' codes).
UNSUPPORTED_VERSION = 35

#: The first version of each API that may answer PRODUCER_FENCED (KIP-588);
#: older versions get INVALID_PRODUCER_EPOCH instead, as from Kafka's brokers.
PRODUCER_FENCED_SINCE = {
    INIT_PRODUCER_ID: 4,
    ADD_PARTITIONS_TO_TXN: 2,
    ADD_OFFSETS_TO_TXN: 2,
    END_TXN: 2,
    TXN_OFFSET_COMMIT: 3,
}
_PRODUCER_FENCED = 90
_INVALID_PRODUCER_EPOCH = 47

_SIZE = struct.Struct(">i")
_KEY_VERSION = struct.Struct(">hh")


class MalformedRequest(ValueError):
    """A frame that is not a request of a supported API and version."""


@dataclass(frozen=True, slots=True)
class Request:
    """A decoded request: its header fields and its body (a kio entity)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any


def api_of(frame: bytes) -> tuple[int, int]:
    """(api key, api version) of a request frame, without decoding the rest.

    Raises:
        MalformedRequest: the frame is too short to hold them.
    """
    if len(frame) < _KEY_VERSION.size:
        raise MalformedRequest("a request shorter than its api key and version")
    key, version = _KEY_VERSION.unpack_from(frame)
    return key, version


def is_supported(api_key: int, api_version: int) -> bool:
    span = SUPPORTED.get(api_key)
    return span is not None and span[0] <= api_version <= span[1]


def decode_request(frame: bytes) -> Request:
    """The request in ``frame`` (a frame without its size prefix).

    Raises:
        MalformedRequest: the api or version is not supported, or the bytes do
            not decode as that request.
    """
    key, version = api_of(frame)
    if not is_supported(key, version):
        raise MalformedRequest(f"api {key} version {version} is not supported")
    schema = load_request_schema(key, version)
    try:
        header, used = entity_reader(schema.__header_schema__)(frame, 0)
        _check_counts(schema, memoryview(frame), used)
        body, _ = entity_reader(schema)(frame, used)
    except MalformedRequest:
        raise
    except Exception as exc:  # kio raises several kinds for bytes that do not decode
        raise MalformedRequest(f"api {key} version {version}: {exc}") from exc
    return Request(key, version, header.correlation_id, header.client_id, body)


def _check_counts(entity: type, frame: memoryview, offset: int) -> int:
    """Walk a body of ``entity`` at ``offset`` as kio's reader will, refusing
    an array whose count is more than the bytes left (kio's native reader
    reserves room for a count before it reads any element: a count of 2**32
    from a 20-byte frame ends the process); returns the offset after it.
    Request headers hold no arrays: their reader runs first, as it is.

    Raises:
        MalformedRequest: an array's count is over the bytes left.
        Exception: what kio's readers raise for bytes that do not decode.
    """
    flexible, fields, tagged = _walk_plan(entity)
    for step in fields:
        offset = _check_field(step, frame, offset, flexible)
    if flexible:
        count, size = read_unsigned_varint(frame, offset)
        offset += size
        _check_count(count, frame, offset)
        for _ in range(count):
            tag, size = read_unsigned_varint(frame, offset)
            offset += size
            length, size = read_unsigned_varint(frame, offset)
            offset += size
            _check_count(length, frame, offset)
            known = tagged.get(tag)
            if known is not None:  # its value alone: a field cannot read past its size
                _check_field(known, frame[: offset + length], offset, flexible)
            offset += length
    return offset


#: How a field is walked: ("value", its reader), ("array", the element's
#: reader or entity), ("struct", its entity, whether it is nullable).
_Step = tuple[str, Any, bool]


@cache
def _walk_plan(entity: type) -> tuple[bool, tuple[_Step, ...], dict[int, _Step]]:
    """(flexible, the steps of the untagged fields in order, the tagged
    fields' steps by tag) of ``entity``."""
    flexible = bool(entity.__flexible__)  # type: ignore[attr-defined]
    fields: list[_Step] = []
    tagged: dict[int, _Step] = {}
    for field in dataclasses.fields(entity):
        is_tagged = "tag" in field.metadata
        kind = classify_field(field)
        step: _Step
        if isinstance(kind, PrimitiveField):
            step = ("value", get_field_reader(entity, field, False, is_tagged), False)
        elif isinstance(kind, EntityTupleField):
            step = ("array", kind.type_, True)
        elif kind.is_array:
            step = ("array", get_reader(get_schema_field_type(field), flexible, False), False)
        else:
            step = ("struct", kind.type_, is_optional(field))
        if is_tagged:
            tagged[field.metadata["tag"]] = step
        else:
            fields.append(step)
    return flexible, tuple(fields), tagged


def _check_field(step: _Step, frame: memoryview, offset: int, flexible: bool) -> int:
    what, reader, flag = step
    if what == "value":
        return offset + int(reader(frame, offset)[1])
    if what == "struct":
        if flag:  # a nullable struct: -1, or 1 and the struct
            present, size = read_int8(frame, offset)
            offset += size
            if present < 0:
                return offset
        return _check_counts(reader, frame, offset)
    if flexible:
        count, size = read_compact_array_length(frame, offset)
    else:
        count, size = read_legacy_array_length(frame, offset)
    offset += size
    if count is None or count < 0:  # a null array
        return offset
    _check_count(count, frame, offset)
    for _ in range(count):
        if flag:  # of entities
            offset = _check_counts(reader, frame, offset)
        else:
            offset += reader(frame, offset)[1]
    return offset


def _check_count(count: int, frame: memoryview, offset: int) -> None:
    """Every element (or byte) of a count takes at least one byte of the frame."""
    left = len(frame) - offset
    if count > left:
        raise MalformedRequest(f"a count of {count} with {left} bytes left")


def encode_response(
    api_key: int, api_version: int, correlation_id: int, data: Mapping[str, Any]
) -> bytes:
    """The size-prefixed response frame for ``data`` (see :func:`build`), with
    the error codes ``api_version`` predates replaced as Kafka does."""
    if api_version < PRODUCER_FENCED_SINCE.get(api_key, 0):
        data = _without_producer_fenced(data)
    schema = load_response_schema(api_key, api_version)
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    header_schema = schema.__header_schema__
    entity_writer(header_schema)(out, build(header_schema, {"correlation_id": correlation_id}))
    entity_writer(schema)(out, build(schema, data))
    frame = out.getbuffer()
    _SIZE.pack_into(frame, 0, len(frame) - _SIZE.size)
    return bytes(frame)


def encode_request(
    api_key: int, api_version: int, correlation_id: int, client_id: str, data: Mapping[str, Any]
) -> bytes:
    """The size-prefixed request frame for ``data`` (see :func:`build`)."""
    schema = load_request_schema(api_key, api_version)
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    header = {
        "request_api_key": api_key,
        "request_api_version": api_version,
        "correlation_id": correlation_id,
        "client_id": client_id,
    }
    entity_writer(schema.__header_schema__)(out, build(schema.__header_schema__, header))
    entity_writer(schema)(out, build(schema, data))
    frame = out.getbuffer()
    _SIZE.pack_into(frame, 0, len(frame) - _SIZE.size)
    return bytes(frame)


def decode_response(api_key: int, api_version: int, payload: bytes) -> Any:
    """The response body in ``payload`` (a frame without its size prefix).

    Raises:
        MalformedRequest: it does not decode as that response.
    """
    schema = load_response_schema(api_key, api_version)
    try:
        _header, used = entity_reader(schema.__header_schema__)(payload, 0)
        body, _ = entity_reader(schema)(payload, used)
    except Exception as exc:  # kio raises several kinds for bytes that do not decode
        raise MalformedRequest(f"api {api_key} version {api_version} response: {exc}") from exc
    return body


def _without_producer_fenced(data: Any) -> Any:
    """``data`` with every PRODUCER_FENCED error code as INVALID_PRODUCER_EPOCH."""
    if isinstance(data, Mapping):
        return {
            key: _INVALID_PRODUCER_EPOCH
            if key.endswith("error_code") and value == _PRODUCER_FENCED
            else _without_producer_fenced(value)
            for key, value in data.items()
        }
    if isinstance(data, list | tuple):
        return [_without_producer_fenced(item) for item in data]
    return data


def correlation_only(frame: bytes) -> int | None:
    """The correlation id of a request frame (after the api key and version), if any."""
    if len(frame) < 8:
        return None
    (correlation_id,) = _SIZE.unpack_from(frame, 4)
    return int(correlation_id)


# --- building entities from plain descriptions -----------------------------------------


def build(schema: type[Any], data: Mapping[str, Any]) -> Any:
    """An instance of the kio entity ``schema`` from ``data``.

    ``data`` names fields by kio's names; values are plain Python: ints
    (error codes, millisecond durations and timestamps included), strings, bytes, None,
    and for nested entities mappings or sequences of mappings. Fields
    ``schema`` does not have are dropped (they belong to other versions);
    fields ``data`` does not name take their schema default, else Kafka's
    implicit default (0, empty, None).
    """
    values: dict[str, Any] = {}
    for name, convert, implicit in _plan(schema):  # type: ignore[arg-type]
        if name in data:
            value = data[name]
            values[name] = value if value is None else convert(value)
        elif implicit is not _SCHEMA_DEFAULT:
            values[name] = implicit
    return schema(**values)


_SCHEMA_DEFAULT = object()
Converter = Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


@cache
def _plan(schema: type[Any]) -> list[tuple[str, Converter, Any]]:
    """Per field of ``schema``: its name, the converter of a plain value, and
    its implicit default (_SCHEMA_DEFAULT when the schema has a default)."""
    hints = typing.get_type_hints(schema)
    plan = []
    for field in dataclasses.fields(schema):
        hint = hints[field.name]
        has_default = not (
            field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        )
        plan.append(
            (field.name, _converter(hint), _SCHEMA_DEFAULT if has_default else _implicit(hint))
        )
    return plan


def _converter(hint: Any) -> Converter:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = _converter(next(a for a in typing.get_args(hint) if a is not type(None)))
        return lambda value: None if value is None else inner(value)
    if origin is tuple:
        item = _converter(typing.get_args(hint)[0])
        return lambda values: tuple(map(item, values))
    if isinstance(hint, type):
        if dataclasses.is_dataclass(hint):
            entity = hint
            return lambda value: value if isinstance(value, entity) else build(entity, value)
        if issubclass(hint, enum.Enum):
            return hint
        if issubclass(hint, datetime.timedelta):
            return lambda value: datetime.timedelta(milliseconds=value)
        if issubclass(hint, datetime.datetime):
            return lambda value: datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
    return _same  # kio's int, str and bytes types are their plain Python values


def _implicit(hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return None
    if origin is tuple:
        return ()
    if isinstance(hint, type):
        if dataclasses.is_dataclass(hint):
            return build(hint, {})
        if issubclass(hint, KafkaErrorCode):
            return KafkaErrorCode.none
        if issubclass(hint, enum.Enum):
            return next(iter(hint))
        if issubclass(hint, datetime.timedelta):
            return datetime.timedelta(0)
        if issubclass(hint, bool):
            return False
        if issubclass(hint, int):
            return 0
        if issubclass(hint, str):
            return ""
        if issubclass(hint, bytes):
            return b""
    return None


def milliseconds(value: datetime.timedelta) -> int:
    """A kio timedelta field as Kafka's millisecond count."""
    return int(value.total_seconds() * 1000)
