"""Client load spread over processes, so that the GIL of one Python client
does not cap what a cluster is asked to do.

:func:`run_load` starts ``processes`` client processes (spawned, never
forked: gRPC does not survive a fork) and splits the ``concurrency`` actors
over them, one thread each. Every actor gets ready (a producer with its
producer id, or a channel), then all start together, repeat their step for
``duration_s`` and report what they saw. The cluster's CPU (utime + stime of
every node process) is read just before the start and after the last report,
and each client process reports its own CPU, so the two are told apart.

A :class:`ClientPool` keeps its client processes between loads: a run of
many short load steps (``raftcoord bench``) starts them once instead of
spawning and importing them again for every step. Given one, :func:`run_load`
uses its first processes; without one it starts processes for that load
alone. Either way the actors of a load are new (their producers are made
before the start and closed after the report), so a step measures the same.

Actors (:class:`Work` ``kind``):

* ``transactions``: a :class:`~raftcoord.client.TransactionalProducer`
  running ``begin_transaction``, ``records`` sends of ``value_bytes`` over
  its ``partitions`` partitions (or sends for ``interval_s`` when given),
  ``commit_transaction``. Actor k writes partitions ``k * partitions`` and
  on, modulo the topic's; with ``rotate``, its n-th step writes those of
  ``(k + n) * partitions`` and on, so that every transaction writes other
  partitions than the one before (a producer as users run one);
* ``idempotent``: a :class:`~raftcoord.client.Producer` doing the same with
  ``flush`` in place of the transaction;
* ``ping``: the empty ``CoordinatorAdmin.Ping`` call on ``bootstrap[0]``.
"""

from __future__ import annotations

import logging
import multiprocessing
import queue
import signal
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka
import grpc

from raftcoord.bench.stats import (
    cpu_deltas_s,
    cpu_of,
    cpu_ticks,
    speed_probe_ms,
    steal_ticks,
)
from raftcoord.client import KafkaError, Producer, RecordMetadata, TransactionalProducer
from raftcoord.protocol.process import LOG_FORMAT, OneLineFormatter
from raftcoord.protocol.tls import SslFiles
from raftcoord.protocol.v1 import admin_pb2, admin_pb2_grpc

#: ``kafka``: a confluent-kafka transactional producer through a Kafka
#: gateway (``Work.bootstrap``: the gateway's address).
KINDS = ("transactions", "idempotent", "ping", "kafka")
CALL_TIMEOUT_S = 30.0
#: An open loop's steps not begun by this many times the load's duration
#: are left out (counted among the errors): the offered load was not kept up.
BEHIND_FACTOR = 2.0
#: How often a client process waiting for work checks that its parent still runs.
PARENT_CHECK_S = 1.0


@dataclass(frozen=True)
class Work:
    """What each actor does (see the module's doc)."""

    kind: str
    bootstrap: Sequence[str]
    topic: str = "bench"
    topic_partitions: int = 6
    partitions: int = 2  # partitions one transaction writes to
    records: int = 2  # records per transaction (or per flush)
    value_bytes: int = 100
    interval_s: float = 0.0  # > 0: send for this long, then commit (or flush)
    id_prefix: str = "bench"
    #: > 0: open loop, each actor starting a step every ``period_s`` on a
    #: schedule (the offered load), its latency counted from the scheduled
    #: start, however late the step began; 0: the next step as soon as the
    #: last one ends.
    period_s: float = 0.0
    rotate: bool = False  # each step writes the next partitions (see the module's doc)
    #: The clients' TLS files (``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile``) of
    #: a cluster with TLS; empty: plaintext.
    tls: SslFiles = field(default_factory=lambda: SslFiles())

    def transactional_id(self, index: int) -> str:
        """The transactional id of actor ``index``'s producer."""
        return f"{self.id_prefix}-{index}"


@dataclass
class Outcome:
    """What actors saw: latencies (s) of completed steps, counts, errors."""

    latencies: list[float] = field(default_factory=list)  # whole step
    commit_latencies: list[float] = field(default_factory=list)  # commit (or flush) only
    completed: int = 0
    records: int = 0
    failed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    elapsed_s: float = 0.0  # from the start to the last step's end
    client_cpu_s: float = 0.0

    def merge(self, other: Outcome) -> None:
        self.latencies.extend(other.latencies)
        self.commit_latencies.extend(other.commit_latencies)
        self.completed += other.completed
        self.records += other.records
        self.failed += other.failed
        self.errors.update(other.errors)
        self.elapsed_s = max(self.elapsed_s, other.elapsed_s)
        self.client_cpu_s += other.client_cpu_s


