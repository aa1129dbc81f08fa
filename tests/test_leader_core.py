"""raftcoord.coordinator.leader: the leader's stamping, producer-id blocks, group commit
and coordinator epoch, on a fake clock (no Raft, no threads)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from fsm import (
    AbortTimedOut,
    AddOffsets,
    AddPartitions,
    AllocatePidBlock,
    Command,
    EndTxn,
    ErrorCode,
    InitProducerId,
    MarkersWritten,
    Outcome,
    TransactionStateMachine,
    TxnState,
    decode_command,
)
from fsm.partitions import imbalanced
from raftcoord.coordinator.leader import (
    COMPLETION_LINGER_MS,
    FIRST_CHECK_MS,
    MAX_ENTRIES_IN_FLIGHT,
    PARK_MARGIN_MS,
    TRANSFER_GRACE_MS,
    TRANSFER_HOLD_MS,
    TRANSFER_RETRY_MS,
    ImbalanceChecks,
    LeaderClock,
    LeaderCore,
    NeedsProducerId,
    Parking,
    Stamp,
    Unstamped,
    covering_outcome,
    park_deadline,
    park_key,
    timed_out_abort,
)
from raftcoord.coordinator.services.transactions import BATCHED_SETTLED_REFUSALS, settled_refusal
from tests.fsm_driver import Leader


class FakeClock:
    def __init__(self, now_ms: int = 5_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


@dataclass
class Queued:
    build: Unstamped | None
    parkable: bool = True


#: leader.imbalance.check.interval.seconds of the tests' leaders, in ms.
INTERVAL_MS = 300_000


def core(block_size: int = 10, clock: FakeClock | None = None) -> LeaderCore:
    """A leader whose node started at the clock's time (its first imbalance
    check FIRST_CHECK_MS later, then every INTERVAL_MS)."""
    clock = clock or FakeClock()
    layout = TransactionStateMachine(0, 1, None, block_size).state.pids.layout
    leader = LeaderCore(layout, clock, ImbalanceChecks(clock.now_ms, INTERVAL_MS))
    leader.elected(7)
    return leader


def init(tid: str) -> Unstamped:
    return lambda s: InitProducerId(tid, 60_000, s.now_ms, s.coordinator_epoch, s.new_producer_id)


def add_offsets(tid: str) -> Unstamped:
    return lambda s: AddOffsets(tid, 1, 0, "group", s.now_ms, s.coordinator_epoch)


def always(command: InitProducerId | EndTxn) -> bool:
    return True


def nowhere(command: Command) -> bool:
    """No command waits for a completion."""
    return False


def never(command: InitProducerId | EndTxn) -> bool:
    return False


def stamped(
    leader: LeaderCore, build: Unstamped, stamp: Stamp, needs: NeedsProducerId
) -> Command | None:
    """The command of ``build`` as the next entry carries it, or None while
    it waits for a producer-id block."""
    batch = leader.batch([Queued(build)], stamp, needs, nowhere)
    assert batch is not None
    if not batch.requests:
        return None
    leader.entry_done(stamp.coordinator_epoch)
    return batch.commands[0]


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
    assert stamped(leader, add_offsets("t"), stamp, always) == AddOffsets(
        "t", 1, 0, "group", 5_000, 7
    )
    assert stamped(leader, init("t"), stamp, never) == InitProducerId("t", 60_000, 5_000, 7, -1)
    assert stamped(leader, init("t"), stamp, always) == InitProducerId("t", 60_000, 5_000, 7, 100)
    assert stamped(leader, init("u"), stamp, always) == InitProducerId("u", 60_000, 5_000, 7, 101)


def test_without_ids_a_command_that_needs_one_waits() -> None:
    leader = core()
    assert leader.block_due(leader.clock())
    assert stamped(leader, init("t"), leader.stamp(), always) is None
    assert stamped(leader, init("t"), leader.stamp(), never) is not None


def test_a_block_is_due_at_90_percent_use_and_only_once_at_a_time() -> None:
    leader = core(block_size=10)
    _command, token = leader.request_block()
    assert not leader.block_due(leader.clock())  # requested, not answered yet
    assert leader.block_granted(token, Outcome(block_first=0, block_end=10))
    for _ in range(8):
        assert leader.take_producer_id() is not None
        assert not leader.block_due(leader.clock())
    assert leader.take_producer_id() == 8
    assert leader.block_due(leader.clock())


def test_a_block_request_that_was_not_applied_is_asked_again() -> None:
    leader = core()
    _command, token = leader.request_block()
    leader.block_not_applied(token)
    assert leader.block_due(leader.clock())


def test_a_refused_block_grants_nothing_and_is_not_asked_again_this_leadership() -> None:
    leader = core()
    _command, token = leader.request_block()
    refused = Outcome(error=ErrorCode.UNKNOWN_SERVER_ERROR, message="refused")
    assert not leader.block_granted(token, refused)
    assert leader.take_producer_id() is None
    assert not leader.block_due(leader.clock())
    leader.elected(8)
    assert leader.block_due(leader.clock())


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
    batch = leader.batch(queued, leader.stamp(), always, nowhere)
    assert batch is not None
    assert batch.requests == queued and batch.waiting == []
    assert [c.new_producer_id for c in batch.commands if isinstance(c, InitProducerId)] == [0, 1]
    assert len(batch.commands) == 3  # the read has no command


def test_group_commit_keeps_requests_while_entries_are_in_flight() -> None:
    leader = core()
    for _ in range(MAX_ENTRIES_IN_FLIGHT):
        assert leader.batch([Queued(add_offsets("a"))], leader.stamp(), never, nowhere) is not None
    assert leader.batch([Queued(add_offsets("b"))], leader.stamp(), never, nowhere) is None
    leader.entry_done(7)
    assert leader.batch([Queued(add_offsets("b"))], leader.stamp(), never, nowhere) is not None


def test_an_entry_of_an_earlier_leadership_does_not_count() -> None:
    leader = core()
    assert leader.batch([Queued(add_offsets("a"))], leader.stamp(), never, nowhere) is not None
    leader.elected(8)
    leader.entry_done(7)
    assert leader.in_flight == 0


def test_requests_after_one_waiting_for_a_block_wait_too_in_order() -> None:
    leader = core()
    first, blocked, after = Queued(add_offsets("a")), Queued(init("b")), Queued(None)
    batch = leader.batch([first, blocked, after], leader.stamp(), always, nowhere)
    assert batch is not None
    assert batch.requests == [first] and batch.waiting == [blocked, after]
    leader.entry_done(7)
    nothing = leader.batch([blocked, after], leader.stamp(), always, nowhere)
    assert nothing is not None and not nothing.requests
    assert nothing.waiting == [blocked, after]
    assert leader.in_flight == 0  # an empty batch is not an entry


def test_a_timed_out_transaction_is_aborted_with_the_leaders_stamp() -> None:
    candidate = AbortTimedOut("t", 3, 1, 100, 0)
    command: Command = timed_out_abort(candidate)(Stamp(900, 7))
    assert command == AbortTimedOut("t", 3, 1, 900, 7)


# --- parking behind a completing transaction ------------------------------------------


def state_of(driver: Leader) -> Callable[[str], TxnState | None]:
    def state(tid: str) -> TxnState | None:
        meta = driver.machine.describe(tid)
        return None if meta is None else meta.state

    return state


def committing(tid: str) -> tuple[Leader, Outcome]:
    """A shard whose transaction ``tid`` is in PrepareCommit (markers
    pending), and the identity of its next transaction (the epoch EndTxn gave)."""
    driver = Leader.new()
    ident = driver.init(tid)
    assert driver.add(tid, ident.producer_id, ident.producer_epoch, ("t", 0)).ok
    ended = driver.end(tid, ident.producer_id, ident.producer_epoch, commit=True)
    assert ended.ok
    return driver, ended


def last_command(driver: Leader) -> Command:
    return decode_command(driver.log[-1])


@pytest.mark.parametrize("kind", ["init", "add", "add_offsets", "end_same_decision"])
def test_a_request_answered_concurrent_while_markers_are_pending_parks(kind: str) -> None:
    driver, ident = committing("a")
    pid, epoch = ident.producer_id, ident.producer_epoch
    outcome = {
        "init": lambda: driver.init("a"),
        "add": lambda: driver.add("a", pid, epoch, ("t", 1)),
        "add_offsets": lambda: driver.add_offsets("a", pid, epoch, "g"),
        "end_same_decision": lambda: driver.end("a", pid, epoch, commit=True),
    }[kind]()
    assert outcome.error is ErrorCode.CONCURRENT_TRANSACTIONS
    assert park_key(last_command(driver), outcome, state_of(driver)) == "a"


def test_after_the_completion_the_answer_is_given() -> None:
    driver, ident = committing("a")
    driver.deliver_all()
    outcome = driver.add("a", ident.producer_id, ident.producer_epoch, ("t", 1))
    assert outcome.ok
    assert park_key(last_command(driver), outcome, state_of(driver)) is None


def test_other_refusals_are_answered_at_once() -> None:
    driver = Leader.new()
    ident = driver.init("a")
    assert driver.add("a", ident.producer_id, ident.producer_epoch, ("t", 0)).ok
    assert driver.end("a", ident.producer_id, ident.producer_epoch, commit=True).ok
    # A retry of the ended transaction with the other decision is refused
    # whatever the markers do.
    wrong = driver.end("a", ident.producer_id, ident.producer_epoch, commit=False)
    assert wrong.error is ErrorCode.INVALID_TXN_STATE
    assert park_key(last_command(driver), wrong, state_of(driver)) is None
    fenced = driver.add("a", ident.producer_id, ident.producer_epoch - 1, ("t", 1))
    assert fenced.error is not ErrorCode.CONCURRENT_TRANSACTIONS
    assert park_key(last_command(driver), fenced, state_of(driver)) is None


def test_concurrent_without_a_completion_to_wait_for_is_answered_at_once() -> None:
    # The completion applied later in the same entry: nothing left to wait for.
    driver, ident = committing("a")
    refused = driver.add("a", ident.producer_id, ident.producer_epoch, ("t", 1))
    command = last_command(driver)
    driver.deliver_all()
    assert park_key(command, refused, state_of(driver)) is None


def test_a_request_stays_parked_until_the_timeout_and_never_past_its_callers_deadline() -> None:
    assert park_deadline(1_000, 500, None) == 1_500
    assert park_deadline(1_000, 500, 9_000) == 1_500
    # Answered before the caller gives up: a request nobody waits for never runs.
    assert park_deadline(1_000, 500, 1_300) == 1_300 - PARK_MARGIN_MS


def markers_written(tid: str) -> Unstamped:
    return lambda s: MarkersWritten(tid, 1, 0, (("t", 0),), (), s.now_ms, 1)


def add(tid: str, partition: int) -> Unstamped:
    return lambda s: AddPartitions(tid, 1, 1, (("t", partition),), s.now_ms, s.coordinator_epoch)


def test_requests_parked_behind_a_completion_go_into_its_entry_right_behind_it() -> None:
    leader, parking = core(), Parking[Queued]()
    held_x, held_y = Queued(add("x", 1)), Queued(add("y", 1))
    parking.park("x", held_x, 10**9)
    parking.park("y", held_y, 10**9)
    before_x, completion, after_x, after_y = (
        Queued(add("x", 2)),
        Queued(markers_written("x")),
        Queued(add("x", 3)),
        Queued(add("y", 2)),
    )
    # Every add would wait for its transaction's completion (Prepare*).
    batch = leader.batch(
        [before_x, completion, after_x, after_y],
        leader.stamp(),
        never,
        lambda command: True,
        parking.release,
    )
    assert batch is not None
    # x's parked add and its later one go in behind x's completion; an add of
    # x queued before the completion, and y's, wait for completions as before.
    assert batch.requests == [completion, held_x, after_x]
    assert [type(c) for c in batch.commands] == [MarkersWritten, AddPartitions, AddPartitions]
    assert batch.parked == [("x", before_x), ("y", after_y)]
    assert parking.release("y") == [held_y] and parking.count == 0


def test_a_completion_nobody_waits_for_is_held_back_for_the_next_request() -> None:
    """A completion no request of its id waits for is held back until one
    comes (which then shares its entry) or COMPLETION_LINGER_MS are over."""
    clock = FakeClock()
    leader, parking = core(clock=clock), Parking[Queued]()
    completion, other = Queued(markers_written("x")), Queued(add_offsets("b"))
    batch = leader.batch([completion, other], leader.stamp(), never, nowhere, parking.release)
    assert batch is not None
    assert batch.requests == [other] and batch.lingering == [completion]
    assert batch.linger_until_ms == clock.now_ms + COMPLETION_LINGER_MS
    leader.entry_done(7)
    # x's producer goes on: its add arrives and goes in right behind the completion.
    clock.now_ms += COMPLETION_LINGER_MS - 1
    following = Queued(add("x", 1))
    batch = leader.batch(
        [completion, following], leader.stamp(), never, lambda command: True, parking.release
    )
    assert batch is not None and not batch.lingering and batch.linger_until_ms is None
    assert batch.requests == [completion, following]
    leader.entry_done(7)
    # Nobody comes for y's completion: it goes alone once its time is over,
    # counted from when it was first held.
    lone = Queued(markers_written("y"))
    for _ in range(COMPLETION_LINGER_MS):
        batch = leader.batch([lone], leader.stamp(), never, nowhere, parking.release)
        assert batch is not None and batch.lingering == [lone] and not batch.requests
        clock.now_ms += 1
    batch = leader.batch([lone], leader.stamp(), never, nowhere, parking.release)
    assert batch is not None and batch.requests == [lone] and not batch.lingering
    assert leader.lingering == {}


def test_a_completion_with_a_parked_request_is_not_held_back() -> None:
    leader, parking = core(), Parking[Queued]()
    held = Queued(add("x", 1))
    parking.park("x", held, 10**9)
    completion = Queued(markers_written("x"))
    batch = leader.batch([completion], leader.stamp(), never, nowhere, parking.release)
    assert batch is not None and batch.requests == [completion, held] and not batch.lingering


def test_parked_requests_are_released_per_transactional_id_in_order() -> None:
    parking: Parking[Queued] = Parking()
    a1, a2, b = Queued(None), Queued(None), Queued(None)
    parking.park("a", a1, 100)
    parking.park("b", b, 100)
    parking.park("a", a2, 100)
    assert parking.release("a") == [a1, a2]
    assert parking.release("a") == []
    assert parking.count == 1
    assert parking.drain() == [b] and parking.count == 0


def test_parked_requests_past_their_deadline_are_expired() -> None:
    parking: Parking[Queued] = Parking()
    early, late, other = Queued(None), Queued(None), Queued(None)
    parking.park("a", early, 100)
    parking.park("a", late, 200)
    parking.park("b", other, 150)
    assert parking.expired(99) == []
    assert parking.expired(150) == [early, other]
    assert parking.count == 1
    assert parking.release("a") == [late]
    assert parking.release("b") == []


# --- preferred leaders --------------------------------------------------------------


def test_the_preferred_leader_never_transfers() -> None:
    clock = FakeClock()
    leader = core(clock=clock)
    leader.became_ready(clock.now_ms, preferred=True)
    for _ in range(10):
        clock.now_ms += TRANSFER_RETRY_MS
        assert not leader.transfer_due(clock.now_ms)


def test_another_leader_waits_for_the_nodes_check_and_no_entry_in_flight() -> None:
    clock = FakeClock()
    leader = core(clock=clock)
    assert not leader.transfer_due(clock.now_ms)  # not ready yet
    leader.became_ready(clock.now_ms, preferred=False)
    clock.now_ms += FIRST_CHECK_MS - 1
    assert not leader.transfer_due(clock.now_ms)
    clock.now_ms += 1
    assert leader.batch([Queued(add_offsets("a"))], leader.stamp(), never, nowhere) is not None
    assert not leader.transfer_due(clock.now_ms)  # the follower's log cannot match yet
    leader.entry_done(7)
    assert leader.transfer_due(clock.now_ms)


def test_a_leadership_that_begins_after_the_first_check_waits_for_the_next() -> None:
    """A restarted preferred node does not get its shard back at once: the
    leader that took over waits for its node's next periodic check."""
    clock = FakeClock()
    started = clock.now_ms
    leader = core(clock=clock)
    clock.now_ms = started + FIRST_CHECK_MS + 1_000
    leader.became_ready(clock.now_ms, preferred=False)
    for later in (0, 60_000, INTERVAL_MS - 1_001):
        assert not leader.transfer_due(clock.now_ms + later)
    assert leader.transfer_due(started + FIRST_CHECK_MS + INTERVAL_MS)


