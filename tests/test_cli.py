"""The ``raftcoord`` command line: honest about what is not built yet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftcoord.cli", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_demo_says_the_main_job_is_not_available_and_fails() -> None:
    result = _cli("demo")
    assert result.returncode != 0, "demo must not pretend to have run"
    stderr = result.stderr.lower()
    assert "not available yet" in stderr
    assert "main job" in stderr
    assert "traceback" not in stderr  # a deliberate refusal, not a crash
    assert result.stdout == ""  # nothing that could be mistaken for a run's output


def test_help_exits_zero_and_lists_demo() -> None:
    result = _cli("--help")
    assert result.returncode == 0, result.stderr
    assert "usage: raftcoord" in result.stdout
    assert "demo" in result.stdout


def test_no_command_is_a_usage_error() -> None:
    result = _cli()
    assert result.returncode == 2
    assert "usage: raftcoord" in result.stderr
