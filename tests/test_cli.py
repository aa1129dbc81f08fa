"""The ``raftcoord`` command line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftcoord.cli", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.slow
def test_demo_runs_the_workload_with_faults_audits_it_and_passes(tmp_path: Path) -> None:
    result = _cli(
        "demo",
        "--duration",
        "15",
        "--input-records",
        "300",
        "--seed",
        "7",
        "--nemesis",
        "leader-kill,pause,plog-restart",
        "--cluster-dir",
        str(tmp_path / "demo"),
        timeout=420,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    faults = result.stdout.split("faults", 1)[1]  # the faults table, then the audit
    assert "kill -9" in faults or "SIGSTOP" in faults, result.stdout[-4000:]
    asked = result.stdout.split("faults asked for", 1)[1].split("raftcoord audit", 1)[0]
    for kind in ("leader-kill", "pause", "plog-restart"):
        row = next(line for line in asked.splitlines() if kind in line)
        happened = int(row.split("│")[2])
        assert happened >= 1, asked
    assert re.search(r"audit: +\d+ s", result.stdout)
    assert "VERDICT: PASS" in result.stdout
    assert (tmp_path / "demo" / "audit" / "audit.html").is_file()
    assert "Traceback" not in result.stderr


def test_help_exits_zero_and_lists_demo() -> None:
    result = _cli("--help")
    assert result.returncode == 0, result.stderr
    assert "usage: raftcoord" in result.stdout
    assert "demo" in result.stdout


def test_no_command_is_a_usage_error() -> None:
    result = _cli()
    assert result.returncode == 64  # EX_USAGE: 2 is INCOMPLETE
    assert "usage: raftcoord" in result.stderr


def test_workload_without_a_cluster_says_so(tmp_path: Path) -> None:
    result = _cli("workload", "--cluster-dir", str(tmp_path), "--seed", "3")
    assert result.returncode == 1
    assert "no cluster in" in result.stdout
    assert "Traceback" not in result.stderr


def test_workload_refuses_an_unknown_fault() -> None:
    result = _cli("workload", "--nemesis", "leader-kill,meteor")
    assert result.returncode == 64
    assert "unknown fault(s) ['meteor']" in result.stderr


def test_workload_and_chaos_are_listed() -> None:
    result = _cli("--help")
    assert "workload" in result.stdout
    assert "chaos" in result.stdout


def test_workload_refuses_bad_options_before_touching_a_cluster(tmp_path: Path) -> None:
    result = _cli("workload", "--cluster-dir", str(tmp_path), "--duration", "0")
    assert result.returncode == 64
    assert "--duration: 0 must be a positive number of seconds" in result.stderr
    assert not list(tmp_path.iterdir())


def test_help_texts_are_plain_text() -> None:
    """No reStructuredText or Markdown markup leaks into --help."""
    for args in (
        ("--help",),
        ("demo", "--help"),
        ("cluster", "--help"),
        ("cluster", "up", "--help"),
        ("cluster", "partition", "--help"),
    ):
        result = _cli(*args)
        assert result.returncode == 0, result.stderr
        assert "``" not in result.stdout and "`" not in result.stdout, (args, result.stdout)


def test_demo_help_says_what_the_demo_does() -> None:
    text = " ".join(_cli("demo", "--help").stdout.split())
    assert "3 coordinators x 3 shards, 3 partition-log nodes" in text
    assert "without the partition fault" in text  # where namespaces are not available
    assert "Spark exactly-once audit" in text and "PASS (exit 0)" in text
    assert "INCOMPLETE (2: a check did not run or had nothing to judge, or a fault" in text
    assert "asked for never changed anything" in text and "64 on a command line" in text
    assert "(default: 60.0)" in text and "(default: 2000)" in text
    assert "(default: all)" in text  # --nemesis


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        (["demo", "--duration", "-5"], "--duration: -5 must be a positive number of seconds"),
        (["chaos", "--duration", "-5"], "--duration: -5 must be a positive number of seconds"),
        (["workload", "--duration", "0"], "--duration: 0 must be a positive number of seconds"),
        (["workload", "--duration", "nan"], "--duration: nan must be a positive number"),
        (["workload", "--transactions", "-1"], "--transactions: -1 must be a positive integer"),
    ],
)
def test_nonsense_lengths_are_refused_before_anything_starts(
    args: list[str], refusal: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from raftcoord.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 64
    assert refusal in capsys.readouterr().err


def test_the_readme_hanging_recipe_runs_on_a_cluster_of_its_own() -> None:
    """Beside the cluster of the README's sections before it: every command
    of the recipe names its own cluster directory."""
    readme = (REPO_ROOT / "README.md").read_text()
    start = readme.index("A hanging transaction made on purpose")
    recipe = readme[start : readme.index("\n## ", start)]
    commands = [line for line in recipe.splitlines() if line.startswith(".venv/bin/raftcoord")]
    assert len(commands) >= 6
    assert all("--cluster-dir .hanging" in line for line in commands), commands
    assert 'LocalCluster(".hanging")' in recipe and ".raftcoord" not in recipe


def test_a_refused_cluster_up_does_not_say_it_is_starting(tmp_path: Path) -> None:
    result = _cli(
        "cluster", "up", "--cluster-dir", str(tmp_path / "c"), "--kafka-listeners", "1",
        "--kafka-security", "SSL",
    )  # fmt: skip
    assert result.returncode == 1
    assert "--kafka-security SSL needs --tls" in result.stderr
    assert "starting" not in result.stdout


@pytest.mark.parametrize(
    ("args", "usage"),
    [
        (["cluster", "up", "--coordinaters", "3"], "raftcoord cluster up"),
        (["txn", "list", "--nope"], "raftcoord txn list"),
        (["acl", "add", "--principle", "User:x"], "raftcoord acl add"),
    ],
)
def test_a_flag_typo_is_told_with_the_subcommands_usage(
    args: list[str], usage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from raftcoord.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 64
    err = capsys.readouterr().err
    assert f"usage: {usage}" in err and f"{usage}: error: unrecognized arguments" in err


def test_cluster_help_loads_neither_spark_nor_the_kafka_codec() -> None:
    """Each command imports only what it uses: `raftcoord cluster --help`
    builds no other command's parser."""
    probe = (
        "import sys\n"
        "from raftcoord.cli.main import main\n"
        "try:\n"
        "    main(['cluster', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ('pyspark', 'kio', 'raftcoord.kafka', 'raftcoord.chaos.workload', 'spark')\n"
        "print(sorted(m for m in sys.modules\n"
        "             if any(m == h or m.startswith(h + '.') for h in heavy)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
