"""Calls to one destination that coalesce while one is being taken.

:class:`CoalescingSender` sends requests to destinations through a batch
function. To each destination at most one batch is being taken at a time:
a request made meanwhile waits in that destination's queue, and when the
destination has taken the batch (answered, or set aside to answer later,
each of its requests), one waiting caller sends everything queued so far
in the next batch. One caller alone costs one call; many callers at once
cost about one call per round trip, however many they are (Kafka's
AddPartitionsToTxnManager sends the brokers' verifications so). Each
request is answered on its own, as soon as its answer comes: one that the
destination sets aside holds up neither the others of its batch nor the
next batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")
Answer = TypeVar("Answer")

#: How a batch function hands over the answer of its ``index``-th item: the
#: answer, or the exception that failed that item.
Deliver = Callable[[int, Answer | BaseException], None]


@dataclass
class _Slot(Generic[Item, Answer]):
    item: Item
    sent: bool = False
    answer: Answer | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Destination(Generic[Item, Answer]):
    queue: list[_Slot[Item, Answer]] = field(default_factory=list)
    busy: bool = False


class CoalescingSender(Generic[Item, Answer]):
    """Sends items to destinations, many per call while a call is being taken.

    ``send(destination, items, deliver)`` makes one call and hands each item
    its answer, or the exception that failed it, through ``deliver(index,
    answer)``: once per item, from any thread, before or after it returns,
    each within a bounded time. It returns once the destination may take
    the next call (every item answered, or set aside to be answered later),
    within a bounded time; an exception it raises fails every item not
    answered yet. At most ``max_batch`` items go in one call.
    """

    def __init__(
        self,
        send: Callable[[str, Sequence[Item], Deliver[Answer]], None],
        max_batch: int = 1000,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._send = send
        self._max_batch = max_batch
        self._cond = threading.Condition()
        self._destinations: dict[str, _Destination[Item, Answer]] = {}
        #: Calls made (batches sent), for tests and statistics.
        self.calls = 0

    def call(self, destination: str, item: Item) -> Answer:
        """``item``'s answer from ``destination``; blocks until it is answered.

        Raises:
            Exception: what failed the call that carried ``item``.
        """
        slot: _Slot[Item, Answer] = _Slot(item)
        with self._cond:
            place = self._destinations.setdefault(destination, _Destination())
            place.queue.append(slot)
        while not slot.sent:
            with self._cond:
                while place.busy and not slot.sent:
                    self._cond.wait()
                if slot.sent:  # another caller sent it
                    break
                # Nothing being taken: this caller sends the queue (its own
                # item is in it, or in a later batch it sends next).
                place.busy = True
                batch = place.queue[: self._max_batch]
                del place.queue[: self._max_batch]
                for sent in batch:
                    sent.sent = True
                self.calls += 1
            self._send_batch(destination, place, batch)
        slot.done.wait()
        if slot.error is not None:
            raise slot.error
        return slot.answer  # type: ignore[return-value]  # set with done, error unset

    def _send_batch(
        self,
        destination: str,
        place: _Destination[Item, Answer],
        batch: list[_Slot[Item, Answer]],
    ) -> None:
        lock = threading.Lock()

        def deliver(index: int, answer: Answer | BaseException) -> None:
            slot = batch[index]
            with lock:
                if slot.done.is_set():
                    return
                if isinstance(answer, BaseException):
                    slot.error = answer
                else:
                    slot.answer = answer
                slot.done.set()

        try:
            self._send(destination, [s.item for s in batch], deliver)
        except Exception as exc:  # every item not answered yet gets it
            for index in range(len(batch)):
                deliver(index, exc)
        with self._cond:
            place.busy = False
            if not place.queue and self._destinations.get(destination) is place:
                del self._destinations[destination]
            self._cond.notify_all()
