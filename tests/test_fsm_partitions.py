"""The controller's partition registrations (fsm/partitions.py) and the
state machine's topics: replicas, leaders, in-sync replicas, epochs."""

from __future__ import annotations

import collections
import itertools
import random

import msgpack
import pytest

from fsm import (
    AlterPartition,
    CreateTopic,
    ErrorCode,
    FenceNode,
    TransactionStateMachine,
    UnfenceNode,
)
from fsm.commands import command_to_wire, decode_command, encode_command
from fsm.errors import CommandError
from fsm.partitions import (
    NO_LEADER,
    PartitionRegistration,
    TopicRegistration,
    alter_isr,
    assign_replicas,
    assignment_error,
    elect_preferred,
    fence,
    imbalanced_nodes,
    new_topic,
    registration_error,
    single_replica_topic,
    unfence,
)
from tests.seeds import chosen_seed


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
    assert topic.min_insync_replicas == 2
    assert [p.leader for p in topic.partitions] == [1, 2]
    for p in topic.partitions:
        assert p.isr == p.replicas and p.leader == p.replicas[0]
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


# --- fencing: a partition-log node's lease expired, and it came back ------------------


def test_a_fenced_leader_of_one_replica_leaves_the_partition_without_a_leader() -> None:
    alone = PartitionRegistration((101,), (101,), 101)
    fenced = fence(alone, 101, frozenset({101}))
    assert (fenced.leader, fenced.isr) == (NO_LEADER, (101,))  # the ISR keeps its last member
    assert (fenced.leader_epoch, fenced.partition_epoch) == (1, 1)
    back = unfence(fenced, 101)
    assert (back.leader, back.isr, back.leader_epoch, back.partition_epoch) == (101, (101,), 2, 2)


def test_a_fenced_leader_hands_over_to_the_next_unfenced_in_sync_replica() -> None:
    p = PartitionRegistration((1, 2, 3), (1, 2, 3), 1)
    after = fence(p, 1, frozenset({1, 2}))  # 2 is fenced too: 3 leads
    assert (after.leader, after.isr, after.leader_epoch) == (3, (2, 3), 1)
    follower_gone = fence(p, 2, frozenset({2}))
    assert (follower_gone.leader, follower_gone.isr) == (1, (1, 3))
    assert follower_gone.leader_epoch == 0 and follower_gone.partition_epoch == 1
    # A node outside the ISR changes nothing; a returning follower waits for
    # its leader to catch it up before it is in sync again.
    assert fence(follower_gone, 2, frozenset({2})) is follower_gone
    assert unfence(follower_gone, 2) is follower_gone


def test_the_last_in_sync_replica_leads_again_when_it_returns() -> None:
    p = PartitionRegistration((1, 2), (1, 2), 1)
    fenced = frozenset({1, 2})
    p = fence(fence(p, 2, fenced), 1, fenced)
    assert (p.leader, p.isr) == (NO_LEADER, (1,))
    assert unfence(p, 2) is p  # not in sync: it may lack acknowledged records
    assert (unfence(p, 1).leader, unfence(p, 1).isr) == (1, (1,))


def test_random_fencing_keeps_every_invariant_and_never_elects_outside_the_isr() -> None:
    seed = chosen_seed(20261127)
    rng = random.Random(seed)
    for _ in range(300):
        nodes = list(range(1, rng.randrange(2, 6)))
        replicas = tuple(rng.sample(nodes, rng.randrange(1, len(nodes) + 1)))
        fenced = frozenset(rng.sample(nodes, rng.randrange(0, 2)))  # fenced at creation
        p = new_topic([replicas], 1, fenced).partitions[0]
        assert registration_error(p) is None and p.leader not in fenced, (seed, p)
        for _ in range(20):
            node = rng.choice(nodes)
            before = p
            if node in fenced and rng.random() < 0.6:
                fenced = fenced - {node}
                p = unfence(p, node)
            else:
                fenced = fenced | {node}
                p = fence(p, node, fenced)
            assert registration_error(p) is None, (seed, p)
            assert p.leader == NO_LEADER or p.leader not in fenced, (seed, p, fenced)
            assert p.leader == NO_LEADER or p.leader in before.isr, (seed, before, p)
            assert set(p.isr) <= set(before.isr), (seed, before, p)  # only the leader grows it
            assert p.leader_epoch >= before.leader_epoch
            assert (p.leader != before.leader) <= (p.leader_epoch > before.leader_epoch)
            assert (p != before) == (p.partition_epoch > before.partition_epoch)


