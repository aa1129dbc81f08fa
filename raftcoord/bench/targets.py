"""The main benchmark: a local cluster against its machine's own ceilings and
the performance targets, in one run so that the ratios hold on a noisy machine.

Run: ``raftcoord bench`` (about 10 minutes; ``--quick`` about 50 s on 2
cores, docs/performance.md says where the time goes). Every cluster is a
:class:`~raftcoord.cluster.launcher.LocalCluster` it starts itself in a
temporary directory (under ``--dir``): 3 coordinators x 3 shards, 3
partition-log nodes, fsync always, a topic of 6 partitions. Every load step
runs in the same client processes (a :class:`~raftcoord.bench.load.ClientPool`
started once). Phases (docs/performance.md says what each measures and how):

1. ceilings: the empty ``CoordinatorAdmin.Ping`` call on a coordinator (1 and
   32 concurrent callers), a bare Raft commit through a shard (InitProducerId
   of a transactional id with no open transaction: one Raft entry, no
   markers, one caller) and the disk's fsyncs/s in the cluster directory;
2. end to end through the public client: transactions of 2 records of 100
   bytes on 2 partitions at 1, 8, 32 and 128 concurrent producers, and of 10
   records at 32;
3. one client process, as users run producers: 1, 8 and 32 producer
   threads, each transaction writing 2 other partitions than the one before,
   then idempotent producers flushing 2 records the same way; the CPU of
   every node, with the shards each coordinator leads;
4. transactional against idempotent producers committing (or flushing)
   every 100 ms;
5. failover: kill -9 of a shard leader under load, time to the first commit
   on that shard, repeated;
6. open transactions (on a fresh cluster): coordinator RSS and the cost of a
   transaction at 100, 10K and 100K open transactions;
7. scaling: committed txn/s against the shard count (a cluster each).

Prints a rich table of every figure and one of the targets; ``--json PATH``
writes the same data.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table

from raftcoord.bench import counts
from raftcoord.bench.load import Actor, ClientPool, LoadResult, Outcome, Work, run_load
from raftcoord.bench.progress import Steps
from raftcoord.bench.stats import (
    Target,
    machine,
    percentile,
    probe_moved,
    rss_bytes,
    wide_console,
)
from raftcoord.client import Admin
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.routing import shard_for
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

COORDINATORS = 3
SHARDS = 3
PARTITION_NODES = 3
TOPIC = "bench"
TOPIC_PARTITIONS = 6
#: The one-process phase's topic of one replica per partition, beside TOPIC.
SINGLE_REPLICA_TOPIC = "bench-rf1"
TXN_TIMEOUT_MS = 900_000  # the maximum: no open transaction times out during a run
CALL_TIMEOUT_S = 30.0
OPEN_WINDOW = 256  # open-transaction requests in flight at once
REFUSED_BACKOFF_S = 0.2  # before retrying refused opens


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


@dataclass
class Options:
    seconds: float
    producers: list[int]
    one_process: list[int]
    raft_n: int
    open_levels: list[int]
    open_budget_s: float
    failovers: int
    scale_shards: list[int]
    kafka: list[int]
    offered: list[int]
    processes: int
    parent: str | None
    skip: set[str]
    #: The client processes every load step uses (started once per run).
    pool: ClientPool | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Options:
        quick = bool(args.quick)

        def pick(value: Any, full: Any, small: Any) -> Any:
            return value if value is not None else (small if quick else full)

        return cls(
            seconds=pick(args.seconds, 6.0, 1.5),
            producers=pick(args.producers, [1, 8, 32, 128], [1, 8, 32]),
            one_process=pick(args.one_process, [1, 8, 32], [1, 32]),
            raft_n=pick(args.raft_n, 300, 50),
            open_levels=pick(args.open, [10_000, 100_000], [1_000]),
            open_budget_s=pick(args.open_budget_s, 240.0, 20.0),
            failovers=pick(args.failovers, 5, 1),
            scale_shards=pick(args.scale_shards, [1, 2, 3, 4, 5, 6], [1, 3]),
            kafka=pick(args.kafka, [1, 8, 32], [1, 32]),
            offered=pick(args.offered, [150, 600], [150, 600]),
            processes=args.client_processes,
            parent=args.dir,
            skip=args.skip,
        )

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "pool"} | {"skip": sorted(self.skip)}

    def load(
        self, work: Work, concurrency: int, cluster: LocalCluster, processes: int | None = None
    ) -> LoadResult:
        """One load step of ``seconds`` against ``cluster``, in the
        run's client processes (the first ``processes`` of them)."""
        return run_load(
            work,
            concurrency,
            self.seconds,
            processes or self.processes,
            pids(cluster),
            pool=self.pool,
        )


# --- clusters ----------------------------------------------------------------------


@contextlib.contextmanager
def local_cluster(
    parent: str | None,
    shards: int,
    tls: bool = False,
    metrics: bool = True,
    replication_factor: int | None = None,
    kafka_listeners: int = 0,
) -> Iterator[LocalCluster]:
    """A running cluster with the benchmark's topic (with ``tls``, every gRPC
    connection over mutual TLS; ``metrics``: every process serves metrics;
    ``replication_factor``: the topic's, None for the cluster's default;
    ``kafka_listeners``: Kafka gateways); stopped on the way out."""
    with tempfile.TemporaryDirectory(prefix="raftcoord-bench-", dir=parent) as workdir:
        cluster = LocalCluster(workdir)
        try:
            cluster.up(
                COORDINATORS,
                shards,
                fsync="always",
                partition_nodes=PARTITION_NODES,
                timeout_s=60.0,
                tls=tls,
                metrics=metrics,
                kafka_listeners=kafka_listeners,
            )
            with Admin(bootstrap(cluster), **cluster.client_tls()) as admin:
                admin.create_topics(
                    {TOPIC: TOPIC_PARTITIONS}, replication_factor=replication_factor
                )
            yield cluster
        finally:
            if cluster.state is not None:
                cluster.down()


