"""The seeds of the randomized tests.

Fixed by default, so that the suite is deterministic (as hypothesis is, in
tests/conftest.py). ``RAFTCOORD_SEED=N`` runs them with another seed (to
replay a printed one, or to explore), ``RAFTCOORD_SEED=random`` with a fresh
one. The seed used is printed, so that a failure names the way to replay it.
"""

from __future__ import annotations

import os
import random

SEED_ENV = "RAFTCOORD_SEED"


def chosen_seed(default: int) -> int:
    """``default``, or the seed ``RAFTCOORD_SEED`` asks for; printed."""
    value = os.environ.get(SEED_ENV, "")
    if value == "random":
        seed = random.SystemRandom().randrange(2**32)
    elif value:
        seed = int(value)
    else:
        seed = default
    print(f"{SEED_ENV}={seed}")
    return seed
