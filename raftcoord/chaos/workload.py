"""The chaos workload: transactional producers, consume-transform-produce
workers and read_committed pollers against a running cluster, every
operation recorded in a history (docs/history.md), optionally with the
nemesis breaking the cluster meanwhile.

Every client process is a thread of the one ``raftcoord workload`` process
with its own client objects (a process name in the history is a thread
here): raftcoord's client, or with ``--client kafka`` Kafka's
(confluent-kafka) through the cluster's Kafka gateways, made of the same
operations (``raftcoord/chaos/clients.py``) by
``raftcoord/chaos/kafka_clients.py``. Threads keep the
machine's load small and share one history writer, whose lock orders the
events; each client object is used by its own thread only, as the client
libraries ask.

Phases: set up (topics, the input pre-fill), traffic (``duration_s`` or a
budget of producer ``transactions``, with the nemesis), heal (every fault
ended, every node up), drain (producers end their open transaction and
resolve any unknown outcome with a new producer, workers commit the whole
input, every partition's last stable offset reaches its end, pollers catch
up), then the ``final`` read and the summary.

Deterministic given the seed: topic names, values, the number and placement
of writes, commit/abort choices and the fault schedule (which nodes a fault
hits, and which records a worker's poll returns, depend on the cluster).

One file on purpose (about 850 lines): the three kinds of client process,
their plans and the run that drives them share one history and one options
object, and the history's format (docs/history.md) is easiest to check
against the one place that writes it.
"""

from __future__ import annotations

import concurrent.futures
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from raftcoord.chaos.clients import (
    ClientModule,
    WorkloadConsumer,
    WorkloadTransactionalProducer,
)
from raftcoord.chaos.history import History
from raftcoord.chaos.nemesis import NOT_CLIENT_OPS, Nemesis
from raftcoord.chaos.options import Options
from raftcoord.client import (
    ConsumerRecord,
    KafkaError,
    KafkaTimeoutError,
    PreparedTxnState,
    TopicPartition,
    TransactionAbortableError,
)
from raftcoord.client import TransactionalProducer as NativeTransactionalProducer
from raftcoord.cluster.launcher import ClusterError, LocalCluster

__all__ = ["TxnPlan", "Workload", "input_values", "producer_plans", "worker_plans"]

TRANSACTION_TIMEOUT_MS = 30_000
#: How long commit/abort are retried after timeouts before the outcome is recorded unknown.
END_RETRY_S = 30.0
POLL_MS = 500
#: A worker's fetch size per partition: polls of about a hundred inputs keep
#: the history small when a worker goes back after an abort.
WORKER_FETCH_BYTES = 4096
#: The pre-fill's batch size: fetches return whole batches, so small ones
#: let WORKER_FETCH_BYTES bound a poll.
INPUT_BATCH_BYTES = 4096
#: How long the final read may go without moving before it gives up (its
#: total time grows with the data of the run).
FINAL_READ_STALL_S = 60.0


def client_module(kind: str) -> ClientModule:
    """The module whose Producer, TransactionalProducer, Consumer and Admin
    the workload makes its clients of (confluent-kafka is imported only for
    a run with Kafka's client)."""
    if kind == "kafka":
        from raftcoord.chaos import kafka_clients

        return kafka_clients
    import raftcoord.client

    return raftcoord.client


# --- the deterministic parts ---------------------------------------------------------


@dataclass(frozen=True)
class TxnPlan:
    """One transaction of a producer: ``(partition, value)`` writes, and
    whether it is to be committed (else aborted)."""

    writes: tuple[tuple[int, str], ...]
    commit: bool


def producer_plans(
    seed: int, process: str, partitions: int, max_writes: int, abort_ratio: float
) -> Iterator[TxnPlan]:
    """The transactions of producer ``process``: each writes 1..max_writes
    values to distinct partitions; values are ``<process>:<n>:<k>`` (the
    n-th transaction's k-th write), unique in the run."""
    rng = random.Random(f"producer:{seed}:{process}")
    n = 0
    while True:
        count = rng.randint(1, min(max_writes, partitions))
        chosen = rng.sample(range(partitions), count)
        yield TxnPlan(
            tuple((p, f"{process}:{n}:{k}") for k, p in enumerate(chosen)),
            rng.random() >= abort_ratio,
        )
        n += 1


