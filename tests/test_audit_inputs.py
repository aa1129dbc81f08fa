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


def test_a_skipped_check_makes_the_verdict_incomplete_not_pass() -> None:
    from spark.checks import CHECKS, CheckResult
    from spark.cli import EXIT_STATUS
    from spark.report import incomplete_reasons, verdict

    passing = [CheckResult(name, 0) for name, _ in CHECKS]
    assert verdict(passing) == "PASS" and incomplete_reasons(passing) == []
    one_skipped = [*passing[:-1], CheckResult(passing[-1].name, 0, skipped="no history given")]
    assert verdict(one_skipped) == "INCOMPLETE"
    assert incomplete_reasons(one_skipped) == [f"{passing[-1].name}: no history given"]
    failing = [CheckResult(passing[0].name, 2), *one_skipped[1:]]
    assert verdict(failing) == "FAIL"  # a violation outweighs a check that did not run
    assert verdict([]) == "INCOMPLETE"  # nothing checked proves nothing
    assert EXIT_STATUS == {"PASS": 0, "FAIL": 1, "INCOMPLETE": 2}
