"""The coalescing sender (partition_log/coalescing.py): one call per
destination in flight, the callers that come meanwhile go out together."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import pytest

from partition_log.coalescing import CoalescingSender

TIMEOUT_S = 10.0


class GatedSend:
    """A ``send`` that records its batches and, for the destinations in
    ``gated``, holds each call until the test opens the gate."""

    def __init__(self, gated: frozenset[str] = frozenset()) -> None:
        self.gated = gated
        self.batches: list[tuple[str, list[int]]] = []
        self.entered = threading.Semaphore(0)
        self.gate = threading.Semaphore(0)
        self.fail_with: Exception | None = None
        self.short = False

    def __call__(self, destination: str, items: Sequence[int]) -> Sequence[str]:
        self.batches.append((destination, list(items)))
        if destination in self.gated:
            self.entered.release()
            assert self.gate.acquire(timeout=TIMEOUT_S), "the test never opened the gate"
        if self.fail_with is not None:
            raise self.fail_with
        answers = [f"{destination}:{item}" for item in items]
        return answers[:-1] if self.short else answers


def in_thread(target: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run ``target`` in a thread; its result or exception lands in the list."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(target())
        except Exception as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def queued(sender: CoalescingSender[int, str], destination: str, count: int) -> bool:
    with sender._cond:
        place = sender._destinations.get(destination)
        return place is not None and len(place.queue) == count


def wait_until(condition: Callable[[], bool]) -> None:
    event = threading.Event()
    for _ in range(int(TIMEOUT_S / 0.005)):
        if condition():
            return
        event.wait(0.005)
    raise AssertionError("condition not reached")


def test_a_caller_alone_makes_one_call() -> None:
    send = GatedSend()
    sender: CoalescingSender[int, str] = CoalescingSender(send)
    assert sender.call("a", 1) == "a:1"
    assert sender.call("a", 2) == "a:2"
    assert send.batches == [("a", [1]), ("a", [2])]
    assert sender.calls == 2
    assert not sender._destinations  # nothing is kept for an idle destination


def test_callers_during_a_call_go_out_together_in_the_next_one() -> None:
    send = GatedSend(gated=frozenset({"a"}))
    sender: CoalescingSender[int, str] = CoalescingSender(send)
    first, first_out = in_thread(lambda: sender.call("a", 0))
    assert send.entered.acquire(timeout=TIMEOUT_S)  # call 1 in flight
    waiting = [in_thread(lambda i=i: sender.call("a", i)) for i in range(1, 6)]  # type: ignore[misc]
    wait_until(lambda: queued(sender, "a", 5))
    send.gate.release()  # answer call 1: one waiter sends the other five
    assert send.entered.acquire(timeout=TIMEOUT_S)
    send.gate.release()
    for thread, _ in [(first, first_out), *waiting]:
        thread.join(TIMEOUT_S)
    assert first_out == ["a:0"]
    assert [out for _, out in waiting] == [[f"a:{i}"] for i in range(1, 6)]
    assert send.batches[0] == ("a", [0])
    assert send.batches[1][0] == "a" and sorted(send.batches[1][1]) == [1, 2, 3, 4, 5]
    assert sender.calls == 2


def test_destinations_do_not_wait_for_each_other() -> None:
    send = GatedSend(gated=frozenset({"slow"}))
    sender: CoalescingSender[int, str] = CoalescingSender(send)
    slow, slow_out = in_thread(lambda: sender.call("slow", 1))
    assert send.entered.acquire(timeout=TIMEOUT_S)
    assert sender.call("fast", 2) == "fast:2"  # while "slow" is in flight
    send.gate.release()
    slow.join(TIMEOUT_S)
    assert slow_out == ["slow:1"]


def test_a_failed_call_fails_every_caller_of_its_batch_and_only_them() -> None:
    send = GatedSend(gated=frozenset({"a"}))
    sender: CoalescingSender[int, str] = CoalescingSender(send)
    first, first_out = in_thread(lambda: sender.call("a", 0))
    assert send.entered.acquire(timeout=TIMEOUT_S)
    second, second_out = in_thread(lambda: sender.call("a", 1))
    third, third_out = in_thread(lambda: sender.call("a", 2))
    wait_until(lambda: queued(sender, "a", 2))
    send.fail_with = ConnectionError("down")
    send.gate.release()  # call 1 fails
    first.join(TIMEOUT_S)
    assert len(first_out) == 1 and isinstance(first_out[0], ConnectionError)
    assert send.entered.acquire(timeout=TIMEOUT_S)  # the waiters' batch goes out
    send.fail_with = None
    send.gate.release()
    second.join(TIMEOUT_S)
    third.join(TIMEOUT_S)
    assert (second_out, third_out) == (["a:1"], ["a:2"])


def test_a_wrong_number_of_answers_is_an_error() -> None:
    send = GatedSend()
    send.short = True
    sender: CoalescingSender[int, str] = CoalescingSender(send)
    with pytest.raises(RuntimeError, match="answered 0 of 1"):
        sender.call("a", 1)


def test_batches_hold_at_most_max_batch_items() -> None:
    send = GatedSend(gated=frozenset({"a"}))
    sender: CoalescingSender[int, str] = CoalescingSender(send, max_batch=2)
    first, _ = in_thread(lambda: sender.call("a", 0))
    assert send.entered.acquire(timeout=TIMEOUT_S)
    waiting = [in_thread(lambda i=i: sender.call("a", i)) for i in range(1, 6)]  # type: ignore[misc]
    wait_until(lambda: queued(sender, "a", 5))
    for answered in range(4):  # call 1, then three batches of at most two
        send.gate.release()
        if answered < 3:
            assert send.entered.acquire(timeout=TIMEOUT_S)
    for thread, _out in [(first, None), *waiting]:
        thread.join(TIMEOUT_S)
    assert [out for _, out in waiting] == [[f"a:{i}"] for i in range(1, 6)]
    assert [len(items) for _, items in send.batches] == [1, 2, 2, 1]


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        CoalescingSender(GatedSend(), max_batch=0)
