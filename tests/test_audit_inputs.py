"""What `raftcoord audit` audits when given only a cluster directory (pure
file lookups, no Spark): the history `raftcoord workload` wrote there, so
that the checks that need a history are not skipped for want of a flag."""

from __future__ import annotations

from pathlib import Path

from raftcoord.chaos.arguments import HISTORY_FILE
from spark.cli import history_of


def test_the_workloads_history_in_the_cluster_directory_is_audited(tmp_path: Path) -> None:
    assert history_of(tmp_path, None) is None  # none written: the history checks skip
    (tmp_path / HISTORY_FILE).write_text("")
    assert history_of(tmp_path, None) == tmp_path / HISTORY_FILE
    other = tmp_path / "elsewhere.jsonl"
    assert history_of(tmp_path, str(other)) == other.resolve()  # --history wins