def bootstrap(cluster: LocalCluster) -> list[str]:
    return [n.grpc for n in cluster.coordinators()]


def pids(cluster: LocalCluster) -> list[int]:
    assert cluster.state is not None
    return [n.pid for n in cluster.state.nodes]


def txn_work(cluster: LocalCluster, prefix: str, records: int = 2) -> Work:
    return Work(
        "transactions",
        bootstrap(cluster),
        TOPIC,
        TOPIC_PARTITIONS,
        records=records,
        id_prefix=prefix,
    )


# --- figures -----------------------------------------------------------------------


def load_figures(result: LoadResult) -> dict[str, Any]:
    """The figures of one load step, in ms and per second."""
    out = result.outcome
    return {
        "concurrency": result.concurrency,
        "completed": out.completed,
        "failed": out.failed,
        "errors": dict(out.errors),
        "seconds": round(out.elapsed_s, 3),
        "per_s": round(result.rate, 1),
        "records_per_s": round(result.record_rate, 1),
        "p50_ms": round(percentile(out.latencies, 50) * 1000, 3),
        "p99_ms": round(percentile(out.latencies, 99) * 1000, 3),
        "p999_ms": round(percentile(out.latencies, 99.9) * 1000, 3),
        "commit_p50_ms": round(percentile(out.commit_latencies, 50) * 1000, 3),
        "cluster_cpu_ms_per_op": round(result.cpu_ms_per_step(result.cluster_cpu_s), 3),
        "client_cpu_ms_per_op": round(result.cpu_ms_per_step(out.client_cpu_s), 3),
        "cluster_cores": round(result.cluster_cpu_s / out.elapsed_s, 2) if out.elapsed_s else 0,
        "probe_ms": round(result.probe_ms, 3),
        "steal_share": round(result.steal_share, 4),
    }


def _error(answer: Any) -> ErrorCode:
    if answer.error_code != ErrorCode.NONE:
        return ErrorCode(answer.error_code)
    for result in getattr(answer, "results", ()):
        if result.error_code != ErrorCode.NONE:
            return ErrorCode(result.error_code)
    return ErrorCode.NONE


def init_request(tid: str) -> Any:
    return coordinator_pb2.InitProducerIdRequest(
        transactional_id=tid, transaction_timeout_ms=TXN_TIMEOUT_MS
    )


# --- phases ------------------------------------------------------------------------


def ceilings(
    cluster: LocalCluster, options: Options, step: Callable[[str], None]
) -> dict[str, Any]:
    ping: list[dict[str, Any]] = []
    leader = cluster.state.node(cluster.leaders()[0]) if cluster.state else None
    assert leader is not None
    for callers in (1, 32):
        step(f"ceilings: Ping, {plural(callers, 'caller')}")
        work = Work("ping", [leader.grpc])
        ping.append(load_figures(options.load(work, callers, cluster)))
    step("ceilings: bare Raft commit")
    tid = "bench-raft-commit"
    with Admin(bootstrap(cluster)) as admin:
        address = admin.find_coordinator(tid)
    latencies = []
    errors = 0
    with grpc.insecure_channel(address) as channel:
        stub = coordinator_pb2_grpc.TransactionCoordinatorStub(channel)
        stub.InitProducerId(init_request(tid), timeout=CALL_TIMEOUT_S)
        for _ in range(options.raft_n):
            started = time.perf_counter()
            answer = stub.InitProducerId(init_request(tid), timeout=CALL_TIMEOUT_S)
            if _error(answer) is ErrorCode.NONE:
                latencies.append(time.perf_counter() - started)
            else:
                errors += 1
    step("ceilings: disk fsyncs/s")
    return {
        "ping": ping,
        "raft_commit": {
            "request": "InitProducerId, same transactional id, no open transaction",
            "n": options.raft_n,
            "errors": errors,
            "p50_ms": round(percentile(latencies, 50) * 1000, 3),
            "p99_ms": round(percentile(latencies, 99) * 1000, 3),
        },
        "disk": {
            "fsyncs_per_s": round(fsyncs_per_s(cluster.data_dir, min(2.0, options.seconds)), 1)
        },
    }


