"""What the console's pages show, computed from what the client library
answered (:class:`Snapshot`). Pure: no I/O and no clock (the time is given),
so that every figure on a page can be checked without a cluster.

``None`` in a snapshot means "not known" (the question failed; the error is
in :attr:`Snapshot.errors`), which the pages show as a dash, never as zero.
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from raftcoord.client import (
    ConsumerGroupDescription,
    CoordinatorDescription,
    PartitionNodeDescription,
    ProducerState,
    ShardReplicaDescription,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)
from raftcoord.client.hanging import OpenTransaction

__all__ = [
    "ClusterView",
    "GroupRow",
    "HangingRow",
    "NodeRow",
    "Overview",
    "ProducerRow",
    "Report",
    "ShardRow",
    "Snapshot",
    "TopicRow",
    "TransactionRow",
    "TransactionsView",
    "abort_command",
    "cluster_view",
    "format_duration",
    "format_time",
    "groups_view",
    "overview",
    "producers_view",
    "topics_view",
    "transactions_view",
]

#: Transaction states in which a transaction is open (its markers are to come).
OPEN_STATES = frozenset({"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"})


@dataclass(frozen=True)
class Report:
    """An audit report found in the cluster directory."""

    #: Its path under the cluster directory, with "/" separators.
    path: str
    modified_ms: int
    #: PASS or FAIL from the audit.json beside it; None when there is none.
    verdict: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """What one round of questions to the cluster answered, at ``taken_ms``."""

    taken_ms: int
    #: How long the round took.
    took_ms: int = 0
    coordinators: Sequence[CoordinatorDescription] | None = None
    #: The cluster's nodes as the coordinators last listed them (at the
    #: console's start, then in every round they answered):
    #: {"coordinators": {id: address}, "partition_nodes": {id: address}}.
    #: The cluster page counts them when no coordinator answers.
    cluster_nodes: Mapping[str, Mapping[int, str]] = field(default_factory=dict)
    partition_nodes: Sequence[PartitionNodeDescription] | None = None
    #: Topic -> partition count.
    topics: Mapping[str, int] | None = None
    #: High watermarks (log end offsets) and last stable offsets.
    log_end_offsets: Mapping[TopicPartition, int] | None = None
    stable_offsets: Mapping[TopicPartition, int] | None = None
    producers: Mapping[TopicPartition, Sequence[ProducerState]] | None = None
    #: The hanging transactions (raftcoord.client.hanging's decision).
    hanging: Sequence[OpenTransaction] | None = None
    transactions: Sequence[TransactionListing] | None = None
    #: The descriptions of the open transactions, by transactional id.
    descriptions: Mapping[str, TransactionDescription] = field(default_factory=dict)
    groups: Mapping[str, ConsumerGroupDescription] = field(default_factory=dict)
    group_offsets: Mapping[str, Mapping[TopicPartition, int]] = field(default_factory=dict)
    reports: Sequence[Report] = ()
    #: "what: why" of every question that failed.
    errors: Sequence[str] = ()


# --- formatting ---------------------------------------------------------------------


def format_duration(ms: int | None) -> str:
    """``ms`` for a person: "850 ms", "12.5 s", "3 min 20 s", "15 min", "2 h 5 min", "3 d 4 h"."""
    if ms is None or ms < 0:
        return "-"
    if ms < 1_000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    seconds = ms // 1000
    if seconds < 3600:
        return _two_units(seconds // 60, "min", seconds % 60, "s")
    if seconds < 86_400:
        return _two_units(seconds // 3600, "h", seconds % 3600 // 60, "min")
    return _two_units(seconds // 86_400, "d", seconds % 86_400 // 3600, "h")


def _two_units(big: int, big_unit: str, small: int, small_unit: str) -> str:
    return f"{big} {big_unit}" + (f" {small} {small_unit}" if small else "")


def format_time(ms: int | None) -> str:
    """A wall-clock time in ms since the epoch, as UTC ("2024-05-01 12:00:03Z")."""
    if ms is None or ms < 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def force_terminate_command(transactional_id: str, connection: Sequence[str]) -> str:
    """The ``raftcoord txn force-terminate`` command line that aborts a
    transactional id's open transaction at its coordinator."""
    return shlex.join(["raftcoord", "txn", "force-terminate", transactional_id, *connection])


