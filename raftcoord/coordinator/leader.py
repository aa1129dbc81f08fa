"""A shard leader's decisions, without I/O: what goes into the next Raft
entry and what the leader stamps into it.

* Stamping: a request carries its command :data:`Unstamped`, a function of
  the leader's :class:`Stamp` (the time, the coordinator epoch and, when
  the state machine needs one, a fresh producer id), called when the
  command is proposed.
* Producer-id blocks: the leader serves fresh ids from a
  :class:`pid_allocator.PidCursor` and proposes ``AllocatePidBlock`` when
  the cursor asks for one (at 90% use, or when it is empty).
* Group commit: at most :data:`MAX_ENTRIES_IN_FLIGHT` entries are in flight;
  the requests queued meanwhile go out together in the next entry, in
  arrival order, up to the first one waiting for a producer-id block. An
  add that an add of the entry applied last already covers is answered
  with that add's outcome instead (:func:`covering_outcome`): the
  partition-log nodes of one producer's flush send the same add.
* The coordinator epoch: the Raft term of the leadership, set when it begins.
* The clock (:class:`LeaderClock`): the leader reads the wall clock once
  when its leadership begins and then advances by the monotonic clock, so
  a step of the wall clock neither times out every open transaction nor
  stops the sweepers; it starts no lower than the newest timestamp the
  shard's state holds, so replicated timestamps never move backwards.
* Preferred leaders (Kafka's auto leader rebalance): shard ``s`` prefers
  coordinator ``s mod n``. A leader that is not its shard's preferred one
  waits for the node's next imbalance check (:class:`ImbalanceChecks`:
  Kafka's ``leader.imbalance.check.interval.seconds``, the first check
  :data:`FIRST_CHECK_MS` after the node starts) or an operator's election
  (:meth:`LeaderCore.elect_preferred`); then, when the preferred node's
  imbalance is above ``leader.imbalance.per.broker.percentage`` (the node
  decides, :func:`fsm.partitions.imbalanced`), it asks the preferred follower to take over
  (Raft's TimeoutNow) whenever it has no entry in flight, and holds new
  entries for :data:`TRANSFER_HOLD_MS` after asking. A follower whose log
  does not match yet is asked again on a later tick; after an election it
  lost, again :data:`TRANSFER_RETRY_MS` after the last time; a check that
  found no moment to transfer within :data:`TRANSFER_GRACE_MS` waits for
  the next one. Only the preferred node is ever asked and it never
  transfers, so leadership cannot flap, and a restarted node does not take
  its shards back before a check: one failure costs one leader change.
* Parking: a client's request the state machine answers
  CONCURRENT_TRANSACTIONS because the transactional id's previous
  transaction is still completing (Prepare*, markers pending) is held by
  :class:`Parking` and goes into the entry of the completion
  (``MarkersWritten``), right behind it, or runs again when the completion
  applies if it was parked later, instead of making the client back off;
  past its bound
  (``transaction.park.timeout.ms``, and shortly before its caller's
  deadline: :func:`park_deadline`) it gets the CONCURRENT_TRANSACTIONS
  answer. Requests that are not :attr:`Queued.parkable` (the adds of a
  batched AddPartitionsToTxn over gRPC that did not ask to wait, which
  answers only once all its transactions are answered) get that answer at
  once.

:class:`LeaderCore` is not thread-safe; its owner serialises calls. The
clocks are injected, so tests run them on fake ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from fsm import (
    AbortTimedOut,
    AddPartitions,
    AllocatePidBlock,
    Command,
    EndTxn,
    ErrorCode,
    InitProducerId,
    MarkersWritten,
    Outcome,
    TxnState,
)
from fsm.machine import WAITING_COMMANDS
from fsm.metadata import NO_PRODUCER_ID
from fsm.states import PREPARE_STATES
from pid_allocator import PidBlock, PidCursor, PidLayout

#: Group commit: a leader keeps at most this many entries of requests in
#: flight; requests arriving meanwhile wait and go out together in the next
#: entry, so under load one Raft entry (and one fsync) carries many requests.
MAX_ENTRIES_IN_FLIGHT = 1

#: A completion (``MarkersWritten``) that no request of its transactional
#: id waits for yet is held back this long for one: a producer that goes on
#: sends its next transaction's first request (the partition-log nodes'
#: add) within a few milliseconds of EndTxn's answer, usually while the
#: markers are written, sometimes just after. Held, the completion and that
#: request share one entry instead of taking one each.
COMPLETION_LINGER_MS = 5

#: A parked request is answered this long before its caller's deadline at
#: the latest, leaving time for the answer to arrive: a request whose caller
#: gave up never runs later.
PARK_MARGIN_MS = 100

#: A node's first imbalance check, this long after it starts (Kafka's
#: controller checks 5 s after it takes over).
FIRST_CHECK_MS = 5_000
#: Kafka's default leader.imbalance.check.interval.seconds, in milliseconds.
KAFKA_CHECK_INTERVAL_MS = 300_000
#: How long one check (or an operator's election) keeps trying to transfer.
TRANSFER_GRACE_MS = 10_000
#: After asking the preferred follower to take over, new entries wait this
#: long (its election normally ends the leadership first).
TRANSFER_HOLD_MS = 500
#: How soon a leadership asks again after it asked (an election the
#: preferred follower lost).
TRANSFER_RETRY_MS = 2_000


@dataclass(frozen=True)
class ImbalanceChecks:
    """When a node checks its leaderships for imbalance: :data:`FIRST_CHECK_MS`
    after it started (``started_ms``), then every ``interval_ms``."""

    started_ms: int
    interval_ms: int

    def next_at(self, now_ms: int) -> int:
        """The time of the first check at or after ``now_ms``."""
        first = self.started_ms + FIRST_CHECK_MS
        if now_ms <= first:
            return first
        return first + -(-(now_ms - first) // self.interval_ms) * self.interval_ms


@dataclass(frozen=True)
class Stamp:
    """What the leader writes into a command it proposes."""

    now_ms: int
    coordinator_epoch: int
    new_producer_id: int = NO_PRODUCER_ID


#: A command as a request carries it: built from the leader's stamp.
Unstamped = Callable[[Stamp], Command]

#: Whether the state machine needs a fresh producer id for a command
#: (:meth:`fsm.TransactionStateMachine.needs_new_producer_id`).
NeedsProducerId = Callable[[InitProducerId | EndTxn], bool]

#: Whether a command would only be answered CONCURRENT_TRANSACTIONS because
#: its transaction is completing
#: (:meth:`fsm.TransactionStateMachine.waits_for_completion`).
WaitsForCompletion = Callable[[Command], bool]

#: The stamp of a command that is checked (request limits) and never
#: proposed: the checks read no stamped field.
CHECK_ONLY = Stamp(now_ms=0, coordinator_epoch=0)


def timed_out_abort(candidate: AbortTimedOut) -> Unstamped:
    """The abort of a transaction the state machine found timed out."""
    return lambda stamp: AbortTimedOut(
        candidate.transactional_id,
        candidate.producer_id,
        candidate.producer_epoch,
        stamp.now_ms,
        stamp.coordinator_epoch,
    )


class Queued(Protocol):
    """A queued request: a command to stamp, or (None) a read behind the entry."""

    @property
    def build(self) -> Unstamped | None: ...

    @property
    def parkable(self) -> bool:
        """Whether the request may be parked (else it is answered at once)."""


Q = TypeVar("Q", bound=Queued)


@dataclass
class Batch(Generic[Q]):
    """The requests of the next entry, with its commands (reads have none),
    the requests left waiting for a producer-id block, in order, the
    requests to park (with their transactional id) instead of proposing,
    those to answer CONCURRENT_TRANSACTIONS now (not parkable), and the
    completions held back (:data:`COMPLETION_LINGER_MS`)."""

    requests: list[Q] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    waiting: list[Q] = field(default_factory=list)
    parked: list[tuple[str, Q]] = field(default_factory=list)
    concurrent: list[Q] = field(default_factory=list)
    #: Completions held back for a request of their transactional id (they
    #: wait, ahead of :attr:`waiting`), and when the first of them is due.
    lingering: list[Q] = field(default_factory=list)
    linger_until_ms: int | None = None


class LeaderClock:
    """The milliseconds a shard's leader stamps into commands and measures
    its deadlines (transaction timeouts, id expiry, group sessions, parked
    requests) by.

    :meth:`start` reads the wall clock once; from then on the time advances
    by the monotonic clock only, so stepping the wall clock (an operator's
    ``date -s``, a virtual machine resumed) changes nothing until the next
    leadership. It never starts below ``floor_ms``, the newest timestamp
    already replicated, so a leader whose wall clock is behind the previous
    leader's continues from there instead of moving time backwards.
    """

    def __init__(self, wall: Callable[[], float], monotonic: Callable[[], float]) -> None:
        self._wall = wall  # seconds
        self._monotonic = monotonic  # seconds
        #: (the time in ms, the monotonic clock then): replaced as a whole,
        #: so readers on other threads see one consistent pair.
        self._base = (0, 0.0)
        self.start(0)

    def start(self, floor_ms: int) -> None:
        """A leadership begins: the time is the wall clock's, or ``floor_ms``
        if that is later."""
        at = self._monotonic()
        self._base = (max(int(self._wall() * 1000), floor_ms), at)

    def raise_to(self, floor_ms: int) -> int:
        """Continue from ``floor_ms`` if the time is earlier (the state
        applied since :meth:`start` holds a newer timestamp); returns how many
        milliseconds the time moved forward (0: none)."""
        behind = floor_ms - self.now_ms()
        if behind <= 0:
            return 0
        base_ms, at = self._base
        self._base = (base_ms + behind, at)
        return behind

    def now_ms(self) -> int:
        return self.deadline_ms(self._monotonic())

    def deadline_ms(self, at_monotonic: float) -> int:
        """This clock's time when the monotonic clock reads ``at_monotonic``."""
        base_ms, at = self._base
        return base_ms + int((at_monotonic - at) * 1000)


