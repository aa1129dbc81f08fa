"""The main job (interim): ``make demo`` / ``raftcoord demo``.

Starts a local cluster (3 coordinators x 3 shards, 3 partition-log nodes),
runs the two example programs of ``examples/`` against it — a transactional
producer that aborts on an exception, and consume-transform-produce with a
kill -9 of the transaction coordinator's leader in the middle — then reads
everything back with a read_committed consumer, prints what was sent
against what is seen, and stops the cluster. Exit status 0 when every check
holds.

The chaos workload and the Spark audit will replace this.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from raftcoord.client import Admin, Consumer, Producer, TopicPartition
from raftcoord.cluster import LocalCluster
from raftcoord.v1 import coordinator_pb2, coordinator_pb2_grpc

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
COPIER_ID = "demo-copier"


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples.{name}", EXAMPLES / f"{name}.py")
    if spec is None or spec.loader is None:
        raise FileNotFoundError(EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def _coordinator_of(bootstrap: list[str], transactional_id: str) -> int:
    with grpc.insecure_channel(bootstrap[0]) as channel:
        answer = coordinator_pb2_grpc.TransactionCoordinatorStub(channel).FindCoordinator(
            coordinator_pb2.FindCoordinatorRequest(
                key=transactional_id, key_type=coordinator_pb2.TRANSACTION
            ),
            timeout=5,
        )
    return int(answer.node_id)


def _table(rows: list[tuple[str, Any, Any]]) -> tuple[str, bool]:
    header = ("check", "expected", "seen", "")
    cells = [header] + [(c, str(e), str(s), "ok" if e == s else "FAIL") for c, e, s in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(4)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines), all(e == s for _, e, s in rows)


def run_demo(data_dir: Path | None = None, records: int = 300) -> int:
    """Run the demo; returns the exit status (0: every check holds)."""
    transactional = _example("transactional_producer")
    copier = _example("consume_transform_produce")
    own_dir = data_dir is None
    root = Path(tempfile.mkdtemp(prefix="raftcoord-demo-")) if data_dir is None else data_dir
    cluster = LocalCluster(root / "cluster")
    started = time.monotonic()
    try:
        _step(f"starting a local cluster in {cluster.data_dir}")
        cluster.up(coordinators=3, shards=3, partition_nodes=3)
        print(cluster.status_table())
        bootstrap = cluster.bootstrap()
        with Admin(bootstrap) as admin:
            admin.create_topics({"orders": 3, "input": 3, "output": 3})

        _step("example 1: a transactional producer that aborts on an exception")
        orders = transactional.produce_orders(bootstrap, "orders", "demo-orders")
        seen_orders = transactional.read_topic(bootstrap, "orders", "read_committed")
        print(f"committed {len(orders['committed'])} orders, aborted {len(orders['aborted'])}")

        _step(f"example 2: consume-transform-produce of {records} records")
        values = [b"record-%04d" % i for i in range(records)]
        with Producer(bootstrap) as producer:
            for value in values:
                producer.send("input", key=value, value=value)
            producer.flush()
        progress = {"copied": 0}
        third = threading.Event()
        failure: list[BaseException] = []

        def on_commit(copied: int) -> None:
            progress["copied"] = copied
            print(f"  copied {copied}/{records}", flush=True)
            if copied >= records // 3:
                third.set()

        def work() -> None:
            try:
                copier.copy_topic(
                    bootstrap, "input", "output", "demo-group", COPIER_ID, 20, on_commit=on_commit
                )
            except BaseException as exc:  # reported below
                failure.append(exc)
            finally:
                third.set()

        worker = threading.Thread(target=work, name="copier")
        worker.start()
        third.wait(timeout=120)
        victim = _coordinator_of(bootstrap, COPIER_ID)
        print(f"  kill -9 coordinator node {victim} (leader of {COPIER_ID!r})", flush=True)
        cluster.kill(victim)
        worker.join(timeout=300)
        if worker.is_alive() or failure:
            print(f"the copier failed: {failure[0] if failure else 'did not finish in time'}")
            return 1
        cluster.start(victim)
        print(f"  restarted node {victim}")

        _step("what a read_committed consumer sees")
        output = transactional.read_topic(bootstrap, "output", "read_committed")
        counts = Counter(output)
        expected = Counter(b"copied:" + v for v in values)
        inputs = [TopicPartition("input", p) for p in range(3)]
        with Consumer(bootstrap, group_id="demo-group", isolation_level="read_committed") as c:
            ends = c.end_offsets(inputs)
            committed = {tp: c.committed(tp) for tp in inputs}
        rows: list[tuple[str, Any, Any]] = [
            ("orders: committed records visible", len(orders["committed"]), len(seen_orders)),
            (
                "orders: aborted records visible",
                0,
                len(set(seen_orders) & set(orders["aborted"])),
            ),
            ("input records sent", records, len(values)),
            ("output records (read_committed)", records, len(output)),
            ("output records copied twice", 0, sum(1 for n in counts.values() if n > 1)),
            ("input records missing from output", 0, len(expected - counts)),
            ("output records not from input", 0, len(counts - expected)),
            (
                "group offsets = input end offsets",
                [ends[tp] for tp in inputs],
                [committed[tp] for tp in inputs],
            ),
        ]
        table, ok = _table(rows)
        print(table)
        elapsed = time.monotonic() - started
        if ok:
            print(
                f"\nVERDICT: PASS - every input record copied exactly once across a leader "
                f"kill -9 ({elapsed:.0f} s)"
            )
            return 0
        print(f"\nVERDICT: FAIL - see the table above ({elapsed:.0f} s)")
        return 1
    finally:
        if cluster.state is not None:
            cluster.down()
            print("cluster stopped")
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)
