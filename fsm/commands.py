"""Commands: the only inputs that change a shard's state.

A command is a frozen dataclass. On the wire (a Raft entry) it is a msgpack
map ``{"v": COMMAND_VERSION, "t": <type id>, <field>: <value>, ...}`` with
exactly the fields of its class. A Raft entry is a msgpack map
``{"v": ENTRY_VERSION, "cmds": [<command>, ...]}`` so that several commands
proposed together (group commit) travel in one entry. Decoding checks the
version, the type id, the field set and every field's type; anything else is
a :class:`CommandError`, never a guess.

Everything that is not deterministic (the time, newly allocated producer ids,
the leader's term as coordinator epoch) is stamped into the command by the
leader before it is proposed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, get_type_hints

import msgpack

from fsm.errors import CommandError
from fsm.metadata import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TopicPartition
from fsm.wire import as_bool, as_bytes, as_int, as_list, as_str, check_version
from raftcoord.protocol.acl import (
    Acl,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    acl_from_wire,
)

COMMAND_VERSION = 1
#: The generation of a consumer group that never completed a join; also
#: what an offset commit from outside any group membership carries.
NO_GENERATION = -1
ENTRY_VERSION = 1


class OffsetEntry(NamedTuple):
    """One partition's offset in an offset commit."""

    topic: str
    partition: int
    offset: int
    metadata: str


class OffsetReservation(NamedTuple):
    """Offsets below ``ceiling`` of a topic-partition may be handed out by the
    partition-log node that owns it (:class:`ReserveOffsets`)."""

    topic: str
    partition: int
    ceiling: int


class GroupProtocol(NamedTuple):
    """One protocol a group member supports (JoinGroup), with its metadata."""

    name: str
    metadata: bytes


class MemberAssignment(NamedTuple):
    """The group leader's assignment for one member (SyncGroup)."""

    member_id: str
    assignment: bytes


@dataclass(frozen=True)
class Command:
    """Base class; subclasses set ``TYPE`` to a stable integer id."""

    TYPE: ClassVar[int] = 0


@dataclass(frozen=True)
class InitProducerId(Command):
    """InitProducerId for a transactional.id (idempotent producers never reach the log).

    ``new_producer_id`` is a fresh id stamped by the leader when the handler
    will need one (see :func:`fsm.machine.TransactionStateMachine.needs_new_producer_id`),
    else -1. ``expected_*`` are the KIP-360 expected id/epoch, -1 when absent.
    ``enable_two_phase_commit`` and ``keep_prepared_txn`` are KIP-939's
    (:mod:`fsm.transactions`).
    """

    TYPE: ClassVar[int] = 1
    transactional_id: str
    timeout_ms: int
    now_ms: int
    coordinator_epoch: int
    new_producer_id: int = NO_PRODUCER_ID
    expected_producer_id: int = NO_PRODUCER_ID
    expected_producer_epoch: int = NO_PRODUCER_EPOCH
    enable_two_phase_commit: bool = False
    keep_prepared_txn: bool = False


@dataclass(frozen=True)
class AddPartitions(Command):
    """AddPartitionsToTxn."""

    TYPE: ClassVar[int] = 2
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[TopicPartition, ...]
    now_ms: int
    coordinator_epoch: int


@dataclass(frozen=True)
class AddOffsets(Command):
    """AddOffsetsToTxn: the group's offsets shard becomes a participant."""

    TYPE: ClassVar[int] = 3
    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str
    now_ms: int
    coordinator_epoch: int


@dataclass(frozen=True)
class EndTxn(Command):
    """EndTxn(commit|abort). ``new_producer_id`` is stamped only when the
    epoch is exhausted and the producer id must rotate, else -1.
    ``transaction_version`` is the one the client speaks (Kafka's
    transaction.version): 2 bumps the epoch, 1 keeps it."""

    TYPE: ClassVar[int] = 4
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    now_ms: int
    coordinator_epoch: int
    new_producer_id: int = NO_PRODUCER_ID
    transaction_version: int = 2


