"""Latency, throughput, group commit and idle CPU of a local raftcoord cluster.

Run: ``raftcoord bench coordinator`` (about 50 s; ``--quick`` about
15 s). For each fsync policy (``--fsync always,never`` by default,
``always`` with ``--quick``) it starts a 3-coordinator, 3-shard
:class:`raftcoord.cluster.launcher.LocalCluster` in a temporary directory (on the disk
given by ``--dir``) and measures, in one run so the numbers compare:

a. gRPC round trip: FindCoordinator on a shard leader, one thread (no Raft);
b. synchronous replicated requests, one thread: InitProducerId with the same
   transactional id (bumps the epoch) and AddPartitionsToTxn adding a new
   partition to an ongoing transaction each time; both go through one Raft
   entry each;
c. full transactions with 1, 8 and 32 client threads for ``--seconds`` each.
   A transaction is InitProducerId + AddPartitionsToTxn + EndTxn(commit) on a
   fresh transactional id (so no transaction waits for the previous one's
   markers), adding a partition of the topic the benchmark creates;
d. group commit: Raft entries applied on the shard leaders (NodeStatus
   ``applied_index``, before and after each run of c) against requests sent;
e. idle CPU of each node process over ``--idle-s`` seconds after the load
   (utime + stime from ``/proc/<pid>/stat``).

The client uses the generated stubs directly, one channel per node shared by
all threads. Each transactional id goes to its shard's leader: the shard is
``raftcoord.protocol.routing.shard_for(id)`` and the shard's leader comes from FindCoordinator,
cached per shard (resolved before the timed phases; looked up again after a
NOT_COORDINATOR or gRPC failure). Requests are not retried: every answer's
error code is checked, failures are counted per method and code, and the
tables say when a phase had any. Progress goes to stderr, markdown to stdout.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

import grpc

from raftcoord.bench.stats import cpu_model, cpu_seconds, percentile
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.config import FSYNC_POLICIES
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.routing import shard_for
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

COORDINATORS = 3
SHARDS = 3
CALL_TIMEOUT_S = 15.0
TXN_TIMEOUT_MS = 900_000  # the maximum: nothing times out during a run
TOPIC = "bench"
REROUTE = {ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE}


def progress(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


def ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1000:.2f}" if values else "-"


@dataclass
class Tally:
    """What one thread saw: latencies of successful calls (s), calls, errors."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    calls: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def add(self, name: str, seconds: float) -> None:
        self.latencies.setdefault(name, []).append(seconds)

    def merge(self, other: Tally) -> None:
        for name, values in other.latencies.items():
            self.latencies.setdefault(name, []).extend(values)
        self.calls += other.calls
        self.errors.update(other.errors)

    def of(self, name: str) -> list[float]:
        return self.latencies.get(name, [])


def answer_error(answer: Any) -> ErrorCode:
    """The request-level error, else the first per-partition one."""
    if answer.error_code != ErrorCode.NONE:
        return ErrorCode(answer.error_code)
    for result in getattr(answer, "results", ()):
        if result.error_code != ErrorCode.NONE:
            return ErrorCode(result.error_code)
    return ErrorCode.NONE


