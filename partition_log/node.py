"""The partition-log node process: ``raftcoord partition-node --config FILE --id N``.

Serves the topic-partitions the cluster metadata assigns to this node. Each
partition lives in ``<data-dir>/<topic>-<partition>/``; partitions found on
disk are opened (and recovered) at start, new ones when the metadata names
them. A metadata thread refreshes the placement from the coordinators, and
under ``log.flush.policy = "interval"`` a flusher fsyncs every
``log.flush.interval.ms``. Every ``log.retention.check.interval.ms`` a
retention thread deletes the segments each topic's retention no longer keeps.

The data directory is the node's by its ``meta.properties``
(:mod:`raftcoord.protocol.data_dir`); its directory id must be the one the
coordinators have on record for this node (RegisterDirectory), else the node
serves none of its partitions until an operator accepts the directory
(``raftcoord accept-directory``). A reservation thread reserves each
partition's offsets with the coordinators before they are handed out
(ReserveOffsets, :meth:`partition_log.partition.Partition.grant`). A clean
stop leaves the file ``clean-shutdown``: without it, under a flush policy
other than ``always``, acknowledged records may be missing, and the
partitions continue above every offset reserved before.
"""

from __future__ import annotations

import enum
import logging
import os
import re
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

import partition_log.log
import partition_log.partition
from partition_log.cluster_view import (
    CALL_TIMEOUT_S,
    ClusterView,
    Followed,
    Placement,
    TxnPartitionAdder,
    owed_marker,
)
from partition_log.log import CorruptLog, FsyncPolicy, LogFlusher
from partition_log.metrics import PartitionCollector, batches_per_fsync
from partition_log.partition import Partition
from partition_log.replica_fetcher import ConnectionLink, GrpcLink, Link, ReplicaFetchers
from partition_log.service import LogChanges, PartitionLogService
from raftcoord.protocol.channels import CHANNEL_POLICY, ChannelCache
from raftcoord.protocol.cluster_link import (
    REPLICA_FETCH,
    WRITE_TXN_MARKERS,
    ClusterLink,
    ClusterListener,
    serve_cluster,
)
from raftcoord.protocol.config import ClusterConfig, NodeAddress
from raftcoord.protocol.data_dir import (
    DirectoryIdentity,
    DirectoryRefused,
    DirectoryUnusable,
    load_or_create,
)
from raftcoord.protocol.data_files import PARTITION_LOG, DataFilesService
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.health import Health
from raftcoord.protocol.limits import KAFKA_MAX_PRODUCER_EPOCH
from raftcoord.protocol.metrics import Metrics, RpcMetrics
from raftcoord.protocol.process import EXIT_DATA_DAMAGED, EXIT_STORAGE_FAILED, fail_stop, serve
from raftcoord.protocol.tls import (
    Authorizer,
    add_port,
    cluster_refusal,
    node_identity,
    node_ssl_context,
)
from raftcoord.protocol.v1 import (
    data_files_pb2,
    data_files_pb2_grpc,
    partition_log_pb2,
    partition_log_pb2_grpc,
)

log = logging.getLogger("raftcoord.partition_log")

#: The largest Metadata answer a partition-log node reads (every topic and ACL).
METADATA_MAX_BYTES = 64 << 20
#: How often the placement is refreshed in the background.
METADATA_REFRESH_S = 1.0
#: gRPC worker threads; a parked (long-poll) Fetch holds one.
GRPC_WORKERS = 32
#: Fetches parked at once; the other workers stay free for Produce, markers and
#: Fetches answered at once.
MAX_PARKED_FETCHES = GRPC_WORKERS // 2
#: Connections the replication listener holds at once beyond two per caller
#: (a follower keeps one connection per leader node, a coordinator one per
#: shard it leads; a restarted one may dial before the listener has seen its
#: old connection close).
REPLICATION_CONNECTIONS = 4
_PARTITION_DIR = re.compile(r"(?P<topic>[a-zA-Z0-9._-]+)-(?P<partition>\d+)")
#: Left in the data directory by a clean stop, removed at start.
CLEAN_SHUTDOWN_FILE = "clean-shutdown"
#: How often the reservation thread looks at the partitions' reserved offsets
#: (and retries a registration that did not get an answer).
RESERVATION_CHECK_S = 1.0
#: How often a leader compares its partitions' followers with their ISR.
ISR_CHECK_S = 0.5
#: The most partitions of one ReserveOffsets.
RESERVATIONS_PER_CALL = 1000
#: Where the directories of damaged partitions are moved (under the data
#: directory) when the partition is fetched again from its other replicas.
DAMAGED_DIR = "damaged"
#: The check of the closed segments after start: bytes of batches checked
#: under a partition's lock at a time, and the pause after each (at most
#: about 100 MiB/s).
VERIFY_CHUNK_BYTES = 1 << 20
VERIFY_PAUSE_S = 0.01


class DirectoryState(enum.Enum):
    """The data directory as the coordinators see it."""

    REGISTERING = "registering"  # no answer yet
    SERVING = "serving"  # the directory on record
    REPLACED = "replaced"  # another directory of this node is on record


