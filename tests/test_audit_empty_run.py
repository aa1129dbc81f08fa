"""A run in which no transaction committed: every transaction aborted on
purpose, workers with no input to copy. Its history is legitimate (the final
event's ``committed`` holds null for input partitions the group never
committed), its final read does not wait out a long poll over aborted data,
and its audit is INCOMPLETE naming the checks that had nothing to judge,
never PASS (nothing checked proves nothing) nor FAIL (nothing is wrong)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from raftcoord.chaos.options import Options
from raftcoord.chaos.workload import FINAL_READ_STALL_S, Workload
from spark.audit import run_audit
from tests.history_format import read_history
from tests.local_cluster import running_cluster

# A cluster, a workload and a Spark audit on a busy 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SEED = 47
DURATION_S = 4.0
#: The checks that judge committed data, polls or the pipeline: a run
#: without commits gives them nothing.
NOTHING_TO_JUDGE = {
    "lost-write",
    "duplicate",
    "aborted-read",
    "uncommitted-read",
    "zombie-write",
    "nonmonotonic-poll",
    "skipped-poll",
    "exactly-once-pipeline",
    "unseen",
}


def test_a_run_without_commits_is_incomplete_naming_its_checks(spark: Any, tmp_path: Path) -> None:
    print(f"workload seed {SEED}")
    history = tmp_path / "history.jsonl"
    with running_cluster(tmp_path / "cluster", shards=1, partition_nodes=1) as cluster:
        options = Options(
            seed=SEED,
            duration_s=DURATION_S,
            abort_ratio=1.0,
            input_records=0,
            drain_timeout_s=120,
        )
        summary = Workload(cluster, options, history, say=print).run()
        cluster_dir = cluster.data_dir
    assert summary["crashed"] == [] and summary["unfinished"] == []
    assert summary["ops"]["abort"]["ok"] > 0 and "commit" not in summary["ops"]
    # The final read's polls over aborted data and markers move its positions
    # without returning records: it goes on at once instead of waiting out a
    # FINAL_READ_STALL_S poll (the run took DURATION_S + 60 s that way).
    assert summary["elapsed_s"] < DURATION_S + FINAL_READ_STALL_S, summary["elapsed_s"]
    (final,) = [e for e in read_history(history) if e["op"] == "final"]
    assert set(final["committed"].values()) == {None}  # the workers committed nothing

    outcome = run_audit(spark, cluster_dir, history, tmp_path / "report")
    statuses = {r.name: r.status for r in outcome.results}
    assert "FAIL" not in statuses.values(), outcome.document["checks"]
    incomplete = {name for name, status in statuses.items() if status == "INCOMPLETE"}
    assert incomplete >= NOTHING_TO_JUDGE, statuses
    assert statuses["unreadable-data"] == "PASS"  # the null offsets are read, not damage
    document = json.loads(outcome.json_path.read_text())
    assert document["verdict"] == "INCOMPLETE" and document["failed"] == []
    named = {reason.split(":")[0] for reason in document["incomplete"]}
    assert named == incomplete, document["incomplete"]
    lost_write = next(r for r in document["incomplete"] if r.startswith("lost-write:"))
    assert lost_write == (
        "lost-write: nothing to judge: saw no write of a committed transaction "
        "(commit ok) in the history"
    )
    page = outcome.html_path.read_text()
    assert "none: the history records no fault" in page  # a run without a nemesis
    assert page.index("lost-write: nothing to judge") < page.index("<h2>Checks</h2>")
