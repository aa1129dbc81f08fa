"""raftcoord.coordinator.voters: the voters record and what a leader proposes."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

from raftcoord.coordinator.voters import counts, decode_record, encode_record, proposal
from tests.seeds import chosen_seed

MEMBERS = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
OLD = {m: f"{i:032x}" for i, m in enumerate(MEMBERS, start=1)}
NEW_DIR = "f" * 32


def test_a_record_round_trips_in_any_order() -> None:
    assert decode_record(encode_record(OLD), reversed(MEMBERS)) == OLD


@pytest.mark.parametrize(
    "pairs",
    [
        [[m, d] for m, d in OLD.items()][:2],  # a member missing
        [*([m, d] for m, d in OLD.items()), ["127.0.0.1:4", NEW_DIR]],  # a stranger
        [[m, "not-a-directory"] for m in MEMBERS],
        [[m, OLD[m].encode()] for m in MEMBERS],
        [[MEMBERS[0], OLD[MEMBERS[0]]]] * 3,  # one member thrice
        [[m] for m in MEMBERS],
        {m: d for m, d in OLD.items()},
        None,
    ],
)
def test_anything_but_a_record_of_exactly_the_members_is_none(pairs: Any) -> None:
    data = bytes(msgpack.packb(pairs, use_bin_type=True))
    assert decode_record(data, MEMBERS) is None


def test_random_bytes_never_raise() -> None:
    seed = chosen_seed(20)
    rng = random.Random(seed)
    for _ in range(2000):
        data = rng.randbytes(rng.randrange(0, 64))
        assert decode_record(data, MEMBERS) in (None, OLD), f"seed {seed}"


def test_votes_count_from_the_recorded_directory_only() -> None:
    assert counts(None, MEMBERS[2], NEW_DIR)  # no record yet: every one counts
    assert counts(OLD, MEMBERS[2], OLD[MEMBERS[2]])
    assert not counts(OLD, MEMBERS[2], NEW_DIR)
    assert not counts(OLD, MEMBERS[2], "")
    assert not counts(OLD, "127.0.0.1:4", NEW_DIR)


def test_the_first_record_waits_for_every_member() -> None:
    heard = dict(OLD)
    del heard[MEMBERS[1]]
    assert proposal(None, MEMBERS, heard, MEMBERS) is None
    assert proposal(None, MEMBERS, {**heard, MEMBERS[1]: ""}, MEMBERS) is None
    assert proposal(None, MEMBERS, OLD, []) == OLD


def test_a_new_directory_is_recorded_once_caught_up() -> None:
    heard = {**OLD, MEMBERS[2]: NEW_DIR}
    assert proposal(OLD, MEMBERS, OLD, MEMBERS) is None  # nothing changed
    assert proposal(OLD, MEMBERS, heard, MEMBERS[:2]) is None  # not caught up yet
    assert proposal(OLD, MEMBERS, heard, MEMBERS) == {**OLD, MEMBERS[2]: NEW_DIR}
    # a member not heard from keeps its record
    assert proposal(OLD, MEMBERS, {MEMBERS[0]: OLD[MEMBERS[0]]}, MEMBERS) is None