class PartitionNode:
    """One partition-log process. :meth:`start`, then :meth:`stop`."""

    def __init__(self, config: ClusterConfig, node_id: int, data_dir: Path) -> None:
        self.config = config
        self.me: NodeAddress = config.partition_node(node_id)
        self.node_id = node_id
        self.data_dir = data_dir
        settings = config.settings
        self._fsync = FsyncPolicy(settings.log_flush_policy)
        coordinators = [n.grpc for n in config.coordinators]
        #: What the node presents and trusts on gRPC (None: plaintext, no [tls]).
        self.tls_identity = node_identity(config, node_id)
        channels = ChannelCache(
            credentials=None
            if self.tls_identity is None
            else self.tls_identity.channel_credentials(),
            # Metadata answers carry every topic and ACL: room beyond gRPC's 4 MiB.
            options=(*CHANNEL_POLICY, ("grpc.max_receive_message_length", METADATA_MAX_BYTES)),
        )
        self.view = ClusterView(channels, coordinators, node_id)
        #: The threads that fetch this node's follower replicas from their leaders.
        self._channels = channels
        #: The TLS of this node's cluster links (None: plaintext, no [tls]).
        self._link_tls = node_ssl_context(config, node_id, server=False)
        self.fetchers = ReplicaFetchers(node_id, self.view, self._link_to, self._follower)
        self.adder = TxnPartitionAdder(
            channels,
            coordinators,
            self.view,
            links={n.grpc: n.link for n in config.coordinators if n.link is not None},
            link_tls=self._link_tls,
            retry_max_s=config.settings.add_partitions_to_txn_retry_backoff_max_ms / 1000,
        )
        self.partitions: dict[tuple[str, int], Partition] = {}
        #: Partitions whose log failed recovery: (topic, index) -> why.
        self.damaged: dict[tuple[str, int], str] = {}
        #: The data directory's identity: its meta.properties (read or written
        #: at :meth:`start`).
        self.directory: DirectoryIdentity | None = None
        self.directory_state = DirectoryState.REGISTERING
        #: The directory the coordinators have on record when it is not ours.
        self.registered_directory = ""
        #: The last refusal of a heartbeat (logged once until it changes).
        self._heartbeat_refused = ErrorCode.NONE
        #: Partitions with other replicas whose log here may lack acknowledged
        #: records: until a heartbeat has had the node fenced (KIP-966), they
        #: reserve no offsets, and the node does not serve.
        self._lost: list[Partition] = []
        self._lost_lock = threading.Lock()
        #: Partitions whose reads found their log damaged, to be set aside by
        #: the reservation thread: (topic, index) -> why.
        self._found_damage: dict[tuple[str, int], str] = {}
        self._damage_lock = threading.Lock()
        #: Whether the node stopped cleanly before this start.
        self.clean_start = False
        self._reservation_due = threading.Event()
        self._reserve_lock = threading.Lock()
        self.changes = LogChanges()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._flusher: LogFlusher | None = None
        self._server: grpc.Server | None = None
        self._replication: ClusterListener | None = None
        #: The node's Prometheus metrics, when its config gives it an address.
        self.metrics: Metrics | None = None
        if self.me.metrics is not None:
            self.metrics = Metrics()
            self.metrics.add(
                PartitionCollector(
                    lambda: list(self.partitions.values()), lambda: len(self.damaged)
                )
            )

    # --- partitions ----------------------------------------------------------------

    def _open(self, topic: str, index: int) -> Partition | None:
        """The partition, opened on first use; None when its log is damaged
        (recorded in :attr:`damaged`, logged CRITICAL, and never served)."""
        with self._lock:
            if (topic, index) in self.damaged:
                return None
            partition = self.partitions.get((topic, index))
            if partition is None:
                try:
                    partition = self._make_partition(topic, index)
                except CorruptLog as exc:
                    self._refuse(topic, index, str(exc))
                    return None
                self.partitions[(topic, index)] = partition
                self._reservation_due.set()
                log.info(
                    "node=%d event=partition_opened partition=%s-%d end_offset=%d",
                    self.node_id,
                    topic,
                    index,
                    partition.store.log_end_offset,
                )
            return partition

    def _refuse(self, topic: str, index: int, why: str) -> None:
        """Serve the partition no more: its log is damaged (the caller holds
        :attr:`_lock`)."""
        self.damaged[(topic, index)] = why
        log.critical(
            "node=%d event=partition_damaged partition=%s-%d: %s; the partition is not "
            "served (KAFKA_STORAGE_ERROR): it is fetched again from an in-sync replica, "
            "or with none, stays refused until its log is repaired (docs/partition-log.md, "
            "Damage)",
            self.node_id,
            topic,
            index,
            why,
        )

    def _damage_found(self, topic: str, index: int, why: str) -> bool:
        """A read found the log of ``topic``-``index`` damaged (called with
        the partition's lock held). With another in-sync replica, the
        reservation thread takes it out of service and sets it aside
        (:meth:`_set_aside_damaged`), and True is returned; otherwise this
        copy stays the one served."""
        if self._lead_elsewhere(topic, index) is None:
            return False
        with self._damage_lock:
            self._found_damage.setdefault((topic, index), why)
        self._reservation_due.set()
        return True

    def _set_aside_damaged(self) -> list[Partition]:
        """Set aside every damaged partition that has another in-sync replica:
        its directory moves under :data:`DAMAGED_DIR` (kept for inspection,
        never deleted), and the partition opens anew, empty, to be fetched
        again from its leader as a replica that lost its data (it leads none
        of them until its leaders catch it up). A partition whose reads found
        damage leaves service first. Returns the partitions opened anew."""
        if self.directory_state is not DirectoryState.SERVING:
            return []
        with self._damage_lock:
            found, self._found_damage = self._found_damage, {}
        for (topic, index), why in found.items():
            with self._lock:
                partition = self.partitions.pop((topic, index), None)
                if partition is None:
                    continue
                self._refuse(topic, index, why)
            partition.discard()
        with self._lock:
            damaged = list(self.damaged)
        reopened = []
        for topic, index in damaged:
            epoch = self._lead_elsewhere(topic, index)
            if epoch is not None:
                partition = self._set_aside(topic, index, epoch)
                if partition is not None:
                    reopened.append(partition)
        return reopened

    def _lead_elsewhere(self, topic: str, index: int) -> int | None:
        """The partition's leader epoch as this node knows it when a replica
        other than this node is in its ISR (one that holds every
        acknowledged record, which can lead it), else None."""
        known = self.view.leadership(topic, index)
        if known is None or not any(r != self.node_id for r in known.isr):
            return None
        return known.leader_epoch

    def _set_aside(self, topic: str, index: int, leader_epoch: int) -> Partition | None:
        """Move the damaged partition's directory aside and open it anew, as
        a follower at ``leader_epoch`` (so that a placement of that epoch or
        an older one never makes the empty log a leader); None when it could
        not be moved (logged; the next round tries again)."""
        name = f"{topic}-{index}"
        aside = self.data_dir / DAMAGED_DIR
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = aside / f"{name}.{stamp}"
        n = 1
        while target.exists():
            n += 1
            target = aside / f"{name}.{stamp}.{n}"
        with self._lock:
            why = self.damaged.get((topic, index))
            if why is None:
                return None
            try:
                aside.mkdir(exist_ok=True)
                partition_log.log.fsync_directory(self.data_dir)
                if (self.data_dir / name).exists():
                    os.rename(self.data_dir / name, target)
                    partition_log.log.fsync_directory(aside)
                    partition_log.log.fsync_directory(self.data_dir)
                partition = self._make_partition(topic, index)
                partition.follow(leader_epoch)
            except (OSError, CorruptLog) as exc:
                log.error(
                    "node=%d event=set_aside_failed partition=%s-%d error=%r",
                    self.node_id,
                    topic,
                    index,
                    exc,
                )
                return None
            del self.damaged[(topic, index)]
            self.partitions[(topic, index)] = partition
        log.critical(
            "node=%d event=partition_set_aside partition=%s-%d moved_to=%s: its log was "
            "damaged (%s); it is fetched again from the in-sync replicas, and this node "
            "leads none of its partitions until its leaders catch it up",
            self.node_id,
            topic,
            index,
            target,
            why,
        )
        return partition

    def _make_partition(self, topic: str, index: int) -> Partition:
        settings = self.config.settings
        return Partition(
            topic,
            index,
            self.data_dir / f"{topic}-{index}",
            segment_bytes=settings.log_segment_bytes,
            index_interval_bytes=settings.log_index_interval_bytes,
            fsync=self._fsync,
            on_change=self.changes.changed,
            clean_start=self.clean_start,
            on_reservation_due=self._reservation_due.set,
            on_damage=lambda why: self._damage_found(topic, index, why),
        )

    def lookup(
        self, topic: str, index: int, leader_epoch: int | None = None
    ) -> Partition | tuple[ErrorCode, str]:
        """The partition if this node leads it, else the error code and message.
        Nothing is served before the coordinators confirmed the data
        directory, nor while the coordinators record another leader or none
        (this node was fenced: its lease expired). A request naming the
        ``leader_epoch`` it knows the partition by is refused when that is
        not the current one (FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH)."""
        if self.directory_state is DirectoryState.REPLACED:
            return ErrorCode.KAFKA_STORAGE_ERROR, self._replaced_message()
        if self.directory_state is DirectoryState.REGISTERING:
            self._reservation_due.set()
            return (
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"partition-log node {self.node_id} has not registered its data directory "
                "with the coordinators yet; retry",
            )
        placement = self.view.locate(topic, index, leader_epoch)
        if placement.error is not ErrorCode.NONE:
            return placement.error, placement.message
        partition = self.partitions.get((topic, index))
        if partition is not None and partition in self._lost:
            return (
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"partition {topic}-{index} may lack acknowledged records on partition-log "
                f"node {self.node_id}: it leads it no more once the coordinators fenced it; retry",
            )
        opened = partition if partition is not None else self._open(topic, index)
        if opened is None:
            return (
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"partition {topic}-{index} is damaged on this node: "
                f"{self.damaged[(topic, index)]}",
            )
        if not self._lead(opened, placement):
            return (
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"{topic}-{index} has moved on from leader epoch {placement.leader_epoch} "
                f"on partition-log node {self.node_id}; retry",
            )
        if opened.ceiling is None:  # new here: its first offsets are reserved now
            self.reserve_due()
        return opened

    def replica_lookup(
        self, topic: str, index: int, replica: int, leader_epoch: int
    ) -> Partition | tuple[ErrorCode, str]:
        """The partition for follower ``replica``'s fetch naming ``leader_epoch``:
        :meth:`lookup`, and the follower must hold a replica of it."""
        found = self.lookup(topic, index, leader_epoch)
        if isinstance(found, tuple):
            return found
        if replica == self.node_id or not self.view.replica_of(topic, index, replica):
            return (
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"partition-log node {replica} holds no follower replica of {topic}-{index}",
            )
        return found

    def _follower(self, followed: Followed) -> Partition | None:
        """The follower replica to fetch into (opened on first use); None while the
        data directory is not the one on record or the log is damaged."""
        if self.directory_state is not DirectoryState.SERVING:
            return None
        found = self.partitions.get((followed.topic, followed.partition))
        return found if found is not None else self._open(followed.topic, followed.partition)

    def _lead(self, partition: Partition, placement: Placement) -> bool:
        """The partition is led here as ``placement`` (this node's view)
        records; False when the partition knows it is stale
        (:meth:`Partition.lead`)."""
        return partition.lead(
            placement.leader_epoch,
            placement.in_sync_followers,
            placement.min_insync_replicas,
            frozenset(placement.replicas) - {self.node_id},
        )

    def check_isr(self) -> None:
        """For each partition led here whose followers fell behind or caught up
        (:meth:`Partition.wanted_in_sync`), ask the coordinators for the new
        ISR (AlterPartition); the leader counts it once they recorded it."""
        if self.directory is None or self.directory_state is not DirectoryState.SERVING:
            return
        lag_s = self.config.settings.replica_lag_time_max_ms / 1000
        for partition in list(self.partitions.values()):
            wanted = partition.wanted_in_sync(time.monotonic(), lag_s)
            if wanted is None:
                continue
            placement = self.view.placement(partition.topic, partition.index)
            if placement.error is not ErrorCode.NONE:
                continue
            isr = [r for r in placement.replicas if r == self.node_id or r in wanted]
            answer = self.view.alter_partition(
                self.directory.directory_id,
                partition.topic,
                partition.index,
                placement.leader_epoch,
                placement.partition_epoch,
                isr,
            )
            if answer is None:
                continue  # no coordinator answered: the next round asks again
            if answer.error_code != ErrorCode.NONE:
                log.warning(
                    "node=%d event=isr_change_refused partition=%s-%d isr=%s error=%s %s",
                    self.node_id,
                    partition.topic,
                    partition.index,
                    isr,
                    ErrorCode(answer.error_code).name,
                    answer.error_message,
                )
                self.view.refresh(wanted=partition.topic)
                continue
            log.info(
                "node=%d event=isr_changed partition=%s-%d isr=%s partition_epoch=%d",
                self.node_id,
                partition.topic,
                partition.index,
                list(answer.isr),
                answer.partition_epoch,
            )
            self._lead(partition, self.view.placement(partition.topic, partition.index))

    def _isr_loop(self) -> None:
        while not self._stopping.wait(ISR_CHECK_S):
            try:
                self.check_isr()
            except Exception:  # the next round tries again; the thread must live
                log.exception("node=%d event=isr_check_failed", self.node_id)

    def _replaced_message(self) -> str:
        assert self.directory is not None
        return (
            f"partition-log node {self.node_id}: its data directory "
            f"{self.directory.directory_id} is not the one the coordinators have on record "
            f"({self.registered_directory}); a replaced disk? its partitions are not served "
            f"until `raftcoord accept-directory --id {self.node_id}` accepts the directory "
            "(docs/partition-log.md, Data directories)"
        )

    # --- the coordinators' records ------------------------------------------------------

    def _register(self) -> None:
        """Ask the coordinators whether this directory is the one on record."""
        assert self.directory is not None
        answer = self.view.register_directory(self.directory.directory_id)
        if answer is None:
            return
        if answer.error_code == ErrorCode.NONE:
            if self.directory_state is DirectoryState.REPLACED:
                # Accepted in place of the directory on record: whatever this
                # one holds may lack what the other one handed out.
                for partition in list(self.partitions.values()):
                    partition.assume_lost()
            if self.directory_state is not DirectoryState.SERVING:
                log.info(
                    "node=%d event=directory_registered directory=%s",
                    self.node_id,
                    self.directory.directory_id,
                )
            self.directory_state = DirectoryState.SERVING
            self._reservation_due.set()
        elif answer.error_code == ErrorCode.KAFKA_STORAGE_ERROR:
            self._replaced(answer.registered_directory_id)
        else:
            log.warning(
                "node=%d event=directory_not_registered error=%s %s",
                self.node_id,
                ErrorCode(answer.error_code).name,
                answer.error_message,
            )

    def _replaced(self, registered: str) -> None:
        first = self.directory_state is not DirectoryState.REPLACED
        self.registered_directory = registered
        self.directory_state = DirectoryState.REPLACED
        if first:
            log.critical(
                "node=%d event=directory_replaced %s", self.node_id, self._replaced_message()
            )

    def reserve_due(self) -> None:
        """Reserve offsets for every partition that needs more (one call per
        :data:`RESERVATIONS_PER_CALL` partitions); partitions that lost
        records continue above the ceiling reserved before (logged CRITICAL)."""
        if self.directory_state is DirectoryState.REGISTERING:
            self._register()
        if self.directory_state is not DirectoryState.SERVING:
            return
        assert self.directory is not None
        with self._reserve_lock:
            due = [
                p
                for p in list(self.partitions.values())
                if p.reservation_due() and self.view.owns(p.topic, p.index) and p not in self._lost
            ]
            for first in range(0, len(due), RESERVATIONS_PER_CALL):
                chunk = [
                    (p, p.wanted_ceiling()) for p in due[first : first + RESERVATIONS_PER_CALL]
                ]
                answer = self.view.reserve_offsets(
                    self.directory.directory_id, [(p.topic, p.index, c) for p, c in chunk]
                )
                if answer is None:
                    return  # no coordinator answered: the next round asks again
                if answer.error_code == ErrorCode.KAFKA_STORAGE_ERROR:
                    self._replaced("")
                    return
                if answer.error_code != ErrorCode.NONE:
                    log.warning(
                        "node=%d event=reservation_refused error=%s %s",
                        self.node_id,
                        ErrorCode(answer.error_code).name,
                        answer.error_message,
                    )
                    return
                for (partition, ceiling), previous in zip(chunk, answer.previous, strict=True):
                    self._grant(partition, previous.ceiling, ceiling)

    def _grant(self, partition: Partition, previous: int, ceiling: int) -> None:
        try:
            skipped = partition.grant(previous, ceiling)
        except Exception as exc:  # the store failed: nothing is appended there
            log.error(
                "node=%d event=skip_failed partition=%s-%d error=%r",
                self.node_id,
                partition.topic,
                partition.index,
                exc,
            )
            return
        if skipped is not None:
            log.critical(
                "node=%d event=offsets_skipped partition=%s-%d from=%d to=%d: the log may "
                "have lost acknowledged records (%s); it continues above every offset "
                "handed out before, so no offset is reused",
                self.node_id,
                partition.topic,
                partition.index,
                skipped,
                previous,
                "its directory is new"
                if partition.store.recovered.created
                else "recovery cut a tail of its log"
                if partition.store.recovered.bytes_truncated
                else "the node did not stop cleanly and the log is not flushed on every append",
            )

    def write_owed_markers(self) -> None:
        """For each partition that may have lost records, during its time to
        check (:attr:`partition_log.partition.Partition.check_markers_until`,
        every round, as shards may still be electing): write again the COMMIT
        or ABORT marker of every open transaction that its coordinator has
        completed (it lost the marker; the coordinator, done, never sends it
        again). Writing a marker twice changes nothing the second time."""
        now = time.monotonic()
        checked = []
        for partition in list(self.partitions.values()):
            until = partition.check_markers_until
            if until is not None and now >= until:
                partition.check_markers_until = None
            elif until is not None:
                checked.append(partition)
        if not checked or self.directory_state is not DirectoryState.SERVING:
            return
        open_txns = {p: p.open_transactions() for p in checked}
        producer_ids = sorted({t.producer_id for txns in open_txns.values() for t in txns})
        described = self.view.coordinator_transactions(producer_ids) if producer_ids else []
        if described is None:
            return  # a coordinator did not answer: the next round asks again
        for partition, txns in open_txns.items():
            placement = self.view.placement(partition.topic, partition.index)
            if placement.error is not ErrorCode.NONE:
                continue  # not led here (now): its leader settles it
            if not self._lead(partition, placement):
                continue  # led elsewhere by now
            for txn in txns:
                owed = owed_marker(txn.producer_id, txn.producer_epoch, txn.marker_txn, described)
                if owed is None or owed.epoch > KAFKA_MAX_PRODUCER_EPOCH:
                    continue
                commit, coordinator_epoch = owed.commit, owed.coordinator_epoch
                if commit and not self.config.settings.transaction_partition_verification_enable:
                    # Unverified appends: the records may never have been part
                    # of the committed transaction (a hanging one). Only an
                    # operator decides (`raftcoord txn find-hanging`).
                    log.critical(
                        "node=%d event=owed_marker_not_written partition=%s-%d producer_id=%d "
                        "epoch=%d: its coordinator committed, but without transaction "
                        "verification this partition may never have been in the transaction",
                        self.node_id,
                        partition.topic,
                        partition.index,
                        txn.producer_id,
                        txn.producer_epoch,
                    )
                    continue
                code, message = partition.write_marker(
                    txn.producer_id,
                    owed.epoch,  # one that closes the records (theirs under v1, above under v2)
                    max(coordinator_epoch, txn.coordinator_epoch),
                    commit,
                    int(time.time() * 1000),
                    transaction_version=owed.transaction_version,
                    txn_number=owed.txn_number,
                )
                log.warning(
                    "node=%d event=owed_marker partition=%s-%d producer_id=%d epoch=%d "
                    "result=%s error=%s %s",
                    self.node_id,
                    partition.topic,
                    partition.index,
                    txn.producer_id,
                    txn.producer_epoch,
                    "COMMIT" if commit else "ABORT",
                    code.name,
                    message,
                )

    def _reservation_loop(self) -> None:
        while not self._stopping.is_set():
            self._reservation_due.wait(RESERVATION_CHECK_S)
            self._reservation_due.clear()
            if self._stopping.is_set():
                return
            try:
                if self.directory_state is DirectoryState.REPLACED:
                    self._register()  # until an operator accepts the directory
                reopened = self._set_aside_damaged()
                if reopened:
                    with self._lost_lock:
                        self._lost += reopened
                    self._heartbeat(CALL_TIMEOUT_S)  # fenced at once: it leads none of them
                self.reserve_due()
                self.write_owed_markers()
            except Exception:  # the next round tries again; the thread must live
                log.exception("node=%d event=reservation_round_failed", self.node_id)

    def status(self) -> Any:
        """PartitionNodeStatus: the directory and the partitions not served."""
        refused = [
            partition_log_pb2.RefusedPartition(topic=t, partition=i, reason=why)
            for (t, i), why in sorted(self.damaged.items())
        ]
        return partition_log_pb2.PartitionNodeStatusResponse(
            node_id=self.node_id,
            pid=os.getpid(),
            directory_id="" if self.directory is None else self.directory.directory_id,
            directory_state=self.directory_state.value,
            refused=refused,
        )

    def _open_from_disk(self) -> None:
        for path in sorted(self.data_dir.iterdir()):
            match = _PARTITION_DIR.fullmatch(path.name)
            if path.is_dir() and match:
                self._open(match["topic"], int(match["partition"]))

    # --- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Open the partitions and serve.

        Raises:
            DirectoryRefused: the data directory is another node's, or its
                identity file is damaged.
            DirectoryUnusable: the data directory cannot be used.
        """
        self.directory, created = load_or_create(self.data_dir, "partition-log", self.node_id)
        if created:
            log.info(
                "node=%d event=directory_created directory=%s data_dir=%s",
                self.node_id,
                self.directory.directory_id,
                self.data_dir,
            )
        marker = self.data_dir / CLEAN_SHUTDOWN_FILE
        self.clean_start = marker.exists()
        if self.clean_start:
            # Durably gone before anything is appended: a crash from now on
            # must not pass for a clean stop.
            marker.unlink()
            partition_log.log.fsync_directory(self.data_dir)
        self._open_from_disk()
        self._refresh_placement()
        if self.directory_state is DirectoryState.REGISTERING:
            self._register()
        self._set_aside_damaged()  # opened anew: among the replicas that lost data
        self._lost = self._lost_replicas()
        if self._lost:
            self._heartbeat(CALL_TIMEOUT_S)  # fenced first: it leads none of them
        self.reserve_due()
        # Back after its lease ran out, the node leads again once a heartbeat
        # unfences it: before it serves, not up to a heartbeat interval later.
        self._heartbeat(CALL_TIMEOUT_S)
        metadata = threading.Thread(target=self._refresh_loop, name="metadata", daemon=True)
        heartbeat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        retention = threading.Thread(target=self._retention_loop, name="retention", daemon=True)
        reservations = threading.Thread(
            target=self._reservation_loop, name="reservations", daemon=True
        )
        isr = threading.Thread(target=self._isr_loop, name="isr", daemon=True)
        verify = threading.Thread(target=self._verify_stored, name="verify", daemon=True)
        self._threads += [metadata, heartbeat, retention, reservations, isr, verify]
        isr.start()
        verify.start()
        metadata.start()
        heartbeat.start()
        retention.start()
        reservations.start()
        if self._fsync is FsyncPolicy.INTERVAL:
            self._flusher = LogFlusher(
                lambda: list(self.partitions.values()),
                self.config.settings.log_flush_interval_ms / 1000.0,
            )
            self._flusher.start()
        rpc = None if self.metrics is None else RpcMetrics(self.metrics)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=GRPC_WORKERS, thread_name_prefix="grpc"),
            interceptors=[] if rpc is None else [rpc],
            options=[
                ("grpc.so_reuseport", 0),
                # A batch over message.max.bytes must reach the service to be
                # answered MESSAGE_TOO_LARGE (gRPC's default limit is 4 MiB).
                ("grpc.max_receive_message_length", self.config.settings.socket_request_max_bytes),
            ],
        )
        service = PartitionLogService(
            self.lookup,
            self.adder,
            self.config.settings.message_max_bytes,
            self.changes,
            MAX_PARKED_FETCHES,
            verify_transactions=self.config.settings.transaction_partition_verification_enable,
            status=self.status,
            cluster_refusal=lambda context, *kinds: cluster_refusal(self.config, context, *kinds),
            authorizer=Authorizer(self.config, self.view.acls),
            refresh_acls=self.view.refresh_acls,
            confirm_epoch=self.view.confirm_coordinator_epoch,
            replica_lookup=self.replica_lookup,
        )
        partition_log_pb2_grpc.add_PartitionLogServicer_to_server(service, self._server)
        data_files_pb2_grpc.add_DataFilesServicer_to_server(
            DataFilesService(
                self.data_dir,
                self.node_id,
                PARTITION_LOG,
                lambda context: cluster_refusal(self.config, context),
            ),
            self._server,
        )
        self.health = Health(
            self._server,
            [
                partition_log_pb2.DESCRIPTOR.services_by_name["PartitionLog"].full_name,
                data_files_pb2.DESCRIPTOR.services_by_name["DataFiles"].full_name,
            ],
            self.can_serve,
        )
        if add_port(self._server, self.me.grpc, self.tls_identity) == 0:
            raise OSError(f"cannot listen on {self.me.grpc}")
        if self.me.replication is not None:
            self._replication = self._serve_replication(service, self.me.replication, rpc)
        self._server.start()
        self._threads.append(self.health.start(self._stopping))
        if self.metrics is not None and self.me.metrics is not None:
            partition_log.log.fsync_observer = self.metrics.fsyncs()
            partition_log.partition.group_commit_observer = batches_per_fsync(self.metrics)
            self.metrics.serve(self.me.metrics, self.config, self.node_id)
        log.info(
            "node=%d event=started kind=partition-log grpc=%s metrics=%s partitions=%d fsync=%s "
            "data_dir=%s",
            self.node_id,
            self.me.grpc,
            self.me.metrics or "-",
            len(self.partitions),
            self._fsync.value,
            self.data_dir,
        )

    def _serve_replication(
        self, service: PartitionLogService, address: str, rpc: RpcMetrics | None
    ) -> ClusterListener:
        """The listener of the followers' fetches and the coordinators'
        markers (one thread per connection, apart from the gRPC workers: a
        Produce waiting for its in-sync replicas holds a worker of the main
        server until the followers fetch, so fetches answered there could all
        wait behind such Produces), counted in the RPC metrics as the gRPC
        calls are."""
        callers = len(self.config.partition_nodes) + len(self.config.coordinators) * (
            self.config.shard_count
        )
        return serve_cluster(
            self.config,
            self.node_id,
            address,
            {REPLICA_FETCH: service.replica_fetch, WRITE_TXN_MARKERS: service.write_txn_markers},
            rpc,
            REPLICATION_CONNECTIONS + 2 * callers,
        )

    def _link_to(self, leader: int) -> Link:
        """How this node's fetcher reaches ``leader``: its replication
        address, or its gRPC address in a config without one."""
        node = self.config.partition_node(leader)
        if node.replication is None:
            return GrpcLink(lambda: self._channels.partition_log(node.grpc))
        return ConnectionLink(ClusterLink(node.replication, self._link_tls))

    def can_serve(self) -> bool:
        """The node's health: its data directory is the one on record and it
        knows the topic map (one metadata refresh answered)."""
        return self.directory_state is DirectoryState.SERVING and self.view.shard_count > 0

    def _refresh_loop(self) -> None:
        while not self._stopping.wait(METADATA_REFRESH_S):
            self._refresh_placement()

    def _refresh_placement(self) -> None:
        if self.view.refresh():
            for topic, index in self.view.owned():
                if (topic, index) not in self.partitions:
                    self._open(topic, index)
            # Leaders learn their in-sync replicas' changes; a replica that no
            # longer leads stops acknowledging (its waiting writes give up).
            # One that does not lead is left alone: marked as following at
            # its own epoch, it could never lead at that epoch, and a view
            # that lacks its topic for now (a lagging coordinator answered
            # first after a restart) would wedge it.
            for partition in list(self.partitions.values()):
                placement = self.view.placement(partition.topic, partition.index)
                if placement.error is ErrorCode.NONE and partition not in self._lost:
                    self._lead(partition, placement)
                elif partition.leading:
                    partition.follow(partition.leader_epoch)
            self.fetchers.sync()

    def _heartbeat_loop(self) -> None:
        """Hold this node's lease with shard 0's leader (docs/replication.md)."""
        settings = self.config.settings
        interval_s = settings.broker_heartbeat_interval_ms / 1000
        # Each coordinator gets at least a second (a loaded machine answers
        # slowly), and all of them together at most the lease.
        timeout_s = min(max(interval_s, 1.0), settings.broker_session_timeout_ms / 3000)
        while not self._stopping.wait(interval_s):
            self._heartbeat(timeout_s)

    def _lost_replicas(self) -> list[Partition]:
        """The partitions this node holds with other replicas whose log here may
        lack acknowledged records (opened anew, or not flushed on every append
        before an unclean stop: :attr:`Partition.may_have_lost`)."""
        lost = []
        for topic, index, replicas in self.view.held():
            if len(replicas) < 2:
                continue  # the only copy: it continues above its offsets instead
            partition = self.partitions.get((topic, index)) or self._open(topic, index)
            if partition is not None and partition.may_have_lost:
                lost.append(partition)
        return lost

    def _heartbeat(self, timeout_s: float) -> None:
        """One heartbeat (a node serving its directory on record); a node the
        coordinators had fenced learns its partitions' leaders again at once.
        While partitions may have lost records (:attr:`_lost`) the heartbeat
        asks to be fenced first."""
        if self.directory is None or self.directory_state is not DirectoryState.SERVING:
            return
        with self._lost_lock:
            lost = list(self._lost)
        answer = self.view.heartbeat(self.directory.directory_id, timeout_s, lost_data=bool(lost))
        if answer is None:
            return
        if lost and answer.error_code == ErrorCode.NONE:
            # The fence in view before these partitions may be served: the
            # view held from before could still name this node their leader.
            if not self.view.refresh(confirmed=True):
                return  # the next heartbeat asks again
            for partition in lost:
                partition.settle_replica()
            with self._lost_lock:
                self._lost = [p for p in self._lost if p not in lost]
            log.warning(
                "node=%d event=fenced_for_lost_data partitions=%s: their logs here may lack "
                "acknowledged records; they are followed until their leaders catch them up",
                self.node_id,
                ",".join(f"{p.topic}-{p.index}" for p in lost),
            )
            self._refresh_placement()
            return
        if answer.error_code != ErrorCode.NONE:
            if answer.error_code != self._heartbeat_refused:
                log.warning(
                    "node=%d event=heartbeat_refused error=%s %s",
                    self.node_id,
                    ErrorCode(answer.error_code).name,
                    answer.error_message,
                )
            self._heartbeat_refused = ErrorCode(answer.error_code)
            return
        self._heartbeat_refused = ErrorCode.NONE
        if answer.was_fenced:
            log.warning(
                "node=%d event=unfenced: the coordinators had fenced this node (no "
                "heartbeat for broker.session.timeout.ms); the partitions it alone kept in "
                "sync are led by it again",
                self.node_id,
            )
            self._refresh_placement()

    def _verify_stored(self) -> None:
        """Check, once, the CRC-32C of every batch in the closed segments of
        the partitions opened at start (recovery reads only their headers'
        tail), a little at a time: a damaged one is found now rather than
        when a reader reaches it (``Partition.verify_stored``). Partitions
        opened later are new or fetched, checked as they are written."""
        for partition in list(self.partitions.values()):
            while not self._stopping.is_set() and partition.verify_stored(VERIFY_CHUNK_BYTES):
                self._stopping.wait(VERIFY_PAUSE_S)

    def _retention_loop(self) -> None:
        interval_s = self.config.settings.log_retention_check_interval_ms / 1000
        while not self._stopping.wait(interval_s):
            self.apply_retention()

    def apply_retention(self) -> None:
        """One retention pass over every partition of the node."""
        now_ms = int(time.time() * 1000)
        for partition in list(self.partitions.values()):
            retention = self.config.retention(partition.topic)
            partition.apply_retention(now_ms, retention.retention_ms, retention.retention_bytes)

    def stop(self) -> None:
        self._stopping.set()
        self._reservation_due.set()
        self.changes.close()
        # Produce handlers waiting for their adds end at once, not at the
        # gRPC server's grace.
        self.adder.close()
        if self._server is not None:
            self._server.stop(grace=1.0).wait(2.0)
        if self._replication is not None:
            self._replication.stop()
        if self._flusher is not None:
            self._flusher.stop()
        for thread in self._threads:
            thread.join(timeout=5.0)
        self.fetchers.stop(timeout_s=5.0)
        for partition in list(self.partitions.values()):
            partition.flush()
            partition.close()
        # Every partition is flushed and closed: the next start may trust the logs.
        (self.data_dir / CLEAN_SHUTDOWN_FILE).touch()
        if self.metrics is not None:
            self.metrics.close()
        log.info("node=%d event=stopped", self.node_id)


def run_partition_node(config: ClusterConfig, node_id: int, data_dir: Path) -> int:
    """Run a partition-log node until SIGTERM/SIGINT; returns the exit status."""

    def fsync_failed(what: str, exc: OSError) -> None:
        fail_stop(
            log,
            EXIT_STORAGE_FAILED,
            "fsync_failed",
            f"node={node_id} {what}: {exc}; the batches being written may not be on disk, "
            "so this node stops instead of acknowledging them (it is never retried); "
            "restarted, it recovers its partitions from what the disk holds",
        )

    partition_log.log.fsync_failure_handler = fsync_failed
    try:
        node = PartitionNode(config, node_id, data_dir)
        return serve(node, config, node_id, data_dir, log)
    except DirectoryRefused as exc:
        fail_stop(log, EXIT_DATA_DAMAGED, "directory_refused", f"node={node_id} {exc}")
    except DirectoryUnusable as exc:
        fail_stop(log, EXIT_STORAGE_FAILED, "directory_unusable", f"node={node_id} {exc}")
