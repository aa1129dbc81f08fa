"""raftcoord.coordinator.leader: the leader's stamping, producer-id blocks, group commit
and coordinator epoch, on a fake clock (no Raft, no threads)."""

from __future__ import annotations

from dataclasses import dataclass

from fsm import (
    AbortTimedOut,
    AddOffsets,
    AllocatePidBlock,
    Command,
    EndTxn,
    ErrorCode,
    InitProducerId,
    Outcome,
    TransactionStateMachine,
)
from raftcoord.coordinator.leader import (
    MAX_ENTRIES_IN_FLIGHT,
    LeaderCore,
    Stamp,
    Unstamped,
    timed_out_abort,
)


class FakeClock:
    def __init__(self, now_ms: int = 5_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


@dataclass
class Queued:
    build: Unstamped | None


def core(block_size: int = 10, clock: FakeClock | None = None) -> LeaderCore:
    layout = TransactionStateMachine(0, 1, None, block_size).state.pids.layout
    leader = LeaderCore(layout, clock or FakeClock())
    leader.elected(7)
    return leader


def init(tid: str) -> Unstamped:
    return lambda s: InitProducerId(tid, 60_000, s.now_ms, s.coordinator_epoch, s.new_producer_id)


def add_offsets(tid: str) -> Unstamped:
    return lambda s: AddOffsets(tid, 1, 0, "group", s.now_ms, s.coordinator_epoch)


def always(command: InitProducerId | EndTxn) -> bool:
    return True


def never(command: InitProducerId | EndTxn) -> bool:
    return False


def grant(leader: LeaderCore, first: int, end: int) -> None:
    command, token = leader.request_block()
    assert isinstance(command, AllocatePidBlock)
    assert leader.block_granted(token, Outcome(block_first=first, block_end=end))


def test_the_stamp_is_the_clock_and_the_epoch_of_the_leadership() -> None:
    clock = FakeClock(1_234)
    leader = core(clock=clock)
    assert leader.stamp() == Stamp(1_234, 7)
    clock.now_ms = 2_000
    leader.elected(9)
    assert leader.stamp() == Stamp(2_000, 9)


def test_a_command_gets_the_stamp_and_a_fresh_id_only_when_it_needs_one() -> None:
    leader = core()
    grant(leader, 100, 110)
    stamp = leader.stamp()
    assert leader.stamped(add_offsets("t"), stamp, always) == AddOffsets(
        "t", 1, 0, "group", 5_000, 7
    )
    assert leader.stamped(init("t"), stamp, never) == InitProducerId("t", 60_000, 5_000, 7, -1)
    assert leader.stamped(init("t"), stamp, always) == InitProducerId("t", 60_000, 5_000, 7, 100)
    assert leader.stamped(init("u"), stamp, always) == InitProducerId("u", 60_000, 5_000, 7, 101)


def test_without_ids_a_command_that_needs_one_waits() -> None:
    leader = core()
    assert leader.block_due()
    assert leader.stamped(init("t"), leader.stamp(), always) is None
    assert leader.stamped(init("t"), leader.stamp(), never) is not None


def test_a_block_is_due_at_90_percent_use_and_only_once_at_a_time() -> None:
    leader = core(block_size=10)
    _command, token = leader.request_block()
    assert not leader.block_due()  # requested, not answered yet
    assert leader.block_granted(token, Outcome(block_first=0, block_end=10))
    for _ in range(8):
        assert leader.take_producer_id() is not None
        assert not leader.block_due()
    assert leader.take_producer_id() == 8
    assert leader.block_due()


def test_a_block_request_that_was_not_applied_is_asked_again() -> None:
    leader = core()
    _command, token = leader.request_block()
    leader.block_not_applied(token)
    assert leader.block_due()


def test_a_refused_block_grants_nothing_and_is_not_asked_again_this_leadership() -> None:
    leader = core()
    _command, token = leader.request_block()
    refused = Outcome(error=ErrorCode.UNKNOWN_SERVER_ERROR, message="refused")
    assert not leader.block_granted(token, refused)
    assert leader.take_producer_id() is None
    assert not leader.block_due()
    leader.elected(8)
    assert leader.block_due()


def test_a_new_leadership_skips_the_ids_left_and_ignores_older_requests() -> None:
    leader = core()
    grant(leader, 0, 10)
    _command, old_token = leader.request_block()
    leader.elected(8)
    assert leader.take_producer_id() is None
    leader.block_granted(old_token, Outcome(block_first=10, block_end=20))
    assert leader.take_producer_id() is None  # the block was asked for by the old leadership


def test_deposed_drops_the_ids() -> None:
    leader = core()
    grant(leader, 0, 10)
    leader.deposed()
    assert leader.take_producer_id() is None


def test_group_commit_stamps_queued_requests_in_order_into_one_entry() -> None:
    leader = core()
    grant(leader, 0, 10)
    read = Queued(None)
    queued = [Queued(init("a")), read, Queued(add_offsets("a")), Queued(init("b"))]
    batch = leader.batch(queued, leader.stamp(), always)
    assert batch is not None
    assert batch.requests == queued and batch.waiting == []
    assert [c.new_producer_id for c in batch.commands if isinstance(c, InitProducerId)] == [0, 1]
    assert len(batch.commands) == 3  # the read has no command


def test_group_commit_keeps_requests_while_entries_are_in_flight() -> None:
    leader = core()
    for _ in range(MAX_ENTRIES_IN_FLIGHT):
        assert leader.batch([Queued(add_offsets("a"))], leader.stamp(), never) is not None
    assert leader.batch([Queued(add_offsets("b"))], leader.stamp(), never) is None
    leader.entry_done(7)
    assert leader.batch([Queued(add_offsets("b"))], leader.stamp(), never) is not None


def test_an_entry_of_an_earlier_leadership_does_not_count() -> None:
    leader = core()
    assert leader.batch([Queued(add_offsets("a"))], leader.stamp(), never) is not None
    leader.elected(8)
    leader.entry_done(7)
    assert leader.in_flight == 0


def test_requests_after_one_waiting_for_a_block_wait_too_in_order() -> None:
    leader = core()
    first, blocked, after = Queued(add_offsets("a")), Queued(init("b")), Queued(None)
    batch = leader.batch([first, blocked, after], leader.stamp(), always)
    assert batch is not None
    assert batch.requests == [first] and batch.waiting == [blocked, after]
    leader.entry_done(7)
    nothing = leader.batch([blocked, after], leader.stamp(), always)
    assert nothing is not None and not nothing.requests
    assert nothing.waiting == [blocked, after]
    assert leader.in_flight == 0  # an empty batch is not an entry


def test_a_timed_out_transaction_is_aborted_with_the_leaders_stamp() -> None:
    candidate = AbortTimedOut("t", 3, 1, 100, 0)
    command: Command = timed_out_abort(candidate)(Stamp(900, 7))
    assert command == AbortTimedOut("t", 3, 1, 900, 7)
