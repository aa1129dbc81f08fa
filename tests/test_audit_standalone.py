"""``raftcoord audit`` on a Spark standalone cluster: a master and a worker started with the
``spark-class`` script that ships inside pyspark, on 127.0.0.1, both killed at the end."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pyspark
import pytest

from raftcoord.cluster.launcher import free_ports
from spark import synthetic

# Spark jobs are slow on a busy 2-core machine: a generous bound.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
RAFTCOORD = Path(sys.executable).parent / "raftcoord"


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


def _alive_workers(ui_port: int, master_log: Path) -> int:
    """The master's count of alive workers, asked of its web UI: the port it
    was given, or the one it says it bound instead (Spark moves to the next
    port when another process holds it)."""
    bound = re.findall(r"MasterWebUI.*?started at http://[^:]+:(\d+)", _text(master_log))
    port = int(bound[-1]) if bound else ui_port
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/", timeout=2) as answer:
            return int(json.load(answer).get("aliveworkers", 0))
    except (OSError, ValueError):  # not up yet, or another service's page
        return 0


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[str]:
    """A master and one worker; yields the master's URL."""
    port, ui_port, worker_ui = free_ports(3)
    env = {**os.environ, "SPARK_LOG_DIR": str(tmp_path), "SPARK_NO_DAEMONIZE": "1"}
    procs: list[subprocess.Popen[bytes]] = []
    url = f"spark://127.0.0.1:{port}"

    def start(args: list[str], name: str) -> None:
        with (tmp_path / f"{name}.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [str(SPARK_CLASS), *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            )

    try:
        start(
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
            ],
            "master",
        )
        start(
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--webui-port",
                str(worker_ui),
                "--cores",
                "2",
                "--memory",
                "2g",
                "--work-dir",
                str(tmp_path / "work"),
                url,
            ],
            "worker",
        )
        master_log = tmp_path / "master.log"
        _wait(lambda: _alive_workers(ui_port, master_log) == 1, 120, "the worker to register")
        yield url
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_audit_runs_on_a_standalone_master(standalone: str, tmp_path: Path) -> None:
    run = synthetic.generate(300, seed=3)
    # One committed batch appended twice, in a topic no worker reads: the verdict is FAIL,
    # and so is the exit status.
    batches = next(
        b
        for (topic, _), b in sorted(run.logs.items())
        if topic == synthetic.EVENTS and b[-1].control == "COMMIT" and b[-2].control is None
    )
    batches.insert(len(batches) - 1, copy.deepcopy(batches[-2]))
    cluster, history = run.write(tmp_path / "run")
    report = tmp_path / "report"
    done = subprocess.run(
        [
            str(RAFTCOORD),
            "audit",
            "--cluster-dir",
            str(cluster),
            "--history",
            str(history),
            "--master",
            standalone,
            "--report",
            str(report),
            "--shuffle-partitions",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=1100,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "verdict: FAIL" in done.stdout
    document = json.loads((report / "audit.json").read_text())
    assert document["inputs"]["master"] == standalone
    assert {c["name"] for c in document["checks"] if c["status"] == "FAIL"} == {"duplicate"}
    assert (report / "audit.html").is_file()
