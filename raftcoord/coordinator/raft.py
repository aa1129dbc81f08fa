"""The one place the coordinator touches pysyncobj.

:class:`RaftGroup` is a pysyncobj ``SyncObj`` driven by its owner's thread
(``autoTick=False``); the rest of the coordinator sees only its methods and
pysyncobj's public properties (``raftCurrentTerm``, ``raftCommitIndex``,
``raftLastApplied``). Where pysyncobj 0.3 has no public way to do what the
coordinator needs, the private member is reached here, each one commented,
so that a pysyncobj upgrade is checked in one module.

Nothing of a group is pickled. Its messages travel over
:class:`raftcoord.coordinator.raft_transport.RaftTransport` (msgpack, peers
authenticated first). Its log entries are not pysyncobj's ``@replicated``
calls (a pickle of the method's id and arguments, unpickled by every replica
when it applies the entry) but :data:`ENTRY_FORMAT` followed by the
proposer's term and the entry's bytes, handed to :meth:`RaftGroup.apply_command`,
or a voters record (:data:`raftcoord.coordinator.voters.VOTERS_ENTRY`, see
that module), handed to :meth:`RaftGroup.apply_voters`; an entry of another
form (pysyncobj's membership and code-version commands, which these groups
never propose, or a journal written before this format) goes to
:meth:`RaftGroup.apply_unknown`, which stops the member.
"""

from __future__ import annotations

import functools
import queue
import struct
from collections.abc import Callable
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj.monotonic import monotonic
from pysyncobj.pipe_notifier import PipeNotifier

from fsm import ErrorCode
from raftcoord.coordinator import raft_wire
from raftcoord.coordinator.raft_transport import RaftTransport, RaftTransportSettings
from raftcoord.coordinator.voters import VOTERS_ENTRY

__all__ = [
    "RaftGroup",
    "RaftTransportSettings",
    "SyncObjConf",
    "UnknownEntry",
    "proposal_error",
    "raft_conf",
    "voters_data",
]

#: pysyncobj's command types (the first byte of every log entry).
REGULAR_COMMAND, NO_OP_COMMAND = 0, 1
#: The second byte of a coordinator entry, then the proposer's term.
ENTRY_FORMAT = b"R"
_TERM = struct.Struct(">I")
#: Command type, format and term: where an entry's data starts.
_DATA_AT = 2 + _TERM.size

#: (node, message) -> None: pysyncobj's handler of messages from other nodes.
MessageHandler = Callable[[Any, Any], None]


def raft_conf(
    heartbeat_s: float,
    election_timeout_s: tuple[float, float],
    journal: str,
    snapshot: str,
    *,
    auto_tick_s: float | None = None,
    connection_retry_s: float = 0.2,
    connection_timeout_s: float = 1.0,
    bind_retry_s: float | None = None,
    commands_wait_leader: bool = False,
) -> SyncObjConf:
    """The configuration of a coordinator shard's Raft group (periods in seconds).

    The owner ticks the group itself and batches requests into one entry
    per tick, journal and snapshot live in files (both are needed: see
    :mod:`raftcoord.raft_journal`), and membership is fixed.

    The keyword arguments serve benchmarks and tests of plain pysyncobj
    groups: ``auto_tick_s`` lets pysyncobj tick its own thread that often
    (and batch appends itself); ``bind_retry_s`` None keeps pysyncobj's
    default; ``commands_wait_leader`` makes a command sent before a leader
    is known wait for one instead of failing.
    """
    low, high = election_timeout_s
    extra: dict[str, Any] = {}
    if auto_tick_s is not None:
        extra["autoTickPeriod"] = auto_tick_s
    if bind_retry_s is not None:
        extra["bindRetryTime"] = bind_retry_s
    return SyncObjConf(
        autoTick=auto_tick_s is not None,
        # Ticked by the owner, which batches: one entry per tick per shard.
        appendEntriesUseBatch=auto_tick_s is not None,
        appendEntriesPeriod=heartbeat_s,
        raftMinTimeout=low,
        raftMaxTimeout=high,
        journalFile=journal,
        fullDumpFile=snapshot,
        useFork=False,  # gRPC's threads make fork unsafe
        dynamicMembershipChange=False,
        commandsWaitLeader=commands_wait_leader,
        logCompactionMinEntries=20_000,
        logCompactionMinTime=60,
        connectionRetryTime=connection_retry_s,
        connectionTimeout=connection_timeout_s,
        leaderFallbackTimeout=max(2.0, 4 * high),
        # Larger entries travel as chunks the transport joins again (see
        # raft_transport); one fragment's worth keeps that rare.
        appendEntriesBatchSizeBytes=raft_wire.FRAGMENT_BYTES,
        **extra,
    )


def voters_data(command: bytes) -> bytes | None:
    """The record's bytes when the log entry ``command`` is a voters record."""
    if command[:1] == bytes([REGULAR_COMMAND]) and command[1:2] == VOTERS_ENTRY:
        return command[2:]
    return None