def test_a_balanced_check_or_one_without_a_moment_to_transfer_waits_for_the_next() -> None:
    clock = FakeClock()
    check = clock.now_ms + FIRST_CHECK_MS
    leader = core(clock=clock)
    leader.became_ready(clock.now_ms, preferred=False)
    assert leader.transfer_due(check)
    leader.balanced(check)  # the preferred node's imbalance is within bounds
    assert not leader.transfer_due(check + INTERVAL_MS - 1)
    assert leader.transfer_due(check + INTERVAL_MS)
    # The follower's log never matched within the grace: the check gives up.
    assert not leader.transfer_due(check + INTERVAL_MS + TRANSFER_GRACE_MS)
    assert not leader.transfer_due(check + 2 * INTERVAL_MS - 1)
    assert leader.transfer_due(check + 2 * INTERVAL_MS)


def test_an_operators_election_asks_at_once_whatever_the_imbalance() -> None:
    clock = FakeClock()
    leader = core(clock=clock)
    leader.became_ready(clock.now_ms, preferred=False)
    clock.now_ms += 1_000
    assert not leader.transfer_due(clock.now_ms) and not leader.forced
    assert leader.elect_preferred(clock.now_ms)
    assert leader.transfer_due(clock.now_ms) and leader.forced
    preferred = core(clock=clock)
    preferred.became_ready(clock.now_ms, preferred=True)
    assert not preferred.elect_preferred(clock.now_ms)
    assert not preferred.transfer_due(clock.now_ms + INTERVAL_MS)


