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

Elections are pysyncobj's with two additions of the Raft thesis (section
9.6; the rules in :mod:`raftcoord.coordinator.election`), run by
:meth:`RaftGroup._elect` before each of pysyncobj's ticks:

* **Pre-vote.** pysyncobj campaigns (raises its term and asks for votes) as
  soon as its election deadline has passed. The group keeps that deadline
  out of reach and its own instead (:attr:`RaftGroup._election_due`, taken
  over whenever pysyncobj restarts its timer: a leader's message, a vote
  given, an election of its own); when it passes, the member asks the
  others for pre-votes, and lets pysyncobj campaign only once a majority
  granted them. A TimeoutNow from the leader (a leadership transfer) lets
  pysyncobj campaign at once, without a pre-vote, as the thesis says. A
  pre-vote answer that carries a term above the member's own gives it that
  term, as an answer to a vote request does in Raft (pysyncobj does not
  answer a vote request of an older term: without this, a member whose log
  is the most up to date but whose term is behind could never be elected).
* **Check-quorum.** A leader that has not had an answer to its
  AppendEntries from a majority of the members whose answers count (itself
  included) within the longest election timeout steps down to follower.
"""

from __future__ import annotations

import functools
import logging
import math
import queue
import random
import struct
from collections.abc import Callable
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj.monotonic import monotonic
from pysyncobj.pipe_notifier import PipeNotifier
from pysyncobj.syncobj import _RAFT_STATE

from fsm import ErrorCode
from raftcoord.coordinator import raft_wire
from raftcoord.coordinator.election import PreVoteRound, grants_pre_vote, quorum_heard
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

#: pysyncobj's election deadline while the group decides when to campaign
#: (pysyncobj campaigns once its deadline has passed; this one never does).
HELD = math.inf

log = logging.getLogger("raftcoord.coordinator.raft")


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
        # pysyncobj's own check-quorum, counting learners too; RaftGroup's
        # (one election timeout, counted members only) acts first.
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

    #: pysyncobj's private election deadline (monotonic s), which _elect holds.
    _SyncObj__raftElectionDeadline: float

    def __init__(
        self,
        self_address: str,
        partner_addresses: list[str],
        conf: SyncObjConf,
        transport: RaftTransportSettings,
        *,
        where: str = "",
    ) -> None:
        """``where`` starts the group's log lines (a replica's ``node=N shard=S``)."""
        self._where = where
        #: An entry applied in this round asked to tell the followers at once.
        self._announce = False
        #: The term and match indexes taken out of this tick's commit count.
        self._left_out: tuple[int, dict[Any, int]] = (0, {})
        # --- elections (see the module docstring), times of monotonic()
        #: When this member's election timeout passes.
        self._election_due = 0.0
        #: The pre-vote this member asked for, if any.
        self._pre_vote: PreVoteRound | None = None
        #: When this member last heard from a leader (an AppendEntries of its
        #: term or a later one).
        self._leader_heard_at: float | None = None
        #: (term, start) of this member's leadership, and when each other
        #: member (Raft address) last answered its AppendEntries.
        self._leading: tuple[int, float] | None = None
        self._answered_at: dict[str, float] = {}
        #: When the last tick began.
        self._ticked_at: float | None = None
        super().__init__(
            self_address,
            partner_addresses,
            conf,
            transportClass=functools.partial(RaftTransport, settings=transport),
        )
        self.addOnTickCallback(self._count_in)
        # pysyncobj's handler of messages from other members; the transport
        # hands every message to _on_message instead, which ends there.
        self._pysyncobj_on_message: MessageHandler = self._SyncObj__onMessageReceived
        self._SyncObj__transport.setOnMessageReceivedCallback(self._on_message)

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

    # --- elections: pre-vote and check-quorum ---------------------------------------

    def votes(self) -> bool:
        """Whether this member may campaign (a learner may not; every member
        may here)."""
        return True

    def _onTick(self, timeToWait: float = 0.0) -> None:
        # pysyncobj's private tick, which doTick (and its own tick thread, in
        # groups that let it tick) calls: the group's election rules first.
        self._elect(monotonic())
        SyncObj._onTick(self, timeToWait)

    def _elect(self, now: float) -> None:
        """Before pysyncobj's tick: check-quorum on a leader; elsewhere, ask
        for pre-votes when the election timeout has passed, and let pysyncobj
        campaign in this tick only after a TimeoutNow or a pre-vote won."""
        deadline = self._SyncObj__raftElectionDeadline
        if deadline != HELD:
            # pysyncobj restarted its election timer, or took a TimeoutNow (0).
            self._election_due = deadline
        ticked, self._ticked_at = self._ticked_at, now
        if self._isLeader():
            self._pre_vote = None
            self._SyncObj__raftElectionDeadline = HELD
            if self._keeps_quorum(now, ticked):
                return
            self._step_down(now)
        self._leading = None
        self._SyncObj__raftElectionDeadline = HELD
        if not self.votes():
            return
        term = int(self.raftCurrentTerm)
        won = self._pre_vote is not None and self._pre_vote.term == term + 1 and self._pre_vote.won
        if won or self._SyncObj__transferInProgress:
            self._pre_vote = None
            self._SyncObj__raftElectionDeadline = 0.0  # pysyncobj campaigns now
        elif now >= self._election_due and self._connected_to_anyone():
            self._ask_pre_votes(now, term)

    def _connected_to_anyone(self) -> bool:
        """Whether a pre-vote could reach anyone (pysyncobj campaigns only
        then too: at start, the member asks once its first connection opens
        instead of an election timeout later)."""
        others = self.otherNodes
        return not others or any(self.isNodeConnected(node) for node in others)

    def _new_election_timeout(self, now: float) -> float:
        conf = self.conf
        return now + random.uniform(conf.raftMinTimeout, conf.raftMaxTimeout)

    def _ask_pre_votes(self, now: float, term: int) -> None:
        self._election_due = self._new_election_timeout(now)
        self._pre_vote = PreVoteRound(term + 1, len(self.otherNodes) + 1)
        self._pre_vote.grant(self.selfNode.address)
        _command, last_index, last_term = self._log_entries()[-1]
        for node in self.otherNodes:
            self._SyncObj__transport.send(
                node,
                {
                    "type": "pre_vote",
                    "term": term + 1,
                    "last_log_index": last_index,
                    "last_log_term": last_term,
                },
            )

    def _answer_pre_vote(self, node: Any, message: dict[str, Any], now: float) -> None:
        if self._isLeader():
            heard: float | None = 0.0
        elif self._getLeader() is None or self._leader_heard_at is None:
            heard = None
        else:
            heard = now - self._leader_heard_at
        _command, last_index, last_term = self._log_entries()[-1]
        term = int(self.raftCurrentTerm)
        granted = grants_pre_vote(
            proposed_term=message["term"],
            current_term=term,
            candidate_log=(message["last_log_term"], message["last_log_index"]),
            own_log=(last_term, last_index),
            leader_heard_s=heard,
            min_timeout_s=self.conf.raftMinTimeout,
        )
        self._SyncObj__transport.send(
            node,
            {
                "type": "pre_vote_answer",
                "term": message["term"],
                "granted": granted,
                "current_term": term,
            },
        )

    def _count_pre_vote(self, node: Any, message: dict[str, Any]) -> None:
        term = int(self.raftCurrentTerm)
        asked = self._pre_vote
        if asked is None or asked.term != message["term"] or asked.term != term + 1:
            return  # not asked, or asked before this member's term changed
        if message["current_term"] > term:
            # Behind the answerer's term: take it, as from a vote request
            # that pysyncobj refuses (no log ends before term -1); the next
            # pre-vote asks for the term after it.
            self._pre_vote = None
            self._pysyncobj_on_message(
                node,
                {
                    "type": "request_vote",
                    "term": message["current_term"],
                    "last_log_index": 0,
                    "last_log_term": -1,
                },
            )
        elif message["granted"]:
            asked.grant(node.address)

    def _keeps_quorum(self, now: float, ticked: float | None) -> bool:
        """On the leader: whether a majority answered within the longest
        election timeout (see :func:`raftcoord.coordinator.election.quorum_heard`)."""
        term = int(self.raftCurrentTerm)
        if self._leading is None or self._leading[0] != term:
            self._leading = (term, now)
            self._answered_at.clear()
            return True
        if ticked is None or now - ticked > self.conf.raftMinTimeout / 2:
            # This thread did not run for a while: the answers that arrived
            # meanwhile are not read yet. The next tick decides.
            return True
        uncounted = {node.address for node in self.uncounted_members()}
        counted = [n.address for n in self.otherNodes if n.address not in uncounted]
        return quorum_heard(
            now,
            self._answered_at,
            counted,
            len(self.otherNodes) + 1,
            self._leading[1],
            self.conf.raftMaxTimeout,
        )

    def _step_down(self, now: float) -> None:
        log.warning(
            "%s event=raft_check_quorum_lost member=%s term=%d timeout_ms=%d: no answer from "
            "a majority within the election timeout; stepping down",
            self._where,
            self.selfNode.address,
            self.raftCurrentTerm,
            round(self.conf.raftMaxTimeout * 1000),
        )
        # What pysyncobj's own leaderFallbackTimeout does, sooner.
        self._SyncObj__setState(_RAFT_STATE.FOLLOWER)
        self._SyncObj__raftLeader = None
        self._election_due = self._new_election_timeout(now)

    def _on_message(self, node: Any, message: Any) -> None:
        """Every message from another member, as the transport hands it over;
        a subclass that looks at messages first overrides this and passes
        them on to :meth:`_receive`."""
        self._receive(node, message)

    def _receive(self, node: Any, message: Any) -> None:
        """Pre-votes and their answers are handled here; every other message
        goes to pysyncobj, noting when a leader or an answer was last heard."""
        kind = message.get("type")
        now = monotonic()
        if kind == "pre_vote":
            self._answer_pre_vote(node, message, now)
            return
        if kind == "pre_vote_answer":
            self._count_pre_vote(node, message)
            return
        if kind == "append_entries" and message["term"] >= self.raftCurrentTerm:
            self._leader_heard_at = now
        elif kind == "next_node_idx":
            self._answered_at[node.address] = now
        self._pysyncobj_on_message(node, message)

    # --- pysyncobj's log handling, for members that fix it ---------------------------

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