class LeaderCore:
    """One shard's leader logic for one node, across its leaderships."""

    def __init__(
        self,
        layout: PidLayout,
        clock: Callable[[], int],
        checks: ImbalanceChecks | None = None,
        completion_linger_ms: int = COMPLETION_LINGER_MS,
    ) -> None:
        self.layout = layout
        #: How long a completion is held back for a request of its id.
        self.completion_linger_ms = completion_linger_ms
        self.clock = clock  # milliseconds
        #: When the node checks its leaderships (without a node: as if it
        #: started at time 0, with Kafka's default interval).
        self.checks = checks or ImbalanceChecks(0, KAFKA_CHECK_INTERVAL_MS)
        self.cursor = PidCursor()
        #: The coordinator epoch of the current (or last) leadership, -1 before any.
        self.epoch = -1
        #: Entries of requests proposed in this leadership and not yet applied.
        self.in_flight = 0
        #: When to ask the preferred follower to take over; None: never (this
        #: node is the preferred one, or the leadership is not ready).
        self.transfer_at: int | None = None
        #: When the check (or election) that asks now began.
        self.check_at = 0
        #: An operator asked for the preferred leader (asked whatever the imbalance).
        self.forced = False
        #: No new entry before this time: a leadership transfer is under way.
        self.hold_until = 0
        #: Transactional id -> until when its completion is held back.
        self.lingering: dict[str, int] = {}

    # --- leadership ----------------------------------------------------------------

    def elected(self, epoch: int) -> None:
        """A leadership begins with coordinator epoch ``epoch`` (its Raft term):
        the ids left from an earlier leadership are skipped, never reused."""
        self.epoch = epoch
        self.in_flight = 0
        self.lingering = {}
        self.transfer_at = None
        self.forced = False
        self.hold_until = 0
        self.cursor.reset()

    def became_ready(self, now_ms: int, preferred: bool) -> None:
        """The leadership is ready (its first entry applied); ``preferred``:
        this node is the shard's preferred leader, or nobody is."""
        self.transfer_at = None if preferred else self.checks.next_at(now_ms)
        self.check_at = self.transfer_at or 0

    def deposed(self) -> None:
        """The leadership ended: its ids and block requests are dropped."""
        self.cursor.reset()

    # --- preferred leaders -----------------------------------------------------------

    def transfer_due(self, now_ms: int) -> bool:
        """Whether to ask the preferred follower to take over now (it is
        asked only if its log matches the leader's, so with no entry in
        flight); past the check's grace the next check is waited for."""
        if self.transfer_at is None or now_ms < self.transfer_at:
            return False
        if now_ms >= self.check_at + TRANSFER_GRACE_MS:
            self.balanced(now_ms)
            return False
        return now_ms >= self.hold_until and self.in_flight == 0

    def transferred(self, now_ms: int) -> None:
        """The preferred follower was asked to take over: new entries wait."""
        self.hold_until = now_ms + TRANSFER_HOLD_MS
        self.transfer_at = now_ms + TRANSFER_RETRY_MS

    def balanced(self, now_ms: int) -> None:
        """A check found nothing to do (or no moment to do it): the next check."""
        if self.transfer_at is not None:
            self.transfer_at = self.check_at = self.checks.next_at(now_ms + 1)
            self.forced = False

    def elect_preferred(self, now_ms: int) -> bool:
        """An operator asks for the preferred leader now (Kafka's preferred
        leader election): whether this leadership will ask it."""
        if self.transfer_at is None:
            return False
        self.transfer_at = self.check_at = now_ms
        self.forced = True
        return True

    # --- stamping ------------------------------------------------------------------

    def stamp(self) -> Stamp:
        """The stamp of commands proposed now."""
        return Stamp(self.clock(), self.epoch)

    def _with_producer_id(
        self, command: Command, build: Unstamped, stamp: Stamp, needs: NeedsProducerId
    ) -> Command | None:
        if isinstance(command, InitProducerId | EndTxn) and needs(command):
            pid = self.cursor.take()
            if pid is None:
                return None
            command = build(Stamp(stamp.now_ms, stamp.coordinator_epoch, pid))
        return command

    # --- producer-id blocks --------------------------------------------------------

    def block_due(self, now_ms: int) -> bool:
        """Whether to propose the next ``AllocatePidBlock`` now (not while a
        leadership transfer holds new entries)."""
        return now_ms >= self.hold_until and self.cursor.needs_block()

    def request_block(self) -> tuple[AllocatePidBlock, int]:
        """The ``AllocatePidBlock`` to propose, and the token of its answer."""
        token = self.cursor.mark_requested()
        return AllocatePidBlock(
            self.layout.shard, self.layout.shard_count, self.layout.block_size
        ), token

    def block_granted(self, token: int, outcome: Outcome) -> bool:
        """The applied answer to the request of ``token``; whether it granted a
        block. A refusal leaves the request outstanding for this leadership."""
        if not outcome.ok:
            return False
        self.cursor.add_block(PidBlock(outcome.block_first, outcome.block_end), token)
        return True

    def block_not_applied(self, token: int) -> None:
        """The request of ``token`` never reached the state machine: ask again."""
        self.cursor.request_failed(token)

    def take_producer_id(self) -> int | None:
        """An id for an idempotent producer, or None until the next block."""
        return self.cursor.take()

    # --- group commit --------------------------------------------------------------

    def batch(
        self,
        queued: Sequence[Q],
        stamp: Stamp,
        needs: NeedsProducerId,
        waits: WaitsForCompletion,
        release: Callable[[str], Sequence[Q]] = lambda _tid: (),
    ) -> Batch[Q] | None:
        """The next entry of ``queued`` (oldest first), or None while
        :data:`MAX_ENTRIES_IN_FLIGHT` entries are in flight or a leadership
        transfer holds new entries (all of ``queued`` then waits). A
        request that ``waits`` for its transaction's completion is not
        proposed: parked if it is :attr:`Queued.parkable`, else answered
        CONCURRENT_TRANSACTIONS at once. A non-empty batch counts as in
        flight until :meth:`entry_done`.

        The requests parked behind a transaction whose ``MarkersWritten``
        goes into the entry (``release``: they are taken from the parking)
        go into the same entry right after it, as do later requests of
        that transactional id: applied after the completion, they are
        answered as they would be in the next entry, one entry sooner. One
        that the completion does not settle (markers still missing) is
        answered CONCURRENT_TRANSACTIONS by the state machine and parked
        again when the entry applies.

        A completion that no request of its transactional id waits for
        (parked, or among ``queued``) is held back (:attr:`Batch.lingering`)
        until one arrives or :attr:`completion_linger_ms` after it was first
        held, whichever is first."""
        if self.in_flight >= MAX_ENTRIES_IN_FLIGHT or stamp.now_ms < self.hold_until:
            return None
        batch: Batch[Q] = Batch()

        def stamped(request: Q) -> tuple[Q, Command | None]:
            """The request with its command as stamped now (None: a read)."""
            return request, None if request.build is None else request.build(stamp)

        pending = [stamped(r) for r in queued]
        completing: set[str] = set()  # ids whose MarkersWritten is in this entry
        # ids of the queued requests that may wait for a completion
        arriving = {c.transactional_id for _, c in pending if isinstance(c, WAITING_COMMANDS)}
        i = 0
        while i < len(pending):
            request, unstamped = pending[i]
            i += 1
            if unstamped is None:
                batch.requests.append(request)
                continue
            if (
                isinstance(unstamped, WAITING_COMMANDS)
                and unstamped.transactional_id not in completing
                and waits(unstamped)
            ):
                if request.parkable:
                    batch.parked.append((unstamped.transactional_id, request))
                else:
                    batch.concurrent.append(request)
                continue
            released: Sequence[Q] = ()
            if isinstance(unstamped, MarkersWritten):
                tid = unstamped.transactional_id
                released = release(tid)
                if not released and tid not in arriving:
                    until = self.lingering.setdefault(tid, stamp.now_ms + self.completion_linger_ms)
                    if stamp.now_ms < until:
                        batch.lingering.append(request)
                        if batch.linger_until_ms is None or until < batch.linger_until_ms:
                            batch.linger_until_ms = until
                        continue
                self.lingering.pop(tid, None)
            assert request.build is not None
            command = self._with_producer_id(unstamped, request.build, stamp, needs)
            if command is None:  # waiting for a producer-id block; keep the order
                batch.waiting = [r for r, _ in pending[i - 1 :]]
                break
            batch.requests.append(request)
            batch.commands.append(command)
            if isinstance(command, MarkersWritten):
                completing.add(command.transactional_id)
                pending[i:i] = [stamped(r) for r in released]
        if batch.requests:
            self.in_flight += 1
        return batch

    def entry_done(self, epoch: int) -> None:
        """An entry proposed with coordinator epoch ``epoch`` was applied or dropped."""
        if epoch == self.epoch:
            self.in_flight -= 1