@dataclass(frozen=True)
class MarkersWritten(Command):
    """Participants that acknowledged the markers of a Prepare* transaction.

    ``producer_id``/``producer_epoch`` are the identity the markers carried.
    """

    TYPE: ClassVar[int] = 5
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[TopicPartition, ...]
    groups: tuple[str, ...]
    now_ms: int
    #: The transaction's number (-1: an entry from before numbers, unchecked).
    txn_number: int = -1


@dataclass(frozen=True)
class AbortTimedOut(Command):
    """The leader's sweeper found this transaction past its timeout."""

    TYPE: ClassVar[int] = 6
    transactional_id: str
    producer_id: int
    producer_epoch: int
    now_ms: int
    coordinator_epoch: int


@dataclass(frozen=True)
class ExpireTransactionalIds(Command):
    """The leader's sweeper found these ids idle for transactional.id.expiration.ms."""

    TYPE: ClassVar[int] = 7
    transactional_ids: tuple[str, ...]
    now_ms: int


@dataclass(frozen=True)
class TxnOffsetCommit(Command):
    """Offsets committed inside a transaction; pending until its marker.

    ``generation_id``/``member_id``/``group_instance_id`` name the consumer
    group member that commits (KIP-447): -1/""/"" for a producer that is
    not a group member."""

    TYPE: ClassVar[int] = 8
    group_id: str
    transactional_id: str
    producer_id: int
    producer_epoch: int
    offsets: tuple[OffsetEntry, ...]
    now_ms: int
    generation_id: int = NO_GENERATION
    member_id: str = ""
    group_instance_id: str = ""


@dataclass(frozen=True)
class GroupMarker(Command):
    """A transaction marker for the group offsets this shard holds."""

    TYPE: ClassVar[int] = 9
    group_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    now_ms: int
    #: The coordinator epoch of the transaction's decision (-1: unknown, an
    #: entry from before it was carried).
    coordinator_epoch: int = -1
    #: How the transaction ended (see :class:`EndTxn`) and its number (-1:
    #: unknown, an entry from before they were carried).
    transaction_version: int = 2
    txn_number: int = -1


@dataclass(frozen=True)
class OffsetCommit(Command):
    """A plain (non-transactional) consumer offset commit; the member fields
    as in :class:`TxnOffsetCommit` (-1/""/"": a simple consumer)."""

    TYPE: ClassVar[int] = 10
    group_id: str
    offsets: tuple[OffsetEntry, ...]
    now_ms: int
    generation_id: int = NO_GENERATION
    member_id: str = ""
    group_instance_id: str = ""


@dataclass(frozen=True)
class AllocatePidBlock(Command):
    """Grant the shard's next producer-id block."""

    TYPE: ClassVar[int] = 11
    shard: int
    shard_count: int
    block_size: int


@dataclass(frozen=True)
class CreateTopic(Command):
    """Create a topic; ``partition_nodes[i]`` is the partition-log node that
    leads partition ``i`` first (its preferred leader), ``replicas[i]`` every
    node holding a replica of it, the preferred leader first (the leader
    chose the placement). Entries written before partitions had replicas
    carry no ``replicas``: each partition's one replica is its node."""

    TYPE: ClassVar[int] = 12
    name: str
    partition_nodes: tuple[int, ...]
    now_ms: int
    replicas: tuple[tuple[int, ...], ...] = ()
    min_insync_replicas: int = 1