def fsyncs_per_s(directory: Path, seconds: float) -> float:
    """4 KiB appended and fsynced, again and again, for ``seconds``."""
    path = directory / "bench-fsync.tmp"
    block = bytes(4096)
    count = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            os.write(fd, block)
            os.fsync(fd)
            count += 1
        return count / (time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()


def counted_load(
    cluster: LocalCluster, options: Options, work: Work, concurrency: int
) -> dict[str, Any]:
    """One load step's figures (:func:`load_figures`) and, under ``counts``,
    what a committed transaction cost by the nodes' own counters read
    around it (:func:`raftcoord.bench.counts.per_transaction`)."""
    before = counts.read(cluster)
    figures = load_figures(options.load(work, concurrency, cluster))
    spent = counts.per_transaction(before, counts.read(cluster), figures["completed"])
    return {**figures, "counts": spent}


def end_to_end(
    cluster: LocalCluster, options: Options, step: Callable[[str], None]
) -> list[dict[str, Any]]:
    rows = []
    shapes = [(n, 2) for n in options.producers] + [
        (32 if 32 in options.producers else max(options.producers), 10)
    ]
    for producers, records in shapes:
        step(f"end to end: {plural(producers, 'producer')}, {records} records per transaction")
        work = txn_work(cluster, f"e2e-{producers}-{records}", records)
        figures = counted_load(cluster, options, work, producers)
        rows.append({"producers": producers, "records_per_txn": records, **figures})
    return rows


#: The producers of the open-loop phase.
OFFERED_PRODUCERS = 32


def offered_loads(
    cluster: LocalCluster, options: Options, step: Callable[[str], None]
) -> list[dict[str, Any]]:
    """32 producers end to end (2 records per transaction) in open loop at
    each offered rate: each producer begins a transaction every 32 / rate
    seconds on a schedule, its latency counted from the scheduled begin."""
    rows = []
    for rate in options.offered:
        step(f"open loop: {rate} txn/s offered over {OFFERED_PRODUCERS} producers")
        work = dataclasses.replace(
            txn_work(cluster, f"offered-{rate}"), period_s=OFFERED_PRODUCERS / rate
        )
        figures = counted_load(cluster, options, work, OFFERED_PRODUCERS)
        rows.append(
            {
                "producers": OFFERED_PRODUCERS,
                "records_per_txn": 2,
                "offered_per_s": rate,
                **figures,
            }
        )
    return rows


def kafka_phase(
    cluster: LocalCluster, options: Options, step: Callable[[str], None]
) -> list[dict[str, Any]]:
    """confluent-kafka transactional producers through the cluster's Kafka
    gateway, each transaction a record on each of 2 partitions other than
    the one before, with the end-to-end steps' figures and counts (the
    cluster's CPU includes the gateway's)."""
    rows = []
    gateways = [n.kafka for n in cluster.kafka_gateways()]
    for producers in options.kafka:
        step(f"Kafka gateway: {plural(producers, 'confluent-kafka producer')}")
        work = Work(
            "kafka",
            gateways,
            TOPIC,
            TOPIC_PARTITIONS,
            records=2,
            id_prefix=f"kafka-{producers}",
            rotate=True,
        )
        figures = counted_load(cluster, options, work, producers)
        rows.append({"producers": producers, "records_per_txn": 2, **figures})
    return rows


#: What the one-process phase calls each kind of producer.
PRODUCER_KINDS = {"transactions": "transactional producer", "idempotent": "idempotent producer"}
#: How the one-process tables name each kind of producer.
KIND_LABELS = {"transactions": "txn", "idempotent": "idempotent"}


def node_roles(cluster: LocalCluster) -> list[dict[str, Any]]:
    """Each node: id, pid, kind and, for a coordinator, the shards it leads now."""
    assert cluster.state is not None
    leaders = cluster.leaders()
    return [
        {
            "node_id": n.node_id,
            "pid": n.pid,
            "kind": n.kind,
            "leads": sorted(s for s, leader in leaders.items() if leader == n.node_id),
        }
        for n in cluster.state.nodes
    ]


def one_process(
    cluster: LocalCluster, options: Options, step: Callable[[str], None]
) -> dict[str, Any]:
    """Producers as users run them: threads of one client process, every
    transaction (or flush) writing one record to each of 2 other partitions
    than the one before; the CPU of each node. On the benchmark's topic (the
    cluster's default replication factor), then the same steps on a topic of
    one replica per partition made beside it."""
    with Admin(bootstrap(cluster), **cluster.client_tls()) as admin:
        admin.create_topics(
            {SINGLE_REPLICA_TOPIC: TOPIC_PARTITIONS}, replication_factor=1, exist_ok=True
        )
        described = admin.describe_topics([TOPIC, SINGLE_REPLICA_TOPIC])
    roles = node_roles(cluster)
    rows = []
    steps = itertools.product(
        (TOPIC, SINGLE_REPLICA_TOPIC), ("transactions", "idempotent"), options.one_process
    )
    for topic, kind, threads in steps:
        factor = described[topic].replication_factor
        step(
            f"one client process, {plural(factor, 'replica')}: "
            f"{plural(threads, PRODUCER_KINDS[kind])}"
        )
        work = Work(
            kind,
            bootstrap(cluster),
            topic,
            TOPIC_PARTITIONS,
            id_prefix=f"one-rf{factor}-{kind}-{threads}",
            rotate=True,
        )
        result = options.load(work, threads, cluster, processes=1)
        elapsed = result.outcome.elapsed_s
        node_cpu = {
            str(r["node_id"]): round(100 * result.node_cpu_s.get(r["pid"], 0.0) / elapsed, 1)
            if elapsed
            else 0.0
            for r in roles
        }
        shards = sorted(
            {shard_for(work.transactional_id(i), SHARDS) for i in range(threads)}
            if kind == "transactions"
            else set()
        )
        rows.append(
            {
                "kind": kind,
                "producers": threads,
                "replication_factor": factor,
                **load_figures(result),
                "node_cpu_percent": node_cpu,
                "transaction_shards": shards,
            }
        )
    return {"nodes": roles, "rows": rows}


def interval_commits(
    cluster: LocalCluster, options: Options, step: Callable[[str], None]
) -> dict[str, Any]:
    producers = 8
    result: dict[str, Any] = {"producers": producers, "commit_interval_ms": 100}
    for kind in ("transactions", "idempotent"):
        step(f"100 ms commits: {kind}")
        work = Work(
            kind, bootstrap(cluster), TOPIC, TOPIC_PARTITIONS, interval_s=0.1, id_prefix="interval"
        )
        result[kind] = load_figures(options.load(work, producers, cluster))
    idem = result["idempotent"]["records_per_s"]
    result["ratio"] = round(result["transactions"]["records_per_s"] / idem, 3) if idem else 0.0
    return result


def failover(
    cluster: LocalCluster, options: Options, step: Callable[[str], None]
) -> dict[str, Any]:
    """kill -9 of shard 0's leader while 4 producers of shard 0's ids commit
    (threads of this process); the time from the kill to the commit of the
    first transaction begun after it (a commit answered just after the kill
    may have been decided before it, and proves nothing about the new
    leader). The node is started again between kills (not after the last
    one: this is the last phase on its cluster)."""
    assert cluster.state is not None
    shard = 0
    prefix = "failover"
    indexes = [
        i for i in range(10**5) if shard_for(f"{prefix}-{i}", cluster.state.shard_count) == shard
    ][:4]
    work = txn_work(cluster, prefix)
    actors = [Actor(work, i) for i in indexes]
    #: (began, committed) of each committed transaction.
    commits: list[tuple[float, float]] = []
    outcomes = [Outcome() for _ in actors]
    stop = threading.Event()
    lock = threading.Lock()

    def loop(actor: Actor, outcome: Outcome) -> None:
        while not stop.is_set():
            began = time.monotonic()
            if actor.step(outcome):
                with lock:
                    commits.append((began, time.monotonic()))

    threads = [
        threading.Thread(target=loop, args=pair, daemon=True)
        for pair in zip(actors, outcomes, strict=True)
    ]
    for thread in threads:
        thread.start()
    times: list[float] = []
    try:
        for k in range(options.failovers):
            step(f"failover {k + 1}/{options.failovers}")
            LocalCluster.wait_until(lambda: len(commits) > 0, 60.0, "no commit before the kill")
            victim = cluster.wait_for_leaders()[shard]
            killed_at = time.monotonic()
            cluster.kill(victim)
            LocalCluster.wait_until(
                lambda t=killed_at: any(began > t for began, _ in list(commits)),
                60.0,
                "no transaction begun after the kill committed",
            )
            with lock:
                first = min(done for began, done in commits if began > killed_at)
            times.append(first - killed_at)
            if k + 1 < options.failovers:  # after the last kill the cluster is stopped
                cluster.start(victim, timeout_s=60.0)
                cluster.wait_for_leaders(60.0)
            with lock:
                commits.clear()
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        for actor in actors:
            actor.close()
    outcome = Outcome()
    for part in outcomes:
        outcome.merge(part)
    return {
        "runs_s": [round(t, 3) for t in times],
        "median_s": round(statistics.median(times), 3) if times else 0.0,
        "failed_during_failover": outcome.failed,
        "errors": dict(outcome.errors),
    }


def open_transactions(
    cluster: LocalCluster, options: Options, step: Callable[[str], None]
) -> dict[str, Any]:
    """Open transactions (InitProducerId + AddPartitionsToTxn, never ended) with
    the generated stubs, many in flight; RSS and cost per transaction at each level.
    An id refused (a leader moved, say) is tried again with fresh routes."""
    assert cluster.state is not None
    coordinators = cluster.coordinators()
    shard_count = cluster.state.shard_count
    probes: dict[int, str] = {}
    for i in range(10**6):
        probes.setdefault(shard_for(f"open-{i}", shard_count), f"open-{i}")
        if len(probes) == shard_count:
            break
    stubs: dict[str, Any] = {}
    channels: list[grpc.Channel] = []

    def routes(admin: Admin) -> dict[int, Any]:
        found = {}
        for shard, tid in probes.items():
            address = admin.find_coordinator(tid)
            if address not in stubs:
                channels.append(grpc.insecure_channel(address))
                stubs[address] = coordinator_pb2_grpc.TransactionCoordinatorStub(channels[-1])
            found[shard] = stubs[address]
        return found

    def rss_mb() -> list[float]:
        return [round(rss_bytes(n.pid) / 1e6, 1) for n in coordinators]

    def cost(level: int) -> dict[str, Any]:
        step(f"open transactions: cost per transaction at {level}")
        work = txn_work(cluster, f"cost-{level}")
        return load_figures(options.load(work, 8, cluster))

    levels: list[dict[str, Any]] = [{"open": 0, "rss_mb": rss_mb()}]
    opened = 0
    next_id = 0
    retry: list[str] = []
    errors: Counter[str] = Counter()
    spent = 0.0
    budget_hit = False
    try:
        with Admin(bootstrap(cluster)) as admin:
            route = routes(admin)
            for level in [100, *options.open_levels]:
                step(f"open transactions: opening up to {level}")
                started = time.perf_counter()
                while (
                    opened < level
                    and spent + (time.perf_counter() - started) < options.open_budget_s
                ):
                    fresh = max(0, min(OPEN_WINDOW, level - opened) - len(retry))
                    batch = retry + [f"open-{i}" for i in range(next_id, next_id + fresh)]
                    next_id += fresh
                    good, retry, refused = _open_batch(route, shard_count, batch)
                    opened += good
                    errors.update(refused)
                    if retry:  # a leader moved or is loading: let it settle
                        time.sleep(REFUSED_BACKOFF_S)
                        route = routes(admin)
                spent += time.perf_counter() - started
                budget_hit = opened < level
                levels.append({"open": opened, "requested": level, "rss_mb": rss_mb()})
                levels[-1]["cost"] = cost(opened)
                if budget_hit:
                    break
    finally:
        for channel in channels:
            channel.close()
    base = max(levels[0]["rss_mb"])
    top = levels[-1]
    per_10k = (max(top["rss_mb"]) - base) / top["open"] * 10_000 if top["open"] else 0.0
    first_cost = levels[1]["cost"]["cluster_cpu_ms_per_op"]
    last_cost = top["cost"]["cluster_cpu_ms_per_op"]
    return {
        "levels": levels,
        "opened": opened,
        "refused_and_retried": dict(errors),
        "open_rate_per_s": round(opened / spent, 1) if spent else 0.0,
        "budget_s": options.open_budget_s,
        "budget_hit": budget_hit,
        "rss_mb_per_10k": round(per_10k, 2),
        "cost_growth": round(last_cost / first_cost, 3) if first_cost else 0.0,
    }


def _open_batch(
    route: dict[int, Any], shard_count: int, tids: list[str]
) -> tuple[int, list[str], Counter[str]]:
    """InitProducerId for every id at once, then AddPartitionsToTxn for those
    that got one: (opened, the ids to try again, why they failed)."""
    stubs = {tid: route[shard_for(tid, shard_count)] for tid in tids}
    inits = {
        tid: stubs[tid].InitProducerId.future(init_request(tid), timeout=CALL_TIMEOUT_S)
        for tid in tids
    }
    adds = {}
    failed: list[str] = []
    why: Counter[str] = Counter()

    def refused(tid: str, method: str, reason: str) -> None:
        failed.append(tid)
        why[f"{method} {reason}"] += 1

    for k, (tid, future) in enumerate(inits.items()):
        try:
            answer = future.result()
        except grpc.RpcError as exc:
            refused(tid, "InitProducerId", exc.code().name)
            continue
        if _error(answer) is not ErrorCode.NONE:
            refused(tid, "InitProducerId", _error(answer).name)
            continue
        request = coordinator_pb2.AddPartitionsToTxnRequest(
            transactional_id=tid,
            producer_id=answer.producer_id,
            producer_epoch=answer.producer_epoch,
            topics=[common_pb2.TopicPartitions(topic=TOPIC, partitions=[k % TOPIC_PARTITIONS])],
        )
        adds[tid] = stubs[tid].AddPartitionsToTxn.future(request, timeout=CALL_TIMEOUT_S)
    for tid, future in adds.items():
        try:
            error = _error(future.result())
        except grpc.RpcError as exc:
            refused(tid, "AddPartitionsToTxn", exc.code().name)
            continue
        if error is not ErrorCode.NONE:
            refused(tid, "AddPartitionsToTxn", error.name)
    return len(tids) - len(failed), failed, why


def scaling(options: Options, step: Callable[[str], None]) -> list[dict[str, Any]]:
    rows = []
    for shards in options.scale_shards:
        step(f"scaling: {plural(shards, 'shard')}")
        with local_cluster(options.parent, shards) as cluster:
            work = txn_work(cluster, f"scale-{shards}")
            figures = load_figures(options.load(work, 32, cluster))
        rows.append({"shards": shards, **figures})
    return rows


# --- targets and tables ------------------------------------------------------------


def _row(rows: list[dict[str, Any]], **match: int | str) -> dict[str, Any] | None:
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()):
            return row
    return None