@dataclass
class LoadResult:
    """One :func:`run_load`: the merged outcome and the cluster's CPU."""

    concurrency: int
    outcome: Outcome
    #: pid -> CPU seconds of that cluster process over the run.
    node_cpu_s: dict[int, float]
    #: The machine-speed probe around the run (ms, the slower of before
    #: and after: :func:`raftcoord.bench.stats.speed_probe_ms`), and the
    #: share of the machine's CPU time stolen by its hypervisor meanwhile.
    probe_ms: float = 0.0
    steal_share: float = 0.0

    @property
    def cluster_cpu_s(self) -> float:
        """The CPU seconds of all the cluster's processes over the run."""
        return sum(self.node_cpu_s.values())

    @property
    def rate(self) -> float:
        """Completed steps per second."""
        return self.outcome.completed / self.outcome.elapsed_s if self.outcome.elapsed_s else 0.0

    @property
    def record_rate(self) -> float:
        return self.outcome.records / self.outcome.elapsed_s if self.outcome.elapsed_s else 0.0

    def cpu_ms_per_step(self, cpu_s: float) -> float:
        return cpu_s * 1000 / self.outcome.completed if self.outcome.completed else 0.0


class Actor:
    """One producer (or channel) and its step."""

    def __init__(self, work: Work, index: int) -> None:
        if work.kind not in KINDS:
            raise ValueError(f"unknown kind {work.kind!r}; use one of {KINDS}")
        self.work = work
        self.index = index
        self.value = bytes(work.value_bytes)
        self.steps = 0
        self.producer: Producer | None = None
        self.channel: grpc.Channel | None = None
        self.kafka: Any = None  # a confluent_kafka.Producer
        self._open()

    def _open(self) -> None:
        work = self.work
        if work.kind == "ping":
            self.channel = grpc.insecure_channel(work.bootstrap[0])
            self.stub = admin_pb2_grpc.CoordinatorAdminStub(self.channel)
            self.stub.Ping(admin_pb2.PingRequest(), timeout=CALL_TIMEOUT_S)
        elif work.kind == "kafka":
            kafka = confluent_kafka.Producer(
                {
                    "bootstrap.servers": ",".join(work.bootstrap),
                    "transactional.id": work.transactional_id(self.index),
                    "linger.ms": 0,
                }
            )
            kafka.init_transactions(CALL_TIMEOUT_S)
            self.kafka = kafka
        elif work.kind == "idempotent":
            self.producer = Producer(list(work.bootstrap), **work.tls)
            self.producer.partitions_for(work.topic)
        else:
            producer = TransactionalProducer(
                list(work.bootstrap),
                transactional_id=work.transactional_id(self.index),
                **work.tls,
            )
            try:
                producer.init_transactions()
                producer.partitions_for(work.topic)
            except KafkaError:
                producer.close(0)
                raise
            self.producer = producer

    def close(self, timeout_s: float | None = None) -> None:
        if self.producer is not None:
            self.producer.close(timeout_s)
            self.producer = None
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        self.kafka = None  # librdkafka's handle ends with its last reference

    def step(self, outcome: Outcome, scheduled: float | None = None) -> bool:
        """One call, transaction or flush; False (counted in ``outcome``) on
        failure. Its latency counts from ``scheduled`` when given (an open
        loop's step that begins late waited that long)."""
        started = time.perf_counter()
        try:
            if self.producer is None and self.channel is None and self.kafka is None:
                self._open()  # the last reopen failed
            if self.work.kind == "ping":
                self.stub.Ping(admin_pb2.PingRequest(), timeout=CALL_TIMEOUT_S)
                committing, sent = started, 0
            elif self.work.kind == "kafka":
                committing, sent = self._produce_kafka()
            else:
                committing, sent = self._produce(started)
        except (KafkaError, grpc.RpcError, confluent_kafka.KafkaException) as exc:
            outcome.failed += 1
            outcome.errors[type(exc).__name__] += 1
            self._recover()
            return False
        ended = time.perf_counter()
        outcome.latencies.append(ended - (started if scheduled is None else scheduled))
        outcome.commit_latencies.append(ended - committing)
        outcome.completed += 1
        outcome.records += sent
        return True

    def partitions(self) -> list[int]:
        """The partitions this step writes."""
        work = self.work
        first = (self.index + (self.steps if work.rotate else 0)) * work.partitions
        return [(first + i) % work.topic_partitions for i in range(work.partitions)]

    def _produce(self, started: float) -> tuple[float, int]:
        """The records of one transaction (or flush): (when the commit or
        flush began, records sent)."""
        assert self.producer is not None
        work = self.work
        if isinstance(self.producer, TransactionalProducer):
            self.producer.begin_transaction()
        futures: list[Future[RecordMetadata]] = []
        partitions = self.partitions()
        self.steps += 1
        sent = 0
        while sent < work.records or time.perf_counter() - started < work.interval_s:
            partition = partitions[sent % len(partitions)]
            futures.append(self.producer.send(work.topic, self.value, partition=partition))
            sent += 1
        committing = time.perf_counter()
        if isinstance(self.producer, TransactionalProducer):
            self.producer.commit_transaction()
        else:
            self.producer.flush(CALL_TIMEOUT_S)
            for future in futures:
                future.result(timeout=0)  # raises the send's error
        return committing, sent

    def _produce_kafka(self) -> tuple[float, int]:
        """One transaction of confluent-kafka's: a record on each of the
        step's partitions, then the commit."""
        work = self.work
        partitions = self.partitions()
        self.steps += 1
        self.kafka.begin_transaction()
        for i in range(work.records):
            self.kafka.produce(work.topic, self.value, partition=partitions[i % len(partitions)])
        committing = time.perf_counter()
        self.kafka.commit_transaction(CALL_TIMEOUT_S)
        return committing, work.records

    def _recover(self) -> None:
        """Abort a failed transaction; when even that fails, drop the producer
        (what it still holds fails at once): the next step opens a new one,
        whose InitProducerId fences the old."""
        if self.kafka is not None:
            try:
                self.kafka.abort_transaction(CALL_TIMEOUT_S)
                return
            except confluent_kafka.KafkaException:
                self.close(timeout_s=0)
                return
        if isinstance(self.producer, TransactionalProducer):
            try:
                self.producer.abort_transaction()
                return
            except KafkaError:
                pass
        if self.work.kind != "ping":
            self.close(timeout_s=0)


