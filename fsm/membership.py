"""Consumer-group membership held by a shard: Kafka's classic group protocol.

A group moves through Kafka's states (:class:`GroupState`)::

    Empty ──join──▶ PreparingRebalance ──every member joined, or the
      ▲                 ▲        │        rebalance timeout passed──▶ CompletingRebalance
      │                 │        └──no member left──▶ Empty              │
      │                 └──join of a new member, leave, expiry───────────┤
      │                                                                   │ the leader's SyncGroup
      └─────────────────────────────────────────────── Stable ◀──────────┘

A member joins with an empty member id and gets one assigned
(MEMBER_ID_REQUIRED, JoinGroup v4+): it is *pending* until it joins again
with that id. A static member (``group_instance_id``) gets its id at once;
a later join of the same instance replaces the id, and the old id is
fenced (FENCED_INSTANCE_ID). When the join completes, the generation goes
up by one, the protocol supported by every member that most members prefer
is chosen, and the first member to join becomes the leader (an existing
leader stays). The leader's SyncGroup stores every member's assignment and
the group is Stable.

Everything that depends on time is decided on the ``now_ms`` a command
carries: members whose session timed out, pending members that never
joined again, and the end of a rebalance (the rebalance timeout, or
``group.initial.rebalance.delay.ms`` after an Empty group began its first
rebalance) are handled by :class:`fsm.commands.GroupTimeouts`, which the
leader proposes when :func:`due` says so. Member ids are chosen by the
node that proposes the join (:attr:`fsm.commands.JoinGroup.new_member_id`).

The handlers are pure: they take a group (None: unknown) and a command and
return the group afterwards (None: unchanged unknown) with the outcome.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from fsm.commands import (
    GroupProtocol,
    GroupTimeouts,
    Heartbeat,
    JoinGroup,
    LeaveGroup,
    SyncGroup,
)
from fsm.config import FsmConfig
from fsm.effects import Outcome, fail
from fsm.errors import CommandError, ErrorCode
from fsm.wire import INT64_MAX, as_bool, as_bytes, as_int, as_list, as_str

#: Most members one group may hold, pending ones included (Kafka's
#: group.max.size, fixed here): more joins are GROUP_MAX_SIZE_REACHED.
MAX_GROUP_MEMBERS = 1000
#: Most protocols one member may offer, and longest protocol type or name.
MAX_PROTOCOLS = 64
MAX_NAME_LENGTH = 249
#: Largest protocol metadata of one member, and of all of a SyncGroup's
#: assignments, in bytes.
MAX_METADATA_BYTES = 1 << 20
MAX_ASSIGNMENT_BYTES = 4 << 20


class GroupState(Enum):
    """Kafka's group states (Kafka's Dead is a deleted group: raftcoord
    never deletes a group's membership, so no stored group is Dead)."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(frozen=True)
class Member:
    """One member of a group.

    ``joined``: it joined in the current rebalance (PreparingRebalance).
    ``last_seen_ms``: its last join, sync or heartbeat (session timeout).
    """

    member_id: str
    group_instance_id: str
    client_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[GroupProtocol, ...]
    last_seen_ms: int
    joined: bool = False
    assignment: bytes = b""

    def metadata(self, protocol_name: str) -> bytes:
        """The member's metadata for ``protocol_name`` (empty if it has none)."""
        return next((p.metadata for p in self.protocols if p.name == protocol_name), b"")

    def to_wire(self) -> list[Any]:
        return [
            self.member_id,
            self.group_instance_id,
            self.client_id,
            self.session_timeout_ms,
            self.rebalance_timeout_ms,
            [[p.name, p.metadata] for p in self.protocols],
            self.last_seen_ms,
            self.joined,
            self.assignment,
        ]

    @classmethod
    def from_wire(cls, data: Any) -> Member:
        fields = as_list(data)
        if len(fields) != 9:
            raise CommandError(f"malformed group member: {data!r}")
        mid, instance, client, session, rebalance, protocols, seen, joined, assignment = fields
        return cls(
            as_str(mid),
            as_str(instance),
            as_str(client),
            as_int(session),
            as_int(rebalance),
            tuple(GroupProtocol(as_str(n), as_bytes(m)) for n, m in as_list(protocols, 2)),
            as_int(seen),
            as_bool(joined),
            as_bytes(assignment),
        )


