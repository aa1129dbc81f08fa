"""A Spark standalone cluster for the tests: a master and workers started with
the ``spark-class`` script that ships inside pyspark, on 127.0.0.1, all
killed at the end."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyspark

from raftcoord.cluster.launcher import free_ports

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"


@dataclass(frozen=True)
class Standalone:
    #: The master's URL (spark://127.0.0.1:PORT).
    url: str
    #: Each worker's work directory: an application's executors leave theirs there.
    work_dirs: tuple[Path, ...]

    def executors(self) -> list[list[Path]]:
        """Per worker, the executor directories its applications ran."""
        return [sorted(d.glob("app-*/*")) for d in self.work_dirs]


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


@contextmanager
def standalone_cluster(directory: Path, workers: int = 1) -> Iterator[Standalone]:
    """A master and ``workers`` workers (2 cores, 2 GiB between them), their
    logs and work directories under ``directory``."""
    port, ui_port, *worker_uis = free_ports(2 + workers)
    env = {**os.environ, "SPARK_LOG_DIR": str(directory), "SPARK_NO_DAEMONIZE": "1"}
    procs: list[subprocess.Popen[bytes]] = []
    url = f"spark://127.0.0.1:{port}"
    work_dirs = tuple(directory / f"work-{n}" for n in range(workers))

    def start(args: list[str], name: str) -> None:
        with (directory / f"{name}.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [str(SPARK_CLASS), *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            )

    directory.mkdir(parents=True, exist_ok=True)
    try:
        start(
            [
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port)),
            ],
            "master",
        )
        for n, (ui, work_dir) in enumerate(zip(worker_uis, work_dirs, strict=True)):
            start(
                [
                    "org.apache.spark.deploy.worker.Worker",
                    *("--host", "127.0.0.1", "--webui-port", str(ui)),
                    *("--cores", str(max(1, 2 // workers))),
                    *("--memory", f"{max(1, 2 // workers)}g"),
                    *("--work-dir", str(work_dir), url),
                ],
                f"worker-{n}",
            )
        master_log = directory / "master.log"
        _wait(
            lambda: _alive_workers(ui_port, master_log) == workers,
            120,
            f"{workers} workers to register",
        )
        yield Standalone(url, work_dirs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
