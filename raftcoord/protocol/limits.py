"""Kafka's limits on what a request may name: ids, topic names, producer
epochs and sequences, fetch waits. The coordinators and partition-log nodes
refuse requests past them; the client checks them before it sends anything.
Pure: no I/O."""

from __future__ import annotations

import re
from typing import Final

#: Kafka's producer epoch is a 16-bit signed integer.
KAFKA_MAX_PRODUCER_EPOCH: Final = 32767

#: Sequences are int32 and wrap to 0 after this (Kafka's DefaultRecordBatch).
MAX_SEQUENCE: Final = 2**31 - 1

#: The longest ``max_wait_ms`` a Fetch may ask for (Kafka bounds fetch.max.wait.ms
#: by the request timeout, whose default is 30 s); the consumer checks it too.
MAX_FETCH_WAIT_MS: Final = 30_000

#: The longest transactional.id or group id, in bytes of UTF-8. Kafka's
#: protocol sends both as a STRING, whose length is a signed 16-bit integer.
MAX_ID_BYTES: Final = 32767

#: The longest topic name (Kafka's limit), in characters of [a-zA-Z0-9._-].
MAX_TOPIC_NAME_CHARS: Final = 249

TOPIC_NAME: Final = re.compile(rf"[a-zA-Z0-9._-]{{1,{MAX_TOPIC_NAME_CHARS}}}")

_SHOWN_CHARS = 64  # of a refused name, in messages

#: A data directory's id (``directory.id`` in its ``meta.properties``): a
#: random UUID as 32 lowercase hexadecimal digits.
DIRECTORY_ID: Final = re.compile(r"[0-9a-f]{32}")

#: The highest offset a partition may reserve (a Kafka offset is an int64;
#: far below its end, so a ceiling plus a block never overflows).
MAX_OFFSET: Final = 2**62


#: Consumer groups: a coordinator holds a JoinGroup for its rebalance
#: timeout plus GROUP_WAIT_GRACE_S (the leader's sweeper completes the join
#: once the timeout passed) and a follower's SyncGroup for its session
#: timeout plus the same; no group request is held longer than
#: GROUP_MAX_WAIT_S, whatever timeouts it asks for. A caller (the Kafka
#: gateway) waits for the answer within the same bounds.
GROUP_WAIT_GRACE_S = 5.0
GROUP_MAX_WAIT_S = 330.0


def id_error(what: str, value: str) -> str | None:
    """Why ``value`` cannot be a transactional.id or group id (named ``what``), or None."""
    if not value:
        return f"{what} must not be empty"
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_ID_BYTES:
        return f"{what} is {size} bytes of UTF-8, more than the limit of {MAX_ID_BYTES} bytes"
    return None


def topic_error(name: str) -> str | None:
    """Why ``name`` cannot be a topic's name (Kafka's rule), or None."""
    if TOPIC_NAME.fullmatch(name) and name not in (".", ".."):
        return None
    shown = name if len(name) <= _SHOWN_CHARS else f"{name[:_SHOWN_CHARS]}... ({len(name)} chars)"
    return (
        f"topic name {shown!r} must be 1-{MAX_TOPIC_NAME_CHARS} characters of "
        "[a-zA-Z0-9._-] and not '.' or '..'"
    )


def is_directory_id(value: str) -> bool:
    """Whether ``value`` is a data directory's id (:data:`DIRECTORY_ID`)."""
    return DIRECTORY_ID.fullmatch(value) is not None