@dataclass(frozen=True)
class GroupMembership:
    """A consumer group's members and generation. Immutable: handlers build new ones.

    ``members`` keeps join order (the first member is the leader of a group
    without one). ``pending`` maps member ids handed out with
    MEMBER_ID_REQUIRED to the time they lapse. ``rebalance_deadline_ms``
    ends the current rebalance (-1 outside PreparingRebalance);
    ``join_not_before_ms`` is the earliest its join may complete.
    """

    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str = ""
    protocol_name: str = ""
    leader_id: str = ""
    members: Mapping[str, Member] = field(default_factory=dict)
    pending: Mapping[str, int] = field(default_factory=dict)
    rebalance_deadline_ms: int = -1
    join_not_before_ms: int = -1

    def instance_owner(self, group_instance_id: str) -> str | None:
        """The member id that holds a static member's instance id, or None."""
        for member in self.members.values():
            if member.group_instance_id == group_instance_id:
                return member.member_id
        return None

    def to_wire(self) -> list[Any]:
        return [
            self.state.value,
            self.generation,
            self.protocol_type,
            self.protocol_name,
            self.leader_id,
            [m.to_wire() for m in self.members.values()],
            sorted([mid, deadline] for mid, deadline in self.pending.items()),
            self.rebalance_deadline_ms,
            self.join_not_before_ms,
        ]

    @classmethod
    def from_wire(cls, data: Any) -> GroupMembership:
        """Rebuild from :meth:`to_wire` output.

        Raises:
            CommandError: malformed data.
        """
        fields = as_list(data)
        if len(fields) != 9:
            raise CommandError(f"malformed group membership: {data!r}")
        state, generation, ptype, pname, leader, members, pending, deadline, not_before = fields
        try:
            group_state = GroupState(as_str(state))
        except ValueError as exc:
            raise CommandError(f"unknown group state {state!r}") from exc
        decoded = [Member.from_wire(m) for m in as_list(members)]
        return cls(
            group_state,
            as_int(generation),
            as_str(ptype),
            as_str(pname),
            as_str(leader),
            {m.member_id: m for m in decoded},
            {as_str(mid): as_int(at) for mid, at in as_list(pending, 2)},
            as_int(deadline),
            as_int(not_before),
        )


Step = tuple[GroupMembership | None, Outcome]


def _answer(group: GroupMembership, error: ErrorCode = ErrorCode.NONE, message: str = "") -> Step:
    if error is not ErrorCode.NONE and not message:
        message = error.name
    return group, Outcome(error=error, message=message, generation=group.generation)


# --- validation -----------------------------------------------------------------------


def join_problem(cmd: JoinGroup, config: FsmConfig) -> tuple[ErrorCode, str] | None:
    """Why a JoinGroup is refused whatever the group's state, or None."""
    if not cmd.group_id:
        return ErrorCode.INVALID_REQUEST, "group id must not be empty"
    if not cmd.member_id and not cmd.new_member_id:
        return ErrorCode.INVALID_REQUEST, "a join with an empty member id needs a new member id"
    if not (
        config.group_min_session_timeout_ms
        <= cmd.session_timeout_ms
        <= config.group_max_session_timeout_ms
    ):
        return ErrorCode.INVALID_SESSION_TIMEOUT, (
            f"session timeout {cmd.session_timeout_ms} ms is outside "
            f"[{config.group_min_session_timeout_ms}, {config.group_max_session_timeout_ms}]"
        )
    if cmd.rebalance_timeout_ms < 1:
        return ErrorCode.INVALID_REQUEST, "rebalance timeout must be positive"
    if not cmd.protocol_type or not cmd.protocols:
        return ErrorCode.INCONSISTENT_GROUP_PROTOCOL, "a protocol type and protocols are required"
    if len(cmd.protocols) > MAX_PROTOCOLS:
        return ErrorCode.INVALID_REQUEST, f"more than {MAX_PROTOCOLS} protocols"
    names = [cmd.protocol_type, *(p.name for p in cmd.protocols)]
    if any(not name or len(name) > MAX_NAME_LENGTH for name in names):
        return ErrorCode.INVALID_REQUEST, f"protocol names are 1..{MAX_NAME_LENGTH} characters"
    if sum(len(p.metadata) for p in cmd.protocols) > MAX_METADATA_BYTES:
        return ErrorCode.INVALID_REQUEST, f"protocol metadata exceeds {MAX_METADATA_BYTES} bytes"
    return None


