"""Running a node process: log format, signal handling, pid file, the end
of a node whose starter asked it to die with a process of its own, and the
end of a node whose storage cannot be trusted."""

from __future__ import annotations

import faulthandler
import logging
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn, Protocol

from raftcoord.protocol.config import ClusterConfig

#: Exit status of a node whose data on disk is damaged (a checksum does not
#: match where a crash cannot explain it): restarting cannot help, an
#: operator repairs it (docs/coordinator.md, "Durability").
EXIT_DATA_DAMAGED = 65  # EX_DATAERR
#: Exit status of a node whose storage failed under it (an fsync error): what
#: it was writing may not be on disk, so it stops instead of acknowledging or
#: retrying; restarted, it recovers from what the disk holds.
EXIT_STORAGE_FAILED = 74  # EX_IOERR


def fail_stop(log: logging.Logger, status: int, event: str, message: str) -> NoReturn:
    """Log ``message`` as CRITICAL ``event`` and end the process at once with
    ``status`` (no cleanup that could write or acknowledge anything more)."""
    log.critical("event=%s exit_status=%d: %s", event, status, message)
    logging.shutdown()
    os._exit(status)


#: A node started with this variable set to a process id stops, as on
#: SIGTERM, when that process ends: a test session sets it to its own pid, so
#: that no node it started (directly, through the launcher or through the
#: command line) outlives it, however it ends.
EXIT_WITH_ENV = "RAFTCOORD_EXIT_WITH_PID"
#: How long a node told to stop that way may take before it is killed.
EXIT_WITH_GRACE_S = 10.0


#: How long a node may take to stop (and its process to end) before it
#: writes every thread's stack to its standard error, the node's log.
STOP_REPORT_S = 5.0


class Node(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


#: The one format of every node's log lines.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

#: Characters a log message may not carry as they are: line breaks and the
#: other control characters would let a client-supplied string (a
#: transactional id, a topic name) start a forged line of its own.
_UNPRINTABLE = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))} | {
    0x2028: "\\u2028",
    0x2029: "\\u2029",
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}


class LogLimiter:
    """Lets a log line through at most ``rate`` times a second (bursts of
    ``rate``); counts what it held back."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.allowance = rate
        self.last = time.monotonic()
        self.suppressed = 0

    def allow(self) -> bool:
        now = time.monotonic()
        self.allowance = min(self.rate, self.allowance + (now - self.last) * self.rate)
        self.last = now
        if self.allowance >= 1.0:
            self.allowance -= 1.0
            return True
        self.suppressed += 1
        return False

    def log(self, logger: logging.Logger, level: int, fmt: str, *args: Any) -> None:
        """Log the line if :meth:`allow` lets it through, with the count of
        lines held back since the last one (``suppressed=N``) when there were."""
        if not self.allow():
            return
        if self.suppressed:
            fmt, args = fmt + " suppressed=%d", (*args, self.suppressed)
            self.suppressed = 0
        logger.log(level, fmt, *args)


class OneLineFormatter(logging.Formatter):
    """Formats a record's message on one line whatever it holds: control
    characters are escaped (``\\n``, ``\\x1b``); a traceback (``exc_info``)
    still follows on lines of its own."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = record.message.translate(_UNPRINTABLE)
        return super().formatMessage(record)


def configure_logging() -> None:
    """Every node's logging: INFO and above, :data:`LOG_FORMAT`, one line per message."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(LOG_FORMAT))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def apply_scheduling(policy: str, log: logging.Logger, node_id: int) -> None:
    """Put every thread of this process under ``policy`` (``node.scheduling``):
    "batch" is SCHED_BATCH, "normal" leaves them as they are (SCHED_OTHER).
    Threads started later inherit it from the thread that starts them. Where
    the policy cannot be set (not Linux, refused), the node runs as it is and
    says so once."""
    if policy != "batch":
        return
    if not hasattr(os, "SCHED_BATCH"):
        log.warning("node=%d event=scheduling_unavailable policy=%s", node_id, policy)
        return
    param = os.sched_param(0)
    done: set[str] = set()
    # Again until no new thread shows up: one started meanwhile by a thread
    # not yet switched inherits the old policy.
    while todo := set(os.listdir("/proc/self/task")) - done:
        for task in todo:
            done.add(task)
            try:
                os.sched_setscheduler(int(task), os.SCHED_BATCH, param)
            except ProcessLookupError:
                continue  # the thread ended meanwhile
            except OSError as exc:
                log.warning(
                    "node=%d event=scheduling_unavailable policy=%s: %s", node_id, policy, exc
                )
                return


def private_files() -> None:
    """The files and directories this process makes are its user's alone
    (0600, 0700): a node's data (transactional ids, records, keys) is not for
    the host's other users. Called first thing by a node's command."""
    os.umask(0o077)


def warn_if_plaintext(config: ClusterConfig, log: logging.Logger, node_id: int) -> None:
    """One WARNING at start when the cluster runs without ``[tls]``."""
    if config.tls is None:
        log.warning(
            "node=%d event=plaintext: the config has no [tls]: every port is plaintext and "
            "every caller may do what a node does (a lab only; docs/security.md)",
            node_id,
        )


def serve(
    node: Node, config: ClusterConfig, node_id: int, data_dir: Path, log: logging.Logger
) -> int:
    """Start ``node`` with its threads under the config's scheduling policy
    (:func:`apply_scheduling`), its data directory its user's alone
    (:func:`private_files`; one made by an older version too), write
    ``data_dir/pid``, run until SIGTERM/SIGINT, stop it.

    Returns the exit status.
    """
    configure_logging()
    warn_if_plaintext(config, log, node_id)
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    data_dir.chmod(0o700)
    apply_scheduling(config.settings.node_scheduling, log, node_id)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("node=%d event=signal signal=%s", node_id, signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    node.start()
    (data_dir / "pid").write_text(str(os.getpid()))
    stop.wait()
    # A stop that hangs leaves its cause: every thread's stack, in the log.
    faulthandler.dump_traceback_later(STOP_REPORT_S, file=sys.stderr)
    node.stop()
    return 0


def exit_with_watched_process() -> None:
    """When :data:`EXIT_WITH_ENV` names a process, send this process SIGTERM
    (a node's own stop) as soon as that process ends, and SIGKILL if it is
    still running :data:`EXIT_WITH_GRACE_S` later. Nothing when it is unset.

    The process is held by a pidfd, so a pid reused after its end is never
    mistaken for it; a process already gone when this runs stops the node at
    once.
    """
    value = os.environ.get(EXIT_WITH_ENV, "")
    if not value:
        return
    try:
        pid = int(value)
        if pid <= 0:
            raise ValueError(value)
    except ValueError:
        raise SystemExit(f"{EXIT_WITH_ENV}={value!r} is not a process id") from None
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        pidfd = None

    def watch() -> None:
        if pidfd is not None:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)  # readable once the process ended
            while not poller.poll():
                pass
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(EXIT_WITH_GRACE_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="exit-with", daemon=True).start()
