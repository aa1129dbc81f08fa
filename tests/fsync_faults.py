"""Failing fsync for real node processes (a pytest fixture).

``tests/faults/failing_fsync.c``, built here with the machine's C compiler,
is preloaded into every process started while the fixture is active (the
launcher's nodes inherit the environment); :meth:`FsyncFaults.fail` makes
fsync and fdatasync of one process fail with EIO until :meth:`heal`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

SOURCE = Path(__file__).parent / "faults" / "failing_fsync.c"
CONTROL_ENV = "RAFTCOORD_FAIL_FSYNC_DIR"


class FsyncFaults:
    def __init__(self, control: Path) -> None:
        self.control = control

    def fail(self, pid: int) -> None:
        """fsync and fdatasync of process ``pid`` fail with EIO from now on."""
        (self.control / str(pid)).touch()

    def heal(self, pid: int) -> None:
        (self.control / str(pid)).unlink(missing_ok=True)


@pytest.fixture
def fsync_faults(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FsyncFaults]:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.fail("a C compiler (gcc) is needed to build the failing-fsync library")
    build = tmp_path_factory.mktemp("fsync-faults")
    library = build / "failing_fsync.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(SOURCE), "-ldl"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    control = build / "failing"
    control.mkdir()
    preload = os.environ.get("LD_PRELOAD", "")
    monkeypatch.setenv("LD_PRELOAD", f"{library} {preload}".strip())
    monkeypatch.setenv(CONTROL_ENV, str(control))
    yield FsyncFaults(control)