class Client:
    """Stubs over one channel per node; shard leaders cached per shard."""

    def __init__(self, addresses: list[str], shard_count: int) -> None:
        self.shard_count = shard_count
        self.channels = {a: grpc.insecure_channel(a) for a in addresses}
        self.stubs = {
            a: coordinator_pb2_grpc.TransactionCoordinatorStub(c) for a, c in self.channels.items()
        }
        self._leaders: dict[int, str] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()

    def resolve_all(self) -> dict[int, str]:
        """Ask FindCoordinator for every shard's leader (a key per shard)."""
        n = 0
        while len(self._leaders) < self.shard_count:
            self.leader_of(f"route-{n}")
            n += 1
        return dict(self._leaders)

    def leader_of(self, key: str) -> str:
        """The gRPC address of the leader of ``key``'s shard."""
        shard = shard_for(key, self.shard_count)
        address = self._leaders.get(shard)
        if address is not None:
            return address
        with self._lock:
            if shard not in self._leaders:
                self._leaders[shard] = self._find(key)
            return self._leaders[shard]

    def _find(self, key: str) -> str:
        request = coordinator_pb2.FindCoordinatorRequest(
            key=key, key_type=coordinator_pb2.TRANSACTION
        )
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while time.monotonic() < deadline:
            for stub in self.stubs.values():
                try:
                    answer = stub.FindCoordinator(request, timeout=1.0)
                except grpc.RpcError:
                    continue
                if answer.error_code == ErrorCode.NONE:
                    return str(answer.address)
            time.sleep(0.05)
        raise TimeoutError(f"no coordinator for {key!r}")

    def call(self, key: str, method: str, request: Any, tally: Tally) -> Any | None:
        """One call on ``key``'s leader: the answer, or None (counted in ``tally``)."""
        address = self.leader_of(key)
        tally.calls += 1
        started = time.perf_counter()
        try:
            answer = getattr(self.stubs[address], method)(request, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            tally.errors[f"{method} gRPC {exc.code().name}"] += 1
            self._leaders.pop(shard_for(key, self.shard_count), None)
            return None
        elapsed = time.perf_counter() - started
        error = answer_error(answer)
        if error is not ErrorCode.NONE:
            tally.errors[f"{method} {error.name}"] += 1
            if error in REROUTE:
                self._leaders.pop(shard_for(key, self.shard_count), None)
            return None
        tally.add(method, elapsed)
        return answer


# --- requests ------------------------------------------------------------------------


def init_request(tid: str) -> Any:
    return coordinator_pb2.InitProducerIdRequest(
        transactional_id=tid, transaction_timeout_ms=TXN_TIMEOUT_MS
    )


def add_request(tid: str, producer: Any, partition: int) -> Any:
    return coordinator_pb2.AddPartitionsToTxnRequest(
        transactional_id=tid,
        producer_id=producer.producer_id,
        producer_epoch=producer.producer_epoch,
        topics=[common_pb2.TopicPartitions(topic=TOPIC, partitions=[partition])],
    )


def transaction(client: Client, tid: str, tally: Tally) -> bool:
    """InitProducerId + AddPartitionsToTxn + EndTxn(commit); False on any error."""
    started = time.perf_counter()
    producer = client.call(tid, "InitProducerId", init_request(tid), tally)
    if producer is None:
        return False
    if client.call(tid, "AddPartitionsToTxn", add_request(tid, producer, 0), tally) is None:
        return False
    end = coordinator_pb2.EndTxnRequest(
        transactional_id=tid,
        producer_id=producer.producer_id,
        producer_epoch=producer.producer_epoch,
        committed=True,
    )
    if client.call(tid, "EndTxn", end, tally) is None:
        return False
    tally.add("transaction", time.perf_counter() - started)
    return True


# --- cluster observations --------------------------------------------------------------


def node_cpu(cluster: LocalCluster) -> dict[int, float]:
    assert cluster.state is not None
    return {n.node_id: cpu_seconds(n.pid) for n in cluster.state.nodes}


def applied_on_leaders(cluster: LocalCluster, leaders: dict[int, int]) -> dict[int, int]:
    """shard -> applied_index on that shard's leader (which must still lead)."""
    applied: dict[int, int] = {}
    for node_id in sorted(set(leaders.values())):
        status = cluster.node_status(node_id, timeout_s=10.0)
        if status is None:
            raise RuntimeError(f"node {node_id} did not answer NodeStatus")
        for shard in status.shards:
            if leaders.get(shard.shard) == node_id:
                if not shard.is_leader:
                    raise RuntimeError(f"node {node_id} no longer leads shard {shard.shard}")
                applied[shard.shard] = shard.applied_index
    return applied


# --- phases ----------------------------------------------------------------------------


@dataclass
class Phase:
    """One measured phase: what was asked, how long, what the cluster did."""

    name: str
    threads: int
    wall_s: float
    tally: Tally
    completed: int  # calls or transactions that succeeded
    entries: int = 0  # Raft entries applied on the shard leaders
    node_cpu_s: dict[int, float] = field(default_factory=dict)  # node id -> CPU seconds
    client_cpu_s: float = 0.0


def run_load(
    cluster: LocalCluster,
    leaders: dict[int, int],
    name: str,
    threads: int,
    work: Callable[[int, Tally], Callable[[], bool]],
    stop: Callable[[int, float], bool],
) -> Phase:
    """Run ``threads`` workers; each builds its step with ``work(k, tally)`` and
    repeats it until ``stop(attempts, elapsed)``. Counts entries and CPU around it."""
    tallies = [Tally() for _ in range(threads)]
    done = [0] * threads
    barrier = threading.Barrier(threads + 1)

    def worker(k: int) -> None:
        step = work(k, tallies[k])
        barrier.wait()
        t0 = time.perf_counter()
        attempts = 0
        while not stop(attempts, time.perf_counter() - t0):
            done[k] += step()
            attempts += 1

    pool = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
    applied0 = applied_on_leaders(cluster, leaders)
    for t in pool:
        t.start()
    cpu0, client0 = node_cpu(cluster), time.process_time()
    started = time.perf_counter()
    barrier.wait()
    for t in pool:
        t.join()
    wall = time.perf_counter() - started
    client_cpu = time.process_time() - client0
    cpu1 = node_cpu(cluster)
    applied1 = applied_on_leaders(cluster, leaders)
    tally = Tally()
    for part in tallies:
        tally.merge(part)
    return Phase(
        name,
        threads,
        wall,
        tally,
        sum(done),
        entries=sum(applied1[s] - applied0[s] for s in applied0),
        node_cpu_s={n: cpu1[n] - cpu0[n] for n in cpu0},
        client_cpu_s=client_cpu,
    )


def round_trip(client: Client, address: str, n: int) -> Phase:
    """FindCoordinator on one node, one thread (no Raft, no cluster counters)."""
    stub = client.stubs[address]
    tally = Tally()
    request = coordinator_pb2.FindCoordinatorRequest(
        key="bench-find", key_type=coordinator_pb2.TRANSACTION
    )
    for _ in range(50):  # warm the channel
        stub.FindCoordinator(request, timeout=CALL_TIMEOUT_S)
    started = time.perf_counter()
    for _ in range(n):
        tally.calls += 1
        t0 = time.perf_counter()
        try:
            answer = stub.FindCoordinator(request, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            tally.errors[f"FindCoordinator gRPC {exc.code().name}"] += 1
            continue
        elapsed = time.perf_counter() - t0
        if answer.error_code != ErrorCode.NONE:
            tally.errors[f"FindCoordinator {ErrorCode(answer.error_code).name}"] += 1
            continue
        tally.add("FindCoordinator", elapsed)
    wall = time.perf_counter() - started
    return Phase("FindCoordinator", 1, wall, tally, len(tally.of("FindCoordinator")))


def sync_init(client: Client, cluster: LocalCluster, leaders: dict[int, int], n: int) -> Phase:
    tid = "bench-sync-init"
    warm = Tally()
    client.call(tid, "InitProducerId", init_request(tid), warm)

    def work(_k: int, tally: Tally) -> Callable[[], bool]:
        return lambda: client.call(tid, "InitProducerId", init_request(tid), tally) is not None

    phase = run_load(cluster, leaders, "InitProducerId (same id)", 1, work, lambda i, _: i >= n)
    phase.tally.merge(Tally(errors=warm.errors))
    return phase


def sync_add(client: Client, cluster: LocalCluster, leaders: dict[int, int], n: int) -> Phase:
    tid = "bench-sync-add"
    warm = Tally()
    producer = client.call(tid, "InitProducerId", init_request(tid), warm)
    if producer is None:
        raise RuntimeError(f"InitProducerId for {tid} failed: {dict(warm.errors)}")
    client.call(tid, "AddPartitionsToTxn", add_request(tid, producer, 0), warm)
    partitions = iter(range(1, 1_000_000))

    def work(_k: int, tally: Tally) -> Callable[[], bool]:
        def step() -> bool:
            request = add_request(tid, producer, next(partitions))
            return client.call(tid, "AddPartitionsToTxn", request, tally) is not None

        return step

    phase = run_load(
        cluster, leaders, "AddPartitionsToTxn (new partition)", 1, work, lambda i, _: i >= n
    )
    phase.tally.merge(Tally(errors=warm.errors))
    return phase


def transactions(
    client: Client,
    cluster: LocalCluster,
    leaders: dict[int, int],
    threads: int,
    seconds: float,
) -> Phase:
    def work(k: int, tally: Tally) -> Callable[[], bool]:
        ids = (f"bench-txn-{threads}t-{k}-{i}" for i in range(10**9))
        return lambda: transaction(client, next(ids), tally)

    return run_load(
        cluster, leaders, "transactions", threads, work, lambda _i, elapsed: elapsed >= seconds
    )


# --- one cluster -----------------------------------------------------------------------


@dataclass
class PolicyResult:
    policy: str
    leaders: dict[int, int]
    pids: dict[int, int]
    find: Phase
    sync: list[Phase]
    txns: list[Phase]
    idle_cpu: dict[int, float]  # node id -> % of one core
    idle_s: float


def run_policy(policy: str, args: argparse.Namespace) -> PolicyResult:
    with tempfile.TemporaryDirectory(prefix="raftcoord-bench-", dir=args.dir) as workdir:
        cluster = LocalCluster(workdir)
        client: Client | None = None
        try:
            t0 = time.monotonic()
            state = cluster.up(COORDINATORS, SHARDS, fsync=policy, timeout_s=30.0)
            leaders = cluster.wait_for_leaders()
            progress(
                f"[{policy}] cluster up in {time.monotonic() - t0:.1f} s, "
                f"shard leaders (shard: node) {leaders}"
            )
            client = Client([n.grpc for n in state.nodes], state.shard_count)
            routes = client.resolve_all()
            by_node = {n.node_id: n.grpc for n in state.nodes}
            if any(routes[s] != by_node[leaders[s]] for s in leaders):
                raise RuntimeError(f"FindCoordinator {routes} disagrees with NodeStatus {leaders}")
            # AddPartitionsToTxn refuses partitions that do not exist; b adds
            # partitions 0..sync_n (shard 0 holds the topics).
            created = client.stubs[routes[0]].CreateTopics(
                coordinator_pb2.CreateTopicsRequest(
                    topics=[
                        coordinator_pb2.CreatableTopic(name=TOPIC, num_partitions=args.sync_n + 1)
                    ]
                ),
                timeout=CALL_TIMEOUT_S,
            )
            if created.results[0].error_code != ErrorCode.NONE:
                raise RuntimeError(f"CreateTopics {TOPIC!r}: {created.results[0]}")

            find = round_trip(client, by_node[leaders[0]], args.find_n)
            progress(
                f"[{policy}] FindCoordinator p50 {ms(find.tally.of('FindCoordinator'), 50)} ms, "
                f"{find.completed / find.wall_s:.0f} calls/s"
            )
            sync = [
                sync_init(client, cluster, leaders, args.sync_n),
                sync_add(client, cluster, leaders, args.sync_n),
            ]
            for phase in sync:
                method = phase.name.split()[0]
                progress(
                    f"[{policy}] {phase.name} p50 {ms(phase.tally.of(method), 50)} ms, "
                    f"{phase.entries} entries for {phase.tally.calls} requests"
                )
            txns = []
            for threads in args.threads:
                phase = transactions(client, cluster, leaders, threads, args.seconds)
                txns.append(phase)
                progress(
                    f"[{policy}] {threads:2} threads: {phase.completed / phase.wall_s:.0f} txn/s, "
                    f"EndTxn p50 {ms(phase.tally.of('EndTxn'), 50)} ms, "
                    f"{sum(phase.tally.errors.values())} errors"
                )

            progress(f"[{policy}] idle for {args.idle_s:.0f} s")
            cpu0, w0 = node_cpu(cluster), time.perf_counter()
            time.sleep(args.idle_s)
            cpu1, wall = node_cpu(cluster), time.perf_counter() - w0
            idle = {n: (cpu1[n] - cpu0[n]) / wall * 100 for n in cpu0}
            if cluster.leaders() != leaders:
                progress(f"[{policy}] WARNING: leaders changed to {cluster.leaders()}")
            return PolicyResult(
                policy,
                leaders,
                {n.node_id: n.pid for n in state.nodes},
                find,
                sync,
                txns,
                idle,
                wall,
            )
        finally:
            if client is not None:
                client.close()
            if cluster.state is not None:
                cluster.down()


# --- report ----------------------------------------------------------------------------


def table(header: list[str], rows: list[list[str]], right_from: int = 1) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i < right_from else "---:" for i in range(len(header))) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


def errors_cell(tally: Tally) -> str:
    return str(sum(tally.errors.values()))


def report(results: list[PolicyResult], args: argparse.Namespace, total_s: float) -> None:
    print(
        f"machine: nproc={os.cpu_count()}, CPU {cpu_model()}, Python "
        f"{platform.python_version()}, pysyncobj {version('pysyncobj')}, "
        f"grpcio {version('grpcio')}, {platform.system()} {platform.release()}; "
        f"fsync policies {', '.join(r.policy for r in results)}; "
        f"cluster: {COORDINATORS} coordinators x {SHARDS} shards, data in "
        f"{args.dir or tempfile.gettempdir()}; client and nodes share the machine"
    )
    print()
    layouts = "; ".join(
        f"{r.policy}: " + ", ".join(f"shard {s} on node {n}" for s, n in sorted(r.leaders.items()))
        for r in results
    )
    print(f"shard leaders: {layouts}")
    print()

    print("**a. gRPC round trip**: FindCoordinator on a shard leader, 1 thread, no Raft")
    print()
    table(
        ["fsync", "calls", "p50 ms", "p99 ms", "calls/s", "errors"],
        [
            [
                r.policy,
                str(r.find.tally.calls),
                ms(r.find.tally.of("FindCoordinator"), 50),
                ms(r.find.tally.of("FindCoordinator"), 99),
                f"{r.find.completed / r.find.wall_s:.0f}",
                errors_cell(r.find.tally),
            ]
            for r in results
        ],
    )

    print("**b. synchronous replicated request**, 1 thread, one after another")
    print()
    rows = []
    for r in results:
        for p in r.sync:
            latencies = p.tally.of(p.name.split()[0])
            rows.append(
                [
                    r.policy,
                    p.name,
                    str(p.tally.calls),
                    ms(latencies, 50),
                    ms(latencies, 99),
                    f"{p.completed / p.wall_s:.0f}",
                    str(p.entries),
                    f"{p.tally.calls / p.entries:.2f}" if p.entries else "-",
                    errors_cell(p.tally),
                ]
            )
    table(
        [
            "fsync",
            "request",
            "calls",
            "p50 ms",
            "p99 ms",
            "req/s",
            "Raft entries",
            "requests/entry",
            "errors",
        ],
        rows,
        right_from=2,
    )

    print(
        "**c. transactions**: fresh transactional id each, InitProducerId + "
        f"AddPartitionsToTxn + EndTxn(commit), {args.seconds:.0f} s per row; "
        "CPU in % of one core"
    )
    print()
    rows = []
    for r in results:
        for p in r.txns:
            end, txn = p.tally.of("EndTxn"), p.tally.of("transaction")
            per_node = [c / p.wall_s * 100 for _, c in sorted(p.node_cpu_s.items())]
            rows.append(
                [
                    r.policy,
                    str(p.threads),
                    str(p.completed),
                    f"{p.completed / p.wall_s:.0f}",
                    ms(end, 50),
                    ms(end, 99),
                    ms(txn, 50),
                    ms(txn, 99),
                    f"{sum(per_node):.0f}",
                    " / ".join(f"{c:.0f}" for c in per_node),
                    f"{p.client_cpu_s / p.wall_s * 100:.0f}",
                    errors_cell(p.tally),
                ]
            )
    table(
        [
            "fsync",
            "threads",
            "txns",
            "txn/s",
            "EndTxn p50 ms",
            "EndTxn p99 ms",
            "txn p50 ms",
            "txn p99 ms",
            "nodes CPU %",
            "per node 1 / 2 / 3",
            "client CPU %",
            "errors",
        ],
        rows,
    )

    print(
        "**d. group commit** during c: requests sent vs Raft entries applied on the "
        "3 shard leaders (requests/entry > 1 means batching)"
    )
    print()
    table(
        ["fsync", "threads", "requests/s", "Raft entries/s", "requests/entry"],
        [
            [
                r.policy,
                str(p.threads),
                f"{p.tally.calls / p.wall_s:.0f}",
                f"{p.entries / p.wall_s:.0f}",
                f"{p.tally.calls / p.entries:.2f}" if p.entries else "-",
            ]
            for r in results
            for p in r.txns
        ],
    )

    print("**e. idle CPU** of each node process after the load, % of one core")
    print()
    rows = []
    for r in results:
        for node_id, cpu in sorted(r.idle_cpu.items()):
            led = sorted(s for s, n in r.leaders.items() if n == node_id)
            rows.append(
                [
                    r.policy,
                    str(node_id),
                    ", ".join(map(str, led)) or "-",
                    f"{r.idle_s:.1f}",
                    f"{cpu:.1f}",
                ]
            )
    table(["fsync", "node", "leads shards", "window s", "CPU %"], rows, right_from=3)

    errors: Counter[str] = Counter()
    for r in results:
        for p in [r.find, *r.sync, *r.txns]:
            errors.update(
                {f"{r.policy} / {p.name} / {p.threads}t: {k}": v for k, v in p.tally.errors.items()}
            )
    if errors:
        print(
            f"**ERRORS: {sum(errors.values())} failed requests.** Latencies, txns and txn/s "
            "count only successes; requests/s and requests/entry count every request sent."
        )
        print()
        table(
            ["policy / phase / threads: method and error", "count"],
            [[k, str(v)] for k, v in sorted(errors.items())],
        )
    else:
        print("errors: none (every answer had error code NONE)")
        print()
    print(f"total run time {total_s:.0f} s")


def run(args: argparse.Namespace) -> int:
    quick = args.quick
    args.fsync = args.fsync or ("always" if quick else "always,never")
    args.find_n = args.find_n or (500 if quick else 2000)
    args.sync_n = args.sync_n or (100 if quick else 300)
    args.seconds = args.seconds or (2.0 if quick else 5.0)
    policies = [p.strip() for p in args.fsync.split(",") if p.strip()]
    for policy in policies:
        if policy not in FSYNC_POLICIES:
            print(
                f"unknown fsync policy {policy!r}; use {', '.join(FSYNC_POLICIES)}",
                file=sys.stderr,
            )
            return 2

    started = time.monotonic()
    results = [run_policy(policy, args) for policy in policies]
    report(results, args, time.monotonic() - started)
    return 0
