"""The protocol's enums as the generated messages' field types, and the
access-control bindings between :mod:`raftcoord.protocol.acl` and their messages.

:class:`~raftcoord.protocol.errors.ErrorCode` and :class:`fsm.TxnState` carry
the numbers of the ``raftcoord.v1`` protobuf enums (tests/test_proto.py proves
they agree), but the generated stubs type those fields with the protobuf enum
classes. These functions say so to the type checker; the value is passed on
unchanged.
"""

from __future__ import annotations

from typing import Any, cast

from raftcoord.protocol.acl import (
    Acl,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from raftcoord.protocol.v1 import common_pb2


def wire_error(code: int) -> common_pb2.ErrorCode:
    """``code`` (an :class:`~raftcoord.protocol.errors.ErrorCode` or its number)
    as a message's ``ErrorCode`` field."""
    return cast(common_pb2.ErrorCode, code)


def wire_state(state: int) -> common_pb2.TransactionState:
    """``state`` (a transaction state's number) as a message's
    ``TransactionState`` field."""
    return cast(common_pb2.TransactionState, state)


def acl_to_proto(acl: Acl) -> common_pb2.AclBinding:
    return common_pb2.AclBinding(
        resource_type=int(acl.resource_type),
        resource_name=acl.resource_name,
        pattern_type=int(acl.pattern_type),
        principal=acl.principal,
        host=acl.host,
        operation=int(acl.operation),
        permission_type=int(acl.permission),
    )


def acl_from_proto(message: Any) -> Acl:
    """An :class:`Acl` from an ``AclBinding`` message.

    Raises:
        ValueError: a number that is not one of Kafka's.
    """
    return Acl(
        ResourceType(message.resource_type),
        PatternType(message.pattern_type),
        message.resource_name,
        message.principal,
        message.host,
        Operation(message.operation),
        Permission(message.permission_type),
    )


def filter_to_proto(acl_filter: AclFilter) -> common_pb2.AclBindingFilter:
    message = common_pb2.AclBindingFilter(
        resource_type=int(acl_filter.resource_type),
        pattern_type=int(acl_filter.pattern_type),
        operation=int(acl_filter.operation),
        permission_type=int(acl_filter.permission),
    )
    for field in ("resource_name", "principal", "host"):
        value = getattr(acl_filter, field)
        if value is not None:
            setattr(message, field, value)
    return message


def filter_from_proto(message: Any) -> AclFilter:
    """An :class:`AclFilter` from an ``AclBindingFilter`` message.

    Raises:
        ValueError: a number that is not one of Kafka's.
    """
    return AclFilter(
        ResourceType(message.resource_type),
        PatternType(message.pattern_type),
        message.resource_name if message.HasField("resource_name") else None,
        message.principal if message.HasField("principal") else None,
        message.host if message.HasField("host") else None,
        Operation(message.operation),
        Permission(message.permission_type),
    )


def marker_identity(marker: Any) -> tuple[int, int]:
    """A TxnMarker's (transaction version, transaction number): version 1,
    else 2 (also when unset); the number, or -1 from a coordinator that
    does not number its transactions."""
    version = 1 if marker.transaction_version == 1 else 2
    return version, marker.txn_number if marker.HasField("txn_number") else -1