def worker_plans(
    seed: int, process: str, records_per_transaction: int, abort_ratio: float
) -> Iterator[tuple[int, bool]]:
    """The transactions of worker ``process``: (most inputs to take, commit?)."""
    rng = random.Random(f"worker:{seed}:{process}")
    while True:
        yield rng.randint(1, records_per_transaction), rng.random() >= abort_ratio


def input_values(prefix: str, records: int, partitions: int) -> list[tuple[int, str]]:
    """The pre-filled input: ``(partition, value)``, round robin over partitions."""
    return [(i % partitions, f"{prefix}-in-{i}") for i in range(records)]


def output_value(txn: str, input_value: str) -> str:
    """A worker's output for an input, unique per attempt (the transaction)."""
    return f"{txn}|{input_value}"


# --- shared state --------------------------------------------------------------------


@dataclass
class Run:
    """What the client threads share."""

    history: History
    bootstrap: list[str]
    #: The module the clients are made of (client_module).
    clients: ClientModule
    options: Options
    prefix: str
    txn_topic: str
    input_topic: str
    output_topic: str
    group: str
    #: Set when the traffic phase ends: producers stop after their transaction.
    traffic_over: threading.Event = field(default_factory=threading.Event)
    #: Set when the drain's deadline passed: every retry loop gives up.
    give_up: threading.Event = field(default_factory=threading.Event)
    #: Set once pollers may stop when they reach ``poll_targets``.
    pollers_may_stop: threading.Event = field(default_factory=threading.Event)
    poll_targets: dict[TopicPartition, int] = field(default_factory=dict)
    budget: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    crashed: list[str] = field(default_factory=list)

    def take_transaction(self) -> bool:
        """Whether a producer may start another transaction (the budget)."""
        with self.lock:
            if self.budget is None:
                return True
            if self.budget <= 0:
                self.traffic_over.set()
                return False
            self.budget -= 1
            return True


def _failure(exc: BaseException) -> dict[str, str]:
    return {"error": type(exc).__name__, "message": str(exc)[:500]}


def _outcome_known(exc: BaseException) -> bool:
    """Whether a failed operation definitely did not happen: a retriable
    error (a timeout, a lost connection) may hide one that did."""
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, TransactionAbortableError) and isinstance(cause, KafkaError):
        return _outcome_known(cause)
    return not (isinstance(exc, KafkaError) and exc.retriable)


