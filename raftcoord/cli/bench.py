"""``raftcoord bench [SUITE] [options]``: the benchmark suites of :mod:`raftcoord.bench`."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

#: suite name -> (module under raftcoord.bench, help)
SUITES = {
    "grpc": ("grpc_style", "the gRPC server style: thread pool against grpc.aio on an empty call"),
    "coordinator": (
        "coordinator",
        "coordinator requests through the generated stubs per fsync policy, group commit, idle CPU",
    ),
    "raft": ("raft_commit", "plain pysyncobj commit latency and throughput per fsync policy"),
    "plog-startup": ("plog_startup", "a partition's start-up time against its log size"),
    "audit": ("audit", "the Spark audit's time by run size"),
    "kafka-codec": ("kafka_codec", "Kafka message codecs: kio against kafka-python's classes"),
    "kafka-gateway": (
        "kafka_gateway",
        "confluent-kafka through the Kafka gateway against the native client over gRPC",
    ),
    "snapshot": ("snapshot", "a shard's log compaction against its open transactions"),
    "tls": ("variants", "the same transactional load against a plaintext and a TLS cluster"),
    "metrics": (
        "variants",
        "the same transactional load against a cluster without and one with metrics endpoints",
    ),
    "replication": (
        "variants",
        "the same transactional load against topics of 1 and of 3 replicas per partition",
    ),
}


def _module(name: str) -> Any:
    return importlib.import_module(f"raftcoord.bench.{name}")


def _run(args: argparse.Namespace) -> int:
    result: int = _module(args.bench_module).run(args)
    return result


def configure(bench: argparse.ArgumentParser) -> None:
    """The arguments of ``raftcoord bench`` (no benchmark's module is
    imported until one runs)."""
    from raftcoord.bench.arguments import ADD_ARGUMENTS

    bench.description = (
        "With no SUITE: start local clusters (3 coordinators x 3 shards, 3 "
        "partition-log nodes, fsync always) and measure, in one run, the machine's ceilings "
        "(an empty gRPC call, a bare Raft commit, fsyncs/s), transactions end to end through "
        "the public client, producers in one client process on rotating partitions with "
        "every node's CPU, transactional against idempotent throughput, failover, "
        "coordinator memory and cost with many open transactions, and scaling by shard "
        "count; prints the figures and the targets (docs/performance.md). A SUITE runs "
        "one of the narrower benchmarks."
    )
    ADD_ARGUMENTS["targets"](bench)
    bench.set_defaults(func=_run, bench_module="targets")
    suites = bench.add_subparsers(dest="suite", metavar="SUITE")
    for name, (module, text) in SUITES.items():
        suite = suites.add_parser(name, help=text, description=text)
        ADD_ARGUMENTS[module](suite)
        suite.set_defaults(bench_module=module)
