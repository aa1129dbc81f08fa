"""Python's cyclic garbage collector against a coordinator's long-lived state.

A coordinator process holds a replica of every shard's state machine, a few
objects per open transaction. The collector's full (generation 2) pass walks
every tracked object while holding the GIL, and it runs again each time the
survivors grow by a quarter: with 30K-90K open transactions the coordinators
paused for 120-980 ms every few seconds, longer than the election timeout
(300 ms), and almost every pause over 300 ms cost a shard its leader (the
followers heard no heartbeat and elected another). See docs/performance.md.

The state's objects are immutable and hold no cycles: reference counting
frees them, the collector never has to. :func:`settle`, called from the
shard threads' ticks, runs at most every ``period_s``: a full collection,
which walks only the objects created since the previous call, then
``gc.freeze()``, which moves every survivor to the permanent generation that
later collections skip. The pause is bounded by what a period creates
(tens of milliseconds, at most 84 ms in the runs of docs/performance.md
at 850-1,200 new transactions/s) instead of growing with the state.

The price: a reference cycle whose objects were all alive at a freeze and
later become garbage is never collected. The coordinator's long-lived
objects (state machine values, journal entries, marker-writer entries) are
freed by reference counting; a cycle among them would leak (see "The
garbage collector" in docs/coordinator.md for how that was checked).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

#: Seconds between two settlements of the heap.
SETTLE_PERIOD_S = 2.0

_lock = threading.Lock()
_last = -float("inf")


def settle(period_s: float = SETTLE_PERIOD_S, clock: Callable[[], float] = time.monotonic) -> bool:
    """Collect what was created since the last call and freeze the survivors,
    unless a call did so less than ``period_s`` ago. Returns whether it did."""
    global _last
    now = clock()
    with _lock:
        if now - _last < period_s:
            return False
        _last = now
        gc.collect()
        gc.freeze()
    return True
