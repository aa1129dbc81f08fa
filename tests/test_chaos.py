"""A bounded chaos run: the workload on a local cluster (3 coordinators x 3
shards, 3 partition-log nodes) while the nemesis kills leaders, pauses a
leader and restarts a partition-log node (and partitions the network where
the cluster runs in namespaces). The tests check that the faults really bit
and that the run is well-formed and live; what the history says about the
data is judged by a checker on the ``chaos_history`` fixture.

The seed is printed; RAFTCOORD_CHAOS_SEED=N replays a run's choices.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raftcoord.chaos.arguments import FAULTS as NODE_FAULTS
from raftcoord.chaos.options import Options
from raftcoord.chaos.verdict import run_problems, verdict
from raftcoord.chaos.workload import Workload
from raftcoord.client import Admin, TransactionListing
from raftcoord.cluster import netns
from tests.history_checker import check
from tests.history_format import read_history
from tests.local_cluster import running_cluster

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("RAFTCOORD_CHAOS_SEED", "20261123"))
#: Every fault kind on the nodes but minority-kill (leader-kill kills coordinators
#: in this short run), in the nemesis's order.
FAULTS = tuple(f for f in NODE_FAULTS if f != "minority-kill")
OPEN_STATES = {"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"}
#: Each node in a network namespace of its own where this machine allows it,
#: so that the partition fault cuts real links.
NETNS = netns.unavailable() is None


@dataclass
class ChaosRun:
    history: Path
    events: list[dict[str, Any]]
    summary: dict[str, Any]
    #: The coordinators' view of the run's transactional ids once it ended.
    transactions: list[TransactionListing]


@pytest.fixture(scope="module")
def chaos_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosRun]:
    print(f"chaos seed {SEED} (replay with RAFTCOORD_CHAOS_SEED={SEED})")
    root = tmp_path_factory.mktemp("chaos")
    with running_cluster(
        root / "cluster",
        netns=NETNS,
        faults=True,
        settings={
            "transaction.two.phase.commit.enable": True,
            # Short leases: a killed partition leader's partitions move within seconds.
            "broker.heartbeat.interval.ms": 300,
            "broker.session.timeout.ms": 3_000,
        },
    ) as cluster:
        options = Options(
            seed=SEED,
            duration_s=45,
            producers=3,
            two_phase_producers=1,
            workers=2,
            pollers=2,
            input_records=400,
            nemesis=FAULTS,
            fault_interval_s=1.0,
            request_timeout_ms=2_000,
            drain_timeout_s=60,
        )
        history = root / "history.jsonl"
        summary = Workload(cluster, options, history, say=print).run()
        with Admin(cluster.bootstrap()) as admin:
            transactions = [
                t
                for t in admin.list_transactions()
                if t.transactional_id.startswith(f"chaos-{SEED}-")
            ]
        yield ChaosRun(history, read_history(history), summary, transactions)


@pytest.fixture
def chaos_history(chaos_run: ChaosRun) -> Path:
    """The history file of the bounded chaos run."""
    return chaos_run.history


def _faults(events: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(start, end) pairs of the fault events (faults run one at a time)."""
    faults = [e for e in events if e["op"] == "fault"]
    starts = [e for e in faults if e["phase"] == "start"]
    ends = [e for e in faults if e["phase"] == "end"]
    assert len(starts) == len(ends)
    for start, end in zip(starts, ends, strict=True):
        assert (start["fault"], start["targets"]) == (end["fault"], end["targets"])
        assert start["index"] < end["index"]
    return list(zip(starts, ends, strict=True))