def abort_command(
    topic_partition: TopicPartition,
    connection: Sequence[str],
    start_offset: int | None = None,
    producer: tuple[int, int] | None = None,
) -> str:
    """The ``raftcoord txn abort`` command line that ends an open transaction
    on a partition: the one starting at ``start_offset``, or the one of
    ``producer`` (producer id, epoch of its data). ``connection`` are the
    options that reach the cluster (--cluster-dir DIR or --bootstrap-server ...)."""
    args = [
        "raftcoord",
        "txn",
        "abort",
        "--topic",
        topic_partition.topic,
        "--partition",
        str(topic_partition.partition),
    ]
    if start_offset is not None:
        args += ["--start-offset", str(start_offset)]
    elif producer is not None:
        args += ["--producer-id", str(producer[0]), "--producer-epoch", str(producer[1])]
    else:
        raise ValueError("give start_offset or producer")
    return shlex.join([*args, *connection])


def _tp_name(tp: TopicPartition) -> str:
    return f"{tp.topic}-{tp.partition}"


# --- cluster ------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeRow:
    """A coordinator or partition-log node."""

    node_id: int
    address: str
    #: None: not known (a partition-log node when no coordinator answered).
    up: bool | None
    #: The error when down; a partition-log node's directory state when up.
    detail: str
    #: The shards a coordinator leads.
    leads: tuple[int, ...] = ()
    #: The partitions a partition-log node refuses, with why.
    refused: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReplicaRow:
    """One replica of a shard."""

    node_id: int
    #: "leader", "follower", or "down" (its node did not answer).
    role: str
    term: int | None = None
    applied_index: int | None = None
    #: Entries it has still to apply to catch up with the leader's commit index.
    behind: int | None = None


@dataclass(frozen=True)
class ShardRow:
    """One shard (a Raft group over every coordinator)."""

    shard: int
    leader_node_id: int
    leader_address: str
    term: int | None
    transactional_ids: int | None
    replicas: tuple[ReplicaRow, ...]

    @property
    def has_leader(self) -> bool:
        return self.leader_node_id >= 0


@dataclass(frozen=True)
class ClusterView:
    coordinators: tuple[NodeRow, ...]
    shards: tuple[ShardRow, ...]
    partition_nodes: tuple[NodeRow, ...]

    @property
    def leaderless(self) -> tuple[int, ...]:
        return tuple(s.shard for s in self.shards if not s.has_leader)

    @property
    def coordinators_answering(self) -> int:
        return sum(1 for n in self.coordinators if n.up)

    @property
    def partition_nodes_answering(self) -> int | None:
        """None when not known (the coordinators did not answer)."""
        if any(n.up is None for n in self.partition_nodes):
            return None
        return sum(1 for n in self.partition_nodes if n.up)


def cluster_view(snapshot: Snapshot) -> ClusterView:
    """The nodes, and each shard's leader and replicas, from what every
    coordinator said of its own replicas. When no coordinator answered,
    every coordinator the cluster has is down and its partition-log nodes
    are not known (nothing asked them)."""
    coordinators = snapshot.coordinators
    if coordinators is None:
        coordinators = [
            CoordinatorDescription(node_id, address, "did not answer")
            for node_id, address in sorted(snapshot.cluster_nodes.get("coordinators", {}).items())
        ]
    by_shard: dict[int, dict[int, ShardReplicaDescription]] = {}
    for node in coordinators:
        for replica in node.shards:
            by_shard.setdefault(replica.shard, {})[node.node_id] = replica
    shards = tuple(
        _shard_row(shard, by_shard.get(shard, {}), coordinators)
        for shard in range(max(by_shard, default=-1) + 1)
    )
    led: dict[int, list[int]] = {}
    for s in shards:
        led.setdefault(s.leader_node_id, []).append(s.shard)
    coordinator_rows = tuple(
        NodeRow(
            node_id=n.node_id,
            address=n.address,
            up=n.error is None,
            detail=n.error or "serving",
            leads=tuple(led.get(n.node_id, ())) if n.error is None else (),
        )
        for n in coordinators
    )
    if snapshot.partition_nodes is None:
        known = sorted(snapshot.cluster_nodes.get("partition_nodes", {}).items())
        partition_rows = tuple(
            NodeRow(node_id, address, None, "not known: the coordinators did not answer")
            for node_id, address in known
        )
    else:
        partition_rows = tuple(
            NodeRow(
                node_id=n.node_id,
                address=n.address,
                up=n.error is None,
                detail=n.error or n.directory_state,
                refused=tuple(f"{_tp_name(tp)}: {why}" for tp, why in n.refused),
            )
            for n in snapshot.partition_nodes
        )
    return ClusterView(coordinator_rows, shards, partition_rows)