def sync_problem(cmd: SyncGroup) -> tuple[ErrorCode, str] | None:
    """Why a SyncGroup's assignments are refused whatever the group's state, or None."""
    if len(cmd.assignments) > MAX_GROUP_MEMBERS:
        return ErrorCode.INVALID_REQUEST, f"more than {MAX_GROUP_MEMBERS} assignments"
    if sum(len(a.assignment) for a in cmd.assignments) > MAX_ASSIGNMENT_BYTES:
        return ErrorCode.INVALID_REQUEST, f"assignments exceed {MAX_ASSIGNMENT_BYTES} bytes"
    return None


def _member_refusal(
    group: GroupMembership | None, member_id: str, group_instance_id: str
) -> tuple[ErrorCode, str] | None:
    """Kafka's validateMember: a named static instance must be in the group
    (else UNKNOWN_MEMBER_ID) and held by ``member_id`` (else
    FENCED_INSTANCE_ID), and the id must be a member (else UNKNOWN_MEMBER_ID)."""
    if group_instance_id:
        owner = None if group is None else group.instance_owner(group_instance_id)
        if owner is None:
            return (
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"instance {group_instance_id!r} is not in the group",
            )
        if owner != member_id:
            return ErrorCode.FENCED_INSTANCE_ID, (
                f"instance {group_instance_id!r} is held by another member"
            )
    if group is None or member_id not in group.members:
        return ErrorCode.UNKNOWN_MEMBER_ID, f"{member_id!r} is not a member of the group"
    return None


def _generation_refusal(
    group: GroupMembership | None, member_id: str, group_instance_id: str, generation_id: int
) -> tuple[ErrorCode, str] | None:
    """:func:`_member_refusal`, then the member's generation must be the
    group's (else ILLEGAL_GENERATION)."""
    refusal = _member_refusal(group, member_id, group_instance_id)
    if refusal is not None:
        return refusal
    assert group is not None  # a member was found
    if generation_id != group.generation:
        return ErrorCode.ILLEGAL_GENERATION, (
            f"generation {generation_id} is not the group's generation {group.generation}"
        )
    return None


def offset_commit_refusal(
    group: GroupMembership | None,
    generation_id: int,
    member_id: str,
    group_instance_id: str,
    transactional: bool,
) -> tuple[ErrorCode, str] | None:
    """Kafka's checks of an OffsetCommit or TxnOffsetCommit (its
    ClassicGroup.validateOffsetCommit, in its order; an unknown group is an
    Empty one).

    A plain commit that names a generation to an unknown group is
    ILLEGAL_GENERATION. A commit without a generation (< 0) to an Empty
    group is accepted whoever sends it. A commit that names a generation,
    member or instance must come from a current member (FENCED_INSTANCE_ID,
    UNKNOWN_MEMBER_ID) of the group's generation (ILLEGAL_GENERATION); one
    that names none of them is a simple consumer's, refused
    (UNKNOWN_MEMBER_ID) only when it is plain and the group is not Empty.
    Last, a plain commit during CompletingRebalance is REBALANCE_IN_PROGRESS.
    """
    if group is None and generation_id >= 0 and not transactional:
        return ErrorCode.ILLEGAL_GENERATION, "the group does not exist"
    empty = group is None or group.state is GroupState.EMPTY
    if generation_id < 0 and empty:
        return None
    if generation_id >= 0 or member_id or group_instance_id:
        refusal = _generation_refusal(group, member_id, group_instance_id, generation_id)
        if refusal is not None:
            return refusal
    elif not transactional and not empty:
        return ErrorCode.UNKNOWN_MEMBER_ID, "the group has members: only they may commit"
    if not transactional and group is not None and group.state is GroupState.COMPLETING_REBALANCE:
        return ErrorCode.REBALANCE_IN_PROGRESS, "the group is completing a rebalance"
    return None


# --- rebalancing ----------------------------------------------------------------------


def _later(now_ms: int, delay_ms: int) -> int:
    """``now_ms + delay_ms``, kept a 64-bit integer (stored times must be)."""
    return min(now_ms + delay_ms, INT64_MAX)


