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
exactly once, or the benchmark fails. Numbers vary with the machine:
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

from raftcoord.client import Admin, TransactionalProducer
from raftcoord.client import Consumer as NativeConsumer
from raftcoord.client import TopicPartition as NativePartition
from raftcoord.cluster.launcher import LocalCluster

TIMEOUT_S = 60.0


def kafka_run(
    cluster: LocalCluster, topic: str, args: argparse.Namespace
) -> tuple[float, float, int]:
    bootstrap = cluster.kafka_bootstrap()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, args.partitions)])[topic].result(TIMEOUT_S)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"bench-{topic}", "linger.ms": 5}
    )
    producer.init_transactions(TIMEOUT_S)
    value = b"v" * args.value_bytes
    start = time.perf_counter()
    for _ in range(args.transactions):
        producer.begin_transaction()
        for i in range(args.records):
            producer.produce(topic, value=value, partition=i % args.partitions)
        producer.commit_transaction(TIMEOUT_S)
    produced_s = time.perf_counter() - start
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench", "isolation.level": "read_committed"}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(args.partitions)])
    expected = args.transactions * args.records
    read = 0
    start = time.perf_counter()
    deadline = start + TIMEOUT_S
    while read < expected and time.perf_counter() < deadline:
        for message in consumer.consume(1000, 0.5):
            error = message.error()
            if error is not None:
                raise KafkaException(error)
            read += 1
    consumed_s = time.perf_counter() - start
    consumer.close()
    return produced_s, consumed_s, read


def native_run(
    cluster: LocalCluster, topic: str, args: argparse.Namespace
) -> tuple[float, float, int]:
    bootstrap = cluster.bootstrap()
    with Admin(bootstrap) as admin:
        admin.create_topics({topic: args.partitions})
    value = b"v" * args.value_bytes
    producer = TransactionalProducer(bootstrap, transactional_id=f"bench-{topic}")
    try:
        producer.init_transactions()
        start = time.perf_counter()
        for _ in range(args.transactions):
            producer.begin_transaction()
            for i in range(args.records):
                producer.send(topic, value=value, partition=i % args.partitions)
            producer.commit_transaction()
        produced_s = time.perf_counter() - start
    finally:
        producer.close()
    expected = args.transactions * args.records
    with NativeConsumer(bootstrap, group_id="bench", isolation_level="read_committed") as consumer:
        partitions = [NativePartition(topic, p) for p in range(args.partitions)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(partitions)
        read = 0
        start = time.perf_counter()
        deadline = start + TIMEOUT_S
        while read < expected and time.perf_counter() < deadline:
            read += len(consumer.poll(timeout_ms=500))
        consumed_s = time.perf_counter() - start
    return produced_s, consumed_s, read


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transactions", type=int, default=40)
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--value-bytes", type=int, default=100)


def run(args: argparse.Namespace) -> int:
    expected = args.transactions * args.records
    root = Path(tempfile.mkdtemp(prefix="kafka-gateway-bench-"))
    cluster = LocalCluster(root)
    rows = []
    try:
        cluster.up(kafka_listeners=1)
        runs: list[tuple[str, Callable[..., tuple[float, float, int]], str]] = [
            ("confluent-kafka via the gateway", kafka_run, "kafka"),
            ("raftcoord client over gRPC", native_run, "native"),
        ]
        for name, run, topic in runs:
            produced_s, consumed_s, read = run(cluster, topic, args)
            if read != expected:
                print(f"{name}: read {read} records, expected {expected}", file=sys.stderr)
                return 1
            rows.append((name, produced_s, consumed_s))
    finally:
        if cluster.state is not None:
            cluster.down(grace_s=3)
        shutil.rmtree(root, ignore_errors=True)
    table = Table(
        title=f"{args.transactions} transactions x {args.records} records of "
        f"{args.value_bytes} B over {args.partitions} partitions"
    )
    for column in ("client", "commits/s", "produced records/s", "read_committed records/s"):
        table.add_column(column, justify="left" if column == "client" else "right")
    for name, produced_s, consumed_s in rows:
        table.add_row(
            name,
            f"{args.transactions / produced_s:.1f}",
            f"{expected / produced_s:,.0f}",
            f"{expected / consumed_s:,.0f}",
        )
    (_, kafka_p, kafka_c), (_, native_p, native_c) = rows
    table.add_row("gateway / native", f"{native_p / kafka_p:.2f}", "", f"{native_c / kafka_c:.2f}")
    Console().print(table)
    return 0
