"""One shard's replicated state and its single apply entry point."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import msgpack

from fsm import membership, transactions
from fsm import offsets as group_offsets
from fsm.commands import (
    AbortTimedOut,
    AddOffsets,
    AddPartitions,
    AllocatePidBlock,
    AlterPartition,
    Command,
    CreateAcls,
    CreateTopic,
    DeleteAcls,
    DeleteScramCredential,
    ElectPreferredLeaders,
    EndTxn,
    ExpireTransactionalIds,
    FenceNode,
    GroupMarker,
    GroupTimeouts,
    Heartbeat,
    InitProducerId,
    JoinGroup,
    LeaveGroup,
    MarkersWritten,
    OffsetCommit,
    RegisterDirectory,
    ReserveOffsets,
    SyncGroup,
    TxnOffsetCommit,
    UnfenceNode,
    UpsertScramCredential,
    decode_entry,
)
from fsm.config import FsmConfig
from fsm.effects import Effect, Outcome, WriteMarkers, fail
from fsm.errors import CommandError, ErrorCode, IllegalTransition
from fsm.limits import topic_error
from fsm.membership import GroupMembership, GroupState
from fsm.metadata import NO_PRODUCER_ID, TopicPartition, TransactionMetadata
from fsm.offsets import FetchedOffset, GroupOffsets
from fsm.partitions import (
    MAX_INT32,
    NO_LEADER,
    PartitionRegistration,
    TopicRegistration,
    alter_isr,
    assignment_error,
    elect_preferred,
    fence,
    new_topic,
    registration_error,
    single_replica_topic,
    unfence,
)
from fsm.states import IDLE_STATES, PREPARE_STATES, TxnState
from fsm.wire import as_bytes, as_int, as_list, as_str, check_version
from pid_allocator import DEFAULT_BLOCK_SIZE, PidBlockRecord, PidExhausted, PidLayout
from raftcoord.protocol.acl import MAX_ACLS, Acl, acl_from_wire, binding_error
from raftcoord.protocol.limits import MAX_OFFSET, is_directory_id
from raftcoord.protocol.scram import MECHANISMS, ScramCredential, credential_error

SNAPSHOT_VERSION = 5
#: The most SCRAM credentials a cluster holds.
MAX_USERS = 10_000
#: Records per piece of :func:`snapshot_pieces` (about a millisecond of encoding).
SNAPSHOT_PIECE_RECORDS = 500
#: In the answer to a command whose handler attempted a transition the rules
#: forbid (:class:`~fsm.errors.IllegalTransition`): a bug, never a property of
#: the request. Tests assert no command sequence produces it.
HANDLER_BUG = "a handler bug"


@dataclass
class ShardState:
    """Everything one shard replicates. Equal states snapshot to equal bytes."""

    pids: PidBlockRecord
    last_assigned_pid: int = NO_PRODUCER_ID
    transactions: dict[str, TransactionMetadata] = field(default_factory=dict)
    groups: dict[str, GroupOffsets] = field(default_factory=dict)
    #: Consumer groups' members and generations (:mod:`fsm.membership`).
    memberships: dict[str, GroupMembership] = field(default_factory=dict)
    #: Topic name -> its partitions' replicas, leaders and in-sync replicas
    #: (shard 0 only; :mod:`fsm.partitions`).
    topics: dict[str, TopicRegistration] = field(default_factory=dict)
    #: The partition-log nodes whose lease expired and that have not
    #: heartbeated since (shard 0 only; :class:`fsm.commands.FenceNode`).
    fenced_nodes: frozenset[int] = frozenset()
    #: Partition-log node id -> the directory id of its data directory on
    #: record (shard 0 only; :class:`fsm.commands.RegisterDirectory`).
    directories: dict[int, str] = field(default_factory=dict)
    #: Topic name -> the offset ceiling reserved for each partition; a topic
    #: without reservations is missing (shard 0 only; :class:`fsm.commands.ReserveOffsets`).
    offset_ceilings: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: The access-control bindings (shard 0 only; :class:`fsm.commands.CreateAcls`).
    acls: frozenset[Acl] = frozenset()
    #: (user, mechanism) -> SCRAM credential (shard 0 only; the Kafka
    #: gateways' SASL users, :class:`fsm.commands.UpsertScramCredential`).
    scram: dict[tuple[str, str], ScramCredential] = field(default_factory=dict)


@dataclass(frozen=True)
class TransactionListing:
    """One row of ListTransactions."""

    transactional_id: str
    producer_id: int
    state: TxnState
    duration_ms: int


class TransactionStateMachine:
    """The deterministic state machine of one shard (transaction-log partition).

    Every replica applies the same commands in the same order and reaches the
    same state. :meth:`apply` is total: it never raises for a command, it
    answers an error and changes nothing. The leader validates requests
    before proposing them, but whatever reaches the log must apply on every
    replica alike, so a command that would break one of the core's
    invariants is refused too (UNKNOWN_SERVER_ERROR), deterministically,
    never raised; an illegal transition is such a refusal marked
    :data:`HANDLER_BUG` (the pure handlers raise it). Handlers compute the
    new state before storing any of it, so a refusal leaves the state
    untouched. Queries read the applied state; the shell must make sure it
    is still leader before serving them as current.
    """

    def __init__(
        self,
        shard: int,
        shard_count: int,
        config: FsmConfig | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> None:
        self.config = config or FsmConfig()
        self.state = ShardState(PidBlockRecord(PidLayout(shard, shard_count, block_size)))

    # --- applying commands ---------------------------------------------------------

    def apply(self, command: Command) -> Outcome:
        """Apply one command; returns the result and the effects to perform."""
        handler = self._HANDLERS.get(type(command))
        if handler is None:
            return fail(ErrorCode.INVALID_REQUEST, f"unknown command {type(command).__name__}")
        try:
            outcome: Outcome = handler(self, command)
        except (MemoryError, RecursionError):
            raise  # a property of this process, not of the command: not deterministic
        except IllegalTransition as exc:  # a handler bug: it moved against the rules table
            return fail(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"{type(command).__name__} refused, {HANDLER_BUG}: {exc}",
            )
        except Exception as exc:  # a bug or a hostile entry; every replica refuses alike
            return fail(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"{type(command).__name__} refused, it breaks an invariant: "
                f"{type(exc).__name__}: {exc}",
            )
        return outcome

    def apply_entry(self, data: bytes) -> list[Outcome]:
        """Apply a Raft entry (one or more commands, see :mod:`fsm.commands`).

        A command that does not decode is answered INVALID_REQUEST; the
        others still apply. An entry that does not decode at all applies
        nothing and yields one INVALID_REQUEST outcome.
        """
        try:
            commands = decode_entry(data)
        except CommandError as exc:
            return [fail(ErrorCode.INVALID_REQUEST, str(exc))]
        return [
            fail(ErrorCode.INVALID_REQUEST, str(c))
            if isinstance(c, CommandError)
            else self.apply(c)
            for c in commands
        ]

    def _transaction_step(
        self,
        transactional_id: str,
        step: Callable[[TransactionMetadata | None], transactions.Step],
        new_producer_id: int = NO_PRODUCER_ID,
    ) -> Outcome:
        if new_producer_id != NO_PRODUCER_ID and not self._fresh_producer_id(new_producer_id):
            return fail(
                ErrorCode.INVALID_REQUEST,
                f"producer id {new_producer_id} is not a fresh id of a block granted to this shard",
            )
        before = self.state.transactions.get(transactional_id)
        result = step(before)
        after = result.meta
        if after is not before:
            if after is None:
                self.state.transactions.pop(transactional_id, None)
            else:
                self.state.transactions[transactional_id] = after
                if new_producer_id != NO_PRODUCER_ID and new_producer_id in (
                    after.producer_id,
                    after.next_producer_id,
                ):
                    self.state.last_assigned_pid = new_producer_id
        return result.outcome

    def _fresh_producer_id(self, producer_id: int) -> bool:
        return self.state.pids.granted(producer_id) and producer_id > self.state.last_assigned_pid

    def _init(self, cmd: InitProducerId) -> Outcome:
        return self._transaction_step(
            cmd.transactional_id,
            lambda meta: transactions.init_producer_id(meta, cmd, self.config),
            cmd.new_producer_id,
        )

    def _add_partitions(self, cmd: AddPartitions) -> Outcome:
        return self._transaction_step(
            cmd.transactional_id, lambda meta: transactions.add_partitions(meta, cmd, self.config)
        )

    def _add_offsets(self, cmd: AddOffsets) -> Outcome:
        return self._transaction_step(
            cmd.transactional_id, lambda meta: transactions.add_offsets(meta, cmd, self.config)
        )

    def _end_txn(self, cmd: EndTxn) -> Outcome:
        return self._transaction_step(
            cmd.transactional_id,
            lambda meta: transactions.end_txn(meta, cmd, self.config),
            cmd.new_producer_id,
        )

    def _markers_written(self, cmd: MarkersWritten) -> Outcome:
        return self._transaction_step(
            cmd.transactional_id, lambda meta: transactions.markers_written(meta, cmd)
        )

    def _abort_timed_out(self, cmd: AbortTimedOut) -> Outcome:
        return self._transaction_step(
            cmd.transactional_id, lambda meta: transactions.abort_timed_out(meta, cmd, self.config)
        )

    def _expire(self, cmd: ExpireTransactionalIds) -> Outcome:
        expired: list[str] = []
        effects: list[Effect] = []
        for transactional_id in dict.fromkeys(cmd.transactional_ids):
            meta = self.state.transactions.get(transactional_id)
            if meta is None or not transactions.expirable(meta, cmd.now_ms, self.config):
                continue
            dead = transactions.expire(meta, cmd.now_ms)
            expired.append(transactional_id)
            effects.append(transactions.moved(meta, dead, cmd.now_ms))
        for transactional_id in expired:  # all or nothing (see the class docstring)
            del self.state.transactions[transactional_id]
        return Outcome(expired=tuple(expired), effects=tuple(effects))

    def _group_step(
        self,
        group_id: str,
        step: Callable[[GroupOffsets | None], tuple[GroupOffsets | None, Outcome]],
    ) -> Outcome:
        before = self.state.groups.get(group_id)
        after, outcome = step(before)
        if after is not before and after is not None:
            self.state.groups[group_id] = after
        return outcome

    def _txn_offset_commit(self, cmd: TxnOffsetCommit) -> Outcome:
        refusal = membership.offset_commit_refusal(
            self.state.memberships.get(cmd.group_id),
            cmd.generation_id,
            cmd.member_id,
            cmd.group_instance_id,
            transactional=True,
        )
        if refusal is not None:
            return fail(*refusal)
        return self._group_step(
            cmd.group_id, lambda g: group_offsets.txn_offset_commit(g, cmd, self.config)
        )

    def _group_marker(self, cmd: GroupMarker) -> Outcome:
        return self._group_step(cmd.group_id, lambda g: group_offsets.group_marker(g, cmd))

    def _offset_commit(self, cmd: OffsetCommit) -> Outcome:
        refusal = membership.offset_commit_refusal(
            self.state.memberships.get(cmd.group_id),
            cmd.generation_id,
            cmd.member_id,
            cmd.group_instance_id,
            transactional=False,
        )
        if refusal is not None:
            return fail(*refusal)
        return self._group_step(
            cmd.group_id, lambda g: group_offsets.offset_commit(g, cmd, self.config)
        )

    def _membership_step(
        self,
        group_id: str,
        step: Callable[[GroupMembership | None], membership.Step],
    ) -> Outcome:
        after, outcome = step(self.state.memberships.get(group_id))
        if after is not None:
            self.state.memberships[group_id] = after
        return outcome

    def _join_group(self, cmd: JoinGroup) -> Outcome:
        return self._membership_step(
            cmd.group_id, lambda g: membership.join_group(g, cmd, self.config)
        )

    def _sync_group(self, cmd: SyncGroup) -> Outcome:
        return self._membership_step(cmd.group_id, lambda g: membership.sync_group(g, cmd))

    def _heartbeat(self, cmd: Heartbeat) -> Outcome:
        return self._membership_step(cmd.group_id, lambda g: membership.heartbeat(g, cmd))

    def _leave_group(self, cmd: LeaveGroup) -> Outcome:
        return self._membership_step(
            cmd.group_id, lambda g: membership.leave_group(g, cmd, self.config)
        )

    def _group_timeouts(self, cmd: GroupTimeouts) -> Outcome:
        return self._membership_step(
            cmd.group_id, lambda g: membership.group_timeouts(g, cmd, self.config)
        )

    def _allocate_pid_block(self, cmd: AllocatePidBlock) -> Outcome:
        layout = self.state.pids.layout
        if (cmd.shard, cmd.shard_count, cmd.block_size) != (
            layout.shard,
            layout.shard_count,
            layout.block_size,
        ):
            return fail(
                ErrorCode.INVALID_REQUEST,
                f"block request for shard {cmd.shard}/{cmd.shard_count} (block size "
                f"{cmd.block_size}) does not match shard {layout.shard}/{layout.shard_count} "
                f"(block size {layout.block_size})",
            )
        try:
            block = self.state.pids.allocate()
        except PidExhausted as exc:
            return fail(ErrorCode.UNKNOWN_SERVER_ERROR, str(exc))
        return Outcome(block_first=block.first, block_end=block.end)

    def _create_topic(self, cmd: CreateTopic) -> Outcome:
        bad_name = topic_error(cmd.name)
        if bad_name is not None:
            return fail(ErrorCode.INVALID_TOPIC_EXCEPTION, bad_name)
        if not 1 <= len(cmd.partition_nodes) <= self.config.max_partitions_per_request:
            return fail(
                ErrorCode.INVALID_PARTITIONS,
                f"a topic needs 1..{self.config.max_partitions_per_request} partitions, "
                f"got {len(cmd.partition_nodes)}",
            )
        if any(node < 0 for node in cmd.partition_nodes):
            return fail(ErrorCode.INVALID_REQUEST, "partition-log node ids must not be negative")
        assignment = cmd.replicas or tuple((node,) for node in cmd.partition_nodes)
        if tuple(r[:1] for r in assignment) != tuple((n,) for n in cmd.partition_nodes):
            return fail(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                "each partition's replicas must start with its node in partition_nodes",
            )
        refusal = assignment_error(assignment, cmd.min_insync_replicas)
        if refusal is not None:
            return fail(*refusal)
        if cmd.name in self.state.topics:
            return fail(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {cmd.name!r} already exists")
        self.state.topics[cmd.name] = new_topic(
            assignment, cmd.min_insync_replicas, self.state.fenced_nodes
        )
        return Outcome()

    def _fence_node(self, cmd: FenceNode) -> Outcome:
        if not 0 <= cmd.node_id <= MAX_INT32:
            return fail(ErrorCode.INVALID_REQUEST, f"bad partition-log node id {cmd.node_id}")
        fenced = self.state.fenced_nodes | {cmd.node_id}
        refusal = self._move_partitions(lambda p: fence(p, cmd.node_id, fenced))
        if refusal is None:
            self.state.fenced_nodes = fenced
        return refusal or Outcome()

    def _unfence_node(self, cmd: UnfenceNode) -> Outcome:
        if cmd.node_id not in self.state.fenced_nodes:
            return Outcome()
        refusal = self._move_partitions(lambda p: unfence(p, cmd.node_id))
        if refusal is None:
            self.state.fenced_nodes = self.state.fenced_nodes - {cmd.node_id}
        return refusal or Outcome()

    def _alter_partition(self, cmd: AlterPartition) -> Outcome:
        topic = self.state.topics.get(cmd.topic)
        if topic is None or not 0 <= cmd.partition < len(topic.partitions):
            return fail(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {cmd.topic}-{cmd.partition}"
            )
        current = topic.partitions[cmd.partition]
        altered = alter_isr(
            current,
            cmd.leader,
            cmd.leader_epoch,
            cmd.partition_epoch,
            cmd.isr,
            self.state.fenced_nodes,
        )
        if isinstance(altered, tuple):
            return fail(*altered)
        if (problem := registration_error(altered)) is not None:
            return fail(ErrorCode.UNKNOWN_SERVER_ERROR, problem)
        if altered is not current:
            partitions = list(topic.partitions)
            partitions[cmd.partition] = altered
            self.state.topics[cmd.topic] = replace(topic, partitions=tuple(partitions))
        return Outcome()

    def _elect_preferred_leaders(self, cmd: ElectPreferredLeaders) -> Outcome:
        nodes, fenced = frozenset(cmd.nodes), self.state.fenced_nodes
        refusal = self._move_partitions(
            lambda p: elect_preferred(p, fenced) if p.replicas[0] in nodes else p
        )
        return refusal or Outcome()

    def _move_partitions(
        self, move: Callable[[PartitionRegistration], PartitionRegistration]
    ) -> Outcome | None:
        """Apply ``move`` to every partition, all or nothing: a move that
        would break a registration's invariants (an epoch past int32) changes
        nothing and is the refusal returned. Topics none of whose partitions
        moved keep their registration object."""
        moved: dict[str, TopicRegistration] = {}
        for name, topic in self.state.topics.items():
            partitions = tuple(move(p) for p in topic.partitions)
            if partitions == topic.partitions:
                continue
            for p in partitions:
                if (problem := registration_error(p)) is not None:
                    return fail(ErrorCode.UNKNOWN_SERVER_ERROR, f"topic {name!r}: {problem}")
            moved[name] = replace(topic, partitions=partitions)
        self.state.topics.update(moved)
        return None

    def _register_directory(self, cmd: RegisterDirectory) -> Outcome:
        if cmd.node_id < 0:
            return fail(ErrorCode.INVALID_REQUEST, "partition-log node ids must not be negative")
        if not is_directory_id(cmd.directory_id):
            return fail(ErrorCode.INVALID_REQUEST, f"bad directory id {cmd.directory_id!r}")
        on_record = self.state.directories.get(cmd.node_id)
        if on_record not in (None, cmd.directory_id) and not cmd.replace:
            return fail(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"partition-log node {cmd.node_id} has directory {on_record} on record, "
                f"not {cmd.directory_id}",
            )
        self.state.directories[cmd.node_id] = cmd.directory_id
        return Outcome()

    def _reserve_offsets(self, cmd: ReserveOffsets) -> Outcome:
        on_record = self.state.directories.get(cmd.node_id)
        if on_record != cmd.directory_id:
            return fail(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"directory {cmd.directory_id} of partition-log node {cmd.node_id} is not "
                f"the one on record ({on_record or 'none'})",
            )
        most = self.config.max_partitions_per_request
        if len(cmd.reservations) > most:
            return fail(ErrorCode.INVALID_REQUEST, f"more than {most} reservations")
        ceilings: dict[str, tuple[int, ...]] = {}
        for topic, index, ceiling in cmd.reservations:
            registered = self.state.topics.get(topic)
            if registered is None or not 0 <= index < len(registered.partitions):
                return fail(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {topic}-{index}")
            leader = registered.partitions[index].leader
            if leader != cmd.node_id:
                return fail(
                    ErrorCode.NOT_LEADER_OR_FOLLOWER,
                    f"{topic}-{index} is led by partition-log node {leader}",
                )
            if not 0 <= ceiling <= MAX_OFFSET:
                return fail(ErrorCode.INVALID_REQUEST, f"offset ceiling {ceiling} out of range")
            current = ceilings.get(topic) or self.offset_ceilings(topic)
            if ceiling > current[index]:
                ceilings[topic] = (*current[:index], ceiling, *current[index + 1 :])
        self.state.offset_ceilings.update(ceilings)
        return Outcome()

    def _create_acls(self, cmd: CreateAcls) -> Outcome:
        for acl in cmd.acls:
            if (problem := binding_error(acl)) is not None:
                return fail(ErrorCode.INVALID_REQUEST, f"{acl.describe()}: {problem}")
        acls = self.state.acls | frozenset(cmd.acls)
        if len(acls) > MAX_ACLS:
            return fail(ErrorCode.INVALID_REQUEST, f"a cluster holds at most {MAX_ACLS} ACLs")
        self.state.acls = acls
        return Outcome()

    def _delete_acls(self, cmd: DeleteAcls) -> Outcome:
        left = self.state.acls
        deleted = []
        for f in cmd.filters:  # a binding is listed under the first filter that matches it
            matched = sorted((a for a in left if f.matches(a)), key=Acl.to_wire)
            left = left.difference(matched)
            deleted.append(tuple(matched))
        self.state.acls = left
        return Outcome(deleted=tuple(deleted))

    def _upsert_scram(self, cmd: UpsertScramCredential) -> Outcome:
        problem = credential_error(cmd.user, cmd.mechanism, cmd.iterations, cmd.salt)
        if problem is None:
            size = hashlib.new(MECHANISMS[cmd.mechanism]).digest_size
            if len(cmd.stored_key) != size or len(cmd.server_key) != size:
                problem = f"{cmd.mechanism} keys are {size} bytes"
        if problem is not None:
            return fail(ErrorCode.INVALID_REQUEST, problem)
        key = (cmd.user, cmd.mechanism)
        if key not in self.state.scram and len(self.state.scram) >= MAX_USERS:
            return fail(ErrorCode.INVALID_REQUEST, f"at most {MAX_USERS} credentials")
        self.state.scram[key] = ScramCredential(
            cmd.salt, cmd.iterations, cmd.stored_key, cmd.server_key
        )
        return Outcome()

    def _delete_scram(self, cmd: DeleteScramCredential) -> Outcome:
        if self.state.scram.pop((cmd.user, cmd.mechanism), None) is None:
            return fail(
                ErrorCode.RESOURCE_NOT_FOUND,
                f"user {cmd.user[:64]!r} has no {cmd.mechanism[:40]} credential",
            )
        return Outcome()

    _HANDLERS: ClassVar[dict[type[Command], Callable[[Any, Any], Outcome]]] = {
        InitProducerId: _init,
        AddPartitions: _add_partitions,
        AddOffsets: _add_offsets,
        EndTxn: _end_txn,
        MarkersWritten: _markers_written,
        AbortTimedOut: _abort_timed_out,
        ExpireTransactionalIds: _expire,
        TxnOffsetCommit: _txn_offset_commit,
        GroupMarker: _group_marker,
        OffsetCommit: _offset_commit,
        AllocatePidBlock: _allocate_pid_block,
        CreateTopic: _create_topic,
        JoinGroup: _join_group,
        SyncGroup: _sync_group,
        Heartbeat: _heartbeat,
        LeaveGroup: _leave_group,
        GroupTimeouts: _group_timeouts,
        RegisterDirectory: _register_directory,
        ReserveOffsets: _reserve_offsets,
        CreateAcls: _create_acls,
        DeleteAcls: _delete_acls,
        UpsertScramCredential: _upsert_scram,
        DeleteScramCredential: _delete_scram,
        FenceNode: _fence_node,
        AlterPartition: _alter_partition,
        ElectPreferredLeaders: _elect_preferred_leaders,
        UnfenceNode: _unfence_node,
    }

    # --- what the leader asks before proposing -------------------------------------

    def preview(self, command: WaitingCommand) -> transactions.Step:
        """The step ``command``'s pure handler takes on the current metadata
        (what the leader asks before proposing); nothing is kept.

        Raises:
            Exception: what the handler raises (its apply answers it).
        """
        meta = self.state.transactions.get(command.transactional_id)
        return _WAITING_STEPS[type(command)](meta, command, self.config)

    def needs_new_producer_id(self, command: InitProducerId | EndTxn) -> bool:
        """Whether the leader must stamp a fresh producer id into ``command``:
        applied now, it would take one (create the id or rotate it).

        If the state changes between this answer and the apply, the handler
        answers CONCURRENT_TRANSACTIONS and the client retries.
        """
        try:
            after = self.preview(replace(command, new_producer_id=_PROBE_PRODUCER_ID)).meta
        except Exception:  # its apply answers it: no id needed
            return False
        return after is not None and _PROBE_PRODUCER_ID in (
            after.producer_id,
            after.next_producer_id,
        )

    def waits_for_completion(self, command: Command) -> bool:
        """Whether ``command`` would only be answered CONCURRENT_TRANSACTIONS,
        changing nothing, because its transaction's markers are being written
        (Prepare*): the leader then holds it until the completion applies
        instead of proposing it."""
        if not isinstance(command, WAITING_COMMANDS):
            return False
        meta = self.state.transactions.get(command.transactional_id)
        if meta is None or meta.state not in PREPARE_STATES:
            return False
        try:
            result = self.preview(command)
        except Exception:  # its apply answers it: propose it
            return False
        return result.meta is meta and result.outcome.error is ErrorCode.CONCURRENT_TRANSACTIONS

    def timed_out(self, now_ms: int) -> list[AbortTimedOut]:
        """Abort commands for every Ongoing transaction past its timeout
        (``coordinator_epoch`` left 0 for the leader to stamp)."""
        return [
            AbortTimedOut(m.transactional_id, m.producer_id, m.producer_epoch, now_ms, 0)
            for m in self.state.transactions.values()
            if transactions.has_timed_out(m, now_ms)
        ]

    def expirable_ids(self, now_ms: int) -> list[str]:
        """Transactional ids idle for longer than transactional.id.expiration.ms."""
        return sorted(
            m.transactional_id
            for m in self.state.transactions.values()
            if transactions.expirable(m, now_ms, self.config)
        )

    def offset_ceilings(self, topic: str) -> tuple[int, ...]:
        """The offset ceiling reserved for each partition of ``topic`` (0: none
        yet); empty for an unknown topic."""
        registered = self.state.topics.get(topic)
        count = 0 if registered is None else len(registered.partitions)
        return self.state.offset_ceilings.get(topic) or (0,) * count

    def latest_stamp_ms(self) -> int:
        """The highest leader timestamp the state holds (a transaction's last
        change, a group member last seen), 0 for none: a new leader's clock
        starts no lower, so the timestamps the shard replicates never move
        backwards across a failover."""
        latest = max((m.last_update_ms for m in self.state.transactions.values()), default=0)
        for group in self.state.memberships.values():
            latest = max(latest, max((m.last_seen_ms for m in group.members.values()), default=0))
        return latest

    def groups_due(self, now_ms: int, leader_since_ms: int) -> list[str]:
        """Groups with a session, pending member id or rebalance past its
        time at ``now_ms`` (the leader, leading since ``leader_since_ms``,
        proposes GroupTimeouts for each)."""
        return sorted(
            gid
            for gid, g in self.state.memberships.items()
            if membership.due(g, now_ms, leader_since_ms)
        )

    def pending_markers(self) -> list[WriteMarkers]:
        """The markers every Prepare* transaction still owes (a new leader resends them)."""
        return [
            transactions.markers_for(m)
            for _, m in sorted(self.state.transactions.items())
            if m.state in PREPARE_STATES
        ]

    # --- queries -------------------------------------------------------------------

    def describe(self, transactional_id: str) -> TransactionMetadata | None:
        """The metadata of one id, or None (TRANSACTIONAL_ID_NOT_FOUND)."""
        return self.state.transactions.get(transactional_id)

    def list_transactions(
        self,
        now_ms: int,
        states: Iterable[TxnState] = (),
        producer_ids: Iterable[int] = (),
        min_duration_ms: int = -1,
    ) -> list[TransactionListing]:
        """ListTransactions: empty filters match everything; ``min_duration_ms``
        keeps only open transactions running longer than it (-1: no filter)."""
        wanted_states, wanted_pids = frozenset(states), frozenset(producer_ids)
        rows = []
        for tid, meta in sorted(self.state.transactions.items()):
            is_open = meta.state not in IDLE_STATES and meta.txn_start_ms >= 0
            duration = now_ms - meta.txn_start_ms if is_open else -1
            if wanted_states and meta.state not in wanted_states:
                continue
            if wanted_pids and meta.producer_id not in wanted_pids:
                continue
            if min_duration_ms >= 0 and duration <= min_duration_ms:
                continue
            rows.append(TransactionListing(tid, meta.producer_id, meta.state, duration))
        return rows

    def offset_fetch(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition] | None = None,
        require_stable: bool = True,
    ) -> list[FetchedOffset]:
        """OffsetFetch for one group (see :func:`fsm.offsets.offset_fetch`)."""
        return group_offsets.offset_fetch(
            self.state.groups.get(group_id), partitions, require_stable
        )

    def group(self, group_id: str) -> GroupMembership | None:
        """The membership of one consumer group, or None (never joined)."""
        return self.state.memberships.get(group_id)

    def group_state(self, group_id: str) -> str:
        """Kafka's state name of a consumer group: its membership's; Empty
        for a group that only has offsets (committed, or pending in a
        transaction), as Kafka's group coordinator creates a group on its
        first offset commit; Dead for a group this shard does not know."""
        joined = self.state.memberships.get(group_id)
        if joined is not None:
            return joined.state.value
        return GroupState.EMPTY.value if group_id in self.state.groups else "Dead"

    def list_groups(self) -> list[tuple[str, str]]:
        """ListGroups: (group id, state name) of every group this shard
        knows (it joined, or it has offsets), by group id."""
        known = self.state.memberships.keys() | self.state.groups.keys()
        return [(gid, self.group_state(gid)) for gid in sorted(known)]

    # --- snapshots -----------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The whole state as msgpack bytes (deterministic: equal states, equal bytes)."""
        return encode_snapshot(self.state)

    def frozen_state(self) -> ShardState:
        """A copy of the state that applying later commands leaves unchanged,
        to encode with :func:`encode_snapshot` while this machine moves on.

        The maps are copied and their values shared: every value (transaction
        metadata, group offsets and memberships, topic tuples) is immutable and
        handlers replace it rather than change it. The pid record is the one
        mutable part and is copied. Costs one pointer copy per key.
        """
        s = self.state
        return ShardState(
            pids=replace(s.pids),
            last_assigned_pid=s.last_assigned_pid,
            transactions=dict(s.transactions),
            groups=dict(s.groups),
            memberships=dict(s.memberships),
            topics=dict(s.topics),
            fenced_nodes=s.fenced_nodes,
            directories=dict(s.directories),
            offset_ceilings=dict(s.offset_ceilings),
            acls=s.acls,
            scram=dict(s.scram),
        )

    @classmethod
    def restore(cls, data: bytes, config: FsmConfig | None = None) -> TransactionStateMachine:
        """A machine whose state is the snapshot ``data``.

        Raises:
            CommandError: the snapshot is malformed or of an unknown version.
        """
        try:
            payload = msgpack.unpackb(data, raw=False, strict_map_key=True)
        except Exception as exc:  # msgpack raises several unrelated types
            raise CommandError(f"snapshot is not valid msgpack: {exc}") from exc
        keys = {
            "v",
            "pids",
            "last_assigned_pid",
            "transactions",
            "groups",
            "topics",
            "fenced_nodes",
            "memberships",
            "directories",
            "offset_ceilings",
            "acls",
            "scram",
        }
        if not isinstance(payload, dict):
            raise CommandError(f"a snapshot must be a map with the keys {sorted(keys)}")
        if type(payload.get("v")) is int and payload["v"] == 1 and "memberships" not in payload:
            # Version 1 came before consumer-group membership: there are none.
            payload = {**payload, "v": 2, "memberships": []}
        if type(payload.get("v")) is int and payload["v"] == 2 and "directories" not in payload:
            # Version 2 came before directories and offset reservations: none.
            payload = {**payload, "v": 3, "directories": [], "offset_ceilings": []}
        if type(payload.get("v")) is int and payload["v"] == 3 and "acls" not in payload:
            # Version 3 came before access-control lists: none.
            payload = {**payload, "v": 4, "acls": [], "scram": []}
        if type(payload.get("v")) is int and payload["v"] == 4:
            # Version 4 came before replicas: each partition's node held its one copy.
            payload = {
                **payload,
                "v": SNAPSHOT_VERSION,
                "topics": [
                    [name, single_replica_topic(as_int(n) for n in as_list(nodes)).to_wire()]
                    for name, nodes in as_list(payload.get("topics"), 2)
                ],
                "fenced_nodes": [],
            }
        check_version(payload.get("v"), SNAPSHOT_VERSION, "snapshot")
        if set(payload) != keys:
            raise CommandError(f"a snapshot must be a map with the keys {sorted(keys)}")
        try:
            pids = PidBlockRecord.from_wire(payload["pids"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        txn_metas = [TransactionMetadata.from_wire(w) for w in as_list(payload["transactions"])]
        groups = [
            (as_str(gid), GroupOffsets.from_wire(w)) for gid, w in as_list(payload["groups"], 2)
        ]
        machine = cls(pids.layout.shard, pids.layout.shard_count, config, pids.layout.block_size)
        machine.state = ShardState(
            pids=pids,
            last_assigned_pid=as_int(payload["last_assigned_pid"]),
            transactions={m.transactional_id: m for m in txn_metas},
            groups=dict(groups),
            topics={
                as_str(name): TopicRegistration.from_wire(topic)
                for name, topic in as_list(payload["topics"], 2)
            },
            fenced_nodes=_fenced_from_wire(payload["fenced_nodes"]),
            memberships={
                as_str(gid): GroupMembership.from_wire(w)
                for gid, w in as_list(payload["memberships"], 2)
            },
            directories={
                as_int(node): as_str(directory)
                for node, directory in as_list(payload["directories"], 2)
            },
            offset_ceilings={
                as_str(topic): tuple(as_int(c) for c in as_list(ceilings))
                for topic, ceilings in as_list(payload["offset_ceilings"], 2)
            },
            acls=_acls_from_wire(payload["acls"]),
            scram={
                (as_str(user), as_str(mechanism)): ScramCredential(
                    as_bytes(salt), as_int(iterations), as_bytes(stored), as_bytes(server)
                )
                for user, mechanism, salt, iterations, stored, server in as_list(
                    payload["scram"], 6
                )
            },
        )
        fenced = machine.state.fenced_nodes
        for name, topic in machine.state.topics.items():
            if any(p.leader != NO_LEADER and p.leader in fenced for p in topic.partitions):
                raise CommandError(f"topic {name!r} is led by a fenced node")
        return machine


#: The requests Kafka answers CONCURRENT_TRANSACTIONS while the previous
#: transaction completes (a leader parks them instead).
WAITING_COMMANDS: tuple[
    type[InitProducerId], type[AddPartitions], type[AddOffsets], type[EndTxn]
] = (InitProducerId, AddPartitions, AddOffsets, EndTxn)

WaitingCommand = InitProducerId | AddPartitions | AddOffsets | EndTxn

#: A producer id no block hands out: stamped into a command to see whether
#: its handler would take it (:meth:`TransactionStateMachine.needs_new_producer_id`).
_PROBE_PRODUCER_ID = 2**63 - 1

#: The pure handlers of the requests a completing transaction holds up
#: (:meth:`TransactionStateMachine.preview`).
_WAITING_STEPS: dict[type[Command], Callable[[Any, Any, FsmConfig], transactions.Step]] = {
    InitProducerId: transactions.init_producer_id,
    AddPartitions: transactions.add_partitions,
    AddOffsets: transactions.add_offsets,
    EndTxn: transactions.end_txn,
}


def encode_snapshot(state: ShardState) -> bytes:
    """``state`` as the msgpack bytes :meth:`TransactionStateMachine.restore` reads."""
    return b"".join(snapshot_pieces(state))


def snapshot_pieces(
    state: ShardState, records_per_piece: int = SNAPSHOT_PIECE_RECORDS
) -> Iterator[bytes]:
    """:func:`encode_snapshot`'s bytes in pieces of about ``records_per_piece``
    records, for a caller that pauses between pieces.

    The same bytes as packing the whole payload at once, but each record is
    packed as soon as it is built and then dropped: encoding a state of 100K
    transactions keeps no 100K wire lists alive at once, which would set off
    Python's cyclic garbage collector over the whole heap several times
    (about 10 x the encoding's own cost at that size).
    """
    packer = msgpack.Packer(use_bin_type=True, autoreset=False)
    packed = 0

    def records(key: str, wires: Iterable[Any], count: int) -> Iterator[bytes]:
        nonlocal packed
        packer.pack(key)
        packer.pack_array_header(count)
        for wire in wires:
            packer.pack(wire)
            packed += 1
            if packed % records_per_piece == 0:
                yield bytes(packer.bytes())
                packer.reset()

    packer.pack_map_header(12)
    for key, value in (
        ("v", SNAPSHOT_VERSION),
        ("pids", state.pids.to_wire()),
        ("last_assigned_pid", state.last_assigned_pid),
    ):
        packer.pack(key)
        packer.pack(value)
    txns, groups, members = state.transactions, state.groups, state.memberships
    yield from records("transactions", (txns[t].to_wire() for t in sorted(txns)), len(txns))
    yield from records("groups", ([g, groups[g].to_wire()] for g in sorted(groups)), len(groups))
    topics = sorted(state.topics.items())
    yield from records("topics", ([name, t.to_wire()] for name, t in topics), len(topics))
    fenced = sorted(state.fenced_nodes)
    yield from records("fenced_nodes", iter(fenced), len(fenced))
    yield from records(
        "memberships", ([g, members[g].to_wire()] for g in sorted(members)), len(members)
    )
    directories = sorted(state.directories.items())
    yield from records("directories", ([n, d] for n, d in directories), len(directories))
    ceilings = sorted(state.offset_ceilings.items())
    yield from records("offset_ceilings", ([t, list(c)] for t, c in ceilings), len(ceilings))
    acls = sorted(a.to_wire() for a in state.acls)
    yield from records("acls", acls, len(acls))
    scram = sorted(state.scram.items())
    yield from records(
        "scram", ([user, mech, *credential] for (user, mech), credential in scram), len(scram)
    )
    yield bytes(packer.bytes())


def _fenced_from_wire(value: Any) -> frozenset[int]:
    """The fenced nodes of a snapshot: distinct node ids, sorted.

    Raises:
        CommandError: anything else.
    """
    nodes = [as_int(n) for n in as_list(value)]
    if nodes != sorted(set(nodes)) or any(not 0 <= n <= MAX_INT32 for n in nodes):
        raise CommandError(f"fenced nodes must be distinct node ids, sorted: {value!r}")
    return frozenset(nodes)


def _acls_from_wire(value: Any) -> frozenset[Acl]:
    try:
        return frozenset(acl_from_wire(w) for w in as_list(value))
    except ValueError as exc:
        raise CommandError(f"snapshot ACLs: {exc}") from exc