def _prepare_rebalance(group: GroupMembership, now_ms: int, config: FsmConfig) -> GroupMembership:
    """Begin a rebalance (no-op when one is under way): every member must join again."""
    if group.state is GroupState.PREPARING_REBALANCE:
        return group
    timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
    delay = min(config.group_initial_rebalance_delay_ms, timeout)
    return replace(
        group,
        state=GroupState.PREPARING_REBALANCE,
        members={mid: replace(m, joined=False) for mid, m in group.members.items()},
        rebalance_deadline_ms=_later(now_ms, timeout),
        join_not_before_ms=_later(now_ms, delay) if group.state is GroupState.EMPTY else now_ms,
    )


def _join_ready(group: GroupMembership, now_ms: int) -> bool:
    if group.state is not GroupState.PREPARING_REBALANCE:
        return False
    if now_ms >= group.rebalance_deadline_ms:
        return True
    everyone = not group.pending and all(m.joined for m in group.members.values())
    return everyone and now_ms >= group.join_not_before_ms


def _common_protocols(offers: list[Member | tuple[GroupProtocol, ...]]) -> list[str]:
    """The protocol names every offer supports, in the first offer's order."""
    lists = [o.protocols if isinstance(o, Member) else o for o in offers]
    common = [p.name for p in lists[0]]
    for protocols in lists[1:]:
        names = {p.name for p in protocols}
        common = [name for name in common if name in names]
    return common


def _select_protocol(members: list[Member]) -> str:
    """Kafka's selectProtocol: among the protocols every member supports,
    the one most members list first (ties: the first member's order)."""
    votes = dict.fromkeys(_common_protocols(list(members)), 0)
    for member in members:
        choice = next(p.name for p in member.protocols if p.name in votes)
        votes[choice] += 1
    return max(votes, key=lambda name: votes[name])


def _complete_join(group: GroupMembership, now_ms: int) -> GroupMembership:
    """End the rebalance: members that did not join are removed, the
    generation goes up, the protocol and leader are chosen."""
    members = {
        mid: replace(m, joined=False, last_seen_ms=now_ms, assignment=b"")
        for mid, m in group.members.items()
        if m.joined
    }
    base = replace(
        group,
        generation=group.generation + 1,
        members=members,
        rebalance_deadline_ms=-1,
        join_not_before_ms=-1,
    )
    if not members:
        return replace(base, state=GroupState.EMPTY, protocol_name="", leader_id="")
    leader = group.leader_id if group.leader_id in members else next(iter(members))
    return replace(
        base,
        state=GroupState.COMPLETING_REBALANCE,
        protocol_name=_select_protocol(list(members.values())),
        leader_id=leader,
    )


def _settle(group: GroupMembership, now_ms: int) -> GroupMembership:
    """Complete the join if it is due now."""
    return _complete_join(group, now_ms) if _join_ready(group, now_ms) else group


def _without(
    group: GroupMembership, member_ids: set[str], now_ms: int, config: FsmConfig
) -> GroupMembership:
    """The group after ``member_ids`` left (or expired): the others rebalance."""
    if not member_ids:
        return group
    left = replace(
        group,
        members={mid: m for mid, m in group.members.items() if mid not in member_ids},
        leader_id="" if group.leader_id in member_ids else group.leader_id,
    )
    if not left.members and group.state is not GroupState.PREPARING_REBALANCE:
        return replace(
            left,
            state=GroupState.EMPTY,
            generation=group.generation + 1,
            protocol_name="",
            rebalance_deadline_ms=-1,
            join_not_before_ms=-1,
        )
    if left.state is GroupState.EMPTY:
        return left
    return _settle(_prepare_rebalance(left, now_ms, config), now_ms)


# --- handlers -------------------------------------------------------------------------


