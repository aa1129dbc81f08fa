"""The coalescing sender (partition_log/coalescing.py): one call per
destination being taken, the callers that come meanwhile go out together;
each caller answered as its own answer comes, one set aside by the
destination holding up neither its batch nor the next."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import pytest

from partition_log.coalescing import CoalescingSender, Deliver

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
        #: With ``fail_with``: the first item is answered before the failure.
        self.answer_first = False
        #: Items answered later (by :meth:`answer_later`), not by the call.
        self.later: set[int] = set()
        self.set_aside: list[tuple[str, int, int, Deliver[str]]] = []

    def __call__(self, destination: str, items: Sequence[int], deliver: Deliver[str]) -> None:
        self.batches.append((destination, list(items)))
        if destination in self.gated:
            self.entered.release()
            assert self.gate.acquire(timeout=TIMEOUT_S), "the test never opened the gate"
        for index, item in enumerate(items):
            if item in self.later:
                self.set_aside.append((destination, index, item, deliver))
            elif self.fail_with is None or (self.answer_first and index == 0):
                deliver(index, f"{destination}:{item}")
        if self.fail_with is not None:
            raise self.fail_with

    def answer_later(self) -> None:
        for destination, index, item, deliver in self.set_aside:
            deliver(index, f"{destination}:{item}")


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


def test_a_call_that_fails_midway_fails_only_the_items_not_answered() -> None:
    send = GatedSend(gated=frozenset({"a"}))
    sender: CoalescingSender[int, str] = CoalescingSender(send)
    first, first_out = in_thread(lambda: sender.call("a", 0))
    assert send.entered.acquire(timeout=TIMEOUT_S)
    waiting = [in_thread(lambda i=i: sender.call("a", i)) for i in (1, 2)]  # type: ignore[misc]
    wait_until(lambda: queued(sender, "a", 2))
    send.gate.release()
    assert send.entered.acquire(timeout=TIMEOUT_S)
    send.fail_with = ConnectionError("cut")  # the first item answered, then the call fails
    send.answer_first = True
    send.gate.release()
    for thread, _ in [(first, first_out), *waiting]:
        thread.join(TIMEOUT_S)
    first_item = send.batches[1][1][0]
    outs = {i: out for i, (_, out) in zip((1, 2), waiting, strict=True)}
    assert outs[first_item] == [f"a:{first_item}"]
    (other,) = {1, 2} - {first_item}
    assert len(outs[other]) == 1 and isinstance(outs[other][0], ConnectionError)


def test_an_item_set_aside_holds_up_neither_its_batch_nor_the_next() -> None:
    """The destination answers item 7 later (parked): the other item of its
    batch is answered, and the next call goes out, meanwhile."""
    send = GatedSend()
    send.later = {7}
    sender: CoalescingSender[int, str] = CoalescingSender(send)
    parked, parked_out = in_thread(lambda: sender.call("a", 7))
    wait_until(lambda: len(send.set_aside) == 1)
    assert sender.call("a", 8) == "a:8"  # a call of its own, while 7 waits
    assert parked_out == [] and parked.is_alive()
    send.answer_later()
    parked.join(TIMEOUT_S)
    assert parked_out == ["a:7"]
    assert send.batches == [("a", [7]), ("a", [8])]


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