class _Transactional:
    """A producer or worker process: one transactional id, a producer that
    is replaced (same id) after a fatal error or an unknown outcome."""

    def __init__(self, run: Run, name: str) -> None:
        self.run = run
        self.h = run.history
        self.name = name
        self.transactional_id = f"{run.prefix}-{name}"
        self.producer: WorkloadTransactionalProducer | None = None
        self.initialized = False
        self.txn_count = 0

    def identity(self) -> dict[str, int]:
        if self.producer is None or self.producer.producer_id < 0:
            return {}
        return {
            "producer_id": self.producer.producer_id,
            "producer_epoch": self.producer.producer_epoch,
        }

    def ready(self) -> bool:
        """A producer that completed ``init``; False once the run gives up."""
        while not self.initialized:
            if self.run.give_up.is_set():
                return False
            if self.producer is None:
                self.producer = self._new_producer()
            self.h.invoke(self.name, "init")
            try:
                self._init()
            except KafkaTimeoutError as exc:  # still initializing: call again
                self.h.complete(self.name, "info", **_failure(exc))
                continue
            except KafkaError as exc:
                self.h.complete(self.name, "fail", **_failure(exc))
                self.restart()
                self.run.give_up.wait(0.5)
                continue
            self.initialized = True
            self.h.complete(self.name, "ok", **self.identity())
            self._initialized()
        return True

    def _new_producer(self) -> WorkloadTransactionalProducer:
        return self.run.clients.TransactionalProducer(
            self.run.bootstrap,
            self.transactional_id,
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
            **self.run.options.producer(),
        )

    def _init(self) -> None:
        assert self.producer is not None
        self.producer.init_transactions()

    def _initialized(self) -> None:
        """After a successful init (it may restart the producer again)."""

    def restart(self) -> None:
        """Close the producer; the next :meth:`ready` starts a new one with the
        same transactional id (its init fences the old one)."""
        if self.producer is not None:
            self.producer.close(timeout_s=5)
            self.producer = None
        self.initialized = False

    def new_txn(self) -> str:
        txn = f"{self.name}:{self.txn_count}"
        self.txn_count += 1
        assert self.producer is not None
        self.producer.begin_transaction()
        return txn

    def send(self, txn: str, topic: str, partition: int, value: str, **extra: Any) -> bool:
        """One ``send`` op, waited for; whether it succeeded."""
        assert self.producer is not None
        self.h.invoke(
            self.name,
            "send",
            txn=txn,
            topic=topic,
            partition=partition,
            value=value,
            **extra,
            **self.identity(),
        )
        try:
            future = self.producer.send(topic, value=value.encode(), partition=partition)
            metadata = future.result(timeout=self.run.options.request_timeout_ms / 1000 + 10)
        except concurrent.futures.TimeoutError:
            self.h.complete(self.name, "info", txn=txn, error="TimeoutError", message="no answer")
            return False
        except KafkaError as exc:
            self.h.complete(
                self.name, "fail" if _outcome_known(exc) else "info", txn=txn, **_failure(exc)
            )
            return False
        self.h.complete(self.name, "ok", txn=txn, offset=metadata.offset)
        return True

    def end(self, txn: str, writes: list[list[Any]], commit: bool) -> str:
        """Commit (else abort) the transaction; a refused commit is followed by
        an abort. Returns how it ended: "commit", "abort" or "unknown"."""
        if commit:
            outcome = self._end_op(txn, writes, "commit")
            if outcome != "fail":
                return "commit" if outcome == "ok" else "unknown"
        outcome = self._end_op(txn, writes, "abort")
        return "unknown" if outcome == "info" else "abort"

    def _end_op(self, txn: str, writes: list[list[Any]], op: str) -> str:
        producer = self.producer
        assert producer is not None
        call = producer.commit_transaction if op == "commit" else producer.abort_transaction
        self.h.invoke(self.name, op, txn=txn, writes=writes, **self.identity())
        deadline = time.monotonic() + END_RETRY_S
        timed_out: KafkaTimeoutError | None = None
        while True:
            try:
                call()
            except KafkaTimeoutError as exc:  # unknown yet: call again
                timed_out = exc
                if time.monotonic() < deadline and not self.run.give_up.is_set():
                    continue
                self.h.complete(self.name, "info", txn=txn, **_failure(exc))
                self.restart()
                return "info"
            except TransactionAbortableError as exc:
                # Refused (nothing committed), unless an earlier attempt timed out.
                known = timed_out is None and _outcome_known(exc)
                self.h.complete(self.name, "fail" if known else "info", txn=txn, **_failure(exc))
                if not known:
                    self.restart()
                return "fail" if known else "info"
            except KafkaError as exc:
                # A fatal error (e.g. fenced) ends the producer. An abort is then
                # definite; a commit's EndTxn may have been applied by an
                # attempt whose answer was lost, so its outcome is unknown.
                definite = op == "abort" and _outcome_known(exc)
                self.h.complete(self.name, "fail" if definite else "info", txn=txn, **_failure(exc))
                self.restart()
                return "fail" if definite else "info"
            self.h.complete(self.name, "ok", txn=txn)
            return "ok"


class TransactionalProducerProcess(_Transactional):
    """``txn-N``: transactions of unique values over the producers' topic."""

    def __init__(self, run: Run, index: int) -> None:
        super().__init__(run, f"txn-{index}")
        o = run.options
        self.plans = producer_plans(o.seed, self.name, o.partitions, o.max_writes, o.abort_ratio)

    def __call__(self) -> None:
        while not self.run.traffic_over.is_set():
            if not self.ready():
                break
            plan = next(self.plans)
            if not self.run.take_transaction():
                break
            self.transaction(plan)
        # Drain: an unknown outcome is resolved by a new producer's init.
        self.ready()
        self.restart()

    def transaction(self, plan: TxnPlan) -> None:
        txn = self.new_txn()
        topic = self.run.txn_topic
        writes: list[list[Any]] = []
        sent = True
        for partition, value in plan.writes:
            writes.append([topic, partition, value])
            if not self.send(txn, topic, partition, value):
                sent = False
                break
        self.end(txn, writes, plan.commit and sent)


@dataclass
class _Prepared:
    """A two-phase producer's transaction not ended yet: its writes, whether
    it is to be committed, and its prepared state once prepared."""

    txn: str
    writes: list[list[Any]]
    commit: bool
    state: PreparedTxnState | None = None


