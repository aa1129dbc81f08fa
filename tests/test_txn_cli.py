"""``raftcoord txn`` against a real cluster (coordinator and partition-log
processes on loopback), run as a user runs it: a hanging transaction made on
purpose (verification off, a transactional batch to a partition the
coordinator never heard of) is found by ``find-hanging`` among ordinary open
transactions, refused aborts change nothing, and ``abort --start-offset``
ends it so that read_committed consumers get past it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftcoord.client import Admin, Consumer, TopicPartition, TransactionalProducer
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.v1 import partition_log_pb2
from tests import plog_client

ROOT = Path(__file__).resolve().parents[1]
TOPIC = "orders"
HANGING_TP = TopicPartition(TOPIC, 1)
#: Older than find-hanging's default 15 minutes (the raw batch's timestamps
#: are plog_client's fixed ones, also from 2023).
OLD_MS = 1_700_000_000_000

pytestmark = pytest.mark.slow


def raftcoord(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftcoord.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def txn(cluster: Path, *args: str) -> Any:
    """Run ``raftcoord txn ARGS --json`` and return its parsed output."""
    result = raftcoord("txn", *args, "--cluster-dir", str(cluster), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def refused(cluster: Path, *args: str) -> str:
    """Run a ``raftcoord txn`` command that must fail; its one-line error."""
    result = raftcoord("txn", *args, "--cluster-dir", str(cluster))
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cluster whose partition-log node appends transactional batches
    unverified, started by the command line."""
    path = tmp_path_factory.mktemp("txn") / "cluster"
    try:
        result = raftcoord(
            "cluster",
            "up",
            "--data-dir",
            str(path),
            "--coordinators",
            "1",
            "--shards",
            "1",
            "--partition-nodes",
            "1",
            "--setting",
            "transaction.partition.verification.enable=false",
        )
        assert result.returncode == 0, result.stderr
        assert '"transaction.partition.verification.enable" = false' in (
            (path / "cluster.toml").read_text()
        )
        yield path
    finally:
        if (path / "cluster.json").exists():
            LocalCluster(path).down(grace_s=3)


def offsets(node: Any) -> tuple[int, int]:
    """(last stable offset, high watermark) of the hanging partition."""
    return (
        plog_client.list_offset(node, TOPIC, 1, partition_log_pb2.OFFSET_SPEC_LAST_STABLE),
        plog_client.list_offset(node, TOPIC, 1, partition_log_pb2.OFFSET_SPEC_LATEST),
    )


def test_find_and_abort_a_hanging_transaction(cluster_dir: Path) -> None:
    bootstrap = LocalCluster(cluster_dir).bootstrap()
    with Admin(bootstrap) as admin:
        admin.create_topics({TOPIC: 2})
    node = plog_client.stub(LocalCluster(cluster_dir).partition_nodes()[0].grpc)
    ghost = TransactionalProducer(bootstrap, "ghost")
    live = TransactionalProducer(bootstrap, "live", transaction_timeout_ms=300_000)
    try:
        # The ghost's transaction: partition 0 through the client (added to
        # the transaction), partition 1 by a raw batch the coordinator never
        # hears of. Its abort then writes a marker to partition 0 only.
        ghost.init_transactions()
        ghost.begin_transaction()
        ghost.send(TOPIC, b"ghost-0", partition=0).result(timeout=30)
        raw = plog_client.produce(
            node,
            TOPIC,
            1,
            [b"ghost-1"],
            producer_id=ghost.producer_id,
            epoch=ghost.producer_epoch,
            sequence=0,
            transactional=True,
            transactional_id="ghost",
        )
        assert raw.error_code == 0, raw
        hanging_offset = raw.base_offset
        ghost_id, ghost_epoch = ghost.producer_id, ghost.producer_epoch
        ghost.abort_transaction()
        # An ordinary open transaction on the same partition, just as old.
        live.init_transactions()
        live.begin_transaction()
        live_offset = (
            live.send(TOPIC, b"live-1", partition=1, timestamp_ms=OLD_MS).result(timeout=30).offset
        )
        assert offsets(node) == (hanging_offset, live_offset + 1)

        listed = {t["transactional_id"]: t for t in txn(cluster_dir, "list")}
        assert listed["ghost"]["state"] == "CompleteAbort"
        assert listed["live"]["state"] == "Ongoing" and listed["live"]["duration_ms"] >= 0
        assert [t["transactional_id"] for t in txn(cluster_dir, "list", "--state", "Ongoing")] == [
            "live"
        ]
        by_producer = txn(cluster_dir, "list", "--producer-id", str(ghost_id))
        assert [t["transactional_id"] for t in by_producer] == ["ghost"]
        [described] = txn(cluster_dir, "describe", "live")
        assert described["state"] == "Ongoing"
        assert described["topic_partitions"] == [f"{TOPIC}-1"]
        assert described["producer_id"] == live.producer_id
        assert described["coordinator"] in bootstrap
        assert described["pending_markers"] == []  # an Ongoing transaction owes none
        producers = {
            p["producer_id"]: p for p in txn(cluster_dir, "describe-producers", TOPIC, "1")
        }
        assert producers[ghost_id]["current_transaction_start_offset"] == hanging_offset
        assert producers[ghost_id]["producer_epoch"] == ghost_epoch
        assert producers[ghost_id]["coordinator_epoch"] == -1  # no marker ever came
        assert producers[live.producer_id]["current_transaction_start_offset"] == live_offset

        hanging = txn(cluster_dir, "find-hanging")
        assert hanging == [
            {
                "topic": TOPIC,
                "partition": 1,
                "producer_id": ghost_id,
                "producer_epoch": ghost_epoch,
                "coordinator_epoch": -1,
                "start_offset": hanging_offset,
                "last_timestamp_ms": producers[ghost_id]["last_timestamp_ms"],
                "duration_min": hanging[0]["duration_min"],
            }
        ]
        assert txn(cluster_dir, "find-hanging", "--topic", TOPIC, "--partition", "0") == []

        # Refused aborts change nothing.
        before = offsets(node)
        assert "no open transaction starts at offset" in refused(
            cluster_dir, "abort", "--topic", TOPIC, "--partition", "1", "--start-offset", "999"
        )
        assert f"is at epoch {ghost_epoch}, not {ghost_epoch + 1}" in refused(
            cluster_dir,
            "abort",
            "--topic",
            TOPIC,
            "--partition",
            "1",
            "--producer-id",
            str(ghost_id),
            "--producer-epoch",
            str(ghost_epoch + 1),
            "--coordinator-epoch",
            "0",
        )
        assert offsets(node) == before

        aborted = txn(
            cluster_dir, "abort", "--topic", TOPIC, "--partition", "1", "--start-offset",
            str(hanging_offset),
        )  # fmt: skip
        assert aborted[0]["producer_id"] == ghost_id
        assert offsets(node)[0] == live_offset  # the LSO moved on to the live transaction
        assert txn(cluster_dir, "find-hanging") == []
        live.commit_transaction()
    finally:
        live.close()
        ghost.close()

    with Consumer(bootstrap, isolation_level="read_committed") as consumer:
        consumer.assign([HANGING_TP])
        values: list[bytes | None] = []
        LocalCluster.wait_until(
            lambda: values.extend(r.value for r in consumer.poll(200)) or b"live-1" in values,
            30,
            "read_committed did not get past the aborted transaction",
        )
        assert values == [b"live-1"]