def test_a_transfer_holds_new_entries_then_retries_later() -> None:
    clock = FakeClock()
    leader = core(clock=clock)
    leader.became_ready(clock.now_ms, preferred=False)
    clock.now_ms += FIRST_CHECK_MS
    assert leader.transfer_due(clock.now_ms)
    leader.transferred(clock.now_ms)
    asked = clock.now_ms
    assert not leader.transfer_due(clock.now_ms)
    assert leader.batch([Queued(add_offsets("a"))], leader.stamp(), never, nowhere) is None
    clock.now_ms = asked + TRANSFER_HOLD_MS  # the election did not end this leadership
    assert leader.batch([Queued(add_offsets("a"))], leader.stamp(), never, nowhere) is not None
    leader.entry_done(7)
    assert not leader.transfer_due(clock.now_ms)
    clock.now_ms = asked + TRANSFER_RETRY_MS
    assert leader.transfer_due(clock.now_ms)


def test_a_new_leadership_starts_without_a_transfer_or_a_hold() -> None:
    clock = FakeClock()
    leader = core(clock=clock)
    leader.became_ready(clock.now_ms, preferred=False)
    clock.now_ms += FIRST_CHECK_MS
    leader.transferred(clock.now_ms)
    leader.elected(8)
    assert not leader.transfer_due(clock.now_ms + TRANSFER_RETRY_MS)
    assert leader.batch([Queued(add_offsets("a"))], leader.stamp(), never, nowhere) is not None