def targets(results: dict[str, Any]) -> list[Target]:
    """The issue's targets, each from figures of this one run (None: the
    phase it needs was skipped)."""
    ceil = results.get("ceilings")
    e2e = results.get("end_to_end", [])
    one = _row(e2e, producers=1, records_per_txn=2)
    many = _row(e2e, producers=32, records_per_txn=2)
    kafka32 = _row(results.get("kafka", []), producers=32)
    ping32 = _row(ceil["ping"], concurrency=32) if ceil else None
    interval = results.get("txn_vs_idempotent")
    opened = results.get("open_transactions")
    fail = results.get("failover")
    alone = results.get("one_process", {}).get("rows", [])

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    return [
        Target(
            "1 producer: txn p50 / bare Raft commit p50",
            ratio(one["p50_ms"] if one else None, ceil["raft_commit"]["p50_ms"] if ceil else None),
            3.0,
            at_most=True,
            unit="x",
        ),
        Target(
            "32 producers: txn/s / Ping calls/s (32 callers)",
            ratio(many["per_s"] if many else None, ping32["per_s"] if ping32 else None),
            0.35,
            at_most=False,
            unit="x",
        ),
        Target("32 producers: txn p99", many["p99_ms"] if many else None, 50.0, True, "ms"),
        Target(
            "32 producers: cluster CPU per txn",
            many["cluster_cpu_ms_per_op"] if many else None,
            1.5,
            at_most=True,
            unit="ms",
        ),
        *batched_path_targets(many, ping32),
        Target(
            "confluent-kafka through a gateway, 32 producers: cluster CPU per txn",
            kafka32["cluster_cpu_ms_per_op"] if kafka32 else None,
            4.5,
            at_most=True,
            unit="ms",
        ),
        *(t for factor in factors(alone) for t in one_process_targets(alone, factor)),
        Target(
            "100 ms commits: transactional / idempotent",
            interval["ratio"] if interval else None,
            0.97,
            at_most=False,
            unit="x",
        ),
        Target(
            "coordinator RSS per 10K open txns",
            opened["rss_mb_per_10k"] if opened else None,
            50.0,
            at_most=True,
            unit="MB",
        ),
        Target("failover, median", fail["median_s"] if fail else None, 1.0, True, "s"),
        Target(
            "cost per txn, most open / 100 open",
            opened["cost_growth"] if opened else None,
            1.2,
            at_most=True,
            unit="x",
        ),
    ]


