"""The marker writer's bookkeeping: which markers are owed, where they wait,
and what each answer does to them. No threads, no clock, no I/O: the caller
passes the time in and serializes the calls (:class:`MarkerWriter` holds a
lock around every one).

A marker (one participant of one transaction) moves through three places:

* *scheduled*: waiting to be routed, because it is new or because it failed
  and backs off until its due time;
* *queued* for a destination once the transport says where it goes;
* *in flight* in the one WriteTxnMarkers call a destination has at a time.
  Everything queued while a call is in flight goes out in the next call, so
  the markers of many transactions share one call.

A transaction whose every marker is acknowledged waits for completion (the
MarkersWritten proposal); completions go out one batch at a time.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from marker_writer.errors import (
    CompletionDisposition,
    MarkerDisposition,
    classify_completion,
    classify_marker_error,
    code_name,
)
from marker_writer.model import (
    Completion,
    ConsumerGroup,
    DataPartition,
    DeliveryProblem,
    Destination,
    MarkerRequest,
    MarkerResponse,
    Participant,
    TxnKey,
)
from raftcoord.protocol.backoff import Backoff
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.types import WriteMarkers

#: The code recorded for a participant whose answer is missing.
MISSING_ANSWER = -1  # UNKNOWN_SERVER_ERROR
#: How many finished transactions are remembered so a repeated hand-off
#: (a re-apply, a resent pending list) does not queue them again.
REMEMBERED_FINISHED = 10_000


@dataclass(eq=False)
class TxnEntry:
    """One transaction the writer owes markers for."""

    key: TxnKey
    commit: bool
    coordinator_epoch: int
    transaction_version: int
    partitions: tuple[DataPartition, ...]
    groups: tuple[ConsumerGroup, ...]
    added_at: float
    pending: set[Participant] = field(default_factory=set)
    markers: dict[Participant, PendingMarker] = field(default_factory=dict)
    completion_failures: int = 0
    closed: bool = False

    def completion(self) -> Completion:
        return Completion(
            self.key.transactional_id,
            self.key.producer_id,
            self.key.producer_epoch,
            self.partitions,
            self.groups,
            self.key.txn_number,
        )


@dataclass(eq=False)
class PendingMarker:
    """One participant's marker of one transaction."""

    txn: TxnEntry
    participant: Participant
    failures: int = 0
    last_problem: DeliveryProblem | None = None
    unroutable: int = 0

    @property
    def live(self) -> bool:
        return not self.txn.closed and self.participant in self.txn.pending


@dataclass(frozen=True)
class MarkerBatch:
    """One WriteTxnMarkers call: ``requests[i]`` carries ``markers[i]``."""

    destination: Destination
    requests: tuple[MarkerRequest, ...]
    markers: tuple[tuple[PendingMarker, ...], ...]

    @property
    def marker_count(self) -> int:
        return sum(len(m) for m in self.markers)


@dataclass(frozen=True)
class CompletionBatch:
    """Transactions whose MarkersWritten goes out together."""

    txns: tuple[TxnEntry, ...]

    @property
    def completions(self) -> tuple[Completion, ...]:
        return tuple(t.completion() for t in self.txns)


@dataclass
class ResponseReport:
    """What one call's answers did, for the log."""

    acked: int = 0
    retried: int = 0
    ready_to_complete: int = 0
    #: (transaction, participant, code) of each transaction dropped as fenced.
    fenced: list[tuple[TxnKey, Participant, int]] = field(default_factory=list)
    #: code -> (transaction, participant) answers this exchange should not give.
    unexpected: dict[int, list[tuple[TxnKey, Participant]]] = field(default_factory=dict)
    #: Retriable codes seen, with how many participants got each.
    retriable: dict[int, int] = field(default_factory=dict)


@dataclass
class CompletionReport:
    completed: list[TxnKey] = field(default_factory=list)
    stale: list[TxnKey] = field(default_factory=list)
    retried: list[tuple[TxnKey, int]] = field(default_factory=list)
    unexpected: list[tuple[TxnKey, int]] = field(default_factory=list)
    leadership_lost: bool = False


@dataclass
class Counters:
    markers_sent: int = 0
    markers_acked: int = 0
    retries: int = 0
    calls: int = 0
    failed_calls: int = 0
    completed_transactions: int = 0
    fenced_transactions: int = 0
    stale_transactions: int = 0
    #: Markers that once found no destination (each counted once).
    unroutable_markers: int = 0


