"""What the audit is doing while Spark works: the stages of its jobs, read
from Spark's status tracker, on a progress line (the audit's minutes are
otherwise silent)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

#: How often the status tracker is read (seconds).
POLL_S = 0.5


def describe(tracker: Any) -> tuple[str, int, int] | None:
    """The line for the stages running now, from a SparkStatusTracker: what
    they are (the first stage's name, shortened, and how many run), and
    their tasks completed and in all; None when no stage runs."""
    infos = [tracker.getStageInfo(i) for i in sorted(tracker.getActiveStageIds())]
    infos = [info for info in infos if info is not None]
    if not infos:
        return None
    name = infos[0].name.split(" at ")[0][:40]
    more = f" and {len(infos) - 1} more" if len(infos) > 1 else ""
    done = sum(info.numCompletedTasks for info in infos)
    total = sum(info.numTasks for info in infos)
    return f"stage {infos[0].stageId} ({name}){more}", done, total


@contextmanager
def spark_progress(spark: Any, console: Console, what: str) -> Iterator[None]:
    """Show the running stages of ``spark``'s jobs under ``what`` until the
    block ends (nothing is drawn on a console that is not a terminal)."""
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tasks"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(what, total=None)

        def follow() -> None:
            while not stop.wait(POLL_S):
                try:
                    line = describe(tracker)
                except Exception:  # the session is stopping: nothing more to show
                    return
                if line is None:
                    progress.update(task, description=f"{what}: between stages")
                else:
                    text, done, total = line
                    progress.update(
                        task, description=f"{what}: {text}", completed=done, total=total
                    )

        thread = threading.Thread(target=follow, name="audit-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(5)