def covering_outcome(
    applied: Sequence[tuple[AddPartitions, Outcome]], command: Command
) -> Outcome | None:
    """The outcome to give an AddPartitions ``command`` from the adds of the
    entry applied last (``applied``, each with its outcome) when one of them
    covers it: the same transactional id, producer id and epoch, every
    partition of ``command`` among its own, and added (NONE). Applied right
    after that entry, ``command`` would change nothing and succeed too, so
    while no other entry has applied (the caller's part) it is answered as
    if it had been in that entry. None: ``command`` goes through the log."""
    if not isinstance(command, AddPartitions):
        return None
    wanted = set(command.partitions)
    for done, outcome in applied:
        if (
            outcome.ok
            and (done.transactional_id, done.producer_id, done.producer_epoch)
            == (command.transactional_id, command.producer_id, command.producer_epoch)
            and wanted <= set(done.partitions)
        ):
            return outcome
    return None


def park_key(
    command: Command, outcome: Outcome, state_of: Callable[[str], TxnState | None]
) -> str | None:
    """The transactional id to park the (parkable) request of ``command``
    behind, or None to answer ``outcome`` now: parked when the state machine
    answered CONCURRENT_TRANSACTIONS to a request in
    :data:`fsm.machine.WAITING_COMMANDS` and the id's
    transaction, in state ``state_of(id)`` after the entry, is completing
    (Prepare*: its completion will apply, or the leadership ends)."""
    if (
        isinstance(command, WAITING_COMMANDS)
        and outcome.error is ErrorCode.CONCURRENT_TRANSACTIONS
        and state_of(command.transactional_id) in PREPARE_STATES
    ):
        return command.transactional_id
    return None


