"""Requests that once jammed a shard for good, tried against real processes:
an exhausted producer epoch, and a committed entry a replica cannot apply."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fsm import ErrorCode
from raftcoord.cluster.launcher import LocalCluster, write_config
from raftcoord.coordinator.node import EXIT_APPLY_FAILED
from raftcoord.protocol.config import load_config
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2
from tests.coord_client import Coordinators, partitions
from tests.local_cluster import running_cluster

pytestmark = pytest.mark.slow
MAX_EPOCH = 6  # epochs 5 and 6 are exhausted


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(
        tmp_path / "cluster",
        shards=1,
        partition_nodes=1,
        abort_interval_ms=100,
        settings={"producer.epoch.max": MAX_EPOCH},
    ) as cluster:
        yield cluster


def describe(client: Coordinators, tid: str) -> coordinator_pb2.TransactionDescription:
    request = coordinator_pb2.DescribeTransactionsRequest(transactional_ids=[tid])
    return client.call(tid, "DescribeTransactions", request).transactions[0]


def test_an_exhausted_epoch_is_refused_and_the_shard_keeps_working(cluster: LocalCluster) -> None:
    client = Coordinators(cluster.bootstrap())
    tid = "exhausted"
    try:
        leader = cluster.state.node(cluster.leaders()[0]).grpc  # type: ignore[union-attr]
        created = client.stubs[leader].CreateTopics(
            coordinator_pb2.CreateTopicsRequest(
                topics=[coordinator_pb2.CreatableTopic(name="orders", num_partitions=1)]
            )
        )
        assert created.results[0].error_code == ErrorCode.NONE

        def init() -> coordinator_pb2.InitProducerIdResponse:
            request = coordinator_pb2.InitProducerIdRequest(
                transactional_id=tid, transaction_timeout_ms=500
            )
            answer = client.call(tid, "InitProducerId", request)
            assert answer.error_code == ErrorCode.NONE, answer
            return answer

        # InitProducerId walks the epoch up and rotates the id before the
        # bump would reach an exhausted epoch.
        answers = [init() for _ in range(MAX_EPOCH)]
        pid = answers[0].producer_id
        assert [(a.producer_id == pid, a.producer_epoch) for a in answers] == [
            (True, 0),
            (True, 1),
            (True, 2),
            (True, 3),
            (True, 4),
            (False, 0),
        ]
        pid = answers[-1].producer_id
        for _ in range(4):
            last = init()
        assert (last.producer_id, last.producer_epoch) == (pid, 4)

        def add(epoch: int) -> coordinator_pb2.AddPartitionsToTxnResponse:
            request = coordinator_pb2.AddPartitionsToTxnRequest(
                transactional_id=tid,
                producer_id=pid,
                producer_epoch=epoch,
                topics=partitions("orders", 0),
            )
            return client.call(tid, "AddPartitionsToTxn", request)

        # A transaction at the last usable epoch times out: the coordinator's
        # fence takes the id to epoch 5, which is exhausted.
        assert add(4).error_code == ErrorCode.NONE
        client.until(
            lambda: describe(client, tid).state == common_pb2.TRANSACTION_STATE_COMPLETE_ABORT,
            20,
            "the timed-out transaction was not aborted",
        )
        assert describe(client, tid).producer_epoch == 5
        # A raw request with that epoch must not open a transaction there.
        refused = add(5)
        assert (
            refused.error_code == ErrorCode.PRODUCER_FENCED and "exhausted" in refused.error_message
        )
        end = client.call(
            tid,
            "EndTxn",
            coordinator_pb2.EndTxnRequest(
                transactional_id=tid, producer_id=pid, producer_epoch=5, committed=True
            ),
        )
        assert end.error_code == ErrorCode.PRODUCER_FENCED
        assert describe(client, tid).state == common_pb2.TRANSACTION_STATE_COMPLETE_ABORT

        # The id starts over on a new producer id, and the shard serves others.
        fresh = init()
        assert fresh.producer_id != pid and fresh.producer_epoch == 0
        for other in ("other-a", "other-b"):
            request = coordinator_pb2.InitProducerIdRequest(
                transactional_id=other, transaction_timeout_ms=9_000
            )
            assert client.call(other, "InitProducerId", request).error_code == ErrorCode.NONE
        statuses = [cluster.node_status(n.node_id) for n in cluster.coordinators()]
        assert all(s is not None for s in statuses), "a coordinator died"
    finally:
        client.close()


CRASHING_NODE = """
import sys
from pathlib import Path
from fsm.machine import TransactionStateMachine
from raftcoord.protocol.config import load_config, read_raft_key
from raftcoord.coordinator.node import run_node

healthy = TransactionStateMachine.apply_entry

def apply_entry(self, data):
    if b"poison" in data:
        raise MemoryError("cannot apply this entry here")
    return healthy(self, data)

TransactionStateMachine.apply_entry = apply_entry
config = load_config(sys.argv[1])
sys.exit(run_node(config, 1, Path(sys.argv[2]), read_raft_key(config.raft_key_file)))
"""


def test_a_node_that_cannot_apply_a_committed_entry_stops_with_its_index(
    tmp_path: Path,
) -> None:
    """Retrying would apply the entry again and skipping it would diverge
    from the other replicas: the node must exit, loudly, naming the entry.
    (A replica whose process cannot apply an entry is simulated by patching
    its state machine; the pure machine itself never raises.)"""
    config_path = tmp_path / "cluster.toml"
    write_config(config_path, coordinators=1, shards=1, partition_nodes=0)
    address = load_config(config_path).coordinator(1).grpc
    log = (tmp_path / "node.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-c", CRASHING_NODE, str(config_path), str(tmp_path / "node-1")],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    client = Coordinators([address])
    try:
        request = coordinator_pb2.InitProducerIdRequest(
            transactional_id="a", transaction_timeout_ms=1_000
        )
        assert client.call("a", "InitProducerId", request).error_code == ErrorCode.NONE
        poison = coordinator_pb2.InitProducerIdRequest(
            transactional_id="poison", transaction_timeout_ms=1_000
        )
        with contextlib.suppress(grpc.RpcError):  # the node may die before it answers
            client.stubs[address].InitProducerId(poison, timeout=5)
        assert process.wait(timeout=20) == EXIT_APPLY_FAILED
    finally:
        client.close()
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
    text = (tmp_path / "node.log").read_text()
    assert "CRITICAL" in text and "event=apply_failed index=" in text, text[-3000:]
    assert "MemoryError" in text
