"""The metrics' names and the monitoring files that use them: docs/metrics.md
lists exactly what each process kind's registry exports; every expression
of the alert rules and the Grafana dashboard names a documented metric and
parses (Prometheus's own promtool); the alert rules fire as their tests in
tests/prometheus/ say. Plus the pure pieces (error codes of answers, the
marker backlog, quantiles). Live endpoints: tests/test_metrics_cluster.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from prometheus_client.core import Metric

from marker_writer.book import MarkerBook
from marker_writer.model import DataPartition, Destination, DestinationKind
from partition_log.metrics import PartitionCollector, batches_per_fsync
from raftcoord.coordinator.metrics import CoordinatorCollector, quantile
from raftcoord.kafka.metrics import GatewayMetrics, first_error
from raftcoord.protocol.backoff import Backoff
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.metrics import Metrics, RpcMetrics, _error_reader
from raftcoord.protocol.types import TopicPartition, WriteMarkers
from raftcoord.protocol.v1 import coordinator_pb2, partition_log_pb2

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "metrics.md"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
ALERT_TESTS = REPO / "tests" / "prometheus" / "alerts_test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "raftcoord.json"

#: A metric name in an expression (histogram series drop their suffix below).
NAME = re.compile(r"\b((?:raftcoord|process|python)_[a-z0-9_]+)\b")
HISTOGRAM_SERIES = re.compile(r"_(bucket|sum|count)$")


def documented() -> dict[str, set[str]]:
    """docs/metrics.md's names per section (## heading -> names)."""
    sections: dict[str, set[str]] = {}
    current = ""
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
        match = re.match(r"\| `([a-z0-9_]+)` \|", line)
        if match:
            sections.setdefault(current, set()).add(match[1])
    return sections


def exported(*collectors: Any) -> set[str]:
    """The names a scrape shows for the families of ``collectors`` (a
    counter's with its ``_total``)."""
    names = set()
    for collector in collectors:
        family: Metric
        for family in collector.collect():
            names.add(family.name + "_total" if family.type == "counter" else family.name)
    return names


def registries() -> dict[str, set[str]]:
    """Each process kind's exported names, from the real collectors over
    empty nodes (a family is exported even without samples)."""
    coordinator = Metrics()
    RpcMetrics(coordinator)
    coordinator.fsyncs()
    node = SimpleNamespace(
        shards=[], markers=SimpleNamespace(metrics=lambda: []), data_dir=Path("/nonexistent")
    )
    coordinator.add(CoordinatorCollector(node))
    partition = Metrics()
    RpcMetrics(partition)
    partition.fsyncs()
    batches_per_fsync(partition)
    partition.add(PartitionCollector(lambda: [], lambda: 0))
    gateway = Metrics()
    GatewayMetrics(gateway, lambda: 0, lambda: 0)
    return {
        kind: exported(metrics.registry)
        for kind, metrics in (
            ("coordinator", coordinator),
            ("partition-log", partition),
            ("gateway", gateway),
        )
    }


def test_the_metrics_table_lists_exactly_what_each_process_exports() -> None:
    docs = documented()
    kinds = registries()
    every = docs["Every process"]
    servers = docs["Coordinators and partition-log nodes"]
    expected = {
        "coordinator": every | servers | docs["Coordinators"],
        "partition-log": every | servers | docs["Partition-log nodes"],
        "gateway": every | docs["Kafka gateways"],
    }
    for kind, names in kinds.items():
        ours = {n for n in names if n.startswith("raftcoord_")}
        assert expected[kind] <= names, (kind, sorted(expected[kind] - names))
        assert ours <= expected[kind], (kind, sorted(ours - expected[kind]))