def _shard_row(
    shard: int,
    replicas: Mapping[int, ShardReplicaDescription],
    nodes: Sequence[CoordinatorDescription],
) -> ShardRow:
    leaders = [r for r in replicas.values() if r.is_leader]
    newest = max(replicas.values(), key=lambda r: r.term, default=None)
    if leaders:
        leader = max(leaders, key=lambda r: r.term)
        leader_id = next(n for n, r in replicas.items() if r is leader)
        leader_address = next((n.address for n in nodes if n.node_id == leader_id), "")
        commit: int | None = leader.commit_index
        ids: int | None = leader.transactional_ids
    else:  # no replica that answered leads it (an election, or its leader is down)
        leader_id, leader_address, commit, ids = -1, "", None, None
    rows = []
    for node in nodes:
        replica = replicas.get(node.node_id)
        if replica is None:
            rows.append(ReplicaRow(node.node_id, "down"))
            continue
        rows.append(
            ReplicaRow(
                node_id=node.node_id,
                role="leader" if node.node_id == leader_id else "follower",
                term=replica.term,
                applied_index=replica.applied_index,
                behind=None if commit is None else max(0, commit - replica.applied_index),
            )
        )
    return ShardRow(
        shard=shard,
        leader_node_id=leader_id,
        leader_address=leader_address,
        term=None if newest is None else newest.term,
        transactional_ids=ids,
        replicas=tuple(rows),
    )


@dataclass(frozen=True)
class Overview:
    """The counts at the top of the cluster page; None: not known."""

    topics: int | None
    partitions: int | None
    open_transactions: int | None
    hanging: int | None
    groups: int


def overview(snapshot: Snapshot) -> Overview:
    topics = snapshot.topics
    transactions = snapshot.transactions
    return Overview(
        topics=None if topics is None else len(topics),
        partitions=None if topics is None else sum(topics.values()),
        open_transactions=(
            None if transactions is None else sum(t.state in OPEN_STATES for t in transactions)
        ),
        hanging=None if snapshot.hanging is None else len(snapshot.hanging),
        groups=len(set(snapshot.groups) | set(snapshot.group_offsets)),
    )


# --- topics -------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionRow:
    partition: int
    #: The high watermark (the offset the next record gets).
    log_end_offset: int | None
    #: The last stable offset: read_committed consumers read up to it.
    last_stable_offset: int | None
    #: Producers with an open transaction on the partition.
    open_transactions: int | None
    #: Of those, the hanging ones.
    hanging: int

    @property
    def unstable(self) -> int | None:
        """Offsets held back from read_committed consumers by open transactions."""
        if self.log_end_offset is None or self.last_stable_offset is None:
            return None
        return self.log_end_offset - self.last_stable_offset


@dataclass(frozen=True)
class TopicRow:
    name: str
    partitions: tuple[PartitionRow, ...]

    @property
    def open_transactions(self) -> int | None:
        counts = [p.open_transactions for p in self.partitions]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)

    @property
    def hanging(self) -> int:
        return sum(p.hanging for p in self.partitions)

    @property
    def log_end_offsets(self) -> int | None:
        ends = [p.log_end_offset for p in self.partitions]
        return None if any(e is None for e in ends) else sum(e or 0 for e in ends)


def topics_view(snapshot: Snapshot) -> tuple[TopicRow, ...]:
    """Every topic's partitions: offsets, open and hanging transactions."""
    ends = snapshot.log_end_offsets
    stable = snapshot.stable_offsets
    producers = snapshot.producers
    hanging = Counter(t.topic_partition for t in snapshot.hanging or ())
    rows = []
    for name, count in sorted((snapshot.topics or {}).items()):
        partitions = []
        for p in range(count):
            tp = TopicPartition(name, p)
            open_count = None
            if producers is not None and tp in producers:
                open_count = sum(
                    1 for s in producers[tp] if s.current_transaction_start_offset >= 0
                )
            partitions.append(
                PartitionRow(
                    partition=p,
                    log_end_offset=None if ends is None else ends.get(tp),
                    last_stable_offset=None if stable is None else stable.get(tp),
                    open_transactions=open_count,
                    hanging=hanging[tp],
                )
            )
        rows.append(TopicRow(name, tuple(partitions)))
    return tuple(rows)


