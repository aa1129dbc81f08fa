"""The deterministic parts of the chaos workload: values, transactions and
the fault schedule given a seed, and the history writer's format."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

import raftcoord.chaos.history as history_module
from raftcoord.chaos.arguments import FAULTS, parse_faults
from raftcoord.chaos.history import SLOW_S, History, HistoryError
from raftcoord.chaos.nemesis import Fault, FaultPlan, effect, plans
from raftcoord.chaos.options import Options
from raftcoord.chaos.workload import (
    input_values,
    output_value,
    producer_plans,
    worker_plans,
)
from tests.history_format import read_history, structure_problems

T = TypeVar("T")


def _take(iterator: Iterator[T], count: int) -> list[T]:
    return list(itertools.islice(iterator, count))


# --- values and transactions ---------------------------------------------------------


def test_producer_transactions_are_the_same_for_the_same_seed() -> None:
    first = _take(producer_plans(7, "txn-0", 6, 4, 0.3), 200)
    assert first == _take(producer_plans(7, "txn-0", 6, 4, 0.3), 200)
    assert first != _take(producer_plans(8, "txn-0", 6, 4, 0.3), 200)


def test_producer_values_are_unique_and_writes_go_to_distinct_partitions() -> None:
    values = []
    for process in ("txn-0", "txn-1", "txn-2"):
        for plan in _take(producer_plans(3, process, 6, 4, 0.2), 300):
            partitions = [p for p, _ in plan.writes]
            assert 1 <= len(partitions) <= 4
            assert len(set(partitions)) == len(partitions)
            assert all(0 <= p < 6 for p in partitions)
            values += [v for _, v in plan.writes]
    assert len(values) == len(set(values))


def test_writes_per_transaction_never_exceed_the_partitions() -> None:
    for plan in _take(producer_plans(1, "txn-0", 2, 9, 0.0), 100):
        assert len(plan.writes) <= 2


@pytest.mark.parametrize(("ratio", "commits"), [(0.0, 500), (1.0, 0)])
def test_abort_ratio_bounds(ratio: float, commits: int) -> None:
    planned = _take(producer_plans(5, "txn-0", 6, 4, ratio), 500)
    assert sum(p.commit for p in planned) == commits
    assert sum(c for _, c in _take(worker_plans(5, "ctp-0", 10, ratio), 500)) == commits


def test_abort_ratio_is_followed_roughly() -> None:
    planned = _take(producer_plans(11, "txn-0", 6, 4, 0.25), 4000)
    aborted = sum(not p.commit for p in planned) / len(planned)
    assert 0.2 < aborted < 0.3


def test_worker_transactions_are_the_same_for_the_same_seed() -> None:
    first = _take(worker_plans(9, "ctp-1", 10, 0.2), 200)
    assert first == _take(worker_plans(9, "ctp-1", 10, 0.2), 200)
    assert first != _take(worker_plans(9, "ctp-0", 10, 0.2), 200)
    assert all(1 <= most <= 10 for most, _ in first)


def test_input_values_are_unique_and_round_robin() -> None:
    values = input_values("chaos-1", 1000, 4)
    assert len({v for _, v in values}) == 1000
    assert [p for p, _ in values[:8]] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert output_value("ctp-0:3", values[0][1]) != output_value("ctp-0:4", values[0][1])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"duration_s": None}, "exactly one of --duration"),
        ({"transactions": 5}, "exactly one of --duration"),
        ({"abort_ratio": 1.5}, "--abort-ratio"),
        ({"workers": 5}, "--workers must be at most --input-partitions"),
        ({"producers": -1}, "--producers"),
        ({"request_timeout_ms": 0}, "--request-timeout"),
        ({"fault_interval_s": 0}, "--fault-interval"),
    ],
)
def test_bad_options_are_refused(changes: dict[str, object], message: str) -> None:
    options = Options(seed=1, **changes)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        options.check()


# --- the fault schedule --------------------------------------------------------------


def test_fault_schedule_is_the_same_for_the_same_seed() -> None:
    first = _take(plans(4, FAULTS, 0.6), 50)
    assert first == _take(plans(4, FAULTS, 0.6), 50)
    assert first != _take(plans(5, FAULTS, 0.6), 50)
    assert [p.number for p in first] == list(range(50))


def test_every_round_of_the_schedule_runs_every_fault_once() -> None:
    kinds = ("leader-kill", "pause", "plog-restart")
    schedule = _take(plans(2, kinds, 0.6), 30)
    for start in range(0, 30, 3):
        assert sorted(p.kind for p in schedule[start : start + 3]) == sorted(kinds)


def test_a_pause_outlasts_the_election_timeout() -> None:
    pauses = [p for p in _take(plans(3, ("pause", "leader-kill"), 0.6), 100) if p.kind == "pause"]
    assert pauses and all(p.hold_s >= 2 * 0.6 for p in pauses)


def test_a_gateway_partition_lasts_as_long_as_a_partition() -> None:
    held = [p.hold_s for p in itertools.islice(plans(3, ["gateway-partition"], 0.6), 50)]
    assert all(2.0 <= h <= 5.0 for h in held)


def test_no_faults_no_schedule() -> None:
    assert _take(plans(1, (), 0.6), 5) == []


def test_fault_names() -> None:
    assert parse_faults("all") == FAULTS
    assert parse_faults("none") == parse_faults("") == ()
    assert parse_faults("pause, leader-kill,pause") == ("pause", "leader-kill")
    # Asked for by name only: `all` runs on clusters without gateways too.
    assert "gateway-partition" not in FAULTS
    assert parse_faults("gateway-partition,leader-kill") == ("gateway-partition", "leader-kill")
    with pytest.raises(ValueError, match="unknown fault"):
        parse_faults("leader-kill,meteor")


# --- the history writer --------------------------------------------------------------


def test_history_from_many_threads_is_well_formed(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with History(path) as history:
        history.event("workload", "info", "run", seed=1)

        def process(name: str) -> None:
            for n in range(200):
                history.invoke(name, "send", txn=f"{name}:{n}", value=f"{name}-{n}")
                history.complete(name, ("ok", "fail", "info")[n % 3], offset=n)

        threads = [threading.Thread(target=process, args=(f"txn-{i}",)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert history.outstanding() == {}
        assert history.counts()[("send", "invoke")] == 1600
    events = read_history(path)
    assert len(events) == 1 + 8 * 200 * 2
    assert structure_problems(events) == []
    assert events[1]["value"] in {f"txn-{i}-0" for i in range(8)}


def test_history_is_readable_before_it_is_closed(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    history = History(path, flush_interval_s=0)
    history.event("workload", "info", "run", seed=1)
    history.invoke("poller-0", "poll", isolation="read_committed", partitions=[["t", 0]])
    assert [e["op"] for e in read_history(path)] == ["run", "poll"]
    history.complete("poller-0", "ok", reads=[])
    history.close()
    history.close()
    assert structure_problems(read_history(path)) == []


def test_history_refuses_events_that_break_the_format(tmp_path: Path) -> None:
    with History(tmp_path / "history.jsonl") as history:
        with pytest.raises(HistoryError, match="never invoked"):
            history.complete("txn-0", "ok")
        history.invoke("txn-0", "commit", txn="txn-0:0", writes=[])
        with pytest.raises(HistoryError, match="while its commit is open"):
            history.invoke("txn-0", "send")
        with pytest.raises(HistoryError, match="does not complete"):
            history.complete("txn-0", "invoke")
        with pytest.raises(HistoryError, match="use invoke"):
            history.event("txn-1", "invoke", "send")
        history.complete("txn-0", "info", error="KafkaTimeoutError")
        assert history.outstanding() == {}
    with pytest.raises(HistoryError, match="closed"):
        history.event("workload", "ok", "run")
    events = read_history(tmp_path / "history.jsonl")
    assert [(e["type"], e["op"]) for e in events] == [("invoke", "commit"), ("info", "commit")]


def test_structure_check_finds_broken_histories() -> None:
    base = {"time_ms": 0.0, "process": "txn-0"}
    run = {**base, "index": 0, "mono_ns": 0, "process": "workload", "type": "info", "op": "run"}
    invoke = {**base, "index": 1, "mono_ns": 2, "type": "invoke", "op": "send"}
    again = {**base, "index": 2, "mono_ns": 1, "type": "invoke", "op": "commit"}
    problems = structure_problems([run, invoke, again])
    assert any("mono_ns goes back" in p for p in problems)
    assert any("invokes with send open" in p for p in problems)
    assert any("never completed" in p for p in problems)


def test_operations_held_up_count_as_slow_but_polls_do_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """History.slow: client operations over SLOW_S, outstanding or completed;
    polls, which wait for records by design, never count. A fault whose
    clients were only held up (a gateway cut off) changed something."""
    now = [0]
    monkeypatch.setattr(history_module.time, "monotonic_ns", lambda: now[0])
    with History(tmp_path / "h.jsonl") as history:
        history.invoke("txn-0", "commit")
        history.invoke("poller-0", "poll")
        assert history.slow() == 0
        now[0] += int((SLOW_S + 0.5) * 1e9)
        assert history.slow() == 1  # the commit, still waiting
        history.complete("txn-0", "ok")
        history.complete("poller-0", "ok")
        assert history.slow() == 1  # the commit, done late; not the poll
        history.invoke("txn-0", "commit")
        history.complete("txn-0", "ok")
        assert history.slow() == 1
    fault = Fault(plans_for_one("gateway-partition"), [[201], [1, 2, 3]], "cut", lambda: ("", {}))
    assert effect(fault, {}, 0, {}, slow=0) == ""
    assert effect(fault, {}, 0, {}, slow=2) == f"2 client operations took over {SLOW_S:g} s"


def plans_for_one(kind: str) -> FaultPlan:
    return next(plans(1, [kind], 0.6))


def test_a_partition_faults_effect_names_the_partition_and_the_catch_up() -> None:
    killed = Fault(
        plans_for_one("plog-leader-kill"),
        [102],
        "kill",
        lambda: ("", {}),
        {"topic": "t", "partition": 3},
    )
    assert effect(killed, {}, 0, {"new_leader": 103}, slow=0) == "partition leader moved (t-3)"
    assert effect(killed, {}, 0, {"new_leader": None}, slow=0) == ""
    wiped = Fault(plans_for_one("plog-wipe"), [101], "wipe", lambda: ("", {}))
    assert effect(wiped, {}, 0, {"in_sync": True}, slow=0) == "the wiped node caught up"
