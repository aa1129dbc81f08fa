"""Deterministic simulation of one coordinator shard and its participants.

In the spirit of FoundationDB's simulation testing and TigerBeetle's VOPR:
the real state machine (:class:`fsm.TransactionStateMachine`), the real
marker bookkeeping (:class:`marker_writer.book.MarkerBook`) and the real
partition producer state (:class:`partition_log.producer_state.ProducerStates`)
run against a simulated world, and one seeded :class:`random.Random` decides
everything that world does:

* Raft is abstracted as one ordered log: the leader appends entries, entries
  commit in order (only while a majority is up) and apply on every replica
  at its own pace; a leader change truncates a random part of the
  uncommitted suffix (the rest commits under the new leader); a replica
  crashes, losing its memory, and restarts from its last snapshot plus the
  committed log tail.
* The leader is the coordinator's own pure core,
  :class:`raftcoord.coordinator.leader.LeaderCore`, one per replica on the
  simulated clock: requests carry their command as an ``Unstamped``
  function of the leader's stamp (as the coordinator's service builds
  them), and the core stamps them, group-commits them (``batch``: one entry
  in flight, the queue goes out together in the next one, in order, up to
  the first request waiting for a producer-id block) and asks for
  producer-id blocks. Around it, the simulation does what a node's shard
  does: the leadership becomes ready once its first own entry (a block
  request) applies, sweeps timed-out transactions, runs a marker book
  seeded from the pending markers and parks clients' requests held up by a
  completing transaction (the core's :class:`Parking`): released to run
  again when the completion applies, answered CONCURRENT_TRANSACTIONS at
  their park deadline and NOT_COORDINATOR when the leadership ends. A
  partition's add comes, at random, as over a cluster link (parked as a
  client's request is, for the node's wait, ``ADD_WAIT_MS``, at most) or as in
  a batched gRPC call that did not ask to wait (answered
  CONCURRENT_TRANSACTIONS before proposing, never parked), as the
  coordinator's service treats them. ``block_not_applied`` is never needed:
  in this Raft an entry is lost only with its leadership.
* Marker calls are delayed, reordered, lost (request or answer) and
  duplicated; a deposed leader's calls still arrive.
* Clients (one per transactional id) run InitProducerId, AddPartitions,
  produce, AddOffsets/TxnOffsetCommit and EndTxn with retries; they crash,
  stall past their timeout, and leave zombies behind that go on with an old
  epoch. One speaks transactions v1 as Kafka's clients do (it adds its
  partitions before it produces, its EndTxn keeps the epoch, its sequences
  go on across transactions), one takes part in a two-phase
  commit (KIP-939): its
  transactions never time out, it crashes after preparing, and its next
  incarnation keeps the open transaction (``keep_prepared_txn``) and ends it.

After every step the invariants are checked (see :class:`Simulation`); after
the faults stop, a quiet period must bring every transaction to completion
(liveness). ``python -m tests.simulation --seeds 10000`` runs many seeds; a
failure prints its seed and a command that replays it exactly.

One file on purpose (about 1,050 lines): the simulated log, network,
clients and invariants share one seeded random source and one step loop,
and a seed replays exactly only if nothing else takes part in it.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from fsm import (
    AddOffsets,
    AddPartitions,
    Command,
    EndTxn,
    FsmConfig,
    InitProducerId,
    OffsetEntry,
    Outcome,
    TransactionStateMachine,
    Transition,
    TxnOffsetCommit,
    WriteMarkers,
    encode_entry,
)
from fsm.errors import ErrorCode
from fsm.states import IDLE_STATES, PREPARE_STATES, TxnState
from fsm.transactions import verify_group
from marker_writer import (
    Backoff,
    ConsumerGroup,
    DataPartition,
    Destination,
    DestinationKind,
    MarkerRequest,
    MarkerResponse,
    Participant,
)
from marker_writer.book import CompletionBatch, MarkerBatch, MarkerBook
from partition_log.producer_state import MarkerAction, ProducerStates, Verdict
from raftcoord.coordinator.leader import (
    CHECK_ONLY,
    LeaderCore,
    Parking,
    Unstamped,
    covering_outcome,
    park_deadline,
    park_key,
    timed_out_abort,
)
from raftcoord.coordinator.markers import markers_written
from raftcoord.coordinator.services.groups import group_marker
from raftcoord.coordinator.services.transactions import (
    BATCHED_SETTLED_REFUSALS,
    SETTLED_REFUSALS,
    settled_refusal,
)
from raftcoord.protocol.types import TopicPartition

REPLICAS = 3
MAJORITY = REPLICAS // 2 + 1
TXN_IDS = ("tx-a", "tx-b", "tx-c")
#: The transactional id whose producer uses two-phase commit (KIP-939).
TWO_PHASE_ID = "tx-c"
#: The transactional id whose producer speaks transactions v1 (KIP-890's TV1).
V1_ID = "tx-b"
PARTITIONS = tuple(TopicPartition("t", i) for i in range(3))
GROUP = "g"
#: Small limits so that producer ids rotate and blocks run out within a run.
CONFIG = FsmConfig(max_producer_epoch=6)
BLOCK_SIZE = 4
TXN_TIMEOUT_MS = 2_000
SWEEP_INTERVAL_MS = 500
#: transaction.park.timeout.ms: short, so that parked requests also expire.
PARK_TIMEOUT_MS = 300
#: How long a partition's add over a cluster link may wait for its previous
#: transaction's completion (add.partitions.to.txn.retry.backoff.max.ms).
ADD_WAIT_MS = 100
CALL_TIMEOUT_MS = 500
MAX_MARKER_REQUESTS = 8
MAX_COMPLETIONS = 8
BACKOFF = Backoff(initial_s=20, max_s=400)  # the book's clock is in milliseconds here
FAULT_STEPS = 300
QUIET_STEPS = 3_000

#: Answers a client retries as they are: the outcome is unknown or not yet possible.
RETRIABLE = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.CONCURRENT_TRANSACTIONS,
    }
)
#: Answers no well-formed request may get: a refused entry or a malformed command.
NEVER = frozenset(
    {
        ErrorCode.INVALID_REQUEST,
        ErrorCode.UNKNOWN_SERVER_ERROR,
        ErrorCode.INVALID_TRANSACTION_TIMEOUT,
    }
)


@dataclass(frozen=True)
class Bugs:
    """Planted bugs (off in every real run) that show the invariants catch them."""

    #: A restarted replica replays the log from its snapshot's own index, so
    #: the entry the snapshot already holds applies twice.
    replay_snapshot_entry: bool = False
    #: Partitions close an open transaction with a marker of the same epoch
    #: (``<=`` instead of ``<``): a late duplicate marker of the previous
    #: transaction then ends the next one.
    close_on_equal_epoch: bool = False


BUGS = {
    "replay_snapshot_entry": Bugs(replay_snapshot_entry=True),
    "close_on_equal_epoch": Bugs(close_on_equal_epoch=True),
}


class Violation(AssertionError):
    """An invariant does not hold."""


# --- the replicated log --------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    term: int
    data: bytes


@dataclass
class Request:
    """A request for the leader: its command as a function of the leader's
    stamp (as the coordinator's service builds it); ``reply`` gets its
    outcome (or why it failed)."""

    build: Unstamped
    reply: Callable[[Outcome], None]
    #: Whether it may be parked (a client's request, a partition's add over
    #: a cluster link; not one of a batched gRPC call that did not ask to wait).
    parkable: bool = True
    #: How long it may stay parked from its first parking, if shorter than
    #: the park timeout (a partition's add over a cluster link).
    park_ms: int | None = None
    #: Set when first parked: until when it may stay parked.
    park_deadline: int | None = None


@dataclass
class Proposal:
    """A leader's entry in flight: who gets its outcomes, and whether the
    leader core counts it as in flight (a group-commit entry, whose requests
    and commands are kept to park the ones the outcome holds up; a
    producer-id block request is proposed outside group commit, as on a node)."""

    replies: list[Callable[[Outcome], None]]
    batched: bool
    requests: tuple[Request, ...] = ()
    commands: tuple[Command, ...] = ()


class Replica:
    """One replica of the shard: its state machine, applied index and
    snapshot, and the node's leader core (the coordinator's own, on the
    simulated clock), which lives across leaderships and dies with a crash."""

    def __init__(self, number: int, clock: Callable[[], int]) -> None:
        self.number = number
        self.clock = clock
        self.up = True
        self.machine = _new_machine()
        self.core = LeaderCore(self.machine.state.pids.layout, clock)
        self.applied = 0
        self.snapshot = (0, self.machine.snapshot())
        self.checked = -1  # applied index at the last snapshot comparison

    def crash(self) -> None:
        self.up = False

    def restart(self, bugs: Bugs) -> None:
        index, data = self.snapshot
        self.machine = TransactionStateMachine.restore(data, CONFIG)
        self.core = LeaderCore(self.machine.state.pids.layout, self.clock)
        self.applied = index - 1 if bugs.replay_snapshot_entry and index > 0 else index
        self.up = True
        self.checked = -1


def _new_machine() -> TransactionStateMachine:
    return TransactionStateMachine(0, 1, CONFIG, BLOCK_SIZE)


class Leadership:
    """One replica's leadership of one term: its queue, entries in flight and
    marker book. Everything here is lost when the leadership ends; what to
    stamp and what goes into the next entry is decided by the replica's
    :class:`LeaderCore`, told of the leadership with ``elected``/``deposed``."""

    def __init__(self, replica: Replica, term: int) -> None:
        self.replica = replica
        self.term = term
        self.core = replica.core
        self.active = True
        self.ready = False
        self.queue: list[Request] = []
        self.in_flight: dict[int, Proposal] = {}
        self.parked: Parking[Request] = Parking()
        self.book = MarkerBook(term, BACKOFF)
        self.next_sweep = 0
        #: The adds of this leadership's entry applied last, with their
        #: outcomes, and its index (a node's ``Shard._last_adds``).
        self.last_adds: tuple[int, list[tuple[AddPartitions, Outcome]]] | None = None
        self.core.elected(term)


# --- participants --------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One record of a simulated partition log: data, or a marker (``commit`` set)."""

    producer_id: int
    epoch: int
    commit: bool | None = None