def test_bootstrap_server_and_clear_errors(cluster_dir: Path) -> None:
    bootstrap = ",".join(LocalCluster(cluster_dir).bootstrap())
    result = raftcoord("txn", "list", "--bootstrap-server", bootstrap, "--json")
    assert result.returncode == 0 and isinstance(json.loads(result.stdout), list)
    assert "transactional id 'nobody' not found" in refused(cluster_dir, "describe", "nobody")
    assert "no topic 'nothing'" in refused(cluster_dir, "find-hanging", "--topic", "nothing")
    assert "no partition nothing-0" in refused(cluster_dir, "describe-producers", "nothing", "0")
    assert "--producer-epoch" in refused(
        cluster_dir, "abort", "--topic", "x", "--partition", "0", "--producer-id", "1"
    )
    # Without --coordinator-epoch the partition's own is used: none for an unknown partition.
    assert "no partition x-0" in refused(
        cluster_dir, "abort", "--topic", "x", "--partition", "0", "--producer-id", "1",
        "--producer-epoch", "0",
    )  # fmt: skip
    table = raftcoord("txn", "list", "--cluster-dir", str(cluster_dir))
    assert table.returncode == 0
    # Into a pipe: each row on one line, however wide, never wrapped.
    [header] = [line for line in table.stdout.splitlines() if "TransactionalId" in line]
    assert "TransactionState" in header and "TransactionDurationMs" in header
    empty = raftcoord("txn", "list", "--bootstrap-server", "", "--cluster-dir", str(cluster_dir))
    assert empty.returncode == 64 and "names no address" in empty.stderr
    nothing = raftcoord("txn", "find-hanging", "--cluster-dir", str(cluster_dir))
    assert nothing.returncode == 0 and nothing.stdout.strip() == "no hanging transaction"


def test_describe_prints_one_line_per_field(cluster_dir: Path) -> None:
    with TransactionalProducer(LocalCluster(cluster_dir).bootstrap(), "described") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(TOPIC, b"v", partition=0)
        producer.commit_transaction()
    result = raftcoord("txn", "describe", "described", "--cluster-dir", str(cluster_dir))
    assert result.returncode == 0, result.stderr
    fields = dict(line.split(":", 1) for line in result.stdout.splitlines())
    assert len(fields) == 12
    assert fields["TransactionalId"].strip() == "described"
    assert fields["TransactionState"].strip() in ("CompleteCommit", "PrepareCommit")
    assert fields["TopicPartitions"].strip() in ("", f"{TOPIC}-0")


def test_topic_describe_takes_the_topic_as_topic_create_does(cluster_dir: Path) -> None:
    where = ("--cluster-dir", str(cluster_dir))
    listed = raftcoord("topic", "describe", TOPIC, "--json", *where)
    assert listed.returncode == 0, listed.stderr
    assert {r["topic"] for r in json.loads(listed.stdout)} == {TOPIC}
    missing = raftcoord("topic", "describe", "absent", *where)
    assert missing.returncode == 1
    assert missing.stderr == "raftcoord topic describe: topic 'absent' does not exist\n"