def proposal_error(reason: Any) -> ErrorCode:
    """The answer to a request whose entry ended with pysyncobj's ``reason``:
    NONE when it was applied, REQUEST_TIMED_OUT when pysyncobj's queue was
    full, NOT_COORDINATOR when it was dropped (leadership lost)."""
    if reason == FAIL_REASON.SUCCESS:
        return ErrorCode.NONE
    if reason == FAIL_REASON.QUEUE_FULL:
        return ErrorCode.REQUEST_TIMED_OUT
    return ErrorCode.NOT_COORDINATOR


class UnknownEntry(Exception):
    """A committed log entry that is not a coordinator entry."""


class RaftGroup(SyncObj):  # type: ignore[misc]  # pysyncobj is untyped
    """A pysyncobj group member, ticked by its owner, talking over
    :class:`RaftTransport`; subclasses apply entries in :meth:`apply_command`."""

    def __init__(
        self,
        self_address: str,
        partner_addresses: list[str],
        conf: SyncObjConf,
        transport: RaftTransportSettings,
    ) -> None:
        #: An entry applied in this round asked to tell the followers at once.
        self._announce = False
        #: The term and match indexes taken out of this tick's commit count.
        self._left_out: tuple[int, dict[Any, int]] = (0, {})
        super().__init__(
            self_address,
            partner_addresses,
            conf,
            transportClass=functools.partial(RaftTransport, settings=transport),
        )
        self.addOnTickCallback(self._count_in)

    def propose_command(self, term: int, data: bytes, callback: Callable[[Any, Any], None]) -> None:
        """Append ``data``, proposed in ``term``, to the log (on the leader);
        ``callback(result, reason)`` runs once it is applied (``result`` being
        :meth:`apply_command`'s) or dropped."""
        if not 0 <= term <= raft_wire.MAX_TERM:
            raise ValueError(f"term {term} out of the coordinator epoch's range")
        self._applyCommand(ENTRY_FORMAT + _TERM.pack(term) + data, callback, REGULAR_COMMAND)

    def apply_command(self, term: int, data: bytes) -> Any:
        """Apply one committed entry's ``data`` (proposed in ``term``); runs on
        the tick thread of every member, in log order."""
        raise NotImplementedError

    def propose_voters(self, data: bytes, callback: Callable[[Any, Any], None]) -> None:
        """Append a voters record (``data``) to the log (on the leader)."""
        self._applyCommand(VOTERS_ENTRY + data, callback, REGULAR_COMMAND)

    def apply_voters(self, data: bytes) -> None:
        """Apply one committed voters record's ``data``; like :meth:`apply_command`."""
        raise NotImplementedError

    def _SyncObj__doApplyCommand(self, command: bytes) -> Any:
        # Replaces pysyncobj's private apply step, which unpickles the entry;
        # pysyncobj calls it for every committed entry, in order.
        kind = command[0]
        if kind == NO_OP_COMMAND:
            return None
        if kind == REGULAR_COMMAND and command[1:2] == ENTRY_FORMAT and len(command) >= _DATA_AT:
            (term,) = _TERM.unpack_from(command, 2)
            return self.apply_command(term, command[_DATA_AT:])
        voters = voters_data(command)
        if voters is not None:
            return self.apply_voters(voters)
        return self.apply_unknown(
            UnknownEntry(
                f"log entry of type {kind} ({len(command)} bytes) is not a coordinator entry "
                "(a journal written by an older version, or a membership command)"
            )
        )

    def announce_commit(self) -> None:
        """Tell the followers the commit index as soon as the entries being
        applied are (called while applying, on the leader): other nodes read
        what they change from their own replica."""
        self._announce = True

    def _SyncObj__applyLogEntries(self) -> bool:
        # pysyncobj's private apply loop; it returns whether to send
        # AppendEntries now, which without its batching is after every
        # entry the leader applies: an empty AppendEntries (and its answer)
        # to each follower only to tell it the new commit index. The
        # followers learn it instead from the next entry, which a busy
        # leader proposes within a tick, or from the next heartbeat
        # (raft.heartbeat.ms), unless an applied entry asked for it
        # (announce_commit).
        self._announce = False
        SyncObj._SyncObj__applyLogEntries(self)
        return self._announce

    def destroy(self) -> None:
        """Stop the member. Entries it was asked to propose that are not
        applied yet are answered as dropped at once (whether they commit is
        for the next leader to say), so that nobody waits on a stopped member."""
        # pysyncobj keeps these callbacks in two private members and drops
        # them, unanswered, on destroy.
        queued = self._SyncObj__commandsQueue
        while True:
            try:
                _command, callback = queued.get_nowait()
            except queue.Empty:
                break
            if callable(callback):
                callback(None, FAIL_REASON.DISCARDED)
        waiting = self._SyncObj__commandsWaitingCommit
        for index in sorted(waiting):
            for _term, callback in waiting.pop(index):
                callback(None, FAIL_REASON.DISCARDED)
        super().destroy()

    def apply_unknown(self, error: UnknownEntry) -> Any:
        """A committed entry that is not a coordinator entry; raises ``error``
        (applying nothing and going on would leave this member's state behind
        the others')."""
        raise error

    def is_leader(self) -> bool:
        """Whether this member is in the leader state (another member may
        still believe it leads, until it hears of the newer term)."""
        # pysyncobj's only public view of this is getStatus(), a debug dump
        # that iterates dictionaries the tick thread changes; reading the one
        # attribute is safe from any thread.
        return bool(self._isLeader())

    def leader_address(self) -> str | None:
        """The Raft address of the last leader this member heard of, or None."""
        # Private for the same reason as is_leader.
        leader = self._getLeader()
        return None if leader is None else str(leader.address)

    def transfer_leadership(self, address: str) -> bool:
        """Ask the follower at Raft address ``address`` to campaign now
        (Raft's TimeoutNow); whether it was asked. pysyncobj asks only from
        a leader and only a follower whose log matches the leader's; the
        follower's election is an ordinary one (its vote rule keeps every
        committed entry), which ends this leadership when it wins."""
        answers: list[Any] = []
        self.transferLeadership(address, lambda _result, reason: answers.append(reason))
        return answers == [FAIL_REASON.SUCCESS]

    def tick(self, wait_s: float) -> None:
        """One pysyncobj tick: waits up to ``wait_s`` for I/O or :meth:`waker`.
        On the leader, the acknowledgements of :meth:`uncounted_members` do not
        count towards committing in it."""
        if self.is_leader():
            self._leave_out(self.uncounted_members())
        self.doTick(wait_s)

    def waker(self) -> Callable[[], None]:
        """A function that ends the wait of the current (or next) :meth:`tick`
        from another thread."""
        # pysyncobj has no public way to wake its poller; its own pipe
        # notifier is registered on ``_poller`` the same way.
        notifier = PipeNotifier(self._poller)
        return notifier.notify  # type: ignore[no-any-return]

    # --- pysyncobj's log handling, for members that fix it ---------------------------

    def _intercept_messages(self, handler: MessageHandler) -> MessageHandler:
        """Put ``handler`` in front of pysyncobj's handler of messages from
        other members; returns pysyncobj's handler for it to call."""
        ours: MessageHandler = self._SyncObj__onMessageReceived
        self._SyncObj__transport.setOnMessageReceivedCallback(handler)
        return ours

    def _log_entries(self) -> Any:
        """pysyncobj's Raft log: ``(command, index, term)`` entries, the first
        one being the last entry of the latest snapshot."""
        return self._SyncObj__raftLog

    def log_entry_count(self) -> int:
        """Entries in this member's Raft log (the first is the last entry of
        the latest snapshot)."""
        return len(self._log_entries())

    def _use_serializer(self, serializer: Any) -> None:
        """Put ``serializer`` in place of pysyncobj's snapshot serializer (log
        compaction and snapshot transfer); it offers the same methods."""
        # Built by SyncObj.__init__ from the config, with no way to pass one in;
        # it is first used on the first tick.
        self._SyncObj__serializer = serializer

    def _hold_election(self) -> None:
        """Keep this member from campaigning for another election timeout."""
        # pysyncobj campaigns once its private election deadline has passed.
        self._SyncObj__raftElectionDeadline = monotonic() + self._SyncObj__conf.raftMaxTimeout

    def uncounted_members(self) -> list[Any]:
        """The members whose acknowledgements the leader does not count
        towards committing (none here; see :meth:`tick`)."""
        return []

    def _leave_out(self, nodes: list[Any]) -> None:
        # pysyncobj's leader commits, at the start of its tick, what a majority
        # of its private match indexes reach: the members left out have theirs
        # at 0 for that, and back (_count_in, a tick callback that runs just
        # before pysyncobj polls) before their answers are read, which move
        # their next index only while their match index grows.
        match = self._SyncObj__raftMatchIndex
        saved = {node: match[node] for node in nodes if node in match}
        for node in saved:
            match[node] = 0
        self._left_out = (int(self.raftCurrentTerm), saved)

    def _count_in(self) -> None:
        term, saved = self._left_out
        self._left_out = (0, {})
        if saved and term == self.raftCurrentTerm and self.is_leader():
            match = self._SyncObj__raftMatchIndex
            for node, value in saved.items():
                if node in match:
                    match[node] = max(match[node], value)

    def match_indexes(self) -> dict[str, int]:
        """On the leader: each member's Raft address and the last index it is
        known to hold (0 until it answers)."""
        return {node.address: int(i) for node, i in self._SyncObj__raftMatchIndex.items()}

    def entry_term(self, index: int) -> int | None:
        """The term of this member's log entry ``index``, if it holds it."""
        raft_log = self._log_entries()
        position = index - raft_log[0][1]
        return int(raft_log[position][2]) if 0 <= position < len(raft_log) else None

    def _acknowledge(self, node: Any, next_index: int) -> None:
        """Answer ``node``'s AppendEntries with success and ``next_index``, as
        pysyncobj does after appending."""
        self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=next_index, success=True)
