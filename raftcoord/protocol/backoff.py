"""Exponential backoff between retries, for every component that retries:
the client's calls, the coordinator's marker deliveries.

The delays are pure (a function of the failure count, plus jitter drawn from
an injected random source); the only sleep is :meth:`Backoff.sleep`, which
never sleeps past a deadline.
"""

from __future__ import annotations

import random
import time
from typing import Protocol

#: Past this many doublings every delay is the maximum anyway.
_MAX_DOUBLINGS = 60


class SupportsRemaining(Protocol):
    """A deadline: how many seconds are left before it passes."""

    def remaining(self) -> float: ...


class Backoff:
    """Delay before the n-th retry: ``initial_s * multiplier**(n-1)``, at most
    ``max_s``, then up to ``jitter`` (a fraction) shorter so that retrying
    clients spread out.

    Used two ways: :meth:`delay` for a failure count kept by the caller
    (stateless), or :meth:`next_delay` / :meth:`reset` / :meth:`sleep`, which
    count the failures here (one instance per retry loop; not thread-safe).

    Args:
        initial_s: the first delay (>= 0).
        max_s: the longest delay (>= ``initial_s``).
        multiplier: growth per failure (>= 1).
        jitter: fraction in [0, 1) by which a delay may be shortened; 0 makes
            every delay the nominal one.
        rng: where the jitter comes from (a seeded ``random.Random`` in tests).

    Raises:
        ValueError: a parameter is out of range.
    """

    def __init__(
        self,
        initial_s: float = 0.05,
        max_s: float = 2.0,
        multiplier: float = 2.0,
        *,
        jitter: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 <= initial_s <= max_s or multiplier < 1 or not 0 <= jitter < 1:
            raise ValueError(
                f"invalid backoff: initial_s={initial_s}, max_s={max_s}, "
                f"multiplier={multiplier}, jitter={jitter}"
            )
        self.initial_s = initial_s
        self.max_s = max_s
        self.multiplier = multiplier
        self.jitter = jitter
        self._rng = rng if rng is not None else random.Random()
        self._failures = 0

    def __repr__(self) -> str:
        return (
            f"Backoff(initial_s={self.initial_s}, max_s={self.max_s}, "
            f"multiplier={self.multiplier}, jitter={self.jitter})"
        )

    def nominal(self, failures: int) -> float:
        """The delay after ``failures`` consecutive failures (>= 1), without jitter."""
        exponent = min(max(failures, 1) - 1, _MAX_DOUBLINGS)
        return float(min(self.max_s, self.initial_s * self.multiplier**exponent))

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` consecutive failures (>= 1)."""
        nominal = self.nominal(failures)
        if not self.jitter:
            return nominal
        return nominal * (1.0 - self.jitter * self._rng.random())

    def next_delay(self) -> float:
        """The delay after one more failure than the last call (the first: ``initial_s``)."""
        self._failures += 1
        return self.delay(self._failures)

    def reset(self) -> None:
        """Start again from ``initial_s`` (after a success)."""
        self._failures = 0

    def sleep(self, deadline: SupportsRemaining) -> None:
        """Sleep :meth:`next_delay`, but never past ``deadline``."""
        time.sleep(max(0.0, min(self.next_delay(), deadline.remaining())))
