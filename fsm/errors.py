"""The core's exceptions, and the protocol's error codes it answers with."""

from __future__ import annotations

from raftcoord.protocol.errors import ErrorCode

__all__ = ["CommandError", "ErrorCode", "IllegalTransition", "InvariantViolation"]


class InvariantViolation(Exception):
    """A bug: the core reached a situation its own rules forbid."""


class IllegalTransition(InvariantViolation):
    """A transition the state table does not allow was attempted."""


class CommandError(ValueError):
    """A command or snapshot could not be decoded (bad version, type or field)."""
