"""``node.scheduling``: a node process puts every one of its threads, those
running before and those started after, under SCHED_BATCH ("batch", the
default), or leaves them as they are ("normal"). Checked in a process of its
own, so that the test run keeps its scheduling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.local_cluster import running_cluster

pytestmark = pytest.mark.skipif(
    not hasattr(os, "SCHED_BATCH"), reason="no SCHED_BATCH on this platform"
)

_PROBE = """
import json, logging, os, sys, threading
from raftcoord.protocol.process import apply_scheduling

stop = threading.Event()
before = threading.Thread(target=stop.wait)
before.start()
apply_scheduling(sys.argv[1], logging.getLogger("probe"), 1)
seen = {}
def after():
    seen["after"] = os.sched_getscheduler(0)
started = threading.Thread(target=after)
started.start()
started.join()
seen["main"] = os.sched_getscheduler(0)
seen["before"] = os.sched_getscheduler(before.native_id)
stop.set()
print(json.dumps(seen))
"""


def policies(policy: str) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, policy], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_batch_puts_every_thread_under_sched_batch() -> None:
    assert policies("batch") == {
        "main": os.SCHED_BATCH,
        "before": os.SCHED_BATCH,
        "after": os.SCHED_BATCH,
    }


def test_normal_leaves_the_threads_as_they_are() -> None:
    inherited = os.sched_getscheduler(0)  # what the probe starts with
    assert policies("normal") == {"main": inherited, "before": inherited, "after": inherited}


@pytest.mark.slow
def test_every_thread_of_a_running_node_is_under_sched_batch(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "cluster", coordinators=1, shards=1, partition_nodes=1) as c:
        assert c.state is not None
        for node in c.state.nodes:
            threads = {
                int(task): os.sched_getscheduler(int(task))
                for task in os.listdir(f"/proc/{node.pid}/task")
            }
            assert set(threads.values()) == {os.SCHED_BATCH}, (node.kind, threads)
