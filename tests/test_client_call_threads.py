"""CallThreads: a client's parallel unary calls on threads that stay, with
gRPC's own futures when every thread is busy or the client is closed."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from raftcoord.client._net import CallThreads


class Method:
    """A stub method: blocking calls (held while ``hold`` is clear) and futures."""

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.hold.set()
        self.threads: list[str] = []
        self.futures = 0
        self.lock = threading.Lock()

    def __call__(self, request: Any, timeout: float) -> Any:
        with self.lock:
            self.threads.append(threading.current_thread().name)
        assert self.hold.wait(10)
        if request == "fail":
            raise ValueError("the call failed")
        return ("answer", request, timeout)

    def future(self, request: Any, timeout: float) -> str:
        self.futures += 1
        return f"future of {request}"


def test_sequential_calls_reuse_one_thread_and_errors_come_back() -> None:
    calls = CallThreads(4, "io")
    method = Method()
    try:
        answers = [calls.start(method, i, 2.0).result(10) for i in range(5)]
        assert answers == [("answer", i, 2.0) for i in range(5)]
        assert len(set(method.threads)) == 1 and method.threads[0].startswith("io-")
        with pytest.raises(ValueError, match="the call failed"):
            calls.start(method, "fail", 1.0).result(10)
        assert method.futures == 0
    finally:
        calls.close()


def test_calls_beyond_the_busy_threads_go_out_as_futures() -> None:
    calls = CallThreads(2, "io")
    method = Method()
    method.hold.clear()
    try:
        held = [calls.start(method, i, 1.0) for i in range(2)]
        assert calls.start(method, 2, 1.0) == "future of 2"
        method.hold.set()
        assert [f.result(10) for f in held] == [("answer", 0, 1.0), ("answer", 1, 1.0)]
        assert method.futures == 1
    finally:
        calls.close()
    # Closed: every later call is a future, and the threads end.
    assert calls.start(method, 3, 1.0) == "future of 3"