def leaders(m: TransactionStateMachine, topic: str) -> list[int]:
    return [p.leader for p in m.state.topics[topic].partitions]


def test_fence_and_unfence_commands_move_every_partition_of_the_node() -> None:
    m = TransactionStateMachine(0, 3)
    assert m.apply(CreateTopic("orders", (101, 102, 101), 5)).ok
    assert m.apply(FenceNode(101, 6)).ok
    assert m.state.fenced_nodes == {101}
    assert leaders(m, "orders") == [NO_LEADER, 102, NO_LEADER]
    restored = TransactionStateMachine.restore(m.snapshot())
    assert restored.state == m.state
    assert m.apply(FenceNode(101, 7)).ok  # again: nothing moves
    assert m.state.topics["orders"].partitions[0].leader_epoch == 1
    assert m.apply(UnfenceNode(102, 8)).ok  # not fenced: nothing moves
    assert m.state.topics["orders"] == restored.state.topics["orders"]
    assert m.apply(UnfenceNode(101, 9)).ok
    assert m.state.fenced_nodes == frozenset()
    assert leaders(m, "orders") == [101, 102, 101]
    assert [p.leader_epoch for p in m.state.topics["orders"].partitions] == [2, 0, 2]
    before = m.snapshot()
    assert m.apply(FenceNode(-1, 10)).error is ErrorCode.INVALID_REQUEST
    assert m.snapshot() == before


def test_a_topic_created_while_a_node_is_fenced_is_not_led_by_it() -> None:
    m = TransactionStateMachine(0, 3)
    assert m.apply(FenceNode(101, 5)).ok
    assert m.apply(CreateTopic("t", (101, 102), 6, ((101, 102), (102, 101)), 1)).ok
    first, second = m.state.topics["t"].partitions
    assert (first.leader, first.isr, first.leader_epoch) == (102, (102,), 1)
    assert (second.leader, second.isr) == (102, (102,))
    assert m.apply(CreateTopic("alone", (101,), 6)).ok
    assert leaders(m, "alone") == [NO_LEADER]
    assert m.apply(UnfenceNode(101, 7)).ok
    assert leaders(m, "alone") == [101] and leaders(m, "t") == [102, 102]


def test_a_fence_that_would_overflow_a_leader_epoch_changes_nothing() -> None:
    m = TransactionStateMachine(0, 3)
    assert m.apply(CreateTopic("t", (101,), 5)).ok
    payload = msgpack.unpackb(m.snapshot(), raw=False)
    payload["topics"] = [["t", [[[[101], [101], 101, 2**31 - 1, 0]], 1]]]
    m = TransactionStateMachine.restore(msgpack.packb(payload, use_bin_type=True))
    before = m.snapshot()
    outcome = m.apply(FenceNode(101, 6))
    assert outcome.error is ErrorCode.UNKNOWN_SERVER_ERROR and "2^31" in outcome.message
    assert m.snapshot() == before
    for node in (-1, 2**31):
        assert m.apply(FenceNode(node, 6)).error is ErrorCode.INVALID_REQUEST
    assert m.snapshot() == before


@pytest.mark.parametrize(
    "fenced, topics",
    [
        ([-1], []),
        ([2, 1], []),
        ([1, 1], []),
        ([101], [["t", [[[[101], [101], 101, 1, 1]], 1]]]),  # a fenced node leads
        ([], [["t", [[[[101], [101], 101, 2**31, 0]], 1]]]),  # an epoch past int32
    ],
)
def test_a_snapshot_with_inconsistent_fencing_does_not_restore(
    fenced: list[int], topics: list[object]
) -> None:
    payload = msgpack.unpackb(TransactionStateMachine(0, 3).snapshot(), raw=False)
    payload["fenced_nodes"], payload["topics"] = fenced, topics
    with pytest.raises(CommandError):
        TransactionStateMachine.restore(msgpack.packb(payload, use_bin_type=True))