def batched_path_targets(
    many: dict[str, Any] | None, ping32: dict[str, Any] | None
) -> list[Target]:
    """The batched data path's targets at 32 producers end to end (the rows
    above them are the longer-term goal), CPU and latency from the step's
    figures, fsyncs and adds from the nodes' counters."""
    spent = many.get("counts", {}) if many else {}
    fsyncs = spent.get("fsyncs", {}).get(counts.KINDS["partition-log"])
    adds = spent.get("calls", {}).get(f"{counts.KINDS['coordinator']} AddPartitionsToTxn")
    where = "32 producers (batched path)"
    return [
        Target(
            f"{where}: cluster CPU per txn",
            many["cluster_cpu_ms_per_op"] if many else None,
            3.0,
            at_most=True,
            unit="ms",
        ),
        Target(
            f"{where}: client CPU per txn",
            many["client_cpu_ms_per_op"] if many else None,
            1.0,
            at_most=True,
            unit="ms",
        ),
        Target(
            f"{where}: txn/s / Ping calls/s (32 callers)",
            many["per_s"] / ping32["per_s"] if many and ping32 and ping32["per_s"] else None,
            0.12,
            at_most=False,
            unit="x",
        ),
        Target(f"{where}: txn p99", many["p99_ms"] if many else None, 150.0, True, "ms"),
        Target(f"{where}: partition-log fsyncs per txn", fsyncs, 4.0, at_most=True),
        Target(f"{where}: AddPartitionsToTxn calls per txn", adds, 1.0, at_most=True),
    ]