class MarkerBook:
    """Owed markers and their queues (see the module docstring)."""

    def __init__(self, coordinator_epoch: int, backoff: Backoff) -> None:
        self.coordinator_epoch = coordinator_epoch
        self.backoff = backoff
        self.counters = Counters()
        self._txns: dict[TxnKey, TxnEntry] = {}
        self._finished: OrderedDict[TxnKey, None] = OrderedDict()
        self._seq = itertools.count()
        self._scheduled: list[tuple[float, int, PendingMarker]] = []
        self._queues: dict[Destination, deque[PendingMarker]] = {}
        self._in_flight: dict[Destination, MarkerBatch] = {}
        self._completions: list[tuple[float, int, TxnEntry]] = []
        self._completing: CompletionBatch | None = None

    # --- intake --------------------------------------------------------------------

    def add(self, markers: WriteMarkers, now: float) -> bool:
        """Owe ``markers``' participants a marker; False when this transaction
        is already owed or was finished here (a repeated hand-off)."""
        key = TxnKey(
            markers.transactional_id,
            markers.producer_id,
            markers.producer_epoch,
            markers.txn_number,
        )
        if key in self._txns or key in self._finished:
            return False
        partitions = tuple(sorted({DataPartition(t, p) for t, p in markers.partitions}))
        groups = tuple(sorted({ConsumerGroup(g) for g in markers.groups}))
        txn = TxnEntry(
            key,
            markers.commit,
            # A resumed transaction keeps the epoch it was prepared under if a
            # newer one is unknown here; normally this writer's term is newer.
            max(self.coordinator_epoch, markers.coordinator_epoch),
            markers.transaction_version,
            partitions,
            groups,
            now,
        )
        txn.pending.update(partitions)
        txn.pending.update(groups)
        self._txns[key] = txn
        participants: tuple[Participant, ...] = (*partitions, *groups)
        for participant in participants:
            marker = txn.markers[participant] = PendingMarker(txn, participant)
            self._schedule(marker, now)
        if not txn.pending:
            self._schedule_completion(txn, now)
        return True

    # --- routing -------------------------------------------------------------------

    def due_markers(self, now: float) -> list[PendingMarker]:
        """Take the scheduled markers due at ``now``; the caller routes each
        with :meth:`route` or :meth:`defer`."""
        due = []
        while self._scheduled and self._scheduled[0][0] <= now:
            marker = heapq.heappop(self._scheduled)[2]
            if marker.live:
                due.append(marker)
        return due

    def route(self, marker: PendingMarker, destination: Destination) -> None:
        self._queues.setdefault(destination, deque()).append(marker)

    def defer(self, marker: PendingMarker, now: float) -> bool:
        """No destination for ``marker`` now: try again after a backoff.
        True the first time this marker could not be routed."""
        marker.unroutable += 1
        if isinstance(marker.participant, DataPartition):
            problem = DeliveryProblem(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                "unroutable: no partition-log node is known for this partition "
                "(not in the cluster's topic metadata); retrying",
            )
        else:
            problem = DeliveryProblem(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                "unroutable: no leader is known for the group's shard; retrying",
            )
        self._retry(marker, now, problem)
        if marker.unroutable == 1:
            self.counters.unroutable_markers += 1
        return marker.unroutable == 1

    # --- sending -------------------------------------------------------------------

    def take_batches(self, max_requests: int) -> list[MarkerBatch]:
        """One call's worth for every destination with queued markers and no
        call in flight: the markers of up to ``max_requests`` transactions,
        one request per transaction."""
        batches = []
        for destination, queue in list(self._queues.items()):
            if destination in self._in_flight:
                continue
            by_txn: dict[TxnEntry, list[PendingMarker]] = {}
            keep: deque[PendingMarker] = deque()
            while queue:
                marker = queue.popleft()
                if not marker.live:
                    continue
                if marker.txn in by_txn or len(by_txn) < max_requests:
                    by_txn.setdefault(marker.txn, []).append(marker)
                else:
                    keep.append(marker)
            if keep:
                self._queues[destination] = keep
            else:
                del self._queues[destination]
            if not by_txn:
                continue
            batch = MarkerBatch(
                destination,
                tuple(self._request(txn, group) for txn, group in by_txn.items()),
                tuple(tuple(group) for group in by_txn.values()),
            )
            self._in_flight[destination] = batch
            self.counters.calls += 1
            self.counters.markers_sent += batch.marker_count
            batches.append(batch)
        return batches

    def _request(self, txn: TxnEntry, markers: list[PendingMarker]) -> MarkerRequest:
        participants = [m.participant for m in markers]
        return MarkerRequest(
            transactional_id=txn.key.transactional_id,
            producer_id=txn.key.producer_id,
            producer_epoch=txn.key.producer_epoch,
            coordinator_epoch=txn.coordinator_epoch,
            commit=txn.commit,
            partitions=tuple(p for p in participants if isinstance(p, DataPartition)),
            groups=tuple(p for p in participants if isinstance(p, ConsumerGroup)),
            transaction_version=txn.transaction_version,
            txn_number=txn.key.txn_number,
        )

    def on_response(
        self,
        batch: MarkerBatch,
        responses: Sequence[MarkerResponse] | None,
        now: float,
        failure: str = "",
    ) -> ResponseReport:
        """Apply a call's answers (None: the call failed as a whole, for the
        reason ``failure``)."""
        self._in_flight.pop(batch.destination, None)
        report = ResponseReport()
        if responses is None:
            self.counters.failed_calls += 1
        for index, markers in enumerate(batch.markers):
            errors = None if responses is None else responses[index].errors
            for marker in markers:
                if not marker.live:
                    continue  # dropped meanwhile (a fenced sibling)
                if errors is None:
                    problem = DeliveryProblem(
                        ErrorCode.UNKNOWN_SERVER_ERROR,
                        f"the WriteTxnMarkers call to {batch.destination} failed "
                        f"({failure or 'no answer'}); retrying",
                    )
                    self._retry(marker, now, problem)
                    report.retried += 1
                    continue
                code = int(errors.get(marker.participant, MISSING_ANSWER))
                disposition = classify_marker_error(code)
                if disposition is MarkerDisposition.DONE:
                    self._acknowledge(marker, now, report)
                elif disposition is MarkerDisposition.FENCED:
                    self._close(marker.txn)
                    self.counters.fenced_transactions += 1
                    report.fenced.append((marker.txn.key, marker.participant, code))
                else:
                    if disposition is MarkerDisposition.UNEXPECTED:
                        report.unexpected.setdefault(code, []).append(
                            (marker.txn.key, marker.participant)
                        )
                    else:
                        report.retriable[code] = report.retriable.get(code, 0) + 1
                    problem = DeliveryProblem(
                        code, f"{batch.destination} answered {code_name(code)}; retrying"
                    )
                    self._retry(marker, now, problem)
                    report.retried += 1
        return report

    def _acknowledge(self, marker: PendingMarker, now: float, report: ResponseReport) -> None:
        txn = marker.txn
        txn.pending.discard(marker.participant)
        self.counters.markers_acked += 1
        report.acked += 1
        if not txn.pending:
            self._schedule_completion(txn, now)
            report.ready_to_complete += 1

    # --- completion ----------------------------------------------------------------

    def take_completions(self, now: float, max_count: int) -> CompletionBatch | None:
        """The due completions, unless a completion batch is in flight."""
        if self._completing is not None:
            return None
        txns: list[TxnEntry] = []
        while self._completions and self._completions[0][0] <= now and len(txns) < max_count:
            txn = heapq.heappop(self._completions)[2]
            if not txn.closed:
                txns.append(txn)
        if not txns:
            return None
        self._completing = CompletionBatch(tuple(txns))
        return self._completing

    def on_completed(
        self, batch: CompletionBatch, codes: Sequence[int], now: float
    ) -> CompletionReport:
        """Apply the answers to a completion batch (one code per transaction)."""
        if self._completing is batch:
            self._completing = None
        report = CompletionReport()
        for txn, code in zip(batch.txns, codes, strict=True):
            if txn.closed:
                continue
            disposition = classify_completion(code)
            if disposition is CompletionDisposition.DONE:
                self._close(txn)
                self.counters.completed_transactions += 1
                report.completed.append(txn.key)
            elif disposition is CompletionDisposition.STALE:
                self._close(txn)
                self.counters.stale_transactions += 1
                report.stale.append(txn.key)
            elif disposition is CompletionDisposition.LEADERSHIP_LOST:
                report.leadership_lost = True
            else:
                txn.completion_failures += 1
                self.counters.retries += 1
                due = now + self.backoff.delay(txn.completion_failures)
                heapq.heappush(self._completions, (due, next(self._seq), txn))
                if disposition is CompletionDisposition.UNEXPECTED:
                    report.unexpected.append((txn.key, code))
                else:
                    report.retried.append((txn.key, code))
        return report

    # --- timing, metrics, shutdown -------------------------------------------------

    def next_due(self) -> float | None:
        """When scheduled work is next due (None: nothing is scheduled).
        Queued markers are not counted: they leave when their destination's
        call in flight returns."""
        while self._scheduled and not self._scheduled[0][2].live:
            heapq.heappop(self._scheduled)
        while self._completions and self._completions[0][2].closed:
            heapq.heappop(self._completions)
        times = []
        if self._scheduled:
            times.append(self._scheduled[0][0])
        if self._completions and self._completing is None:
            times.append(self._completions[0][0])
        return min(times, default=None)

    def has_work(self) -> bool:
        return bool(self._txns)

    def pending(self, key: TxnKey) -> dict[Participant, DeliveryProblem | None] | None:
        """The participants whose marker transaction ``key`` still owes here,
        each with the problem its last try met (None: none yet); None when
        the transaction is not owed here."""
        txn = self._txns.get(key)
        if txn is None:
            return None
        return {p: txn.markers[p].last_problem for p in sorted(txn.pending)}

    def metrics(self, now: float) -> dict[str, Any]:
        queued = {str(d): sum(1 for m in q if m.live) for d, q in sorted(self._queues.items()) if q}
        in_flight = {str(d): b.marker_count for d, b in sorted(self._in_flight.items())}
        oldest = min((t.added_at for t in self._txns.values()), default=None)
        return {
            "pending_transactions": len(self._txns),
            "scheduled_markers": sum(1 for _, _, m in self._scheduled if m.live),
            "queued_markers": queued,
            "in_flight_markers": in_flight,
            "markers_sent": self.counters.markers_sent,
            "markers_acked": self.counters.markers_acked,
            "retries": self.counters.retries,
            "calls": self.counters.calls,
            "failed_calls": self.counters.failed_calls,
            "completed_transactions": self.counters.completed_transactions,
            "fenced_transactions": self.counters.fenced_transactions,
            "stale_transactions": self.counters.stale_transactions,
            "unroutable_markers": self.counters.unroutable_markers,
            "oldest_pending_ms": 0 if oldest is None else int((now - oldest) * 1000),
            "backlog": self.backlog(now),
        }

    def backlog(self, now: float) -> dict[str, tuple[int, float]]:
        """Per destination, the markers queued or in flight there and the
        age (seconds) of the oldest one's transaction; markers waiting to be
        tried again (or routed) are under ``"retrying"``."""
        by_destination: dict[str, list[PendingMarker]] = {}
        for destination, queue in self._queues.items():
            by_destination.setdefault(str(destination), []).extend(m for m in queue if m.live)
        for destination, batch in self._in_flight.items():
            markers = (m for group in batch.markers for m in group if m.live)
            by_destination.setdefault(str(destination), []).extend(markers)
        retrying = [m for _, _, m in self._scheduled if m.live]
        if retrying:
            by_destination["retrying"] = retrying
        return {
            name: (len(markers), now - min(m.txn.added_at for m in markers))
            for name, markers in sorted(by_destination.items())
            if markers
        }

    def clear(self) -> None:
        """Forget every owed marker (the writer stops; the next leader resends)."""
        for txn in self._txns.values():
            txn.closed = True
            txn.markers.clear()  # no cycle left (see _close)
        self._txns.clear()
        self._scheduled.clear()
        self._queues.clear()
        self._in_flight.clear()
        self._completions.clear()
        self._completing = None

    # --- internals -----------------------------------------------------------------

    def _schedule(self, marker: PendingMarker, due: float) -> None:
        heapq.heappush(self._scheduled, (due, next(self._seq), marker))

    def _retry(self, marker: PendingMarker, now: float, problem: DeliveryProblem) -> None:
        marker.failures += 1
        marker.last_problem = problem
        self.counters.retries += 1
        self._schedule(marker, now + self.backoff.delay(marker.failures))

    def _schedule_completion(self, txn: TxnEntry, now: float) -> None:
        heapq.heappush(self._completions, (now, next(self._seq), txn))

    def _close(self, txn: TxnEntry) -> None:
        txn.closed = True
        # Each marker points back at its entry: dropping the entry's side
        # leaves no reference cycle, so reference counting frees both (the
        # coordinator freezes long-lived objects for the garbage collector,
        # see raftcoord/coordinator/heap.py, and a cycle would stay).
        txn.markers.clear()
        self._txns.pop(txn.key, None)
        self._finished[txn.key] = None
        while len(self._finished) > REMEMBERED_FINISHED:
            self._finished.popitem(last=False)
