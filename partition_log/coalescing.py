"""Calls to one destination that coalesce while one is in flight.

:class:`CoalescingSender` sends requests to destinations through a batch
function. To each destination at most one batch is in flight: a request
made meanwhile waits in that destination's queue, and when the batch in
flight is answered, one waiting caller sends everything queued so far in
the next batch. One caller alone costs one call; many callers at once cost
about one call per round trip, however many they are (Kafka's
AddPartitionsToTxnManager sends the brokers' verifications so).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")
Answer = TypeVar("Answer")


@dataclass
class _Slot(Generic[Item, Answer]):
    item: Item
    done: bool = False
    answer: Answer | None = None
    error: BaseException | None = None


@dataclass
class _Destination(Generic[Item, Answer]):
    queue: list[_Slot[Item, Answer]] = field(default_factory=list)
    busy: bool = False


class CoalescingSender(Generic[Item, Answer]):
    """Sends items to destinations, many per call while a call is in flight.

    ``send(destination, items)`` makes one call and returns one answer per
    item, in order; it must return (or raise) within a bounded time. An
    exception it raises, or a wrong number of answers, is raised to every
    caller of that batch. At most ``max_batch`` items go in one call.
    """

    def __init__(
        self, send: Callable[[str, Sequence[Item]], Sequence[Answer]], max_batch: int = 1000
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
            Exception: what ``send`` raised for the batch that carried ``item``.
        """
        slot: _Slot[Item, Answer] = _Slot(item)
        with self._cond:
            place = self._destinations.setdefault(destination, _Destination())
            place.queue.append(slot)
        while True:
            with self._cond:
                while not slot.done and place.busy:
                    self._cond.wait()
                if slot.done:
                    break
                # Nothing in flight: this caller sends the queue (its own item
                # is in it, or in a later batch it sends next).
                place.busy = True
                batch = place.queue[: self._max_batch]
                del place.queue[: self._max_batch]
                self.calls += 1
            self._send_batch(destination, place, batch)
        if slot.error is not None:
            raise slot.error
        return slot.answer  # type: ignore[return-value]  # set with done, error unset

    def _send_batch(
        self,
        destination: str,
        place: _Destination[Item, Answer],
        batch: list[_Slot[Item, Answer]],
    ) -> None:
        answers: Sequence[Answer] = ()
        error: BaseException | None = None
        try:
            answers = self._send(destination, [s.item for s in batch])
            if len(answers) != len(batch):
                error = RuntimeError(
                    f"{destination} answered {len(answers)} of {len(batch)} requests"
                )
        except Exception as exc:  # every caller of the batch gets it
            error = exc
        with self._cond:
            for i, slot in enumerate(batch):
                if error is None:
                    slot.answer = answers[i]
                else:
                    slot.error = error
                slot.done = True
            place.busy = False
            if not place.queue:
                del self._destinations[destination]
            self._cond.notify_all()