def factors(rows: list[dict[str, Any]]) -> list[int]:
    """The replication factors of the one-process rows, one replica first
    (the shape the one-process targets were set on); [1] when none ran."""
    return sorted({int(r["replication_factor"]) for r in rows} | {1})


def one_process_targets(rows: list[dict[str, Any]], factor: int) -> list[Target]:
    """The one-process targets on the topic of ``factor`` replicas."""
    one = _row(rows, producers=1, kind="transactions", replication_factor=factor)
    many = _row(rows, producers=32, kind="transactions", replication_factor=factor)
    flush = _row(rows, producers=1, kind="idempotent", replication_factor=factor)
    where = f"one process, {plural(factor, 'replica')}"
    return [
        Target(f"{where}, 1 producer: txn/s", one["per_s"] if one else None, 74.0, False),
        Target(
            f"{where}, 1 producer: cluster CPU per txn",
            one["cluster_cpu_ms_per_op"] if one else None,
            10.0,
            at_most=True,
            unit="ms",
        ),
        Target(f"{where}, 32 producers: txn/s", many["per_s"] if many else None, 450.0, False),
        Target(
            f"{where}, 1 idempotent producer: flushes/s",
            flush["per_s"] if flush else None,
            450.0,
            at_most=False,
        ),
    ]


