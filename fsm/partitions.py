"""The controller's rules: where each partition's replicas live, which one
leads, and which are in sync (shard 0 only; docs/replication.md).

A partition's registration is what KRaft's controller keeps for it: the
replicas (the first is the preferred leader), the in-sync replicas, the
leader and the leader epoch, and a partition epoch that counts every change
of the registration. Every function here is pure: it returns new
registrations and never changes one.

The invariants every registration keeps (:func:`registration_error`): the
replicas are distinct node ids, the ISR is a non-empty subset of them, the
leader is an ISR member or -1 (no leader: every ISR member is fenced), and
epochs only grow. A leader is only ever chosen from the ISR: a replica that
was not in sync may lack acknowledged records (no unclean election).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fsm.errors import CommandError, ErrorCode
from fsm.wire import as_int, as_list

#: The leader of a partition none of whose in-sync replicas can lead.
NO_LEADER = -1
#: Node ids and epochs are int32 on the wire (Metadata, the batch header).
MAX_INT32 = 2**31 - 1


@dataclass(frozen=True)
class PartitionRegistration:
    """One partition's replicas, in-sync replicas, leader and epochs."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0

    def to_wire(self) -> list[Any]:
        return [
            list(self.replicas),
            list(self.isr),
            self.leader,
            self.leader_epoch,
            self.partition_epoch,
        ]

    @classmethod
    def from_wire(cls, data: Any) -> PartitionRegistration:
        """Raises: CommandError: malformed, or breaking an invariant."""
        fields = as_list(data)
        if len(fields) != 5:
            raise CommandError(f"a partition registration has 5 fields, got {data!r}")
        replicas, isr, leader, leader_epoch, partition_epoch = fields
        registration = cls(
            tuple(as_int(n) for n in as_list(replicas)),
            tuple(as_int(n) for n in as_list(isr)),
            as_int(leader),
            as_int(leader_epoch),
            as_int(partition_epoch),
        )
        problem = registration_error(registration)
        if problem is not None:
            raise CommandError(f"bad partition registration {data!r}: {problem}")
        return registration


@dataclass(frozen=True)
class TopicRegistration:
    """A topic: its partitions' registrations and ``min.insync.replicas``."""

    partitions: tuple[PartitionRegistration, ...]
    min_insync_replicas: int = 1

    def to_wire(self) -> list[Any]:
        return [[p.to_wire() for p in self.partitions], self.min_insync_replicas]

    @classmethod
    def from_wire(cls, data: Any) -> TopicRegistration:
        """Raises: CommandError: malformed, or breaking an invariant."""
        fields = as_list(data)
        if len(fields) != 2:
            raise CommandError(f"a topic registration has 2 fields, got {data!r}")
        partitions, min_insync = fields
        topic = cls(
            tuple(PartitionRegistration.from_wire(p) for p in as_list(partitions)),
            as_int(min_insync),
        )
        problem = assignment_error(
            [p.replicas for p in topic.partitions], topic.min_insync_replicas
        )
        if problem is not None:
            raise CommandError(f"bad topic registration: {problem[1]}")
        return topic


def registration_error(p: PartitionRegistration) -> str | None:
    """What breaks the registration invariants, or None."""
    if not p.replicas or len(set(p.replicas)) != len(p.replicas):
        return f"replicas {list(p.replicas)} must be distinct and not empty"
    if any(not 0 <= n <= MAX_INT32 for n in p.replicas):
        return "node ids must be in 0..2^31-1"
    if not p.isr or len(set(p.isr)) != len(p.isr) or not set(p.isr) <= set(p.replicas):
        return f"ISR {list(p.isr)} must be a non-empty subset of the replicas {list(p.replicas)}"
    if p.leader != NO_LEADER and p.leader not in p.isr:
        return f"leader {p.leader} is not in the ISR {list(p.isr)}"
    if not (0 <= p.leader_epoch <= MAX_INT32 and 0 <= p.partition_epoch <= MAX_INT32):
        return "epochs must be in 0..2^31-1"
    return None


