"""Strict checks of values read back from msgpack (commands and snapshots)."""

from __future__ import annotations

from typing import Any

from fsm.errors import CommandError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def as_int(value: Any) -> int:
    """``value`` if it is a 64-bit integer (not a bool), else CommandError."""
    if type(value) is not int or not INT64_MIN <= value <= INT64_MAX:
        raise CommandError(f"expected a 64-bit integer, got {value!r}")
    return value


def as_bool(value: Any) -> bool:
    if type(value) is not bool:
        raise CommandError(f"expected a boolean, got {value!r}")
    return value


def as_str(value: Any) -> str:
    if type(value) is not str:
        raise CommandError(f"expected a string, got {value!r}")
    return value


def as_bytes(value: Any) -> bytes:
    if type(value) is not bytes:
        raise CommandError(f"expected bytes, got {value!r}")
    return value


def as_list(value: Any, arity: int | None = None) -> list[Any]:
    """``value`` as a list; with ``arity`` every item must be a list of that length."""
    if not isinstance(value, list | tuple):
        raise CommandError(f"expected a list, got {value!r}")
    if arity is not None:
        for item in value:
            if not isinstance(item, list | tuple) or len(item) != arity:
                raise CommandError(f"expected {arity}-element items, got {item!r}")
    return list(value)


def check_version(value: Any, expected: int, what: str) -> None:
    """Refuse any version but ``expected`` (True and 1.0 are not 1)."""
    if type(value) is not int or value != expected:
        raise CommandError(f"unknown {what} version {value!r}")
