"""A coordinator whose data directory was emptied loses no commit.

Each shard records the data directory its members vote from
(raftcoord.coordinator.voters). Coordinator B is stopped; A (the leader)
and C commit transactions; C's directory is emptied while A is down too,
and C and B are started: B's log is stale and C's is empty, so B would be
elected with C's vote and the transactions A and C committed would be gone.
C's answer to B's pre-vote does not count (its directory is not the
recorded one), so B does not even campaign: no leader is elected until A
is back, every acknowledged value is read once with
read_committed, and C, caught up, is recorded again as a voter.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from raftcoord.client import Admin, Consumer, TopicPartition, TransactionalProducer
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.data_dir import META_FILE, parse
from tests.local_cluster import running_cluster

pytestmark = pytest.mark.slow

TOPIC = "wiped"


def wait_for(what: str, condition: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def log_of(cluster: LocalCluster, node_id: int) -> str:
    return (cluster.data_dir / f"node-{node_id}.log").read_text()


def read_committed(cluster: LocalCluster) -> list[bytes]:
    values: list[bytes] = []
    with Consumer(cluster.bootstrap(), isolation_level="read_committed") as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        while batch := consumer.poll(timeout_ms=1000):
            values.extend(r.value for r in batch if r.value is not None)
    return values


def commit(cluster: LocalCluster, transactional_id: str, values: list[bytes]) -> None:
    """One transaction per value; returns once each commit is acknowledged."""
    with TransactionalProducer(cluster.bootstrap(), transactional_id) as producer:
        producer.init_transactions()
        for value in values:
            producer.begin_transaction()
            producer.send(TOPIC, value, partition=0)
            producer.commit_transaction()


def test_a_wiped_coordinator_does_not_elect_a_stale_one(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "cluster", shards=1) as cluster:
        ids = [r.node_id for r in cluster.coordinators()]
        wait_for(
            "the voters record on every coordinator",
            lambda: all("event=voters_recorded" in log_of(cluster, n) for n in ids),
        )
        with Admin(cluster.bootstrap()) as admin:
            admin.create_topics({TOPIC: 1})
        commit(cluster, "before", [b"before-0"])
        a = cluster.leaders()[0]
        b, c = (n for n in ids if n != a)

        cluster.kill(b, "TERM")
        acknowledged = [b"before-0"]
        for i in range(3):
            values = [f"txn-{i}-{j}".encode() for j in range(3)]
            commit(cluster, f"writer-{i}", values)  # A and C: a majority
            acknowledged += values

        cluster.kill(c, "KILL")
        cluster.kill(a, "KILL")
        directory = cluster.data_dir / f"node-{c}"
        shutil.rmtree(directory)
        directory.mkdir()
        cluster.start(c)
        cluster.start(b)
        wiped = parse((directory / META_FILE).read_text()).directory_id
        c_log_from = len(log_of(cluster, c))

        def refused() -> bool:
            return any(
                "event=raft_pre_vote_answer_not_counted" in line and f"directory={wiped}" in line
                for line in log_of(cluster, b).splitlines()
            )

        # B asks for pre-votes and the empty C answers: that answer does not count.
        wait_for("B's pre-vote with C's answer", lambda: refused() or cluster.leaders())
        stale_leader = cluster.leaders()

        cluster.start(a)
        cluster.wait_for_leaders(timeout_s=60)
        values = read_committed(cluster)
        assert sorted(values) == sorted(acknowledged), (values, acknowledged)
        assert not stale_leader and refused(), "the stale coordinator was elected with C's vote"
        for name in ("before", *(f"writer-{i}" for i in range(3))):
            commit(cluster, name, [f"{name}-after".encode()])  # never fenced by a lost epoch
        for n in ids:
            assert "event=raft_committed_conflict" not in log_of(cluster, n)
        # C caught up and is a voter again.
        wait_for(
            "C recorded again",
            lambda: (
                "event=voters_recorded" in log_of(cluster, c)[c_log_from:]
                and "voter=True" in log_of(cluster, c).rsplit("event=voters_recorded", 1)[1]
            ),
        )