def monitored_names() -> dict[str, set[str]]:
    """The metric names each monitoring file's expressions use."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    return {
        "alerts": set(NAME.findall(ALERTS.read_text().split("annotations")[0]))
        | {n for e in alert_expressions() for n in NAME.findall(e)},
        "dashboard": {n for e in exprs for n in NAME.findall(e)},
    }


def alert_expressions() -> list[str]:
    """The ``expr`` of every rule (the file's folded ``>-`` blocks joined)."""
    exprs, lines = [], ALERTS.read_text().splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("expr:"):
            rest = stripped[len("expr:") :].strip()
            if rest != ">-":
                exprs.append(rest)
                continue
            indent = len(lines[i + 1]) - len(lines[i + 1].lstrip())
            block = []
            for following in lines[i + 1 :]:
                if len(following) - len(following.lstrip()) < indent or not following.strip():
                    break
                block.append(following.strip())
            exprs.append(" ".join(block))
    return exprs


def test_every_alert_and_dashboard_expression_names_a_documented_metric() -> None:
    docs = set().union(*documented().values())
    known = docs | {"up"}
    for where, names in monitored_names().items():
        assert names, where
        unknown = {HISTOGRAM_SERIES.sub("", n) for n in names} - known
        assert not unknown, (where, sorted(unknown))
    assert len(alert_expressions()) == ALERTS.read_text().count("- alert:")


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool not found: `make install` installs Debian's prometheus package as root"
    return found


def test_the_alert_rules_parse_and_pass_their_tests() -> None:
    checked = subprocess.run(
        [promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [promtool(), "test", "rules", ALERT_TESTS.name],
        cwd=ALERT_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_dashboard_expression_parses(tmp_path: Path) -> None:
    """Each panel's query, checked as a recording rule by promtool."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    assert len(exprs) >= 20
    rules = tmp_path / "dashboard.yml"
    rules.write_text(
        "groups:\n  - name: dashboard\n    rules:\n"
        + "".join(
            f"      - record: dashboard:panel_{i}\n        expr: {json.dumps(e)}\n"
            for i, e in enumerate(exprs)
        )
    )
    checked = subprocess.run(
        [promtool(), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{len(exprs)} rules found" in checked.stdout


def test_an_answer_s_error_is_its_own_code_else_its_first_entry_s() -> None:
    top = _error_reader(coordinator_pb2.EndTxnResponse.DESCRIPTOR)
    assert top(coordinator_pb2.EndTxnResponse(error_code=ErrorCode.PRODUCER_FENCED)) == int(
        ErrorCode.PRODUCER_FENCED
    )
    per_partition = _error_reader(partition_log_pb2.ProduceResponse.DESCRIPTOR)
    answer = partition_log_pb2.ProduceResponse(
        partitions=[
            partition_log_pb2.PartitionProduceResponse(partition=0),
            partition_log_pb2.PartitionProduceResponse(
                partition=1, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER
            ),
        ]
    )
    assert per_partition(answer) == int(ErrorCode.NOT_LEADER_OR_FOLLOWER)
    assert per_partition(partition_log_pb2.ProduceResponse()) == 0


def test_a_kafka_answer_s_error_is_found_in_its_topics_and_partitions() -> None:
    assert first_error({"error_code": 0, "throttle_time_ms": 0}) == 0
    assert first_error({"error_code": 47}) == 47
    produce = {
        "responses": [
            {"name": "t", "partition_responses": [{"index": 0, "error_code": 0}]},
            {"name": "u", "partition_responses": [{"index": 3, "error_code": 6}]},
        ]
    }
    assert first_error(produce) == 6
    assert first_error({"a": [{"b": [{"c": [{"error_code": 9}]}]}]}) == 9  # three lists down
    assert first_error({"a": [{"b": [{"c": [{"d": [{"error_code": 9}]}]}]}]}) == 0  # four


def test_the_marker_backlog_counts_each_destination_and_its_oldest_transaction() -> None:
    book = MarkerBook(coordinator_epoch=1, backoff=Backoff())
    first = WriteMarkers("a", 1, 0, 1, True, (TopicPartition("t", 0), TopicPartition("t", 1)), ())
    second = WriteMarkers("b", 2, 0, 1, True, (TopicPartition("t", 0),), ())
    assert book.add(first, now=10.0)
    assert book.add(second, now=12.0)
    assert book.backlog(13.0) == {"retrying": (3, 3.0)}
    here = Destination(DestinationKind.PARTITION_LOG, 101, "127.0.0.1:1")
    there = Destination(DestinationKind.PARTITION_LOG, 102, "127.0.0.1:2")
    for marker in book.due_markers(13.0):
        partition = marker.participant
        assert isinstance(partition, DataPartition)
        book.route(marker, here if partition.partition == 0 else there)
    backlog = book.backlog(14.0)
    assert backlog == {str(here): (2, 4.0), str(there): (1, 4.0)}
    (batch,) = [b for b in book.take_batches(10) if b.destination == there]
    assert book.backlog(14.0)[str(there)] == (1, 4.0)  # in flight still counts
    assert book.metrics(14.0)["backlog"] == book.backlog(14.0)
    assert batch.marker_count == 1


def test_quantile_is_the_nearest_rank() -> None:
    assert quantile([], 0.99) == 0.0
    assert quantile([5.0], 0.99) == 5.0
    values = [float(v) for v in range(1, 101)]
    assert quantile(values, 0.99) == 99.0
    assert quantile(values, 0.5) == 50.0
    assert quantile(list(reversed(values)), 1.0) == 100.0


@pytest.mark.parametrize("kind", ["coordinator", "partition-log", "gateway"])
def test_each_registry_is_its_own(kind: str) -> None:
    """Two processes' worth in one interpreter (the tests) do not collide."""
    assert registries()[kind] == registries()[kind]


def test_a_method_s_measured_handler_is_made_once_and_counts_every_call() -> None:
    metrics = Metrics()
    interceptor = RpcMetrics(metrics)
    answers = iter(
        [
            partition_log_pb2.ProduceResponse(),
            partition_log_pb2.ProduceResponse(
                partitions=[
                    partition_log_pb2.PartitionProduceResponse(
                        error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER
                    )
                ]
            ),
        ]
    )
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: next(answers))
    asked: list[str] = []

    def continuation(details: Any) -> Any:
        asked.append(details.method)
        return handler

    details = SimpleNamespace(method="/raftcoord.v1.PartitionLog/Produce")
    first = interceptor.intercept_service(continuation, details)
    assert interceptor.intercept_service(continuation, details) is first
    assert asked == [details.method]
    # A method the server does not have is asked for every time, kept never.
    for name in ("/x/A", "/x/B"):
        assert interceptor.intercept_service(lambda d: None, SimpleNamespace(method=name)) is None
    assert list(interceptor._handlers) == [details.method]
    request = partition_log_pb2.ProduceRequest()
    first.unary_unary(request, None)
    first.unary_unary(request, None)

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"method": "Produce", **labels})

    assert sample("raftcoord_rpc_requests_total", code="NONE") == 1
    assert sample("raftcoord_rpc_requests_total", code="NOT_LEADER_OR_FOLLOWER") == 1
    assert sample("raftcoord_rpc_duration_seconds_count") == 2
