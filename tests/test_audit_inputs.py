"""What `raftcoord audit` audits when given only a cluster directory (pure
file lookups, no Spark): the history `raftcoord workload` wrote there, so
that the checks that need a history are not skipped for want of a flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raftcoord.chaos.arguments import HISTORY_FILE
from spark.cli import history_of


def test_the_workloads_history_in_the_cluster_directory_is_audited(tmp_path: Path) -> None:
    assert history_of(tmp_path, None) is None  # none written: the history checks skip
    (tmp_path / HISTORY_FILE).write_text("")
    assert history_of(tmp_path, None) == tmp_path / HISTORY_FILE
    other = tmp_path / "elsewhere.jsonl"
    assert history_of(tmp_path, str(other)) == other.resolve()  # --history wins


def test_a_skipped_check_makes_the_verdict_incomplete_not_pass() -> None:
    from raftcoord.chaos.verdict import EXIT_STATUS
    from spark.checks import CHECKS, CheckResult
    from spark.report import judge

    passing = [CheckResult(name, 0) for name, _ in CHECKS]
    assert judge(passing) == ("PASS", [], [])
    one_skipped = [*passing[:-1], CheckResult(passing[-1].name, 0, skipped="no history given")]
    assert judge(one_skipped) == ("INCOMPLETE", [], [f"{passing[-1].name}: no history given"])
    failing = [CheckResult(passing[0].name, 2), *one_skipped[1:]]
    # a violation outweighs a check that did not run
    assert judge(failing)[:2] == ("FAIL", [f"{passing[0].name}: 2 violations"])
    assert judge([])[0] == "INCOMPLETE"  # nothing checked proves nothing
    assert EXIT_STATUS == {"PASS": 0, "FAIL": 1, "INCOMPLETE": 2}


def test_a_check_with_nothing_to_judge_is_incomplete_naming_what_it_lacked() -> None:
    """A run in which nothing committed: lost-write found no lost write among
    no writes, which proves nothing."""
    from spark.checks import CHECKS, CheckResult
    from spark.report import judge

    lacked = "write of a committed transaction (commit ok) in the history"
    empty = CheckResult("lost-write", 0, lacked=[lacked])
    assert empty.status == "INCOMPLETE"
    results = [empty if name == "lost-write" else CheckResult(name, 0) for name, _ in CHECKS]
    assert judge(results) == ("INCOMPLETE", [], [f"lost-write: nothing to judge: saw no {lacked}"])
    # what it found is what counts when it found something
    assert CheckResult("lost-write", 1, lacked=[lacked]).status == "FAIL"


def test_one_verdict_rule_holds_the_faults_to_having_changed_something() -> None:
    """The rule of the demo, the audit and chaos: a fault kind asked for that
    never changed anything the cluster or the clients saw (the nemesis's
    ``changed``) makes a run INCOMPLETE, naming the kind, even when every
    check passed; a crashed client makes it FAIL."""
    from spark.checks import CHECKS, CheckResult
    from spark.report import judge

    passing = [CheckResult(name, 0) for name, _ in CHECKS]
    report = [
        {"fault": "leader-kill", "happened": 2, "changed": 2, "not_run": ""},
        {"fault": "pause", "happened": 3, "changed": 0, "not_run": ""},
        {"fault": "disk", "happened": 0, "changed": 0, "not_run": ""},
        {"fault": "partition", "happened": 0, "changed": 0, "not_run": "not run: no netns"},
    ]
    summary = {"crashed": [], "unfinished": [], "fault_report": report}
    assert judge(passing, summary) == (
        "INCOMPLETE",
        [],
        [
            "fault pause never changed anything the cluster or the clients saw (3 ended)",
            "fault disk asked for and never happened",
            "fault partition asked for and not run: no netns",
        ],
    )
    assert judge(passing, {**summary, "fault_report": report[:1]}) == ("PASS", [], [])
    assert judge(passing, {**summary, "fault_report": []}) == ("PASS", [], [])  # none asked
    crashed = {**summary, "crashed": ["txn-0: ValueError: x"]}
    assert judge(passing, crashed)[:2] == ("FAIL", ["crashed: txn-0: ValueError: x"])


@pytest.mark.parametrize(
    "argv",
    [[], ["--cluster-dir", "x", "--cluster-config", "y"], ["--cluster-dir", "x", "--nope"]],
)
def test_a_usage_error_exits_64_not_2_which_is_incomplete(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from raftcoord.chaos.verdict import EXIT_USAGE
    from raftcoord.cli.main import main
    from spark.cli import parser

    for run in (lambda: parser().parse_args(argv), lambda: main(["audit", *argv])):
        with pytest.raises(SystemExit) as exited:
            run()
        assert exited.value.code == EXIT_USAGE == 64
        assert "usage: raftcoord audit" in capsys.readouterr().err


def _config(directory: Path, tls: bool) -> Path:
    path = directory / "cluster.toml"
    text = (
        'shard_count = 1\n\n[[coordinators]]\nid = 1\ngrpc = "127.0.0.1:7100"\n'
        'raft = ["127.0.0.1:7201"]\n\n[[partition_nodes]]\nid = 101\ngrpc = "127.0.0.1:7300"\n'
    )
    if tls:
        text += '\n[tls]\nca_file = "tls/ca.pem"\ncert_dir = "tls"\nsuper_users = ["User:admin"]\n'
    path.write_text(text)
    return path


def _network_args(config: Path, *more: str) -> Any:
    from spark.cli import parser

    return parser().parse_args(["--cluster-config", str(config), *more])


def test_across_hosts_the_audit_calls_the_nodes_as_the_configs_admin(tmp_path: Path) -> None:
    """--cluster-config of a cluster with [tls]: the CA of the config and
    cert_dir's admin certificate unless others are given; a missing file, or
    TLS files for a cluster without TLS, are refused before Spark starts."""
    from spark.cli import _network_inputs
    from spark.nodes import Cluster

    plain = _config(tmp_path, tls=False)
    assert _network_inputs(_network_args(plain), None) == Cluster(plain.resolve())
    refused = _network_inputs(_network_args(plain, "--ssl-certfile", "x.pem"), None)
    assert isinstance(refused, str) and "has no [tls] table" in refused
    secured_dir = tmp_path / "secured"
    secured_dir.mkdir()
    secured = _config(secured_dir, tls=True)
    missing = _network_inputs(_network_args(secured), None)
    assert isinstance(missing, str) and "ca.pem is not a file" in missing
    (secured_dir / "tls").mkdir()
    for name in ("ca.pem", "admin.pem", "admin.key", "mine.pem", "mine.key"):
        (secured_dir / "tls" / name).write_text("PEM")
    tls = secured_dir / "tls"
    assert _network_inputs(_network_args(secured), None) == Cluster(
        secured.resolve(), (str(tls / "ca.pem"), str(tls / "admin.pem"), str(tls / "admin.key"))
    )
    given = _network_args(
        secured, "--ssl-certfile", str(tls / "mine.pem"), "--ssl-keyfile", str(tls / "mine.key")
    )
    assert _network_inputs(given, None) == Cluster(
        secured.resolve(), (str(tls / "ca.pem"), str(tls / "mine.pem"), str(tls / "mine.key"))
    )
    history = _network_inputs(_network_args(plain), tmp_path / "no-such-history.jsonl")
    assert isinstance(history, str) and "is not a file" in history
