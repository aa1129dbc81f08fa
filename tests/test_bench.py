"""``raftcoord bench``: its pure helpers, its log lines, its client processes, and one
quick run end to end."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from raftcoord.bench import counts
from raftcoord.bench.load import ClientPool, Outcome, Work, run_actor, run_load, split
from raftcoord.bench.progress import Steps, bench_logging
from raftcoord.bench.stats import (
    CLK_TCK,
    Target,
    cpu_deltas_s,
    parse_stat_cpu_s,
    parse_vm_rss_bytes,
    percentile,
)
from raftcoord.bench.targets import failed_transactions, mark_moved_steps, tables, targets

# --- pure helpers ----------------------------------------------------------------------


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 51.0  # round(0.5 * 99) = 50 -> the 51st
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile(values, 0) == 1.0
    assert percentile(list(reversed(values)), 50) == 51.0  # order does not matter
    assert percentile([7.0], 99.9) == 7.0
    assert percentile([], 50) == 0.0


def test_cpu_from_proc_stat_survives_spaces_and_parentheses_in_the_name() -> None:
    fields = ["S"] + ["0"] * 10 + [str(3 * CLK_TCK), str(2 * CLK_TCK)] + ["0"] * 30
    stat = "1234 (raft (coord) x) " + " ".join(fields)
    assert parse_stat_cpu_s(stat) == 5.0
    # This process's own reading agrees with os.times (the same tick counters).
    before = os.times()
    own = Path(f"/proc/{os.getpid()}/stat").read_text()
    after = os.times()
    tick = 1 / CLK_TCK
    assert before.user + before.system - tick <= parse_stat_cpu_s(own)
    assert parse_stat_cpu_s(own) <= after.user + after.system + tick


def test_cpu_delta_counts_only_processes_seen_twice() -> None:
    before = {1: 10.0, 2: 20.0, 3: 30.0}
    after = {1: 10.5, 2: 21.0, 4: 99.0}  # 3 was killed, 4 started in between
    deltas = cpu_deltas_s(before, after)
    assert deltas == pytest.approx({1: 0.5, 2: 1.0})
    assert sum(deltas.values()) == pytest.approx(1.5)


def test_vm_rss_is_read_in_bytes() -> None:
    status = "Name:\tpython\nVmPeak:\t  9000 kB\nVmRSS:\t  2048 kB\nThreads:\t4\n"
    assert parse_vm_rss_bytes(status) == 2048 * 1024
    with pytest.raises(ValueError, match="no VmRSS"):
        parse_vm_rss_bytes("Name:\tkthread\n")


def test_split_spreads_actors_evenly_over_processes() -> None:
    assert split(1, 4) == [1]
    assert split(8, 4) == [2, 2, 2, 2]
    assert split(10, 4) == [3, 3, 2, 2]
    assert split(128, 3) == [43, 43, 42]
    assert sum(split(37, 5)) == 37


def test_outcomes_merge_counts_and_take_the_longest_elapsed() -> None:
    a = Outcome([0.1], [0.05], completed=1, records=2, elapsed_s=2.0, client_cpu_s=0.5)
    b = Outcome([0.2, 0.3], [0.1, 0.1], completed=2, records=4, failed=1, elapsed_s=3.0)
    b.errors["KafkaTimeoutError"] += 1
    a.merge(b)
    assert (a.completed, a.records, a.failed, a.elapsed_s) == (3, 6, 1, 3.0)
    assert a.latencies == [0.1, 0.2, 0.3] and a.client_cpu_s == 0.5
    assert a.errors == {"KafkaTimeoutError": 1}


def test_a_target_says_its_margin_the_same_way_for_both_kinds() -> None:
    at_most = Target("p99", 75.0, 50.0, at_most=True, unit="ms")
    assert at_most.met is False and at_most.margin is not None and at_most.margin < 1
    assert at_most.as_row() == ["p99", "≤ 50 ms", "75 ms", "0.67", "NOT met"]
    at_least = Target("ratio", 0.5, 0.25, at_most=False, unit="x")
    assert at_least.met is True and at_least.margin == 2.0
    assert Target("p99", 25.0, 50.0, at_most=True).margin == 2.0  # met: above 1 too
    missing = Target("failover", None, 1.0, at_most=True, unit="s")
    assert missing.met is None and missing.as_row()[2:] == ["-", "-", "not measured"]


def _load(per_s: float, p50: float, p99: float, cpu: float, failed: int = 0) -> dict[str, Any]:
    return {
        "concurrency": 1,
        "completed": 100,
        "failed": failed,
        "errors": {},
        "seconds": 1.0,
        "per_s": per_s,
        "records_per_s": per_s * 2,
        "p50_ms": p50,
        "p99_ms": p99,
        "p999_ms": p99,
        "commit_p50_ms": p50 / 2,
        "cluster_cpu_ms_per_op": cpu,
        "client_cpu_ms_per_op": 1.0,
        "cluster_cores": 1.0,
    }


RESULTS: dict[str, Any] = {
    "ceilings": {
        "ping": [
            {**_load(2000, 0.5, 1.0, 0.2), "concurrency": 1},
            {**_load(6000, 4.0, 9.0, 0.2), "concurrency": 32},
        ],
        "raft_commit": {"request": "InitProducerId", "n": 50, "errors": 0, "p50_ms": 2.0},
        "disk": {"fsyncs_per_s": 5000.0},
    },
    "end_to_end": [
        {"producers": 1, "records_per_txn": 2, **_load(60, 15.0, 20.0, 14.0)},
        {
            "producers": 32,
            "records_per_txn": 2,
            **_load(2400, 30.0, 45.0, 1.2, failed=2),
            "counts": {
                "calls": {"partition log Produce": 1.5},
                "raft_entries": 0.25,
                "fsyncs": {"partition log": 3.5},
                "context_switches": {"coordinator": 40.0},
                "batches_per_fsync": 2.0,
            },
        },
    ],
    "one_process": {
        "nodes": [
            {"node_id": 1, "pid": 10, "kind": "coordinator", "leads": [0, 1]},
            {"node_id": 2, "pid": 11, "kind": "coordinator", "leads": []},
            {"node_id": 101, "pid": 12, "kind": "partition-log", "leads": []},
        ],
        "rows": [
            {
                "kind": "transactions",
                "producers": 1,
                "replication_factor": 3,
                **_load(50, 17.0, 28.0, 24.0),
                "node_cpu_percent": {"1": 40.0, "2": 12.0, "101": 30.0},
                "transaction_shards": [1],
            },
            {
                "kind": "transactions",
                "producers": 1,
                "replication_factor": 1,
                **_load(80, 12.0, 20.0, 11.0),
                "node_cpu_percent": {"1": 50.0, "2": 15.0, "101": 10.0},
                "transaction_shards": [1],
            },
            {
                "kind": "transactions",
                "producers": 32,
                "replication_factor": 1,
                **_load(140, 200.0, 400.0, 9.0, failed=1),
                "node_cpu_percent": {"1": 40.0, "2": 35.0, "101": 20.0},
                "transaction_shards": [0, 1],
            },
            {
                "kind": "idempotent",
                "producers": 1,
                "replication_factor": 1,
                **_load(500, 2.0, 4.0, 1.5),
                "node_cpu_percent": {"1": 5.0, "2": 4.0, "101": 33.0},
                "transaction_shards": [],
            },
        ],
    },
    "txn_vs_idempotent": {
        "producers": 8,
        "commit_interval_ms": 100,
        "transactions": _load(10, 110, 130, 30),
        "idempotent": _load(11, 105, 120, 25, failed=1),
        "ratio": 0.98,
    },
    "scaling": [{"shards": 1, **_load(200, 100, 200, 6)}],
}
RESULTS["ceilings"]["raft_commit"]["p99_ms"] = 3.0


def test_targets_are_ratios_of_one_run_and_skipped_phases_are_not_measured() -> None:
    found = {t.name: t for t in targets(RESULTS)}
    assert found["1 producer: txn p50 / bare Raft commit p50"].value == 7.5
    assert found["32 producers: txn/s / Ping calls/s (32 callers)"].value == 0.4
    assert found["32 producers: txn p99"].met is True
    assert found["32 producers: cluster CPU per txn"].met is True
    batched = "32 producers (batched path)"
    assert found[f"{batched}: cluster CPU per txn"].met is True
    assert found[f"{batched}: txn/s / Ping calls/s (32 callers)"].value == 0.4
    assert found[f"{batched}: partition-log fsyncs per txn"].value == 3.5
    assert found[f"{batched}: AddPartitionsToTxn calls per txn"].value is None  # not counted
    assert found["100 ms commits: transactional / idempotent"].met is True
    assert found["failover, median"].met is None
    assert found["coordinator RSS per 10K open txns"].value is None
    # The one-process targets on each replication factor that ran.
    assert found["one process, 1 replica, 1 producer: txn/s"].met is True
    assert found["one process, 1 replica, 1 producer: cluster CPU per txn"].met is False
    assert found["one process, 1 replica, 32 producers: txn/s"].met is False
    assert found["one process, 1 replica, 1 idempotent producer: flushes/s"].value == 500
    assert found["one process, 3 replicas, 1 producer: txn/s"].value == 50
    assert found["one process, 3 replicas, 32 producers: txn/s"].met is None


def test_tables_show_every_phase_that_ran_and_the_targets() -> None:
    built = tables(RESULTS)
    assert [str(t.title).split(":")[0].split(" (")[0] for t in built] == [
        "ceilings",
        "end to end, public client",
        "end to end, per committed transaction",
        "one client process, each transaction",
        "replicated partitions",
        "8 producers committing",
        "scaling",
        "targets",
    ]
    console = Console(file=io.StringIO(), width=200)
    for table in built:
        console.print(table)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "32 x 2" in text and "2400" in text and "NOT met" in text and "not measured" in text
    assert "c1(0,1) %" in text and "c2() %" in text and "p101 %" in text
    assert "1 txn" in text and "1 idempotent" in text
    assert "1 txn, RF 3 / RF 1" in text and "0.62" in text
    # The counts: Ping's cluster CPU is 0.2 ms, a transaction's 1.2 ms.
    assert "calls, partition log Produce" in text and "1.50" in text and "6.0" in text


def test_a_steps_counts_are_the_differences_per_committed_transaction() -> None:
    before, after = counts.Reading(), counts.Reading()
    before.calls[("partition log", "Produce")] = 10
    after.calls[("partition log", "Produce")] = 50
    after.calls[("coordinator", "Ping")] = 0  # no call made: left out
    before.applied, after.applied = {"0": 5, "1": 7}, {"0": 15, "1": 17}
    before.fsyncs["partition log"], after.fsyncs["partition log"] = 100, 180
    after.switches["coordinator"] = 400
    after.batches_synced, after.group_fsyncs = 60, 20
    spent = counts.per_transaction(before, after, 20)
    assert spent == {
        "calls": {"partition log Produce": 2.0},
        "raft_entries": 1.0,
        "fsyncs": {"partition log": 4.0},
        "context_switches": {"coordinator": 20.0},
        "batches_per_fsync": 3.0,
    }
    assert counts.per_transaction(before, after, 0) == {}


def test_failed_transactions_leave_out_the_failover_phase() -> None:
    with_failover = {**RESULTS, "failover": {"failed_during_failover": 5}}
    assert failed_transactions(with_failover) == 4  # 2 end to end, 1 one-process, 1 idempotent


# --- one quick run ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_run_writes_every_section_with_positive_numbers(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    command = [
        sys.executable,
        "-m",
        "raftcoord.cli",
        "bench",
        "--quick",
        "--json",
        str(out),
        "--dir",
        str(tmp_path),
    ]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # the run stops its clusters on the way out
        try:
            proc.communicate(timeout=60)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("raftcoord bench --quick did not finish in 420 s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text
    results = json.loads(out.read_text())
    assert results["failed_transactions"] == 0, text

    ceil = results["ceilings"]
    assert [p["concurrency"] for p in ceil["ping"]] == [1, 32]
    for row in ceil["ping"]:
        assert row["per_s"] > 0 and row["p50_ms"] > 0 and row["failed"] == 0
    assert ceil["raft_commit"]["p50_ms"] > 0 and ceil["raft_commit"]["errors"] == 0
    assert ceil["disk"]["fsyncs_per_s"] > 0

    alone = results["one_process"]
    assert {(r["kind"], r["producers"]) for r in alone["rows"]} == {
        (kind, n) for kind in ("transactions", "idempotent") for n in (1, 32)
    }
    coordinators = [n for n in alone["nodes"] if n["kind"] == "coordinator"]
    assert sorted(s for n in coordinators for s in n["leads"]) == [0, 1, 2]
    for row in alone["rows"]:
        assert sorted(row["node_cpu_percent"]) == sorted(str(n["node_id"]) for n in alone["nodes"])
        assert sum(row["node_cpu_percent"].values()) > 0, row
    assert {(r["replication_factor"], r["kind"], r["producers"]) for r in alone["rows"]} == {
        (factor, kind, n)
        for factor in (1, 3)
        for kind in ("transactions", "idempotent")
        for n in (1, 32)
    }
    loads = [*results["end_to_end"], *alone["rows"], *results["scaling"]]
    loads += [results["txn_vs_idempotent"][k] for k in ("transactions", "idempotent")]
    loads += [level["cost"] for level in results["open_transactions"]["levels"][1:]]
    for row in loads:
        assert row["completed"] > 0 and row["per_s"] > 0, row
        assert row["p50_ms"] > 0 and row["cluster_cpu_ms_per_op"] > 0, row
    for row in results["end_to_end"]:
        spent = row["counts"]
        assert spent["raft_entries"] > 0 and spent["calls"]["coordinator EndTxn"] > 0, row
        assert spent["fsyncs"]["partition log"] > 0 and spent["fsyncs"]["coordinator"] > 0, row
    assert "per committed transaction" in text
    assert [r["offered_per_s"] for r in results["offered"]] == [150, 600]
    assert all(r["completed"] > 0 for r in results["offered"])
    kafka = results["kafka"]
    assert [r["producers"] for r in kafka] == [1, 32]
    for row in kafka:
        assert row["completed"] > 0 and row["failed"] == 0, row
        assert row["counts"]["calls"]["gateway EndTxn"] > 0, row
    assert {(r["producers"], r["records_per_txn"]) for r in results["end_to_end"]} >= {
        (1, 2),
        (32, 10),
    }
    assert results["txn_vs_idempotent"]["ratio"] > 0

    opened = results["open_transactions"]
    assert opened["opened"] > 0
    assert all(m > 0 for level in opened["levels"] for m in level["rss_mb"])
    assert results["failover"]["median_s"] > 0
    assert [r["shards"] for r in results["scaling"]] == [1, 3]
    assert len(results["targets"]) == 23
    assert all(t["value"] is not None and t["value"] > 0 for t in results["targets"])
    assert "targets" in text


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_option_comparison_runs_both_clusters(tmp_path: Path) -> None:
    """``raftcoord bench metrics`` in brief (``tls`` is the same code with
    other cluster options): one step per cluster, their ratio, and the
    endpoints scraped meanwhile."""
    suite = "metrics"
    command = [sys.executable, "-m", "raftcoord.cli", "bench", suite, "--seconds", "2.5"]
    command += ["--producers", "1", "--json", "--dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(done.stdout[done.stdout.index("[\n") :])
    from raftcoord.bench.variants import COMPARISONS

    _title, baseline, option = COMPARISONS[suite]
    assert [r["mode"] for r in rows] == [baseline.name, option.name]
    assert all(r["completed"] > 0 and r["failed"] == 0 for r in rows), rows
    assert [r["scrapes"] > 0 for r in rows] == [False, option.scraped]
    assert f"{option.name} / {baseline.name}" in done.stdout


def test_the_tls_table_shows_both_modes_and_their_ratio() -> None:
    from raftcoord.bench.variants import table

    def row(mode: str, per_s: float, cpu: float) -> dict[str, Any]:
        return {
            "mode": mode,
            "round": 1,
            "producers": 1,
            "per_s": per_s,
            "p50_ms": 10.0,
            "p99_ms": 20.0,
            "cluster_cpu_ms_per_op": cpu,
            "client_cpu_ms_per_op": 2.0,
            "failed": 0,
        }

    out = io.StringIO()
    Console(file=out, width=200).print(
        table("tls", [row("plaintext", 50.0, 20.0), row("TLS", 40.0, 25.0)])
    )
    text = out.getvalue()
    assert "plaintext" in text and "TLS / plaintext" in text
    assert "0.80" in text and "1.25" in text  # throughput and cluster CPU per transaction


# --- what the bench shows while it runs ------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\]8;[^\x1b]*\x1b\\")
SOURCE_LOCATION = re.compile(r"\w+\.py:\d+|file://")
LOG_LINE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) raftcoord\.[a-z._]+ \S.*"
)


def test_bench_log_lines_are_the_nodes_format_without_source_locations() -> None:
    # A terminal, as a user runs it: rich's Console.log and RichHandler would
    # end every line with its file:line there.
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    client = logging.getLogger("raftcoord.client.producer")
    with Steps(console, 2) as step:
        step("starting the cluster")
        client.warning("could not abort the open transaction on close: %s", "boom")
        client.info("producer 7: epoch bumped")  # below WARNING: not shown
        step("ceilings: Ping, 1 caller")
        step.finish()
    text = ANSI.sub("", out.getvalue()).replace("\r", "\n")
    assert not SOURCE_LOCATION.search(text), text
    lines = [line.strip() for line in text.splitlines() if " raftcoord." in line]
    assert len(lines) == 3, text
    for line in lines:
        assert LOG_LINE.fullmatch(line), line
    assert lines[0].endswith(
        " INFO raftcoord.bench event=step step=1/2 what='starting the cluster'"
    )
    assert lines[1].endswith(
        " WARNING raftcoord.client.producer could not abort the open transaction on close: boom"
    )
    assert lines[2].endswith(" event=step step=2/2 what='ceilings: Ping, 1 caller'")
    assert "epoch bumped" not in text
    assert "2/2" in text  # the progress bar's count


def test_bench_logging_leaves_the_loggers_as_it_found_them() -> None:
    root, bench = logging.getLogger(), logging.getLogger("raftcoord.bench")
    before = (list(root.handlers), root.level, bench.level)
    out = io.StringIO()
    with bench_logging(Console(file=out, width=200)) as log:
        log.info("event=step what=%r", "a\nb")
    assert (list(root.handlers), root.level, bench.level) == before
    line = out.getvalue()
    assert line.count("\n") == 1 and "what='a\\nb'" in line  # one line whatever it holds
    assert not SOURCE_LOCATION.search(line)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_client_pool_runs_load_after_load_in_the_same_processes() -> None:
    from raftcoord.bench.grpc_style import server

    with server("thread pool") as (address, pid), ClientPool(2) as pool:
        workers = pool.pids
        loads = [
            run_load(Work("ping", [address]), callers, 0.3, 2, [pid], pool=pool)
            for callers in (4, 1, 2)  # the second leaves one process idle
        ]
        for load, callers in zip(loads, (4, 1, 2), strict=True):
            assert load.concurrency == callers
            assert load.outcome.completed > 0 and load.outcome.failed == 0
            assert load.node_cpu_s[pid] > 0
        assert pool.pids == workers
        # A load whose actors cannot start stops the run, and the pool.
        with pytest.raises(RuntimeError, match="failed to start"):
            run_load(Work("ping", ["127.0.0.1:1"]), 1, 0.3, 1, [pid], pool=pool)
        assert pool.closed
    assert not [w for w in workers if Path(f"/proc/{w}").exists()]  # ended and reaped


def test_steps_run_at_another_machine_speed_are_marked() -> None:
    """A step whose machine-speed probe is more than 10 % off the run's at
    its start is marked, and its rate shows a ``!``."""
    results = {
        "machine": {"probe_ms": 10.0},
        "end_to_end": [
            {"producers": 1, "records_per_txn": 2, **_load(60, 15, 20, 14), "probe_ms": 10.5},
            {"producers": 32, "records_per_txn": 2, **_load(99, 30, 45, 1), "probe_ms": 12.0},
        ],
    }
    assert mark_moved_steps(results) == 1
    assert [f["probe_moved"] for f in results["end_to_end"]] == [False, True]
    console = Console(file=io.StringIO(), width=200)
    console.print(tables(results)[0])
    assert "99!" in console.file.getvalue()  # type: ignore[attr-defined]
    assert "60!" not in console.file.getvalue()  # type: ignore[attr-defined]


class Stepper:
    """An actor whose steps take ``step_s`` each, noting when each began
    and the latency it was given."""

    def __init__(self, index: int, step_s: float) -> None:
        self.index = index
        self.step_s = step_s
        self.began: list[float] = []

    def step(self, outcome: Outcome, scheduled: float | None = None) -> bool:
        started = time.perf_counter()
        self.began.append(started)
        time.sleep(self.step_s)  # the step's own work
        outcome.latencies.append(time.perf_counter() - (scheduled or started))
        outcome.completed += 1
        return True


def test_an_open_loop_keeps_its_schedule_and_counts_lateness() -> None:
    """Steps on a schedule of one every 50 ms for 0.375 s: 8 of them, none
    begun before it was due; steps slower than the period begin late, their
    latency counting from when they were due, and what is left of the
    schedule at twice the duration is counted among the errors, not run."""
    on_time, outcome = Stepper(0, 0.001), Outcome()
    t0 = time.perf_counter()
    run_actor(on_time, outcome, 0.05, t0, 0.375)
    assert outcome.completed == 8
    assert all(b >= t0 + 0.05 * i for i, b in enumerate(on_time.began))
    slow, late = Stepper(0, 0.2), Outcome()
    t0 = time.perf_counter()
    run_actor(slow, late, 0.05, t0, 0.375)
    left = late.errors["not begun: behind the schedule"]
    assert late.completed + left == 8 and left >= 4
    assert late.latencies[-1] >= slow.began[-1] + 0.2 - (t0 + 0.05 * (late.completed - 1))
