"""No process a test session starts outlives it.

Loaded by tests/conftest.py (and with ``-p tests.session_guard`` by the test
that checks it). Two parts:

* SIGTERM ends the session as Ctrl-C would: pytest stops the running test
  and runs every fixture's teardown, so clusters are stopped with
  ``cluster down`` as usual.
* Every node started below the session (by the launcher, the command line
  or a test's own ``Popen``) inherits ``RAFTCOORD_EXIT_WITH_PID`` naming the
  session's process and stops when that process ends, also when it is killed
  with SIGKILL and no teardown runs.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

import pytest

from raftcoord.protocol.process import EXIT_WITH_ENV


def _terminated(signum: int, _frame: FrameType | None) -> None:
    pytest.exit(f"stopped by {signal.Signals(signum).name}", returncode=128 + signum)


def pytest_configure(config: pytest.Config) -> None:
    os.environ[EXIT_WITH_ENV] = str(os.getpid())
    signal.signal(signal.SIGTERM, _terminated)