class TwoPhaseProducerProcess(TransactionalProducerProcess):
    """``2pc-N``: transactions of unique values, each one side of a two-phase
    commit (KIP-939): sent, prepared (flushed), then committed or aborted as
    planned. In one of three (seeded) the producer crashes once prepared: it
    is closed with the transaction prepared, as a process that dies leaves
    it, and the next incarnation keeps the transaction
    (``init_transactions(keep_prepared_txn=True)``) and ends it as planned
    when its prepared state is the one stored, else aborts it. A transaction
    whose end is unknown is kept and ended again the same way."""

    def __init__(self, run: Run, index: int) -> None:
        _Transactional.__init__(self, run, f"2pc-{index}")
        o = run.options
        self.plans = producer_plans(o.seed, self.name, o.partitions, o.max_writes, o.abort_ratio)
        self.crashes = random.Random(f"2pc-crash:{o.seed}:{self.name}")
        self.pending: _Prepared | None = None
        self.two_phase: NativeTransactionalProducer | None = None

    def _new_producer(self) -> WorkloadTransactionalProducer:
        self.two_phase = NativeTransactionalProducer(
            self.run.bootstrap,
            self.transactional_id,
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
            enable_two_phase_commit=True,
            **self.run.options.producer(),
        )
        return self.two_phase

    def _init(self) -> None:
        assert self.two_phase is not None
        self.two_phase.init_transactions(keep_prepared_txn=True)

    def _initialized(self) -> None:
        assert self.two_phase is not None
        kept = self.two_phase.prepared_state
        if kept is None:
            self.pending = None  # nothing was kept: whatever was open, the end happened
            return
        pending = self.pending or _Prepared(f"{self.name}:kept", [], False)
        commit = pending.commit and pending.state == kept
        if self.end(pending.txn, pending.writes, commit) != "unknown":
            self.pending = None

    def transaction(self, plan: TxnPlan) -> None:
        txn = self.new_txn()
        topic = self.run.txn_topic
        pending = self.pending = _Prepared(txn, [], plan.commit)
        sent = True
        for partition, value in plan.writes:
            pending.writes.append([topic, partition, value])
            if not self.send(txn, topic, partition, value):
                sent = False
                break
        if sent:
            assert self.two_phase is not None
            try:
                pending.state = self.two_phase.prepare_transaction()
            except KafkaError:
                sent = False
        if sent and self.crashes.random() < 1 / 3:
            self.restart()  # dies prepared: the next incarnation ends it
            return
        if self.end(txn, pending.writes, plan.commit and sent) != "unknown":
            self.pending = None


