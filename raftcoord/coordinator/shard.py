"""A shard's leader-side work around its replica: leadership changes, the
request queue, proposals and the periodic sweepers; and :class:`Shards`,
what the node's services see of its shards.

Everything here runs on the node's tick thread except :meth:`Shard.submit`,
:meth:`Shard.read` and the other methods :class:`Shards` needs, which gRPC
threads call. Requests queue up between ticks; each tick the leader stamps
them (time, term, fresh producer ids) in arrival order and proposes them
together as one Raft entry (group commit), so Raft entries per second do
not cap requests per second. What to stamp and what goes into an entry is
decided by :class:`raftcoord.coordinator.leader.LeaderCore`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, InvalidStateError
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

from fsm import (
    METADATA_COMMANDS,
    AddPartitions,
    Command,
    EndTxn,
    ErrorCode,
    ExpireTransactionalIds,
    GroupTimeouts,
    InitProducerId,
    Outcome,
    ProducerFenced,
    ShardState,
    TransactionStateMachine,
    Transition,
    TxnState,
    WriteMarkers,
    encode_entry,
    encode_snapshot,
)
from fsm.states import PREPARE_STATES
from raftcoord.coordinator.leader import (
    CHECK_ONLY,
    PARK_MARGIN_MS,
    ImbalanceChecks,
    LeaderClock,
    LeaderCore,
    Parking,
    Stamp,
    Unstamped,
    covering_outcome,
    park_deadline,
    park_key,
    timed_out_abort,
)
from raftcoord.coordinator.replica import AppliedListener, ShardReplica, SnapshotListener
from raftcoord.protocol.config import NodeAddress

log = logging.getLogger("raftcoord.coordinator.shard")

T = TypeVar("T")
#: How often the leader looks for consumer groups with a session, pending
#: member id or rebalance past its time (see fsm.membership.due).
GROUP_SWEEP_INTERVAL_MS = 100
Reader = Callable[[TransactionStateMachine], T]
MarkerSink = Callable[[int, WriteMarkers], None]


#: The deadline (:func:`time.monotonic`, seconds) of the call (gRPC or
#: cluster link) the current thread serves, None outside a call or without a
#: deadline; set through :func:`caller_waits`.
CALLER_DEADLINE: ContextVar[float | None] = ContextVar("caller_deadline", default=None)


@contextmanager
def caller_waits(timeout_s: float | None) -> Iterator[None]:
    """Within it, the current thread serves a call whose caller waits
    ``timeout_s`` from now (None: no deadline): requests it submits are
    never parked beyond that."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    token = CALLER_DEADLINE.set(deadline)
    try:
        yield
    finally:
        CALLER_DEADLINE.reset(token)


@contextmanager
def parked_at_most(seconds: float) -> Iterator[None]:
    """Within it, the requests this thread submits are parked at most
    ``seconds`` (their caller's deadline as the shards see it is brought
    forward to ``seconds`` plus :data:`PARK_MARGIN_MS` from now, unless it
    is earlier): the caller wants an answer by then if one is parked."""
    bound = time.monotonic() + seconds + PARK_MARGIN_MS / 1000
    deadline = CALLER_DEADLINE.get()
    token = CALLER_DEADLINE.set(bound if deadline is None else min(deadline, bound))
    try:
        yield
    finally:
        CALLER_DEADLINE.reset(token)


@dataclass(frozen=True)
class ShardStatus:
    """One replica of a shard as an operator sees it."""

    ready_leader: bool
    term: int
    commit_index: int
    applied_index: int
    state_digest: str  # sha256 of the state machine's snapshot
    transactional_ids: int
    parked_requests: int


