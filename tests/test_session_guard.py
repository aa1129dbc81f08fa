"""Nodes started by a test session die with it (tests/session_guard.py).

A pytest session of its own starts a small cluster and holds it; it is then
sent SIGTERM (its fixtures' teardown stops the cluster) or SIGKILL (no
teardown runs: each node notices that the session's process is gone). Either
way every node must be gone within seconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raftcoord.cluster.launcher import LocalCluster

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
#: How long the inner session may take to have its cluster up.
START_TIMEOUT_S = 90.0
#: How long the nodes may take to stop once the session was signalled.
STOP_TIMEOUT_S = 20.0

#: The inner session's exit status after each signal.
EXIT_STATUS = {"SIGTERM": 128 + signal.SIGTERM, "SIGKILL": -signal.SIGKILL}

INNER_TEST = """
import os
import time
from pathlib import Path

from tests.local_cluster import running_cluster


def test_holds_a_cluster():
    directory = Path(os.environ["INNER_CLUSTER_DIR"])
    options = dict(coordinators=1, shards=1, partition_nodes=1, kafka_listeners=1)
    with running_cluster(directory, **options):
        (directory / "ready").touch()
        time.sleep(600)
"""


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGKILL"])
def test_nodes_die_with_the_test_session(tmp_path: Path, signal_name: str) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_inner.py").write_text(INNER_TEST)
    cluster_dir = tmp_path / "cluster"
    cluster_dir.mkdir()
    log = (tmp_path / "inner.log").open("wb")
    inner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.session_guard",
            "-p",
            "no:cacheprovider",
            "-q",
            str(tmp_path / "test_inner.py"),
        ],
        cwd=ROOT,
        env={**os.environ, "INNER_CLUSTER_DIR": str(cluster_dir)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    cluster: LocalCluster | None = None
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (cluster_dir / "ready").exists():
            assert inner.poll() is None, (tmp_path / "inner.log").read_text()
            assert time.monotonic() < deadline, "the inner session's cluster never came up"
            time.sleep(0.1)
        cluster = LocalCluster(cluster_dir)
        assert cluster.state is not None
        nodes = [n.node_id for n in cluster.state.nodes]
        assert len(nodes) == 3 and all(cluster.alive(n) for n in nodes)

        inner.send_signal(getattr(signal, signal_name))
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while left := [n for n in nodes if cluster.alive(n)]:
            assert time.monotonic() < deadline, f"nodes {left} outlived the session"
            time.sleep(0.1)
        # SIGTERM ends the session through pytest (teardown ran), with 128 + 15.
        assert inner.wait(STOP_TIMEOUT_S) == EXIT_STATUS[signal_name]
    finally:
        with contextlib.suppress(ProcessLookupError):
            inner.kill()
        inner.wait()
        log.close()
        if cluster is not None and cluster.state is not None:
            for record in cluster.state.nodes:
                if cluster.alive(record.node_id):
                    os.kill(record.pid, signal.SIGKILL)