@dataclass(frozen=True)
class JoinGroup(Command):
    """JoinGroup. A member joining with an empty ``member_id`` gets
    ``new_member_id``, chosen by the node that proposes the command
    (``client_id`` or the instance id, a dash and a random UUID)."""

    TYPE: ClassVar[int] = 13
    group_id: str
    member_id: str
    group_instance_id: str
    client_id: str
    protocol_type: str
    protocols: tuple[GroupProtocol, ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    new_member_id: str
    now_ms: int


@dataclass(frozen=True)
class SyncGroup(Command):
    """SyncGroup; ``assignments`` are the leader's (empty from a follower)."""

    TYPE: ClassVar[int] = 14
    group_id: str
    member_id: str
    group_instance_id: str
    generation_id: int
    assignments: tuple[MemberAssignment, ...]
    now_ms: int


@dataclass(frozen=True)
class Heartbeat(Command):
    """A group member's heartbeat: keeps its session alive."""

    TYPE: ClassVar[int] = 15
    group_id: str
    member_id: str
    group_instance_id: str
    generation_id: int
    now_ms: int


@dataclass(frozen=True)
class LeaveGroup(Command):
    """One member leaves its group (a static one may be named by instance id alone)."""

    TYPE: ClassVar[int] = 16
    group_id: str
    member_id: str
    group_instance_id: str
    now_ms: int


@dataclass(frozen=True)
class GroupTimeouts(Command):
    """The leader's sweeper found a session, a pending member id or a
    rebalance of this group past its time (see :func:`fsm.membership.due`).

    ``leader_since_ms``: when the proposing leader's leadership began. A
    session is not counted before it (as Kafka's coordinator restarts every
    member's session when it loads a group), so members do not expire for
    the heartbeats they could not deliver while the shard had no leader."""

    TYPE: ClassVar[int] = 17
    group_id: str
    now_ms: int
    leader_since_ms: int


@dataclass(frozen=True)
class RegisterDirectory(Command):
    """A partition-log node's data directory (its ``directory.id``, KIP-858's
    idea) as the node found it at start (``replace`` False: accepted only if
    the node has no directory on record or this one), or as an operator
    accepted a new one (``replace`` True: ``raftcoord accept-directory``)."""

    TYPE: ClassVar[int] = 18
    node_id: int
    directory_id: str
    replace: bool
    now_ms: int


@dataclass(frozen=True)
class ReserveOffsets(Command):
    """A partition-log node reserves offsets of partitions it owns before it
    hands them out, from the data directory on record for it; a ceiling
    only ever grows. A partition that lost records, or a directory that
    replaced a lost one, continues above the ceiling instead of handing out
    offsets that readers may have seen already (docs/partition-log.md)."""

    TYPE: ClassVar[int] = 19
    node_id: int
    directory_id: str
    reservations: tuple[OffsetReservation, ...]
    now_ms: int


@dataclass(frozen=True)
class CreateAcls(Command):
    """Add access-control bindings (shard 0 only); all or none. Each must
    pass :func:`raftcoord.protocol.acl.binding_error`, checked before the
    command is proposed."""

    TYPE: ClassVar[int] = 20
    acls: tuple[Acl, ...]
    now_ms: int


@dataclass(frozen=True)
class DeleteAcls(Command):
    """Remove every binding that one of the filters matches (shard 0 only);
    the outcome lists what each filter removed."""

    TYPE: ClassVar[int] = 21
    filters: tuple[AclFilter, ...]
    now_ms: int


@dataclass(frozen=True)
class UpsertScramCredential(Command):
    """Set a user's SCRAM credential for one mechanism (shard 0 only): what
    Kafka keeps of a password (:mod:`raftcoord.protocol.scram`)."""

    TYPE: ClassVar[int] = 22
    user: str
    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes
    now_ms: int


@dataclass(frozen=True)
class DeleteScramCredential(Command):
    """Remove a user's SCRAM credential for one mechanism (shard 0 only)."""

    TYPE: ClassVar[int] = 23
    user: str
    mechanism: str
    now_ms: int


@dataclass(frozen=True)
class FenceNode(Command):
    """A partition-log node's lease expired (shard 0 only; the controller,
    :mod:`fsm.partitions`): it leaves every ISR and leads nothing."""

    TYPE: ClassVar[int] = 24
    node_id: int
    now_ms: int


@dataclass(frozen=True)
class UnfenceNode(Command):
    """A fenced partition-log node heartbeats again (shard 0 only): the
    partitions it alone kept in sync are led by it again."""

    TYPE: ClassVar[int] = 25
    node_id: int
    now_ms: int


@dataclass(frozen=True)
class AlterPartition(Command):
    """A partition's leader changes its ISR (shard 0 only; KRaft's
    AlterPartition, :func:`fsm.partitions.alter_isr`): a follower that
    caught up joins, one that fell behind leaves."""

    TYPE: ClassVar[int] = 26
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]
    now_ms: int


@dataclass(frozen=True)
class ElectPreferredLeaders(Command):
    """Every partition that prefers one of ``nodes`` (its first replica) is
    led by it again where it is in the ISR and not fenced (shard 0 only;
    the controller's preferred-leader balancing,
    :func:`fsm.partitions.elect_preferred`)."""

    TYPE: ClassVar[int] = 27
    nodes: tuple[int, ...]
    now_ms: int


