"""``raftcoord node|partition-node|kafka-gateway --check``: what a node would
refuse at its start (config, Raft key, certificates, data directory) is said
in one line with exit status 2, and a node that would start gets one line
saying what was checked; nothing starts and nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raftcoord.cli.main import main
from raftcoord.cluster import certs
from raftcoord.cluster.launcher import write_config
from raftcoord.protocol.config import SHAPE_FILE, check_shape, load_config
from raftcoord.protocol.data_dir import load_or_create


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A cluster of 3 coordinators and 3 partition-log nodes with ``[tls]``,
    its CA and every node's certificate in ``tls/`` beside it."""
    path = tmp_path / "cluster.toml"
    write_config(path, coordinators=3, shards=3, partition_nodes=3, kafka_listeners=1)
    with path.open("a") as out:
        out.write('\n[tls]\nca_file = "tls/ca.pem"\ncert_dir = "tls"\n')
    certs.make_cluster_certs(tmp_path / "tls", {n: ["127.0.0.1"] for n in (1, 2, 101, 201)}, ())
    return path


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """The exit status and the one line of ``raftcoord ARGS --check``."""
    status = main([*args, "--check"])
    out, err = capsys.readouterr()
    lines = (out + err).splitlines()
    assert len(lines) == 1, lines
    return status, lines[0]


def test_a_node_that_would_start_gets_one_line_and_nothing_is_written(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(config.parent.rglob("*"))
    status, line = check(capsys, "node", "--config", str(config), "--id", "1")
    assert status == 0
    assert f"config {config}" in line and "Raft key" in line and "node-1.pem" in line
    assert f"data directory {config.parent / 'node-1'} (not made yet)" in line
    assert line.endswith("fine; nothing started")
    status, line = check(capsys, "partition-node", "--config", str(config), "--id", "101")
    assert status == 0 and "node-101.pem" in line and "Raft key" not in line
    status, line = check(capsys, "kafka-gateway", "--config", str(config), "--id", "201")
    assert status == 0 and "node-201.pem" in line
    assert sorted(config.parent.rglob("*")) == before


def test_a_data_directory_of_another_node_or_shape_is_named(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = config.parent / "node-1"
    load_or_create(data_dir, "coordinator", 1)
    check_shape(data_dir, load_config(config))
    status, line = check(capsys, "node", "--config", str(config), "--id", "1")
    assert status == 0 and f"data directory {data_dir}:" in line
    status, line = check(
        capsys, "node", "--config", str(config), "--id", "2", "--data-dir", str(data_dir)
    )
    assert status == 2 and "belongs to coordinator node 1" in line
    shape = json.loads((data_dir / SHAPE_FILE).read_text())
    (data_dir / SHAPE_FILE).write_text(json.dumps({**shape, "shard_count": 5}))
    status, line = check(capsys, "node", "--config", str(config), "--id", "1")
    assert status == 2 and "shard_count must stay 5" in line
    (config.parent / "file").write_text("")
    status, line = check(
        capsys, "partition-node", "--config", str(config), "--id", "101", "--data-dir",
        str(config.parent / "file"),
    )  # fmt: skip
    assert status == 2 and "is not a directory" in line


def test_a_raft_key_others_may_read_is_named(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (config.parent / "raft.key").chmod(0o644)
    status, line = check(capsys, "node", "--config", str(config), "--id", "1")
    assert status == 2 and "raft_key_file" in line and "chmod 600" in line


def test_certificates_a_node_could_not_serve_with_are_named(
    config: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    tls = config.parent / "tls"
    node = ["node", "--config", str(config), "--id", "1"]
    # Another CA's certificate.
    other = certs.make_ca(tmp_path / "other")
    certs.issue(other, tls, "node-1", "node-1", ["127.0.0.1"])
    status, line = check(capsys, *node)
    assert status == 2 and "node-1.pem is not signed by the CA" in line
    # One that does not name the node's host.
    ca = certs.load_ca(tls)
    certs.issue(ca, tls, "node-1", "node-1", ["10.0.0.11"])
    status, line = check(capsys, *node)
    assert status == 2 and "does not name 127.0.0.1" in line
    # Another node's key.
    certs.issue(ca, tls, "node-1", "node-1", ["127.0.0.1"])
    (tls / "node-1.key").write_bytes((tls / "node-2.key").read_bytes())
    status, line = check(capsys, *node)
    assert status == 2 and "node-1.key is not the key of" in line
    # No certificate at all.
    (tls / "node-101.pem").unlink()
    status, line = check(capsys, "partition-node", "--config", str(config), "--id", "101")
    assert status == 2 and "cannot read" in line and "node-101.pem" in line
