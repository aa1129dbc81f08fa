"""Shard 0's record of partition-log data directories and offset reservations."""

from __future__ import annotations

from fsm import (
    CreateTopic,
    ErrorCode,
    OffsetReservation,
    RegisterDirectory,
    ReserveOffsets,
    TransactionStateMachine,
)

OLD = "a" * 32
NEW = "b" * 32


def machine() -> TransactionStateMachine:
    m = TransactionStateMachine(0, 1)
    assert m.apply(CreateTopic("orders", (101, 102, 101), 1)).ok
    return m


def register(m: TransactionStateMachine, directory: str, replace: bool = False) -> ErrorCode:
    return m.apply(RegisterDirectory(101, directory, replace, 2)).error


def reserve(m: TransactionStateMachine, *reservations: tuple[str, int, int]) -> ErrorCode:
    wanted = tuple(OffsetReservation(*r) for r in reservations)
    return m.apply(ReserveOffsets(101, OLD, wanted, 3)).error


def test_a_node_registers_its_directory_once_and_again_with_the_same_id() -> None:
    m = machine()
    assert register(m, OLD) is ErrorCode.NONE
    assert register(m, OLD) is ErrorCode.NONE
    assert m.state.directories == {101: OLD}


def test_another_directory_is_refused_until_an_operator_replaces_it() -> None:
    m = machine()
    register(m, OLD)
    before = m.snapshot()
    outcome = m.apply(RegisterDirectory(101, NEW, False, 2))
    assert outcome.error is ErrorCode.KAFKA_STORAGE_ERROR
    assert OLD in outcome.message and NEW in outcome.message
    assert m.snapshot() == before
    assert register(m, NEW, replace=True) is ErrorCode.NONE
    assert m.state.directories == {101: NEW}


def test_bad_directory_ids_and_node_ids_are_refused() -> None:
    m = machine()
    for directory in ("", "A" * 32, "a" * 31, "g" * 32, "a" * 33):
        assert register(m, directory) is ErrorCode.INVALID_REQUEST
    assert m.apply(RegisterDirectory(-1, OLD, False, 2)).error is ErrorCode.INVALID_REQUEST
    assert m.state.directories == {}


def test_offset_ceilings_only_grow_and_start_at_zero() -> None:
    m = machine()
    register(m, OLD)
    assert m.offset_ceilings("orders") == (0, 0, 0)
    assert reserve(m, ("orders", 0, 1_000), ("orders", 2, 50)) is ErrorCode.NONE
    assert m.offset_ceilings("orders") == (1_000, 0, 50)
    assert reserve(m, ("orders", 0, 10)) is ErrorCode.NONE  # lower: kept
    assert m.offset_ceilings("orders") == (1_000, 0, 50)
    restored = TransactionStateMachine.restore(m.snapshot())
    assert restored.offset_ceilings("orders") == (1_000, 0, 50)
    assert restored.state.directories == {101: OLD}
    assert m.offset_ceilings("nosuch") == ()


def test_a_reservation_from_a_directory_not_on_record_changes_nothing() -> None:
    m = machine()
    assert reserve(m, ("orders", 0, 5)) is ErrorCode.KAFKA_STORAGE_ERROR  # none on record
    register(m, OLD)
    register(m, NEW, replace=True)
    before = m.snapshot()
    assert reserve(m, ("orders", 0, 5)) is ErrorCode.KAFKA_STORAGE_ERROR  # the old disk
    assert m.snapshot() == before


def test_a_reservation_is_all_or_nothing() -> None:
    m = machine()
    register(m, OLD)
    before = m.snapshot()
    assert reserve(m, ("orders", 0, 5), ("orders", 1, 5)) is ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert reserve(m, ("orders", 0, 5), ("orders", 3, 5)) is (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    assert reserve(m, ("orders", 0, 5), ("nosuch", 0, 5)) is (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    assert reserve(m, ("orders", 0, 5), ("orders", 2, -1)) is ErrorCode.INVALID_REQUEST
    assert reserve(m, ("orders", 0, 2**62 + 1)) is ErrorCode.INVALID_REQUEST
    assert m.snapshot() == before