class Shards(Protocol):
    """A node's shards as its services and marker writers use them."""

    def availability(self, shard: int) -> ErrorCode:
        """NONE when this node leads ``shard`` and has applied its log, else why not."""

    def leader_of(self, shard: int) -> NodeAddress | None:
        """The coordinator this node believes leads ``shard``, or None."""

    def submit(
        self,
        shard: int,
        build: Unstamped,
        parkable: bool = True,
        parked: Callable[[], None] | None = None,
        park_ms: int | None = None,
    ) -> Future[Outcome]:
        """Replicate the command of ``build`` on ``shard`` (a ready leader's),
        stamped when it is proposed; the future holds its :class:`Outcome`,
        or the refusal. Not ``parkable``: never parked behind a completing
        transaction (answered CONCURRENT_TRANSACTIONS instead). ``parked``
        is called (on the shard's thread) each time the request is parked;
        ``park_ms``: it stays parked at most that long from its first
        parking (None: the park timeout)."""

    def query(self, shard: int, reader: Reader[T]) -> T:
        """``reader``'s answer from this node's replica of ``shard`` as it is
        now (it may lag the leader), whoever leads."""

    def read(self, shard: int, reader: Reader[T]) -> Future[T | Outcome]:
        """``reader``'s answer from ``shard`` on its ready leader (this node)
        once a log barrier is applied (a linearizable read); the future
        holds the answer, or the refusal."""

    def change_count(self, shard: int) -> int:
        """How many entries ``shard``'s replica applied and leaderships it
        lost so far (see :meth:`await_change`)."""

    def await_change(self, shard: int, seen: int, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` until :meth:`change_count` of ``shard``
        is no longer ``seen``; the count then."""

    def take_producer_id(self) -> int | None:
        """An id for an idempotent producer from any shard this node leads
        (ready), or None."""

    def status(self, shard: int) -> ShardStatus:
        """This node's replica of ``shard``, for operators."""

    def term(self, shard: int) -> int:
        """The current Raft term of this node's replica of ``shard``: no
        leader of the shard stamped a higher coordinator epoch yet that this
        replica heard of (a replica that is behind may know a lower one)."""

    def now_ms(self, shard: int) -> int:
        """The time of ``shard``'s leader clock on this node (its current or
        last leadership's :class:`raftcoord.coordinator.leader.LeaderClock`)."""

    def elect_preferred_leaders(self) -> list[int]:
        """Kafka's preferred leader election on this node: the shards it leads
        whose preferred leader is another node, each asked to hand over now."""


@dataclass
class Request:
    """A command to stamp and replicate, or (``reader`` set) a read behind a log barrier."""

    build: Unstamped | None
    future: Future[Any] = field(default_factory=Future)
    reader: Reader[Any] | None = None
    #: The caller's deadline (:func:`time.monotonic`), None when it has none.
    caller_deadline: float | None = None
    #: Set when the request is first parked: until when it may stay parked.
    park_deadline_ms: int | None = None
    #: Whether it may be parked (:attr:`raftcoord.coordinator.leader.Queued.parkable`).
    parkable: bool = True
    #: Called (on the tick thread) each time it is parked: its caller may
    #: learn that its answer waits for a completion.
    parked: Callable[[], None] | None = None
    #: How long it may stay parked from its first parking, if shorter than
    #: the park timeout (None: the park timeout).
    park_ms: int | None = None


#: A follower that hears from its leader waits for Raft messages this share
#: of the lowest election timeout at most between ticks: the leader's
#: heartbeats wake it more often, and without them it notices the missing
#: leader this much late at most.
FOLLOWER_WAIT_SHARE = 0.25


@dataclass
class ShardTimers:
    """Leader duties' periods, in milliseconds."""

    abort_timed_out_interval_ms: int
    expire_interval_ms: int
    #: How long a request may stay parked (from its first parking).
    park_timeout_ms: int
    #: The longest a follower that knows its leader waits between ticks
    #: (0: as long as a leader, ``raft.tick.ms``). Leaders, candidates and
    #: followers without a leader tick every ``raft.tick.ms``: their timers
    #: (heartbeats, sweeps, parked requests, elections) are theirs to keep.
    follower_wait_ms: float = 0.0


_COMPACT = json.JSONEncoder(separators=(",", ":"))


class TransitionsLog:
    """The applied-transitions log of one replica (one JSON object per line).

    Keys: ``index`` and ``term`` of the Raft entry, ``shard``,
    ``transactional_id``, ``producer_id``, ``producer_epoch``, ``from`` (state
    name, null when the id was created), ``to``, ``partitions`` (list of
    [topic, partition]), ``groups``, ``time_ms`` (the leader-stamped time),
    ``txn_number`` (the number of the id's latest transaction).
    pysyncobj re-applies its journal after a restart; entries at or below the
    last index already in the file are not written again. A last line cut
    short by a crash is removed when the file is opened, so that the next
    entry starts on a line of its own. A replica whose state is replaced by
    a snapshot beyond its last line (a follower too far behind gets the
    leader's) applies the entries it covers without writing them: it writes
    ``{"index", "term", "shard", "snapshot": true}`` instead, saying that the
    entries after its previous line up to ``index`` came by snapshot.
    """

    def __init__(self, path: Path, shard: int) -> None:
        self.path = path
        self.shard = shard
        self._cut_torn_tail(path)
        self.last_index = self._last_index(path)
        self._file: IO[str] = path.open("a", encoding="utf-8")

    def _cut_torn_tail(self, path: Path) -> None:
        """Truncate ``path`` after its last newline when its last line has none."""
        if not path.exists():
            return
        with path.open("r+b") as f:
            size = f.seek(0, 2)
            if size == 0:
                return
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return
            keep = size
            while keep > 0:
                start = max(0, keep - 65536)
                f.seek(start)
                newline = f.read(keep - start).rfind(b"\n")
                if newline >= 0:
                    keep = start + newline + 1
                    break
                keep = start
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
        log.warning(
            "shard=%d event=transitions_tail_cut path=%s bytes=%d: a last line cut short "
            "by a crash was removed",
            self.shard,
            path,
            size - keep,
        )

    @staticmethod
    def _last_index(path: Path) -> int:
        last = 0
        if path.exists():
            with path.open(encoding="utf-8") as f:
                for line in f:
                    try:
                        last = max(last, int(json.loads(line)["index"]))
                    except (ValueError, KeyError):
                        continue  # a torn last line after kill -9
        return last

    def snapshot(self, index: int, term: int) -> None:
        """The replica's state was replaced by a snapshot up to entry ``index``
        (of ``term``): say so unless the file reaches that far already."""
        if index <= self.last_index:
            return
        self._file.write(
            _COMPACT.encode({"index": index, "term": term, "shard": self.shard, "snapshot": True})
            + "\n"
        )
        self._file.flush()
        self.last_index = index

    def write(self, index: int, term: int, transitions: list[Transition]) -> None:
        if index <= self.last_index or not transitions:
            return
        lines = [
            _COMPACT.encode(
                {
                    "index": index,
                    "term": term,
                    "shard": self.shard,
                    "transactional_id": t.transactional_id,
                    "producer_id": t.producer_id,
                    "producer_epoch": t.producer_epoch,
                    "from": None if t.from_state is None else t.from_state.name,
                    "to": t.to_state.name,
                    "partitions": [list(p) for p in t.partitions],
                    "groups": list(t.groups),
                    "time_ms": t.now_ms,
                    "txn_number": t.txn_number,
                }
            )
            for t in transitions
        ]
        self._file.write("\n".join(lines) + "\n")  # one write and one flush per entry
        self._file.flush()
        self.last_index = index

    def close(self) -> None:
        self._file.close()


class Shard:
    """One shard on one node: its replica plus the leader's duties, decided
    by a :class:`raftcoord.coordinator.leader.LeaderCore`."""

    def __init__(
        self,
        shard: int,
        node_id: int,
        replica_factory: Callable[[AppliedListener, SnapshotListener], ShardReplica],
        transitions: TransitionsLog,
        timers: ShardTimers,
        marker_sink: MarkerSink,
        preferred_leader: str | None = None,
        checks: ImbalanceChecks | None = None,
        imbalanced: Callable[[], bool] = lambda: True,
    ) -> None:
        self.shard = shard
        self.node_id = node_id
        #: The Raft address of the shard's preferred leader when it is another
        #: node: leaderships here transfer to it. None: this node is the
        #: preferred one, or leaders are not rebalanced.
        self.preferred_leader = preferred_leader
        #: Whether the preferred node's imbalance is above the threshold now.
        self.imbalanced = imbalanced
        self.transitions = transitions
        self.timers = timers
        self.marker_sink = marker_sink
        self.is_leader = False
        self.ready = False
        #: Set once the node stops (:meth:`stop`): nothing is queued after it.
        self._stopped = False
        #: Requests queued together go out in the same entry.
        self._queue: queue.SimpleQueue[list[Request]] = queue.SimpleQueue()
        self._waiting: list[Request] = []
        #: When the first completion held back in :attr:`_waiting` is due.
        self._linger_until_ms: int | None = None
        #: The adds of the entry this leader applied last, with their
        #: outcomes, and :meth:`change_count` right after it (tick thread):
        #: see :meth:`_answer_covered_adds`.
        self._last_adds: tuple[int, list[tuple[AddPartitions, Outcome]]] | None = None
        #: Requests waiting for their transactional id's transaction to complete.
        self._parked: Parking[Request] = Parking()
        self._next_abort_sweep = 0
        self._next_expire_sweep = 0
        self._next_group_sweep = 0
        #: When the current leadership began (group sessions count from it).
        self._leader_since_ms = 0
        #: What this replica counted since the process started (its metrics):
        #: leaders it saw elected (a new term with a known leader), and, while
        #: it led, transactions aborted for their timeout and producers fenced.
        self.leader_changes = 0
        self.timeouts = 0
        self.fenced = 0
        self._seen_leader: tuple[int, str] | None = None
        #: Groups whose GroupTimeouts is queued, held or in flight: the
        #: sweeper proposes no second one until its answer came.
        self._group_timeouts_pending: set[str] = set()
        self._group_timeouts_lock = threading.Lock()
        #: Applied entries plus lost leaderships; waiters on the condition
        #: wake when it moves (:meth:`await_change`).
        self._changes = 0
        self._changed = threading.Condition()
        self.replica = replica_factory(self._on_applied, self.transitions.snapshot)
        #: The leader's time (:class:`raftcoord.coordinator.leader.LeaderClock`).
        self.clock = LeaderClock(time.time, time.monotonic)
        self.core = LeaderCore(
            self.replica.query(lambda m: m.state.pids.layout),
            self.clock.now_ms,
            checks,
        )
        # The shard thread drives the core; gRPC threads take producer ids from it.
        self._core_lock = threading.Lock()
        #: Wakes the tick thread from its poll.
        self.wake = self.replica.waker()

    @property
    def leader_term(self) -> int:
        """The Raft term (coordinator epoch) of this replica's current or last leadership."""
        return self.core.epoch

    # --- called from gRPC threads --------------------------------------------------

    def submit(
        self,
        build: Unstamped,
        parkable: bool = True,
        parked: Callable[[], None] | None = None,
        park_ms: int | None = None,
    ) -> Future[Any]:
        """Queue the command of ``build``, stamped when it is proposed; the
        future resolves to its :class:`Outcome`. Not ``parkable``: never
        parked (:attr:`Request.parkable`); ``parked``, ``park_ms``:
        :attr:`Request.parked`, :attr:`Request.park_ms`."""
        request = Request(
            build,
            caller_deadline=CALLER_DEADLINE.get(),
            parkable=parkable,
            parked=parked,
            park_ms=park_ms,
        )
        self._enqueue([request])
        return request.future

    def submit_all(self, builds: Sequence[Unstamped], parkable: bool = True) -> list[Future[Any]]:
        """Queue the commands of ``builds`` to go out together, in one entry
        (the completions of many transactions); one future per command."""
        deadline = CALLER_DEADLINE.get()
        requests = [Request(build, caller_deadline=deadline, parkable=parkable) for build in builds]
        self._enqueue(requests)
        return [request.future for request in requests]

    def read(self, reader: Reader[T]) -> Future[T | Outcome]:
        """Run ``reader`` on the state once a log barrier proposed after this
        call is applied (a linearizable read); the future holds its result,
        or the refusal."""
        request = Request(None, reader=reader)
        self._enqueue([request])
        return request.future

    def status(self) -> ShardStatus:
        # Only a copy of the state's maps is taken under the replica's lock;
        # the digest is encoded outside it, so applies do not wait for it.
        def read(machine: TransactionStateMachine) -> tuple[ShardStatus, ShardState]:
            return ShardStatus(
                ready_leader=self.is_leader and self.ready,
                term=self.replica.raftCurrentTerm,
                commit_index=self.replica.raftCommitIndex,
                applied_index=self.replica.raftLastApplied,
                state_digest="",
                transactional_ids=len(machine.state.transactions),
                parked_requests=self.parked_count,
            ), machine.frozen_state()

        status, state = self.replica.query(read)
        return replace(status, state_digest=hashlib.sha256(encode_snapshot(state)).hexdigest())

    @property
    def parked_count(self) -> int:
        """Requests parked behind a completing transaction."""
        return self._parked.count

    def change_count(self) -> int:
        """How many entries this replica applied and leaderships it lost so far."""
        with self._changed:
            return self._changes

    def await_change(self, seen: int, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` until :meth:`change_count` is no longer
        ``seen`` (an entry applied, or the leadership ended); the count then."""
        with self._changed:
            self._changed.wait_for(lambda: self._changes != seen, timeout_s)
            return self._changes

    def _count_change(self) -> None:
        with self._changed:
            self._changes += 1
            self._changed.notify_all()

    def availability(self) -> ErrorCode:
        """NONE when this replica leads and has applied its log, else why not."""
        if not self.is_leader:
            return ErrorCode.NOT_COORDINATOR
        if not self.ready:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return ErrorCode.NONE

    def take_producer_id(self) -> int | None:
        """An id for an idempotent producer, or None when this replica cannot
        serve one now (not a ready leader, or waiting for its next block)."""
        if not (self.is_leader and self.ready):
            return None
        with self._core_lock:
            pid = self.core.take_producer_id()
        if pid is not None:
            self.wake()  # the shard thread asks for the next block at 90% use
        return pid

    def _enqueue(self, requests: list[Request]) -> None:
        error = self.availability()
        if error is not ErrorCode.NONE:
            for request in requests:
                request.future.set_result(Outcome(error=error, message=error.name))
            return
        self._queue.put(requests)
        if self._stopped:  # stop() drained the queue before this put
            for request in requests:
                _fail(request, ErrorCode.NOT_COORDINATOR)
            return
        self.wake()

    # --- the tick thread -----------------------------------------------------------

    def tick(self, wait_s: float) -> None:
        """One round of leader duties, then one pysyncobj tick that waits up
        to ``wait_s`` for I/O (a new request wakes it through :attr:`wake`);
        a follower that knows its leader up to :attr:`ShardTimers.follower_wait_ms`
        if that is longer."""
        self._track_leadership()
        if self.is_leader and self.ready:
            stamp = self.core.stamp()
            self._sweep(stamp.now_ms)
            for request in self._parked.expired(stamp.now_ms):
                _fail(request, ErrorCode.CONCURRENT_TRANSACTIONS)
            self._transfer_to_preferred(stamp.now_ms)
            self._propose_batch(stamp)
            if self._linger_until_ms is not None:  # a held completion is due then
                wait_s = min(wait_s, max(0.0, (self._linger_until_ms - stamp.now_ms) / 1000))
        elif not self.is_leader and self.replica.leader_address() is not None:
            wait_s = max(wait_s, self.timers.follower_wait_ms / 1000)
        self.replica.tick(wait_s)

    def _track_leadership(self) -> None:
        leading = self.replica.is_leader()
        term = int(self.replica.raftCurrentTerm)
        if self._seen_leader is None or self._seen_leader[0] != term:
            leader = self.replica.leader_address()
            if leader is not None:
                self._seen_leader = (term, leader)
                self.leader_changes += 1
        if leading and (not self.is_leader or term != self.leader_term):
            if self.is_leader:
                self._lose_leadership("term changed")
            self.is_leader, self.ready = True, False
            with self._core_lock:
                self.core.elected(term)
            self.clock.start(self.replica.query(lambda m: m.latest_stamp_ms()))
            self._leader_since_ms = self.clock.now_ms()
            with self._group_timeouts_lock:
                self._group_timeouts_pending.clear()
            log.info(
                "node=%d shard=%d event=leader_elected term=%d", self.node_id, self.shard, term
            )
            # The first own entry: once it is applied, so is everything before
            # it, and the shard can answer as current.
            self._request_block(term, first=True)
        elif not leading and self.is_leader:
            self._lose_leadership("stepped down")

    def stop(self) -> None:
        """The node stops (its tick thread has ended): every request still
        here, queued, parked or in an entry not yet applied, is answered
        NOT_COORDINATOR at once (its caller retries on the next leader), and
        so is every request submitted after this (a gRPC handler still running
        would otherwise wait out its timeout, and hold up the process's exit);
        waiters for a change (:meth:`await_change`) wake and find no leader."""
        self.is_leader = self.ready = False
        self._stopped = True
        for request in self._drain() + self._parked.drain():
            _fail(request, ErrorCode.NOT_COORDINATOR)
        self._count_change()
        self.replica.destroy()
        self.transitions.close()

    def _lose_leadership(self, why: str) -> None:
        log.info(
            "node=%d shard=%d event=leadership_lost term=%d reason=%s",
            self.node_id,
            self.shard,
            self.leader_term,
            why,
        )
        self.is_leader = self.ready = False
        with self._core_lock:
            self.core.deposed()
        for request in self._drain() + self._parked.drain():
            _fail(request, ErrorCode.NOT_COORDINATOR)
        self._count_change()

    def elect_preferred(self) -> bool:
        """An operator asks for the shard's preferred leader (Kafka's preferred
        leader election): whether this node leads the shard, is not its
        preferred leader and will ask it to take over."""
        if not (self.is_leader and self.ready):
            return False
        with self._core_lock:
            return self.core.elect_preferred(self.clock.now_ms())

    def _transfer_to_preferred(self, now: int) -> None:
        with self._core_lock:
            due = self.core.transfer_due(now)
            forced = self.core.forced
        if not due or self.preferred_leader is None:
            return
        if not forced and not self.imbalanced():
            with self._core_lock:
                self.core.balanced(now)
            return
        if self.replica.transfer_leadership(self.preferred_leader):
            with self._core_lock:
                self.core.transferred(now)
            log.info(
                "node=%d shard=%d event=leadership_transfer term=%d to=%s",
                self.node_id,
                self.shard,
                self.leader_term,
                self.preferred_leader,
            )

    def _request_block(self, term: int, first: bool = False) -> None:
        with self._core_lock:
            command, token = self.core.request_block()

        def granted(result: list[Outcome] | None, error: ErrorCode) -> None:
            if term != self.leader_term or not self.is_leader:
                return  # a new leadership asks again
            if result is None:
                with self._core_lock:
                    self.core.block_not_applied(token)
                if first:
                    self._request_block(term, first=True)
                return
            with self._core_lock:
                ok = self.core.block_granted(token, result[0])
            if not ok:
                log.error(
                    "node=%d shard=%d event=pid_block_failed %s",
                    self.node_id,
                    self.shard,
                    result[0].message,
                )
            if first:
                # Everything before the first entry is applied now: the clock
                # continues from the newest timestamp of the whole log, and
                # the leadership's start moves with it (group sessions count
                # from there).
                jump = self.clock.raise_to(self.replica.query(lambda m: m.latest_stamp_ms()))
                self._leader_since_ms += jump
                # The node's marker writer for this leadership starts from the
                # applied state's pending markers.
                self.ready = True
                with self._core_lock:
                    self.core.became_ready(
                        self.clock.now_ms(), preferred=self.preferred_leader is None
                    )
                log.info(
                    "node=%d shard=%d event=leader_ready term=%d", self.node_id, self.shard, term
                )

        self.replica.propose(term, encode_entry([command]), granted)

    def _drain(self) -> list[Request]:
        drained, self._waiting = self._waiting, []
        while True:
            try:
                drained.extend(self._queue.get_nowait())
            except queue.Empty:
                return drained

    def _propose_batch(self, stamp: Stamp) -> None:
        self._linger_until_ms = None
        with self._core_lock:
            block_due = self.core.block_due(stamp.now_ms)
        if block_due:
            self._request_block(stamp.coordinator_epoch)
        requests = self._answer_covered_adds(self._drain())
        if not requests:
            return
        with self._core_lock:
            batch = self.core.batch(
                requests,
                stamp,
                self._needs_new_producer_id,
                self._waits_for_completion,
                self._parked.release,
            )
        if batch is None:  # entries in flight: the requests go out together next
            self._waiting = requests
            return
        self._waiting = batch.lingering + batch.waiting
        self._linger_until_ms = batch.linger_until_ms
        for tid, request in batch.parked:
            if not self._hold(request, tid, stamp.now_ms):
                _fail(request, ErrorCode.CONCURRENT_TRANSACTIONS)
        for request in batch.concurrent:
            _fail(request, ErrorCode.CONCURRENT_TRANSACTIONS)
        if not batch.requests:
            return
        term = stamp.coordinator_epoch
        # Other nodes read these commands' state from their own replica: the
        # followers learn of the commit at once, not with the next entry.
        announce = any(isinstance(c, METADATA_COMMANDS) for c in batch.commands)

        def applied(result: list[Outcome] | None, error: ErrorCode) -> None:
            with self._core_lock:
                self.core.entry_done(term)
            if announce and result is not None:
                self.replica.announce_commit()
            if self._waiting or not self._queue.empty():
                # Requests queued while the entry was in flight go out now,
                # not when the tick's wait for I/O ends.
                self.wake()
            if result is None:
                for request in batch.requests:
                    _fail(request, error)
                return
            adds = [
                (command, outcome)
                for command, outcome in zip(batch.commands, result, strict=True)
                if isinstance(command, AddPartitions)
            ]
            self._last_adds = (self.change_count(), adds) if adds else None
            outcomes = iter(zip(batch.commands, result, strict=True))
            for request in batch.requests:
                if request.build is not None:
                    command, outcome = next(outcomes)
                    if not self._park(request, command, outcome):
                        request.future.set_result(outcome)
                else:
                    assert request.reader is not None
                    try:
                        request.future.set_result(self.replica.query(request.reader))
                    except Exception as exc:  # a reader bug must not kill the tick
                        request.future.set_exception(exc)

        self.replica.propose(term, encode_entry(batch.commands), applied)

    def _answer_covered_adds(self, requests: list[Request]) -> list[Request]:
        """Answer, without an entry of their own, the queued adds that an add
        of the entry applied last covers (:func:`covering_outcome`), as long
        as nothing has applied since and the leadership is the same (the
        change count says both): they are answered as if they had been in
        that entry. The partition-log nodes of one producer's flush send the
        same add (the flush's partitions); the first goes out at once, the
        others arrive while it is in flight. Returns the requests left."""
        last = self._last_adds
        if last is None:
            return requests
        seen, adds = last
        if seen != self.change_count():
            self._last_adds = None
            return requests
        left = []
        for request in requests:
            outcome = None
            if request.build is not None:
                outcome = covering_outcome(adds, request.build(CHECK_ONLY))
            if outcome is None:
                left.append(request)
            else:
                request.future.set_result(outcome)
        return left

    def _park(self, request: Request, command: Command, outcome: Outcome) -> bool:
        """Park ``request`` if its answer ``outcome`` only says that its
        transactional id's previous transaction is still completing; whether
        it was parked. Runs when its entry applies, on the tick thread."""
        if not (self.is_leader and request.parkable):
            return False
        key = park_key(
            command, outcome, lambda tid: self.replica.query(lambda m: _state_of(m, tid))
        )
        return key is not None and self._hold(request, key, self.clock.now_ms())

    def _hold(self, request: Request, transactional_id: str, now: int) -> bool:
        """Park ``request`` behind ``transactional_id`` unless its time to
        stay parked is over; whether it was parked."""
        if request.park_deadline_ms is None:
            request.park_deadline_ms = park_deadline(
                now,
                self.timers.park_timeout_ms
                if request.park_ms is None
                else min(request.park_ms, self.timers.park_timeout_ms),
                None
                if request.caller_deadline is None
                else self.clock.deadline_ms(request.caller_deadline),
            )
        if now >= request.park_deadline_ms:
            return False
        self._parked.park(transactional_id, request, request.park_deadline_ms)
        if request.parked is not None:
            request.parked()
        return True

    def _needs_new_producer_id(self, command: InitProducerId | EndTxn) -> bool:
        return self.replica.query(lambda m: m.needs_new_producer_id(command))

    def _waits_for_completion(self, command: Command) -> bool:
        return self.replica.query(lambda m: m.waits_for_completion(command))

    def _sweep(self, now: int) -> None:
        if now >= self._next_abort_sweep:
            self._next_abort_sweep = now + self.timers.abort_timed_out_interval_ms
            candidates = self.replica.query(lambda m: m.timed_out(now))
            for candidate in candidates:
                self._queue.put([Request(timed_out_abort(candidate))])
        if now >= self._next_expire_sweep:
            self._next_expire_sweep = now + self.timers.expire_interval_ms
            ids = tuple(self.replica.query(lambda m: m.expirable_ids(now)))
            if ids:
                self._queue.put([Request(lambda stamp: ExpireTransactionalIds(ids, stamp.now_ms))])
        if now >= self._next_group_sweep:
            self._next_group_sweep = now + GROUP_SWEEP_INTERVAL_MS
            since = self._leader_since_ms
            for group_id in self.replica.query(lambda m: m.groups_due(now, since)):
                with self._group_timeouts_lock:
                    if group_id in self._group_timeouts_pending:
                        continue
                    self._group_timeouts_pending.add(group_id)
                request = Request(_group_timeouts(group_id, since))
                request.future.add_done_callback(self._swept(group_id))
                self._queue.put([request])

    def _swept(self, group_id: str) -> Callable[[Future[Any]], None]:
        """What runs once the GroupTimeouts of ``group_id`` is answered
        (applied or refused): the sweeper may propose the next one."""

        def answered(_future: Future[Any]) -> None:
            with self._group_timeouts_lock:
                self._group_timeouts_pending.discard(group_id)

        return answered

    # --- every replica, after an entry is applied ----------------------------------

    def _on_applied(self, index: int, term: int, outcomes: list[Outcome]) -> None:
        self._count_change()
        effects = [e for o in outcomes for e in o.effects]
        self.transitions.write(index, term, [e for e in effects if isinstance(e, Transition)])
        for outcome in outcomes:
            if outcome.error is ErrorCode.UNKNOWN_SERVER_ERROR:
                log.error(
                    "node=%d shard=%d event=command_refused index=%d %s",
                    self.node_id,
                    self.shard,
                    index,
                    outcome.message,
                )
        if not self.replica.is_leader():
            return
        released = [
            request
            for t in effects
            if isinstance(t, Transition) and t.from_state in PREPARE_STATES
            for request in self._parked.release(t.transactional_id)
        ]
        if released:  # they run again, ahead of newer requests
            self._waiting[:0] = released
            self.wake()
        for effect in effects:
            if isinstance(effect, ProducerFenced):
                timed_out = effect.reason == "timeout"
                if timed_out:
                    self.timeouts += 1
                else:
                    self.fenced += 1
                event = "timeout_abort" if timed_out else "producer_fenced"
                log.info(
                    "node=%d shard=%d event=%s transactional_id=%s producer_id=%d "
                    "old_epoch=%d new_epoch=%d",
                    self.node_id,
                    self.shard,
                    event,
                    effect.transactional_id,
                    effect.producer_id,
                    effect.old_epoch,
                    effect.new_epoch,
                )
            elif isinstance(effect, WriteMarkers):
                self.marker_sink(self.shard, effect)
        for outcome in outcomes:
            if outcome.expired:
                log.info(
                    "node=%d shard=%d event=expired transactional_ids=%s",
                    self.node_id,
                    self.shard,
                    ",".join(outcome.expired),
                )


def _group_timeouts(group_id: str, leader_since_ms: int) -> Unstamped:
    return lambda stamp: GroupTimeouts(group_id, stamp.now_ms, leader_since_ms)


def _state_of(machine: TransactionStateMachine, transactional_id: str) -> TxnState | None:
    meta = machine.describe(transactional_id)
    return None if meta is None else meta.state


def _fail(request: Request, code: ErrorCode) -> None:
    """Answer ``request`` with ``code`` unless it is answered already (by
    now, or by another thread meanwhile: a stop drains the queue that a
    handler's :meth:`Shard._enqueue` may fail as well)."""
    with suppress(InvalidStateError):
        request.future.set_result(Outcome(error=code, message=code.name))