COMMAND_TYPES: dict[int, type[Command]] = {
    cls.TYPE: cls
    for cls in (
        InitProducerId,
        AddPartitions,
        AddOffsets,
        EndTxn,
        MarkersWritten,
        AbortTimedOut,
        ExpireTransactionalIds,
        TxnOffsetCommit,
        GroupMarker,
        OffsetCommit,
        AllocatePidBlock,
        CreateTopic,
        JoinGroup,
        SyncGroup,
        Heartbeat,
        LeaveGroup,
        GroupTimeouts,
        RegisterDirectory,
        ReserveOffsets,
        CreateAcls,
        DeleteAcls,
        UpsertScramCredential,
        DeleteScramCredential,
        FenceNode,
        UnfenceNode,
        AlterPartition,
        ElectPreferredLeaders,
    )
}

#: The commands that change what every coordinator reads from its own
#: replica of the metadata shard, not through the leader: ACLs and SCRAM
#: credentials (authorization), topics and their placement (markers, topic
#: checks), their leaders (fencing), data directories and offset ceilings.
METADATA_COMMANDS: tuple[type[Command], ...] = (
    CreateTopic,
    FenceNode,
    UnfenceNode,
    AlterPartition,
    ElectPreferredLeaders,
    RegisterDirectory,
    ReserveOffsets,
    CreateAcls,
    DeleteAcls,
    UpsertScramCredential,
    DeleteScramCredential,
)


def _partitions(value: Any) -> tuple[TopicPartition, ...]:
    return tuple(TopicPartition(as_str(t), as_int(p)) for t, p in as_list(value, 2))


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(as_str(v) for v in as_list(value))


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(as_int(v) for v in as_list(value))


