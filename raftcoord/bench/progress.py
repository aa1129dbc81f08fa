"""What a benchmark shows while it runs: a progress bar and log lines on stderr.

The log lines are the nodes' (:data:`~raftcoord.protocol.process.LOG_FORMAT`:
time, level, logger, then ``key=value`` pairs), printed through the rich
console that draws the bar so that they scroll above it, and never with a
source location (rich's ``Console.log`` and ``RichHandler`` end each line
with ``file.py:line``). Besides the benchmark's own lines (logger
``raftcoord.bench``, INFO and above), the warnings of any library it runs
in-process (the client's, say) are printed the same way.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from raftcoord.protocol.process import LOG_FORMAT, OneLineFormatter

LOGGER = "raftcoord.bench"


class ConsoleHandler(logging.Handler):
    """Log records as :data:`LOG_FORMAT` lines printed through a rich console
    (as they are: no markup, highlighting or wrapping)."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console
        self.setFormatter(OneLineFormatter(LOG_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            self.console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def bench_logging(console: Console) -> Iterator[logging.Logger]:
    """While in it, log lines go to ``console``: the benchmark's from INFO
    (the logger it yields), every other logger's from WARNING. The loggers'
    handlers and levels are as before afterwards."""
    root = logging.getLogger()
    bench = logging.getLogger(LOGGER)
    levels = root.level, bench.level
    handler = ConsoleHandler(console)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    bench.setLevel(logging.INFO)
    try:
        yield bench
    finally:
        root.removeHandler(handler)
        root.setLevel(levels[0])
        bench.setLevel(levels[1])


class Steps:
    """A run of ``total`` steps: a progress bar (step description, bar, steps
    done, time elapsed) and one log line per step, ``event=step
    step=N/TOTAL what='...'``. Call it with each step's description."""

    def __init__(self, console: Console, total: int) -> None:
        self.total = total
        self.done = -1  # the first call starts step 1, later ones also end the one before
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=console,
        )
        self._task = self._progress.add_task("", total=total)
        self._stack = contextlib.ExitStack()
        self.log = logging.getLogger(LOGGER)

    def __enter__(self) -> Steps:
        self._stack.enter_context(self._progress)
        self.log = self._stack.enter_context(bench_logging(self._progress.console))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def __call__(self, description: str) -> None:
        self.done = min(self.done + 1, self.total)
        self._progress.update(self._task, completed=self.done, description=description)
        self.log.info(
            "event=step step=%d/%d what=%r", min(self.done + 1, self.total), self.total, description
        )

    def finish(self, description: str = "done") -> None:
        """All steps done."""
        self.done = self.total
        self._progress.update(self._task, completed=self.total, description=description)
