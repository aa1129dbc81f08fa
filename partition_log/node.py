"""The partition-log node process: ``raftcoord partition-node --config FILE --id N``.

Serves the topic-partitions the cluster metadata assigns to this node. Each
partition lives in ``<data-dir>/<topic>-<partition>/``; partitions found on
disk are opened (and recovered) at start, new ones when the metadata names
them. A metadata thread refreshes the placement from the coordinators, and
under ``log.flush.policy = "interval"`` a flusher fsyncs every
``log.flush.interval.ms``. Every ``log.retention.check.interval.ms`` a
retention thread deletes the segments each topic's retention no longer keeps.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

import partition_log.log
from partition_log.cluster_view import ClusterView, TxnPartitionAdder
from partition_log.log import CorruptLog, FsyncPolicy, LogFlusher
from partition_log.partition import Partition
from partition_log.service import LogChanges, PartitionLogService
from raftcoord.protocol.channels import ChannelCache
from raftcoord.protocol.config import ClusterConfig, NodeAddress
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.process import EXIT_STORAGE_FAILED, fail_stop, serve
from raftcoord.protocol.v1 import partition_log_pb2_grpc

log = logging.getLogger("raftcoord.partition_log")

#: How often the placement is refreshed in the background.
METADATA_REFRESH_S = 1.0
#: gRPC worker threads; a parked (long-poll) Fetch holds one.
GRPC_WORKERS = 32
#: Fetches parked at once; the other workers stay free for Produce, markers and
#: Fetches answered at once.
MAX_PARKED_FETCHES = GRPC_WORKERS // 2
_PARTITION_DIR = re.compile(r"(?P<topic>[a-zA-Z0-9._-]+)-(?P<partition>\d+)")


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
        channels = ChannelCache()
        self.view = ClusterView(channels, coordinators, node_id)
        self.adder = TxnPartitionAdder(
            channels,
            coordinators,
            self.view,
            retry_backoff_s=config.settings.add_partitions_to_txn_retry_backoff_ms / 1000,
            retry_max_s=config.settings.add_partitions_to_txn_retry_backoff_max_ms / 1000,
        )
        self.partitions: dict[tuple[str, int], Partition] = {}
        #: Partitions whose log failed recovery: (topic, index) -> why.
        self.damaged: dict[tuple[str, int], str] = {}
        self.changes = LogChanges()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._flusher: LogFlusher | None = None
        self._server: grpc.Server | None = None

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
                    self.damaged[(topic, index)] = str(exc)
                    log.critical(
                        "node=%d event=partition_damaged partition=%s-%d: %s; the partition "
                        "is not served (KAFKA_STORAGE_ERROR) until its log is repaired "
                        "(docs/partition-log.md, Damage)",
                        self.node_id,
                        topic,
                        index,
                        exc,
                    )
                    return None
                self.partitions[(topic, index)] = partition
                log.info(
                    "node=%d event=partition_opened partition=%s-%d end_offset=%d",
                    self.node_id,
                    topic,
                    index,
                    partition.store.log_end_offset,
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
        )

    def lookup(self, topic: str, index: int) -> Partition | tuple[ErrorCode, str]:
        """The partition if this node owns it, else the error code and message."""
        partition = self.partitions.get((topic, index))
        if partition is not None:
            return partition
        placement = self.view.locate(topic, index)
        if placement.error is not ErrorCode.NONE:
            return placement.error, placement.message
        opened = self._open(topic, index)
        if opened is None:
            return (
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"partition {topic}-{index} is damaged on this node: "
                f"{self.damaged[(topic, index)]}",
            )
        return opened

    def _open_from_disk(self) -> None:
        for path in sorted(self.data_dir.iterdir()):
            match = _PARTITION_DIR.fullmatch(path.name)
            if path.is_dir() and match:
                self._open(match["topic"], int(match["partition"]))

    # --- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._open_from_disk()
        self.view.refresh()
        for topic, index in self.view.owned():
            self._open(topic, index)
        metadata = threading.Thread(target=self._refresh_loop, name="metadata", daemon=True)
        retention = threading.Thread(target=self._retention_loop, name="retention", daemon=True)
        self._threads += [metadata, retention]
        metadata.start()
        retention.start()
        if self._fsync is FsyncPolicy.INTERVAL:
            self._flusher = LogFlusher(
                lambda: list(self.partitions.values()),
                self.config.settings.log_flush_interval_ms / 1000.0,
            )
            self._flusher.start()
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=GRPC_WORKERS, thread_name_prefix="grpc"),
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
        )
        partition_log_pb2_grpc.add_PartitionLogServicer_to_server(service, self._server)
        if self._server.add_insecure_port(self.me.grpc) == 0:
            raise OSError(f"cannot listen on {self.me.grpc}")
        self._server.start()
        log.info(
            "node=%d event=started kind=partition-log grpc=%s partitions=%d fsync=%s data_dir=%s",
            self.node_id,
            self.me.grpc,
            len(self.partitions),
            self._fsync.value,
            self.data_dir,
        )

    def _refresh_loop(self) -> None:
        while not self._stopping.wait(METADATA_REFRESH_S):
            if self.view.refresh():
                for topic, index in self.view.owned():
                    if (topic, index) not in self.partitions:
                        self._open(topic, index)

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
        self.changes.close()
        if self._server is not None:
            self._server.stop(grace=1.0).wait(2.0)
        if self._flusher is not None:
            self._flusher.stop()
        for thread in self._threads:
            thread.join(timeout=5.0)
        for partition in list(self.partitions.values()):
            partition.flush()
            partition.close()
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
    return serve(PartitionNode(config, node_id, data_dir), node_id, data_dir, log)