def park_deadline(now_ms: int, timeout_ms: int, caller_deadline_ms: int | None) -> int:
    """Until when a request first parked at ``now_ms`` may stay parked: the
    park timeout, and :data:`PARK_MARGIN_MS` before its caller's deadline."""
    deadline = now_ms + timeout_ms
    if caller_deadline_ms is not None:
        deadline = min(deadline, caller_deadline_ms - PARK_MARGIN_MS)
    return deadline


class Parking(Generic[Q]):
    """Requests parked per transactional id until its transaction completes,
    each with its deadline (ms). Ids do not wait for each other. Its owner
    serialises calls; :attr:`count` may be read from any thread."""

    def __init__(self) -> None:
        self._parked: dict[str, list[tuple[int, Q]]] = {}
        #: How many requests are parked.
        self.count = 0

    def park(self, transactional_id: str, request: Q, deadline_ms: int) -> None:
        self._parked.setdefault(transactional_id, []).append((deadline_ms, request))
        self.count += 1

    def release(self, transactional_id: str) -> list[Q]:
        """The requests parked behind ``transactional_id``, in parking order:
        its transaction completed, they run again."""
        released = [request for _deadline, request in self._parked.pop(transactional_id, [])]
        self.count -= len(released)
        return released

    def expired(self, now_ms: int) -> list[Q]:
        """The requests whose deadline has come, removed."""
        out: list[Q] = []
        for tid in list(self._parked):
            held = self._parked[tid]
            kept = [(d, r) for d, r in held if d > now_ms]
            out.extend(r for d, r in held if d <= now_ms)
            if kept:
                self._parked[tid] = kept
            else:
                del self._parked[tid]
        self.count -= len(out)
        return out

    def drain(self) -> list[Q]:
        """Every parked request, removed (the leadership ended)."""
        out = [request for held in self._parked.values() for _deadline, request in held]
        self._parked.clear()
        self.count = 0
        return out