def assignment_error(
    assignment: Sequence[Sequence[int]], min_insync_replicas: int
) -> tuple[ErrorCode, str] | None:
    """Why a topic with these replica lists cannot be created, or None."""
    if not assignment:
        return ErrorCode.INVALID_PARTITIONS, "a topic needs at least one partition"
    factor = len(assignment[0])
    for index, replicas in enumerate(assignment):
        if len(replicas) != factor:
            return (
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"partition {index} has {len(replicas)} replicas, partition 0 has {factor}",
            )
        if (
            not replicas
            or len(set(replicas)) != len(replicas)
            or not 0 <= min(replicas) <= max(replicas) <= MAX_INT32
        ):
            return (
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"partition {index}: replicas {list(replicas)} must be distinct node ids",
            )
    if not 1 <= min_insync_replicas <= factor:
        return (
            ErrorCode.INVALID_CONFIG,
            f"min.insync.replicas {min_insync_replicas} not in 1..{factor} "
            f"(the replication factor)",
        )
    return None


def assign_replicas(
    nodes: Sequence[int], partitions: int, replication_factor: int, start: int
) -> tuple[tuple[int, ...], ...]:
    """Each partition's replicas, spread over ``nodes`` (Kafka's rack-unaware
    assignment): partition ``p`` is led by the node ``start + p`` places on,
    its followers are the next nodes round the ring, so that leaders and
    followers are both spread evenly. ``replication_factor`` must not exceed
    the number of nodes."""
    count = len(nodes)
    return tuple(
        tuple(nodes[(start + p + r) % count] for r in range(replication_factor))
        for p in range(partitions)
    )


def new_topic(
    assignment: Sequence[Sequence[int]],
    min_insync_replicas: int,
    fenced: frozenset[int] = frozenset(),
) -> TopicRegistration:
    """A new topic: every replica starts in sync (every log is empty), led by
    its preferred leader, then each ``fenced`` node among its replicas fenced
    as :func:`fence` does (a fenced node leads nothing, and is in no ISR but
    as its last member)."""
    partitions = []
    for replicas in assignment:
        p = PartitionRegistration(tuple(replicas), tuple(replicas), replicas[0])
        for node in sorted(fenced & set(replicas)):
            p = fence(p, node, fenced)
        partitions.append(p)
    return TopicRegistration(tuple(partitions), min_insync_replicas)


def single_replica_topic(nodes: Iterable[int]) -> TopicRegistration:
    """The registration of a topic created before partitions had replicas:
    one replica per partition, on the node that held it."""
    return new_topic([(n,) for n in nodes], 1)


def fence(
    current: PartitionRegistration, node: int, fenced: frozenset[int]
) -> PartitionRegistration:
    """``current`` once ``node`` is fenced (its lease expired; ``fenced`` is
    every fenced node, ``node`` among them).

    A fenced follower leaves the ISR. A fenced leader leaves it too and the
    next unfenced ISR member in replica order leads, at the next leader
    epoch; when there is none the partition has no leader, and the ISR keeps
    its last member, the only replica known to hold every acknowledged
    record, which leads again when it comes back (KRaft keeps it so).
    """
    if node not in current.isr:
        return current
    isr = tuple(n for n in current.isr if n != node) or (node,)
    if current.leader != node:
        if isr == current.isr:
            return current
        return replace(current, isr=isr, partition_epoch=current.partition_epoch + 1)
    leader = next((n for n in isr if n not in fenced), NO_LEADER)
    if (isr, leader) == (current.isr, current.leader):
        return current
    return _led_by(replace(current, isr=isr), leader)