def test_the_imbalance_ratio_is_kafkas() -> None:
    """Shards 0..5 prefer nodes 1, 2, 3, 1, 2, 3."""
    preferred = [1, 2, 3, 1, 2, 3]
    assert not imbalanced([1, 2, 3, 1, 2, 3], preferred, 1, 10)
    assert imbalanced([2, 2, 3, 1, 2, 3], preferred, 1, 10)  # 1 of 2: 50 % > 10 %
    assert imbalanced([None, 2, 3, 1, 2, 3], preferred, 1, 10)  # no leader known
    assert not imbalanced([2, 2, 3, 1, 2, 3], preferred, 1, 50)  # 50 % is not above 50 %
    assert imbalanced([2, 2, 3, 2, 2, 3], preferred, 1, 99)
    assert not imbalanced([1, 1, 1], [1, 1, 1], 2, 10)  # no shard prefers node 2


def test_checks_come_first_after_the_start_then_every_interval() -> None:
    checks = ImbalanceChecks(1_000, INTERVAL_MS)
    first = 1_000 + FIRST_CHECK_MS
    assert checks.next_at(0) == first and checks.next_at(first) == first
    assert checks.next_at(first + 1) == first + INTERVAL_MS
    assert checks.next_at(first + INTERVAL_MS) == first + INTERVAL_MS
    assert checks.next_at(first + 5 * INTERVAL_MS + 7) == first + 6 * INTERVAL_MS


