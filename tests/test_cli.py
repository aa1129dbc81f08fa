"""The ``raftcoord`` command line."""

from __future__ import annotations

import ast
import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
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


def test_no_commands_help_loads_grpc_or_cryptography() -> None:
    """`raftcoord workload --help`, `raftcoord bench coordinator --help` and
    every other command's and subcommand's help answer without loading gRPC
    and cryptography (a third of a second of CPU): their modules import the
    client, the launcher and what the benchmarks run where they use them.
    The commands are found by walking the parsers, so that a new one is
    checked too."""
    probe = (
        "import argparse, sys\n"
        "from raftcoord.cli.main import main\n"
        "shown = []\n"
        "print_help = argparse.ArgumentParser.print_help\n"
        "def record(self, file=None):\n"
        "    shown.append(self)\n"
        "    print_help(self, file)\n"
        "argparse.ArgumentParser.print_help = record\n"
        "todo, done = [[]], []\n"
        "while todo:\n"
        "    command = todo.pop()\n"
        "    try:\n"
        "        main([*command, '--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "    done.append(' '.join(command))\n"
        "    for action in shown[-1]._actions:\n"
        "        if isinstance(action, argparse._SubParsersAction):\n"
        "            todo.extend([*command, name] for name in action.choices)\n"
        "heavy = ('grpc', 'cryptography')\n"
        "print(done)\n"
        "print(sorted(m for m in sys.modules\n"
        "             if any(m == h or m.startswith(h + '.') for h in heavy)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "[]"
    checked = set(ast.literal_eval(lines[-2]))
    assert {"workload", "chaos", "bench", "bench coordinator", "audit", "demo"} <= checked
    assert {"txn describe", "certs client", "kafka-gateway", "console", "cluster up"} <= checked
    assert sum(line.startswith("usage: raftcoord") for line in lines) == len(checked)


def test_an_empty_bootstrap_server_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from raftcoord.cli.main import main

    for given in ("", " , "):
        with pytest.raises(SystemExit) as exited:
            main(["txn", "list", "--bootstrap-server", given])
        assert exited.value.code == 64
        assert "--bootstrap-server: " in capsys.readouterr().err


def test_a_table_into_a_file_keeps_each_row_on_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from raftcoord.cli.connection import print_record, print_table

    columns = [(f"Column{i}", f"c{i}") for i in range(12)]
    row = {f"c{i}": f"value-{i}-" + "x" * 20 for i in range(12)}
    print_table([row], columns)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5  # top, header, rule, the row, bottom
    assert all(f"value-{i}-" + "x" * 20 in lines[3] for i in range(12))
    print_record(row, columns)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Column0:  value-0-" + "x" * 20 and lines[11].startswith("Column11: ")


def test_the_workload_demo_and_audit_tables_into_a_file_keep_each_row_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tables of `raftcoord workload`, `chaos`, `demo` and `audit` are
    printed as the admin commands' are (raftcoord.chaos.tables): into a
    file or a pipe each row is one line, however long; on a terminal they
    fit its width."""
    from io import StringIO

    from rich.console import Console

    from raftcoord.chaos.commands import fault_report_table, summary_table
    from raftcoord.chaos.tables import print_unwrapped
    from raftcoord.cli.demo import _faults_table
    from spark.checks import CheckResult
    from spark.report import print_table as print_audit_table

    long = "y" * 150
    summary = {
        "seed": 7,
        "elapsed_s": 60,
        "ops": {"txn": {"invoke": 10, "ok": 8, "fail": 1, "info": 1}},
        "crashed": [f"producer-1: {long}"],
        "unfinished": [],
    }
    report = [{"fault": "kill", "happened": 2, "changed": 0, "not_run": f"because {long}"}]
    history = tmp_path / "history.jsonl"
    fault = {"op": "fault", "phase": "start", "fault": "partition", "targets": [1, 2]}
    history.write_text(json.dumps({**fault, "detail": f"cut {long}"}) + "\n")
    for table in (summary_table(summary), fault_report_table(report), _faults_table(history)):
        print_unwrapped(Console(), table)
        [row] = [line for line in capsys.readouterr().out.splitlines() if long in line]
        assert row.count("│") >= 3  # the whole row: its cells and borders on one line
    print_audit_table([CheckResult("no-duplicates", 1, [{"value": long}])], Console())
    lines = capsys.readouterr().out.splitlines()
    [row] = [line for line in lines if "no-duplicates" in line]
    assert long in row and "FAIL" in row
    terminal = StringIO()
    on_terminal = Console(file=terminal, force_terminal=True, color_system=None, width=80)
    print_unwrapped(on_terminal, summary_table(summary))
    assert max(len(line) for line in terminal.getvalue().splitlines()) <= 80


#: A line of gRPC's C core log (severity, date, time, thread, file).
GRPC_LOG = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\]")


class Terminal:
    """``raftcoord ARGS`` on a pseudo-terminal of its own, as a user runs it:
    its session's controlling terminal, so that a Ctrl-C typed on it
    (:meth:`interrupt`) is the SIGINT the terminal sends."""

    def __init__(self, *args: str) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 250, 0, 0))

        def take_the_terminal() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.process = subprocess.Popen(
            [sys.executable, "-m", "raftcoord.cli", *args],
            cwd=REPO_ROOT,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            preexec_fn=take_the_terminal,
            env={**os.environ, "TERM": "dumb", "COLUMNS": "250"},
        )
        os.close(slave)
        self.output = ""

    def wait_for(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.output:
            left = deadline - time.monotonic()
            assert left > 0, f"no {text!r} within {timeout_s} s:\n{self.output[-3000:]}"
            if not self._read(min(left, 1.0)) and self.process.poll() is not None:
                raise AssertionError(f"exited before {text!r}:\n{self.output[-3000:]}")

    def interrupt(self) -> None:
        os.write(self.master, b"\x03")

    def exit_status(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None:
            assert time.monotonic() < deadline, f"still running:\n{self.output[-3000:]}"
            self._read(0.5)
        while self._read(0.1):
            pass
        return self.process.returncode

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
        os.close(self.master)

    def _read(self, timeout_s: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout_s)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the other side is closed
            return False
        self.output += data.decode(errors="replace")
        return bool(data)


def _cluster_stopped(cluster_dir: Path) -> bool:
    state = json.loads((cluster_dir / "cluster.json").read_text())
    return not any(Path(f"/proc/{n['pid']}").exists() for n in state["nodes"] if n["pid"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_interrupted_heals_drains_and_skips_the_audit(tmp_path: Path) -> None:
    """Ctrl-C during the traffic: the run heals and drains, the cluster
    stops, the Spark audit does not start, and the demo says where the run
    is and how to audit it (exit status 130)."""
    cluster_dir = tmp_path / "demo"
    terminal = Terminal(
        "demo", "--duration", "120", "--seed", "5", "--nemesis", "leader-kill",
        "--input-records", "100", "--cluster-dir", str(cluster_dir),
    )  # fmt: skip
    try:
        terminal.wait_for("2. the workload", 300)
        terminal.wait_for("nemesis: leader-kill", 120)  # the traffic is going
        terminal.interrupt()
        assert terminal.exit_status(400) == 128 + signal.SIGINT
    finally:
        terminal.close()
    out = terminal.output
    assert "interrupted: healing and draining" in out
    assert "the audit is skipped" in out
    assert " ".join(out.split()).count(f"raftcoord audit --cluster-dir {cluster_dir}") == 1
    assert "3. the Spark audit" not in out and "Traceback" not in out
    events = [json.loads(line) for line in (cluster_dir / "history.jsonl").read_text().splitlines()]
    assert [e["op"] for e in events if e["process"] == "workload"][-2:] == ["final", "run"]
    assert _cluster_stopped(cluster_dir)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_interrupted_twice_stops_at_once_with_one_line(tmp_path: Path) -> None:
    cluster_dir = tmp_path / "demo"
    terminal = Terminal(
        "demo", "--duration", "120", "--seed", "6", "--nemesis", "leader-kill",
        "--input-records", "100", "--cluster-dir", str(cluster_dir),
    )  # fmt: skip
    try:
        terminal.wait_for("2. the workload", 300)
        terminal.wait_for("nemesis: leader-kill", 120)
        terminal.interrupt()
        terminal.wait_for("interrupt again to stop at once", 60)
        terminal.interrupt()
        assert terminal.exit_status(300) == 128 + signal.SIGINT
    finally:
        terminal.close()
    # what the demo said after its last word on the first interrupt (a live
    # display may draw a line again)
    after = terminal.output.rsplit("interrupt again to stop at once", 1)[1]
    # gRPC's own log lines (its channels to the stopped nodes) are not the demo's
    lines = [line.removeprefix("^C") for line in after.splitlines()[1:]]  # the echoed Ctrl-C
    said = [line for line in lines if line.strip() and not GRPC_LOG.match(line)]
    assert said == [f"interrupted: stopped at once; the cluster's files are in {cluster_dir}"]
    assert "Traceback" not in terminal.output and "3. the Spark audit" not in terminal.output
    assert _cluster_stopped(cluster_dir)