class WorkerProcess(_Transactional):
    """``ctp-N``: consume-transform-produce over its share of the input
    partitions, input partition p to output partition p."""

    def __init__(self, run: Run, index: int, partitions: list[int], ends: dict[int, int]) -> None:
        super().__init__(run, f"ctp-{index}")
        o = run.options
        self.plans = worker_plans(o.seed, self.name, o.records_per_transaction, o.abort_ratio)
        self.inputs = [TopicPartition(run.input_topic, p) for p in partitions]
        self.ends = {tp: ends[tp.partition] for tp in self.inputs}
        #: The group's committed offsets as this worker knows them.
        self.committed: dict[TopicPartition, int] = {}
        #: Records polled and not taken into a transaction yet, in poll order.
        self.buffer: deque[ConsumerRecord] = deque()
        self.consumer: WorkloadConsumer = run.clients.Consumer(
            run.bootstrap,
            group_id=run.group,
            isolation_level="read_committed",
            max_partition_fetch_bytes=WORKER_FETCH_BYTES,
            fetch_max_bytes=WORKER_FETCH_BYTES * len(self.inputs),
            **o.client(),
        )
        self.consumer.assign(self.inputs)
        #: What send_offsets_to_transaction takes: the group id (raftcoord's
        #: client), the consumer's group metadata (Kafka's).
        self.group_metadata: Any = run.group
        if run.options.client_kind == "kafka":
            from raftcoord.chaos.kafka_clients import Consumer as KafkaConsumer

            assert isinstance(self.consumer, KafkaConsumer)
            self.group_metadata = self.consumer.group_metadata()

    def done(self) -> bool:
        return all(self.committed.get(tp, -1) >= end for tp, end in self.ends.items())

    def __call__(self) -> None:
        try:
            self.rewind()
            while not self.run.give_up.is_set():
                if self.done():
                    if self.run.traffic_over.is_set():
                        break
                    self.run.traffic_over.wait(0.5)
                    continue
                if not self.ready():
                    break
                if not self.buffer:
                    self.buffer.extend(self.poll())
                if self.buffer:
                    self.transaction()
            self.restart()
        finally:
            self.consumer.close()

    def rewind(self) -> None:
        """Start again from the group's committed offsets (retried until known)."""
        self.buffer.clear()
        while not self.run.give_up.is_set():
            try:
                for tp in self.inputs:
                    offset = self.consumer.committed(tp)
                    self.committed[tp] = 0 if offset is None else offset
                    self.consumer.seek(tp, self.committed[tp])
                return
            except KafkaError:
                self.run.give_up.wait(0.5)

    def poll(self) -> list[ConsumerRecord]:
        self.h.invoke(
            self.name,
            "poll",
            isolation="read_committed",
            partitions=[[tp.topic, tp.partition] for tp in self.inputs],
        )
        try:
            records: list[ConsumerRecord] = self.consumer.poll(timeout_ms=POLL_MS)
        except KafkaError as exc:
            self.h.complete(self.name, "fail", **_failure(exc))
            return []
        self.h.complete(self.name, "ok", reads=_reads(records))
        return records

    def transaction(self) -> None:
        """One transaction over the next buffered records."""
        most, commit = next(self.plans)
        taken = [self.buffer.popleft() for _ in range(min(most, len(self.buffer)))]
        txn = self.new_txn()
        out = self.run.output_topic
        writes: list[list[Any]] = []
        offsets: dict[TopicPartition, int] = {}
        ok = True
        for r in taken:
            source = (r.value or b"").decode()
            value = output_value(txn, source)
            writes.append([out, r.partition, value])
            offsets[r.topic_partition] = r.offset + 1
            if not self.send(
                txn, out, r.partition, value, source=[r.topic, r.partition, r.offset, source]
            ):
                ok = False
                break
        ok = ok and self.send_offsets(txn, offsets)
        ended = self.end(txn, writes, commit and ok)
        if ended == "commit":
            self.committed.update(offsets)
        else:
            self.ready()  # an unknown outcome is settled by a new producer's init
            self.rewind()

    def send_offsets(self, txn: str, offsets: dict[TopicPartition, int]) -> bool:
        assert self.producer is not None
        self.h.invoke(
            self.name,
            "offsets",
            txn=txn,
            group=self.run.group,
            offsets=[[tp.topic, tp.partition, o] for tp, o in sorted(offsets.items())],
            **self.identity(),
        )
        try:
            self.producer.send_offsets_to_transaction(offsets, self.group_metadata)
        except KafkaError as exc:
            self.h.complete(
                self.name, "fail" if _outcome_known(exc) else "info", txn=txn, **_failure(exc)
            )
            return False
        self.h.complete(self.name, "ok", txn=txn)
        return True


def _reads(records: list[ConsumerRecord]) -> list[list[Any]]:
    return [[r.topic, r.partition, r.offset, (r.value or b"").decode()] for r in records]


class PollerProcess:
    """``poller-N``: reads every partition of the producers' and the workers'
    output topics from the beginning with read_committed, recording every
    poll, until the drain says it has caught up."""

    def __init__(self, run: Run, index: int, partitions: list[TopicPartition]) -> None:
        self.run = run
        self.name = f"poller-{index}"
        self.partitions = partitions
        self.consumer: WorkloadConsumer = run.clients.Consumer(
            run.bootstrap, isolation_level="read_committed", **run.options.client()
        )
        self.consumer.assign(partitions)
        for tp in partitions:
            self.consumer.seek(tp, 0)

    def caught_up(self) -> bool:
        if not self.run.pollers_may_stop.is_set():
            return False
        targets = self.run.poll_targets
        return all(self.consumer.position(tp) >= targets[tp] for tp in self.partitions)

    def __call__(self) -> None:
        h = self.run.history
        try:
            while not self.run.give_up.is_set() and not self.caught_up():
                h.invoke(
                    self.name,
                    "poll",
                    isolation="read_committed",
                    partitions=[[tp.topic, tp.partition] for tp in self.partitions],
                )
                try:
                    records = self.consumer.poll(timeout_ms=POLL_MS)
                except KafkaError as exc:
                    h.complete(self.name, "fail", **_failure(exc))
                    self.run.give_up.wait(0.2)
                    continue
                h.complete(self.name, "ok", reads=_reads(records))
        finally:
            self.consumer.close()


