"""Exponential backoff for markers and completions that must be tried again."""

from __future__ import annotations

from dataclasses import dataclass

#: Past this many doublings every delay is the maximum anyway.
_MAX_DOUBLINGS = 60


@dataclass(frozen=True)
class Backoff:
    """Delay before the n-th retry: ``initial_s * multiplier**(n-1)``, at most ``max_s``."""

    initial_s: float = 0.05
    max_s: float = 2.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s or self.multiplier < 1:
            raise ValueError(f"invalid backoff {self}")

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` consecutive failures (>= 1)."""
        exponent = min(max(failures, 1) - 1, _MAX_DOUBLINGS)
        return float(min(self.max_s, self.initial_s * self.multiplier**exponent))