def join_group(group: GroupMembership | None, cmd: JoinGroup, config: FsmConfig) -> Step:
    """JoinGroup. NONE means the member is in the group and takes part in
    the rebalance (the caller waits until the generation moves past the
    answer's) or, in CompletingRebalance or Stable, already has the
    current generation."""
    problem = join_problem(cmd, config)
    if problem is not None:
        return group, fail(*problem)
    current = group or GroupMembership()
    if current.members or current.pending:
        if cmd.protocol_type != current.protocol_type:
            return group, fail(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"the group's protocol type is {current.protocol_type!r}",
            )
        others = [m for mid, m in current.members.items() if mid != cmd.member_id]
        if others and not _common_protocols([*others, cmd.protocols]):
            return group, fail(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                "no protocol in common with every member of the group",
            )
    current = replace(current, protocol_type=cmd.protocol_type)
    member_id = cmd.member_id
    if not member_id:
        known_instance = bool(cmd.group_instance_id) and (
            current.instance_owner(cmd.group_instance_id) is not None
        )
        full = len(current.members) + len(current.pending) >= MAX_GROUP_MEMBERS
        if full and not known_instance:
            return group, fail(
                ErrorCode.GROUP_MAX_SIZE_REACHED, f"the group has {MAX_GROUP_MEMBERS} members"
            )
        if not cmd.group_instance_id:
            lapses = _later(cmd.now_ms, cmd.session_timeout_ms)
            pending = {**current.pending, cmd.new_member_id: lapses}
            waiting = replace(current, pending=pending)
            return waiting, Outcome(
                error=ErrorCode.MEMBER_ID_REQUIRED,
                message="join again with the assigned member id",
                generation=waiting.generation,
            )
        return _join_static(current, cmd, config)
    refusal = _member_refusal(current, member_id, cmd.group_instance_id)
    if refusal is not None and member_id in current.pending and not cmd.group_instance_id:
        refusal = None
    if refusal is not None:
        return group, fail(*refusal)
    old = current.members.get(member_id)
    joining = Member(
        member_id,
        cmd.group_instance_id,
        cmd.client_id,
        cmd.session_timeout_ms,
        cmd.rebalance_timeout_ms,
        cmd.protocols,
        cmd.now_ms,
        joined=True,
        assignment=b"" if old is None else old.assignment,
    )
    pending = {mid: at for mid, at in current.pending.items() if mid != member_id}
    current = replace(current, pending=pending)
    if (
        old is not None
        and old.protocols == cmd.protocols
        and (
            current.state is GroupState.COMPLETING_REBALANCE
            or (current.state is GroupState.STABLE and member_id != current.leader_id)
        )
    ):
        # Kafka answers the current generation again: no rebalance.
        refreshed = replace(old, last_seen_ms=cmd.now_ms, client_id=cmd.client_id)
        return _answer(replace(current, members={**current.members, member_id: refreshed}))
    return _enter(current, joining, cmd.now_ms, config)


def _enter(group: GroupMembership, joining: Member, now_ms: int, config: FsmConfig) -> Step:
    """``joining`` joins the (new or current) rebalance."""
    members = {**group.members, joining.member_id: joining}
    rebalancing = _prepare_rebalance(replace(group, members=members), now_ms, config)
    rebalancing = replace(rebalancing, members={**rebalancing.members, joining.member_id: joining})
    # The deadline was set when the rebalance began (Kafka's too): later
    # joins do not extend it. The answer carries the generation before the
    # join completes, which the caller waits to see passed.
    settled = _settle(rebalancing, now_ms)
    return settled, Outcome(generation=rebalancing.generation)


def _join_static(group: GroupMembership, cmd: JoinGroup, config: FsmConfig) -> Step:
    """A static member joins with an empty member id: it gets ``new_member_id``
    at once; an earlier id of its instance is replaced (and so fenced)."""
    old_id = group.instance_owner(cmd.group_instance_id)
    joining = Member(
        cmd.new_member_id,
        cmd.group_instance_id,
        cmd.client_id,
        cmd.session_timeout_ms,
        cmd.rebalance_timeout_ms,
        cmd.protocols,
        cmd.now_ms,
        joined=True,
    )
    if old_id is None:
        return _enter(group, joining, cmd.now_ms, config)
    old = group.members[old_id]
    members = {
        (cmd.new_member_id if mid == old_id else mid): (joining if mid == old_id else m)
        for mid, m in group.members.items()
    }
    leader = cmd.new_member_id if group.leader_id == old_id else group.leader_id
    replaced = replace(group, members=members, leader_id=leader)
    if group.state is GroupState.STABLE and old.protocols == cmd.protocols:
        # Kafka: a known static member comes back with its assignment, no rebalance.
        kept = replace(joining, joined=False, assignment=old.assignment)
        return _answer(replace(replaced, members={**members, cmd.new_member_id: kept}))
    return _enter(replaced, joining, cmd.now_ms, config)


