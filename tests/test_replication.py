"""Replicated partitions on a real cluster (coordinator and partition-log
processes on loopback): followers fetch from their leader and hold
byte-identical logs; a leader killed in the middle of transactions is
replaced from the in-sync replicas and no acknowledged record is lost or
doubled; a replica that comes back cuts what its leader never acknowledged
and catches up."""

from __future__ import annotations

import random
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from partition_log.node import GRPC_WORKERS
from raftcoord.client import Admin, Consumer, Producer, TopicPartition, TransactionalProducer
from raftcoord.client.errors import KafkaError
from raftcoord.client.records import TopicDescription
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.config import load_config
from spark import audit
from tests import plog_client
from tests.crowd import Crowd
from tests.local_cluster import running_cluster

#: A test here runs a Spark audit: 90 s with its cluster, over 240 s on a
#: slow hour with the standalone Spark cluster of tests/test_audit_network.py
#: running beside it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOPIC = "replicated"
PARTITIONS = 2
#: Short leases: a killed leader is fenced, and its partitions move, within seconds.
SETTINGS = {"broker.heartbeat.interval.ms": 300, "broker.session.timeout.ms": 3_000}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "cluster", settings=SETTINGS) as running:
        with Admin(running.bootstrap()) as admin:
            admin.create_topics({TOPIC: PARTITIONS}, replication_factor=3, min_insync_replicas=2)
        yield running


def describe(cluster: LocalCluster) -> TopicDescription:
    with Admin(cluster.bootstrap()) as admin:
        return admin.describe_topics([TOPIC])[TOPIC]


def log_bytes(cluster: LocalCluster, node_id: int, partition: int) -> bytes:
    """The bytes of one replica's segment files, oldest first."""
    record = cluster.state.node(node_id)  # type: ignore[union-attr]
    directory = Path(record.log).with_suffix("") / f"{TOPIC}-{partition}"
    return b"".join(path.read_bytes() for path in sorted(directory.glob("*.log")))


def wait_identical(cluster: LocalCluster, partition: int, nodes: list[int]) -> bytes:
    """Wait until every replica on ``nodes`` holds the same log; returns it."""
    logs: dict[int, bytes] = {}

    def same() -> bool:
        logs.update({n: log_bytes(cluster, n, partition) for n in nodes})
        return len(set(logs.values())) == 1 and bool(logs[nodes[0]])

    cluster.wait_until(
        same,
        30.0,
        f"replicas of {TOPIC}-{partition} never matched: { {n: len(b) for n, b in logs.items()} }",
    )
    return logs[nodes[0]]


class Workload(threading.Thread):
    """Transactions across both partitions, one after another, until stopped:
    which committed (commit_transaction returned) and which were aborted."""

    def __init__(self, cluster: LocalCluster, name: str) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.name_ = name
        self.committed: list[bytes] = []
        #: Values of transactions that raised: committed or not, either may be.
        self.uncertain: list[bytes] = []
        self.failed: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        with TransactionalProducer(self.cluster.bootstrap(), self.name_) as producer:
            producer.init_transactions()
            while not self.stop.is_set():
                values = [f"{self.name_}-{n}-{p}".encode() for p in range(PARTITIONS)]
                n += 1
                try:
                    producer.begin_transaction()
                    for p, value in enumerate(values):
                        producer.send(TOPIC, value, partition=p)
                    producer.commit_transaction()
                    self.committed += values
                except KafkaError as exc:
                    self.uncertain += values
                    self.failed.append(repr(exc))
                    try:
                        producer.abort_transaction()
                    except KafkaError as again:
                        self.failed.append(repr(again))
                        return

    def check(self, values: list[bytes], partition: int | None = None) -> None:
        """``values`` (what read_committed returned) hold every committed
        value once, and nothing a transaction never tried."""
        suffix = b"" if partition is None else f"-{partition}".encode()
        committed = [v for v in self.committed if v.endswith(suffix)]
        assert len(values) == len(set(values)), "a value read twice"
        assert set(committed) <= set(values), (set(committed) - set(values), self.failed[-5:])
        assert set(values) <= set(committed) | set(self.uncertain)

    def wait_commits(self, more: int, timeout_s: float = 60.0) -> None:
        target = len(self.committed) + more * PARTITIONS
        deadline = time.monotonic() + timeout_s
        while len(self.committed) < target:
            assert self.is_alive(), f"the workload ended: {self.failed[-3:]}"
            assert time.monotonic() < deadline, f"no progress: {self.failed[-3:]}"
            time.sleep(0.05)


