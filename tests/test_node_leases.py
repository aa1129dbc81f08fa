"""Topics' records, partition-log nodes' leases and leader epochs on a real
cluster (coordinator and partition-log processes on loopback): topics record
each partition's replicas, ISR and leader epoch, and `raftcoord topic`
describes them; a node that stops heartbeating is fenced by shard 0's
leader (its partitions have no leader, LEADER_NOT_AVAILABLE), and led by it
again once it heartbeats, at a higher leader epoch, which the batches it
appends then carry and requests must name; a new leader of shard 0 fences
nobody for the heartbeats it did not hear."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from partition_log import codec
from raftcoord.client import Admin, Consumer, TopicPartition, TransactionalProducer
from raftcoord.client.errors import InvalidConfigurationError, InvalidReplicationFactorError
from raftcoord.client.records import TopicDescription
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.v1 import partition_log_pb2
from tests import plog_client
from tests.local_cluster import running_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TOPIC = "leased"
SESSION_MS = 3_000
SETTINGS = {"broker.heartbeat.interval.ms": 300, "broker.session.timeout.ms": SESSION_MS}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "cluster", settings=SETTINGS) as running:
        with Admin(running.bootstrap()) as admin:
            admin.create_topics({TOPIC: 3}, replication_factor=1)  # one copy: fences show
        yield running


def describe(cluster: LocalCluster) -> TopicDescription:
    with Admin(cluster.bootstrap()) as admin:
        return admin.describe_topics([TOPIC])[TOPIC]


def wait_for(cluster: LocalCluster, condition: str, check: object) -> TopicDescription:
    found: list[TopicDescription] = []

    def met() -> bool:
        found[:] = [describe(cluster)]
        return bool(check(found[0]))  # type: ignore[operator]

    cluster.wait_until(met, 30.0, f"the topic never had {condition}: {found}")
    return found[0]


def test_a_silent_node_is_fenced_and_leads_again_when_it_heartbeats(
    cluster: LocalCluster,
) -> None:
    before = describe(cluster)
    paused = before.partitions[0].leader
    its = [p.partition for p in before.partitions if p.leader == paused]
    others = {p.partition: p for p in before.partitions if p.leader != paused}
    cluster.kill(paused, "STOP")
    try:
        fenced = wait_for(
            cluster,
            f"node {paused}'s partitions without a leader",
            lambda t: all(t.partitions[i].leader == -1 for i in its),
        )
    finally:
        cluster.kill(paused, "CONT")
    for i in its:
        p = fenced.partitions[i]
        assert p.isr == p.replicas == (paused,)  # the ISR keeps its last member
        assert p.leader_epoch == 1
    for i, p in others.items():
        assert fenced.partitions[i] == p  # the other nodes' partitions did not move
    back = wait_for(
        cluster,
        f"node {paused} leading again",
        lambda t: all(t.partitions[i].leader == paused for i in its),
    )
    assert all(back.partitions[i].leader_epoch == 2 for i in its)
    # The node serves its partitions again: a transaction across every
    # partition commits and is read back.
    with TransactionalProducer(cluster.bootstrap(), "after-fence") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(3):
            producer.send(TOPIC, f"v{i}".encode(), partition=i)
        producer.commit_transaction()
    consumer = Consumer(cluster.bootstrap(), isolation_level="read_committed")
    try:
        consumer.assign([TopicPartition(TOPIC, i) for i in range(3)])
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(values) < 3 and time.monotonic() < deadline:
            values += [r.value for r in consumer.poll(timeout_ms=500) if r.value is not None]
        assert sorted(values) == [b"v0", b"v1", b"v2"]
    finally:
        consumer.close()
    logs = cluster.data_dir.glob("*.log")
    assert any("event=partition_node_fenced" in path.read_text() for path in logs)
    # What the node appended since it leads again carries the new leader
    # epoch; a request naming another epoch is refused.
    node = plog_client.stub(cluster.state.node(paused).grpc)  # type: ignore[union-attr]
    i = its[0]
    answer = node.Fetch(
        partition_log_pb2.FetchRequest(
            raw=True,
            partitions=[partition_log_pb2.FetchPartition(topic=TOPIC, partition=i)],
        ),
        timeout=10,
    ).partitions[0]
    data, epochs = answer.raw_batches, []
    while data:
        header = codec.parse_header(data)
        epochs.append(header.partition_leader_epoch)
        data = data[header.size :]
    assert epochs == [2, 2]  # the transaction's record and its COMMIT marker
    for epoch, code in [
        (1, ErrorCode.FENCED_LEADER_EPOCH),
        (3, ErrorCode.UNKNOWN_LEADER_EPOCH),
        (2, ErrorCode.NONE),
    ]:
        produced = plog_client.produce(node, TOPIC, i, [b"x"], leader_epoch=epoch)
        assert produced.error_code == code, (epoch, produced)


def test_the_cli_lists_the_partitions_without_a_leader(cluster: LocalCluster) -> None:
    paused = describe(cluster).partitions[1].leader
    cluster.kill(paused, "STOP")
    try:
        wait_for(cluster, "a partition without a leader", lambda t: t.partitions[1].leader == -1)
        with Admin(cluster.bootstrap()) as admin:  # placed on the nodes holding a lease
            admin.create_topics({"while-fenced": 4})
            placed = admin.describe_topics(["while-fenced"])["while-fenced"].partitions
        assert {p.leader for p in placed} == {n.node_id for n in cluster.partition_nodes()} - {
            paused
        }
        command = [sys.executable, "-m", "raftcoord.cli", "topic", "describe", "--json"]
        command += ["--unavailable-partitions", "--cluster-dir", str(cluster.data_dir)]
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        cluster.kill(paused, "CONT")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert {r["partition"] for r in rows} >= {1}
    assert all(r["leader"] == -1 and r["isr"] == [paused] for r in rows)


def test_a_new_leader_of_shard_0_fences_nobody_it_did_not_hear(cluster: LocalCluster) -> None:
    before = describe(cluster)
    shard0 = cluster.leaders()[0]
    cluster.kill(shard0, "KILL")
    try:
        cluster.wait_until(
            lambda: cluster.leaders().get(0) not in (None, shard0),
            30.0,
            "shard 0 elected no new leader",
        )
        # Longer than a session: had the new leader counted the leases from
        # before its leadership, every node would be fenced by now.
        time.sleep(2 * SESSION_MS / 1000)
        assert describe(cluster) == before
    finally:
        cluster.start(shard0)


def test_a_consumer_polling_through_a_fence_reads_on_at_the_new_leader_epoch(
    cluster: LocalCluster,
) -> None:
    """A consumer that keeps polling (short polls, partitions on every node:
    a fetch parked on the other nodes takes each whole poll) while a node is
    killed past its lease and restarted learns the new leader epoch and reads
    what is committed there afterwards."""
    before = describe(cluster)
    victim = before.partitions[0].leader
    tps = [TopicPartition(TOPIC, i) for i in range(3)]
    consumer = Consumer(cluster.bootstrap(), isolation_level="read_committed")
    read: list[tuple[int, bytes | None]] = []
    polls = [0]
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            read.extend((r.partition, r.value) for r in consumer.poll(timeout_ms=300))
            polls[0] += 1

    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)
    poller = threading.Thread(target=poll)
    poller.start()
    try:
        cluster.kill(victim, "KILL")
        wait_for(cluster, "a fenced node", lambda t: t.partitions[0].leader == -1)
        fenced_at = polls[0]  # a few polls meet the partition without a leader
        cluster.wait_until(lambda: polls[0] >= fenced_at + 5, 30.0, "the consumer stopped")
        cluster.start(victim)
        wait_for(cluster, "the node back", lambda t: t.partitions[0].leader == victim)
        with TransactionalProducer(cluster.bootstrap(), "through-a-fence") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(TOPIC, b"after the fence", partition=0)
            producer.commit_transaction()
        cluster.wait_until(
            lambda: (0, b"after the fence") in read, 30.0, "the consumer never read the record"
        )
    finally:
        stop.set()
        poller.join(timeout=30)
        consumer.close()


def test_topics_record_each_partitions_replicas_and_the_cli_describes_them(
    cluster: LocalCluster,
) -> None:
    """A topic of the default replication factor has 3 replicas per
    partition (as many as nodes), all in sync, led by the first at leader
    epoch 0, leaders spread over every node; min.insync.replicas 2; other
    factors and more replicas than nodes are refused with why; ``raftcoord
    topic`` creates and describes topics."""
    plog_ids = {n.node_id for n in cluster.partition_nodes()}
    with Admin(cluster.bootstrap()) as admin:
        admin.create_topics({"described": 6})
        [topic] = admin.describe_topics(["described"]).values()
        assert (topic.replication_factor, topic.min_insync_replicas) == (3, 2)
        leaders = [p.leader for p in topic.partitions]
        assert set(leaders) == plog_ids  # spread over every node
        for p in topic.partitions:
            assert sorted(p.replicas) == sorted(p.isr) == sorted(plog_ids)
            assert p.leader == p.replicas[0] and p.leader_epoch == 0
            assert not p.under_replicated
        with pytest.raises(InvalidReplicationFactorError, match="larger than the 3"):
            admin.create_topics({"single": 1}, replication_factor=4)
        with pytest.raises(
            InvalidConfigurationError, match=r"min\.insync\.replicas 2 not in 1\.\.1"
        ):
            admin.create_topics({"single": 1}, replication_factor=1, min_insync_replicas=2)
        assert "single" not in admin.list_topics()
        admin.create_topics({"single": 2}, replication_factor=1)
        [single] = admin.describe_topics(["single"]).values()
        assert (single.replication_factor, single.min_insync_replicas) == (1, 1)
        for p in single.partitions:
            assert p.replicas == p.isr == (p.leader,)

    def topic_cli(*args: str) -> subprocess.CompletedProcess[str]:
        where = ("--cluster-dir", str(cluster.data_dir))
        return subprocess.run(
            [sys.executable, "-m", "raftcoord.cli", "topic", *args, *where],
            capture_output=True,
            text=True,
            timeout=120,
        )

    made = topic_cli("create", "cli-made", "--partitions", "2", "--config", "min.insync.replicas=1")
    assert made.returncode == 0, made.stderr
    described = topic_cli("describe", "--topic", "cli-made", "--json")
    assert described.returncode == 0, described.stderr
    rows = json.loads(described.stdout)
    assert [r["partition"] for r in rows] == [0, 1]
    assert all(len(r["replicas"]) == 3 and sorted(r["isr"]) == sorted(r["replicas"]) for r in rows)
    assert all(r["leader"] == r["replicas"][0] for r in rows)
    table = topic_cli("describe", "--topic", "cli-made")
    assert "LeaderEpoch" in table.stdout and "Isr" in table.stdout
    none = topic_cli("describe", "--under-replicated-partitions")
    assert none.returncode == 0 and none.stdout.strip() == "no partition matches"
    for args, message in [
        (("create", "x", "--partitions", "1", "--config", "retention.ms=5"), "unknown config"),
        (("create", "x", "--partitions", "1", "--replication-factor", "9"), "larger than"),
        (("describe", "--topic", "no-such-topic"), "no-such-topic"),
    ]:
        refused = topic_cli(*args)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused
        assert len(refused.stderr.strip().splitlines()) == 1 and message in refused.stderr
