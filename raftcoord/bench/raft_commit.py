"""Commit latency, throughput and idle CPU of a 3-node pysyncobj cluster per fsync policy.

Run: ``raftcoord bench raft`` (about a minute). For each fsync
policy of :mod:`raftcoord.coordinator.raft_journal` (always, batch, never) and two tick
settings (pysyncobj's defaults, autoTickPeriod 0.05 s / appendEntriesPeriod
0.1 s, and an aggressive 0.001 s / 0.002 s) it starts three SyncObj nodes in
this one process on 127.0.0.1, with journals in a temporary directory (on the
disk given by ``--dir``), waits for a leader, then measures

* synchronous commit latency from the leader: ``N`` calls of a ``@replicated``
  method with ``sync=True``, one after another (p50 / p99 in ms). With the
  default tick each call takes ~100 ms, so that setting uses a smaller ``N``
  (``--n-default-tick``) to keep the whole run short; ``--full`` uses ``--n``
  everywhere;
* throughput: 8 threads calling the same method with ``sync=True`` for
  ``--tput-s`` seconds (commits/s);
* idle CPU: ``time.process_time()`` delta / wall time over ``--idle-s``
  seconds with the cluster idle (the whole process: three nodes' tick threads),
  in percent of one core;
* fsyncs per commit during the latency phase, over all three journals.

Election timeouts are 0.4-0.8 s in both settings (only to shorten start-up).
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import pysyncobj
from pysyncobj import SyncObj, replicated
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

from raftcoord.bench.stats import percentile
from raftcoord.cluster.launcher import free_ports
from raftcoord.coordinator import raft_journal
from raftcoord.coordinator.raft import raft_conf

TICKS: dict[str, tuple[float, float]] = {
    "default 0.05/0.1": (0.05, 0.1),
    "aggressive 0.001/0.002": (0.001, 0.002),
}
THREADS = 8


class Counter(SyncObj):  # type: ignore[misc]
    def __init__(self, self_addr: str, others: list[str], conf: Any) -> None:
        super().__init__(self_addr, others, conf)
        self._value = 0

    @replicated  # type: ignore[untyped-decorator]
    def add(self, n: int) -> int:
        self._value += n
        return self._value


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.005)


def run_one(
    workdir: str, policy: str, tick: float, append: float, n: int, tput_s: float, idle_s: float
) -> dict[str, float]:
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    journals = [os.path.join(workdir, f"node{i}.journal") for i in range(3)]
    for i, path in enumerate(journals):
        raft_journal.register_journal(
            path, policy, snapshot_file=os.path.join(workdir, f"node{i}.dump")
        )
    nodes: list[Counter] = []
    try:
        for i, addr in enumerate(addrs):
            conf = raft_conf(
                append,
                (0.4, 0.8),
                journals[i],
                os.path.join(workdir, f"node{i}.dump"),
                auto_tick_s=tick,
                bind_retry_s=0.05,
                connection_retry_s=0.05,
                commands_wait_leader=True,
            )
            nodes.append(Counter(addr, [a for a in addrs if a != addr], conf))

        def one_leader() -> bool:
            leaders = [nd for nd in nodes if nd._isLeader()]
            return len(leaders) == 1 and all(nd._getLeader() is not None for nd in nodes)

        wait_until(one_leader, 15, "a leader")
        leader = next(nd for nd in nodes if nd._isLeader())
        leader.add(0, sync=True, timeout=10)  # leader's no-op committed, warm path

        live = [raft_journal.journal_for(p) for p in journals]
        fsyncs0 = sum(j.fsync_count for j in live if j is not None)
        latencies = []
        for _ in range(n):
            t0 = time.perf_counter()
            leader.add(1, sync=True, timeout=10)
            latencies.append(time.perf_counter() - t0)
        fsyncs = sum(j.fsync_count for j in live if j is not None) - fsyncs0

        done = [0] * THREADS
        stop_at = time.monotonic() + tput_s

        def worker(k: int) -> None:
            while time.monotonic() < stop_at:
                leader.add(1, sync=True, timeout=10)
                done[k] += 1

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        tput = sum(done) / (time.perf_counter() - t0)

        time.sleep(0.3)  # let the last acks and commit-index updates settle
        c0, w0 = time.process_time(), time.perf_counter()
        time.sleep(idle_s)
        idle = (time.process_time() - c0) / (time.perf_counter() - w0)

        return {
            "n": n,
            "p50": statistics.median(latencies) * 1000,
            "p99": percentile(latencies, 99) * 1000,
            "tput": tput,
            "idle": idle * 100,
            "fsyncs_per_commit": fsyncs / n,
        }
    finally:
        for nd in nodes:
            nd.destroy()
        for nd in nodes:
            nd.destroy_synchronous()
        for path in journals:
            raft_journal.unregister_journal(path)


def run(args: argparse.Namespace) -> int:

    raft_journal.install()
    started = time.monotonic()
    rows = []
    for tick_name, (tick, append) in TICKS.items():
        for policy in raft_journal.POLICIES:
            n = args.n if (args.full or tick < 0.01) else args.n_default_tick
            with tempfile.TemporaryDirectory(prefix="raft-bench-", dir=args.dir) as workdir:
                r = run_one(workdir, policy, tick, append, n, args.tput_s, args.idle_s)
            rows.append((tick_name, policy, r))
            print(
                f"# {tick_name:24} {policy:6} p50 {r['p50']:.2f} ms  p99 {r['p99']:.2f} ms  "
                f"{r['tput']:.0f}/s  idle {r['idle']:.1f}%",
                file=sys.stderr,
                flush=True,
            )
    raft_journal.uninstall()

    fs_dir = args.dir or tempfile.gettempdir()
    print(
        f"machine: nproc={os.cpu_count()}, Python {platform.python_version()}, "
        f"pysyncobj {PYSYNCOBJ_VERSION} ({os.path.dirname(pysyncobj.__file__)}), "
        f"{platform.system()} {platform.release()}, journals in {fs_dir}"
    )
    print()
    print(
        "| tick (autoTick/appendEntries s) | fsync policy | N | sync commit p50 ms "
        "| p99 ms | fsyncs/commit (3 nodes) | 8-thread commits/s | idle CPU % of a core |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for tick_name, policy, r in rows:
        print(
            f"| {tick_name} | {policy} | {int(r['n'])} | {r['p50']:.2f} | {r['p99']:.2f} "
            f"| {r['fsyncs_per_commit']:.2f} | {r['tput']:.0f} | {r['idle']:.1f} |"
        )
    print()
    print(f"total run time {time.monotonic() - started:.0f} s")
    return 0
