"""Real coordinator and partition-log processes: an idle cluster writes nothing
to shard 0's Raft log (partition nodes learn topic placement without a log
barrier), and a topic created later is still served promptly."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fsm import ErrorCode
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.v1 import partition_log_pb2 as plog
from tests.local_cluster import running_cluster
from tests.plog_client import create_topic, stub

pytestmark = pytest.mark.slow
#: How long the idle cluster is watched.
IDLE_WINDOW_S = 3.0
#: How often the shard-0 index is read while waiting.
POLL_S = 0.1


def shard0_commit_index(cluster: LocalCluster) -> int:
    leader = cluster.leaders()[0]
    status = cluster.node_status(leader)
    assert status is not None, f"node {leader} did not answer NodeStatus"
    return int(status.shards[0].commit_index)


def wait_until_quiet(cluster: LocalCluster, timeout_s: float) -> int:
    """The shard-0 commit index once two reads one poll apart agree (start-up
    entries, elections and producer-id blocks, are behind it)."""
    deadline = time.monotonic() + timeout_s
    last = shard0_commit_index(cluster)
    while True:
        time.sleep(POLL_S)
        now = shard0_commit_index(cluster)
        if now == last:
            return now
        assert time.monotonic() < deadline, f"shard 0 kept appending entries (index {now})"
        last = now


def test_an_idle_cluster_appends_nothing_and_still_learns_new_topics(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "cluster") as cluster:  # 3 partition-log nodes
        cluster.wait_for_leaders()
        start = wait_until_quiet(cluster, timeout_s=10.0)
        # The partition nodes refresh their metadata every second meanwhile.
        deadline = time.monotonic() + IDLE_WINDOW_S
        while time.monotonic() < deadline:
            index = shard0_commit_index(cluster)
            assert index == start, f"idle shard 0 appended {index - start} entries"
            time.sleep(POLL_S)

        owners = create_topic(cluster, "late", 3)

        def served(partition: int) -> bool:
            answer = stub(owners[partition]).ListOffsets(
                plog.ListOffsetsRequest(
                    partitions=[
                        plog.ListOffsetsPartition(
                            topic="late", partition=partition, spec=plog.OFFSET_SPEC_LATEST
                        )
                    ]
                ),
                timeout=5,
            )
            return bool(answer.partitions[0].error_code == ErrorCode.NONE)

        for partition in owners:
            cluster.wait_until(
                lambda p=partition: served(p), 5.0, f"late-{partition} is not served"
            )
