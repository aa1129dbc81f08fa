"""One topic-partition: its segment log plus its producer/transaction state.

Every append and marker takes the partition's lock, checks the request
against :class:`ProducerStates`, appends to the log, then updates the state,
so the LSO and the aborted index change atomically with the append that
moves them. Under ``log.flush.policy=always`` the fsync comes after, without
the lock (group commit, :meth:`Partition.sync_through`): one thread fsyncs
what every append before it wrote while the others wait for it, and
nothing a leader's readers or followers see, nor its high watermark, passes
what is on disk (:meth:`Partition._stored_end`).

The state is saved as a snapshot file when the log rolls to a new segment
and when the partition is closed; opening the partition loads the newest
readable snapshot and replays only the batch headers (and control records)
after it, or the whole log when there is none.

Offsets are handed out only below the partition's *ceiling*, reserved in
the coordinators' metadata by the node (:meth:`Partition.grant`). A
partition that may have lost acknowledged records (an unclean stop under a
flush policy other than ``always``) or whose log is new while offsets were
reserved before (a replaced disk) continues at the ceiling reserved before,
so no offset a reader may have seen is handed out again
(docs/partition-log.md, "Offsets are never reused").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from partition_log import codec, epochs
from partition_log.log import CorruptLog, FsyncPolicy, PartitionLogStore, StoreFailed
from partition_log.producer_state import (
    AbortedTxn,
    ActiveProducer,
    AppendCheck,
    MarkerAction,
    ProducerStates,
    SnapshotError,
    Verdict,
    decode_snapshot,
    encode_snapshot,
)
from raftcoord.protocol.errors import ErrorCode

log = logging.getLogger("raftcoord.partition_log")

#: Offsets a partition reserves at a time; it asks for the next block when
#: fewer than half remain.
OFFSET_BLOCK = 1 << 20
#: Called with the batches (appends and markers) each group fsync of a
#: leader's log covered (:meth:`Partition.sync_through`; the node's metrics).
group_commit_observer: Callable[[int], None] | None = None
#: How long after its first grant a partition that may have lost records
#: keeps comparing its open transactions with the coordinators' decisions
#: (elections after a whole-cluster restart can hide a shard for a while).
MARKER_CHECK_S = 60.0


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """The producer fields of a batch to append."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    transactional: bool


@dataclass(frozen=True, slots=True)
class FetchedBatch:
    """Records of one stored data batch, as a reader receives them."""

    producer_id: int
    producer_epoch: int
    transactional: bool
    records: list[codec.StoredRecord]


@dataclass(frozen=True, slots=True)
class ReplicaRead:
    """A leader's answer to one partition of a follower's fetch."""

    error: ErrorCode
    message: str
    high_watermark: int
    log_start_offset: int
    records: bytes = b""
    #: Where the follower's log diverges from this one (KIP-320), or None.
    diverging: epochs.EpochEnd | None = None


@dataclass(frozen=True, slots=True)
class FetchResult:
    error: ErrorCode
    message: str
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    next_fetch_offset: int
    batches: list[FetchedBatch]
    #: For :meth:`Partition.fetch_raw`: the stored batches, whole, and the
    #: aborted transactions with records among them (read_committed).
    raw: bytes = b""
    aborted: list[AbortedTxn] = field(default_factory=list)