def _transactions(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """txn -> its events."""
    found: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        if "txn" in event:
            found.setdefault(event["txn"], []).append(event)
    return found


def _completes_end(event: dict[str, Any]) -> bool:
    return event["op"] in ("commit", "abort") and event["type"] in ("ok", "fail", "info")


def test_the_history_is_well_formed(chaos_run: ChaosRun) -> None:
    events = chaos_run.events  # its structure: the checker's "malformed" (below)
    assert events[0]["seed"] == SEED
    assert [(e["op"], e["type"]) for e in events[-2:]] == [("final", "ok"), ("run", "ok")]
    assert chaos_run.summary["crashed"] == []
    assert chaos_run.summary["unfinished"] == []


def test_the_faults_ran_and_moved_leaders(chaos_run: ChaosRun) -> None:
    pairs = _faults(chaos_run.events)
    kinds = {start["fault"] for start, _ in pairs if start["targets"]}
    assert {
        "leader-kill",
        "pause",
        "plog-restart",
        "plog-leader-kill",
        "plog-wipe",
        "disk",
    } <= kinds
    disks = [end for start, end in pairs if start["fault"] == "disk"]
    assert all(end["stopped"] for end in disks), disks  # each stopped on its failed fsync
    for start, end in pairs:
        if start["fault"] in ("leader-kill", "pause"):
            victim = start["targets"][0]
            assert start["leaders"][str(start["shard"])] == victim
            assert end["new_leader"] not in (None, victim), end["detail"]
        if start["fault"] in ("plog-leader-kill", "plog-partition"):  # a follower took over
            assert end["new_leader"] not in (None, start["targets"][0]), end["detail"]
        if start["fault"] == "plog-wipe":  # the wiped node caught up and is in sync again
            assert end["in_sync"], end["detail"]
    partitions = [start for start, _ in pairs if start["fault"] == "partition"]
    assert partitions, "the partition fault is neither run nor reported as not run"
    if NETNS:
        assert {"partition", "plog-partition"} <= kinds, [p["detail"] for p in partitions]
    for start in partitions:
        assert start["targets"] or start["detail"].startswith("not run: "), start


def test_faults_ran_one_at_a_time_and_each_kind_is_accounted_for(chaos_run: ChaosRun) -> None:
    ran = [(start, end) for start, end in _faults(chaos_run.events) if start["targets"]]
    for (_, end), (start, _) in itertools.pairwise(ran):
        assert end["index"] < start["index"], (end, start)  # the next only after the end
    report = {r["fault"]: r for r in chaos_run.summary["fault_report"]}
    assert list(report) == list(FAULTS)
    for kind, row in report.items():
        happened = sum(1 for start, _ in ran if start["fault"] == kind)
        assert row["happened"] == happened, row
        assert row["changed"] <= row["happened"], row
        assert bool(row["not_run"]) == (kind == "partition" and not NETNS), row
    for kind in ("leader-kill", "pause"):  # each moves a leader
        assert report[kind]["changed"] == report[kind]["happened"] >= 1, report[kind]
    ends = [end for _, end in ran]
    assert sum(1 for end in ends if end["changed"]) == sum(r["changed"] for r in report.values())


def test_a_fault_asked_for_that_cannot_act_makes_the_demo_incomplete(tmp_path: Path) -> None:
    """A cluster outside network namespaces cannot be partitioned: the run
    says so, and the verdict on it (the demo's and the audit's) is
    INCOMPLETE whatever the checks found."""
    with running_cluster(tmp_path / "cluster", shards=1, partition_nodes=1) as cluster:
        options = Options(
            seed=SEED,
            duration_s=2,
            producers=1,
            workers=0,
            pollers=0,
            nemesis=("partition",),
            fault_interval_s=0.5,
            every_fault=True,
            drain_timeout_s=30,
        )
        summary = Workload(cluster, options, tmp_path / "history.jsonl", say=print).run()
    (row,) = summary["fault_report"]
    assert row["fault"] == "partition" and row["happened"] == 0
    assert "network namespaces" in row["not_run"]
    failures, shortfalls = run_problems(summary)
    assert failures == []
    assert shortfalls == [f"fault partition asked for and {row['not_run']}"]
    assert verdict(failures, shortfalls) == "INCOMPLETE"


def test_requests_failed_and_were_retried(chaos_run: ChaosRun) -> None:
    events = chaos_run.events
    failed = [
        e
        for e in events
        if e["type"] in ("fail", "info") and e["process"].startswith(("txn-", "ctp-"))
    ]
    assert failed, "no operation failed: the faults did not bite"
    retried = {
        e["process"]
        for e in failed
        if any(
            later["process"] == e["process"] and later["op"] == "commit" and later["type"] == "ok"
            for later in events[e["index"] + 1 :]
        )
    }
    assert retried, "no process committed again after a failure"


def test_a_transaction_was_in_flight_across_every_fault(chaos_run: ChaosRun) -> None:
    spans = []
    for txn_events in _transactions(chaos_run.events).values():
        ends = [e["index"] for e in txn_events if _completes_end(e)]
        if ends:
            spans.append((txn_events[0]["index"], ends[-1]))
    for start, _ in _faults(chaos_run.events):
        if not start["targets"]:
            continue  # reported as not run
        assert any(first < start["index"] < last for first, last in spans), start["detail"]


def test_every_transaction_ended(chaos_run: ChaosRun) -> None:
    transactions = _transactions(chaos_run.events)
    assert transactions
    unended = [txn for txn, evs in transactions.items() if not any(map(_completes_end, evs))]
    assert unended == []
    assert chaos_run.transactions, "the coordinators list none of the run's transactional ids"
    still_open = [t for t in chaos_run.transactions if t.state in OPEN_STATES]
    assert still_open == []


def test_prepared_transactions_were_kept_across_crashes_and_ended(chaos_run: ChaosRun) -> None:
    """The two-phase producer (KIP-939) crashed with transactions prepared,
    and its next incarnation, which keeps them, ended them: a transaction
    sent before an init of the process and ended after it, committed and
    aborted ones among them (the checker and the audit judge their data)."""
    events = [e for e in chaos_run.events if e["process"] == "2pc-0"]
    inits = [e["index"] for e in events if e["op"] == "init" and e["type"] == "ok"]
    kept: dict[str, str] = {}
    for txn, txn_events in _transactions(events).items():
        sends = [e["index"] for e in txn_events if e["op"] == "send"]
        ends = [e for e in txn_events if _completes_end(e) and e["type"] == "ok"]
        if sends and ends and any(sends[-1] < i < ends[-1]["index"] for i in inits):
            kept[txn] = ends[-1]["op"]
    print(f"2pc-0: {len(inits)} inits, kept and ended: {sorted(kept.values())}")
    assert len(inits) >= 2 and kept, (len(inits), kept)
    assert set(kept.values()) == {"commit", "abort"}, kept


def test_the_independent_checker_finds_nothing(chaos_history: Path) -> None:
    violations = check(chaos_history)
    assert {name: found[:3] for name, found in violations.items() if found} == {}
