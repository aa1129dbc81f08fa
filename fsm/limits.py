"""Limits on what one request may ask a shard to replicate.

The coordinator checks a command built from a client's request with
:func:`request_refusal` *before* proposing it, so a malformed or oversized
request is answered at once with an error code and a message naming the
limit, and never reaches the Raft log. The client library checks
:data:`MAX_ID_BYTES` when it is given a transactional.id or group id.
"""

from __future__ import annotations

import re
from typing import Final

from fsm.commands import AddPartitions, Command, CreateTopic, OffsetCommit, TxnOffsetCommit
from fsm.config import FsmConfig
from fsm.errors import ErrorCode
from fsm.offsets import validate_offsets
from fsm.transactions import validate_partitions

#: The longest transactional.id or group id, in bytes of UTF-8. Kafka's
#: protocol sends both as a STRING, whose length is a signed 16-bit integer.
MAX_ID_BYTES: Final = 32767

#: The longest topic name (Kafka's limit), in characters of [a-zA-Z0-9._-].
MAX_TOPIC_NAME_CHARS: Final = 249

TOPIC_NAME: Final = re.compile(rf"[a-zA-Z0-9._-]{{1,{MAX_TOPIC_NAME_CHARS}}}")

_SHOWN_CHARS = 64  # of a refused name, in messages


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


def request_refusal(command: Command, config: FsmConfig) -> tuple[ErrorCode, str] | None:
    """The answer to a request whose ``command`` must not be proposed, or None.

    Checks the ids (:data:`MAX_ID_BYTES`), the topic names
    (:data:`TOPIC_NAME`) and the partition or offset lists (at most
    ``config.max_partitions_per_request``) the request carries: what the
    state machine would refuse anyway (refused here before it costs a Raft
    entry) and what no request may carry although the machine accepts it
    (long ids, illegal topic names outside CreateTopic).
    """
    for field in ("transactional_id", "group_id"):
        value = getattr(command, field, None)
        if isinstance(value, str) and (bad_id := id_error(field, value)) is not None:
            return ErrorCode.INVALID_REQUEST, bad_id
    problem: str | None = None
    topics: list[str] = []
    if isinstance(command, AddPartitions):
        problem = validate_partitions(command.partitions, config)
        topics = [topic for topic, _partition in command.partitions]
    elif isinstance(command, TxnOffsetCommit | OffsetCommit):
        problem = validate_offsets(command.offsets, config)
        topics = [entry.topic for entry in command.offsets]
    elif isinstance(command, CreateTopic):
        topics = [command.name]
    if problem is not None:
        return ErrorCode.INVALID_REQUEST, problem
    for topic in dict.fromkeys(topics):
        if (bad_topic := topic_error(topic)) is not None:
            return ErrorCode.INVALID_TOPIC_EXCEPTION, bad_topic
    return None
