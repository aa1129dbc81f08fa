"""The audit's progress line: the stages Spark runs, from its status tracker."""

from __future__ import annotations

import io
import re
import time
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from spark.progress import describe, spark_progress


class Tracker:
    def __init__(self, stages: dict[int, tuple[str, int, int]]) -> None:
        self.stages = stages

    def getActiveStageIds(self) -> list[int]:
        return list(self.stages)

    def getStageInfo(self, stage: int) -> Any:
        if stage not in self.stages:
            return None  # finished between the two calls
        name, done, total = self.stages[stage]
        return SimpleNamespace(stageId=stage, name=name, numCompletedTasks=done, numTasks=total)


def test_the_line_names_the_first_running_stage_and_counts_every_task() -> None:
    assert describe(Tracker({})) is None
    line = describe(Tracker({7: ("collect at checks.py:341", 3, 8), 5: ("showString at x", 1, 2)}))
    assert line == ("stage 5 (showString) and 1 more", 4, 10)


@pytest.mark.slow
def test_a_spark_job_shows_its_stage_on_a_terminal(spark: Any) -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with spark_progress(spark, console, "checks"):
        # Tasks that last longer than a poll of the tracker.
        spark.sparkContext.parallelize(range(2), 2).map(lambda x: time.sleep(1.5) or x).collect()
    assert re.search(r"checks: stage \d+ \(", out.getvalue()), out.getvalue()[-500:]
