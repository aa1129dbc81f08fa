"""The metrics endpoints of a running cluster: every process serves what
docs/metrics.md lists for its kind, and the numbers follow what happens (a
transaction open, then committed; requests, bytes, fsyncs); with ``[tls]``
only the cluster's principals (and ``metrics_users``) are answered, and
silent connections hold up no scrape."""

from __future__ import annotations

import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftcoord.client import Admin, TopicPartition, TransactionalProducer
from raftcoord.cluster.launcher import LocalCluster, NodeRecord
from tests.local_cluster import running_cluster
from tests.test_metrics import documented

pytestmark = pytest.mark.slow

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(address: str, context: ssl.SSLContext | None = None) -> tuple[set[str], Samples]:
    """The family names (a counter's with ``_total``) and samples of one endpoint."""
    scheme = "http" if context is None else "https"
    with urllib.request.urlopen(f"{scheme}://{address}/metrics", timeout=5, context=context) as r:
        text = r.read().decode()
    names, samples = set(), {}
    for family in text_string_to_metric_families(text):
        names.add(family.name + "_total" if family.type == "counter" else family.name)
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return names, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        v for (n, have), v in samples.items() if n == name and set(labels.items()) <= set(have)
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("metrics")
    with running_cluster(
        root / "cluster", shards=2, partition_nodes=1, kafka_listeners=1
    ) as running:
        yield running


def nodes(cluster: LocalCluster) -> list[NodeRecord]:
    assert cluster.state is not None
    return cluster.state.nodes


def by_kind(cluster: LocalCluster, kind: str) -> list[NodeRecord]:
    return [n for n in nodes(cluster) if n.kind == kind]


def test_each_process_serves_what_the_table_lists_for_its_kind(cluster: LocalCluster) -> None:
    docs = documented()
    every, servers = docs["Every process"], docs["Coordinators and partition-log nodes"]
    expected = {
        "coordinator": every | servers | docs["Coordinators"],
        "partition-log": every | servers | docs["Partition-log nodes"],
        "kafka-gateway": every | docs["Kafka gateways"],
    }
    status = {n["node"]: n["metrics"] for n in cluster.status()}
    for record in nodes(cluster):
        assert record.metrics and status[record.node_id] == record.metrics
        names, _ = scrape(record.metrics)
        ours = {n for n in names if n.startswith("raftcoord_")}
        # A snapshot's age appears once a shard took one; none has yet.
        wanted = expected[record.kind] - {"raftcoord_shard_snapshot_age_seconds"}
        assert wanted <= names, (record.kind, sorted(wanted - names))
        assert ours <= expected[record.kind], (record.kind, sorted(ours - expected[record.kind]))


def test_the_numbers_follow_a_transaction(cluster: LocalCluster) -> None:
    (partition_node,) = by_kind(cluster, "partition-log")
    coordinators = by_kind(cluster, "coordinator")
    with Admin(cluster.bootstrap()) as admin:
        admin.create_topics({"metered": 1}, exist_ok=True)

    def coordinator_sum(name: str, **labels: str) -> float:
        return sum(value(scrape(c.metrics)[1], name, **labels) for c in coordinators)

    end_txns = coordinator_sum("raftcoord_rpc_requests_total", method="EndTxn", code="NONE")
    fsyncs = value(scrape(partition_node.metrics)[1], "raftcoord_fsync_duration_seconds_count")
    where = {"topic": "metered", "partition": "0"}
    with TransactionalProducer(cluster.bootstrap(), "metered-1") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("metered", b"x" * 100, partition=0)
        producer.flush()
        # Open: the coordinators count it Ongoing, the partition keeps its LSO back.
        LocalCluster.wait_until(
            lambda: coordinator_sum("raftcoord_transactions", state="ONGOING") >= 1,
            10,
            "the open transaction counted",
        )
        assert coordinator_sum("raftcoord_transaction_open_age_max_seconds") > 0
        _, samples = scrape(partition_node.metrics)
        assert value(samples, "raftcoord_partition_open_transactions", **where) == 1
        assert value(samples, "raftcoord_partition_lso_lag", **where) == 1
        assert value(samples, "raftcoord_rpc_received_bytes_total", method="Produce") > 100
        producer.commit_transaction()

    def settled() -> bool:
        _, samples = scrape(partition_node.metrics)
        return (
            value(samples, "raftcoord_partition_open_transactions", **where) == 0
            and value(samples, "raftcoord_partition_lso_lag", **where) == 0
        )

    LocalCluster.wait_until(settled, 10, "the marker written")
    _, samples = scrape(partition_node.metrics)
    assert value(samples, "raftcoord_partition_log_end_offset", **where) == 2  # record, marker
    assert value(samples, "raftcoord_partition_last_stable_offset", **where) == 2
    assert value(samples, "raftcoord_rpc_requests_total", method="WriteTxnMarkers") >= 1
    # The partition node's add of the partition, over the coordinator's link.
    assert coordinator_sum("raftcoord_rpc_requests_total", method="AddPartitionsToTxn") >= 1
    assert value(samples, "raftcoord_fsync_duration_seconds_count") > fsyncs
    # Every replica applies the completion, followers a heartbeat after the leader.
    LocalCluster.wait_until(
        lambda: (
            coordinator_sum("raftcoord_transactions", state="COMPLETE_COMMIT") == len(coordinators)
        ),
        10,
        "the commit completed on every replica",
    )
    assert coordinator_sum("raftcoord_transactions", state="ONGOING") == 0
    assert coordinator_sum("raftcoord_transactions", state="PREPARE_COMMIT") == 0
    assert (
        coordinator_sum("raftcoord_rpc_requests_total", method="EndTxn", code="NONE")
        == end_txns + 1
    )
    assert coordinator_sum("raftcoord_shard_role", role="leader") == 2  # one per shard
    assert coordinator_sum("raftcoord_rpc_duration_seconds_count", method="EndTxn") >= 1


