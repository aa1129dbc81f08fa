"""``raftcoord console`` in a real browser against a real cluster: a local
cluster over mutual TLS (3 coordinators x 3 shards, 3 partition-log nodes,
verification off so that a transaction can be left hanging), the console in
a process of its own on a free loopback port, and headless Chromium (the
system's, /usr/bin/chromium; `make install` installs it where it is
missing) driven by Playwright. The pages refresh themselves: every check
waits, within a bound, for what the page must come to show."""

from __future__ import annotations

import re
import select
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from raftcoord.client import Admin, Producer, TransactionalProducer
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.v1 import coordinator_pb2, coordinator_pb2_grpc, partition_log_pb2_grpc
from tests import plog_client
from tests.browser import chromium_page
from tests.local_cluster import running_cluster

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[1]
#: How long the console may take to show what happened in the cluster (it
#: asks every half second here).
SHOWN_MS = 30_000
TOPIC = "orders"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    path = tmp_path_factory.mktemp("console") / "cluster"
    with running_cluster(
        path, tls=True, settings={"transaction.partition.verification.enable": False}
    ) as cluster:
        yield cluster


@pytest.fixture
def console(cluster: LocalCluster, tmp_path: Path) -> Iterator[str]:
    """The console's URL; the console runs in a process of its own, stopped
    (killed if it must) after the test."""
    stderr = (tmp_path / "console.stderr").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "raftcoord.cli",
            "console",
            "--cluster-dir",
            str(cluster.data_dir),
            "--host",
            "127.0.0.1",
            "--port",
            "0",  # a free port: the console prints its URL
            "--refresh",
            "0.5",
            "--group",
            "billing",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=stderr,
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 30)
        line = process.stdout.readline().decode() if ready else ""
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert found, f"the console did not say where it serves: {line!r}, " + (
            tmp_path / "console.stderr"
        ).read_text(errors="replace")
        yield found.group(0)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        stderr.close()
        if process.stdout is not None:
            process.stdout.close()
        logged = (tmp_path / "console.stderr").read_text(errors="replace")
        assert "Traceback" not in logged, logged


@pytest.fixture
def page() -> Iterator[Page]:
    with chromium_page(1400) as opened:
        yield opened


def partition_owner(cluster: LocalCluster, topic: str, partition: int) -> str:
    """The address of the partition-log node that owns the partition."""
    coordinator = coordinator_pb2_grpc.TransactionCoordinatorStub(
        cluster.channel(cluster.bootstrap()[0])
    )
    answer = coordinator.Metadata(coordinator_pb2.MetadataRequest(topics=[topic]), timeout=10)
    nodes = {n.node_id: n.address for n in answer.partition_nodes}
    [placed] = [p for p in answer.topics[0].partitions if p.partition == partition]
    return nodes[placed.node_id]