# --- transactions -------------------------------------------------------------------


@dataclass(frozen=True)
class TransactionRow:
    transactional_id: str
    producer_id: int
    state: str
    #: Since the transaction began; None when none is open.
    age_ms: int | None
    producer_epoch: int | None = None
    timeout_ms: int | None = None
    partitions: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    #: Markers the coordinator still owes, with the last error of each delivery.
    pending_markers: tuple[str, ...] = ()
    #: Open longer than its timeout (the coordinator should have ended it).
    overdue: bool = False
    #: The commands that end it: on its partitions when overdue and Ongoing;
    #: ``txn force-terminate`` when it waits for a two-phase commit's manager.
    commands: tuple[str, ...] = ()
    #: Ongoing for a producer in a two-phase commit (KIP-939): it waits for
    #: its transaction manager and never times out, so it is never overdue.
    two_phase: bool = False

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES


@dataclass(frozen=True)
class HangingRow:
    """A transaction open on a partition that no coordinator will end."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    start_offset: int
    #: Since the producer last wrote to the partition.
    silent_ms: int | None
    command: str
    #: The transactional ids the coordinators know with this producer id.
    transactional_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class TransactionsView:
    rows: tuple[TransactionRow, ...]
    hanging: tuple[HangingRow, ...]
    #: (state, how many) in state order of the rows.
    counts: tuple[tuple[str, int], ...]

    @property
    def overdue(self) -> tuple[TransactionRow, ...]:
        return tuple(r for r in self.rows if r.overdue)


def transactions_view(snapshot: Snapshot, connection: Sequence[str]) -> TransactionsView:
    """The transactional ids (open ones first, oldest first), the overdue ones
    and the hanging ones with the commands that end them."""
    now = snapshot.taken_ms
    rows = []
    for listing in snapshot.transactions or ():
        described = snapshot.descriptions.get(listing.transactional_id)
        age = listing.duration_ms if listing.duration_ms >= 0 else None
        if described is None or described.state != listing.state:
            rows.append(
                TransactionRow(listing.transactional_id, listing.producer_id, listing.state, age)
            )
            continue
        if described.transaction_start_time_ms >= 0 and described.state in OPEN_STATES:
            age = max(0, now - described.transaction_start_time_ms)
        partitions = sorted(described.partitions)
        two_phase = described.two_phase_commit and described.state == "Ongoing"
        overdue = not two_phase and age is not None and age > described.transaction_timeout_ms
        commands: tuple[str, ...] = ()
        if two_phase:
            commands = (force_terminate_command(listing.transactional_id, connection),)
        elif overdue and described.state == "Ongoing":
            epoch = (described.producer_id, described.producer_epoch)
            commands = tuple(abort_command(tp, connection, producer=epoch) for tp in partitions)
        rows.append(
            TransactionRow(
                transactional_id=listing.transactional_id,
                producer_id=described.producer_id,
                state=described.state,
                age_ms=age,
                producer_epoch=described.producer_epoch,
                timeout_ms=described.transaction_timeout_ms,
                partitions=tuple(_tp_name(tp) for tp in partitions),
                groups=tuple(sorted(described.groups)),
                pending_markers=tuple(str(m) for m in described.pending_markers),
                overdue=overdue,
                commands=commands,
                two_phase=two_phase,
            )
        )
    by_producer: dict[int, list[str]] = {}
    for listing in snapshot.transactions or ():
        by_producer.setdefault(listing.producer_id, []).append(listing.transactional_id)
    rows.sort(
        key=lambda r: (not r.is_open, -(r.age_ms or 0) if r.is_open else 0, r.transactional_id)
    )
    hanging = tuple(
        HangingRow(
            topic=t.topic_partition.topic,
            partition=t.topic_partition.partition,
            producer_id=t.producer.producer_id,
            producer_epoch=t.producer.producer_epoch,
            coordinator_epoch=t.producer.coordinator_epoch,
            start_offset=t.producer.current_transaction_start_offset,
            silent_ms=(
                now - t.producer.last_timestamp_ms if t.producer.last_timestamp_ms >= 0 else None
            ),
            command=abort_command(
                t.topic_partition,
                connection,
                start_offset=t.producer.current_transaction_start_offset,
            ),
            transactional_ids=tuple(sorted(by_producer.get(t.producer.producer_id, ()))),
        )
        for t in snapshot.hanging or ()
    )
    counts = Counter(r.state for r in rows)
    return TransactionsView(tuple(rows), hanging, tuple(sorted(counts.items())))


# --- producers ----------------------------------------------------------------------


@dataclass(frozen=True)
class ProducerRow:
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    last_sequence: int
    #: Since its last batch or marker on the partition.
    last_write_ms: int | None
    #: First offset of its open transaction on the partition; None when none.
    open_since: int | None
    hanging: bool


def producers_view(snapshot: Snapshot) -> tuple[ProducerRow, ...]:
    """The producers every partition keeps state for, by partition and id."""
    hanging = {(t.topic_partition, t.producer.producer_id) for t in snapshot.hanging or ()}
    now = snapshot.taken_ms
    return tuple(
        ProducerRow(
            topic=tp.topic,
            partition=tp.partition,
            producer_id=p.producer_id,
            producer_epoch=p.producer_epoch,
            coordinator_epoch=p.coordinator_epoch,
            last_sequence=p.last_sequence,
            last_write_ms=now - p.last_timestamp_ms if p.last_timestamp_ms >= 0 else None,
            open_since=(
                p.current_transaction_start_offset
                if p.current_transaction_start_offset >= 0
                else None
            ),
            hanging=(tp, p.producer_id) in hanging,
        )
        for tp, states in sorted((snapshot.producers or {}).items())
        for p in sorted(states, key=lambda s: s.producer_id)
    )


# --- consumer groups ----------------------------------------------------------------


@dataclass(frozen=True)
class MemberRow:
    member_id: str
    client_id: str
    group_instance_id: str | None


@dataclass(frozen=True)
class GroupOffsetRow:
    topic: str
    partition: int
    committed: int
    #: The high watermark, as Kafka's kafka-consumer-groups reads it.
    log_end_offset: int | None
    last_stable_offset: int | None

    @property
    def lag(self) -> int | None:
        """The log end offset minus the committed offset, as
        kafka-consumer-groups computes LAG: the same figure for
        read_committed and read_uncommitted members. None when the log end
        offset is not known, or is below the committed offset (an offset
        committed past the log's end): never a negative lag."""
        if self.log_end_offset is None or self.past_log_end:
            return None
        return self.log_end_offset - self.committed

    @property
    def past_log_end(self) -> bool:
        """The committed offset is past the log end offset."""
        return self.log_end_offset is not None and self.committed > self.log_end_offset

    @property
    def held_back(self) -> int | None:
        """Of the lag, the offsets at or past the last stable offset: open
        transactions hold them back from read_committed members, which
        cannot read them yet however fast they are."""
        if self.lag is None or self.log_end_offset is None or self.last_stable_offset is None:
            return None
        return self.log_end_offset - max(self.committed, self.last_stable_offset)


@dataclass(frozen=True)
class GroupRow:
    group_id: str
    state: str
    generation_id: int | None
    protocol_type: str
    partition_assignor: str
    leader: str
    members: tuple[MemberRow, ...]
    offsets: tuple[GroupOffsetRow, ...]

    @property
    def lag(self) -> int | None:
        lags = [o.lag for o in self.offsets]
        return None if any(lag is None for lag in lags) else sum(lag or 0 for lag in lags)


def groups_view(snapshot: Snapshot) -> tuple[GroupRow, ...]:
    """Each consumer group known: members, generation, committed offsets and
    lag behind the log end offset."""
    ends = snapshot.log_end_offsets
    stable = snapshot.stable_offsets
    names = sorted(set(snapshot.groups) | set(snapshot.group_offsets))
    rows = []
    for name in names:
        group = snapshot.groups.get(name)
        offsets = tuple(
            GroupOffsetRow(
                tp.topic,
                tp.partition,
                committed,
                None if ends is None else ends.get(tp),
                None if stable is None else stable.get(tp),
            )
            for tp, committed in sorted(snapshot.group_offsets.get(name, {}).items())
        )
        if group is None:
            rows.append(GroupRow(name, "-", None, "", "", "", (), offsets))
            continue
        rows.append(
            GroupRow(
                group_id=name,
                state=group.state,
                generation_id=group.generation_id,
                protocol_type=group.protocol_type,
                partition_assignor=group.partition_assignor,
                leader=group.leader,
                members=tuple(
                    MemberRow(m.member_id, m.client_id, m.group_instance_id) for m in group.members
                ),
                offsets=offsets,
            )
        )
    return tuple(rows)