class Partition:
    """A data partition: its records and the pure producer state deciding them."""

    def __init__(self, topic: str, index: int, bugs: Bugs) -> None:
        self.tp = TopicPartition(topic, index)
        self.bugs = bugs
        self.states = ProducerStates()
        self.records: list[Record] = []

    def append(
        self, producer_id: int, epoch: int, sequence: int, verified: bool = False
    ) -> ErrorCode | None:
        """A transactional batch of one record; None when the coordinator must
        add this partition to the producer's transaction first (KIP-890 part
        2), after which the batch comes again ``verified``."""
        check = self.states.check_append(producer_id, epoch, sequence, 1, True, verified)
        if check.verdict is Verdict.VERIFY:
            return None
        if not check.ok:
            return check.error
        if check.verdict is Verdict.APPEND:
            offset = len(self.records)
            self.records.append(Record(producer_id, epoch))
            self.states.on_append(producer_id, epoch, sequence, offset, offset, True)
        return ErrorCode.NONE

    def write_marker(
        self, marker: MarkerRequest, written: Callable[[Partition, int], None]
    ) -> ErrorCode:
        """Apply one marker; ``written`` checks it with the offset of the data it closes."""
        pid, epoch = marker.producer_id, marker.producer_epoch
        action = self.states.check_marker(
            pid, epoch, marker.coordinator_epoch, marker.transaction_version, marker.txn_number
        )
        if action is MarkerAction.FENCED:
            return ErrorCode.TRANSACTION_COORDINATOR_FENCED
        entry = self.states.producers.get(pid)
        first = None if entry is None else entry.txn_first_offset
        buggy = (
            self.bugs.close_on_equal_epoch
            and marker.transaction_version == 2
            and entry is not None
            and first is not None
            and entry.epoch == epoch
        )
        if action is MarkerAction.NOOP and not buggy:
            return ErrorCode.NONE
        written(self, -1 if first is None else first)
        offset = len(self.records)
        self.records.append(Record(pid, epoch, marker.commit))
        if buggy:  # the planted bug: end the open transaction despite its epoch
            assert entry is not None
            entry.txn_first_offset = None
            del self.states.open_txns[pid]
        self.states.on_marker(
            pid,
            epoch,
            marker.coordinator_epoch,
            marker.commit,
            offset,
            txn_number=marker.txn_number,
        )
        return ErrorCode.NONE


# --- clients -------------------------------------------------------------------------