def test_a_request_its_transactions_completion_holds_up_is_parked_not_proposed() -> None:
    driver, ident = committing("a")
    pid, epoch = ident.producer_id, ident.producer_epoch
    leader = core()
    held = Queued(lambda s: AddPartitions("a", pid, epoch, (("t", 1),), s.now_ms, 7))
    other = Queued(add_offsets("b"))
    batch = leader.batch([held, other], leader.stamp(), never, driver.machine.waits_for_completion)
    assert batch is not None
    assert batch.parked == [("a", held)] and batch.requests == [other]
    driver.deliver_all()  # completed: the same request is proposed
    leader.entry_done(7)
    batch = leader.batch([held], leader.stamp(), never, driver.machine.waits_for_completion)
    assert batch is not None and batch.requests == [held] and not batch.parked


def test_a_request_that_may_not_park_is_answered_at_once_not_proposed() -> None:
    driver, ident = committing("a")
    pid, epoch = ident.producer_id, ident.producer_epoch
    leader = core()
    batched = Queued(
        lambda s: AddPartitions("a", pid, epoch, (("t", 1),), s.now_ms, 7), parkable=False
    )
    other = Queued(add_offsets("b"))
    batch = leader.batch(
        [batched, other], leader.stamp(), never, driver.machine.waits_for_completion
    )
    assert batch is not None
    assert batch.concurrent == [batched] and not batch.parked and batch.requests == [other]


