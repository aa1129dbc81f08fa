"""Failing disks for a local cluster: fsync and fdatasync that return EIO.

``raftcoord cluster up --disk-faults`` (and the chaos workload's ``disk``
fault) builds ``failing_fsync.c`` with the machine's C compiler into the
cluster's directory and preloads it (``LD_PRELOAD``) into every node it
starts. A node's fsync then fails while the file ``<control>/<pid>``
exists: :func:`fail` creates it, :func:`heal` removes it. The nodes stop on
a failed fsync (docs/coordinator.md, "Durability"), so this is how a dying
disk is rehearsed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("failing_fsync.c")
#: The variable the preloaded library reads: the directory of control files.
CONTROL_ENV = "RAFTCOORD_FAIL_FSYNC_DIR"
LIBRARY = "failing_fsync.so"


class DiskFaultsUnavailable(Exception):
    """The library cannot be built here; the message says why."""


def unavailable() -> str | None:
    """Why disk faults cannot be injected on this machine, or None."""
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        return "no C compiler (gcc or cc) to build the failing-fsync library"
    return None


def build(directory: Path) -> Path:
    """Build the library into ``directory`` (with an empty control directory
    beside it); returns ``directory``.

    Raises:
        DiskFaultsUnavailable: no compiler, or the build failed.
    """
    reason = unavailable()
    if reason is not None:
        raise DiskFaultsUnavailable(reason)
    compiler = shutil.which("gcc") or shutil.which("cc")
    assert compiler is not None
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "failing").mkdir(exist_ok=True)
    command = [compiler, "-shared", "-fPIC", "-O2", "-o", str(directory / LIBRARY)]
    try:
        subprocess.run(
            [*command, str(SOURCE), "-ldl"],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise DiskFaultsUnavailable(f"building {SOURCE.name} failed: {detail}") from None
    return directory


def environment(directory: Path) -> dict[str, str]:
    """The variables that preload the library built in ``directory``."""
    return {"LD_PRELOAD": str(directory / LIBRARY), CONTROL_ENV: str(directory / "failing")}


def fail(directory: Path, pid: int) -> None:
    """fsync and fdatasync of process ``pid`` fail with EIO from now on."""
    (directory / "failing" / str(pid)).touch()


def heal(directory: Path, pid: int) -> None:
    (directory / "failing" / str(pid)).unlink(missing_ok=True)
