"""The chaos workload with Kafka's client (``--client kafka``): confluent-kafka
through two Kafka gateways on a local cluster while the nemesis kills
coordinator leaders and restarts partition-log nodes and, where network
namespaces can be made (every node and gateway in its own), cuts gateways
off from the coordinators; the independent checker and the Spark audit
judge the history and the logs.

The seed is printed; RAFTCOORD_CHAOS_SEED=N replays a run's choices.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raftcoord.chaos.options import Options
from raftcoord.chaos.workload import Workload
from raftcoord.cluster import netns
from raftcoord.cluster.launcher import ClusterError
from spark.audit import run_audit
from tests.history_checker import check
from tests.history_format import read_history
from tests.local_cluster import running_cluster

pytest.importorskip("confluent_kafka")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SEED = int(os.environ.get("RAFTCOORD_CHAOS_SEED", "20261124"))
NETNS = netns.unavailable() is None
FAULTS = ("leader-kill", "plog-restart", *(("gateway-partition",) if NETNS else ()))


@dataclass
class KafkaRun:
    cluster_dir: Path
    history: Path
    events: list[dict[str, Any]]
    summary: dict[str, Any]


@pytest.fixture(scope="module")
def kafka_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaRun]:
    print(f"chaos seed {SEED} (replay with RAFTCOORD_CHAOS_SEED={SEED})")
    root = tmp_path_factory.mktemp("chaos-kafka")
    with running_cluster(
        root / "cluster", partition_nodes=2, kafka_listeners=2, netns=NETNS
    ) as cluster:
        options = Options(
            seed=SEED,
            duration_s=24,
            producers=2,
            workers=2,
            pollers=1,
            input_records=400,
            nemesis=FAULTS,
            fault_interval_s=2.0,
            drain_timeout_s=120,
            client_kind="kafka",
            every_fault=True,
        )
        history = root / "history.jsonl"
        summary = Workload(cluster, options, history, say=print).run()
        yield KafkaRun(cluster.data_dir, history, read_history(history), summary)


def test_the_run_finished_with_faults(kafka_run: KafkaRun) -> None:
    summary = kafka_run.summary
    assert summary["crashed"] == [] and summary["unfinished"] == []
    assert all(summary["faults"].get(kind, 0) >= 1 for kind in FAULTS), summary["faults"]
    assert summary["ops"]["commit"]["ok"] > 0 and summary["ops"]["offsets"]["ok"] > 0


def test_the_history_names_no_producer_identity(kafka_run: KafkaRun) -> None:
    """librdkafka does not expose the producer id and epoch (docs/chaos.md)."""
    assert not any("producer_id" in e for e in kafka_run.events)


def test_the_independent_checker_finds_nothing(kafka_run: KafkaRun) -> None:
    violations = check(kafka_run.history)
    assert {name: found[:3] for name, found in violations.items() if found} == {}


def test_the_audit_passes(kafka_run: KafkaRun, spark: Any, tmp_path: Path) -> None:
    outcome = run_audit(spark, kafka_run.cluster_dir, kafka_run.history, tmp_path / "report")
    assert outcome.verdict == "PASS", [
        (r.name, r.status, r.skipped, r.examples[:2]) for r in outcome.results if r.status != "PASS"
    ]


def test_the_kafka_client_needs_gateways(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "cluster", coordinators=1, shards=1, partition_nodes=1) as c:
        with pytest.raises(ClusterError, match="--kafka-listeners"):
            Workload(c, Options(seed=1, client_kind="kafka"), tmp_path / "h.jsonl")