def test_a_batched_add_behind_a_completion_is_refused_before_proposing() -> None:
    driver, ident = committing("a")
    add = AddPartitions("a", ident.producer_id, ident.producer_epoch, (("t", 1),), 0, 1)
    refused = settled_refusal(driver.machine, add, BATCHED_SETTLED_REFUSALS)
    assert refused is not None and refused.error is ErrorCode.CONCURRENT_TRANSACTIONS
    assert settled_refusal(driver.machine, add) is None  # a client's add: parked instead
    fenced = AddPartitions("a", ident.producer_id, ident.producer_epoch + 3, (("t", 1),), 0, 1)
    refused = settled_refusal(driver.machine, fenced)
    assert refused is not None and refused.error is ErrorCode.PRODUCER_FENCED
    driver.deliver_all()  # completed: the add goes through the log
    assert settled_refusal(driver.machine, add, BATCHED_SETTLED_REFUSALS) is None


def test_no_block_is_requested_while_a_transfer_holds_new_entries() -> None:
    clock = FakeClock()
    leader = core(clock=clock)
    assert leader.block_due(clock.now_ms)
    leader.became_ready(clock.now_ms, preferred=False)
    clock.now_ms += FIRST_CHECK_MS
    leader.transferred(clock.now_ms)
    assert not leader.block_due(clock.now_ms)
    assert not leader.block_due(clock.now_ms + TRANSFER_HOLD_MS - 1)
    assert leader.block_due(clock.now_ms + TRANSFER_HOLD_MS)


