"""The gRPC server style, by numbers: a synchronous server on a thread pool
(what the coordinator and partition-log nodes run) against a ``grpc.aio``
server, both serving the empty ``CoordinatorAdmin.Ping`` call.

Run: ``raftcoord bench grpc`` (about a minute; ``--quick`` about 15 s). Each
server runs in a process of its own on 127.0.0.1 (both at once, the idle one
waiting); the callers are spread over client processes
(:func:`raftcoord.bench.load.run_load`) at 1, 8, 32 and 128 concurrent
callers for ``--seconds`` each, the two styles taking turns at each count so
that a change in the machine's load falls on both. Reports calls/s,
p50/p99 and the server process's CPU per call (utime + stime from /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table

from raftcoord.bench.load import Work, run_load
from raftcoord.bench.progress import bench_logging
from raftcoord.bench.stats import machine, percentile, wide_console
from raftcoord.cluster.launcher import free_ports
from raftcoord.protocol.v1 import admin_pb2, admin_pb2_grpc

STYLES = ("thread pool", "grpc.aio")
#: The coordinator's server: grpc.server on a ThreadPoolExecutor of 32 workers.
POOL_WORKERS = 32


class _Pings(admin_pb2_grpc.CoordinatorAdminServicer):
    def Ping(self, request: Any, context: Any) -> Any:
        return admin_pb2.PingResponse()


class _AioPings(admin_pb2_grpc.CoordinatorAdminServicer):
    async def Ping(self, request: Any, context: Any) -> Any:
        return admin_pb2.PingResponse()


def _serve(style: str, address: str, stop: Any) -> None:
    """One server until ``stop`` is set (the process's only job)."""
    if style == "thread pool":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=POOL_WORKERS))
        admin_pb2_grpc.add_CoordinatorAdminServicer_to_server(_Pings(), server)
        server.add_insecure_port(address)
        server.start()
        stop.wait()
        server.stop(grace=None)
        return

    async def main() -> None:
        server = grpc.aio.server()
        admin_pb2_grpc.add_CoordinatorAdminServicer_to_server(_AioPings(), server)
        server.add_insecure_port(address)
        await server.start()
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        await server.stop(grace=None)

    asyncio.run(main())


@contextlib.contextmanager
def server(style: str) -> Iterator[tuple[str, int]]:
    """A server of ``style`` in a process of its own: (address, pid)."""
    context = multiprocessing.get_context("spawn")
    address = f"127.0.0.1:{free_ports(1)[0]}"
    stop = context.Event()
    proc = context.Process(target=_serve, args=(style, address, stop), daemon=True)
    proc.start()
    try:
        with grpc.insecure_channel(address) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
        assert proc.pid is not None
        yield address, proc.pid
    finally:
        stop.set()
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)


def measure(
    style: str, address: str, pid: int, callers: int, seconds: float, processes: int
) -> dict[str, Any]:
    result = run_load(Work("ping", [address]), callers, seconds, processes, [pid])
    out = result.outcome
    return {
        "style": style,
        "callers": callers,
        "calls": out.completed,
        "failed": out.failed,
        "calls_per_s": round(result.rate, 1),
        "p50_ms": round(percentile(out.latencies, 50) * 1000, 3),
        "p99_ms": round(percentile(out.latencies, 99) * 1000, 3),
        "server_cpu_us_per_call": round(
            result.cluster_cpu_s * 1e6 / out.completed if out.completed else 0.0, 1
        ),
    }


def run(args: argparse.Namespace) -> int:
    seconds = args.seconds or (1.0 if args.quick else 4.0)
    rows = []
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(bench_logging(Console(stderr=True)))
        servers = {style: stack.enter_context(server(style)) for style in STYLES}
        for callers in args.callers:
            for style, (address, pid) in servers.items():
                log.info("event=step server=%r callers=%d seconds=%g", style, callers, seconds)
                rows.append(measure(style, address, pid, callers, seconds, args.client_processes))
    rows.sort(key=lambda r: (STYLES.index(r["style"]), r["callers"]))
    table = Table(
        title="empty unary call (Ping), server alone in its process", title_justify="left"
    )
    for name in (
        "server",
        "callers",
        "calls/s",
        "p50 ms",
        "p99 ms",
        "server CPU µs/call",
        "failed",
    ):
        table.add_column(name, justify="left" if name == "server" else "right")
    for r in rows:
        table.add_row(
            r["style"],
            str(r["callers"]),
            f"{r['calls_per_s']:.0f}",
            f"{r['p50_ms']:.2f}",
            f"{r['p99_ms']:.2f}",
            f"{r['server_cpu_us_per_call']:.0f}",
            str(r["failed"]),
        )
    out = wide_console()
    out.print(table)
    m = machine()
    out.print(f"{m['nproc']} CPUs ({m['cpu']}), load average {m['loadavg'][0]:.2f}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"machine": m, "rows": rows}, indent=2) + "\n")
    return 0