@dataclass
class Client:
    """A transactional producer: one transaction at a time, retried until done."""

    tid: str
    producer_id: int = -1
    epoch: int = -1
    phase: str = "init"
    busy: bool = False
    next_at: int = 0
    partitions: tuple[TopicPartition, ...] = ()
    produced: int = 0
    with_offsets: bool = False
    commit: bool = True
    stalled: bool = False
    #: Whether its batches name the transaction's partitions (the client
    #: library's ``transaction_partitions``; a Kafka client's do not).
    names_partitions: bool = False

    #: The sequence of its next batch per partition (transactions v1 go on
    #: across transactions; a new epoch starts them at 0).
    sequences: dict[TopicPartition, int] = field(default_factory=dict)

    def adopt(self, producer_id: int, epoch: int) -> None:
        """Use (``producer_id``, ``epoch``) from now on: a new identity
        starts its sequences at 0."""
        if (producer_id, epoch) != (self.producer_id, self.epoch):
            self.sequences.clear()
        self.producer_id, self.epoch = producer_id, epoch

    @property
    def transaction_version(self) -> int:
        return 1 if self.tid == V1_ID else 2

    @property
    def two_phase(self) -> bool:
        """Whether it takes part in a two-phase commit: it initializes with
        ``enable_two_phase_commit`` and ``keep_prepared_txn``."""
        return self.tid == TWO_PHASE_ID


@dataclass
class Zombie:
    """An old incarnation of a producer that goes on with its old epoch."""

    tid: str
    producer_id: int
    epoch: int
    actions: int


@dataclass
class Stats:
    steps: int = 0
    commits: int = 0
    aborts: int = 0
    elections: int = 0
    crashes: int = 0
    truncated: int = 0
    timeouts: int = 0
    zombies: int = 0
    kept: int = 0
    marker_calls: int = 0
    duplicates: int = 0
    parked: int = 0
    released: int = 0
    folded: int = 0
    park_expired: int = 0
    park_deposed: int = 0
    covered: int = 0
    digest: str = ""

    COUNTERS = (
        "steps",
        "commits",
        "aborts",
        "elections",
        "crashes",
        "truncated",
        "timeouts",
        "zombies",
        "kept",
        "marker_calls",
        "duplicates",
        "parked",
        "released",
        "folded",
        "park_expired",
        "park_deposed",
        "covered",
    )

    def __str__(self) -> str:
        return ", ".join(f"{name}={getattr(self, name)}" for name in self.COUNTERS)


@dataclass(frozen=True)
class Decision:
    commit: bool
    partitions: frozenset[TopicPartition]
    groups: frozenset[str]
    #: The epoch of the transaction's records: the one it began at.
    data_epoch: int


# --- the simulation ------------------------------------------------------------------