def test_only_a_refusal_that_changes_nothing_waits_for_the_completion() -> None:
    driver, ident = committing("a")
    machine = driver.machine
    pid, epoch = ident.producer_id, ident.producer_epoch
    assert machine.waits_for_completion(AddPartitions("a", pid, epoch, (("t", 1),), 0, 1))
    assert machine.waits_for_completion(EndTxn("a", pid, epoch, True, 0, 1))
    # Another producer's epoch is fenced whatever the markers do.
    assert not machine.waits_for_completion(AddPartitions("a", pid, epoch + 5, (("t", 1),), 0, 1))
    assert not machine.waits_for_completion(AddOffsets("b", 1, 0, "g", 0, 1))  # unknown id
    assert not machine.waits_for_completion(AbortTimedOut("a", pid, epoch, 0, 1))


def _add(*partitions: int, tid: str = "a", pid: int = 7, epoch: int = 2) -> AddPartitions:
    return AddPartitions(tid, pid, epoch, tuple(("t", p) for p in partitions), 1_000, 3)


def test_an_add_covered_by_the_last_entrys_add_gets_its_outcome() -> None:
    """The nodes of one flush send the same add: the second is answered with
    the first one's outcome (same producer and epoch, its partitions among
    the first one's, and the first one added)."""
    added, refused = Outcome(), Outcome(error=ErrorCode.PRODUCER_FENCED)
    applied = [(_add(0, 1), added)]
    assert covering_outcome(applied, _add(1, 0)) is added
    assert covering_outcome(applied, _add(1)) is added  # a subset
    assert covering_outcome(applied, _add(1, 2)) is None  # a partition more
    assert covering_outcome(applied, _add(0, 1, epoch=3)) is None  # another epoch
    assert covering_outcome(applied, _add(0, 1, pid=8)) is None  # another producer id
    assert covering_outcome(applied, _add(0, 1, tid="b")) is None  # another id
    assert covering_outcome([(_add(0, 1), refused)], _add(0)) is None  # only a success covers
    end = EndTxn("a", 7, 2, True, 1_000, 3)
    assert covering_outcome(applied, end) is None  # only adds are covered
    assert covering_outcome([], _add(0)) is None


class SteppingClocks:
    """A wall clock an operator can step and a monotonic clock that only moves on."""

    def __init__(self) -> None:
        self.wall_s = 1_000_000.0
        self.monotonic_s = 50.0

    def advance(self, seconds: float) -> None:
        self.wall_s += seconds
        self.monotonic_s += seconds


def test_the_leader_clock_ignores_wall_clock_steps_during_a_leadership() -> None:
    clocks = SteppingClocks()
    clock = LeaderClock(lambda: clocks.wall_s, lambda: clocks.monotonic_s)
    clock.start(0)
    assert clock.now_ms() == 1_000_000_000
    clocks.advance(2.5)
    assert clock.now_ms() == 1_000_002_500
    clocks.wall_s += 3600  # a step forward
    clocks.advance(1.0)
    assert clock.now_ms() == 1_000_003_500
    clocks.wall_s -= 7200  # and back
    clocks.advance(1.0)
    assert clock.now_ms() == 1_000_004_500
    assert clock.deadline_ms(clocks.monotonic_s + 0.25) == 1_000_004_750


def test_a_new_leadership_reads_the_wall_clock_but_never_goes_below_the_replicated_time() -> None:
    clocks = SteppingClocks()
    clock = LeaderClock(lambda: clocks.wall_s, lambda: clocks.monotonic_s)
    clock.start(0)
    clocks.wall_s += 60  # the wall clock was corrected while this node followed
    clock.start(0)
    assert clock.now_ms() == 1_000_060_000
    clock.start(2_000_000_000)  # the previous leader's clock was ahead
    assert clock.now_ms() == 2_000_000_000
    clocks.advance(1.0)
    assert clock.now_ms() == 2_000_001_000
    assert clock.raise_to(2_000_000_500) == 0  # already later: unchanged
    assert clock.now_ms() == 2_000_001_000
    assert clock.raise_to(2_000_005_000) == 4_000  # the applied log holds a newer stamp
    assert clock.now_ms() == 2_000_005_000
    clocks.advance(0.5)
    assert clock.now_ms() == 2_000_005_500
