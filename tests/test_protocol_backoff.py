"""raftcoord.protocol.backoff: the one backoff of the client and the marker writer."""

from __future__ import annotations

import random
import time

import pytest

from raftcoord.protocol.backoff import Backoff


def test_delays_double_up_to_the_maximum_without_jitter() -> None:
    backoff = Backoff(0.1, 1.0)
    assert [backoff.delay(n) for n in (0, 1, 2, 3, 4, 5, 10_000)] == [
        0.1,
        0.1,
        0.2,
        0.4,
        0.8,
        1.0,
        1.0,
    ]
    assert [backoff.next_delay() for _ in range(3)] == [0.1, 0.2, 0.4]
    backoff.reset()
    assert backoff.next_delay() == 0.1


def test_jitter_is_drawn_from_the_injected_random_source() -> None:
    first = Backoff(0.1, 1.0, jitter=0.2, rng=random.Random(7))
    second = Backoff(0.1, 1.0, jitter=0.2, rng=random.Random(7))
    delays = [first.next_delay() for _ in range(6)]
    assert delays == [second.next_delay() for _ in range(6)]
    for n, delay in enumerate(delays, start=1):
        assert 0.8 * first.nominal(n) <= delay <= first.nominal(n)


def test_sleep_stops_at_the_deadline() -> None:
    class Deadline:
        def remaining(self) -> float:
            return 0.01

    started = time.monotonic()
    Backoff(5.0, 5.0).sleep(Deadline())
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize(
    "invalid",
    [{"initial_s": -1}, {"initial_s": 2, "max_s": 1}, {"multiplier": 0.5}, {"jitter": 1}],
)
def test_invalid_parameters_are_refused(invalid: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**invalid)