class Simulation:
    """One seeded run. Invariants, checked after every step:

    * replicas that applied the same prefix of the log have equal snapshots;
    * per transactional id, (producer id, epoch) never goes backwards, and a
      producer id never serves two transactional ids nor is stamped twice;
    * one decision per transaction: a (producer id, marker epoch) is prepared
      as commit or as abort, never both, and a client told its commit (or
      abort) succeeded got exactly that decision;
    * participants write only decided markers: a marker carries the deciding
      epoch and decision, goes to a participant of that transaction, and
      closes only data written with the epoch before it;
    * no well-formed request is refused as malformed or as a server error.

    Liveness, after the faults stop: every transaction completes, every
    participant holds its marker and no request stays unanswered.
    """

    def __init__(self, seed: int, bugs: Bugs = Bugs()) -> None:
        self.rng = random.Random(seed)
        self.bugs = bugs
        self.now = 1_000_000
        self.step_no = 0
        self.faults = True
        self.log: list[Entry] = []
        self.commit = 0
        self.term = 0
        self.replicas = [Replica(i, self.clock) for i in range(REPLICAS)]
        self.leadership: Leadership | None = None
        self.partitions = {tp: Partition(*tp, bugs) for tp in PARTITIONS}
        self.clients = [Client(tid) for tid in TXN_IDS]
        self.zombies: list[Zombie] = []
        self.events: list[tuple[int, int, Callable[[], None]]] = []
        self.event_seq = 0
        # What the invariants remember.
        self.reference: dict[int, bytes] = {}
        self.effects_seen = 0
        self.identity: dict[str, tuple[int, int]] = {}
        #: Per transactional id, the epoch its open transaction began at.
        self.began_at: dict[str, int] = {}
        self.pid_owner: dict[int, str] = {}
        self.stamped: set[int] = set()
        #: (producer id, marker epoch, transaction number) -> the decision.
        self.decisions: dict[tuple[int, int, int], Decision] = {}
        self.stats = Stats()

    # --- running -------------------------------------------------------------------

    def run(self) -> Stats:
        for _ in range(FAULT_STEPS):
            self.step()
        self.faults = False
        self.zombies.clear()
        for replica in self.replicas:
            if not replica.up:
                replica.restart(self.bugs)
        for _ in range(QUIET_STEPS):
            if not self.unfinished():
                break
            self.step()
        else:
            raise Violation(f"not quiescent after {QUIET_STEPS} quiet steps: {self.unfinished()}")
        self.check_delivered()
        self.stats.steps = self.step_no
        self.stats.digest = hashlib.sha256(b"".join(e.data for e in self.log)).hexdigest()[:16]
        return self.stats

    def step(self) -> None:
        self.step_no += 1
        self.now += self.rng.randint(1, 40)
        if self.faults:
            self.inject_fault()
        self.elect()
        self.act_clients()
        self.lead()
        self.replicate()
        self.deliver_events()
        self.check_replicas()

    def clock(self) -> int:
        """The simulated time in milliseconds: the leader core's clock."""
        return self.now

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    # --- faults and elections ------------------------------------------------------

    def inject_fault(self) -> None:
        up = [r for r in self.replicas if r.up]
        down = [r for r in self.replicas if not r.up]
        if self.leadership is not None and self.chance(0.02):
            self.end_leadership()
        if up and self.chance(0.015):
            victim = self.rng.choice(up)
            victim.crash()
            self.stats.crashes += 1
            if self.leadership is not None and self.leadership.replica is victim:
                self.end_leadership()
        if down and self.chance(0.08):
            self.rng.choice(down).restart(self.bugs)
        if up and self.chance(0.05):
            replica = self.rng.choice(up)
            if replica.up:
                replica.snapshot = (replica.applied, replica.machine.snapshot())

    def end_leadership(self) -> None:
        leadership = self.leadership
        assert leadership is not None
        self.leadership = None
        leadership.active = False
        leadership.core.deposed()
        leadership.book.clear()
        failed = [r.reply for r in leadership.queue]
        parked = leadership.parked.drain()
        self.stats.park_deposed += len(parked)
        failed += [r.reply for r in parked]
        for proposal in leadership.in_flight.values():  # dropped, or applied unanswered
            if proposal.batched:
                leadership.core.entry_done(leadership.term)
            failed += proposal.replies
        leadership.queue, leadership.in_flight = [], {}
        # Raft keeps part of the uncommitted suffix (a new leader holds it) and loses the rest.
        keep = self.rng.randint(self.commit, len(self.log))
        self.stats.truncated += len(self.log) - keep
        del self.log[keep:]
        for reply in failed:
            reply(Outcome(error=ErrorCode.NOT_COORDINATOR))

    def elect(self) -> None:
        up = [r for r in self.replicas if r.up]
        if self.leadership is not None or len(up) < MAJORITY or not self.chance(0.3):
            return
        self.term += 1
        self.stats.elections += 1
        leadership = self.leadership = Leadership(self.rng.choice(up), self.term)
        self.request_block(leadership, first=True)

    # --- the leader ----------------------------------------------------------------

    def submit(
        self,
        build: Unstamped,
        reply: Callable[[Outcome], None],
        parkable: bool = True,
        park_ms: int | None = None,
    ) -> None:
        """A request reaching the shard: queued at a ready leader, else refused."""
        leadership = self.leadership
        if leadership is None:
            reply(Outcome(error=ErrorCode.NOT_COORDINATOR))
        elif not leadership.ready:
            reply(Outcome(error=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
        else:
            leadership.queue.append(Request(build, reply, parkable, park_ms))

    def propose(
        self,
        leadership: Leadership,
        commands: list[Command],
        replies: list[Callable[[Outcome], None]],
        batched: bool,
        requests: tuple[Request, ...] = (),
    ) -> None:
        self.log.append(Entry(leadership.term, encode_entry(commands)))
        leadership.in_flight[len(self.log)] = Proposal(
            replies, batched, requests, tuple(commands) if requests else ()
        )

    def request_block(self, leadership: Leadership, first: bool = False) -> None:
        """Propose the core's ``AllocatePidBlock`` as an entry of its own (as
        the node does); the first one of a leadership makes it ready."""
        core = leadership.core
        command, token = core.request_block()

        def granted(outcome: Outcome) -> None:
            if not leadership.active:
                return  # the cursor was reset; the next leadership asks again
            core.block_granted(token, outcome)
            if first:
                # Everything before the leader's first entry is applied: it is current.
                leadership.ready = True
                for markers in leadership.replica.machine.pending_markers():
                    leadership.book.add(markers, self.now)

        self.propose(leadership, [command], [granted], batched=False)

    def lead(self) -> None:
        """One round of a ready leader's duties, in the order of a node's tick
        (``raftcoord/coordinator/shard.py``): sweep, ask for a block when due,
        then propose the queue as one entry with the core's group commit."""
        leadership = self.leadership
        if leadership is None or not leadership.ready:
            return
        machine, core = leadership.replica.machine, leadership.core
        stamp = core.stamp()
        if stamp.now_ms >= leadership.next_sweep:
            leadership.next_sweep = stamp.now_ms + SWEEP_INTERVAL_MS
            for candidate in machine.timed_out(stamp.now_ms):
                leadership.queue.append(Request(timed_out_abort(candidate), self.timed_out))
        expired = leadership.parked.expired(stamp.now_ms)
        self.stats.park_expired += len(expired)
        for request in expired:
            request.reply(Outcome(error=ErrorCode.CONCURRENT_TRANSACTIONS))
        if core.block_due(stamp.now_ms):
            self.request_block(leadership)
        self.answer_covered_adds(leadership)
        if leadership.queue:
            batch = core.batch(
                leadership.queue,
                stamp,
                machine.needs_new_producer_id,
                machine.waits_for_completion,
                lambda tid: self.fold(leadership, tid),
            )
            if batch is not None:  # else an entry is in flight: the queue waits
                # Held completions, then what waits for a block, in order.
                leadership.queue = batch.lingering + batch.waiting
                for tid, held in batch.parked:
                    if not self.hold(leadership, held, tid):
                        held.reply(Outcome(error=ErrorCode.CONCURRENT_TRANSACTIONS))
                for request in batch.concurrent:
                    request.reply(Outcome(error=ErrorCode.CONCURRENT_TRANSACTIONS))
                for command in batch.commands:
                    self.check_stamped(command)
                if batch.requests:
                    self.propose(
                        leadership,
                        batch.commands,
                        [r.reply for r in batch.requests],
                        batched=True,
                        requests=tuple(batch.requests),
                    )
        self.write_markers(leadership)

    def answer_covered_adds(self, leadership: Leadership) -> None:
        """As a node's shard does: the queued adds that an add of the entry
        applied last covers, while nothing has applied since, get that add's
        outcome without an entry of their own."""
        last = leadership.last_adds
        if last is None or last[0] != leadership.replica.applied:
            return
        left = []
        for request in leadership.queue:
            outcome = covering_outcome(last[1], request.build(CHECK_ONLY))
            if outcome is None:
                left.append(request)
            else:
                self.stats.covered += 1
                request.reply(outcome)
        leadership.queue = left

    # --- replication ---------------------------------------------------------------

    def replicate(self) -> None:
        leadership = self.leadership
        up = sum(r.up for r in self.replicas)
        if leadership is not None and up >= MAJORITY:
            self.commit = min(len(self.log), self.commit + self.rng.randint(0, 3))
        for replica in self.replicas:
            if replica.up and replica.applied < self.commit and self.chance(0.6):
                target = self.rng.randint(replica.applied + 1, self.commit)
                while replica.applied < target:
                    self.apply_next(replica)

    def apply_next(self, replica: Replica) -> None:
        index = replica.applied + 1
        entry = self.log[index - 1]
        outcomes = replica.machine.apply_entry(entry.data)
        replica.applied = index
        if index > self.effects_seen:
            self.effects_seen = index
            self.record_effects(outcomes)
        leadership = self.leadership
        if leadership is None or leadership.replica is not replica:
            return
        if leadership.ready:
            for outcome in outcomes:
                for effect in outcome.effects:
                    if isinstance(effect, WriteMarkers):
                        leadership.book.add(effect, self.now)
        # The leadership's own entry (a truncation ends the leadership first).
        proposal = leadership.in_flight.pop(index, None)
        if proposal is not None:
            if proposal.batched:
                leadership.core.entry_done(leadership.term)
            if proposal.requests:
                leadership.last_adds = (
                    index,
                    [
                        (c, o)
                        for c, o in zip(proposal.commands, outcomes, strict=True)
                        if isinstance(c, AddPartitions)
                    ],
                )
                pairs = zip(proposal.requests, proposal.commands, outcomes, strict=True)
                for request, command, outcome in pairs:
                    if not self.park_applied(leadership, request, command, outcome):
                        request.reply(outcome)
            else:
                for reply, outcome in zip(proposal.replies, outcomes, strict=True):
                    reply(outcome)
        # A completion releases what was parked behind it, ahead of newer requests.
        released = [
            request
            for outcome in outcomes
            for t in outcome.effects
            if isinstance(t, Transition) and t.from_state in PREPARE_STATES
            for request in leadership.parked.release(t.transactional_id)
        ]
        self.stats.released += len(released)
        leadership.queue[:0] = released

    # --- parking -------------------------------------------------------------------

    def fold(self, leadership: Leadership, tid: str) -> list[Request]:
        """The requests parked behind ``tid``, released into the entry of its
        ``MarkersWritten`` (as a node's shard does)."""
        released = leadership.parked.release(tid)
        self.stats.folded += len(released)
        return released

    def park_applied(
        self, leadership: Leadership, request: Request, command: Command, outcome: Outcome
    ) -> bool:
        """Park ``request`` if its applied ``outcome`` only says its previous
        transaction is still completing (as a node's shard does); whether it was."""
        if not request.parkable:
            return False
        machine = leadership.replica.machine

        def state_of(tid: str) -> TxnState | None:
            meta = machine.describe(tid)
            return None if meta is None else meta.state

        key = park_key(command, outcome, state_of)
        return key is not None and self.hold(leadership, request, key)

    def hold(self, leadership: Leadership, request: Request, tid: str) -> bool:
        """Park ``request`` behind ``tid`` unless its time to stay parked is
        over; whether it was parked."""
        if request.park_deadline is None:
            timeout_ms = PARK_TIMEOUT_MS if request.park_ms is None else request.park_ms
            request.park_deadline = park_deadline(self.now, min(timeout_ms, PARK_TIMEOUT_MS), None)
        if self.now >= request.park_deadline:
            return False
        leadership.parked.park(tid, request, request.park_deadline)
        self.stats.parked += 1
        return True

    # --- markers -------------------------------------------------------------------

    def write_markers(self, leadership: Leadership) -> None:
        """One round of the marker writer's dispatcher (see :class:`MarkerWriter`)."""
        book = leadership.book
        for marker in book.due_markers(self.now):
            book.route(marker, _destination(marker.participant))
        for batch in book.take_batches(MAX_MARKER_REQUESTS):
            self.send_markers(leadership, batch)
        completions = book.take_completions(self.now, MAX_COMPLETIONS)
        if completions is not None:
            self.complete(leadership, completions)

    def send_markers(self, leadership: Leadership, batch: MarkerBatch) -> None:
        self.stats.marker_calls += 1
        if self.faults and self.chance(0.05):  # the request is lost
            self.schedule(CALL_TIMEOUT_MS, lambda: self.answered(leadership, batch, None))
            return
        self.schedule(self.delay(), lambda: self.deliver_markers(leadership, batch, True))
        if self.faults and self.chance(0.1):  # the network delivers it twice
            late = self.rng.randint(0, 3 * TXN_TIMEOUT_MS)
            self.stats.duplicates += 1
            self.schedule(late, lambda: self.deliver_markers(leadership, batch, False))

    def deliver_markers(self, leadership: Leadership, batch: MarkerBatch, answer: bool) -> None:
        answers: list[dict[Participant, int]] = [{} for _ in batch.requests]
        waiting = [0]

        def done() -> None:
            if not answer:
                return  # a duplicate's answer goes nowhere
            responses = [MarkerResponse(a) for a in answers]
            if self.faults and self.chance(0.05):  # the answer is lost
                self.schedule(CALL_TIMEOUT_MS, lambda: self.answered(leadership, batch, None))
            else:
                self.schedule(self.delay(), lambda: self.answered(leadership, batch, responses))

        def group_answer(
            errors: dict[Participant, int], group: ConsumerGroup
        ) -> Callable[[Outcome], None]:
            def reply(outcome: Outcome) -> None:
                errors[group] = int(outcome.error)
                waiting[0] -= 1
                if waiting[0] == 0:
                    done()

            return reply

        for request, errors in zip(batch.requests, answers, strict=True):
            for partition in request.partitions:
                target = self.partitions[TopicPartition(partition.topic, partition.partition)]
                errors[partition] = int(target.write_marker(request, self.marker_written(request)))
            waiting[0] += len(request.groups)
        waiting[0] += 1  # held until every group marker is submitted
        for request, errors in zip(batch.requests, answers, strict=True):
            for group in request.groups:
                self.check_group_marker(request, group.group_id)
                self.submit(
                    group_marker(
                        group.group_id,
                        request.producer_id,
                        request.producer_epoch,
                        request.commit,
                        request.coordinator_epoch,
                        request.transaction_version,
                        request.txn_number,
                    ),
                    group_answer(errors, group),
                )
        waiting[0] -= 1
        if waiting[0] == 0:
            done()

    def answered(
        self, leadership: Leadership, batch: MarkerBatch, responses: list[MarkerResponse] | None
    ) -> None:
        if leadership.active:
            failure = "" if responses is not None else "lost"
            leadership.book.on_response(batch, responses, self.now, failure)

    def complete(self, leadership: Leadership, batch: CompletionBatch) -> None:
        codes: list[int] = [0] * len(batch.txns)
        waiting = [len(batch.txns)]

        def reply_for(i: int) -> Callable[[Outcome], None]:
            def reply(outcome: Outcome) -> None:
                codes[i] = int(outcome.error)
                waiting[0] -= 1
                # Only an ended leadership answers NOT_COORDINATOR, and its book is gone.
                if waiting[0] == 0 and leadership.active:
                    leadership.book.on_completed(batch, codes, self.now)

            return reply

        for i, completion in enumerate(batch.completions):
            leadership.queue.append(Request(markers_written(completion), reply_for(i)))

    def timed_out(self, outcome: Outcome) -> None:
        """The answer to a sweeper's abort (a failed one is found again next sweep)."""
        self.stats.timeouts += outcome.ok

    def delay(self) -> int:
        return self.rng.randint(0, 200)

    def schedule(self, after_ms: int, event: Callable[[], None]) -> None:
        self.event_seq += 1
        heapq.heappush(self.events, (self.now + after_ms, self.event_seq, event))

    def deliver_events(self) -> None:
        due = []
        while self.events and self.events[0][0] <= self.now:
            due.append(heapq.heappop(self.events)[2])
        self.rng.shuffle(due)  # what is due arrives in any order
        for event in due:
            event()

    # --- clients -------------------------------------------------------------------

    def act_clients(self) -> None:
        for client in self.clients:
            if not client.busy and client.phase != "done" and self.now >= client.next_at:
                if self.faults and client.producer_id >= 0 and self.chance(0.005):
                    self.restart_client(client)
                self.client_step(client)
        for zombie in list(self.zombies):
            if self.chance(0.05):
                self.zombie_step(zombie)

    def client_step(self, client: Client) -> None:
        phase = client.phase
        if phase == "init":
            self.call(client, _init_producer_id(client.tid, TXN_TIMEOUT_MS, client.two_phase))
        elif phase == "begin":
            if not self.faults:
                client.phase = "done"
                return
            count = self.rng.randint(1, len(PARTITIONS))
            client.partitions = tuple(self.rng.sample(PARTITIONS, count))
            client.names_partitions = self.chance(0.5)
            client.produced = 0
            client.with_offsets = self.chance(0.4)
            client.commit = self.chance(0.7)
            client.stalled = False
            if client.transaction_version == 1:
                # As Kafka's clients of transactions v1: the partitions are
                # added (AddPartitionsToTxn, which waits for the previous
                # transaction to complete) before a record goes to them.
                client.phase = "add_partitions"
                self.client_step(client)
                return
            # The partitions add themselves to the transaction (KIP-890 part 2).
            client.phase = "produce"
            self.produce(client)
        elif phase == "add_partitions":
            self.call(
                client,
                _add_partitions(client.tid, client.producer_id, client.epoch, client.partitions),
            )
        elif phase == "produce":
            self.produce(client)
        elif phase == "add_offsets":
            self.call(client, _add_offsets(client.tid, client.producer_id, client.epoch, GROUP))
        elif phase == "commit_offsets":
            self.commit_offsets(client)
        elif phase == "end":
            if self.faults and client.two_phase and self.chance(0.1):
                self.restart_client(client)  # it crashed once prepared
                return
            if self.faults and not client.stalled and self.chance(0.05):
                client.stalled = True  # outlive the timeout: the sweeper aborts it
                client.next_at = self.now + TXN_TIMEOUT_MS + SWEEP_INTERVAL_MS
                return
            self.call(
                client,
                _end_txn(
                    client.tid,
                    client.producer_id,
                    client.epoch,
                    client.commit,
                    client.transaction_version,
                ),
            )

    def call(self, client: Client, build: Unstamped) -> None:
        """Send the request of ``build``; its reply is judged by the command's
        client-given fields (the stamped ones are the leader's business)."""
        client.busy = True
        command = build(CHECK_ONLY)
        self.submit(build, lambda outcome: self.client_reply(client, command, outcome))

    def client_reply(self, client: Client, command: Command, outcome: Outcome) -> None:
        client.busy = False
        self.check_answer(command, outcome)
        if outcome.error in RETRIABLE:
            client.next_at = self.now + self.rng.randint(10, 100)
            return
        if not outcome.ok:
            self.restart_client(client)
            return
        if isinstance(command, InitProducerId):
            client.adopt(outcome.producer_id, outcome.producer_epoch)
            client.phase = "begin"
            if outcome.ongoing_producer_id >= 0:  # kept: end it, as the manager decides
                self.stats.kept += 1
                client.phase = "end"
                client.commit = self.chance(0.5)
                client.stalled = False
        elif isinstance(command, AddPartitions):
            client.phase = "produce"
        elif isinstance(command, AddOffsets):
            client.phase = "commit_offsets"
        elif isinstance(command, TxnOffsetCommit):
            client.phase = "end"
        elif isinstance(command, EndTxn):
            self.check_acknowledged(command)
            if command.commit:
                self.stats.commits += 1
            else:
                self.stats.aborts += 1
            client.adopt(outcome.producer_id, outcome.producer_epoch)
            client.phase = "begin"

    def produce(self, client: Client) -> None:
        while client.produced < len(client.partitions):
            tp = client.partitions[client.produced]
            pid, epoch = client.producer_id, client.epoch
            error = self.partitions[tp].append(pid, epoch, client.sequences.get(tp, 0))
            if error is None:
                client.busy = True
                self.partition_adds(
                    tp,
                    client.tid,
                    pid,
                    epoch,
                    lambda error: self.produced(client, error),
                    client.partitions if client.names_partitions else (),
                    client.sequences.get(tp, 0),
                )
                return
            self.produced(client, error)
            if client.phase != "produce" or client.next_at > self.now:
                return  # refused: retried later, or the client started over
        client.phase = "add_offsets" if client.with_offsets else "end"

    def produced(self, client: Client, error: ErrorCode) -> None:
        """The answer to the client's batch to its next partition."""
        client.busy = False
        self.check_answer(None, Outcome(error=error))
        if error in RETRIABLE:
            client.next_at = self.now + self.rng.randint(10, 100)
        elif error is not ErrorCode.NONE:
            self.restart_client(client)
        else:
            tp = client.partitions[client.produced]
            client.sequences[tp] = client.sequences.get(tp, 0) + 1
            client.produced += 1

    def partition_adds(
        self,
        tp: TopicPartition,
        tid: str,
        producer_id: int,
        epoch: int,
        answer: Callable[[ErrorCode], None],
        named: tuple[TopicPartition, ...] = (),
        sequence: int = 0,
    ) -> None:
        """KIP-890 part 2: the partition asks the shard's leader to add ``tp``,
        and the partitions the batch ``named`` (its transaction's), to the
        producer's transaction (the coordinator's service for a node's
        batched request: refusals its applied state settles are answered
        before proposing, the rest goes through the log; over a cluster link
        an add whose previous transaction is still completing is parked,
        within ``ADD_WAIT_MS``; in a gRPC call that did not ask to wait it is
        answered CONCURRENT_TRANSACTIONS before proposing); once added,
        the batch comes again verified, one network hop later (a marker may
        overtake it). The partition's answer goes to ``answer``."""
        partition = self.partitions[tp]
        build = _add_partitions(tid, producer_id, epoch, tuple(sorted({tp, *named})))

        def added(outcome: Outcome) -> None:
            self.check_answer(build(CHECK_ONLY), outcome)
            if not outcome.ok:
                answer(outcome.error)
                return

            def append() -> None:
                error = partition.append(producer_id, epoch, sequence, verified=True)
                answer(ErrorCode.NOT_COORDINATOR if error is None else error)

            self.schedule(self.delay(), append)

        over_link = self.rng.random() < 0.5
        leadership = self.leadership
        if leadership is not None and leadership.ready:
            command = build(CHECK_ONLY)
            assert isinstance(command, AddPartitions)
            refusals = SETTLED_REFUSALS if over_link else BATCHED_SETTLED_REFUSALS
            refused = settled_refusal(leadership.replica.machine, command, refusals)
            if refused is not None:
                added(refused)
                return
        if over_link:
            self.submit(build, added, True, ADD_WAIT_MS)
        else:
            self.submit(build, added, parkable=False)

    def commit_offsets(self, client: Client) -> None:
        if self.leadership is None or not self.leadership.ready:
            client.next_at = self.now + self.rng.randint(10, 100)
            return
        meta = self.leadership.replica.machine.describe(client.tid)
        error = verify_group(meta, client.producer_id, client.epoch, GROUP)[0]
        if error is not ErrorCode.NONE:
            self.restart_client(client)
            return
        offsets = (OffsetEntry("t", 0, self.step_no, ""),)
        self.call(
            client, _txn_offset_commit(GROUP, client.tid, client.producer_id, client.epoch, offsets)
        )

    def restart_client(self, client: Client) -> None:
        """The producer starts over with InitProducerId; its old self may go on."""
        if self.faults and client.producer_id >= 0 and self.chance(0.5):
            self.stats.zombies += 1
            self.zombies.append(
                Zombie(client.tid, client.producer_id, client.epoch, self.rng.randint(1, 3))
            )
        client.phase = "init"
        client.adopt(-1, -1)

    def zombie_step(self, zombie: Zombie) -> None:
        zombie.actions -= 1
        if zombie.actions <= 0:
            self.zombies.remove(zombie)
        tid, pid, epoch = zombie.tid, zombie.producer_id, zombie.epoch
        tp = self.rng.choice(PARTITIONS)
        action = self.rng.randrange(3)
        if action == 0:
            build = _add_partitions(tid, pid, epoch, (tp,))
        elif action == 1:
            error = self.partitions[tp].append(pid, epoch, self.rng.randint(0, 2))
            if error is None:
                self.partition_adds(
                    tp, tid, pid, epoch, lambda error: self.check_answer(None, Outcome(error=error))
                )
            else:
                self.check_answer(None, Outcome(error=error))
            return
        else:
            build = _end_txn(tid, pid, epoch, self.chance(0.5))
        command = build(CHECK_ONLY)
        self.submit(build, lambda outcome: self.check_answer(command, outcome))

    # --- invariants ----------------------------------------------------------------

    def check_replicas(self) -> None:
        """Replicas at the same applied index have the same state."""
        for replica in self.replicas:
            if not replica.up or replica.checked == replica.applied:
                continue
            replica.checked = replica.applied
            snapshot = replica.machine.snapshot()
            seen = self.reference.setdefault(replica.applied, snapshot)
            if seen != snapshot:
                raise Violation(
                    f"replica {replica.number} diverged at index {replica.applied}: "
                    f"its snapshot differs from another replica's at the same index"
                )

    def record_effects(self, outcomes: list[Outcome]) -> None:
        """Check and remember what an entry did, the first time any replica applies it."""
        for outcome in outcomes:
            for effect in outcome.effects:
                if isinstance(effect, Transition):
                    self.check_transition(effect)

    def check_transition(self, t: Transition) -> None:
        identity = (t.producer_id, t.producer_epoch)
        previous = self.identity.get(t.transactional_id, (-1, -1))
        if identity < previous:
            raise Violation(
                f"{t.transactional_id}: (producer id, epoch) went back "
                f"from {previous} to {identity}"
            )
        self.identity[t.transactional_id] = identity
        owner = self.pid_owner.setdefault(t.producer_id, t.transactional_id)
        if owner != t.transactional_id:
            raise Violation(f"producer id {t.producer_id} serves {owner} and {t.transactional_id}")
        if t.to_state is TxnState.ONGOING and t.from_state is not TxnState.ONGOING:
            self.began_at[t.transactional_id] = t.producer_epoch
        if t.to_state in PREPARE_STATES:
            decision = Decision(
                t.to_state is TxnState.PREPARE_COMMIT,
                frozenset(t.partitions),
                frozenset(t.groups),
                self.began_at.get(t.transactional_id, -1),
            )
            key = (*identity, t.txn_number)
            earlier = self.decisions.setdefault(key, decision)
            if earlier.commit != decision.commit:
                raise Violation(f"transaction {key} decided both commit and abort")

    def check_stamped(self, command: Command) -> None:
        pid = getattr(command, "new_producer_id", -1)
        if pid < 0:
            return
        if pid in self.stamped:
            raise Violation(f"producer id {pid} was handed out twice")
        self.stamped.add(pid)

    def check_answer(self, command: Command | None, outcome: Outcome) -> None:
        if outcome.error in NEVER:
            raise Violation(f"{command} answered {outcome.error.name}: {outcome.message}")

    def check_acknowledged(self, command: EndTxn) -> None:
        """A successful EndTxn got the decision it asked for: the latest
        transaction's of the identity its markers carry (the epoch after the
        bump under v2, the same under v1). Under v1 an abort with nothing
        open succeeds without one."""
        bump = 1 if command.transaction_version == 2 else 0
        identity = (command.producer_id, command.producer_epoch + bump)
        numbers = [n for (pid, epoch, n) in self.decisions if (pid, epoch) == identity]
        decision = self.decisions.get((*identity, max(numbers))) if numbers else None
        if decision is None and command.transaction_version == 1 and not command.commit:
            return
        if decision is None or decision.commit != command.commit:
            raise Violation(
                f"EndTxn(commit={command.commit}) of {identity} succeeded but the decision "
                f"is {decision}"
            )

    def decision_for(self, marker: MarkerRequest) -> Decision:
        key = (marker.producer_id, marker.producer_epoch, marker.txn_number)
        decision = self.decisions.get(key)
        if decision is None or decision.commit != marker.commit:
            raise Violation(
                f"marker commit={marker.commit} for {key} but the coordinator decided {decision}"
            )
        return decision

    def marker_written(self, marker: MarkerRequest) -> Callable[[Partition, int], None]:
        def check(partition: Partition, first_offset: int) -> None:
            if partition.tp not in self.decision_for(marker).partitions:
                raise Violation(f"marker for {marker.producer_id} sent to {tuple(partition.tp)}")
            if first_offset < 0:
                return
            data_epoch = self.decision_for(marker).data_epoch
            for record in partition.records[first_offset:]:
                if (
                    record.producer_id == marker.producer_id
                    and record.commit is None
                    and record.epoch != data_epoch
                ):
                    raise Violation(
                        f"marker epoch {marker.producer_epoch} of producer {marker.producer_id} "
                        f"closes data of epoch {record.epoch} on {tuple(partition.tp)}"
                    )

        return check

    def check_group_marker(self, marker: MarkerRequest, group: str) -> None:
        if group not in self.decision_for(marker).groups:
            raise Violation(f"marker for {marker.producer_id} sent to group {group}")

    # --- liveness ------------------------------------------------------------------

    def unfinished(self) -> list[str]:
        """What still keeps the run from being done (empty once it is)."""
        waiting = []
        leadership = self.leadership
        if leadership is None or not leadership.ready:
            return ["no ready leader"]
        if self.commit < len(self.log) or any(r.applied < self.commit for r in self.replicas):
            waiting.append("log not applied everywhere")
        waiting += [f"client {c.tid} in {c.phase}" for c in self.clients if c.phase != "done"]
        machine = leadership.replica.machine
        waiting += [
            f"{tid} is {meta.state.name}"
            for tid, meta in machine.state.transactions.items()
            if meta.state not in IDLE_STATES
        ]
        waiting += [
            f"{tuple(tp)} has open transactions"
            for tp, p in self.partitions.items()
            if p.states.open_txns
        ]
        group = machine.state.groups.get(GROUP)
        if group is not None and group.pending:
            waiting.append(f"group {GROUP} has pending offsets")
        if (
            leadership.book.has_work()
            or leadership.queue
            or leadership.in_flight
            or leadership.parked.count
        ):
            waiting.append("the leader has work")
        if self.events:
            waiting.append("messages in flight")
        return waiting

    def check_delivered(self) -> None:
        """Every decided participant holds its marker."""
        group = self.replicas[0].machine.state.groups.get(GROUP)
        for (pid, epoch, _), decision in self.decisions.items():
            for tp in sorted(decision.partitions):
                if Record(pid, epoch, decision.commit) not in self.partitions[tp].records:
                    raise Violation(f"{tuple(tp)} never got the marker of {(pid, epoch)}")
            if decision.groups and (group is None or group.producer_epochs.get(pid, -1) < epoch):
                raise Violation(f"group {GROUP} never got the marker of {(pid, epoch)}")


# --- requests, built as the coordinator's service builds them -------------------------


def _init_producer_id(tid: str, timeout_ms: int, two_phase: bool) -> Unstamped:
    return lambda stamp: InitProducerId(
        tid,
        timeout_ms,
        stamp.now_ms,
        stamp.coordinator_epoch,
        stamp.new_producer_id,
        enable_two_phase_commit=two_phase,
        keep_prepared_txn=two_phase,
    )


def _add_partitions(
    tid: str, producer_id: int, epoch: int, partitions: tuple[TopicPartition, ...]
) -> Unstamped:
    return lambda stamp: AddPartitions(
        tid, producer_id, epoch, partitions, stamp.now_ms, stamp.coordinator_epoch
    )


def _add_offsets(tid: str, producer_id: int, epoch: int, group: str) -> Unstamped:
    return lambda stamp: AddOffsets(
        tid, producer_id, epoch, group, stamp.now_ms, stamp.coordinator_epoch
    )


def _txn_offset_commit(
    group: str, tid: str, producer_id: int, epoch: int, offsets: tuple[OffsetEntry, ...]
) -> Unstamped:
    return lambda stamp: TxnOffsetCommit(group, tid, producer_id, epoch, offsets, stamp.now_ms)


def _end_txn(
    tid: str, producer_id: int, epoch: int, commit: bool, transaction_version: int = 2
) -> Unstamped:
    return lambda stamp: EndTxn(
        tid,
        producer_id,
        epoch,
        commit,
        stamp.now_ms,
        stamp.coordinator_epoch,
        stamp.new_producer_id,
        transaction_version,
    )


def _destination(participant: Participant) -> Destination:
    if isinstance(participant, DataPartition):
        node = PARTITIONS.index(TopicPartition(participant.topic, participant.partition))
        return Destination(DestinationKind.PARTITION_LOG, node, f"partition-{node}")
    return Destination(DestinationKind.COORDINATOR, 0, "coordinator")


# --- running seeds -------------------------------------------------------------------


@dataclass
class Result:
    seed: int
    stats: Stats | None = None
    failure: str = ""
    step: int = 0

    @property
    def ok(self) -> bool:
        return not self.failure


def run_seed(seed: int, bugs: Bugs = Bugs()) -> Result:
    sim = Simulation(seed, bugs)
    try:
        return Result(seed, sim.run())
    except Violation as exc:
        return Result(seed, failure=str(exc), step=sim.step_no)


def replay_command(seed: int, bug: str | None) -> str:
    flag = f" --bug {bug}" if bug else ""
    return f"python -m tests.simulation --seed {seed}{flag}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation", description=__doc__)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--seeds", type=int, default=100, help="run seeds 0..N-1 (default 100)")
    which.add_argument("--seed", type=int, help="run (replay) this one seed")
    parser.add_argument("--first", type=int, default=0, help="first seed of --seeds")
    parser.add_argument("--bug", choices=sorted(BUGS), help="plant a bug (shows it is caught)")
    args = parser.parse_args(argv)
    bugs = BUGS[args.bug] if args.bug else Bugs()
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    total = Stats()
    for seed in seeds:
        result = run_seed(seed, bugs)
        if not result.ok:
            print(f"seed {seed} FAILED at step {result.step}: {result.failure}")
            print(f"replay: {replay_command(seed, args.bug)}")
            return 1
        assert result.stats is not None
        if args.seed is not None:
            print(f"seed {seed} ok: {result.stats}, digest={result.stats.digest}")
            return 0
        for name in Stats.COUNTERS:
            setattr(total, name, getattr(total, name) + getattr(result.stats, name))
    print(f"{len(seeds)} seeds ok: {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
