"""The protocol's enums as the generated messages' field types.

:class:`~raftcoord.protocol.errors.ErrorCode` and :class:`fsm.TxnState` carry
the numbers of the ``raftcoord.v1`` protobuf enums (tests/test_proto.py proves
they agree), but the generated stubs type those fields with the protobuf enum
classes. These functions say so to the type checker; the value is passed on
unchanged.
"""

from __future__ import annotations

from typing import cast

from raftcoord.protocol.v1 import common_pb2


def wire_error(code: int) -> common_pb2.ErrorCode:
    """``code`` (an :class:`~raftcoord.protocol.errors.ErrorCode` or its number)
    as a message's ``ErrorCode`` field."""
    return cast(common_pb2.ErrorCode, code)


def wire_state(state: int) -> common_pb2.TransactionState:
    """``state`` (a transaction state's number) as a message's
    ``TransactionState`` field."""
    return cast(common_pb2.TransactionState, state)
