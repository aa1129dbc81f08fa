"""Places for connections in their handshake, counted per source address."""

from __future__ import annotations

import pytest

from raftcoord.protocol.admission import HandshakeSlots


def test_one_address_holds_its_share_and_strangers_together_the_total() -> None:
    slots = HandshakeSlots(per_source=2, total=3)
    assert slots.take("10.0.0.1") and slots.take("10.0.0.1")
    assert not slots.take("10.0.0.1")  # its share
    assert slots.take("10.0.0.2")
    assert not slots.take("10.0.0.3")  # the strangers' total
    slots.give_back("10.0.0.1")
    assert slots.take("10.0.0.3")
    assert slots.held() == 3 and slots.held("10.0.0.1") == 1


def test_the_cluster_hosts_have_places_strangers_cannot_take() -> None:
    slots = HandshakeSlots(per_source=1, total=2, reserved={"127.0.0.1"}, per_reserved=3)
    assert slots.take("10.0.0.1") and slots.take("10.0.0.2")
    assert not slots.take("10.0.0.3")
    assert all(slots.take("127.0.0.1") for _ in range(3))
    assert not slots.take("127.0.0.1")
    for _ in range(3):
        slots.give_back("127.0.0.1")
    assert not slots.take("10.0.0.3")  # the cluster's places are not the strangers'


def test_a_place_not_held_cannot_be_given_back() -> None:
    slots = HandshakeSlots(per_source=1, total=1)
    with pytest.raises(ValueError, match="no place"):
        slots.give_back("10.0.0.1")
    with pytest.raises(ValueError):
        HandshakeSlots(per_source=2, total=1)