def read_committed(cluster: LocalCluster, expected: int) -> list[bytes]:
    consumer = Consumer(cluster.bootstrap(), isolation_level="read_committed")
    try:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(values) < expected and time.monotonic() < deadline:
            values += [r.value for r in consumer.poll(timeout_ms=500) if r.value is not None]
        # Anything more would be a duplicate or an uncommitted record.
        values += [r.value for r in consumer.poll(timeout_ms=1000) if r.value is not None]
        return values
    finally:
        consumer.close()


def test_followers_hold_the_leaders_log_and_a_killed_leader_loses_nothing(
    cluster: LocalCluster, spark: Any, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    rng = random.Random(seed)
    topic = describe(cluster)
    nodes = sorted(n.node_id for n in cluster.partition_nodes())
    for p in topic.partitions:
        assert sorted(p.replicas) == sorted(p.isr) == nodes
    assert topic.min_insync_replicas == 2

    workload = Workload(cluster, "replicated-txn")
    workload.start()
    try:
        workload.wait_commits(10)
        for index in range(PARTITIONS):
            wait_identical(cluster, index, nodes)  # the workload goes on: lagging ones catch up
        victim = topic.partitions[rng.randrange(PARTITIONS)].leader
        led = [p.partition for p in topic.partitions if p.leader == victim]
        cluster.kill(victim, "KILL")
        moved_at = time.monotonic()

        def moved(t: TopicDescription) -> bool:
            return all(t.partitions[i].leader not in (victim, -1) for i in led)

        cluster.wait_until(lambda: moved(describe(cluster)), 30.0, "no new leader")
        print(f"new leader after {time.monotonic() - moved_at:.1f} s")
        after = describe(cluster)
        for i in led:
            p = after.partitions[i]
            assert victim not in p.isr and p.leader_epoch > topic.partitions[i].leader_epoch
        workload.wait_commits(10)  # transactions go on at the new leaders

        cluster.start(victim)  # comes back as a follower: cuts its tail, catches up
        workload.wait_commits(5)
    finally:
        workload.stop.set()
        workload.join(60)
    assert not workload.is_alive()
    for index in range(PARTITIONS):
        wait_identical(cluster, index, nodes)
    values = read_committed(cluster, len(workload.committed))
    workload.check(values)
    # The audit reads every replica: they agree, and every batch reads back.
    outcome = audit.run_audit(spark, cluster.data_dir, None, tmp_path / "report")
    results = {r.name: r for r in outcome.results}
    for name in ("replica-divergence", "unreadable-data", "leader-epoch-order", "duplicate"):
        assert results[name].status == "PASS", results[name]


def test_a_wiped_replica_catches_up_and_a_later_leader_kill_loses_nothing(
    cluster: LocalCluster,
) -> None:
    """A node whose data directory is gone (a replaced disk: a new directory
    id) restarts at once, within its lease, while the coordinators still
    record it as a leader: since every partition it holds has another
    in-sync replica, the coordinators accept the new directory and fence it
    first instead of letting it lead an empty log; it fetches everything
    again, rejoins the ISR, and can then be the one that takes over."""
    topic = describe(cluster)
    nodes = sorted(n.node_id for n in cluster.partition_nodes())
    wiped = topic.partitions[1].leader
    workload = Workload(cluster, "wiped-txn")
    workload.start()
    try:
        workload.wait_commits(10)
        cluster.kill(wiped, "KILL")
        shutil.rmtree(cluster.node_dir(wiped))
        cluster.start(wiped)
        moved = describe(cluster).partitions[1]  # (it may be back in the ISR already)
        assert moved.leader not in (wiped, -1), moved
        assert moved.leader_epoch > topic.partitions[1].leader_epoch
        workload.wait_commits(5)
        cluster.wait_until(
            lambda: all(wiped in p.isr for p in describe(cluster).partitions),
            30.0,
            "the wiped replica in sync",
        )
        workload.wait_commits(5)
        # The wiped replica is left alone: it takes over both partitions.
        for node in nodes:
            if node != wiped:
                cluster.kill(node, "KILL")
        cluster.wait_until(
            lambda: all(p.leader == wiped for p in describe(cluster).partitions),
            30.0,
            "the wiped replica leads",
        )
    finally:
        workload.stop.set()
        workload.join(60)
    # min.insync.replicas 2 with one replica left: it serves reads, refuses writes.
    for p in range(PARTITIONS):
        workload.check(read_committed_partition(cluster, p), partition=p)
    logs = "".join(p.read_text() for p in cluster.data_dir.glob("*.log"))
    assert "event=directory_replaced_accepted" in logs


def read_committed_partition(cluster: LocalCluster, partition: int) -> list[bytes]:
    consumer = Consumer(cluster.bootstrap(), isolation_level="read_committed")
    try:
        consumer.assign([TopicPartition(TOPIC, partition)])
        consumer.seek_to_beginning()
        values: list[bytes] = []
        idle = 0
        deadline = time.monotonic() + 60
        while idle < 3 and time.monotonic() < deadline:
            got = [r.value for r in consumer.poll(timeout_ms=500) if r.value is not None]
            idle = 0 if got else idle + 1
            values += got
        return values
    finally:
        consumer.close()


def test_more_waiting_writes_than_workers_do_not_hold_up_the_followers_fetches(
    cluster: LocalCluster,
) -> None:
    """More acks=all writes waiting for their replicas at once than the
    leader has gRPC workers: the followers fetch on the replication listener,
    whose threads those writes cannot take, so every write is acknowledged
    (fetching on the same workers, every one of them timed out)."""
    leader = describe(cluster).partitions[0].leader
    node = plog_client.stub(cluster.state.node(leader).grpc)  # type: ignore[union-attr]
    cluster.wait_until(
        lambda: plog_client.produce(node, TOPIC, 0, [b"first"]).error_code == 0,
        30.0,
        "the leader knows the topic",
    )
    writers = GRPC_WORKERS + 16
    start = threading.Barrier(writers)

    def write(i: int) -> Any:
        start.wait(30)
        return plog_client.produce(node, TOPIC, 0, [b"w%d" % i], timeout_s=15.0)

    with ThreadPoolExecutor(writers) as pool:
        answers = list(pool.map(write, range(writers)))
    assert [(a.error_code, a.error_message) for a in answers if a.error_code] == []
    assert len({a.base_offset for a in answers}) == writers


def test_a_follower_that_lags_leaves_the_isr_and_rejoins_once_caught_up(tmp_path: Path) -> None:
    """A paused follower (not fenced: its lease outlasts the pause) leaves
    the ISR after replica.lag.time.max.ms, so acks=all writes go on with the
    others; resumed, it catches up and joins again."""
    settings = {**SETTINGS, "broker.session.timeout.ms": 60_000, "replica.lag.time.max.ms": 2_000}
    with running_cluster(tmp_path / "cluster", settings=settings) as cluster:
        with Admin(cluster.bootstrap()) as admin:
            admin.create_topics({TOPIC: 1}, replication_factor=3, min_insync_replicas=2)
        leader = describe(cluster).partitions[0].leader
        lagging = next(n for n in describe(cluster).partitions[0].replicas if n != leader)
        with Producer(cluster.bootstrap()) as producer:
            producer.send(TOPIC, b"before", partition=0).result(30)
            cluster.kill(lagging, "STOP")
            try:
                producer.send(TOPIC, b"paused", partition=0).result(30)  # waits for the shrink
                after = describe(cluster).partitions[0]
                assert lagging not in after.isr and after.leader == leader
            finally:
                cluster.kill(lagging, "CONT")
            cluster.wait_until(
                lambda: lagging in describe(cluster).partitions[0].isr, 30.0, "rejoined the ISR"
            )
            producer.send(TOPIC, b"after", partition=0).result(30)
        assert wait_identical(cluster, 0, [leader, lagging])
        logs = "".join(p.read_text() for p in cluster.data_dir.glob("*.log"))
        assert "event=isr_changed" in logs and "event=partition_node_fenced" not in logs


def test_a_partition_goes_back_to_its_preferred_leader_at_a_later_check(tmp_path: Path) -> None:
    """Its preferred leader killed, a partition moves to an in-sync follower;
    back and in sync again, the preferred leader leads it once more at the
    next imbalance check (leader.imbalance.check.interval.seconds)."""
    settings = {**SETTINGS, "leader.imbalance.check.interval.seconds": 2}
    with running_cluster(tmp_path / "cluster", settings=settings) as cluster:
        with Admin(cluster.bootstrap()) as admin:
            admin.create_topics({TOPIC: 1}, replication_factor=3)
        first = describe(cluster).partitions[0]
        preferred = first.replicas[0]
        assert first.leader == preferred
        cluster.kill(preferred, "KILL")
        cluster.wait_until(
            lambda: describe(cluster).partitions[0].leader not in (preferred, -1),
            30.0,
            "no new leader",
        )
        cluster.start(preferred)
        cluster.wait_until(
            lambda: describe(cluster).partitions[0].leader == preferred,
            60.0,
            "the preferred leader never led again",
        )
        assert describe(cluster).partitions[0].leader_epoch >= first.leader_epoch + 2
        with Producer(cluster.bootstrap()) as producer:
            producer.send(TOPIC, b"at the preferred leader", partition=0).result(30)
        logs = "".join(p.read_text() for p in cluster.data_dir.glob("*.log"))
        assert "event=preferred_leaders_elected" in logs


def test_under_tls_the_followers_fetch_and_hold_the_leaders_log(tmp_path: Path) -> None:
    """Replication under ``[tls]`` (the followers' fetches over mutual TLS,
    the nodes' certificates): acks=all writes are acknowledged, every
    replica stays in the ISR and holds the leader's bytes."""
    with running_cluster(tmp_path / "cluster", shards=1, tls=True) as cluster:
        tls = cluster.client_tls()
        with Admin(cluster.bootstrap(), **tls) as admin:
            admin.create_topics({TOPIC: 1}, replication_factor=3, min_insync_replicas=3)
        with Producer(cluster.bootstrap(), **tls) as producer:
            for i in range(20):
                producer.send(TOPIC, b"v%d" % i, partition=0)
            producer.flush()
        with Admin(cluster.bootstrap(), **tls) as admin:
            (partition,) = admin.describe_topics([TOPIC])[TOPIC].partitions
        assert sorted(partition.isr) == sorted(partition.replicas) and len(partition.isr) == 3
        assert b"v19" in wait_identical(cluster, 0, list(partition.replicas))


#: How long the crowded round may take at most: seconds on a quiet machine;
#: over two minutes when the strangers can take the nodes' places.
CROWDED_BOUND_S = 60.0


def test_under_tls_strangers_holding_the_link_ports_keep_no_node_out(tmp_path: Path) -> None:
    """Strangers on 9 addresses other than the cluster's keep every place
    for connections in their handshake that they may take on every cluster
    link port (the partition nodes' replication ports, the coordinators'
    ports for adds) full, dialling again whenever a node closes one. A
    follower killed and started again meanwhile fetches from its leader
    again and is back in the ISR, and transactions commit (their adds and
    markers over links dialled anew)."""
    with running_cluster(tmp_path / "cluster", shards=1, tls=True) as cluster:
        tls = cluster.client_tls()
        with Admin(cluster.bootstrap(), **tls) as admin:
            admin.create_topics({TOPIC: 1}, replication_factor=3)
        config = load_config(cluster.data_dir / "cluster.toml")
        links = [n.replication for n in config.partition_nodes] + [
            n.link for n in config.coordinators
        ]
        assert None not in links
        ports = [int(str(address).rsplit(":", 1)[1]) for address in links]

        def described() -> Any:
            with Admin(cluster.bootstrap(), **tls) as admin:
                return admin.describe_topics([TOPIC])[TOPIC].partitions[0]

        with Crowd(ports, sources=9, per_source=8) as crowd:
            gathered = time.monotonic()
            partition = described()
            follower = next(n for n in partition.replicas if n != partition.leader)
            cluster.kill(follower, "KILL")
            cluster.start(follower)
            with TransactionalProducer(cluster.bootstrap(), "crowded", **tls) as producer:
                producer.init_transactions()
                for i in range(3):
                    producer.begin_transaction()
                    producer.send(TOPIC, b"crowded-%d" % i, partition=0)
                    producer.commit_transaction()
            cluster.wait_until(
                lambda: len(described().isr) == 3,
                30.0,
                f"node {follower} did not come back into the ISR",
            )
            assert b"crowded-2" in wait_identical(cluster, 0, list(partition.replicas))
            assert crowd.dialled > len(crowd.places)
            # Kept out, the nodes would still get in now and then, when the
            # deadline frees places: minutes for what takes seconds here.
            assert time.monotonic() - gathered < CROWDED_BOUND_S