def _client_process(
    work: Work,
    first_index: int,
    count: int,
    duration_s: float,
    ready: Any,
    go: Any,
    results: Any,
) -> None:
    """One load in a client process: ``count`` actors, one thread each."""
    try:
        # Made at once (each producer's InitProducerId is a Raft commit): the
        # set-up is not measured, only waited for.
        with ThreadPoolExecutor(max_workers=count) as pool:
            actors = list(pool.map(lambda k: Actor(work, first_index + k), range(count)))
    except Exception as exc:  # reported to the parent, which stops the run
        ready.put(f"{type(exc).__name__}: {exc}")
        return
    ready.put("ready")
    while not go.wait(PARENT_CHECK_S):
        if _parent_gone():
            return
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    outcomes = [Outcome() for _ in actors]

    threads = [
        threading.Thread(
            target=run_actor, args=(actor, outcome, work.period_s, t0, duration_s), daemon=True
        )
        for actor, outcome in zip(actors, outcomes, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    merged = Outcome()
    for outcome in outcomes:
        merged.merge(outcome)
    merged.client_cpu_s = time.process_time() - cpu0
    results.put(merged)
    for actor in actors:
        actor.close()


def run_actor(actor: Any, outcome: Outcome, period_s: float, t0: float, duration_s: float) -> None:
    """``actor``'s steps from ``t0`` (:func:`time.perf_counter`) for
    ``duration_s``: one after the other (``period_s`` 0), or in open loop,
    one every ``period_s`` on a schedule offset by the actor's index (see
    :attr:`Work.period_s`, :data:`BEHIND_FACTOR`)."""
    if period_s <= 0:
        while time.perf_counter() - t0 < duration_s:
            actor.step(outcome)
    else:  # spread over the period by the golden ratio, the same each run
        due = t0 + (actor.index * 0.6180339887 % 1.0) * period_s
        while due - t0 < duration_s:
            now = time.perf_counter()
            if now - t0 >= BEHIND_FACTOR * duration_s:
                # The cluster does not keep up with the offered load: what is
                # left of the schedule is counted, not run.
                while due - t0 < duration_s:
                    outcome.errors["not begun: behind the schedule"] += 1
                    due += period_s
                break
            if due > now:
                time.sleep(due - now)  # the schedule is the offered load
            actor.step(outcome, scheduled=due)
            due += period_s
    outcome.elapsed_s = time.perf_counter() - t0


def _client_logging() -> None:
    """A client process's log lines: warnings and above (the client library's
    own, say a leader that moved), in the nodes' format."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(LOG_FORMAT))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])


def _parent_gone() -> bool:
    parent = multiprocessing.parent_process()
    return parent is not None and not parent.is_alive()


def _client_worker(commands: Any, ready: Any, go: Any, results: Any) -> None:
    """A pooled client process: one load per command until ``None``, or
    until the process that started it is gone. Ctrl-C is left to that
    process, which stops its pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _client_logging()
    while True:
        try:
            command = commands.get(timeout=PARENT_CHECK_S)
        except queue.Empty:
            if _parent_gone():
                return
            continue
        if command is None:
            return
        work, first_index, count, duration_s = command
        _client_process(work, first_index, count, duration_s, ready, go, results)


def split(total: int, parts: int) -> list[int]:
    """``total`` spread as evenly as possible over at most ``parts`` non-empty parts."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


class ClientPool:
    """``processes`` client processes (spawned, never forked: gRPC does not
    survive a fork), started once and given one load after another by
    :func:`run_load`. A load that fails leaves the pool closed."""

    def __init__(self, processes: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._ready, self._results, self._go = context.Queue(), context.Queue(), context.Event()
        self._commands = [context.Queue() for _ in range(processes)]
        self._procs = [
            context.Process(
                target=_client_worker,
                args=(commands, self._ready, self._go, self._results),
                daemon=True,
            )
            for commands in self._commands
        ]
        for proc in self._procs:
            proc.start()
        self.closed = False

    @property
    def size(self) -> int:
        return len(self._procs)

    @property
    def pids(self) -> list[int]:
        """The client processes' pids, in the order loads are given to them."""
        return [proc.pid for proc in self._procs if proc.pid is not None]

    def __enter__(self) -> ClientPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, grace_s: float = 30.0) -> None:
        """Ask every process to end after its load (its producers closed), and
        kill what is still running ``grace_s`` later."""
        if self.closed:
            return
        self.closed = True
        for commands in self._commands:
            commands.put(None)
        deadline = time.monotonic() + grace_s
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)

    def load(
        self,
        work: Work,
        concurrency: int,
        duration_s: float,
        processes: int,
        cluster_pids: list[int],
        setup_timeout_s: float = 120.0,
    ) -> LoadResult:
        """``concurrency`` actors over the first ``processes`` processes for ``duration_s``."""
        if self.closed:
            raise RuntimeError("the client pool is closed")
        parts = split(concurrency, processes)
        if len(parts) > self.size:
            raise ValueError(f"{len(parts)} client processes asked of a pool of {self.size}")
        try:
            first = 0
            for commands, count in zip(self._commands, parts, strict=False):
                commands.put((work, first, count, duration_s))
                first += count
            for _ in parts:
                try:
                    message = self._ready.get(timeout=setup_timeout_s)
                except queue.Empty:
                    raise RuntimeError(
                        f"client processes not ready in {setup_timeout_s:.0f} s"
                    ) from None
                if message != "ready":
                    raise RuntimeError(f"a client process failed to start: {message}")
            cpu0 = cpu_of(cluster_pids)
            self._go.set()
            outcome = Outcome()
            for _ in parts:
                outcome.merge(self._results.get(timeout=duration_s + setup_timeout_s))
            cpu1 = cpu_of(cluster_pids)
            # Every process has passed the start (each reported): the next load waits again.
            self._go.clear()
        except BaseException:
            self.close(grace_s=0.0)
            raise
        return LoadResult(concurrency, outcome, cpu_deltas_s(cpu0, cpu1))


def run_load(
    work: Work,
    concurrency: int,
    duration_s: float,
    processes: int,
    cluster_pids: list[int],
    setup_timeout_s: float = 120.0,
    pool: ClientPool | None = None,
) -> LoadResult:
    """``concurrency`` actors over ``processes`` client processes for
    ``duration_s``: those of ``pool``, or processes started for this load;
    with the machine-speed probe and the stolen time around it."""
    probe_ms, steal = speed_probe_ms(), steal_ticks()
    ticks = cpu_ticks()
    if pool is not None:
        result = pool.load(work, concurrency, duration_s, processes, cluster_pids, setup_timeout_s)
    else:
        with ClientPool(len(split(concurrency, processes))) as own:
            result = own.load(
                work, concurrency, duration_s, processes, cluster_pids, setup_timeout_s
            )
    result.probe_ms = max(probe_ms, speed_probe_ms())
    elapsed = cpu_ticks() - ticks
    result.steal_share = (steal_ticks() - steal) / elapsed if elapsed > 0 else 0.0
    return result
