"""Faults injected into a local cluster's node processes: a disk whose
fsync fails, a wall clock that steps.

``raftcoord cluster up --faults`` (and the chaos workload's ``disk``
fault) builds ``node_faults.c`` with the machine's C compiler into the
cluster's directory and preloads it (``LD_PRELOAD``) into every node it
starts. Then, for a node's process ``pid``:

* fsync and fdatasync fail with EIO while the file ``<control>/fsync-<pid>``
  exists (:func:`fail_disk`, :func:`heal_disk`). The nodes stop on a failed
  fsync (docs/coordinator.md, "Durability"): this is how a dying disk is
  rehearsed.
* the wall clock (``CLOCK_REALTIME``: Python's :func:`time.time`) reads
  ``<control>/clock-<pid>`` milliseconds ahead, or behind if negative
  (:func:`shift_clock`); the monotonic clock is never shifted. This is how
  an operator's ``date -s`` or an NTP step is rehearsed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("node_faults.c")
#: The variable the preloaded library reads: the directory of control files.
CONTROL_ENV = "RAFTCOORD_FAULTS_DIR"
LIBRARY = "node_faults.so"


class FaultsUnavailable(Exception):
    """The library cannot be built here; the message says why."""


def unavailable() -> str | None:
    """Why faults cannot be injected on this machine, or None."""
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        return "no C compiler (gcc or cc) to build the node-faults library"
    return None


def build(directory: Path) -> Path:
    """Build the library into ``directory`` (with an empty control directory
    beside it); returns ``directory``.

    Raises:
        FaultsUnavailable: no compiler, or the build failed.
    """
    reason = unavailable()
    if reason is not None:
        raise FaultsUnavailable(reason)
    compiler = shutil.which("gcc") or shutil.which("cc")
    assert compiler is not None
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "control").mkdir(exist_ok=True)
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
        raise FaultsUnavailable(f"building {SOURCE.name} failed: {detail}") from None
    return directory


def environment(directory: Path) -> dict[str, str]:
    """The variables that preload the library built in ``directory``."""
    return {"LD_PRELOAD": str(directory / LIBRARY), CONTROL_ENV: str(directory / "control")}


def fail_disk(directory: Path, pid: int) -> None:
    """fsync and fdatasync of process ``pid`` fail with EIO from now on."""
    (directory / "control" / f"fsync-{pid}").touch()


def heal_disk(directory: Path, pid: int) -> None:
    (directory / "control" / f"fsync-{pid}").unlink(missing_ok=True)


def shift_clock(directory: Path, pid: int, shift_ms: int) -> None:
    """The wall clock of process ``pid`` reads ``shift_ms`` ahead (behind if
    negative) from now on, within 20 ms; 0 undoes it."""
    control = directory / "control" / f"clock-{pid}"
    if shift_ms == 0:
        control.unlink(missing_ok=True)
        return
    staged = control.with_suffix(".new")
    staged.write_text(f"{shift_ms}\n")
    os.replace(staged, control)  # the library never reads half a number
