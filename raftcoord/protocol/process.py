"""Running a node process: log format, signal handling, pid file."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Protocol


class Node(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


def serve(node: Node, node_id: int, data_dir: Path, log: logging.Logger) -> int:
    """Start ``node``, write ``data_dir/pid``, run until SIGTERM/SIGINT, stop it.

    Returns the exit status.
    """
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("node=%d event=signal signal=%s", node_id, signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    node.start()
    (data_dir / "pid").write_text(str(os.getpid()))
    stop.wait()
    node.stop()
    return 0
