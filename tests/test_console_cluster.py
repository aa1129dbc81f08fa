"""What the console collects from a real cluster (3 coordinators x 3
shards, 3 partition-log nodes, plaintext), rendered as its pages: a consumer
group that only ever committed offsets in a transaction is listed, Empty as
in Kafka; its lag is Kafka's (log end offset minus committed offset) also
when the committed offset is past the last stable offset; and with every
coordinator down the cluster page counts the coordinators the cluster has.
The console in a browser: tests/test_console_browser.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from raftcoord.client import Admin, Producer, TopicPartition, TransactionalProducer
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.console import model
from raftcoord.console.app import render
from raftcoord.console.collect import Collector, ConsoleOptions
from tests.local_cluster import running_cluster

pytestmark = pytest.mark.slow

TOPIC = "in"
IN_0 = TopicPartition(TOPIC, 0)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "cluster") as cluster:
        yield cluster


def test_groups_lag_and_a_cluster_without_coordinators(cluster: LocalCluster) -> None:
    bootstrap = cluster.bootstrap()
    with Admin(bootstrap) as admin:
        admin.create_topics({TOPIC: 1})
        nodes = admin.describe_cluster()
    # Offset 0: a transaction left open (the last stable offset stays 0);
    # offsets 1-3: plain records.
    with (
        TransactionalProducer(bootstrap, "open", transaction_timeout_ms=600_000) as open_txn,
        Producer(bootstrap) as plain,
        TransactionalProducer(bootstrap, "etl") as etl,
    ):
        open_txn.init_transactions()
        open_txn.begin_transaction()
        open_txn.send(TOPIC, b"open", partition=0).result(timeout=30)
        for value in (b"a", b"b", b"c"):
            plain.send(TOPIC, value, partition=0).result(timeout=30)
        # Group "etl" commits offset 3 (past the last stable offset) in a
        # transaction, and never has a member.
        etl.init_transactions()
        etl.begin_transaction()
        etl.send_offsets_to_transaction({IN_0: 3}, "etl")
        etl.commit_transaction()

        with Admin(bootstrap) as admin:
            assert admin.list_consumer_groups() == {"etl": "Empty"}
            described = admin.describe_consumer_groups(["etl", "never"])
        assert (described["etl"].state, described["never"].state) == ("Empty", "Dead")

        options = ConsoleOptions(bootstrap=bootstrap, request_timeout_ms=3_000)
        collector = Collector(options, nodes)  # no --group: the cluster lists it
        try:
            snapshot = collector.collect()
            assert snapshot.stable_offsets == {IN_0: 0}, snapshot.errors
            assert snapshot.log_end_offsets == {IN_0: 4}
            [etl_row] = model.groups_view(snapshot)
            assert (etl_row.group_id, etl_row.state, etl_row.lag) == ("etl", "Empty", 1)
            [offset] = etl_row.offsets
            assert (offset.committed, offset.lag, offset.held_back) == (3, 1, 1)
            groups_page = render("groups", snapshot, options, snapshot.taken_ms)
            assert 'class="pill group-state">Empty<' in groups_page
            assert 'class="num lag">1<' in groups_page

            open_txn.abort_transaction()
            for node in cluster.coordinators():
                cluster.kill(node.node_id)
            down = collector.collect()
            assert down.coordinators is None and down.errors
            view = model.cluster_view(down)
            assert (len(view.coordinators), view.coordinators_answering) == (3, 0)
            assert view.partition_nodes_answering is None and len(view.partition_nodes) == 3
            cluster_page = render("cluster", down, options, down.taken_ms)
            assert '<div class="value">0 / 3</div>' in cluster_page
            assert '<div class="value">- / 3</div>' in cluster_page
        finally:
            collector.stop()
