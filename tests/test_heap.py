"""raftcoord.coordinator.heap: the long-lived state leaves the collector's view."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator

import pytest

from raftcoord.coordinator import heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_settle_collects_the_young_and_freezes_the_survivors(unfrozen: None) -> None:
    start = time.monotonic() + 10 * heap.SETTLE_PERIOD_S  # past any earlier call
    survivor = [object() for _ in range(1000)]
    garbage = Cycle()
    gone = weakref.ref(garbage)
    del garbage
    assert heap.settle(clock=lambda: start)
    assert gc.get_freeze_count() >= len(survivor)
    assert gone() is None  # collected, not frozen
    assert not heap.settle(clock=lambda: start + heap.SETTLE_PERIOD_S / 2)
    assert heap.settle(clock=lambda: start + heap.SETTLE_PERIOD_S)