def test_the_console_shows_the_live_cluster(
    cluster: LocalCluster, console: str, page: Page
) -> None:
    tls = cluster.client_tls()
    bootstrap = cluster.bootstrap()

    # The shards, each with the leader the coordinators report.
    page.goto(console)
    expect(page.locator("#shards tbody tr")).to_have_count(3, timeout=SHOWN_MS)
    for shard, leader in cluster.wait_for_leaders().items():
        expect(page.locator(f'#shards tr[data-shard="{shard}"] .shard-leader')).to_contain_text(
            f"node {leader} ", timeout=SHOWN_MS
        )
    expect(page.locator("#coordinators tbody tr")).to_have_count(3)
    expect(page.locator("#partition-nodes tbody tr")).to_have_count(3)
    expect(page.locator("#errors")).to_have_count(0)

    with Admin(bootstrap, **tls) as admin:
        admin.create_topics({TOPIC: 2})
    live = TransactionalProducer(bootstrap, "console-live", transaction_timeout_ms=600_000, **tls)
    ghost = TransactionalProducer(bootstrap, "console-ghost", **tls)
    try:
        # An open transaction: begun and sent to, not committed.
        live.init_transactions()
        live.begin_transaction()
        live.send(TOPIC, b"pending", partition=0).result(timeout=30)
        page.goto(console + "transactions")
        row = page.locator('#transactions tr[data-transactional-id="console-live"]')
        expect(row.locator(".state")).to_have_text("Ongoing", timeout=SHOWN_MS)
        expect(row).to_contain_text(f"{TOPIC}-0")
        expect(row).not_to_have_class(re.compile("overdue"))
        page.goto(console + "topics")
        partition_0 = page.locator(f'table[data-topic="{TOPIC}"] tr[data-partition="0"]')
        expect(partition_0.locator(".open")).to_have_text("1", timeout=SHOWN_MS)

        # Committed: complete, and the partition's transaction closed.
        live.commit_transaction()
        expect(partition_0.locator(".open")).to_have_text("0", timeout=SHOWN_MS)
        expect(partition_0.locator(".lso")).to_have_text("2")  # the record and its marker
        page.goto(console + "transactions")
        expect(row.locator(".state")).to_have_text("CompleteCommit", timeout=SHOWN_MS)

        # A hanging transaction: a transactional batch written straight to a
        # partition its coordinator never heard of (verification is off), by
        # a producer silent since (the batch's timestamps are from 2023).
        with Producer(bootstrap, **tls) as plain:  # the partition's node knows it now
            plain.send(TOPIC, b"plain", partition=1).result(timeout=30)
        ghost.init_transactions()
        node = partition_log_pb2_grpc.PartitionLogStub(
            cluster.channel(partition_owner(cluster, TOPIC, 1))
        )
        raw = plog_client.produce(
            node,
            TOPIC,
            1,
            [b"stuck"],
            producer_id=ghost.producer_id,
            epoch=ghost.producer_epoch,
            sequence=0,
            transactional=True,
            transactional_id="console-ghost",
        )
        assert raw.error_code == 0, raw
        hanging = page.locator(
            f'#hanging-transactions tr[data-topic="{TOPIC}"][data-partition="1"]'
        )
        expect(hanging).to_be_visible(timeout=SHOWN_MS)
        expect(hanging).to_have_class(re.compile(r"\bhanging\b"))
        highlight = hanging.locator("td").first.evaluate(
            "td => getComputedStyle(td).backgroundColor"
        )
        assert highlight not in ("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)"), highlight
        expect(hanging).to_contain_text("console-ghost")
        command = shlex.join(
            [
                "raftcoord", "txn", "abort", "--topic", TOPIC, "--partition", "1",
                "--start-offset", str(raw.base_offset), "--cluster-dir", str(cluster.data_dir),
            ]
        )  # fmt: skip
        expect(hanging.locator(".command")).to_have_text(command)
        expect(page.locator("#hanging-count .value")).to_have_text("1")

        # The command shown ends it.
        shown = shlex.split(hanging.locator(".command").inner_text())
        aborted = subprocess.run(
            [sys.executable, "-m", "raftcoord.cli", *shown[1:]],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert aborted.returncode == 0, aborted.stderr
        expect(page.locator("#no-hanging")).to_be_visible(timeout=SHOWN_MS)
    finally:
        live.close()
        ghost.close()

    # A coordinator down: a banner naming it, no traceback, the rest still shown.
    cluster.kill(3)
    page.goto(console)
    expect(page.locator("#errors")).to_contain_text("coordinator 3", timeout=SHOWN_MS)
    expect(page.locator('#coordinators tr[data-node="3"]')).to_contain_text("down")
    expect(page.locator('#coordinators tr[data-node="1"]')).to_contain_text("up")
    started = time.monotonic()
    page.goto(console + "topics")  # answered from the latest round, without waiting
    expect(page.locator(f'table[data-topic="{TOPIC}"]')).to_be_visible()
    assert time.monotonic() - started < 5