# --- the run -------------------------------------------------------------------------


class Workload:
    """One run of the workload against ``cluster``.

    Args:
        say: prints a line for the user (progress is shown by the caller).
    """

    def __init__(
        self,
        cluster: LocalCluster,
        options: Options,
        history_path: Path,
        say: Callable[[str], None] = print,
    ) -> None:
        options.check()
        if options.client_kind == "raftcoord" and not options.tls:
            options = replace(options, tls=cluster.client_tls())
        self.cluster = cluster
        self.options = options
        self.say = say
        self.prefix = f"chaos-{options.seed}"
        self.nemesis: Nemesis | None = None
        self.phase = "setup"
        self.started = time.monotonic()
        if options.client_kind == "kafka" and not cluster.kafka_gateways():
            raise ClusterError(
                "--client kafka needs the cluster's Kafka gateways: "
                "start it with `raftcoord cluster up --kafka-listeners N`"
            )
        self.history = History(history_path)
        self.run_state = Run(
            history=self.history,
            bootstrap=(
                cluster.kafka_bootstrap().split(",")
                if options.client_kind == "kafka"
                else cluster.bootstrap()
            ),
            clients=client_module(options.client_kind),
            options=options,
            prefix=self.prefix,
            txn_topic=f"{self.prefix}-txn",
            input_topic=f"{self.prefix}-input",
            output_topic=f"{self.prefix}-output",
            group=f"{self.prefix}-group",
            budget=options.transactions,
        )
        self.threads: list[threading.Thread] = []
        self.summary: dict[str, Any] = {}
        #: Whether an interrupt (Ctrl-C) ended the traffic early.
        self.interrupted = False

    # --- phases --------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Run every phase; returns the summary (also the last history event)."""
        o, r = self.options, self.run_state
        topics = {r.txn_topic: o.partitions}
        if o.workers:
            topics.update({r.input_topic: o.input_partitions, r.output_topic: o.input_partitions})
        self.history.event(
            "workload",
            "info",
            "run",
            seed=o.seed,
            args=asdict(o),
            topics=topics,
            input_topic=r.input_topic if o.workers else None,
            output_topic=r.output_topic if o.workers else None,
            group=r.group if o.workers else None,
            bootstrap=r.bootstrap,
        )
        try:
            ends = self._set_up(topics)
            self._start_clients(ends)
            self.phase = "traffic"
            self._traffic()
            self.phase = "heal"
            if self.nemesis is not None:
                self.nemesis.heal()
            self.phase = "drain"
            self._drain(topics)
            self.phase = "final read"
            self._final(topics)
        finally:
            r.give_up.set()
            r.traffic_over.set()
            if self.nemesis is not None:
                self.nemesis.stop()
            self._stop_clients()
            self.phase = "done"
            self.summary = self._summary()
            self.history.event("workload", "ok", "run", summary=self.summary)
            self.history.close()
        return self.summary

    def _set_up(self, topics: dict[str, int]) -> dict[int, int]:
        """Create the topics (refusing existing ones: a run's topics are its
        own) and pre-fill the input; returns the input's end offsets."""
        r = self.run_state
        with r.clients.Admin(r.bootstrap, **self.options.client()) as admin:
            existing = set(admin.list_topics()) & set(topics)
            if existing:
                raise ValueError(
                    f"topics {sorted(existing)} exist already (a run with seed "
                    f"{self.options.seed} was made on this cluster): use another --seed"
                )
            admin.create_topics(topics)
        if not self.options.workers:
            return {}
        self.say(f"pre-filling {r.input_topic} with {self.options.input_records} records")
        with r.clients.Producer(
            r.bootstrap, batch_size=INPUT_BATCH_BYTES, **self.options.client()
        ) as producer:
            futures = [
                producer.send(r.input_topic, value=value.encode(), partition=p)
                for p, value in input_values(
                    self.prefix, self.options.input_records, self.options.input_partitions
                )
            ]
            producer.flush()
            for future in futures:
                future.result()
        tps = [TopicPartition(r.input_topic, p) for p in range(self.options.input_partitions)]
        with r.clients.Consumer(r.bootstrap, **self.options.client()) as consumer:
            return {tp.partition: end for tp, end in consumer.end_offsets(tps).items()}

    def _start_clients(self, ends: dict[int, int]) -> None:
        o, r = self.options, self.run_state
        polled = [TopicPartition(r.txn_topic, p) for p in range(o.partitions)]
        if o.workers:
            polled += [TopicPartition(r.output_topic, p) for p in range(o.input_partitions)]
        processes: list[Callable[[], None]] = []
        processes += [TransactionalProducerProcess(r, i) for i in range(o.producers)]
        processes += [TwoPhaseProducerProcess(r, i) for i in range(o.two_phase_producers)]
        processes += [
            WorkerProcess(r, i, list(range(i, o.input_partitions, o.workers)), ends)
            for i in range(o.workers)
        ]
        processes += [PollerProcess(r, i, polled) for i in range(o.pollers)]
        for process in processes:
            name = getattr(process, "name", "process")
            thread = threading.Thread(
                target=self._guarded, args=(name, process), name=name, daemon=True
            )
            self.threads.append(thread)
        for thread in self.threads:
            thread.start()

    def _guarded(self, name: str, process: Callable[[], None]) -> None:
        try:
            process()
        except Exception as exc:  # reported in the summary; the run goes on
            self.run_state.crashed.append(f"{name}: {type(exc).__name__}: {exc}")
            self.say(f"{name} crashed: {type(exc).__name__}: {exc}")

    def _traffic(self) -> None:
        o, r = self.options, self.run_state
        nemesis_thread = None
        if o.nemesis:
            self.nemesis = Nemesis(
                self.cluster, self.history, o.nemesis, o.fault_interval_s, o.seed, self.say
            )
            nemesis_thread = threading.Thread(target=self.nemesis.run, name="nemesis", daemon=True)
            nemesis_thread.start()
        end = None if o.duration_s is None else time.monotonic() + o.duration_s
        latest = None if o.duration_s is None else time.monotonic() + 2 * o.duration_s
        producers = [t for t in self.threads if t.name.startswith(("txn-", "2pc-"))]
        extended = False
        try:
            while not r.traffic_over.wait(0.2):
                if end is not None and time.monotonic() >= end:
                    waiting = (
                        o.every_fault
                        and self.nemesis is not None
                        and not self.nemesis.every_kind_happened()
                        and latest is not None
                        and time.monotonic() < latest
                    )
                    if not waiting:
                        break
                    if not extended:
                        self.say("going on until every fault kind has happened once")
                        extended = True
                if end is None and not any(t.is_alive() for t in producers):
                    break  # every producer crashed: the budget can never be spent
        except KeyboardInterrupt:
            self.interrupted = True
            self.say("interrupted: healing and draining (interrupt again to stop at once)")
        finally:
            r.traffic_over.set()
            if self.nemesis is not None and nemesis_thread is not None:
                self.nemesis.stop()
                nemesis_thread.join()

    def _drain(self, topics: dict[str, int]) -> None:
        r = self.run_state
        deadline = time.monotonic() + self.options.drain_timeout_s
        writers = [t for t in self.threads if t.name.startswith(("txn-", "2pc-", "ctp-"))]
        for thread in writers:
            thread.join(max(0.0, deadline - time.monotonic()))
        tps = [TopicPartition(t, p) for t, n in topics.items() for p in range(n)]
        client = self.options.client()
        with (
            r.clients.Consumer(
                r.bootstrap, isolation_level="read_committed", **client
            ) as committed,
            r.clients.Consumer(
                r.bootstrap, isolation_level="read_uncommitted", **client
            ) as uncommitted,
        ):
            stable: dict[TopicPartition, int] = {}

            def settled() -> bool:
                try:
                    stable.clear()
                    stable.update(committed.end_offsets(tps))
                    return bool(stable == uncommitted.end_offsets(tps))
                except KafkaError:
                    return False

            if LocalCluster.wait_until(
                settled, max(1.0, deadline - time.monotonic()), "", raise_on_timeout=False
            ):
                r.poll_targets.update(stable)
                r.pollers_may_stop.set()
            else:
                self.say("drain: some partitions still have an open transaction")
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        late = [t.name for t in self.threads if t.is_alive()]
        if late:
            self.say(f"drain: {late} did not finish within {self.options.drain_timeout_s} s")
        self._stop_clients()

    def _stop_clients(self) -> None:
        """Make every client thread give up and wait for it (each gives up
        within about one request timeout)."""
        self.run_state.give_up.set()
        for thread in self.threads:
            thread.join(self.options.request_timeout_ms / 1000 + 5)

    def _final(self, topics: dict[str, int]) -> None:
        """The ``final`` event: every partition read completely (read_committed),
        the high watermarks and the workers' committed offsets."""
        r = self.run_state
        tps = [TopicPartition(t, p) for t, n in topics.items() for p in range(n)]
        client = self.options.client()
        # No fault is running now: the reader is patient, and asks for little
        # per Fetch, so that a node slow to filter a long log (read_committed)
        # answers each request well within the timeout.
        patient = {**client, "request_timeout_ms": 60_000, "fetch_max_bytes": 1 << 20}
        with (
            r.clients.Consumer(r.bootstrap, isolation_level="read_committed", **patient) as reader,
            r.clients.Consumer(r.bootstrap, isolation_level="read_uncommitted", **client) as latest,
        ):
            ends = latest.end_offsets(tps)
            stable = reader.end_offsets(tps)
            reader.assign(tps)
            for tp in tps:
                reader.seek(tp, 0)
            reads: list[list[Any]] = []
            wait_ms = POLL_MS
            while behind := {
                tp: reader.position(tp) for tp in tps if reader.position(tp) < stable[tp]
            }:
                # A poll returns when it has records or at its deadline, which is
                # also each Fetch's: after a poll that moved no position the next
                # is given twice as long (a node filtering a long log may need
                # seconds to answer a Fetch), up to FINAL_READ_STALL_S. Polls
                # start short: one that moved the positions to the end over
                # aborted data and markers alone returns nothing, at its deadline.
                polled = _reads(reader.poll(timeout_ms=wait_ms))
                reads += polled
                if polled or any(reader.position(tp) > at for tp, at in behind.items()):
                    continue
                if wait_ms >= FINAL_READ_STALL_S * 1000:
                    raise KafkaTimeoutError(
                        f"the final read got nothing for {FINAL_READ_STALL_S} s"
                    )
                wait_ms = min(2 * wait_ms, int(FINAL_READ_STALL_S * 1000))
        committed: dict[str, int | None] = {}
        if self.options.workers:
            inputs = [tp for tp in tps if tp.topic == r.input_topic]
            with r.clients.Consumer(r.bootstrap, group_id=r.group, **client) as group:
                committed = {f"{tp.topic}/{tp.partition}": group.committed(tp) for tp in inputs}
        self.history.event(
            "workload",
            "ok",
            "final",
            reads=reads,
            end_offsets={f"{tp.topic}/{tp.partition}": ends[tp] for tp in tps},
            committed=committed,
        )

    # --- reporting -----------------------------------------------------------------

    def progress(self) -> dict[str, Any]:
        """Counts so far, for a live display."""
        counts = self.history.counts()
        return {
            "phase": self.phase,
            "elapsed_s": time.monotonic() - self.started,
            "commits": counts[("commit", "ok")],
            "aborts": counts[("abort", "ok")],
            "failures": sum(n for (op, t), n in counts.items() if t == "fail"),
            "unknown": sum(
                n for (op, t), n in counts.items() if t == "info" and op not in NOT_CLIENT_OPS
            ),
            "faults": self.nemesis.current() if self.nemesis is not None else [],
            "faults_done": sum(self.nemesis.done.values()) if self.nemesis is not None else 0,
        }

    def _summary(self) -> dict[str, Any]:
        counts = self.history.counts()
        ops: dict[str, dict[str, int]] = {}
        for (op, type_), n in sorted(counts.items()):
            if op in NOT_CLIENT_OPS:
                continue
            ops.setdefault(op, {"invoke": 0, "ok": 0, "fail": 0, "info": 0})[type_] = n
        return {
            "seed": self.options.seed,
            "elapsed_s": round(time.monotonic() - self.started, 1),
            "ops": ops,
            "faults": dict(self.nemesis.done) if self.nemesis is not None else {},
            "fault_report": self.nemesis.report() if self.nemesis is not None else [],
            "crashed": list(self.run_state.crashed),
            "unfinished": sorted(self.history.outstanding()),
        }