def alter_isr(
    current: PartitionRegistration,
    leader: int,
    leader_epoch: int,
    partition_epoch: int,
    isr: Sequence[int],
    fenced: frozenset[int],
) -> PartitionRegistration | tuple[ErrorCode, str]:
    """``current`` with the ISR its leader asks for (KRaft's AlterPartition:
    a follower that caught up joins, one that fell behind leaves), or why
    not: the request must come from the current leader at the current
    leader epoch, name the partition epoch it last saw (a stale view is
    INVALID_UPDATE_VERSION), keep the leader in the ISR, name only
    replicas, and add no fenced node (INELIGIBLE_REPLICA)."""
    if leader != current.leader or leader == NO_LEADER:
        return (
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            f"partition-log node {leader} does not lead the partition (its leader is "
            f"{current.leader})",
        )
    if leader_epoch != current.leader_epoch:
        return (
            ErrorCode.FENCED_LEADER_EPOCH,
            f"leader epoch {leader_epoch}, the partition is at {current.leader_epoch}",
        )
    if partition_epoch != current.partition_epoch:
        return (
            ErrorCode.INVALID_UPDATE_VERSION,
            f"partition epoch {partition_epoch}, the partition is at {current.partition_epoch}",
        )
    wanted = tuple(isr)
    if (
        leader not in wanted
        or len(set(wanted)) != len(wanted)
        or not set(wanted) <= set(current.replicas)
    ):
        return (
            ErrorCode.INVALID_REQUEST,
            f"ISR {list(wanted)} must be distinct replicas of {list(current.replicas)} "
            f"holding the leader {leader}",
        )
    joining = sorted((set(wanted) - set(current.isr)) & fenced)
    if joining:
        return ErrorCode.INELIGIBLE_REPLICA, f"fenced nodes {joining} cannot join the ISR"
    if wanted == current.isr:
        return current
    return replace(current, isr=wanted, partition_epoch=current.partition_epoch + 1)


def imbalanced(
    leaders: Sequence[int | None], preferred: Sequence[int], node: int, percentage: int
) -> bool:
    """Whether ``node`` leads too few of what prefers it (coordinator shards,
    or partitions: their first replica): Kafka's imbalance ratio, those that
    prefer it (``preferred[i]``) led by another node or none (``leaders[i]``,
    None or -1: no leader) over all that prefer it, above ``percentage`` %."""
    mine = [i for i, p in enumerate(preferred) if p == node]
    others = sum(1 for i in mine if leaders[i] != node)
    return bool(mine) and others * 100 > percentage * len(mine)


def elect_preferred(
    current: PartitionRegistration, fenced: frozenset[int]
) -> PartitionRegistration:
    """``current`` led by its preferred leader (its first replica) at the next
    leader epoch, when that one is in the ISR, not fenced, and not leading
    already; else ``current``."""
    preferred = current.replicas[0]
    if current.leader == preferred or preferred not in current.isr or preferred in fenced:
        return current
    return _led_by(current, preferred)


def imbalanced_nodes(
    topics: Iterable[TopicRegistration], fenced: frozenset[int], percentage: int
) -> list[int]:
    """The nodes whose share of the partitions that prefer them, led by
    another replica, is above ``percentage`` % (Kafka's
    leader.imbalance.per.broker.percentage), and that could lead one of
    them again now (:func:`elect_preferred` would move it)."""
    partitions = [p for topic in topics for p in topic.partitions]
    leaders = [p.leader for p in partitions]
    preferred = [p.replicas[0] for p in partitions]
    electable = {p.replicas[0] for p in partitions if elect_preferred(p, fenced) is not p}
    return sorted(n for n in electable if imbalanced(leaders, preferred, n, percentage))


def unfence(current: PartitionRegistration, node: int) -> PartitionRegistration:
    """``current`` once ``node`` is back (heartbeating again): a partition
    without a leader whose ISR holds it is led by it again, at the next
    leader epoch. A returning follower rejoins the ISR only when its leader
    has caught it up (:func:`alter_isr`)."""
    if current.leader != NO_LEADER or node not in current.isr:
        return current
    return _led_by(current, node)


def _led_by(current: PartitionRegistration, leader: int) -> PartitionRegistration:
    """``current`` with another leader (or none): both epochs grow."""
    return replace(
        current,
        leader=leader,
        leader_epoch=current.leader_epoch + 1,
        partition_epoch=current.partition_epoch + 1,
    )
