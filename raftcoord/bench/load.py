"""Client load spread over processes, so that the GIL of one Python client
does not cap what a cluster is asked to do.

:func:`run_load` starts ``processes`` client processes (spawned, never
forked: gRPC does not survive a fork) and splits the ``concurrency`` actors
over them, one thread each. Every actor gets ready (a producer with its
producer id, or a channel), then all start together, repeat their step for
``duration_s`` and report what they saw. The cluster's CPU (utime + stime of
every node process) is read just before the start and after the last report,
and each client process reports its own CPU, so the two are told apart.

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

import multiprocessing
import queue
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import grpc

from raftcoord.bench.stats import cpu_deltas_s, cpu_of
from raftcoord.client import KafkaError, Producer, RecordMetadata, TransactionalProducer
from raftcoord.protocol.tls import SslFiles
from raftcoord.protocol.v1 import admin_pb2, admin_pb2_grpc

KINDS = ("transactions", "idempotent", "ping")
CALL_TIMEOUT_S = 30.0


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
        self._open()

    def _open(self) -> None:
        work = self.work
        if work.kind == "ping":
            self.channel = grpc.insecure_channel(work.bootstrap[0])
            self.stub = admin_pb2_grpc.CoordinatorAdminStub(self.channel)
            self.stub.Ping(admin_pb2.PingRequest(), timeout=CALL_TIMEOUT_S)
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

    def step(self, outcome: Outcome) -> bool:
        """One call, transaction or flush; False (counted in ``outcome``) on failure."""
        started = time.perf_counter()
        try:
            if self.producer is None and self.channel is None:  # the last reopen failed
                self._open()
            if self.work.kind == "ping":
                self.stub.Ping(admin_pb2.PingRequest(), timeout=CALL_TIMEOUT_S)
                committing, sent = started, 0
            else:
                committing, sent = self._produce(started)
        except (KafkaError, grpc.RpcError) as exc:
            outcome.failed += 1
            outcome.errors[type(exc).__name__] += 1
            self._recover()
            return False
        ended = time.perf_counter()
        outcome.latencies.append(ended - started)
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

    def _recover(self) -> None:
        """Abort a failed transaction; when even that fails, drop the producer
        (what it still holds fails at once): the next step opens a new one,
        whose InitProducerId fences the old."""
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
    """One client process: ``count`` actors, one thread each."""
    try:
        actors = [Actor(work, first_index + k) for k in range(count)]
    except Exception as exc:  # reported to the parent, which stops the run
        ready.put(f"{type(exc).__name__}: {exc}")
        return
    ready.put("ready")
    go.wait()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    outcomes = [Outcome() for _ in actors]

    def loop(actor: Actor, outcome: Outcome) -> None:
        while time.perf_counter() - t0 < duration_s:
            actor.step(outcome)
        outcome.elapsed_s = time.perf_counter() - t0

    threads = [
        threading.Thread(target=loop, args=pair, daemon=True)
        for pair in zip(actors, outcomes, strict=True)
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


def split(total: int, parts: int) -> list[int]:
    """``total`` spread as evenly as possible over at most ``parts`` non-empty parts."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_load(
    work: Work,
    concurrency: int,
    duration_s: float,
    processes: int,
    cluster_pids: list[int],
    setup_timeout_s: float = 120.0,
) -> LoadResult:
    """``concurrency`` actors over ``processes`` client processes for ``duration_s``."""
    context = multiprocessing.get_context("spawn")
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    procs = []
    first = 0
    for count in split(concurrency, processes):
        proc = context.Process(
            target=_client_process,
            args=(work, first, count, duration_s, ready, go, results),
            daemon=True,
        )
        proc.start()
        procs.append(proc)
        first += count
    try:
        for _ in procs:
            try:
                message = ready.get(timeout=setup_timeout_s)
            except queue.Empty:
                raise RuntimeError(
                    f"client processes not ready in {setup_timeout_s:.0f} s"
                ) from None
            if message != "ready":
                raise RuntimeError(f"a client process failed to start: {message}")
        cpu0 = cpu_of(cluster_pids)
        go.set()
        outcome = Outcome()
        for _ in procs:
            outcome.merge(results.get(timeout=duration_s + setup_timeout_s))
        cpu1 = cpu_of(cluster_pids)
        for proc in procs:
            proc.join(timeout=30)
        return LoadResult(concurrency, outcome, cpu_deltas_s(cpu0, cpu1))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