def sync_group(group: GroupMembership | None, cmd: SyncGroup) -> Step:
    """SyncGroup. NONE: in Stable the member's assignment is stored; in
    CompletingRebalance a follower waits for the leader's sync, and the
    leader's sync stores every assignment and makes the group Stable."""
    refusal = _generation_refusal(group, cmd.member_id, cmd.group_instance_id, cmd.generation_id)
    if refusal is not None:
        return group, fail(*refusal)
    assert group is not None
    if group.state is GroupState.PREPARING_REBALANCE:
        return group, fail(ErrorCode.REBALANCE_IN_PROGRESS, "the group is rebalancing")
    problem = sync_problem(cmd)
    if problem is not None:
        return group, fail(*problem)
    members = dict(group.members)
    members[cmd.member_id] = replace(members[cmd.member_id], last_seen_ms=cmd.now_ms)
    state = group.state
    if state is GroupState.COMPLETING_REBALANCE and cmd.member_id == group.leader_id:
        given = {a.member_id: a.assignment for a in cmd.assignments}
        members = {mid: replace(m, assignment=given.get(mid, b"")) for mid, m in members.items()}
        state = GroupState.STABLE
    return _answer(replace(group, members=members, state=state))


def heartbeat(group: GroupMembership | None, cmd: Heartbeat) -> Step:
    """Heartbeat, checked as Kafka does: the member, then its generation
    (ILLEGAL_GENERATION), then the state: REBALANCE_IN_PROGRESS while the
    group rebalances (the member must join again)."""
    refusal = _generation_refusal(group, cmd.member_id, cmd.group_instance_id, cmd.generation_id)
    if refusal is not None:
        return group, fail(*refusal)
    assert group is not None
    refreshed = replace(group.members[cmd.member_id], last_seen_ms=cmd.now_ms)
    seen = replace(group, members={**group.members, cmd.member_id: refreshed})
    if group.state is GroupState.PREPARING_REBALANCE:
        return _answer(
            seen, ErrorCode.REBALANCE_IN_PROGRESS, "the group is rebalancing; join again"
        )
    return _answer(seen)


def leave_group(group: GroupMembership | None, cmd: LeaveGroup, config: FsmConfig) -> Step:
    """LeaveGroup of one member (by member id, or by instance id alone for a
    static member); the others rebalance."""
    member_id = cmd.member_id
    if not member_id and cmd.group_instance_id and group is not None:
        member_id = group.instance_owner(cmd.group_instance_id) or ""
    if group is not None and member_id in group.pending and not cmd.group_instance_id:
        pending = {mid: at for mid, at in group.pending.items() if mid != member_id}
        return _answer(_settle(replace(group, pending=pending), cmd.now_ms))
    refusal = _member_refusal(group, member_id, cmd.group_instance_id)
    if refusal is not None:
        return group, fail(*refusal)
    assert group is not None
    return _answer(_without(group, {member_id}, cmd.now_ms, config))


def _expired_members(group: GroupMembership, now_ms: int, since_ms: int) -> set[str]:
    """Members whose session, counted from their last sign of life but not
    before ``since_ms``, timed out (those that joined the current rebalance
    wait for its end instead, as in Kafka)."""
    rebalancing = group.state is GroupState.PREPARING_REBALANCE
    return {
        mid
        for mid, m in group.members.items()
        if now_ms > max(m.last_seen_ms, since_ms) + m.session_timeout_ms
        and not (rebalancing and m.joined)
    }


def due(group: GroupMembership, now_ms: int, leader_since_ms: int) -> bool:
    """Whether :func:`group_timeouts` would change ``group`` at ``now_ms``
    for a leader whose leadership began at ``leader_since_ms``."""
    return (
        bool(_expired_members(group, now_ms, leader_since_ms))
        or any(now_ms > max(at, leader_since_ms) for at in group.pending.values())
        or _join_ready(group, now_ms)
    )


def group_timeouts(group: GroupMembership | None, cmd: GroupTimeouts, config: FsmConfig) -> Step:
    """Expire sessions and pending member ids, and complete a join that is due."""
    if group is None:
        return group, fail(ErrorCode.INVALID_REQUEST, "no such group")
    since = cmd.leader_since_ms
    pending = {mid: at for mid, at in group.pending.items() if cmd.now_ms <= max(at, since)}
    trimmed = replace(group, pending=pending)
    expired = _expired_members(trimmed, cmd.now_ms, since)
    return _answer(_settle(_without(trimmed, expired, cmd.now_ms, config), cmd.now_ms))
