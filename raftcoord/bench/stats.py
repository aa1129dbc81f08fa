"""The figures every suite computes the same way: percentiles, process CPU
and memory from /proc, the machine a run was on, and the target check."""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

CLK_TCK = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0..100) of ``values``; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def parse_stat_cpu_s(stat: str) -> float:
    """utime + stime in seconds from the text of ``/proc/<pid>/stat`` (the
    command name in parentheses may hold spaces)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    return parse_stat_cpu_s(Path(f"/proc/{pid}/stat").read_text())


def cpu_deltas_s(before: dict[int, float], after: dict[int, float]) -> dict[int, float]:
    """pid -> the CPU seconds that process spent between two readings; a
    process missing from ``after`` (killed) is left out."""
    return {pid: after[pid] - before[pid] for pid in before if pid in after}


def cpu_of(pids: list[int]) -> dict[int, float]:
    """pid -> CPU seconds so far, for the pids still running."""
    found: dict[int, float] = {}
    for pid in pids:
        try:
            found[pid] = cpu_seconds(pid)
        except OSError:
            continue
    return found


def parse_vm_rss_bytes(status: str) -> int:
    """VmRSS in bytes from the text of ``/proc/<pid>/status``."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            value, unit = line.split()[1:3]
            if unit != "kB":
                raise ValueError(f"unexpected VmRSS unit {unit!r}")
            return int(value) * 1024
    raise ValueError("no VmRSS line")


def rss_bytes(pid: int) -> int:
    return parse_vm_rss_bytes(Path(f"/proc/{pid}/status").read_text())


def wide_console() -> Console:
    """A console for the result tables: wide enough for them when the output
    is not a terminal (a file or a pipe), so that their rows stay on one line."""
    console = Console()
    return console if console.is_terminal else Console(width=160)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """What the run ran on: cores, CPU model, load average, versions, and
    the machine-speed probe at the start (:func:`speed_probe_ms`)."""
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "loadavg": list(os.getloadavg()),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
        "probe_ms": round(speed_probe_ms(), 3),
    }


#: The machine-speed probe's loop: a fixed amount of pure CPU work.
PROBE_ITERATIONS = 200_000
#: A step whose probe is further than this from the run's first one ran on a
#: machine of another speed (other load, frequency, steal): its figures are
#: flagged.
PROBE_TOLERANCE = 0.10


def speed_probe_ms() -> float:
    """The best of three timings of a fixed loop, in ms: how fast this
    machine runs Python for this process now."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        total = 0
        for i in range(PROBE_ITERATIONS):
            total += i & 7
        best = min(best, time.perf_counter() - started)
    return best * 1000


def _cpu_line() -> list[int]:
    """The fields of /proc/stat's ``cpu`` line: clock ticks since boot by
    kind (user, nice, system, idle, iowait, irq, softirq, steal, ...)."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return []
    return [int(f) for f in fields[1:]] if fields and fields[0] == "cpu" else []


def steal_ticks() -> int:
    """The CPU time stolen from this machine by its hypervisor, in clock
    ticks since boot (0 when the kernel does not say)."""
    fields = _cpu_line()
    return fields[7] if len(fields) > 7 else 0


def cpu_ticks() -> int:
    """All the machine's CPU time, in clock ticks since boot."""
    return sum(_cpu_line()[:8])


def probe_moved(step_ms: float, reference_ms: float) -> bool:
    """Whether a step's probe is more than :data:`PROBE_TOLERANCE` off the run's."""
    return reference_ms > 0 and abs(step_ms / reference_ms - 1) > PROBE_TOLERANCE


@dataclass(frozen=True)
class Target:
    """One of the targets: a measured ratio or figure against a bound."""

    name: str
    value: float | None  # None: not measured in this run
    bound: float
    at_most: bool  # True: value <= bound meets it; False: value >= bound
    unit: str = ""

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value <= self.bound if self.at_most else self.value >= self.bound

    @property
    def margin(self) -> float | None:
        """How far the value is on the good side of the bound, read the same
        way for both kinds of target: 1.0 on it, above 1 met, below not
        (bound / value for an at-most target, value / bound for an at-least one)."""
        if self.value is None:
            return None
        over, under = (self.bound, self.value) if self.at_most else (self.value, self.bound)
        if under == 0:
            return None if over == 0 else float("inf")
        return over / under

    def as_row(self) -> list[str]:
        """Cells: target, bound, value, margin, met."""
        sign = "≤" if self.at_most else "≥"
        unit = f" {self.unit}" if self.unit else ""
        met = {None: "not measured", True: "met", False: "NOT met"}[self.met]
        return [
            self.name,
            f"{sign} {self.bound:g}{unit}",
            "-" if self.value is None else f"{self.value:.3g}{unit}",
            "-" if self.margin is None else f"{self.margin:.2f}",
            met,
        ]