def test_a_gateway_counts_its_connections_and_requests(cluster: LocalCluster) -> None:
    (gateway,) = by_kind(cluster, "kafka-gateway")
    _, before = scrape(gateway.metrics)
    cluster.status()  # asks the gateway ApiVersions on a connection of its own
    _, after = scrape(gateway.metrics)
    for name, labels in (
        ("raftcoord_kafka_requests_total", {"api": "ApiVersions", "error": "NONE"}),
        ("raftcoord_kafka_request_duration_seconds_count", {"api": "ApiVersions"}),
        ("raftcoord_kafka_connections_opened_total", {}),
    ):
        assert value(after, name, **labels) == value(before, name, **labels) + 1, name
    assert value(after, "process_cpu_seconds_total") > 0


def test_with_tls_only_the_clusters_principals_are_answered(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "cluster", shards=1, partition_nodes=1, tls=True) as cluster:
        address = cluster.coordinators()[0].metrics
        files = cluster.client_tls("admin")
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            scrape(address)  # plain HTTP
        anonymous = ssl.create_default_context(cafile=files["ssl_cafile"])
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            scrape(address, anonymous)  # TLS without a client certificate
        client = ssl.create_default_context(cafile=files["ssl_cafile"])
        client.load_cert_chain(files["ssl_certfile"], files["ssl_keyfile"])
        # Silent connections (no TLS handshake) hold up no scrape: each
        # handshake has a thread and a deadline of its own.
        silent = [socket.create_connection(address.rsplit(":", 1)) for _ in range(3)]
        try:
            names, samples = scrape(address, client)
        finally:
            for connection in silent:
                connection.close()
        assert "raftcoord_shard_role" in names
        assert value(samples, "raftcoord_shard_role", role="leader") == 1
        # A certificate of the CA that is not the cluster's nor a metrics user's.
        stranger_files = cluster.client_tls("client")
        stranger = ssl.create_default_context(cafile=stranger_files["ssl_cafile"])
        stranger.load_cert_chain(stranger_files["ssl_certfile"], stranger_files["ssl_keyfile"])
        with pytest.raises(urllib.error.HTTPError, match="403"):
            scrape(address, stranger)


def test_a_cluster_without_metrics_has_no_endpoints(tmp_path: Path) -> None:
    with running_cluster(
        tmp_path / "cluster", shards=1, partition_nodes=1, metrics=False
    ) as cluster:
        assert all(n["metrics"] == "" for n in cluster.status())
        assert cluster.state is not None
        assert "metrics" not in Path(cluster.state.config).read_text()
        with TransactionalProducer(cluster.bootstrap(), "unmetered") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send_offsets_to_transaction({TopicPartition("t", 0): 1}, "g")
            producer.commit_transaction()
