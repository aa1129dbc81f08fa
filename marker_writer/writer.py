"""The marker writer of one shard leadership (Kafka's TransactionMarkerChannelManager).

A :class:`MarkerWriter` belongs to one shard for one term. The shard leader
hands it the markers of every transaction that reaches PrepareCommit or
PrepareAbort (:meth:`MarkerWriter.add`); the writer delivers one marker per
participant, batching the markers of many transactions into one
WriteTxnMarkers call per destination, retries by error class, and proposes
MarkersWritten once a transaction's every participant has acknowledged.

Threads: one dispatcher thread routes due markers and hands calls to a small
pool; each destination has at most one call in flight, so calls to different
destinations run concurrently and markers that arrive meanwhile share the
next call. The pool thread that gets an answer goes on with what the answer
made possible (the next call to that destination, the transactions it
finished, whose completion it runs itself); the dispatcher is woken only for
new markers and for work due earlier than it planned to look (a retry). The
dispatcher sleeps on a condition until work is due or new work arrives.
:meth:`MarkerWriter.stop` (leadership lost, node stopping) discards
everything: the next leader resends from its own replicated state.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from marker_writer.book import (
    CompletionBatch,
    CompletionReport,
    MarkerBatch,
    MarkerBook,
    ResponseReport,
)
from marker_writer.errors import code_name
from marker_writer.model import (
    DeliveryProblem,
    Destination,
    MarkerResponse,
    Participant,
    TxnKey,
)
from marker_writer.transport import Clock, MarkerTransport, TransportError
from raftcoord.protocol.backoff import Backoff
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.types import WriteMarkers

DEFAULT_MAX_REQUESTS_PER_CALL = 500
DEFAULT_MAX_COMPLETIONS = 500
DEFAULT_SENDERS = 8
DEFAULT_SUMMARY_INTERVAL_S = 60.0
#: The dispatcher wakes at least this often, so a missed notification costs
#: at most this much delay.
_MAX_SLEEP_S = 1.0


class MarkerWriter:
    """Delivers the markers of one shard leadership (see the module docstring)."""

    def __init__(
        self,
        shard: int,
        term: int,
        transport: MarkerTransport,
        *,
        clock: Clock = time.monotonic,
        logger: logging.Logger | None = None,
        backoff: Backoff | None = None,
        max_requests_per_call: int = DEFAULT_MAX_REQUESTS_PER_CALL,
        max_completions: int = DEFAULT_MAX_COMPLETIONS,
        executor: Executor | None = None,
        summary_interval_s: float = DEFAULT_SUMMARY_INTERVAL_S,
        label: str = "",
    ) -> None:
        """``executor`` runs the calls (a thread pool by default; tests pass
        one that runs them inline). ``label`` prefixes every log line
        (e.g. ``node=1``)."""
        if max_requests_per_call < 1 or max_completions < 1:
            raise ValueError("batch limits must be positive")
        self.shard = shard
        self.term = term
        self._transport = transport
        self._clock = clock
        self._log = logger or logging.getLogger("marker_writer")
        self._book = MarkerBook(term, backoff or Backoff())
        self._max_requests = max_requests_per_call
        self._max_completions = max_completions
        self._owns_executor = executor is None
        self._executor: Executor = executor or ThreadPoolExecutor(
            max_workers=DEFAULT_SENDERS, thread_name_prefix=f"markers-{shard}"
        )
        self._summary_interval_s = summary_interval_s
        self._prefix = f"{label} shard={shard} term={term}".strip()
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._kicked = False
        #: When the dispatcher looks at the book next by itself (-inf: it is
        #: awake and looks again before sleeping).
        self._wake_at = -math.inf
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._next_summary = clock() + summary_interval_s
        self._active_since_summary = False

    # --- the shard leader's side ---------------------------------------------------

    def start(self) -> None:
        """Start the dispatcher thread."""
        with self._lock:
            if self._stopped or self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, name=f"markers-{self.shard}-t{self.term}", daemon=True
            )
        self._thread.start()

    def add(self, markers: WriteMarkers, term: int) -> bool:
        """Owe ``markers``' participants their markers. Ignored (False) when
        ``term`` is not this writer's, the writer is stopped, or the
        transaction is already owed or finished here."""
        if term != self.term:
            self._log.debug(
                "%s event=markers_ignored reason=term_%d transactional_id=%s",
                self._prefix,
                term,
                markers.transactional_id,
            )
            return False
        with self._lock:
            if self._stopped:
                return False
            added = self._book.add(markers, self._clock())
            if added:
                self._active_since_summary = True
                self._kick()
        return added

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop sending, discard every owed marker, never complete again.
        Waits up to ``timeout_s`` for the dispatcher thread; calls in flight
        end by their own deadline and their answers are ignored."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            summary = self._book.metrics(self._clock())
            self._book.clear()
            self._wakeup.notify_all()
            thread = self._thread
        self._log.info("%s event=marker_writer_stopped %s", self._prefix, _summary_line(summary))
        if self._owns_executor:
            self._executor.shutdown(wait=False, cancel_futures=True)
        if thread is not None and thread is not threading.current_thread() and timeout_s > 0:
            thread.join(timeout_s)

    @property
    def stopped(self) -> bool:
        return self._stopped

    def pending(self, key: TxnKey) -> dict[Participant, DeliveryProblem | None] | None:
        """The participants whose marker transaction ``key`` still owes, each
        with the problem its last try met (None: none yet); None when this
        writer does not owe the transaction."""
        with self._lock:
            return self._book.pending(key)

    def metrics(self) -> dict[str, Any]:
        """Counters and gauges: ``queued_markers`` per destination,
        ``markers_sent``, ``retries``, ``unroutable_markers``,
        ``oldest_pending_ms`` and more."""
        with self._lock:
            values = self._book.metrics(self._clock())
        values.update(shard=self.shard, term=self.term, stopped=self._stopped)
        return values

    # --- dispatching ---------------------------------------------------------------

    def dispatch(self) -> None:
        """One round: route the due markers, start a call for every idle
        destination with queued markers, start the due completions. The
        dispatcher thread runs this whenever it wakes; tests call it directly."""
        now = self._clock()
        with self._lock:
            if self._stopped:
                return
            due = self._book.due_markers(now)
        # Routing reads the node's metadata: never under this writer's lock.
        resolved: dict[Participant, Destination | None] = {}
        for marker in due:
            if marker.participant not in resolved:
                resolved[marker.participant] = self._resolve(marker.participant)
        unroutable = []
        with self._lock:
            if self._stopped:
                return
            for marker in due:
                destination = resolved[marker.participant]
                if destination is None:
                    if self._book.defer(marker, now):
                        unroutable.append(marker)
                else:
                    self._book.route(marker, destination)
            batches = self._book.take_batches(self._max_requests)
        for marker in unroutable:  # once per marker, however often it is retried
            self._log.warning(
                "%s event=marker_unroutable transactional_id=%s producer_id=%d "
                "participant=%s (%s; DescribeTransactions lists it until delivered)",
                self._prefix,
                marker.txn.key.transactional_id,
                marker.txn.key.producer_id,
                marker.participant,
                marker.last_problem.message if marker.last_problem else "no destination",
            )
        for batch in batches:
            self._submit(self._send, batch)
        # After the sends: with calls that answer at once, what they finished
        # completes in this same round.
        with self._lock:
            if self._stopped:
                return
            completions = self._book.take_completions(self._clock(), self._max_completions)
        if completions is not None:
            self._submit(self._complete, completions)

    def _resolve(self, participant: Participant) -> Destination | None:
        try:
            return self._transport.resolve(participant)
        except Exception:
            self._log.exception(
                "%s event=marker_resolve_failed participant=%s", self._prefix, participant
            )
            return None

    def _submit(self, job: Callable[[Any], None], work: Any) -> None:
        try:
            self._executor.submit(self._guarded, job, work)
        except RuntimeError:  # the pool shut down: the writer is stopping
            if not self._stopped:
                raise

    def _guarded(self, job: Callable[[Any], None], work: Any) -> None:
        # Nobody reads the pool's futures: a failure must reach the log.
        try:
            job(work)
        except Exception:
            self._log.exception("%s event=marker_job_failed job=%s", self._prefix, job.__name__)

    def _kick(self) -> None:
        """Wake the dispatcher (caller holds the lock)."""
        self._kicked = True
        self._wakeup.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._stopped:
                    return
                if not self._kicked:
                    now = self._clock()
                    due = self._book.next_due()
                    sleep = _MAX_SLEEP_S if due is None else min(_MAX_SLEEP_S, due - now)
                    if sleep > 0:
                        self._wake_at = now + sleep
                        self._wakeup.wait(sleep)
                        self._wake_at = -math.inf
                self._kicked = False
                if self._stopped:
                    return
            try:
                self.dispatch()
                self._maybe_log_summary()
            except Exception:  # a bug here must not end marker delivery
                self._log.exception("%s event=marker_dispatch_failed", self._prefix)
                with self._lock:
                    self._wakeup.wait(_MAX_SLEEP_S)

    # --- calls ---------------------------------------------------------------------

    def _send(self, batch: MarkerBatch) -> None:
        failure: str | None = None
        responses: Sequence[MarkerResponse] | None = None
        try:
            responses = self._transport.send(batch.destination, batch.requests)
            if len(responses) != len(batch.requests):
                raise TransportError(f"{len(responses)} answers to {len(batch.requests)} markers")
        except TransportError as exc:
            responses, failure = None, str(exc) or type(exc).__name__
        except Exception as exc:
            self._log.exception(
                "%s event=marker_send_failed destination=%s", self._prefix, batch.destination
            )
            responses, failure = None, repr(exc)
        with self._lock:
            if self._stopped:
                return
            report = self._book.on_response(batch, responses, self._clock(), failure or "")
            self._active_since_summary = True
        self._log_response(batch, report, failure)
        self._follow_up()

    def _complete(self, batch: CompletionBatch) -> None:
        self._run_completion(batch)
        self._follow_up()

    def _follow_up(self) -> None:
        """After an answer, in the pool thread that got it: start the calls
        of markers queued meanwhile, run the due completions here (one batch
        at a time, as many as come due), and wake the dispatcher only if some
        work (a retry) is due before it would look by itself."""
        while True:
            with self._lock:
                if self._stopped:
                    return
                batches = self._book.take_batches(self._max_requests)
                completions = self._book.take_completions(self._clock(), self._max_completions)
                due = self._book.next_due()
                if due is not None and due < self._wake_at:
                    self._kick()
            for batch in batches:
                self._submit(self._send, batch)
            if completions is None:
                return
            self._run_completion(completions)

    def _run_completion(self, batch: CompletionBatch) -> None:
        completions = batch.completions
        with self._lock:
            if self._stopped:  # a stopped writer never completes anything
                return
        try:
            codes = list(self._transport.complete(completions))
            if len(codes) != len(completions):
                raise TransportError(f"{len(codes)} answers to {len(completions)} completions")
        except Exception:
            self._log.exception("%s event=markers_complete_failed", self._prefix)
            codes = [int(ErrorCode.REQUEST_TIMED_OUT)] * len(completions)
        with self._lock:
            if self._stopped:
                return
            report = self._book.on_completed(batch, codes, self._clock())
        self._log_completion(report)
        if report.leadership_lost:
            self._log.info("%s event=marker_writer_leadership_lost", self._prefix)
            self.stop(timeout_s=0)

    # --- logs ----------------------------------------------------------------------

    def _log_response(
        self, batch: MarkerBatch, report: ResponseReport, failure: str | None
    ) -> None:
        if failure is not None:
            self._log.info(
                "%s event=markers_call_failed destination=%s address=%s markers=%d "
                "error=%s (retrying)",
                self._prefix,
                batch.destination,
                batch.destination.address,
                batch.marker_count,
                failure,
            )
        for key, participant, code in report.fenced:
            self._log.info(
                "%s event=markers_fenced transactional_id=%s producer_id=%d epoch=%d "
                "participant=%s code=%s (a newer coordinator or producer epoch owns it; "
                "dropping this transaction's markers)",
                self._prefix,
                key.transactional_id,
                key.producer_id,
                key.producer_epoch,
                participant,
                code_name(code),
            )
        for code, where in sorted(report.unexpected.items()):
            key, participant = where[0]
            self._log.warning(
                "%s event=marker_unexpected_error destination=%s code=%s participants=%d "
                "first=%s/%s (retrying)",
                self._prefix,
                batch.destination,
                code_name(code),
                len(where),
                key,
                participant,
            )
        if report.retriable:
            self._log.debug(
                "%s event=markers_retry destination=%s codes=%s",
                self._prefix,
                batch.destination,
                ",".join(f"{code_name(c)}x{n}" for c, n in sorted(report.retriable.items())),
            )

    def _log_completion(self, report: CompletionReport) -> None:
        for key in report.stale:
            self._log.info(
                "%s event=markers_complete_stale transactional_id=%s producer_id=%d epoch=%d "
                "(the transaction moved on)",
                self._prefix,
                key.transactional_id,
                key.producer_id,
                key.producer_epoch,
            )
        for key, code in report.unexpected:
            self._log.warning(
                "%s event=markers_complete_unexpected transactional_id=%s code=%s (retrying)",
                self._prefix,
                key.transactional_id,
                code_name(code),
            )

    def _maybe_log_summary(self) -> None:
        now = self._clock()
        if now < self._next_summary:
            return
        self._next_summary = now + self._summary_interval_s
        with self._lock:
            if not (self._active_since_summary or self._book.has_work()):
                return
            self._active_since_summary = False
            summary = self._book.metrics(now)
        self._log.info("%s event=marker_writer_metrics %s", self._prefix, _summary_line(summary))


def _summary_line(metrics: dict[str, Any]) -> str:
    queued = metrics["queued_markers"]
    return (
        f"pending_transactions={metrics['pending_transactions']} "
        f"queued={sum(queued.values())} destinations={len(queued)} "
        f"sent={metrics['markers_sent']} acked={metrics['markers_acked']} "
        f"retries={metrics['retries']} completed={metrics['completed_transactions']} "
        f"fenced={metrics['fenced_transactions']} "
        f"unroutable={metrics['unroutable_markers']} "
        f"oldest_pending_ms={metrics['oldest_pending_ms']}"
    )
