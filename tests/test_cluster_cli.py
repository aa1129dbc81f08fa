"""The command line of the node and the local launcher, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def raftcoord(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftcoord.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_node_with_a_missing_config_is_a_clear_error(tmp_path: Path) -> None:
    result = raftcoord("node", "--config", str(tmp_path / "nope.toml"), "--id", "1")
    assert result.returncode == 2
    assert "config file not found" in result.stderr and "Traceback" not in result.stderr


def test_node_with_an_invalid_config_or_id(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("shard_count = 0\n")
    result = raftcoord("node", "--config", str(bad), "--id", "1")
    assert result.returncode == 2 and "shard_count" in result.stderr
    good = tmp_path / "good.toml"
    good.write_text(
        '[[coordinators]]\nid = 1\ngrpc = "127.0.0.1:1"\n'
        'raft = ["127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"]\n'
    )
    result = raftcoord("node", "--config", str(good), "--id", "7")
    assert result.returncode == 2 and "no coordinator with id 7" in result.stderr
    result = raftcoord("partition-node", "--config", str(good), "--id", "7")
    assert result.returncode == 2 and "no partition-log node with id 7" in result.stderr


@pytest.mark.slow
def test_cluster_up_status_kill_start_down(tmp_path: Path) -> None:
    data = str(tmp_path / "c")
    pids: list[int] = []
    try:
        up = raftcoord("cluster", "up", "--data-dir", data, "--shards", "2")
        assert up.returncode == 0, up.stderr
        state = json.loads((Path(data) / "cluster.json").read_text())
        pids = [n["pid"] for n in state["nodes"]]
        assert len(pids) == 6 and all(Path(n["log"]).exists() for n in state["nodes"])
        assert [n["kind"] for n in state["nodes"]] == ["coordinator"] * 3 + ["partition-log"] * 3
        assert up.stdout.count("leader") == 2  # one leader per shard in the table
        assert up.stdout.count("partition-log, serving") == 3
        killed = raftcoord("cluster", "kill", "102", "--data-dir", data)
        assert killed.returncode == 0
        started = raftcoord("cluster", "start", "102", "--data-dir", data)
        assert started.returncode == 0, started.stderr
        killed = raftcoord("cluster", "kill", "2", "--data-dir", data)
        assert killed.returncode == 0
        status = raftcoord("cluster", "status", "--data-dir", data)
        assert "no" in status.stdout.splitlines()[2].split()  # node 2 not alive
        started = raftcoord("cluster", "start", "2", "--data-dir", data)
        assert started.returncode == 0, started.stderr
        state = json.loads((Path(data) / "cluster.json").read_text())
        pids = [n["pid"] for n in state["nodes"]]
    finally:
        down = raftcoord("cluster", "down", "--data-dir", data)
    assert down.returncode == 0, down.stderr
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", pid
    assert raftcoord("cluster", "status", "--data-dir", data).stdout.count(" no ") >= 6
