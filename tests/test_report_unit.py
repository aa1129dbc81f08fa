"""The audit report's pure pieces, without Spark: the timeline's zero-filling,
the faults' lanes and their planned holds and overruns, the totals' words,
the run header's inputs (the history's ``run`` events, the cluster
directory), and a whole page rendered from a hand-made document. Also that
the nemesis records a fault's planned hold and the history source reads it
(an old history without it still reads)."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raftcoord.chaos.history import History
from raftcoord.chaos.nemesis import FaultPlan, Nemesis
from spark import report
from spark.audit import describe_cluster
from spark.report import Span, fault_lanes, hold_label, lasted_s, overrun_s, total_words
from spark.sources import HISTORY_SCHEMA, _history_row
from spark.stats import OUTCOMES, _fault_windows, run_header, zero_filled

T0 = 1_790_000_000_000.0


def _window(
    fault: str,
    start_s: float,
    end_s: float | None,
    hold_s: float | None,
    targets: Any = (1,),
    detail: str = "",
) -> dict[str, Any]:
    return {
        "fault": fault,
        "targets": list(targets),
        "detail": detail,
        "start_ms": T0 + start_s * 1000,
        "end_ms": None if end_s is None else T0 + end_s * 1000,
        "hold_s": hold_s,
    }


# --- the timeline -----------------------------------------------------------------------------


def test_the_timeline_has_every_outcome_in_every_second_of_the_run() -> None:
    first = int(T0 // 1000)
    rows = [
        {"second": first + 1, "outcome": "commit", "count": 5},
        {"second": first + 4, "outcome": "commit", "count": 2},
        {"second": first + 4, "outcome": "abort", "count": 1},
    ]
    filled = zero_filled(rows, T0 + 300, T0 + 5_700)
    assert [r["second"] - first for r in filled[:: len(OUTCOMES)]] == [0, 1, 2, 3, 4, 5]
    commits = [r["count"] for r in filled if r["outcome"] == "commit"]
    assert commits == [0, 5, 0, 0, 2, 0]  # the quiet seconds are there, as zeros
    assert [r["count"] for r in filled if r["outcome"] == "abort"] == [0, 0, 0, 0, 1, 0]
    assert {r["outcome"] for r in filled} == set(OUTCOMES)


def test_the_timeline_keeps_what_it_has_when_the_run_span_is_unknown() -> None:
    rows = [
        {"second": 7, "outcome": "odd", "count": 3},
        {"second": 9, "outcome": "commit", "count": 1},
    ]
    filled = zero_filled(rows, None, None)
    # a zero on each side of every second with counts: no line joins across a gap
    assert sorted({r["second"] for r in filled}) == [6, 7, 8, 9, 10]
    assert {(r["second"], r["outcome"]): r["count"] for r in filled if r["count"]} == {
        (7, "odd"): 3,
        (9, "commit"): 1,
    }
    assert [r["outcome"] for r in filled[:4]] == [*OUTCOMES, "odd"]
    assert zero_filled([], None, None) == []
    # a clock gone wrong (an event at the epoch) does not fill billions of seconds
    far = zero_filled(rows, 0.0, T0)
    assert sorted({r["second"] for r in far}) == [6, 7, 8, 9, 10]


# --- the faults' lanes and holds --------------------------------------------------------------


def test_a_fault_past_its_planned_hold_is_held_then_overrun() -> None:
    late = _window("leader-kill", 5.0, 14.8, 2.1)
    assert lasted_s(late) == pytest.approx(9.8)
    assert overrun_s(late) == pytest.approx(7.7)
    assert hold_label(late) == "planned 2.1 s, lasted 9.8 s (7.7 s past the plan)"
    [lane] = fault_lanes([late], T0, T0 + 60_000)
    assert [(s.part, round(s.start_s, 3), round(s.end_s, 3)) for s in lane.spans] == [
        ("planned", 5.0, 7.1),
        ("overrun", 7.1, 14.8),
    ]


def test_a_fault_that_ended_within_its_hold_has_no_overrun() -> None:
    early = _window("pause", 10.0, 11.0, 3.0)
    assert overrun_s(early) == 0.0
    assert hold_label(early) == "planned 3.0 s, lasted 1.0 s"
    brief = _window("leader-kill", 0.0, 0.15, 0.02)  # below a second: to a hundredth
    assert hold_label(brief) == "planned 0.02 s, lasted 0.15 s (0.13 s past the plan)"
    [lane] = fault_lanes([early], T0, T0 + 60_000)
    assert lane.spans == (Span(10.0, 11.0, "planned"),)


def test_a_fault_without_a_recorded_hold_is_one_window_and_one_that_never_ended_runs_out() -> None:
    old = _window("plog-restart", 1.0, 3.0, None)
    assert overrun_s(old) is None
    assert hold_label(old) == "lasted 2.0 s"
    never = _window("disk", 50.0, None, 1.5)
    assert lasted_s(never) is None and overrun_s(never) is None
    assert hold_label(never) == "planned 1.5 s, never ended"
    lanes = fault_lanes([old, never, _window("pause", 20.0, None, None)], T0, T0 + 60_000)
    assert {lane.fault: lane.spans for lane in lanes} == {
        "plog-restart": (Span(1.0, 3.0, "unplanned"),),
        "disk": (Span(50.0, 51.5, "planned"), Span(51.5, 60.0, "open")),
        "pause": (Span(20.0, 60.0, "open"),),
    }


def test_one_lane_per_fault_kind_that_ran_in_the_order_they_first_started() -> None:
    faults = [
        _window("partition", 0.0, 0.0, None, targets=(), detail="not run: no namespaces"),
        _window("pause", 2.0, 4.0, 1.0),
        _window("leader-kill", 6.0, 8.0, 1.0),
        _window("pause", 10.0, 12.0, 1.5),
        _window("cosmic-ray", 14.0, 15.0, None),
    ]
    lanes = fault_lanes(faults, T0, T0 + 20_000)
    assert [(lane.fault, lane.count) for lane in lanes] == [
        ("pause", 2),
        ("leader-kill", 1),
        ("cosmic-ray", 1),
    ]
    assert len({lane.colour for lane in lanes}) == 3  # no two lanes alike
    assert not report.ran(faults[0]) and all(report.ran(w) for w in faults[1:])
    # Faults run one at a time, so the spans of a lane never overlap: nothing blends.
    for lane in lanes:
        ends = [(s.start_s, s.end_s) for s in lane.spans]
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(ends))


def test_fault_windows_carry_the_planned_hold_of_their_start() -> None:
    pause = {"fault": "pause", "targets": "[2]"}
    events = [
        {**pause, "time_ms": T0, "phase": "start", "detail": "x", "hold_s": 2.5},
        {**pause, "time_ms": T0 + 9000, "phase": "end", "detail": "y", "hold_s": None},
        {"time_ms": T0 + 9100, "phase": "start", "fault": "disk", "targets": "[1]", "detail": None},
    ]
    windows = _fault_windows(events)
    assert [(w["fault"], w["hold_s"], w["end_ms"]) for w in windows] == [
        ("pause", 2.5, T0 + 9000),
        ("disk", None, None),
    ]
    assert hold_label(windows[0]) == "planned 2.5 s, lasted 9.0 s (6.5 s past the plan)"


# --- the totals' words ------------------------------------------------------------------------


def test_totals_are_in_words_with_the_internal_name_where_it_helps() -> None:
    assert total_words("segment rows") == "records read from the partition logs (every replica)"
    assert total_words("commit ok") == "transactions committed (commit ok)"
    assert total_words("abort ok") == "transactions aborted (abort ok)"
    assert total_words("history events") == "events in the history"
    # an operation the mapping does not know: what its type means
    assert total_words("resize fail") == "resize operations that failed (resize fail)"
    assert total_words("resize info") == (
        "resize operations that ended with an unknown outcome (resize info)"
    )
    assert total_words("something else") == "something else"


# --- the run header's inputs ------------------------------------------------------------------


def test_the_run_events_give_the_seed_the_options_and_the_fault_report() -> None:
    report_ = [{"fault": "pause", "happened": 2, "changed": 1, "not_run": ""}]
    summary = {"elapsed_s": 33.1, "fault_report": report_}
    events = [
        {"type": "info", "info": json.dumps({"seed": 5, "args": {"duration_s": 30.0}})},
        {"type": "ok", "info": json.dumps({"summary": summary})},
    ]
    assert run_header(events) == {
        "seed": 5,
        "args": {"duration_s": 30.0},
        "summary": {"elapsed_s": 33.1, "fault_report": report_},
    }
    assert run_header(events[:1]) == {"seed": 5, "args": {"duration_s": 30.0}}
    assert run_header([{"type": "info", "info": "{not json"}]) == {}
    assert run_header([]) == {}


def test_the_cluster_directory_gives_the_shards_nodes_and_settings(tmp_path: Path) -> None:
    for node in (1, 2):
        for shard in (0, 2):
            (tmp_path / f"node-{node}" / f"shard-{shard}").mkdir(parents=True)
    (tmp_path / "partition-node-101" / "events-0").mkdir(parents=True)
    assert describe_cluster(tmp_path) == {"shards": [0, 2]}  # nothing else there: left out
    (tmp_path / "cluster.toml").write_text(
        'shard_count = 4\n[settings]\n"raft.tick.ms" = 10\n'
        '"raft.election.timeout.ms" = [300, 600]\n'
        '[[coordinators]]\nid = 2\ngrpc = "a:1"\n[[coordinators]]\nid = 1\ngrpc = "b:1"\n'
        '[[partition_nodes]]\nid = 101\ngrpc = "c:1"\n'
    )
    from_config = describe_cluster(tmp_path)
    assert from_config == {
        "shards": [0, 1, 2, 3],  # shard_count says 4: shards 1 and 3 have no directory
        "shard_count": 4,
        "nodes": {"coordinators": [1, 2], "partition-log nodes": [101]},
        "settings": {"raft.tick.ms": 10, "raft.election.timeout.ms": [300, 600]},
    }
    state = {
        "shard_count": 3,
        "nodes": [
            {"node_id": 101, "kind": "partition-log"},
            {"node_id": 1, "kind": "coordinator"},
            {"node_id": 201, "kind": "kafka-gateway"},
        ],
    }
    (tmp_path / "cluster.json").write_text(json.dumps(state))
    described = describe_cluster(tmp_path)
    assert described["nodes"] == {
        "partition-log nodes": [101],
        "coordinators": [1],
        "Kafka gateways": [201],
    }
    assert described["shard_count"] == 3 and described["shards"] == [0, 1, 2]
    (tmp_path / "cluster.toml").write_text("shard_count = [")  # damaged: left out
    assert "settings" not in describe_cluster(tmp_path)


# --- the planned hold in the history ---------------------------------------------------------


def _columns() -> list[str]:
    return [
        m.group(1) or m.group(2) for m in re.finditer(r"(?:^|, )(?:`(\w+)`|(\w+)) ", HISTORY_SCHEMA)
    ]


def test_the_history_source_reads_the_planned_hold_and_histories_without_it() -> None:
    columns = _columns()
    start = {
        **{"index": 3, "time_ms": T0, "process": "nemesis", "type": "info", "op": "fault"},
        **{"phase": "start", "fault": "pause", "targets": [2], "detail": "d", "hold_s": 2.25},
    }
    row = dict(zip(columns, _history_row(json.dumps(start).encode(), 0), strict=True))
    assert row["hold_s"] == 2.25 and row["problem"] is None
    assert row["info"] is None  # a known field, not an unknown one
    del start["hold_s"]
    old = dict(zip(columns, _history_row(json.dumps(start).encode(), 0), strict=True))
    assert old["hold_s"] is None and old["problem"] is None
    bad = dict(zip(columns, _history_row(b"\n", 7), strict=True))
    assert bad["problem"] == "empty line at byte 7"


@dataclass
class _Node:
    node_id: int


class _Cluster:
    """Just what the nemesis asks of a cluster to run a plog-restart fault."""

    def __init__(self, config: Path) -> None:
        self.state = type("State", (), {"config": str(config), "faults": None, "shard_count": 1})()
        self.data_dir = config.parent
        self.killed: list[tuple[int, str]] = []
        self.down: set[int] = set()

    def partition_nodes(self) -> list[_Node]:
        return [_Node(101)]

    def leaders(self) -> dict[int, int]:
        return {0: 1}

    def kill(self, node_id: int, signal: str) -> None:
        self.killed.append((node_id, signal))
        self.down.add(node_id)

    def alive(self, node_id: int) -> bool:
        return node_id not in self.down

    def start(self, node_id: int) -> None:
        self.down.discard(node_id)


def test_the_nemesis_records_the_planned_hold_in_a_fault_start(tmp_path: Path) -> None:
    config = tmp_path / "cluster.toml"
    config.write_text('[settings]\n"raft.election.timeout.ms" = [300, 600]\n')
    cluster = _Cluster(config)
    path = tmp_path / "history.jsonl"
    with History(path) as history:
        nemesis = Nemesis(cluster, history, ["plog-restart"], 0.1, 1, say=lambda _: None)  # type: ignore[arg-type]
        fault = nemesis._start(FaultPlan(0, "plog-restart", 0, 1.75))
        assert fault is not None
        nemesis._end(fault)
    start, end = (json.loads(line) for line in path.read_text().splitlines())
    assert (start["phase"], start["hold_s"]) == ("start", 1.75)
    assert end["phase"] == "end" and "hold_s" not in end
    assert cluster.killed == [(101, "KILL")]


def test_the_final_heal_records_a_restart_of_a_node_down_outside_any_fault(
    tmp_path: Path,
) -> None:
    config = tmp_path / "cluster.toml"
    config.write_text('[settings]\n"raft.election.timeout.ms" = [300, 600]\n')
    cluster = _Cluster(config)
    cluster.state.nodes = [_Node(1), _Node(101)]  # type: ignore[attr-defined]
    cluster.wait_for_leaders = lambda timeout_s: {0: 1}  # type: ignore[attr-defined]
    cluster.down.add(101)  # crashed by itself
    path = tmp_path / "history.jsonl"
    with History(path) as history:
        nemesis = Nemesis(cluster, history, ["plog-restart"], 0.1, 1, say=lambda _: None)  # type: ignore[arg-type]
        nemesis.heal()
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["phase"], e["fault"], e["targets"]) for e in events] == [
        ("start", "heal-restart", [101]),
        ("end", "heal-restart", [101]),
    ]
    assert cluster.alive(101) and cluster.killed == [(1, "CONT")]


# --- a whole page ------------------------------------------------------------------------------


def _document() -> dict[str, Any]:
    first = int(T0 // 1000)
    timeline = zero_filled(
        [{"second": first + s, "outcome": "commit", "count": 3} for s in (0, 1, 5)], T0, T0 + 6000
    )
    return {
        "verdict": "PASS",
        "incomplete": [],
        "inputs": {
            "cluster dir": "/c",
            "history": "/c/h.jsonl",
            "master": "local[2]",
            "audit time (s)": 12.5,
        },
        "cluster": {
            "shards": [0, 1, 2],
            "shard_count": 3,
            "nodes": {"coordinators": [1, 2, 3], "partition-log nodes": [101]},
            "settings": {"raft.tick.ms": 10},
        },
        "checks": [
            {
                "name": "duplicate",
                "description": "d",
                "status": "PASS",
                "count": 0,
                "examples": [],
                "skipped": None,
            }
        ],
        "stats": {
            "partitions": [
                {
                    "topic": "t",
                    "partition": 0,
                    "records": 1,
                    "visible": 1,
                    "aborted": 0,
                    "commit_markers": 1,
                    "abort_markers": 0,
                    "batches": 2,
                    "end_offset": 2,
                }
            ],
            "terms": [
                {"shard": 0, "term": 1, "time_ms": T0 + 10},
                {"shard": 0, "term": 2, "time_ms": T0 + 2500},
                {"shard": 1, "term": 1, "time_ms": T0 + 20},
            ],
            "totals": {"segment rows": 3, "batches": 2},
            "summary": {"ops": {"commit ok": 9}, "start_ms": T0, "end_ms": T0 + 6000},
            "timeline": timeline,
            "latency": {"n": 0, "p50_p90_p99": [], "max": None, "bins": []},
            "faults": [
                _window("partition", 0.0, 0.0, None, targets=(), detail="not run: no netns"),
                _window("leader-kill", 1.0, 4.2, 1.0),
                _window("pause", 4.5, 5.0, None),
            ],
            "run": {
                "seed": 42,
                "args": {"seed": 42, "duration_s": 5.0, "nemesis": ["leader-kill", "partition"]},
                "summary": {
                    "elapsed_s": 6.1,
                    "fault_report": [
                        {"fault": "leader-kill", "happened": 1, "changed": 1, "not_run": ""},
                        {
                            "fault": "partition",
                            "happened": 0,
                            "changed": 0,
                            "not_run": "not run: no netns",
                        },
                    ],
                },
            },
        },
    }


def test_the_page_reads_top_down_with_the_run_lanes_every_shard_and_words(tmp_path: Path) -> None:
    _, html_path = report.write(tmp_path, _document())
    page = html_path.read_text()
    order = [
        "id='verdict'",
        "id='run'",
        "id='checks'",
        "id='timeline'",
        "id='faults'",
        "id='terms'",
        "id='leader-changes'",
        "id='partitions'",
        "id='totals'",
    ]
    assert [page.index(marker) for marker in order] == sorted(page.index(m) for m in order)
    run = page[page.index("id='run'") : page.index("id='checks'")]
    for shown in (
        "42",
        "5.0 s asked for",
        "the workload ran 6.1 s",
        "the history spans 6.0 s",
        "coordinators: 1, 2, 3",
        "partition-log nodes: 101",
        "3 shards",
        "raft.tick.ms",
        "leader-kill, partition",
        "not run: no netns",
        "took 12.5 s",
        "local[2]",
    ):
        assert shown in run, shown
    assert page.count("<img ") == 4
    assert re.findall(r"<figure id='timeline' data-lanes='([^']*)'", page) == ["leader-kill pause"]
    assert re.findall(r"<figure id='terms' data-lanes='([^']*)'", page) == ["leader-kill pause"]
    assert "planned 1.0 s, lasted 3.2 s (2.2 s past the plan)" in page
    shards = re.findall(r"<tr data-shard='(\d+)'>(.*?)</tr>", page)
    assert [s for s, _ in shards] == ["0", "1", "2"]
    assert "no transitions" in shards[2][1] and "1 → 2" in shards[0][1]
    assert "transactions committed (commit ok)" in page
    assert "records read from the partition logs" in page
    assert "http://" not in page and "https://" not in page
    document = json.loads((tmp_path / "audit.json").read_text())
    assert document["cluster"]["shards"] == [0, 1, 2]


def test_a_page_without_a_history_or_cluster_files_leaves_those_pieces_out(tmp_path: Path) -> None:
    document = _document()
    document["cluster"] = {"shards": [0, 1]}
    stats = document["stats"]
    for key in ("timeline", "latency", "faults", "run", "summary"):
        del stats[key]
    _, html_path = report.write(tmp_path, document)
    page = html_path.read_text()
    run = page[page.index("id='run'") : page.index("id='checks'")]
    assert "seed" not in run and "cluster settings" not in run and "unknown (no history)" in run
    assert "Transactions over time" not in page and page.count("<img ") == 2
    assert re.findall(r"<tr data-shard='(\d+)'>", page) == ["0", "1"]