def _int_lists(value: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(_ints(v) for v in as_list(value))


def _offsets(value: Any) -> tuple[OffsetEntry, ...]:
    return tuple(
        OffsetEntry(as_str(t), as_int(p), as_int(o), as_str(m)) for t, p, o, m in as_list(value, 4)
    )


def _reservations(value: Any) -> tuple[OffsetReservation, ...]:
    return tuple(
        OffsetReservation(as_str(t), as_int(p), as_int(c)) for t, p, c in as_list(value, 3)
    )


def _protocols(value: Any) -> tuple[GroupProtocol, ...]:
    return tuple(GroupProtocol(as_str(n), as_bytes(m)) for n, m in as_list(value, 2))


def _assignments(value: Any) -> tuple[MemberAssignment, ...]:
    return tuple(MemberAssignment(as_str(m), as_bytes(a)) for m, a in as_list(value, 2))


def _acls(value: Any) -> tuple[Acl, ...]:
    try:
        return tuple(acl_from_wire(v) for v in as_list(value))
    except ValueError as exc:
        raise CommandError(str(exc)) from exc


def _optional_str(value: Any) -> str | None:
    return None if value is None else as_str(value)


def _acl_filters(value: Any) -> tuple[AclFilter, ...]:
    try:
        return tuple(
            AclFilter(
                ResourceType(as_int(rtype)),
                PatternType(as_int(ptype)),
                _optional_str(name),
                _optional_str(principal),
                _optional_str(host),
                Operation(as_int(operation)),
                Permission(as_int(permission)),
            )
            for rtype, ptype, name, principal, host, operation, permission in as_list(value, 7)
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from exc


_DECODERS: dict[Any, Any] = {
    int: as_int,
    bytes: as_bytes,
    bool: as_bool,
    str: as_str,
    tuple[TopicPartition, ...]: _partitions,
    tuple[str, ...]: _strs,
    tuple[int, ...]: _ints,
    tuple[tuple[int, ...], ...]: _int_lists,
    tuple[OffsetEntry, ...]: _offsets,
    tuple[GroupProtocol, ...]: _protocols,
    tuple[MemberAssignment, ...]: _assignments,
    tuple[OffsetReservation, ...]: _reservations,
    tuple[Acl, ...]: _acls,
    tuple[AclFilter, ...]: _acl_filters,
}


def _schema(cls: type[Command]) -> dict[str, Any]:
    hints = get_type_hints(cls)
    return {f.name: _DECODERS[hints[f.name]] for f in dataclasses.fields(cls)}


_SCHEMAS = {type_id: _schema(cls) for type_id, cls in COMMAND_TYPES.items()}
#: Fields added after their command first shipped: entries written before
#: (an older version's Raft log) leave them out, and they decode to the
#: field's default. Every other field must be on the wire.
_ADDED_LATER: dict[int, frozenset[str]] = {
    GroupMarker.TYPE: frozenset({"coordinator_epoch", "transaction_version", "txn_number"}),
    InitProducerId.TYPE: frozenset({"enable_two_phase_commit", "keep_prepared_txn"}),
    EndTxn.TYPE: frozenset({"transaction_version"}),
    MarkersWritten.TYPE: frozenset({"txn_number"}),
    CreateTopic.TYPE: frozenset({"replicas", "min_insync_replicas"}),
} | {
    cls.TYPE: frozenset({"generation_id", "member_id", "group_instance_id"})
    for cls in (TxnOffsetCommit, OffsetCommit)
}


def command_to_wire(command: Command) -> dict[str, Any]:
    """The msgpack-ready map of one command."""
    wire: dict[str, Any] = {"v": COMMAND_VERSION, "t": command.TYPE}
    for f in dataclasses.fields(command):
        value = getattr(command, f.name)
        if isinstance(value, tuple):
            value = [list(v) if isinstance(v, tuple) else v for v in value]
        wire[f.name] = value
    return wire


def command_from_wire(wire: Any) -> Command:
    """Decode and validate one command map.

    Raises:
        CommandError: unknown version or type, missing or extra fields, or a
            field of the wrong type.
    """
    if not isinstance(wire, dict):
        raise CommandError(f"a command must be a map, got {type(wire).__name__}")
    check_version(wire.get("v"), COMMAND_VERSION, "command")
    type_id = wire.get("t")
    cls = COMMAND_TYPES.get(type_id) if type(type_id) is int else None
    if cls is None:
        raise CommandError(f"unknown command type {type_id!r}")
    schema = _SCHEMAS[cls.TYPE]
    names = set(wire) - {"v", "t"}
    missing = set(schema) - names - _ADDED_LATER.get(cls.TYPE, frozenset())
    extra = names - set(schema)
    if missing or extra:
        raise CommandError(
            f"{cls.__name__}: missing fields {sorted(missing)}, unknown fields {sorted(extra)}"
        )
    fields = {}
    for name in names:
        try:
            fields[name] = schema[name](wire[name])
        except CommandError as exc:
            raise CommandError(f"{cls.__name__}.{name}: {exc}") from exc
    return cls(**fields)


def encode_command(command: Command) -> bytes:
    """One command as msgpack bytes."""
    return bytes(msgpack.packb(command_to_wire(command), use_bin_type=True))


def decode_command(data: bytes) -> Command:
    """Decode :func:`encode_command` output.

    Raises:
        CommandError: the bytes are not a valid command.
    """
    return command_from_wire(_unpack(data))


def encode_entry(commands: list[Command]) -> bytes:
    """Several commands as one Raft entry (group commit)."""
    payload = {"v": ENTRY_VERSION, "cmds": [command_to_wire(c) for c in commands]}
    return bytes(msgpack.packb(payload, use_bin_type=True))


def decode_entry(data: bytes) -> list[Command | CommandError]:
    """Decode a Raft entry; a command that does not decode is returned as its error.

    Raises:
        CommandError: the entry itself is malformed or of an unknown version.
    """
    payload = _unpack(data)
    if not isinstance(payload, dict) or set(payload) != {"v", "cmds"}:
        raise CommandError("an entry must be a map with the keys 'v' and 'cmds'")
    check_version(payload["v"], ENTRY_VERSION, "entry")
    if not isinstance(payload["cmds"], list):
        raise CommandError("an entry's 'cmds' must be a list")
    decoded: list[Command | CommandError] = []
    for wire in payload["cmds"]:
        try:
            decoded.append(command_from_wire(wire))
        except CommandError as exc:
            decoded.append(exc)
    return decoded


def _unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise CommandError(f"not valid msgpack: {exc}") from exc
