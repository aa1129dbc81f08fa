"""``raftcoord console`` without a cluster: the pages' figures
(raftcoord.console.model, pure), every page rendered from a made-up
snapshot, the web application's routes, the audit reports it finds, the
admin client's calls it relies on (against fake nodes) and its command line.
The console against a real cluster, in a real browser:
tests/test_console_browser.py."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftcoord.cli.console import connection_options
from raftcoord.cli.main import main
from raftcoord.client import (
    Admin,
    ConsumerGroupDescription,
    CoordinatorDescription,
    MemberDescription,
    PartitionNodeDescription,
    PendingMarker,
    ProducerState,
    ShardReplicaDescription,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)
from raftcoord.client._net import CHANNEL_OPTIONS, client_closed
from raftcoord.client.hanging import OpenTransaction
from raftcoord.console import model
from raftcoord.console.app import PAGES, create_app, render
from raftcoord.console.collect import ConsoleOptions, find_reports
from raftcoord.console.model import Report, Snapshot
from raftcoord.protocol.channels import ChannelCache
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.v1 import admin_pb2, common_pb2, coordinator_pb2, partition_log_pb2

REPO_ROOT = Path(__file__).resolve().parents[1]
NOW = 1_800_000_000_000
CONNECTION = ("--cluster-dir", "/srv/my cluster")
ORDERS_1 = TopicPartition("orders", 1)


# --- made-up answers -----------------------------------------------------------------


def replica(
    shard: int, leader: int | None, term: int = 4, applied: int = 100
) -> ShardReplicaDescription:
    return ShardReplicaDescription(
        shard=shard,
        is_leader=False,
        term=term,
        leader_node_id=-1 if leader is None else leader,
        leader_address="",
        commit_index=110,
        applied_index=applied,
        transactional_ids=7,
        parked_requests=0,
    )


def leading(shard: int, node: int, term: int = 4) -> ShardReplicaDescription:
    r = replica(shard, node, term, applied=110)
    return ShardReplicaDescription(**{**r.__dict__, "is_leader": True, "transactional_ids": 12})


COORDINATORS = [
    CoordinatorDescription(1, "10.0.0.1:7100", None, (leading(0, 1), replica(1, 2, 5, 90))),
    CoordinatorDescription(2, "10.0.0.2:7100", None, (replica(0, 1), replica(1, 2, 5, 95))),
    CoordinatorDescription(3, "10.0.0.3:7100", "10.0.0.3:7100: UNAVAILABLE: refused"),
]
PARTITION_NODES = [
    PartitionNodeDescription(101, "10.0.0.1:7300", None, "d-1", "serving"),
    PartitionNodeDescription(
        102, "10.0.0.2:7300", None, "d-2", "replaced", ((ORDERS_1, "directory replaced"),)
    ),
    PartitionNodeDescription(103, "10.0.0.3:7300", "UNAVAILABLE: down"),
]


def producer(
    pid: int, start: int = -1, last_ms: int = NOW - 1_000, epoch: int = 2
) -> ProducerState:
    return ProducerState(
        producer_id=pid,
        producer_epoch=epoch,
        last_sequence=4,
        last_timestamp_ms=last_ms,
        coordinator_epoch=3,
        current_transaction_start_offset=start,
    )


GHOST = producer(9, start=40, last_ms=NOW - 3_600_000, epoch=1)


def described(
    tid: str, state: str, pid: int, started: int, timeout: int = 60_000
) -> TransactionDescription:
    return TransactionDescription(
        transactional_id=tid,
        state=state,
        producer_id=pid,
        producer_epoch=5,
        transaction_timeout_ms=timeout,
        transaction_start_time_ms=started,
        last_update_time_ms=started,
        partitions=frozenset({TopicPartition("orders", 0), ORDERS_1}),
        groups=frozenset({"billing"}),
        coordinator_epoch=4,
        pending_markers=(
            (PendingMarker(ORDERS_1, None, "NOT_LEADER_OR_FOLLOWER", "moving"),)
            if state == "PrepareCommit"
            else ()
        ),
    )


def snapshot(**changes: Any) -> Snapshot:
    """A cluster with a node of each kind down, open, overdue, committing,
    committed and hanging transactions, and a group."""
    fields: dict[str, Any] = {
        "taken_ms": NOW,
        "took_ms": 120,
        "coordinators": COORDINATORS,
        "partition_nodes": PARTITION_NODES,
        "topics": {"orders": 2, "empty": 1},
        "log_end_offsets": {
            TopicPartition("orders", 0): 10,
            ORDERS_1: 50,
            TopicPartition("empty", 0): 0,
        },
        "stable_offsets": {
            TopicPartition("orders", 0): 10,
            ORDERS_1: 40,
            TopicPartition("empty", 0): 0,
        },
        "producers": {
            TopicPartition("orders", 0): [producer(7)],
            ORDERS_1: [producer(8, start=45), GHOST],
            TopicPartition("empty", 0): [],
        },
        "hanging": [OpenTransaction(ORDERS_1, GHOST)],
        "transactions": [
            TransactionListing("done", 1, "CompleteCommit", -1),
            TransactionListing("late", 2, "Ongoing", 120_000),
            TransactionListing("live", 8, "Ongoing", 2_000),
            TransactionListing("committing", 3, "PrepareCommit", 5_000),
            TransactionListing("ghost", 9, "Empty", -1),
        ],
        "descriptions": {
            "late": described("late", "Ongoing", 2, NOW - 120_000),
            "live": described("live", "Ongoing", 8, NOW - 2_000),
            "committing": described("committing", "PrepareCommit", 3, NOW - 5_000),
        },
        "groups": {
            "billing": ConsumerGroupDescription(
                "billing",
                "Stable",
                "consumer",
                "range",
                3,
                "m-1",
                (MemberDescription("m-1", None, "worker-1", b""),),
            )
        },
        "group_offsets": {"billing": {TopicPartition("orders", 0): 7, ORDERS_1: 38}},
        "reports": [Report("audit/audit.html", NOW - 60_000, "PASS")],
        "errors": ["coordinator 3: 10.0.0.3:7100: UNAVAILABLE: refused"],
    }
    return Snapshot(**{**fields, **changes})


OPTIONS = ConsoleOptions(
    bootstrap=["10.0.0.1:7100"], connection=CONNECTION, cluster_dir=Path("/srv/my cluster")
)


# --- formatting ----------------------------------------------------------------------


def test_durations_and_times_read_as_a_person_says_them() -> None:
    assert [
        model.format_duration(ms)
        for ms in (None, -1, 0, 850, 12_500, 200_000, 900_000, 7_500_000, 3 * 86_400_000 + 1)
    ] == ["-", "-", "0 ms", "850 ms", "12.5 s", "3 min 20 s", "15 min", "2 h 5 min", "3 d"]
    assert model.format_time(0) == "1970-01-01 00:00:00Z"
    assert model.format_time(-1) == "-"


def test_the_abort_command_is_a_shell_command_line() -> None:
    assert (
        model.abort_command(ORDERS_1, CONNECTION, start_offset=40)
        == "raftcoord txn abort --topic orders --partition 1 --start-offset 40 "
        "--cluster-dir '/srv/my cluster'"
    )
    assert model.abort_command(TopicPartition("a b", 0), (), producer=(9, 1)) == (
        "raftcoord txn abort --topic 'a b' --partition 0 --producer-id 9 --producer-epoch 1"
    )
    with pytest.raises(ValueError):
        model.abort_command(ORDERS_1, ())


# --- the pages' figures --------------------------------------------------------------


def test_each_shards_leader_and_replicas_as_the_coordinators_tell_them() -> None:
    view = model.cluster_view(snapshot())
    shard0, shard1 = view.shards
    assert (shard0.leader_node_id, shard0.leader_address, shard0.term) == (1, "10.0.0.1:7100", 4)
    assert shard0.transactional_ids == 12
    assert [(r.node_id, r.role, r.behind) for r in shard0.replicas] == [
        (1, "leader", 0),
        (2, "follower", 10),
        (3, "down", None),
    ]
    # Shard 1's leader (node 2) knows itself but has not applied its log yet:
    # no ready leader, whatever its followers believe.
    assert not shard1.has_leader and shard1.term == 5
    assert view.leaderless == (1,)
    assert [(n.node_id, n.up, n.leads) for n in view.coordinators] == [
        (1, True, (0,)),
        (2, True, ()),
        (3, False, ()),
    ]
    assert view.coordinators[2].detail.endswith("UNAVAILABLE: refused")
    assert [(n.node_id, n.up, n.detail, n.refused) for n in view.partition_nodes] == [
        (101, True, "serving", ()),
        (102, True, "replaced", ("orders-1: directory replaced",)),
        (103, False, "UNAVAILABLE: down", ()),
    ]
    assert (view.coordinators_answering, view.partition_nodes_answering) == (2, 2)
    assert model.cluster_view(Snapshot(taken_ms=NOW)) == model.ClusterView((), (), ())


def test_with_every_coordinator_down_the_nodes_the_cluster_has_are_counted() -> None:
    """No coordinator answered: each coordinator the cluster listed is down,
    and its partition-log nodes are not known (nothing asked them), never
    "0 / 0"."""
    nodes = {
        "coordinators": {1: "10.0.0.1:7100", 2: "10.0.0.2:7100", 3: "10.0.0.3:7100"},
        "partition_nodes": {101: "10.0.0.1:7300", 102: "10.0.0.2:7300"},
    }
    down = Snapshot(taken_ms=NOW, cluster_nodes=nodes, errors=["coordinators: no answer"])
    view = model.cluster_view(down)
    assert [(n.node_id, n.up) for n in view.coordinators] == [(1, False), (2, False), (3, False)]
    assert [(n.node_id, n.up) for n in view.partition_nodes] == [(101, None), (102, None)]
    assert (view.coordinators_answering, view.partition_nodes_answering) == (0, None)
    page = render("cluster", down, OPTIONS, NOW)
    assert "0 / 3" in page and "- / 2" in page and "0 / 0" not in page


def test_topics_show_offsets_open_and_hanging_transactions_or_a_dash() -> None:
    empty, orders = model.topics_view(snapshot())
    assert empty.name == "empty" and empty.open_transactions == 0 and empty.hanging == 0
    assert [
        (p.partition, p.log_end_offset, p.last_stable_offset, p.unstable, p.open_transactions)
        for p in orders.partitions
    ] == [(0, 10, 10, 0, 0), (1, 50, 40, 10, 2)]
    assert [p.hanging for p in orders.partitions] == [0, 1]
    assert (orders.open_transactions, orders.hanging, orders.log_end_offsets) == (2, 1, 60)
    # What could not be learnt is not known, not zero.
    unknown = model.topics_view(
        snapshot(log_end_offsets=None, stable_offsets=None, producers=None, hanging=None)
    )[1]
    assert unknown.log_end_offsets is None and unknown.open_transactions is None
    assert unknown.partitions[1].unstable is None and unknown.hanging == 0


def test_transactions_open_first_overdue_ones_with_the_commands_that_end_them() -> None:
    view = model.transactions_view(snapshot(), CONNECTION)
    assert [(r.transactional_id, r.state, r.age_ms) for r in view.rows] == [
        ("late", "Ongoing", 120_000),
        ("committing", "PrepareCommit", 5_000),
        ("live", "Ongoing", 2_000),
        ("done", "CompleteCommit", None),
        ("ghost", "Empty", None),
    ]
    late, committing, live, done, _ = view.rows
    assert late.overdue and late.commands == (
        "raftcoord txn abort --topic orders --partition 0 --producer-id 2 --producer-epoch 5 "
        "--cluster-dir '/srv/my cluster'",
        "raftcoord txn abort --topic orders --partition 1 --producer-id 2 --producer-epoch 5 "
        "--cluster-dir '/srv/my cluster'",
    )
    assert late.partitions == ("orders-0", "orders-1") and late.groups == ("billing",)
    assert not live.overdue and live.commands == () and live.timeout_ms == 60_000
    assert committing.pending_markers == ("orders-1: NOT_LEADER_OR_FOLLOWER (moving)",)
    assert done.partitions == () and not done.is_open
    assert view.overdue == (late,)
    assert dict(view.counts) == {"CompleteCommit": 1, "Empty": 1, "Ongoing": 2, "PrepareCommit": 1}
    [hanging] = view.hanging
    assert (hanging.topic, hanging.partition, hanging.producer_id, hanging.start_offset) == (
        "orders",
        1,
        9,
        40,
    )
    assert hanging.silent_ms == 3_600_000 and hanging.transactional_ids == ("ghost",)
    assert hanging.command == (
        "raftcoord txn abort --topic orders --partition 1 --start-offset 40 "
        "--cluster-dir '/srv/my cluster'"
    )


def test_a_transaction_past_its_timeout_while_committing_gets_no_abort_command() -> None:
    late = described("c", "PrepareCommit", 3, NOW - 120_000)
    view = model.transactions_view(
        snapshot(
            transactions=[TransactionListing("c", 3, "PrepareCommit", 120_000)],
            descriptions={"c": late},
        ),
        CONNECTION,
    )
    assert view.rows[0].overdue and view.rows[0].commands == ()


def test_a_two_phase_transaction_waits_for_its_manager_and_is_never_overdue() -> None:
    waiting = replace(described("2pc", "Ongoing", 4, NOW - 7_200_000), two_phase_commit=True)
    view = model.transactions_view(
        snapshot(
            transactions=[TransactionListing("2pc", 4, "Ongoing", 7_200_000)],
            descriptions={"2pc": waiting},
        ),
        CONNECTION,
    )
    [row] = view.rows
    assert row.two_phase and not row.overdue and view.overdue == ()
    assert row.commands == ("raftcoord txn force-terminate 2pc --cluster-dir '/srv/my cluster'",)


def test_producers_and_groups() -> None:
    producers = model.producers_view(snapshot())
    assert [(p.topic, p.partition, p.producer_id, p.open_since, p.hanging) for p in producers] == [
        ("orders", 0, 7, None, False),
        ("orders", 1, 8, 45, False),
        ("orders", 1, 9, 40, True),
    ]
    assert producers[0].last_write_ms == 1_000
    [billing] = model.groups_view(snapshot())
    assert (billing.state, billing.generation_id, billing.lag) == ("Stable", 3, 15)
    assert [
        (o.partition, o.committed, o.log_end_offset, o.last_stable_offset, o.lag, o.held_back)
        for o in billing.offsets
    ] == [(0, 7, 10, 10, 3, 0), (1, 38, 50, 40, 12, 10)]
    assert billing.members[0].client_id == "worker-1"
    # A group with offsets only (never a member described), offsets unknown.
    [lone] = model.groups_view(
        snapshot(
            groups={}, group_offsets={"g": {ORDERS_1: 3}}, log_end_offsets=None, stable_offsets=None
        )
    )
    assert (lone.state, lone.lag, lone.offsets[0].lag, lone.offsets[0].held_back) == (
        "-",
        None,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("committed", "lag", "held_back", "past_log_end"),
    [
        (38, 12, 10, False),  # below the LSO (40): 2 readable now, 10 held back
        (40, 10, 10, False),  # at the LSO: all of it held back
        (45, 5, 5, False),  # past the LSO: a lag, not 0 (kafka-consumer-groups says 5)
        (50, 0, 0, False),  # at the log end
        (52, None, None, True),  # committed past the log end: no lag, and said so
    ],
)
def test_the_lag_is_kafkas_log_end_minus_committed_never_negative(
    committed: int, lag: int | None, held_back: int | None, past_log_end: bool
) -> None:
    [group] = model.groups_view(snapshot(group_offsets={"billing": {ORDERS_1: committed}}))
    [row] = group.offsets
    assert (row.lag, row.held_back, row.past_log_end) == (lag, held_back, past_log_end)
    page = render(
        "groups", snapshot(group_offsets={"billing": {ORDERS_1: committed}}), OPTIONS, NOW
    )
    assert ("committed past the log end" in page) == past_log_end


def test_the_overview_counts() -> None:
    assert model.overview(snapshot()) == model.Overview(
        topics=2, partitions=3, open_transactions=3, hanging=1, groups=1
    )
    assert model.overview(Snapshot(taken_ms=NOW)) == model.Overview(None, None, None, None, 0)


# --- pages ---------------------------------------------------------------------------


@pytest.mark.parametrize("page", [name for _, name, _ in PAGES])
def test_every_page_renders_what_is_known_and_a_banner_for_what_is_not(page: str) -> None:
    html = render(page, snapshot(), OPTIONS, NOW + 500)
    assert 'id="errors"' in html and "coordinator 3: 10.0.0.3:7100: UNAVAILABLE" in html
    assert "500 ms ago" in html
    assert html.count('class="current"') == 1
    # No answer at all yet: a page that waits, not an error.
    waiting = render(page, None, OPTIONS, NOW)
    assert 'id="waiting"' in waiting and 'id="errors"' not in waiting
    # Nothing but errors (no coordinator answered): still a page.
    down = render(page, Snapshot(taken_ms=NOW, errors=["coordinators: no answer"]), OPTIONS, NOW)
    assert "coordinators: no answer" in down


def test_the_pages_show_the_figures() -> None:
    cluster = render("cluster", snapshot(), OPTIONS, NOW)
    assert 'data-shard="1" class="bad"' in cluster and "no leader" in cluster
    transactions = render("transactions", snapshot(), OPTIONS, NOW)
    assert 'data-transactional-id="late" class="overdue"' in transactions
    assert 'class="hanging" data-topic="orders" data-partition="1"' in transactions
    assert "--start-offset 40 --cluster-dir &#39;/srv/my cluster&#39;" in transactions
    reports = render("reports", snapshot(), OPTIONS, NOW)
    assert 'href="/reports/audit/audit.html"' in reports and "PASS" in reports
    groups = render("groups", snapshot(), OPTIONS, NOW)
    assert "worker-1" in groups and "lag 15" in groups


def test_what_the_cluster_says_is_escaped() -> None:
    evil = "<script>alert(1)</script>"
    html = render(
        "transactions",
        snapshot(transactions=[TransactionListing(evil, 1, "Empty", -1)], descriptions={}),
        OPTIONS,
        NOW,
    )
    assert evil not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def asgi_get(app: Any, path: str) -> tuple[int, dict[str, str], bytes]:
    """GET ``path`` from the ASGI application, as a server would."""
    messages: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"console")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8080),
    }
    asyncio.run(app(scope, receive, send))
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, body


def test_the_application_serves_pages_and_only_the_reports_found(tmp_path: Path) -> None:
    (tmp_path / "audit").mkdir()
    (tmp_path / "audit" / "audit.html").write_text("<h1>verdict</h1>")
    (tmp_path / "secret.txt").write_text("no")
    options = ConsoleOptions(bootstrap=["x:1"], cluster_dir=tmp_path)
    found = snapshot(reports=find_reports(tmp_path))
    app = create_app(lambda: found, options)
    status, headers, body = asgi_get(app, "/transactions")
    assert status == 200 and headers["cache-control"] == "no-store"
    assert b"Hanging transactions" in body
    assert asgi_get(app, "/reports/audit/audit.html")[2] == b"<h1>verdict</h1>"
    for refused in ("/reports/secret.txt", "/reports/../secret.txt", "/reports/%2e%2e/x"):
        assert asgi_get(app, refused)[0] == 404, refused
    assert asgi_get(app, "/healthz")[2] == b"ok"
    assert asgi_get(create_app(lambda: None, options), "/")[0] == 200


def test_reports_are_found_newest_first_with_their_verdicts(tmp_path: Path) -> None:
    for name, verdict, age_s in (("audit", "PASS", 100), ("run-2", "FAIL", 10)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "audit.html").write_text("x")
        (tmp_path / name / "audit.json").write_text(json.dumps({"verdict": verdict}))
        then = time.time() - age_s
        os.utime(tmp_path / name / "audit.html", (then, then))
    (tmp_path / "notes.html").write_text("x")
    os.utime(tmp_path / "notes.html", (time.time() - 1000, time.time() - 1000))
    (tmp_path / "node-1" / "shard-0").mkdir(parents=True)
    (tmp_path / "node-1" / "shard-0" / "deep.html").write_text("x")  # too deep
    reports = find_reports(tmp_path)
    assert [(r.path, r.verdict) for r in reports] == [
        ("run-2/audit.html", "FAIL"),
        ("audit/audit.html", "PASS"),
        ("notes.html", None),
    ]
    assert find_reports(tmp_path / "missing") == []


# --- the admin client's calls (fake nodes) ------------------------------------------


class Unavailable(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection refused"


class FakeNodes(ChannelCache):
    """Coordinators 1 and 2 (2 down), partition-log nodes 101 and 102 (102 down)."""

    def __init__(self) -> None:
        super().__init__(CHANNEL_OPTIONS, closed_error=client_closed)
        self.describe_answers: list[int] = [ErrorCode.NOT_COORDINATOR, ErrorCode.NONE]

    def coordinator(self, address: str) -> Any:
        return _Stub(self._coordinator)

    def partition_log(self, address: str) -> Any:
        return _Stub(lambda method, request: self._partition_log(address, method))

    def channel(self, address: str) -> Any:
        return _Channel(address)

    def _coordinator(self, method: str, request: Any) -> Any:
        if method == "Metadata":
            return coordinator_pb2.MetadataResponse(
                coordinators=[
                    coordinator_pb2.NodeInfo(node_id=1, address="c1:1"),
                    coordinator_pb2.NodeInfo(node_id=2, address="c2:1"),
                ],
                partition_nodes=[
                    coordinator_pb2.NodeInfo(node_id=101, address="p1:1"),
                    coordinator_pb2.NodeInfo(node_id=102, address="p2:1"),
                ],
            )
        if method == "FindCoordinator":
            return coordinator_pb2.FindCoordinatorResponse(address="c1:1", node_id=1)
        if method == "OffsetFetch":
            assert request.group_id == "billing" and not request.topics
            assert not request.require_stable
            return coordinator_pb2.OffsetFetchResponse(
                partitions=[
                    coordinator_pb2.OffsetFetchPartition(topic="t", partition=0, offset=5),
                    coordinator_pb2.OffsetFetchPartition(topic="t", partition=1, offset=-1),
                ]
            )
        if method == "DescribeTransactions":
            code = self.describe_answers.pop(0)
            return coordinator_pb2.DescribeTransactionsResponse(
                transactions=[
                    coordinator_pb2.TransactionDescription(
                        transactional_id="tx",
                        error_code=code,  # type: ignore[arg-type]
                        state=common_pb2.TRANSACTION_STATE_ONGOING,
                    )
                ]
            )
        raise AssertionError(method)

    def _partition_log(self, address: str, method: str) -> Any:
        assert method == "PartitionNodeStatus"
        if address == "p2:1":
            raise Unavailable()
        return partition_log_pb2.PartitionNodeStatusResponse(
            node_id=101,
            directory_id="d-1",
            directory_state="serving",
            refused=[partition_log_pb2.RefusedPartition(topic="t", partition=3, reason="damaged")],
        )


class _Stub:
    def __init__(self, answer: Any) -> None:
        self._answer = answer

    def __getattr__(self, method: str) -> Any:
        return lambda request, timeout: self._answer(method, request)


class _Channel:
    """What admin_pb2_grpc.CoordinatorAdminStub is made on."""

    def __init__(self, address: str) -> None:
        self.address = address

    def unary_unary(self, path: str, **_: Any) -> Any:
        def call(request: Any, timeout: float) -> Any:
            assert path.endswith("/NodeStatus")
            if self.address == "c2:1":
                raise Unavailable()
            return admin_pb2.NodeStatusResponse(
                node_id=1,
                shards=[
                    admin_pb2.ShardStatus(
                        shard=0,
                        is_leader=True,
                        term=3,
                        leader_node_id=1,
                        leader_address="c1:1",
                        commit_index=9,
                        applied_index=8,
                        transactional_ids=2,
                    )
                ],
            )

        return call


def fake_admin() -> tuple[Admin, FakeNodes]:
    nodes = FakeNodes()
    return Admin(["c1:1"], channels=nodes, request_timeout_ms=5_000, retry_backoff_ms=1), nodes


def test_admin_describes_every_node_also_those_that_do_not_answer() -> None:
    admin, _ = fake_admin()
    with admin:
        one, two = admin.describe_coordinators()
        assert (one.node_id, one.address, one.error) == (1, "c1:1", None)
        assert one.shards == (ShardReplicaDescription(0, True, 3, 1, "c1:1", 9, 8, 2, 0),)
        assert (two.node_id, two.shards) == (2, ())
        assert two.error == "c2:1: UNAVAILABLE: connection refused"
        first, second = admin.describe_partition_nodes()
        assert first == PartitionNodeDescription(
            101, "p1:1", None, "d-1", "serving", ((TopicPartition("t", 3), "damaged"),)
        )
        assert second.error == "p2:1: UNAVAILABLE: connection refused"


def test_admin_lists_a_groups_committed_offsets() -> None:
    admin, _ = fake_admin()
    with admin:
        assert admin.list_consumer_group_offsets("billing") == {TopicPartition("t", 0): 5}


def test_describe_transactions_retries_an_entry_answered_by_a_node_no_longer_leading() -> None:
    """A shard's leader changing: the entry says NOT_COORDINATOR (the answer
    has no message of its own) and the next coordinator is asked."""
    admin, nodes = fake_admin()
    with admin:
        assert admin.describe_transactions(["tx"])["tx"].state == "Ongoing"
    assert nodes.describe_answers == []


# --- command line --------------------------------------------------------------------


def test_the_commands_shown_reach_the_cluster_the_console_reaches() -> None:
    def parsed(*args: str) -> list[str]:
        import argparse

        from raftcoord.cli.console import configure

        parser = argparse.ArgumentParser()
        configure(parser)
        return connection_options(parser.parse_args(list(args)))

    assert parsed() == ["--cluster-dir", ".raftcoord"]
    assert parsed("--cluster-dir", "/c", "--port", "0") == ["--cluster-dir", "/c"]
    assert parsed("--bootstrap-server", "h:1,h:2", "--ssl-cafile", "ca.pem") == [
        "--bootstrap-server",
        "h:1,h:2",
        "--ssl-cafile",
        "ca.pem",
    ]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftcoord.cli", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_console_help_loads_neither_spark_nor_the_web_server() -> None:
    probe = (
        "import sys\n"
        "from raftcoord.cli.main import main\n"
        "try:\n"
        "    main(['console', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ('pyspark', 'spark', 'uvicorn', 'starlette', 'raftcoord.chaos.workload')\n"
        "print(sorted(m for m in sys.modules\n"
        "             if any(m == h or m.startswith(h + '.') for h in heavy)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "[]"
    assert any("--max-transaction-timeout" in line for line in lines)


def test_an_unreachable_bootstrap_is_told_at_once() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    start = time.monotonic()
    result = _cli("console", "--bootstrap-server", dead, "--port", "0")
    assert time.monotonic() - start < 15
    assert result.returncode == 1, result
    assert result.stderr.startswith(f"raftcoord console: no coordinator of {dead} answered")
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_a_directory_without_a_cluster_is_told(tmp_path: Path) -> None:
    result = _cli("console", "--cluster-dir", str(tmp_path))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("raftcoord console: ")


def test_bad_options_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["console", "--refresh", "0"])
    assert exited.value.code == 64
    assert "--refresh: 0 must be a positive number of seconds" in capsys.readouterr().err
    assert main(["console", "--max-transaction-timeout", "-1"]) == 2
