"""One shard's Raft replica: pysyncobj as the Raft log, fsm/ as the state.

pysyncobj carries opaque msgpack entries; :meth:`ShardReplica.apply_command`
is the single replicated entry point and hands each entry to
:meth:`fsm.TransactionStateMachine.apply_entry`. Snapshots (pysyncobj's log
compaction and the transfer to a lagging follower) are the state machine's
msgpack snapshot plus the two boundary log entries and a CRC32C, never a
pickle of Python objects, written off the tick thread by
:class:`raftcoord.coordinator.snapshots.SnapshotFile`.

Snapshots and the journal
-------------------------
The tick thread only captures :meth:`fsm.TransactionStateMachine.frozen_state`
(pointer copies); the snapshot file is encoded, written and fsynced in the
background and the journal keeps every entry until it is durable. Two
things pysyncobj does on loading a snapshot are fixed here:

* Started with a snapshot newer than the journal's first entry (a crash
  after the new snapshot was renamed into place but before the journal was
  compacted), pysyncobj clears the journal, entries after the snapshot
  included. When the journal holds the snapshot's two boundary entries, the
  replica first drops the journal's prefix up to them, so pysyncobj keeps
  the tail.
* Installing a large snapshot sent by the leader (restoring the state
  machine from it) can take longer than the election timeout, after which a
  follower would campaign at once although it has just heard from the
  leader. The replica restarts the election timer once the install is done.

Directory identity
------------------
The replica keeps the shard's voters record in force
(:mod:`raftcoord.coordinator.voters`): before the Raft rules see a vote, a
vote request, a pre-vote, a pre-vote's answer or an acknowledgement,
:meth:`ShardReplica._counted` drops it, or takes it without granting or
counting, when its directory is not the recorded one; a learner neither
campaigns nor asks for pre-votes (:meth:`ShardReplica.votes`); the leader
proposes the next record from its tick, and leaves learners out of its
commit count (:meth:`raftcoord.coordinator.raft.RaftGroup.tick`) and of its
check-quorum. The record applied goes into snapshots.

AppendEntries on a follower
---------------------------
pysyncobj's follower deletes every entry after ``prevLogIdx`` whenever its
log is longer, even when the entries it holds are the very ones the message
carries. A duplicate, reordered or stale AppendEntries (e.g. the leader
resending from an older ``nextIndex``, or a batch smaller than what the
follower already acknowledged) therefore shortened the log: acknowledged
entries vanished, and entries already committed and applied were cut and
re-applied. Raft (section 5.3 of the paper) deletes only from the first
*conflicting* entry (same index, another term) and sets the commit index to
at most the last entry the message vouches for.

:class:`ShardReplica` puts its own handler in front of pysyncobj's (the
transport's message callback) and rewrites each AppendEntries that carries
a ``prevLogIdx`` (entries or a heartbeat) before pysyncobj sees it, so that
pysyncobj's own code does only what Raft allows:

* ``prevLogIdx``/``prevLogTerm`` not in the log: passed on unchanged;
  pysyncobj refuses it without touching the log.
* Entries the log already holds with the same term are dropped from the
  message and ``prevLogIdx`` moves up to the last of them, so pysyncobj
  appends only the new entries and deletes only from a real conflict.
* A real conflict is logged (node, shard, index, terms) before pysyncobj
  deletes from it. A conflict at or below the commit or applied index
  cannot happen in Raft; it would mean a diverged state machine, so it is
  logged CRITICAL (once per index and term), nothing is deleted nor
  acknowledged, and the message only counts as a heartbeat (term, leader,
  election timer), so the replica does not disrupt the others by campaigning.
* When every entry is already present and the log goes on past them,
  nothing can be given to pysyncobj without it truncating: the replica
  lets pysyncobj do only the leader/term bookkeeping of the message (with
  the commit index capped at the last vouched entry) and acknowledges
  ``next_node_idx`` itself, exactly as pysyncobj would have after
  truncating.

pysyncobj still does everything else: terms, votes, the election timer,
rejections (``reset`` answers), the commit index (``min(leader commit,
last entry)`` is the Raft rule once the log ends at the vouched entry) and
snapshot installation.

Why rewrite messages rather than replace the handler: pysyncobj's handler
is one private method that also runs elections, leadership transfer and
commit bookkeeping; rewriting its input changes only the log decisions and
leaves the rest to pysyncobj. The cost is reaching four name-mangled
members, all in :class:`raftcoord.coordinator.raft.RaftGroup`;
``tests/test_replica_append_entries.py`` fails if a pysyncobj upgrade
changes them or the behaviour above.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import crc32c
import msgpack

from fsm import ErrorCode, Outcome, TransactionStateMachine, snapshot_pieces
from raftcoord.coordinator import heap
from raftcoord.coordinator.raft import (
    RaftGroup,
    RaftTransportSettings,
    SyncObjConf,
    UnknownEntry,
    proposal_error,
    voters_data,
)
from raftcoord.coordinator.raft_transport import DIRECTORY_MESSAGES
from raftcoord.coordinator.snapshots import SnapshotFile
from raftcoord.coordinator.voters import Record, counts, decode_record, encode_record, proposal

#: 2: the msgpack payload is followed by its CRC32C (1 had none).
SNAPSHOT_FILE_VERSION = 2
_CRC = struct.Struct("<I")

T = TypeVar("T")

log = logging.getLogger("raftcoord.coordinator.replica")

#: Called on every replica after an entry is applied: (index, term, outcomes).
AppliedListener = Callable[[int, int, list[Outcome]], None]
#: Called when a replica's state is replaced by a snapshot (its own at start,
#: or the leader's): (index, term) of the snapshot's last entry.
SnapshotListener = Callable[[int, int], None]

#: Called once a proposed entry is applied or dropped: (outcomes, error), the
#: outcomes being None unless ``error`` is NONE (see
#: :func:`raftcoord.coordinator.raft.proposal_error`).
ProposalCallback = Callable[[list[Outcome] | None, ErrorCode], None]

#: pysyncobj's message type for AppendEntries (entries, heartbeats, snapshots).
APPEND_ENTRIES = "append_entries"
#: A vote request and a pre-vote: a learner grants neither.
VOTE_REQUESTS = frozenset({"request_vote", "pre_vote"})


class SnapshotDamaged(Exception):
    """The snapshot file does not read back as written (its checksum or
    format): the replica cannot know its state, and must not go on from an
    empty one (pysyncobj would: it logs a failed load and continues)."""


class EntryNotApplied(Exception):
    """A committed entry could not be applied (or its effects not recorded).

    The state machine's ``apply_entry`` is total, so this is a bug or a
    broken host (a full disk under the applied-transitions log). pysyncobj
    would apply the same entry again on the next tick, forever, and a
    partly recorded entry twice; the replica must stop instead.
    """

    def __init__(self, index: int) -> None:
        super().__init__(f"committed entry {index} could not be applied")
        self.index = index


class ShardReplica(RaftGroup):
    """A pysyncobj object whose whole state is one :class:`TransactionStateMachine`.

    ``lock`` guards ``machine``: the tick thread applies entries under it and
    readers on other threads take it too. AppendEntries reach pysyncobj
    through :meth:`_on_message` (see the module docstring).
    """

    def __init__(
        self,
        self_address: str,
        partner_addresses: list[str],
        conf: SyncObjConf,
        machine: TransactionStateMachine,
        on_applied: AppliedListener,
        *,
        node_id: int,
        transport: RaftTransportSettings,
        on_snapshot: SnapshotListener | None = None,
    ) -> None:
        # Attributes set before SyncObj.__init__ are treated by pysyncobj as
        # its own; the snapshot file holds only the machine.
        self.machine = machine
        self.node_id = node_id
        self.shard = machine.state.pids.layout.shard
        self.lock = threading.RLock()
        self._on_applied = on_applied
        self._on_snapshot = on_snapshot
        self._refused_conflict: tuple[int, int] | None = None  # (index, term) logged
        self._damaged: SnapshotDamaged | None = None
        # --- directory identity (raftcoord.coordinator.voters)
        self.directory_id = transport.directory_id
        self.members = sorted([self_address, *partner_addresses])
        #: The directory each member last reported (this one's own included).
        self.heard: dict[str, str] = {self_address: transport.directory_id}
        #: The record applied (what a snapshot of the applied state holds).
        self._applied_record: Record | None = None
        #: The record of the snapshot the log starts from.
        self._snapshot_record: Record | None = None
        #: The record in force and the log position it was found at: the
        #: (index, term) of the last entry looked at, the index of the record's
        #: entry (0: the snapshot's or none) and the record.
        self._scan: tuple[tuple[int, int], int, Record | None] | None = None
        #: The term in which this member proposed a record not applied yet.
        self._voters_pending: int | None = None
        #: (member, directory, what) already logged, so each is logged once.
        self._reported: set[tuple[str, str, str]] = set()
        if conf.fullDumpFile is None:
            raise ValueError("a shard replica needs a snapshot file (fullDumpFile)")
        where = f"node={node_id} shard={self.shard}"
        self._snapshots = SnapshotFile(
            conf.fullDumpFile,
            conf.logCompactionBatchSize,
            self._capture_snapshot,
            self._read_snapshot,
            where=where,
        )
        super().__init__(self_address, partner_addresses, conf, transport, where=where)
        self._use_serializer(self._snapshots)

    def tick(self, wait_s: float) -> None:
        """One pysyncobj tick, after keeping the garbage collector off the
        long-lived state (:func:`raftcoord.coordinator.heap.settle`).

        Raises:
            SnapshotDamaged: the snapshot file (at start, or just installed
                from the leader) did not read back.
        """
        heap.settle()
        if self.is_leader() and self.votes():
            self._record_voters(self.voters_record())
        super().tick(wait_s)
        if self._damaged is not None:
            raise self._damaged

    def destroy(self) -> None:
        """Stop the replica, after a snapshot being written is durable."""
        self._snapshots.close()
        super().destroy()

    # --- directory identity ----------------------------------------------------------

    def voters_record(self) -> Record | None:
        """The voters record in force: the latest in the log, else the one of
        the snapshot the log starts from, else None (every member counts)."""
        raft_log = self._log_entries()
        first, last = raft_log[0][1], (raft_log[-1][1], raft_log[-1][2])
        scan = self._scan
        if scan is not None and scan[0] == last:
            return scan[2]
        if scan is not None and first <= scan[0][0] <= last[0]:
            seen_index, seen_term = scan[0]
            if raft_log[seen_index - first][2] == seen_term:
                # The log only grew since: look at the new entries.
                found_at, record = scan[1], scan[2]
                for command, index, _term in raft_log[seen_index - first + 1 :]:
                    found = self._decode_voters(command)
                    if found is not None:
                        found_at, record = index, found
                self._scan = (last, found_at, record)
                return record
        # A new log, or one truncated or compacted since: from its end back.
        found_at, record = 0, self._snapshot_record
        for command, index, _term in reversed(raft_log[:]):
            found = self._decode_voters(command)
            if found is not None:
                found_at, record = index, found
                break
        self._scan = (last, found_at, record)
        return record

    def votes(self) -> bool:
        """Whether this member counts under the record in force (a learner
        neither campaigns nor asks for pre-votes)."""
        return counts(self.voters_record(), self.selfNode.address, self.directory_id)

    def _decode_voters(self, command: bytes) -> Record | None:
        data = voters_data(command)
        return None if data is None else decode_record(data, self.members)

    def uncounted_members(self) -> list[Any]:
        record = self.voters_record()
        return [
            node
            for node in self.otherNodes
            if not counts(record, node.address, self.heard.get(node.address, ""))
        ]

    def _counted(self, node: Any, message: dict[str, Any]) -> dict[str, Any] | None:
        """A vote, vote request, pre-vote, pre-vote answer or acknowledgement
        of ``node`` as the Raft rules may see it, or None when it does not
        count; notes the directory it came from."""
        kind, directory = message["type"], message.get("directory", "")
        self.heard[node.address] = directory
        record = self.voters_record()
        if counts(record, node.address, directory):
            if kind not in VOTE_REQUESTS or self.votes():
                return message
            self._report(
                self.selfNode.address, self.directory_id, "raft_learner_does_not_vote", record
            )
        elif kind == "next_node_idx":
            # A learner: followed and answered, never counted (uncounted_members).
            self._report(node.address, directory, "raft_learner", record)
            return message
        else:
            self._report(node.address, directory, f"raft_{kind}_not_counted", record)
        if kind in VOTE_REQUESTS:
            # Not granted (no log is older than term -1), but a vote request's
            # term is taken as any term is: a member whose directory is new
            # has an empty log that does not know it is a learner, and
            # campaigns; left in a term above the leader's it would never hear
            # from it again. A pre-vote is answered no, with this member's term.
            return {**message, "last_log_term": -1}
        return None

    def _report(self, address: str, directory: str, event: str, record: Record | None) -> None:
        if (address, directory, event) in self._reported:
            return
        self._reported.add((address, directory, event))
        log.warning(
            "node=%d shard=%d event=%s member=%s directory=%s recorded=%s: a member whose "
            "data directory is not the recorded one does not vote, and its votes and "
            "acknowledgements do not count, until it has caught up and is recorded again",
            self.node_id,
            self.shard,
            event,
            address,
            directory or "-",
            (record or {}).get(address, "-"),
        )

    def _record_voters(self, record: Record | None) -> None:
        """On the leader, once its term has an entry committed (all earlier
        ones are then committed too) and the record in force is committed:
        propose the next record, if any (raftcoord.coordinator.voters)."""
        term = int(self.raftCurrentTerm)
        if self._voters_pending == term:
            return
        commit = int(self.raftCommitIndex)
        if self.entry_term(commit) != term or self._scan is None or self._scan[1] > commit:
            return
        caught_up = [a for a, index in self.match_indexes().items() if index >= commit]
        wanted = proposal(record, self.members, self.heard, [self.selfNode.address, *caught_up])
        if wanted is None:
            return
        self._voters_pending = term
        log.info(
            "node=%d shard=%d event=voters_proposed term=%d voters=%s",
            self.node_id,
            self.shard,
            term,
            ",".join(f"{a}={d}" for a, d in sorted(wanted.items())),
        )

        def done(_result: Any, reason: Any) -> None:
            if self._voters_pending == term:
                self._voters_pending = None

        self.propose_voters(encode_record(wanted), done)

    def apply_voters(self, data: bytes) -> None:
        record = decode_record(data, self.members)
        if record is None:
            # Every replica decodes the same bytes alike: all skip it.
            log.error(
                "node=%d shard=%d event=voters_record_ignored index=%d bytes=%d",
                self.node_id,
                self.shard,
                self.raftLastApplied + 1,
                len(data),
            )
            return
        self._applied_record = record
        log.info(
            "node=%d shard=%d event=voters_recorded index=%d voter=%s",
            self.node_id,
            self.shard,
            self.raftLastApplied + 1,
            counts(record, self.selfNode.address, self.directory_id),
        )

    # --- AppendEntries on a follower -----------------------------------------------

    def _on_message(self, node: Any, message: Any) -> None:
        if message.get("type") in DIRECTORY_MESSAGES:
            message = self._counted(node, message)
            if message is None:
                return
        if message.get("type") != APPEND_ENTRIES or message["term"] < self.raftCurrentTerm:
            self._receive(node, message)
            return
        if "prevLogIdx" in message:
            message = self._append_entries(node, message)
        if message is None:
            return
        self._receive(node, message)
        chunk = message.get("serialized")
        if chunk is not None and chunk[2]:
            # The last chunk of a snapshot: pysyncobj has installed it, maybe
            # for longer than an election timeout. The same message again
            # without the chunk restarts the election timer.
            self._follow(node, message, message["commit_index"])

    def _append_entries(self, node: Any, message: dict[str, Any]) -> dict[str, Any] | None:
        """``message`` rewritten so that pysyncobj deletes entries only from a
        real conflict, or None when this method has answered it."""
        raft_log = self._log_entries()
        first, last = raft_log[0][1], raft_log[-1][1]

        def term_at(index: int) -> int:
            return int(raft_log[index - first][2])

        prev = message["prevLogIdx"]
        if not first <= prev <= last or term_at(prev) != message["prevLogTerm"]:
            return message  # pysyncobj refuses it and leaves the log alone
        entries = list(message.get("entries", []))
        fresh: list[Any] = []
        for i, (_command, index, term) in enumerate(entries):
            if index > last or term_at(index) != term:
                fresh = entries[i:]
                break
        vouched = entries[-1][1] if entries else prev  # the message's last entry
        if fresh and fresh[0][1] <= last:
            conflict, leader_term = fresh[0][1], fresh[0][2]
            if conflict <= max(self.raftCommitIndex, self.raftLastApplied):
                self._refuse_conflict(node, message, conflict, term_at(conflict), leader_term)
                return None
            log.warning(
                "node=%d shard=%d event=raft_log_conflict index=%d term=%d leader_entry_term=%d "
                "last_index=%d: deleting the entries from index %d (uncommitted)",
                self.node_id,
                self.shard,
                conflict,
                term_at(conflict),
                leader_term,
                last,
                conflict,
            )
        elif not fresh and vouched < last:
            # All present and the log goes on: nothing to append and nothing
            # to delete, which pysyncobj cannot be told. It does the term and
            # leader bookkeeping; the commit index stops at what the message
            # vouches for, and the answer is the one pysyncobj would send.
            self._follow(node, message, min(message["commit_index"], vouched))
            self._acknowledge(node, vouched + 1)
            return None
        base = fresh[0][1] - 1 if fresh else vouched
        return {**message, "prevLogIdx": base, "prevLogTerm": term_at(base), "entries": fresh}

    def _refuse_conflict(
        self, node: Any, message: dict[str, Any], index: int, own_term: int, leader_term: int
    ) -> None:
        """A conflict at a committed index: never delete it, never acknowledge."""
        if self._refused_conflict != (index, leader_term):
            self._refused_conflict = (index, leader_term)
            log.critical(
                "node=%d shard=%d event=raft_committed_conflict index=%d term=%d "
                "leader_entry_term=%d commit_index=%d applied_index=%d: the leader's log differs "
                "at a committed entry; not deleting it and not acknowledging",
                self.node_id,
                self.shard,
                index,
                own_term,
                leader_term,
                self.raftCommitIndex,
                self.raftLastApplied,
            )
        self._follow(node, message, self.raftCommitIndex)

    def _follow(self, node: Any, message: dict[str, Any], commit_index: int) -> None:
        """Let pysyncobj take ``message`` as a heartbeat (term, leader, election
        timer) carrying ``commit_index``, without touching the log."""
        self._receive(
            node, {"type": APPEND_ENTRIES, "term": message["term"], "commit_index": commit_index}
        )

    def propose(self, term: int, entry: bytes, callback: ProposalCallback) -> None:
        """Propose ``entry``; ``callback(outcomes, error)`` runs once it is
        applied (or dropped). pysyncobj calls it before it counts the entry
        as applied, so an exception escaping it would make the entry apply
        again: it is logged and swallowed here."""

        def guarded(result: Any, reason: Any) -> None:
            error = proposal_error(reason)
            try:
                callback(result if error is ErrorCode.NONE else None, error)
            except Exception:
                log.exception(
                    "node=%d shard=%d event=apply_callback_failed term=%d",
                    self.node_id,
                    self.shard,
                    term,
                )

        self.propose_command(term, entry, guarded)

    def query(self, reader: Callable[[TransactionStateMachine], T]) -> T:
        """``reader``'s answer from the applied state, taken under :attr:`lock`
        (the state as this replica has it now; it may lag the leader's).
        ``reader`` only reads, and returns values, not parts of the state."""
        with self.lock:
            return reader(self.machine)

    def apply_command(self, term: int, entry: bytes) -> list[Outcome]:
        """The replicated entry point: apply one msgpack entry of commands.

        ``term`` is the proposing leader's term, recorded with the entry's
        transitions. Runs on the tick thread of every replica.
        """
        index = self.raftLastApplied + 1
        try:
            with self.lock:
                outcomes = self.machine.apply_entry(entry)
            self._on_applied(index, term, outcomes)
        except Exception as exc:
            raise EntryNotApplied(index) from exc
        return outcomes

    def apply_unknown(self, error: UnknownEntry) -> Any:
        raise EntryNotApplied(self.raftLastApplied + 1) from error

    def _capture_snapshot(self, last: Any, previous: Any) -> Callable[[], bytes]:
        """On the tick thread, with ``last`` the last applied entry: a function
        that encodes the state as it is now, and the two entries, as the
        snapshot file's bytes."""
        with self.lock:
            state = self.machine.frozen_state()
        # The record as of the snapshot's last entry: the one in force once
        # the journal's prefix, which may hold the record's entry, is dropped.
        voters = self._snapshot_record = self._applied_record

        def encode() -> bytes:
            pieces = []
            for piece in snapshot_pieces(state):
                pieces.append(piece)
                time.sleep(0)  # hand the GIL to a shard thread waiting for it
            payload = {
                "v": SNAPSHOT_FILE_VERSION,
                "voters": None if voters is None else encode_record(voters),
                "fsm": b"".join(pieces),
                "last": [bytes(last[0]), last[1], last[2]],
                "previous": [bytes(previous[0]), previous[1], previous[2]],
            }
            packed = bytes(msgpack.packb(payload, use_bin_type=True))
            return packed + _CRC.pack(crc32c.crc32c(packed))

        return encode

    def _read_snapshot(self, path: str) -> tuple[Any, Any, list[Any]]:
        try:
            payload = read_snapshot_file(path)
            restored = TransactionStateMachine.restore(payload["fsm"], self.machine.config)
        except Exception as exc:
            # pysyncobj swallows any error here and goes on with an empty
            # state; the tick raises it instead (see tick).
            self._damaged = SnapshotDamaged(f"{path}: {exc}")
            raise
        with self.lock:
            self.machine = restored
        voters = payload.get("voters")
        self._applied_record = self._snapshot_record = (
            None if voters is None else decode_record(voters, self.members)
        )
        self._scan = None
        last = (payload["last"][0], payload["last"][1], payload["last"][2])
        previous = (payload["previous"][0], payload["previous"][1], payload["previous"][2])
        self._trim_journal_to(previous, last)
        if self._on_snapshot is not None:
            self._on_snapshot(int(last[1]), int(last[2]))
        return last, previous, []

    def _trim_journal_to(self, previous: Any, last: Any) -> None:
        """Drop the journal's entries before ``previous`` when it holds the
        snapshot's boundary entries ``previous`` and ``last`` (see the module
        docstring), as log compaction would have."""
        raft_log = self._log_entries()
        if len(raft_log) < 2:
            return
        position = previous[1] - raft_log[0][1]
        if 0 < position < len(raft_log) - 1 and tuple(raft_log[position]) == previous:
            if tuple(raft_log[position + 1]) == last:
                raft_log.deleteEntriesTo(position)


def read_snapshot_file(path: str) -> dict[str, Any]:
    """The payload of a snapshot file, checked.

    Raises:
        ValueError: the checksum does not match, or the file is not a
            snapshot of this version.
    """
    data = Path(path).read_bytes()
    packed, tail = data[: -_CRC.size], data[-_CRC.size :]
    if len(tail) != _CRC.size or _CRC.unpack(tail)[0] != crc32c.crc32c(packed):
        raise ValueError("checksum mismatch (the file is damaged, or of a version before 2)")
    payload = msgpack.unpackb(packed, raw=False)
    if not isinstance(payload, dict) or payload.get("v") != SNAPSHOT_FILE_VERSION:
        raise ValueError(f"unknown snapshot file version {payload.get('v')!r}")
    return payload