class Partition:
    """A topic-partition owned by this node. Thread-safe."""

    def __init__(
        self,
        topic: str,
        index: int,
        directory: Path,
        *,
        segment_bytes: int,
        index_interval_bytes: int,
        fsync: FsyncPolicy,
        on_change: Callable[[bool], None] = lambda appended: None,
        clean_start: bool = True,
        on_reservation_due: Callable[[], None] = lambda: None,
        on_damage: Callable[[str], bool] = lambda reason: False,
    ) -> None:
        """Open (and recover) the partition in ``directory``. ``on_change`` is called
        with the partition's lock held after each change a leader's readers may see,
        with True when followers may have something new to fetch (the log grew and
        has other replicas, was cut, or gained a replica; :meth:`LogChanges.changed`):
        it wakes parked fetches. ``clean_start``: the node stopped cleanly before (every write
        reached the disk). ``on_reservation_due`` is called when fewer than half
        a block of reserved offsets remain (:meth:`reservation_due`).
        ``on_damage`` is called, with the lock held, when a read finds the
        stored log damaged (a batch that fails its CRC-32C or does not follow
        the one before), with why; it returns True when the partition is
        then fetched again from another replica (the read answers
        KAFKA_STORAGE_ERROR, which clients retry at the new leader), False
        when this copy stays the one served (the read answers
        CORRUPT_MESSAGE)."""
        self.topic = topic
        self.index = index
        #: Reentrant: a follower's fetcher holds it across checking that an
        #: answer still fits the log and applying it (:meth:`follows_from`).
        self.lock = threading.RLock()
        self._on_change = on_change
        self._on_reservation_due = on_reservation_due
        self._on_damage = on_damage
        #: Offsets below it may be handed out; None until the first grant.
        self.ceiling: int | None = None
        self.store = PartitionLogStore(
            directory,
            segment_bytes=segment_bytes,
            index_interval_bytes=index_interval_bytes,
            fsync=fsync,
        )
        #: The high watermark: the offset below which every in-sync replica
        #: holds the log. A leader moves it (:meth:`_advance_high_watermark`),
        #: a follower takes it from its leader's answers. Not kept on disk:
        #: it starts at the log start and catches up with the followers.
        self.high_watermark = self.store.log_start_offset
        #: Transactions completed by a marker the in-sync replicas may not all
        #: have yet: (first offset, marker offset), until the high watermark
        #: passes the marker (Kafka's unreplicated transactions). Until then
        #: the transaction holds the LSO back as an open one does.
        self._unreplicated: list[tuple[int, int]] = []
        start = self._rebuild_state()
        #: The leader epoch this node leads the partition at: stamped into
        #: every batch it appends. It only grows: it starts at the log's last
        #: batch's, and the node raises it to the one the coordinators
        #: record (:meth:`lead`).
        self.leader_epoch = self.store.latest_leader_epoch
        #: Whether this node leads the partition (:meth:`lead`) or follows it
        #: (:meth:`follow`); a partition opened from disk does neither yet.
        self.leading = False
        #: The newest leader epoch at which this replica followed another
        #: leader or stopped leading (-1: none since it opened): a placement
        #: naming it leader at that epoch or an older one is stale.
        self.followed_epoch = -1
        #: While leading: the other replicas and those of them in sync, the
        #: topic's min.insync.replicas, the log end each follower fetched from
        #: last, when (monotonic) each last had the leader's log (Kafka's
        #: lastCaughtUpTime), and each one's last fetch (time, leader's log end).
        self.followers: frozenset[int] = frozenset()
        self.in_sync_followers: frozenset[int] = frozenset()
        self.min_insync_replicas = 1
        self.follower_ends: dict[int, int] = {}
        self.caught_up_at: dict[int, float] = {}
        self._last_fetch: dict[int, tuple[float, int]] = {}
        self._leading_since = 0.0
        #: Whether this replica has appended batches fetched from a leader
        #: since it opened: its log is the leader's, not one that lost records.
        self.replicated = False
        #: Signalled when the high watermark moves or the leadership changes
        #: (acks=all waits on it).
        self._replication = threading.Condition(self.lock)
        #: Signalled when a group fsync ends or the leadership changes
        #: (:meth:`sync_through` waits on it); whether one runs now.
        self._durability = threading.Condition(self.lock)
        self._syncing = False
        #: This replica's own batches appended since the last group fsync began.
        self._unsynced_batches = 0
        self.snapshot_loaded = start
        """The offset of the snapshot the state was loaded from (0: full replay)."""
        recovered = self.store.recovered
        self.may_have_lost = (
            self.store.unsettled
            or recovered.created
            or recovered.bytes_truncated > 0
            or (fsync is not FsyncPolicy.ALWAYS and not clean_start)
        )
        """Whether acknowledged records may be missing from the log (it is new,
        recovery cut a tail, it was not flushed on every append and not
        closed cleanly, or a start before said so and it was not settled
        since: the mark is kept on disk until the first grant,
        :meth:`PartitionLogStore.mark_unsettled`). A tail cut under
        ``always`` was never acknowledged, but this copy cannot tell what it
        held: the replicas that hold the log whole are followed, and its
        offsets are not handed out again."""
        if self.may_have_lost:
            self.store.mark_unsettled()
        #: Until when (monotonic) the node compares the open transactions with
        #: the coordinators' decisions (``PartitionNode.write_owed_markers``);
        #: None: not (nothing can have lost a marker, or the time is over).
        self.check_markers_until: float | None = None

    # --- offset reservations -----------------------------------------------------------

    def reservation_due(self) -> bool:
        """Whether the partition needs (more) reserved offsets."""
        with self.lock:
            return self._reservation_due()

    def _reservation_due(self) -> bool:
        return self.ceiling is None or self.ceiling - self.store.log_end_offset < OFFSET_BLOCK // 2

    def wanted_ceiling(self) -> int:
        """The ceiling to reserve now: a block past the log end."""
        with self.lock:
            return self.store.log_end_offset + OFFSET_BLOCK

    def assume_lost(self) -> None:
        """Treat the log as possibly missing records whose offsets were handed
        out (its directory was accepted in place of the one on record), unless
        offsets were granted already.

        Raises:
            OSError: the mark could not be made durable.
        """
        with self.lock:
            if self.ceiling is None:
                self.may_have_lost = True
                self.store.mark_unsettled()

    def grant(self, previous: int, ceiling: int) -> int | None:
        """The coordinators reserved offsets below ``ceiling`` (the one before was
        ``previous``). At the first grant, a partition that :attr:`may_have_lost`
        records and ends below ``previous`` continues at ``previous``; returns
        the log end it skipped from, or None. Such a partition with records
        then has its open transactions checked for a while
        (:attr:`check_markers_until`).

        Raises:
            OSError, StoreFailed: the skip could not be recorded (nothing is
                appended until a later grant succeeds).
        """
        with self.lock:
            skipped = None
            if self.ceiling is None:
                end = self.store.log_end_offset
                if self.may_have_lost and not self.replicated and end < previous:
                    self.store.skip_to(previous)
                    # The state as of the new start: recovery keeps no snapshot
                    # outside the log, so the producers would be forgotten.
                    self._save_snapshot_at(previous)
                    skipped = end
                if self.may_have_lost and end > 0:
                    self.check_markers_until = time.monotonic() + MARKER_CHECK_S
                self.store.settle()
            self.ceiling = max(self.ceiling or 0, previous, ceiling)
            return skipped

    def settle_replica(self) -> None:
        """This replica left every ISR for the records it may have lost: the
        log is a follower's from now on, caught up by its leader before it
        counts as in sync again.

        Raises:
            OSError: the mark could not be removed.
        """
        with self.lock:
            self.may_have_lost = False
            self.store.settle()

    def _append_refusal(self, count: int) -> str | None:
        """Why ``count`` more offsets cannot be handed out now, or None: this
        replica does not lead (a follower's log takes only its leader's
        batches), or its offsets are not reserved (the caller holds the
        lock)."""
        if not self.leading:
            return (
                f"partition {self.topic}-{self.index} is not led here (leader epoch "
                f"{self.leader_epoch}); retry"
            )
        if self.ceiling is None:
            return (
                f"partition {self.topic}-{self.index} is opening (its offsets are not "
                "reserved with the coordinators yet); retry"
            )
        if self.store.log_end_offset + count > self.ceiling:
            self._on_reservation_due()
            return (
                f"partition {self.topic}-{self.index} has no reserved offsets left "
                f"(ceiling {self.ceiling}); retry"
            )
        return None

    def _rebuild_state(self) -> int:
        """The producer state (and the unreplicated transactions) as of the log
        end: the newest readable snapshot, then the batches after it replayed.
        Returns the snapshot's offset (0: full replay). The caller holds the
        lock, or the partition is opening."""
        self._unreplicated = []
        self.states, start = self._load_snapshot()
        for header, body in self.store.batches(start):
            self._replay(header, body)
        self.states.trim(self.store.log_start_offset)
        return start

    def _load_snapshot(self) -> tuple[ProducerStates, int]:
        """The newest readable snapshot at or above the log start offset (recovery
        already dropped those past the log end), else an empty state at offset 0."""
        for offset in reversed(self.store.snapshot_offsets()):
            if offset < self.store.log_start_offset:
                break
            try:
                found, states = decode_snapshot(self.store.read_snapshot(offset))
                if found != offset:
                    raise SnapshotError(f"the file holds the state at offset {found}")
            except (OSError, SnapshotError) as exc:
                log.warning(
                    "partition=%s-%d event=snapshot_unusable offset=%d error=%s",
                    self.topic,
                    self.index,
                    offset,
                    exc,
                )
                continue
            return states, offset
        return ProducerStates(), 0

    def _save_snapshot_at(self, offset: int) -> None:
        """Write the state, which must be the state after every batch below ``offset``
        (the caller holds the lock). A failure is logged only: a missing snapshot costs a
        longer replay, not data."""
        try:
            self.store.write_snapshot(offset, encode_snapshot(self.states, offset))
        except OSError as exc:
            log.warning(
                "partition=%s-%d event=snapshot_failed offset=%d error=%r",
                self.topic,
                self.index,
                offset,
                exc,
            )

    def _replay(self, header: codec.BatchHeader, body: bytes | None) -> None:
        if header.is_control:
            assert body is not None
            marker = codec.read_marker(body)
            self._completing(header.producer_id, header.base_offset)
            self.states.on_marker(
                header.producer_id,
                header.producer_epoch,
                marker.coordinator_epoch,
                marker.commit,
                header.base_offset,
                timestamp_ms=header.max_timestamp,
                txn_number=marker.txn_number,
            )
        else:
            self.states.on_append(
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
                header.base_offset,
                header.last_offset,
                header.is_transactional,
                timestamp_ms=header.max_timestamp,
            )

    # --- writes --------------------------------------------------------------------

    def lead(
        self,
        leader_epoch: int,
        in_sync_followers: frozenset[int] = frozenset(),
        min_insync_replicas: int = 1,
        followers: frozenset[int] = frozenset(),
    ) -> bool:
        """This node leads the partition at ``leader_epoch``, with these other
        replicas, ``in_sync_followers`` of them in sync. Returns False,
        changing nothing, for a stale placement: an epoch older than this
        replica knows, or one at which it followed or stopped leading (a
        request that looked the placement up before a refresh moved the
        leadership must not make a second leader of a newer epoch)."""
        if (
            self.leading
            and leader_epoch == self.leader_epoch
            and in_sync_followers == self.in_sync_followers
            and min_insync_replicas == self.min_insync_replicas
            and followers == self.followers
        ):
            return True
        with self.lock:
            if leader_epoch < self.leader_epoch or leader_epoch <= self.followed_epoch:
                return False
            self.leader_epoch = leader_epoch
            if not self.leading:
                self.follower_ends, self.caught_up_at, self._last_fetch = {}, {}, {}
                self._leading_since = time.monotonic()
            self.leading = True
            joined = (followers | in_sync_followers) - self.followers
            self.followers = followers | in_sync_followers
            self.in_sync_followers = in_sync_followers
            self.min_insync_replicas = min_insync_replicas
            self._advance_high_watermark()
            self._replication.notify_all()
            self._durability.notify_all()
            if joined:  # their fetches may have parked while the appends woke none
                self._on_change(True)
            return True

    def wanted_in_sync(self, now: float, lag_s: float) -> frozenset[int] | None:
        """While leading, the followers that should be in sync now when that
        differs from those that are, else None: an in-sync follower that has
        not had the leader's log for ``lag_s`` (replica.lag.time.max.ms)
        leaves; another whose log reaches the high watermark and this
        leader epoch's first offset joins (Kafka's rules)."""
        with self.lock:
            if not self.leading:
                return None
            since = now - lag_s
            keep = {
                r
                for r in self.in_sync_followers
                if self.caught_up_at.get(r, self._leading_since) >= since
            }
            history = self.store.epochs
            epoch_start = (
                history.entries[-1].start_offset
                if history.latest_epoch == self.leader_epoch
                else self.store.log_end_offset  # nothing appended at this epoch yet
            )
            floor = max(self.high_watermark, epoch_start)
            join = {
                r
                for r in self.followers - self.in_sync_followers
                if self.follower_ends.get(r, -1) >= floor
            }
            wanted = frozenset(keep | join)
            return None if wanted == self.in_sync_followers else wanted

    def follow(self, leader_epoch: int) -> bool:
        """Another node leads the partition at ``leader_epoch``: appends come
        from it (:meth:`append_replicated`); writes waiting here for their
        replication give up. Returns False, changing nothing, when this
        replica knows a newer epoch: the placement that names that leader is
        stale, and a replica that appended at a newer epoch (as leader) must
        not be cut back to the log of an older one."""
        if leader_epoch < self.leader_epoch:
            return False
        if (
            not self.leading
            and leader_epoch == self.leader_epoch
            and leader_epoch <= self.followed_epoch
        ):
            return True
        with self.lock:
            if leader_epoch < self.leader_epoch:
                return False
            self.leader_epoch = leader_epoch
            self.followed_epoch = max(self.followed_epoch, leader_epoch)
            self.leading = False
            self._replication.notify_all()
            self._durability.notify_all()
        return True

    def _advance_high_watermark(self, wake_fetches: bool = True) -> None:
        """While leading: the lowest log end of the in-sync replicas (this
        one's as far as it is on disk, :meth:`_stored_end`), which only grows
        (the caller holds the lock); wakes what waits for it (parked Fetches
        too, unless the caller does)."""
        if not self.leading:
            return
        end = self._stored_end()
        ends = [self.follower_ends.get(r, self.high_watermark) for r in self.in_sync_followers]
        moved = min([end, *ends])
        if moved > self.high_watermark:
            self.high_watermark = moved
            self._replication.notify_all()
            if wake_fetches:
                self._on_change(False)

    def replication_problem(self) -> tuple[ErrorCode, str] | None:
        """Why an acks=all write may not be appended now, or None (Kafka's
        check before appending: enough in-sync replicas)."""
        in_sync = len(self.in_sync_followers) + 1
        if in_sync < self.min_insync_replicas:
            return (
                ErrorCode.NOT_ENOUGH_REPLICAS,
                f"partition {self.topic}-{self.index} has {in_sync} in-sync replicas, fewer "
                f"than its min.insync.replicas {self.min_insync_replicas}; retry",
            )
        return None

    def wait_replicated(self, offset: int, timeout_s: float) -> tuple[ErrorCode, str]:
        """Wait until the high watermark reaches ``offset`` (every in-sync
        replica has what lies below it): NONE; or REQUEST_TIMED_OUT,
        NOT_LEADER_OR_FOLLOWER (no longer the leader) or, as Kafka answers,
        NOT_ENOUGH_REPLICAS_AFTER_APPEND (reached, but the in-sync replicas
        are fewer than min.insync.replicas by then)."""
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while self.high_watermark < offset:
                if not self.leading:
                    return (
                        ErrorCode.NOT_LEADER_OR_FOLLOWER,
                        f"partition-log node no longer leads {self.topic}-{self.index}; "
                        "the write may or may not be replicated",
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    return (
                        ErrorCode.REQUEST_TIMED_OUT,
                        f"the in-sync replicas of {self.topic}-{self.index} did not all "
                        f"have offset {offset - 1} in {timeout_s:.1f} s",
                    )
                self._replication.wait(left)
            if len(self.in_sync_followers) + 1 < self.min_insync_replicas:
                return (
                    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                    f"offset {offset - 1} of {self.topic}-{self.index} is on every in-sync "
                    f"replica, but they are fewer than min.insync.replicas "
                    f"{self.min_insync_replicas}",
                )
        return ErrorCode.NONE, ""

    def log_end(self) -> int:
        with self.lock:
            return self.store.log_end_offset

    def check(self, spec: BatchSpec) -> AppendCheck:
        """What :meth:`append` would decide now, without appending."""
        with self.lock:
            return self._check(spec, verified=False)

    def _check(self, spec: BatchSpec, verified: bool) -> AppendCheck:
        return self.states.check_append(
            spec.producer_id,
            spec.producer_epoch,
            spec.base_sequence,
            spec.record_count,
            spec.transactional,
            verified,
        )

    def append(self, spec: BatchSpec, batch: bytearray, verified: bool) -> AppendCheck:
        """Append ``batch`` (encoded from ``spec``) unless the state refuses it.

        Returns the check; on APPEND and DUPLICATE ``base_offset`` is set,
        once the batch is stored as the flush policy asks (under ``always``
        on disk: :meth:`sync_through`, whose error it returns otherwise). A
        VERIFY verdict means the transaction was not verified yet: nothing
        was appended.
        """
        with self.lock:
            check = self._check(spec, verified)
            if check.ok and check.verdict is Verdict.APPEND:
                check = self._append_checked(spec, batch)
            if check.base_offset < 0:  # refused, failed, or to be verified first
                return check
            # A duplicate's original may be waiting for its fsync too.
            end, epoch = self.store.log_end_offset, self.leader_epoch
        code, message = self.sync_through(end, epoch)
        if code is not ErrorCode.NONE:
            return AppendCheck(None, code, message)
        return check

    def _append_checked(self, spec: BatchSpec, batch: bytearray) -> AppendCheck:
        """Append a batch the state accepted (the caller holds the lock)."""
        refused = self._append_refusal(spec.record_count)
        if refused is not None:
            return AppendCheck(None, ErrorCode.NOT_LEADER_OR_FOLLOWER, refused)
        try:
            base = self._append(batch)
        except (OSError, StoreFailed) as exc:
            log.error("partition=%s-%d event=append_failed error=%r", self.topic, self.index, exc)
            return AppendCheck(None, ErrorCode.KAFKA_STORAGE_ERROR, f"storage error: {exc}")
        self.states.on_append(
            spec.producer_id,
            spec.producer_epoch,
            spec.base_sequence,
            base,
            base + spec.record_count - 1,
            spec.transactional,
            timestamp_ms=codec.parse_header(batch).max_timestamp,
        )
        return AppendCheck(Verdict.APPEND, base_offset=base)

    def write_marker(
        self,
        producer_id: int,
        epoch: int,
        coordinator_epoch: int,
        commit: bool,
        timestamp_ms: int,
        admin_abort: bool = False,
        transaction_version: int = 2,
        txn_number: int = -1,
        *,
        sync: bool = True,
    ) -> tuple[ErrorCode, str]:
        """Append a COMMIT/ABORT control record for ``producer_id`` (if it is
        due: :meth:`ProducerStates.check_marker`). An ``admin_abort`` (an
        ABORT from an administrator, not the coordinator) is refused unless
        it ends the producer's open transaction here
        (:meth:`ProducerStates.check_admin_abort`). With ``sync``, answers
        once the log up to its end is stored as the flush policy asks
        (:meth:`sync_through`); without, the caller calls it (one fsync
        for many markers)."""
        with self.lock:
            code, message = self._write_marker(
                producer_id,
                epoch,
                coordinator_epoch,
                commit,
                timestamp_ms,
                admin_abort,
                transaction_version,
                txn_number,
            )
            if code is not ErrorCode.NONE or not sync:
                return code, message
            end, leader_epoch = self.store.log_end_offset, self.leader_epoch
        return self.sync_through(end, leader_epoch)

    def _write_marker(
        self,
        producer_id: int,
        epoch: int,
        coordinator_epoch: int,
        commit: bool,
        timestamp_ms: int,
        admin_abort: bool,
        transaction_version: int,
        txn_number: int,
    ) -> tuple[ErrorCode, str]:
        """:meth:`write_marker` without the fsync (the caller holds the lock)."""
        if admin_abort:
            code, message = self.states.check_admin_abort(producer_id, epoch, coordinator_epoch)
            if code is not ErrorCode.NONE:
                return code, message
        action = self.states.check_marker(
            producer_id, epoch, coordinator_epoch, transaction_version, txn_number
        )
        if action is MarkerAction.FENCED:
            seen = self.states.producers[producer_id].coordinator_epoch
            return (
                ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                f"coordinator epoch {coordinator_epoch} is older than {seen}",
            )
        if action is MarkerAction.WRITE:
            refused = self._append_refusal(1)
            if refused is not None:
                return ErrorCode.NOT_LEADER_OR_FOLLOWER, refused
            batch = codec.encode_control_batch(
                commit=commit,
                producer_id=producer_id,
                producer_epoch=epoch,
                coordinator_epoch=coordinator_epoch,
                timestamp_ms=timestamp_ms,
                txn_number=txn_number,
            )
            try:
                offset = self._append(batch)
            except (OSError, StoreFailed) as exc:
                log.error(
                    "partition=%s-%d event=marker_failed error=%r", self.topic, self.index, exc
                )
                return ErrorCode.KAFKA_STORAGE_ERROR, f"storage error: {exc}"
            self._completing(producer_id, offset)
            self.states.on_marker(
                producer_id,
                epoch,
                coordinator_epoch,
                commit,
                offset,
                timestamp_ms=timestamp_ms,
                txn_number=txn_number,
            )
        return ErrorCode.NONE, ""

    def _completing(self, producer_id: int, marker_offset: int) -> None:
        """A marker at ``marker_offset`` ends ``producer_id``'s open transaction
        here (if any): it stays unstable until the high watermark passes the
        marker (the caller holds the lock)."""
        first = self.states.open_txns.get(producer_id)
        if first is not None and marker_offset >= self.high_watermark:
            self._unreplicated.append((first, marker_offset))

    def _last_stable_offset(self) -> int:
        """The LSO: below the high watermark, the first open transaction's
        first offset, and the first offset of every transaction whose marker
        the high watermark has not passed yet (the caller holds the lock)."""
        hw = self.high_watermark
        self._unreplicated = [(f, m) for f, m in self._unreplicated if m >= hw]
        return min([self.states.last_stable_offset(hw), *(f for f, _ in self._unreplicated)])

    def _append(self, batch: bytearray) -> int:
        """Append to the store, stamped with the leader epoch (:meth:`_store`)."""
        codec.set_partition_leader_epoch(batch, self.leader_epoch)
        base = self._store(batch)
        if self._reservation_due():
            self._on_reservation_due()
        return base

    def _store(self, batch: bytearray, replicated: bool = False) -> int:
        """Append to the store, not fsynced yet (:meth:`sync_through` for this
        replica's own batches, :meth:`append_replicated` for a follower's);
        when that rolled a new segment, snapshot the state as of the new
        segment's base offset (the batch is not in the state yet), as Kafka
        does at every roll. A batch of this replica's own (not ``replicated``
        from the leader) is seen by readers once stored (:meth:`_stored`):
        at once unless the flush policy is ``always``, else at its fsync."""
        active = self.store.active_base_offset
        base = self.store.append(batch, sync=False)
        if self.store.active_base_offset != active:
            self._save_snapshot_at(base)
        if not replicated:
            if self.store.fsync is FsyncPolicy.ALWAYS:
                self._unsynced_batches += 1
            else:
                self._stored()
        return base

    def _stored_end(self) -> int:
        """The end of what this replica's readers and followers may see and its
        high watermark may reach: the log end, or under the flush policy
        ``always`` what is on disk of it (the caller holds the lock)."""
        if self.store.fsync is FsyncPolicy.ALWAYS:
            return self.store.synced_end_offset
        return self.store.log_end_offset

    def _stored(self) -> None:
        """This replica's own batches reached :meth:`_stored_end`: move the high
        watermark and wake parked fetches, followers' only when the partition
        has other replicas; nothing fetches from a follower (the caller holds
        the lock)."""
        self._advance_high_watermark(wake_fetches=False)
        self._on_change(bool(self.followers))

    def sync_through(self, offset: int, leader_epoch: int) -> tuple[ErrorCode, str]:
        """Wait until the log below ``offset``, appended while leading at
        ``leader_epoch``, is stored as the flush policy asks (under ``always``:
        fsynced). Group commit: when no other thread is fsyncing the log, this
        one fsyncs everything written up to now, without the lock, so appends
        go on meanwhile; the others wait for it and are released once what it
        synced covers their offset (or fsync next, for what was written after
        it began).

        Returns NONE; NOT_LEADER_OR_FOLLOWER when this replica no longer leads
        at ``leader_epoch`` (what it appended may be cut: retriable); or
        KAFKA_STORAGE_ERROR when the store failed (a failed fsync stops the
        node process before that, through ``fsync_failure_handler``).
        """
        while True:
            with self.lock:
                while True:
                    if not self.leading or self.leader_epoch != leader_epoch:
                        return (
                            ErrorCode.NOT_LEADER_OR_FOLLOWER,
                            f"partition-log node no longer leads {self.topic}-{self.index} at "
                            f"leader epoch {leader_epoch}; the write may or may not be stored",
                        )
                    if self._stored_end() >= offset:
                        return ErrorCode.NONE, ""
                    if not self._syncing:
                        break
                    self._durability.wait()
                try:
                    ticket = self.store.begin_sync()
                except (OSError, StoreFailed) as exc:
                    return self._sync_failed(exc)
                # Leading at the same epoch: the log was not cut below ``offset``.
                assert ticket is not None
                self._syncing = True
                batches, self._unsynced_batches = self._unsynced_batches, 0
            # Until it returns, the fsync counts as failed (the store with it).
            error: OSError | None = OSError("the fsync did not complete")
            try:
                error = ticket.run()
            finally:
                with self.lock:
                    self.store.finish_sync(ticket, error)
                    self._syncing = False
                    self._durability.notify_all()
                    if error is None:
                        self._stored()
            if error is not None:
                return self._sync_failed(error)
            if group_commit_observer is not None:
                group_commit_observer(batches)

    def _sync_failed(self, exc: Exception) -> tuple[ErrorCode, str]:
        log.error("partition=%s-%d event=sync_failed error=%r", self.topic, self.index, exc)
        return ErrorCode.KAFKA_STORAGE_ERROR, f"storage error: {exc}"

    # --- replication ---------------------------------------------------------------

    def append_replicated(self, batches: list[bytes]) -> None:
        """Append batches fetched from the leader, as they are (offsets, leader
        epochs, producer fields), bringing the producer state, the aborted index
        and the LSO along as replay at start does. A batch past the log end
        follows a gap in the leader's log, which is kept here too.

        Raises:
            ValueError: a batch fails its CRC-32C or starts below the log end
                (nothing from it on is appended).
            OSError, StoreFailed: the store failed.
        """
        with self.lock:
            try:
                for data in batches:
                    self._append_replicated(data)
            finally:
                # One fsync for what was appended (log.flush.policy always),
                # before the next fetch tells the leader this log end.
                if self.store.fsync is FsyncPolicy.ALWAYS:
                    self.store.sync()
            self.replicated = True
            self.leader_epoch = max(self.leader_epoch, self.store.latest_leader_epoch)

    def _append_replicated(self, data: bytes) -> None:
        header = codec.parse_header(data)
        if not codec.crc_ok(data) or header.size != len(data):
            raise ValueError(
                f"partition {self.topic}-{self.index}: the batch at offset "
                f"{header.base_offset} from the leader does not match its CRC-32C"
            )
        end = self.store.log_end_offset
        if header.base_offset < end:
            raise ValueError(
                f"partition {self.topic}-{self.index}: the leader's batch at offset "
                f"{header.base_offset} is below the log end {end}"
            )
        if header.base_offset > end:
            self.store.skip_to(header.base_offset)
        self._store(bytearray(data), replicated=True)
        self._replay(header, bytes(data) if header.is_control else None)

    def follows_from(self, leader_epoch: int, log_end: int, last_epoch: int) -> bool:
        """Whether this replica follows the leader of ``leader_epoch`` and its
        log ends at ``log_end`` after a batch of ``last_epoch``: what a fetch
        asked from, so that its answer applies (the caller holds the lock
        across this and the applying)."""
        return (
            not self.leading
            and self.leader_epoch == leader_epoch
            and self.follower_state() == (log_end, last_epoch)
        )

    def follower_state(self) -> tuple[int, int]:
        """(log end offset, leader epoch of the last batch or -1): what a
        follower's fetch names (KIP-320)."""
        with self.lock:
            end = self.store.log_end_offset
            last = self.store.epochs.latest_epoch if end > self.store.log_start_offset else -1
            return end, last

    def set_follower_high_watermark(self, leader_high_watermark: int) -> None:
        """A follower's high watermark: its leader's, within its own log. A log
        that reaches its leader's high watermark holds every acknowledged
        record: whatever it may have lost before (:attr:`may_have_lost`) is
        back.

        Raises:
            OSError: the log could not be marked settled.
        """
        with self.lock:
            self.replicated = True
            end = self.store.log_end_offset
            self.high_watermark = max(self.store.log_start_offset, min(leader_high_watermark, end))
            if self.may_have_lost and end >= leader_high_watermark:
                self.may_have_lost = False
                self.store.settle()

    def restart_at(self, offset: int) -> None:
        """Empty the log and continue it at ``offset`` (a follower whose log
        ends below its leader's log start offset).

        Raises:
            OSError, StoreFailed: the store failed.
        """
        with self.lock:
            self.store.truncate_to(self.store.log_start_offset)
            if offset > self.store.log_end_offset:
                self.store.skip_to(offset)
            self._rebuild_state()
            self._save_snapshot_at(self.store.log_end_offset)
            self.high_watermark = self.store.log_start_offset
            self._on_change(True)

    def replica_read(
        self, replica: int, fetch_offset: int, last_fetched_epoch: int, max_bytes: int
    ) -> ReplicaRead:
        """A leader's answer to follower ``replica`` fetching from ``fetch_offset``
        after a batch of ``last_fetched_epoch``: where its log diverges from
        this one, or the stored batches from ``fetch_offset``, up to
        :meth:`_stored_end` (its fetch offset is its log end: the high
        watermark moves with it)."""
        with self.lock:
            start, end = self.store.log_start_offset, self.store.log_end_offset
            if last_fetched_epoch >= 0:
                epoch_end = self.store.epochs.end_offset_for(last_fetched_epoch, end)
                if epoch_end.epoch < last_fetched_epoch or epoch_end.end_offset < fetch_offset:
                    return ReplicaRead(
                        ErrorCode.NONE, "", self.high_watermark, start, diverging=epoch_end
                    )
            if not start <= fetch_offset <= end:
                return ReplicaRead(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"offset {fetch_offset} is outside [{start}, {end}]",
                    self.high_watermark,
                    start,
                )
            # Followers get what is stored (_stored_end): were the leader's
            # machine to lose the rest, no replica may hold it in sync.
            stored = self._stored_end()
            now = time.monotonic()
            previous = self._last_fetch.get(replica)
            if fetch_offset >= stored:
                self.caught_up_at[replica] = now
            elif previous is not None and fetch_offset >= previous[1]:
                self.caught_up_at[replica] = max(self.caught_up_at.get(replica, 0.0), previous[0])
            self._last_fetch[replica] = (now, stored)
            if self.follower_ends.get(replica, -1) != fetch_offset:
                self.follower_ends[replica] = fetch_offset
                self._advance_high_watermark()
            try:
                raw = self.store.read(fetch_offset, max_bytes, stored, verify=True)
            except (OSError, StoreFailed, CorruptLog) as exc:
                self._log_unreadable(fetch_offset, exc)
                if isinstance(exc, CorruptLog):
                    self._on_damage(str(exc))
                return ReplicaRead(
                    ErrorCode.KAFKA_STORAGE_ERROR,
                    f"storage error: {exc}",
                    self.high_watermark,
                    start,
                )
            return ReplicaRead(ErrorCode.NONE, "", self.high_watermark, start, b"".join(raw))

    def truncate_to(self, offset: int) -> None:
        """Cut the log at ``offset`` (where it may differ from the leader's) and
        rebuild the producer state from the newest snapshot at or below it.

        Raises:
            ValueError: ``offset`` is outside the log or inside a batch.
            OSError, StoreFailed: the store failed.
        """
        with self.lock:
            if offset >= self.store.log_end_offset:
                return
            self.store.truncate_to(offset)
            self._rebuild_state()
            self.high_watermark = min(self.high_watermark, self.store.log_end_offset)
            self._on_change(True)

    def epoch_end(self, leader_epoch: int) -> epochs.EpochEnd:
        """Where ``leader_epoch`` ends in this log (:meth:`LeaderEpochs.end_offset_for`)."""
        with self.lock:
            return self.store.epochs.end_offset_for(leader_epoch, self.store.log_end_offset)

    # --- reads ---------------------------------------------------------------------

    def active_producers(self) -> list[ActiveProducer]:
        """The producers this partition keeps state for (DescribeProducers)."""
        with self.lock:
            return self.states.active_producers()

    def open_transactions(self) -> list[ActiveProducer]:
        """The producers with a transaction open here."""
        with self.lock:
            return [p for p in self.states.active_producers() if p.current_txn_start_offset >= 0]

    def offsets(self) -> tuple[int, int, int]:
        """(log start offset, last stable offset, high watermark)."""
        with self.lock:
            hw = self.high_watermark
            return self.store.log_start_offset, self._last_stable_offset(), hw

    def fetch(self, offset: int, max_bytes: int, read_committed: bool) -> FetchResult:
        """Records from ``offset``: up to the high watermark, or under
        read_committed up to the LSO and without aborted transactions.
        Control records are never returned.

        A stored batch that cannot be read (storage failure, or a batch that
        fails :func:`codec.read_batch`, such as one appended before the
        checks existed) answers an error for this partition only; records
        of the batches before it are served first, so the error comes when a
        fetch starts at the unreadable batch."""
        read = self._read(offset, max_bytes, read_committed)
        if isinstance(read, FetchResult):
            return read
        raw, aborted, (end, lso, start) = read
        batches = []
        next_offset = offset
        for data in raw:
            header = codec.parse_header(data)
            if not _hidden(header, aborted):
                try:
                    records = codec.read_batch(data)
                except codec.InvalidBatch as exc:
                    if next_offset > offset:
                        break  # serve what precedes it; the next fetch starts here
                    self._log_unreadable(header.base_offset, exc)
                    return FetchResult(
                        self._corrupt_answer(data, str(exc)),
                        f"the batch at offsets {header.base_offset}..{header.last_offset} "
                        f"cannot be read: {exc}",
                        end,
                        lso,
                        start,
                        offset,
                        [],
                    )
                batches.append(
                    FetchedBatch(
                        header.producer_id,
                        header.producer_epoch,
                        header.is_transactional,
                        [r for r in records if r.offset >= offset],
                    )
                )
            next_offset = header.next_offset
        return FetchResult(ErrorCode.NONE, "", end, lso, start, next_offset, batches)

    def fetch_raw(self, offset: int, max_bytes: int, read_committed: bool) -> FetchResult:
        """The stored batches from the one holding ``offset`` on, whole, as
        Kafka's Fetch returns them: up to the high watermark, or under
        read_committed up to the LSO with the aborted transactions among
        them (the reader skips their records and the control batches).
        Every batch was checked against its CRC-32C as it was read."""
        read = self._read(offset, max_bytes, read_committed)
        if isinstance(read, FetchResult):
            return read
        raw, aborted, (end, lso, start) = read
        served: list[bytes] = []
        next_offset = offset
        for data in raw:
            header = codec.parse_header(data)
            if not codec.crc_ok(data):
                if served:
                    break  # serve what precedes it; the next fetch starts here
                self._log_unreadable(header.base_offset, codec.CorruptBatch("CRC-32C mismatch"))
                return FetchResult(
                    self._corrupt_answer(data, "CRC-32C mismatch"),
                    f"the batch at offsets {header.base_offset}..{header.last_offset} "
                    "does not match its CRC-32C",
                    end,
                    lso,
                    start,
                    offset,
                    [],
                )
            served.append(data)
            next_offset = header.next_offset
        return FetchResult(
            ErrorCode.NONE, "", end, lso, start, next_offset, [], b"".join(served), aborted
        )

    def _read(
        self, offset: int, max_bytes: int, read_committed: bool
    ) -> tuple[list[bytes], list[AbortedTxn], tuple[int, int, int]] | FetchResult:
        """The stored batches a fetch from ``offset`` returns, the aborted
        transactions among them (read_committed) and (high watermark, LSO,
        log start offset); or the failed fetch."""
        with self.lock:
            start = self.store.log_start_offset
            end = self.store.log_end_offset
            hw = self.high_watermark
            lso = self._last_stable_offset()

            def failed(code: ErrorCode, message: str) -> FetchResult:
                return FetchResult(code, message, hw, lso, start, offset, [])

            if not start <= offset <= end:
                return failed(
                    ErrorCode.OFFSET_OUT_OF_RANGE, f"offset {offset} is outside [{start}, {end}]"
                )
            upto = lso if read_committed else hw
            try:
                raw = self.store.read(offset, max_bytes, upto)
            except (OSError, StoreFailed) as exc:
                self._log_unreadable(offset, exc)
                return failed(ErrorCode.KAFKA_STORAGE_ERROR, f"storage error: {exc}")
            except CorruptLog as exc:
                self._log_unreadable(offset, exc)
                moved = self._on_damage(str(exc))
                return failed(
                    ErrorCode.KAFKA_STORAGE_ERROR if moved else ErrorCode.CORRUPT_MESSAGE,
                    f"the log cannot be read at {offset}: {exc}",
                )
            aborted = self.states.aborted_between(offset, upto) if read_committed else []
        return raw, aborted, (hw, lso, start)

    def _corrupt_answer(self, batch: bytes, why: str) -> ErrorCode:
        """The answer to a read that starts at a stored ``batch`` that cannot
        be read: KAFKA_STORAGE_ERROR when it fails its CRC-32C (damage since
        it was appended) and the partition is fetched again from another
        replica (``on_damage``), else CORRUPT_MESSAGE."""
        header = codec.parse_header(batch)
        if not codec.crc_ok(batch) and self._on_damage(
            f"the batch at offset {header.base_offset} fails its CRC-32C ({why})"
        ):
            return ErrorCode.KAFKA_STORAGE_ERROR
        return ErrorCode.CORRUPT_MESSAGE

    def _log_unreadable(self, offset: int, exc: Exception) -> None:
        log.error(
            "partition=%s-%d event=unreadable offset=%d error=%r",
            self.topic,
            self.index,
            offset,
            exc,
        )

    def apply_retention(self, now_ms: int, retention_ms: int, retention_bytes: int) -> int:
        """Delete the segments retention no longer keeps (only segments wholly below
        the last stable offset) and forget the producer state and aborted
        transactions that lay wholly in them. Returns the segments deleted; a storage
        failure is logged and deletes what came before it."""
        with self.lock:
            lso = self._last_stable_offset()
            try:
                deleted = self.store.apply_retention(now_ms, retention_ms, retention_bytes, lso)
            except (OSError, StoreFailed, CorruptLog) as exc:
                log.error(
                    "partition=%s-%d event=retention_failed error=%r", self.topic, self.index, exc
                )
                deleted = 0
            start = self.store.log_start_offset
            self.states.trim(start)
            if deleted:
                log.info(
                    "partition=%s-%d event=retention segments_deleted=%d log_start_offset=%d",
                    self.topic,
                    self.index,
                    deleted,
                    start,
                )
                self._on_change(True)
            return deleted

    def verify_stored(self, max_bytes: int) -> bool:
        """Check about ``max_bytes`` more of the stored batches that were not
        checked since the partition opened (:meth:`PartitionLogStore.verify_next`);
        False when none are left, or the log is damaged (reported to
        ``on_damage``), unreadable (logged) or closed or failed before."""
        with self.lock:
            try:
                return self.store.verify_next(max_bytes)
            except CorruptLog as exc:
                log.critical(
                    "partition=%s-%d event=damage_found error=%s", self.topic, self.index, exc
                )
                self._on_damage(str(exc))
            except OSError as exc:
                self._log_unreadable(self.store.log_start_offset, exc)
            except StoreFailed:
                pass  # closed (set aside), or its failure was logged when it happened
            return False

    def flush(self) -> None:
        with self.lock:
            self.store.flush()

    def discard(self) -> None:
        """Close the store without writing to its directory (its log is
        damaged and is set aside); writes waiting for their replication give
        up."""
        with self.lock:
            self.leading = False
            self._replication.notify_all()
            self.store.close()

    def close(self) -> None:
        """Snapshot the state at the log end (a clean shutdown restarts without replay)
        and close the store."""
        with self.lock:
            try:
                self.store.flush()
            except (OSError, StoreFailed) as exc:
                log.error(
                    "partition=%s-%d event=flush_failed error=%r", self.topic, self.index, exc
                )
            else:
                self._save_snapshot_at(self.store.log_end_offset)
            self.store.close()


def _hidden(header: codec.BatchHeader, aborted: list[AbortedTxn]) -> bool:
    """Whether a fetch skips the batch: a control batch, or data of an aborted transaction."""
    return header.is_control or (
        header.is_transactional
        and any(
            t.producer_id == header.producer_id
            and t.first_offset <= header.base_offset <= t.last_offset
            for t in aborted
        )
    )