def _table(title: str, header: list[str], rows: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    return table


def _load_cells(f: dict[str, Any]) -> list[str]:
    """A load step's cells; its rate marked ``!`` when the machine's speed
    moved during it (:func:`mark_moved_steps`)."""
    return [
        f"{f['per_s']:.0f}" + ("!" if f.get("probe_moved") else ""),
        f"{f['p50_ms']:.1f}",
        f"{f['p99_ms']:.1f}",
        f"{f['p999_ms']:.1f}",
        f"{f['cluster_cpu_ms_per_op']:.2f}",
        f"{f['client_cpu_ms_per_op']:.2f}",
        f"{f['cluster_cores']:.2f}",
        str(f["failed"]),
    ]


LOAD_HEADER = [
    "/s",
    "p50 ms",
    "p99 ms",
    "p999 ms",
    "cluster CPU ms/op",
    "client CPU ms/op",
    "cluster cores",
    "failed",
]


def mark_moved_steps(results: dict[str, Any]) -> int:
    """Mark (``probe_moved``) every load step of ``results`` whose
    machine-speed probe is more than 10 % off the run's at its start;
    returns how many were."""
    reference = results.get("machine", {}).get("probe_ms", 0.0)
    moved = 0

    def visit(value: Any) -> None:
        nonlocal moved
        if isinstance(value, dict):
            if "probe_ms" in value and "per_s" in value:
                value["probe_moved"] = probe_moved(value["probe_ms"], reference)
                moved += value["probe_moved"]
            for child in value.values():
                visit(child)
        elif isinstance(value, list):
            for child in value:
                visit(child)

    visit({k: v for k, v in results.items() if k != "machine"})
    return moved


def tables(results: dict[str, Any]) -> list[Table]:
    """The run as rich tables: one per phase that ran, then the targets."""
    out = []
    ceil = results.get("ceilings")
    if ceil:
        rows = [
            [f"Ping, {plural(f['concurrency'], 'caller')}", *_load_cells(f)] for f in ceil["ping"]
        ]
        raft = ceil["raft_commit"]
        rows.append(
            ["bare Raft commit, 1 caller", "", f"{raft['p50_ms']:.1f}", f"{raft['p99_ms']:.1f}"]
            + [""] * 4
            + [str(raft["errors"])]
        )
        rows.append(["disk fsyncs/s", f"{ceil['disk']['fsyncs_per_s']:.0f}"] + [""] * 7)
        out.append(_table("ceilings", ["call", *LOAD_HEADER], rows))
    if results.get("end_to_end"):
        out.append(
            _table(
                "end to end, public client (/s: committed txn/s; latency: begin to commit)",
                ["producers x records", *LOAD_HEADER],
                [
                    [f"{f['producers']} x {f['records_per_txn']}", *_load_cells(f)]
                    for f in results["end_to_end"]
                ],
            )
        )
        out.append(counts_table(results, "end_to_end", "end to end"))
    if results.get("offered"):
        out.append(
            _table(
                f"open loop, {OFFERED_PRODUCERS} producers (/s: committed txn/s; latency: from "
                "the scheduled begin to commit)",
                ["offered txn/s", *LOAD_HEADER],
                [[str(f["offered_per_s"]), *_load_cells(f)] for f in results["offered"]],
            )
        )
    if results.get("kafka"):
        out.append(
            _table(
                "confluent-kafka through a Kafka gateway (/s: committed txn/s; latency: begin "
                "to commit; cluster CPU with the gateway's)",
                ["producers x records", *LOAD_HEADER],
                [
                    [f"{f['producers']} x {f['records_per_txn']}", *_load_cells(f)]
                    for f in results["kafka"]
                ],
            )
        )
        out.append(counts_table(results, "kafka", "through a Kafka gateway"))
    alone = results.get("one_process")
    if alone:
        out.append(one_process_table(alone))
        out.append(replication_table(alone["rows"]))
    interval = results.get("txn_vs_idempotent")
    if interval:
        out.append(
            _table(
                f"{interval['producers']} producers committing (or flushing) every "
                f"{interval['commit_interval_ms']} ms; ratio {interval['ratio']:.3f}",
                ["producer", "records/s", *LOAD_HEADER[1:]],
                [
                    [
                        kind,
                        f"{interval[kind]['records_per_s']:.0f}",
                        *_load_cells(interval[kind])[1:],
                    ]
                    for kind in ("transactions", "idempotent")
                ],
            )
        )
    fail = results.get("failover")
    if fail:
        out.append(
            _table(
                "failover: kill -9 of shard 0's leader under load",
                ["runs s", "median s", "failed during failover"],
                [
                    [
                        ", ".join(f"{t:.2f}" for t in fail["runs_s"]),
                        f"{fail['median_s']:.2f}",
                        str(fail["failed_during_failover"]),
                    ]
                ],
            )
        )
    opened = results.get("open_transactions")
    if opened:
        title = (
            f"open transactions: opened at {opened['open_rate_per_s']:.0f}/s, "
            f"{opened['rss_mb_per_10k']:.1f} MB RSS per 10K"
        )
        if opened["budget_hit"]:
            title += f"; budget of {opened['budget_s']:.0f} s hit at {opened['opened']}"
        retried = sum(opened["refused_and_retried"].values())
        if retried:
            title += f"; {retried} refused and retried"
        rows = []
        for level in opened["levels"]:
            cost = level.get("cost")
            rss = " / ".join(f"{m:.0f}" for m in level["rss_mb"])
            cells = _load_cells(cost) if cost else [""] * len(LOAD_HEADER)
            rows.append([str(level["open"]), rss, *cells])
        out.append(_table(title, ["open", "coordinator RSS MB", *LOAD_HEADER], rows))
    if results.get("scaling"):
        out.append(
            _table(
                "scaling: 32 producers against the shard count",
                ["shards", *LOAD_HEADER],
                [[str(f["shards"]), *_load_cells(f)] for f in results["scaling"]],
            )
        )
    out.append(
        _table(
            "targets",
            ["target", "bound", "measured", "margin (≥ 1: met)", "verdict"],
            [t.as_row() for t in targets(results)],
        )
    )
    return out


def counts_table(results: dict[str, Any], phase: str, title: str) -> Table:
    """Per committed transaction of each step of ``phase``, from the nodes'
    counters (:mod:`raftcoord.bench.counts`), and its cluster CPU in calls
    of Ping (the ceilings' cheapest call, when they ran)."""
    steps = [
        (f"{f['producers']} x {f['records_per_txn']}", f.get("counts", {})) for f in results[phase]
    ]
    header, rows = counts.rows(steps)
    ping = results.get("ceilings", {}).get("ping")
    if ping:
        unit = max(ping, key=lambda f: f["concurrency"])["cluster_cpu_ms_per_op"]
        rows.insert(
            0,
            [
                "cluster CPU, in Ping calls",
                *(
                    f"{f['cluster_cpu_ms_per_op'] / unit:.1f}" if unit else ""
                    for f in results[phase]
                ),
            ],
        )
    return _table(f"{title}, per committed transaction (the nodes' own counters)", header, rows)


def one_process_table(alone: dict[str, Any]) -> Table:
    """The one-process phase: a row per producer kind and count, with the
    CPU of every node (% of one core) in a column named after its role:
    ``cN(S)`` coordinator N leading shards S, ``pN`` partition-log node N."""
    nodes = alone["nodes"]

    def role(node: dict[str, Any]) -> str:
        if node["kind"] != "coordinator":
            return f"p{node['node_id']} %"
        return f"c{node['node_id']}({','.join(str(s) for s in node['leads'])}) %"

    rows = []
    for f in alone["rows"]:
        shards = ",".join(str(s) for s in f["transaction_shards"]) or "-"
        kind = KIND_LABELS[f["kind"]]
        per_s, p50, p99, _, cluster_cpu, client_cpu, _, failed = _load_cells(f)
        rows.append(
            [
                f"{f['producers']} {kind}",
                str(f["replication_factor"]),
                shards,
                per_s,
                p50,
                p99,
                cluster_cpu,
                client_cpu,
                *(f"{f['node_cpu_percent'][str(n['node_id'])]:.0f}" for n in nodes),
                failed,
            ]
        )
    return _table(
        "one client process, each transaction (or flush) on 2 other partitions than the last, "
        "on a topic of the default replication factor and on one of 1 replica "
        "(/s: committed txn/s or flushes/s; node columns: % of one core, cN(S) coordinator N "
        "leading shards S, pN partition-log node N)",
        ["producers", "replicas", "ids' shards", "/s", "p50 ms", "p99 ms", "cluster CPU ms/op"]
        + ["client CPU ms/op"]
        + [role(n) for n in nodes]
        + ["failed"],
        rows,
    )


def replication_table(rows: list[dict[str, Any]]) -> Table:
    """What replicas cost in the one-process phase: for each kind and
    producer count, the replicated row's figures over the one-replica row's."""
    single = {(r["kind"], r["producers"]): r for r in rows if r["replication_factor"] == 1}
    cells = []
    for f in rows:
        base = single.get((f["kind"], f["producers"]))
        if f["replication_factor"] == 1 or base is None or not base["per_s"]:
            continue
        kind = KIND_LABELS[f["kind"]]
        cells.append(
            [
                f"{f['producers']} {kind}, RF {f['replication_factor']} / RF 1",
                f"{f['per_s'] / base['per_s']:.2f}",
                *(
                    f"{f[k] / base[k]:.2f}" if base[k] else "-"
                    for k in ("p50_ms", "p99_ms", "cluster_cpu_ms_per_op")
                ),
            ]
        )
    return _table(
        "replicated partitions: the one-process figures on the topic of the default "
        "replication factor over those on the topic of one replica (same run)",
        ["producers", "/s", "p50 ms", "p99 ms", "cluster CPU ms/op"],
        cells,
    )


def failed_transactions(results: dict[str, Any]) -> int:
    """Failed steps of every load phase but failover (where some are expected)."""
    loads: list[dict[str, Any]] = list(results.get("end_to_end", []))
    loads += results.get("one_process", {}).get("rows", [])
    loads += results.get("scaling", [])
    interval = results.get("txn_vs_idempotent")
    if interval:
        loads += [interval["transactions"], interval["idempotent"]]
    opened = results.get("open_transactions")
    if opened:
        loads += [level["cost"] for level in opened["levels"] if "cost" in level]
    return sum(int(f["failed"]) for f in loads)


def run(args: argparse.Namespace) -> int:
    options = Options.from_args(args)
    console = Console(stderr=True)
    started = time.monotonic()
    results: dict[str, Any] = {
        "machine": machine(),
        "options": options.as_json(),
    }
    phases = {
        "ceilings": 4,
        "e2e": len(options.producers) + 1,
        "one-process": 4 * len(options.one_process),
        "interval": 2,
        "failover": options.failovers,
        "kafka": 1 + len(options.kafka),
        "offered": len(options.offered),
        "open": 2 * (1 + len(options.open_levels)),
        "scaling": len(options.scale_shards),
    }
    total = 1 + sum(n for name, n in phases.items() if name not in options.skip)
    with Steps(console, total) as step, ClientPool(options.processes) as pool:
        options.pool = pool
        step("starting the cluster")
        with local_cluster(options.parent, SHARDS) as cluster:
            if "ceilings" not in options.skip:
                results["ceilings"] = ceilings(cluster, options, step)
            if "e2e" not in options.skip:
                results["end_to_end"] = end_to_end(cluster, options, step)
            if "offered" not in options.skip:
                results["offered"] = offered_loads(cluster, options, step)
            if "one-process" not in options.skip:
                results["one_process"] = one_process(cluster, options, step)
            if "interval" not in options.skip:
                results["txn_vs_idempotent"] = interval_commits(cluster, options, step)
            if "failover" not in options.skip:
                results["failover"] = failover(cluster, options, step)
        if "kafka" not in options.skip:
            step("starting a cluster with a Kafka gateway")
            with local_cluster(options.parent, SHARDS, kafka_listeners=1) as cluster:
                results["kafka"] = kafka_phase(cluster, options, step)
        if "open" not in options.skip:
            with local_cluster(options.parent, SHARDS) as cluster:
                results["open_transactions"] = open_transactions(cluster, options, step)
        if "scaling" not in options.skip:
            results["scaling"] = scaling(options, step)
        step.finish()
    results["failed_transactions"] = failed_transactions(results)
    results["targets"] = [
        {"name": t.name, "value": t.value, "bound": t.bound, "at_most": t.at_most, "met": t.met}
        for t in targets(results)
    ]
    results["machine"]["loadavg_end"] = list(os.getloadavg())
    results["steps_on_another_speed"] = mark_moved_steps(results)
    results["wall_s"] = round(time.monotonic() - started, 1)
    out = wide_console()
    for table in tables(results):
        out.print(table)
    m = results["machine"]
    out.print(
        f"{m['nproc']} CPUs ({m['cpu']}), load average {m['loadavg'][0]:.2f} at the start and "
        f"{m['loadavg_end'][0]:.2f} at the end; {COORDINATORS} coordinators x {SHARDS} shards, "
        f"{PARTITION_NODES} partition-log nodes, fsync always; clients on the same machine in "
        f"{options.processes} processes; {results['wall_s']:.0f} s; "
        f"failed transactions: {results['failed_transactions']}; machine-speed probe "
        f"{m['probe_ms']:.1f} ms at the start, "
        f"{results['steps_on_another_speed']} steps off it by more than 10 % (marked !)"
    )
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2) + "\n")
    return 0
