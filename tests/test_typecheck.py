"""Every package (the generated protocol code aside), the tests' history
checker and the simulation type-check under ``mypy --strict`` (the Makefile's
TYPED list); everything lints clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def typed_paths() -> list[str]:
    """The Makefile's TYPED list: what ``make lint`` type-checks."""
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith("TYPED = "):
            return line.removeprefix("TYPED = ").split()
    raise AssertionError("the Makefile has no TYPED line")


def test_mypy_strict_on_every_package() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", *typed_paths()],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_clean() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
