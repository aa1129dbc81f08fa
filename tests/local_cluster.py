"""The one way the multi-process tests start a local cluster."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from raftcoord.client import TopicPartition, TransactionalProducer
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.coordinator.leader import FIRST_CHECK_MS


@contextmanager
def running_cluster(path: Path, **options: Any) -> Iterator[LocalCluster]:
    """A cluster of 3 coordinators x 3 shards (and 3 partition-log nodes)
    unless ``options`` (LocalCluster.up's) say otherwise; stopped, and its
    network namespaces removed (``netns=True``), even when the test fails."""
    cluster = LocalCluster(path)
    try:
        cluster.up(**{"coordinators": 3, "shards": 3, "timeout_s": 30, **options})
        yield cluster
    finally:
        if cluster.state is not None:  # else up() started nothing
            cluster.down(grace_s=3)


def commit_offsets(cluster: LocalCluster, name: str) -> None:
    """One offsets-only transaction of transactional id ``name`` commits
    (needs only the coordinators: the leader of its shard and the group's)."""
    with TransactionalProducer(cluster.bootstrap(), name) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_offsets_to_transaction({TopicPartition("t", 0): 1}, f"group-{name}")
        producer.commit_transaction()


def after_first_checks(started: float) -> None:
    """Return once the first imbalance checks of coordinators that were
    running at ``started`` (time.monotonic()) are over: each checks
    FIRST_CHECK_MS after it starts, and a test that watches leaderships
    stay where they are must not see one of those."""
    remaining = started + FIRST_CHECK_MS / 1000 + 0.5 - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)  # the condition is the time itself
