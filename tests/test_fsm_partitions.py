"""The controller's partition registrations (fsm/partitions.py) and the
state machine's topics: replicas, leaders, in-sync replicas, epochs."""

from __future__ import annotations

import collections
import itertools

import msgpack
import pytest

from fsm import CreateTopic, ErrorCode, TransactionStateMachine
from fsm.commands import command_to_wire, decode_command
from fsm.errors import CommandError
from fsm.partitions import (
    NO_LEADER,
    PartitionRegistration,
    TopicRegistration,
    assign_replicas,
    assignment_error,
    new_topic,
    registration_error,
    single_replica_topic,
)


@pytest.mark.parametrize("nodes, factor", [(3, 1), (3, 3), (5, 3), (4, 2)])
def test_replicas_are_spread_evenly_over_the_nodes(nodes: int, factor: int) -> None:
    ids = [101 + i for i in range(nodes)]
    partitions = nodes * 4
    assignment = assign_replicas(ids, partitions, factor, start=2)
    assert len(assignment) == partitions
    assert all(len(set(r)) == factor for r in assignment)
    leaders = collections.Counter(r[0] for r in assignment)
    held = collections.Counter(n for r in assignment for n in r)
    assert set(leaders.values()) == {4}  # every node leads as many partitions
    assert set(held.values()) == {4 * factor}  # and holds as many replicas
    assert assignment_error(assignment, min(2, factor)) is None


def test_a_new_topic_starts_every_replica_in_sync_led_by_its_preferred_leader() -> None:
    topic = new_topic(((1, 2, 3), (2, 3, 1)), 2)
    assert topic.replication_factor == 3 and topic.min_insync_replicas == 2
    assert topic.leaders == (1, 2)
    for p in topic.partitions:
        assert p.isr == p.replicas and p.leader == p.preferred_leader
        assert (p.leader_epoch, p.partition_epoch) == (0, 0)
        assert registration_error(p) is None


@pytest.mark.parametrize(
    "registration",
    [
        PartitionRegistration((), (), NO_LEADER),
        PartitionRegistration((1, 1), (1,), 1),
        PartitionRegistration((-1,), (-1,), -1),
        PartitionRegistration((1, 2), (), 1),
        PartitionRegistration((1, 2), (3,), 3),
        PartitionRegistration((1, 2), (1, 1), 1),
        PartitionRegistration((1, 2), (1,), 2),  # a leader outside the ISR
        PartitionRegistration((1, 2), (1,), 1, -1),
    ],
)
def test_a_registration_that_breaks_an_invariant_does_not_restore(
    registration: PartitionRegistration,
) -> None:
    assert registration_error(registration) is not None
    with pytest.raises(CommandError):
        PartitionRegistration.from_wire(registration.to_wire())


def test_registrations_round_trip_through_the_wire() -> None:
    topic = new_topic(((1, 2, 3), (2, 3, 1)), 2)
    assert TopicRegistration.from_wire(topic.to_wire()) == topic
    offline = PartitionRegistration((1, 2), (2,), NO_LEADER, 4, 9)
    assert PartitionRegistration.from_wire(offline.to_wire()) == offline


@pytest.mark.parametrize(
    "assignment, min_insync, error",
    [
        ((), 1, ErrorCode.INVALID_PARTITIONS),
        (((1, 2), (1,)), 1, ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        (((1, 1),), 1, ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        (((1, -2),), 1, ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        (((1, 2),), 0, ErrorCode.INVALID_CONFIG),
        (((1, 2),), 3, ErrorCode.INVALID_CONFIG),
    ],
)
def test_an_assignment_that_cannot_be_a_topic_says_why(
    assignment: tuple[tuple[int, ...], ...], min_insync: int, error: ErrorCode
) -> None:
    problem = assignment_error(assignment, min_insync)
    assert problem is not None and problem[0] is error


def test_create_topic_registers_every_replica() -> None:
    m = TransactionStateMachine(0, 3)
    command = CreateTopic("orders", (1, 2, 3), 5, ((1, 2, 3), (2, 3, 1), (3, 1, 2)), 2)
    assert m.apply(command).ok
    assert m.state.topics["orders"] == new_topic(command.replicas, 2)
    assert m.offset_ceilings("orders") == (0, 0, 0)


def test_a_create_topic_logged_before_replicas_registers_one_replica_per_partition() -> None:
    wire = command_to_wire(CreateTopic("orders", (101, 102), 5))
    del wire["replicas"], wire["min_insync_replicas"]
    old = decode_command(msgpack.packb(wire, use_bin_type=True))
    m = TransactionStateMachine(0, 3)
    assert m.apply(old).ok
    assert m.state.topics["orders"] == single_replica_topic((101, 102))
    assert m.state.topics["orders"].partitions[1] == PartitionRegistration((102,), (102,), 102)


def test_a_snapshot_from_before_replicas_restores_one_replica_per_partition() -> None:
    m = TransactionStateMachine(0, 3)
    assert m.apply(CreateTopic("orders", (101, 102, 101), 5)).ok
    payload = msgpack.unpackb(m.snapshot(), raw=False)
    payload["v"] = 4
    payload["topics"] = [["orders", [101, 102, 101]]]
    restored = TransactionStateMachine.restore(msgpack.packb(payload, use_bin_type=True))
    assert restored.state == m.state
    assert restored.snapshot() == m.snapshot()


def test_a_snapshot_with_a_broken_registration_does_not_restore() -> None:
    m = TransactionStateMachine(0, 3)
    assert m.apply(CreateTopic("orders", (1,), 5, ((1, 2),), 1)).ok
    payload = msgpack.unpackb(m.snapshot(), raw=False)
    for broken in itertools.islice(
        (
            [[[[1, 2], [3], 3, 0, 0]], 1],  # the ISR outside the replicas
            [[[[1, 2], [1, 2], 1, 0, 0]], 3],  # min.insync above the replication factor
            [[[[1, 2], [1, 2], 1, 0]], 1],  # a field missing
        ),
        None,
    ):
        payload["topics"] = [["orders", broken]]
        with pytest.raises(CommandError):
            TransactionStateMachine.restore(msgpack.packb(payload, use_bin_type=True))
