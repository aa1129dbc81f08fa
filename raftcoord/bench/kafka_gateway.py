"""Throughput through the Kafka gateway against the native gRPC client.

    raftcoord bench kafka-gateway [--transactions 40] [--records 200]
        [--partitions 3] [--value-bytes 100]

Starts a local cluster (3 coordinators x 3 shards, 3 partition-log nodes, one
Kafka gateway; fsync as by default) in a temporary directory, then runs the
same workload twice: ``--transactions`` transactions of ``--records``
records spread over ``--partitions`` partitions, committed one after the
other by one transactional producer, then read back by a read_committed
consumer (until it has read them all). Once with confluent-kafka
(librdkafka) through the gateway, once with raftcoord's own client over
gRPC. Prints transactions/s and records/s
of each phase and the gateway's share. Every record must be read back
exactly once, or the benchmark fails. Also the MiB/s of record values
produced and read, and the CPU the gateway and the partition-log nodes
spent per MiB in each phase (``/proc``). Numbers vary with the machine:
compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from rich.console import Console
from rich.table import Table

from raftcoord.bench.stats import cpu_of
from raftcoord.client import Admin, TransactionalProducer
from raftcoord.client import Consumer as NativeConsumer
from raftcoord.client import TopicPartition as NativePartition
from raftcoord.cluster.launcher import LocalCluster

TIMEOUT_S = 60.0
MIB = 1 << 20


class Phases:
    """Wall time and CPU seconds (per process kind) of a run's produce and
    consume phases."""

    def __init__(self, cluster: LocalCluster) -> None:
        assert cluster.state is not None
        self.kinds = {n.pid: n.kind for n in cluster.state.nodes}
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, dict[str, float]] = {}
        self._started = 0.0
        self._before: dict[int, float] = {}

    def start(self) -> None:
        self._before = cpu_of(list(self.kinds))
        self._started = time.perf_counter()

    def stop(self, phase: str) -> float:
        took = time.perf_counter() - self._started
        after = cpu_of(list(self.kinds))
        spent: dict[str, float] = {}
        for pid, before in self._before.items():
            if pid in after:
                kind = self.kinds[pid]
                spent[kind] = spent.get(kind, 0.0) + after[pid] - before
        self.wall[phase], self.cpu[phase] = took, spent
        return took


def kafka_run(cluster: LocalCluster, topic: str, args: argparse.Namespace, phases: Phases) -> int:
    bootstrap = cluster.kafka_bootstrap()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, args.partitions)])[topic].result(TIMEOUT_S)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"bench-{topic}", "linger.ms": 5}
    )
    producer.init_transactions(TIMEOUT_S)
    value = b"v" * args.value_bytes
    phases.start()
    for _ in range(args.transactions):
        producer.begin_transaction()
        for i in range(args.records):
            producer.produce(topic, value=value, partition=i % args.partitions)
        producer.commit_transaction(TIMEOUT_S)
    phases.stop("produce")
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench", "isolation.level": "read_committed"}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(args.partitions)])
    expected = args.transactions * args.records
    read = 0
    phases.start()
    deadline = time.perf_counter() + TIMEOUT_S
    while read < expected and time.perf_counter() < deadline:
        for message in consumer.consume(1000, 0.5):
            error = message.error()
            if error is not None:
                raise KafkaException(error)
            read += 1
    phases.stop("consume")
    consumer.close()
    return read


def native_run(cluster: LocalCluster, topic: str, args: argparse.Namespace, phases: Phases) -> int:
    bootstrap = cluster.bootstrap()
    with Admin(bootstrap) as admin:
        admin.create_topics({topic: args.partitions})
    value = b"v" * args.value_bytes
    producer = TransactionalProducer(bootstrap, transactional_id=f"bench-{topic}")
    try:
        producer.init_transactions()
        phases.start()
        for _ in range(args.transactions):
            producer.begin_transaction()
            for i in range(args.records):
                producer.send(topic, value=value, partition=i % args.partitions)
            producer.commit_transaction()
        phases.stop("produce")
    finally:
        producer.close()
    expected = args.transactions * args.records
    with NativeConsumer(bootstrap, group_id="bench", isolation_level="read_committed") as consumer:
        partitions = [NativePartition(topic, p) for p in range(args.partitions)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(partitions)
        read = 0
        phases.start()
        deadline = time.perf_counter() + TIMEOUT_S
        while read < expected and time.perf_counter() < deadline:
            read += len(consumer.poll(timeout_ms=500))
        phases.stop("consume")
    return read


def run(args: argparse.Namespace) -> int:
    expected = args.transactions * args.records
    mib = expected * args.value_bytes / MIB
    root = Path(tempfile.mkdtemp(prefix="kafka-gateway-bench-"))
    cluster = LocalCluster(root)
    rows: list[tuple[str, Phases]] = []
    try:
        cluster.up(kafka_listeners=1)
        runs: list[tuple[str, Callable[..., int], str]] = [
            ("confluent-kafka via the gateway", kafka_run, "kafka"),
            ("raftcoord client over gRPC", native_run, "native"),
        ]
        for name, run, topic in runs:
            phases = Phases(cluster)
            read = run(cluster, topic, args, phases)
            if read != expected:
                print(f"{name}: read {read} records, expected {expected}", file=sys.stderr)
                return 1
            rows.append((name, phases))
    finally:
        if cluster.state is not None:
            cluster.down(grace_s=3)
        shutil.rmtree(root, ignore_errors=True)
    table = Table(
        title=f"{args.transactions} transactions x {args.records} records of "
        f"{args.value_bytes} B over {args.partitions} partitions ({mib:.1f} MiB of values)"
    )
    columns = (
        "client",
        "phase",
        "records/s",
        "MiB/s",
        "gateway CPU s/MiB",
        "partition nodes CPU s/MiB",
    )
    for column in columns:
        table.add_column(column, justify="left" if column in ("client", "phase") else "right")
    for name, phases in rows:
        for phase, label in (
            ("produce", "produce, commit"),
            ("consume", "read_committed"),
        ):
            took = phases.wall[phase]
            cpu = phases.cpu[phase]
            table.add_row(
                name,
                label,
                f"{expected / took:,.0f}",
                f"{mib / took:.2f}",
                f"{cpu['kafka-gateway'] / mib:.3f}" if "kafka-gateway" in cpu else "-",
                f"{cpu.get('partition-log', 0.0) / mib:.3f}",
            )
    (_, kafka), (_, native) = rows
    for phase, label in (("produce", "produce, commit"), ("consume", "read_committed")):
        ratio = native.wall[phase] / kafka.wall[phase]
        table.add_row("gateway / native", label, f"{ratio:.2f}", f"{ratio:.2f}", "", "")
    Console(width=140).print(table)
    return 0