def test_only_the_leader_at_its_epochs_alters_the_isr() -> None:
    p = PartitionRegistration((1, 2, 3), (1, 2), 1, leader_epoch=4, partition_epoch=7)
    grown = alter_isr(p, 1, 4, 7, (1, 2, 3), frozenset())
    assert grown == PartitionRegistration((1, 2, 3), (1, 2, 3), 1, 4, 8)
    assert alter_isr(p, 1, 4, 7, (1, 2), frozenset()) is p  # no change
    for args, code in [
        ((2, 4, 7, (2, 1)), ErrorCode.NOT_LEADER_OR_FOLLOWER),
        ((1, 3, 7, (1,)), ErrorCode.FENCED_LEADER_EPOCH),
        ((1, 4, 6, (1,)), ErrorCode.INVALID_UPDATE_VERSION),
        ((1, 4, 7, (2, 3)), ErrorCode.INVALID_REQUEST),  # without the leader
        ((1, 4, 7, (1, 4)), ErrorCode.INVALID_REQUEST),  # not a replica
        ((1, 4, 7, (1, 1)), ErrorCode.INVALID_REQUEST),
    ]:
        refused = alter_isr(p, *args, frozenset())  # type: ignore[arg-type]
        assert isinstance(refused, tuple) and refused[0] is code, (args, refused)
    refused = alter_isr(p, 1, 4, 7, (1, 2, 3), frozenset({3}))
    assert isinstance(refused, tuple) and refused[0] is ErrorCode.INELIGIBLE_REPLICA
    shrunk = alter_isr(p, 1, 4, 7, (1,), frozenset({3}))  # leaving is always allowed
    assert isinstance(shrunk, PartitionRegistration) and shrunk.isr == (1,)
    leaderless = PartitionRegistration((1, 2), (1,), NO_LEADER, 2, 3)
    refused = alter_isr(leaderless, NO_LEADER, 2, 3, (1,), frozenset())
    assert isinstance(refused, tuple) and refused[0] is ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_the_alter_partition_command_applies_on_every_replica_alike() -> None:
    m = TransactionStateMachine(0, 3)
    assert m.apply(CreateTopic("t", (1, 2), 5, ((1, 2, 3), (2, 3, 1)), 2)).ok
    command = AlterPartition("t", 0, 1, 0, 0, (1, 3), 6)
    assert decode_command(encode_command(command)) == command
    assert m.apply(command).ok
    assert m.state.topics["t"].partitions[0].isr == (1, 3)
    assert m.state.topics["t"].partitions[1].isr == (2, 3, 1)
    replica = TransactionStateMachine.restore(m.snapshot())
    before = m.snapshot()
    for refused in (
        AlterPartition("t", 0, 1, 0, 0, (1, 2, 3), 7),  # a stale partition epoch
        AlterPartition("t", 5, 1, 0, 0, (1,), 7),
        AlterPartition("nope", 0, 1, 0, 0, (1,), 7),
    ):
        assert not m.apply(refused).ok and not replica.apply(refused).ok
    assert m.snapshot() == before
    assert m.apply(FenceNode(2, 8)).ok  # the fenced node cannot join
    assert m.apply(AlterPartition("t", 0, 1, 0, 1, (1, 2, 3), 9)).error is (
        ErrorCode.INELIGIBLE_REPLICA
    )


def test_a_preferred_leader_in_sync_and_unfenced_leads_again() -> None:
    p = PartitionRegistration((1, 2, 3), (1, 2, 3), 2, leader_epoch=4, partition_epoch=6)
    assert elect_preferred(p, frozenset()) == PartitionRegistration((1, 2, 3), (1, 2, 3), 1, 5, 7)
    assert elect_preferred(p, frozenset({1})) is p  # fenced
    out_of_sync = PartitionRegistration((1, 2, 3), (2, 3), 2, 4, 6)
    assert elect_preferred(out_of_sync, frozenset()) is out_of_sync
    led = PartitionRegistration((1, 2, 3), (1, 2, 3), 1)
    assert elect_preferred(led, frozenset()) is led


def test_only_imbalanced_nodes_that_could_lead_are_named() -> None:
    topic = TopicRegistration(
        (
            PartitionRegistration((1, 2), (1, 2), 2),  # 1 could lead it again
            PartitionRegistration((1, 2), (1, 2), 1),
            PartitionRegistration((2, 1), (1,), 1),  # 2 is out of its ISR
        ),
        1,
    )
    assert imbalanced_nodes([topic], frozenset(), 10) == [1]  # 1 of 2: 50 % > 10 %
    assert imbalanced_nodes([topic], frozenset(), 50) == []  # 50 % is not above 50 %
    assert imbalanced_nodes([topic], frozenset({1}), 10) == []
