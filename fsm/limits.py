"""Limits on what one request may ask a shard to replicate.

The coordinator checks a command built from a client's request with
:func:`request_refusal` *before* proposing it, so a malformed or oversized
request is answered at once with an error code and a message naming the
limit, and never reaches the Raft log. The limits themselves are the
protocol's (:mod:`raftcoord.protocol.limits`), which the client library
checks too.
"""

from __future__ import annotations

from fsm.commands import (
    AddPartitions,
    Command,
    CreateAcls,
    CreateTopic,
    DeleteAcls,
    JoinGroup,
    OffsetCommit,
    RegisterDirectory,
    ReserveOffsets,
    SyncGroup,
    TxnOffsetCommit,
    UpsertScramCredential,
)
from fsm.config import FsmConfig
from fsm.errors import ErrorCode
from fsm.membership import join_problem, sync_problem
from fsm.offsets import validate_offsets
from fsm.transactions import validate_partitions
from raftcoord.protocol.acl import MAX_ACL_FIELD_CHARS, binding_error
from raftcoord.protocol.limits import id_error, is_directory_id, topic_error
from raftcoord.protocol.scram import credential_error

__all__ = ["id_error", "request_refusal", "topic_error"]


def request_refusal(command: Command, config: FsmConfig) -> tuple[ErrorCode, str] | None:
    """The answer to a request whose ``command`` must not be proposed, or None.

    Checks the ids (:func:`id_error`), the topic names
    (:func:`topic_error`) and the partition or offset lists (at most
    ``config.max_partitions_per_request``) the request carries: what the
    state machine would refuse anyway (refused here before it costs a Raft
    entry) and what no request may carry although the machine accepts it
    (long ids, illegal topic names outside CreateTopic).
    """
    for field in ("transactional_id", "group_id"):
        value = getattr(command, field, None)
        if isinstance(value, str) and (bad_id := id_error(field, value)) is not None:
            return ErrorCode.INVALID_REQUEST, bad_id
    # Group members' ids may be empty (a first join, a simple consumer).
    for field in ("member_id", "group_instance_id", "new_member_id", "client_id"):
        value = getattr(command, field, None)
        if value and (bad_id := id_error(field, value)) is not None:
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
    elif isinstance(command, JoinGroup):
        return join_problem(command, config)
    elif isinstance(command, SyncGroup):
        return sync_problem(command)
    elif isinstance(command, RegisterDirectory | ReserveOffsets):
        if not is_directory_id(command.directory_id):
            return ErrorCode.INVALID_REQUEST, f"bad directory id {command.directory_id[:64]!r}"
        if isinstance(command, ReserveOffsets):
            if len(command.reservations) > config.max_partitions_per_request:
                problem = (
                    f"{len(command.reservations)} reservations, more than "
                    f"{config.max_partitions_per_request}"
                )
            topics = [reservation.topic for reservation in command.reservations]
    elif isinstance(command, CreateAcls):
        problem = _acls_problem(command, config)
    elif isinstance(command, DeleteAcls):
        problem = _filters_problem(command, config)
    elif isinstance(command, UpsertScramCredential):
        problem = credential_error(
            command.user, command.mechanism, command.iterations, command.salt
        )
    if problem is not None:
        return ErrorCode.INVALID_REQUEST, problem
    for topic in dict.fromkeys(topics):
        if (bad_topic := topic_error(topic)) is not None:
            return ErrorCode.INVALID_TOPIC_EXCEPTION, bad_topic
    return None


def _acls_problem(command: CreateAcls, config: FsmConfig) -> str | None:
    if not 1 <= len(command.acls) <= config.max_partitions_per_request:
        return f"1..{config.max_partitions_per_request} ACLs per request, got {len(command.acls)}"
    for acl in command.acls:
        if (problem := binding_error(acl)) is not None:
            return f"{acl.describe()[:300]}: {problem}"
    return None


def _filters_problem(command: DeleteAcls, config: FsmConfig) -> str | None:
    if not 1 <= len(command.filters) <= config.max_partitions_per_request:
        return (
            f"1..{config.max_partitions_per_request} filters per request, "
            f"got {len(command.filters)}"
        )
    for f in command.filters:
        for value in (f.resource_name, f.principal, f.host):
            if value is not None and len(value) > MAX_ACL_FIELD_CHARS:
                return f"a filter's name is longer than {MAX_ACL_FIELD_CHARS} characters"
    return None
