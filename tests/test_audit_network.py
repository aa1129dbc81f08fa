"""``raftcoord audit --cluster-config``: a cluster in network namespaces (with
TLS) audited in place, its data files read from its nodes over their DataFiles
RPC by the executors of a Spark standalone cluster with two workers. The audit
of a clean run passes; after a committed write is cut from one node's disk it
fails with ``lost-write`` (that audit in local mode: the network reader is the
same, and a second standalone application would only add its JVMs' start)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatch

from raftcoord.cluster import netns
from raftcoord.cluster.launcher import LocalCluster
from tests.spark_standalone import standalone_cluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1500),
    pytest.mark.skipif(
        netns.unavailable() is not None,
        reason=f"network namespaces cannot be created here: {netns.unavailable()}",
    ),
]

RAFTCOORD = Path(sys.executable).parent / "raftcoord"
_FRAMING = struct.Struct(">qi")  # base offset, length of the rest of the batch
_COMMIT = struct.pack(">hh", 0, 1)  # a control record's key: version 0, COMMIT


def run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RAFTCOORD), *args], capture_output=True, text=True, timeout=timeout)


def batches(segment: Path) -> list[tuple[int, DefaultRecordBatch]]:
    """(position, batch) of every batch in a segment."""
    data = segment.read_bytes()
    found, pos = [], 0
    while pos + _FRAMING.size <= len(data):
        _, length = _FRAMING.unpack_from(data, pos)
        size = _FRAMING.size + length
        found.append((pos, DefaultRecordBatch(data[pos : pos + size])))
        pos += size
    return found


def cut_a_committed_write(cluster_dir: Path) -> str:
    """Truncate a partition's newest segment where the data of its last
    committed transaction starts (at a batch boundary, so not a torn tail:
    disks that lost acknowledged writes), on every replica (they hold the
    same bytes). Returns the partition's directory."""
    for segment in sorted(cluster_dir.glob("partition-node-*/*-*/*.log"), reverse=True):
        found = batches(segment)
        for i in range(len(found) - 1, -1, -1):
            _, batch = found[i]
            records = list(batch) if batch.is_control_batch else []
            if not (records and records[0].key == _COMMIT):
                continue
            data = [
                p
                for p, b in found[:i]
                if b.producer_id == batch.producer_id and not b.is_control_batch
            ]
            if data:
                name = f"{segment.parent.name}/{segment.name}"
                for replica in cluster_dir.glob(f"partition-node-*/{name}"):
                    with replica.open("r+b") as f:
                        f.truncate(data[-1])
                return f"{segment.parent.parent.name}/{segment.parent.name}"
    raise AssertionError(f"no committed transaction in {cluster_dir}")


def audit(config: Path, history: Path, master: str, report: Path) -> tuple[int, Any, str]:
    done = run(
        "audit",
        "--cluster-config",
        str(config),
        "--history",
        str(history),
        "--master",
        master,
        "--report",
        str(report),
        timeout=1100,
    )
    document = json.loads((report / "audit.json").read_text())
    return done.returncode, document, done.stdout + done.stderr


def test_a_namespace_cluster_is_audited_through_its_nodes(tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    try:
        up = run(
            "cluster", "up", "--netns", "--tls", "--shards", "2", "--partition-nodes", "2",
            "--cluster-dir", str(data), timeout=180,
        )  # fmt: skip
        assert up.returncode == 0, up.stdout + up.stderr
        workload = run(
            "workload", "--cluster-dir", str(data), "--seed", "11", "--duration", "5",
            "--input-records", "200", timeout=300,
        )  # fmt: skip
        assert workload.returncode == 0, workload.stdout + workload.stderr
        config, history = data / "cluster.toml", data / "history.jsonl"
        cluster = LocalCluster(data)
        addresses = [n.grpc for n in (*cluster.coordinators(), *cluster.partition_nodes())]
        assert addresses and not any(a.startswith("127.") for a in addresses), addresses
        with standalone_cluster(tmp_path / "spark", workers=2) as spark:
            status, document, output = audit(config, history, spark.url, tmp_path / "clean")
            assert status == 0, output
            assert document["verdict"] == "PASS"
            assert document["inputs"]["cluster config"] == str(config)
            assert document["inputs"]["master"] == spark.url
            # The executors of both workers read the nodes.
            assert all(spark.executors()), spark.executors()

        # The damaged run, read over the nodes' RPC by a local-mode Spark (the
        # standalone master's part is shown above; this one is the verdict).
        where = cut_a_committed_write(data)
        status, document, output = audit(config, history, "local[2]", tmp_path / "cut")
        assert status == 1, output
        assert document["inputs"]["cluster config"] == str(config)
        failed = {c["name"] for c in document["checks"] if c["status"] == "FAIL"}
        assert "lost-write" in failed, (where, failed)
    finally:
        down = run("cluster", "down", "--cluster-dir", str(data), timeout=120)
        assert down.returncode == 0, down.stderr
