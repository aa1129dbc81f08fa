"""The coordinator node process: S shard replicas, their tick threads, gRPC.

``raftcoord node --config FILE --id N`` runs one. Every node hosts a replica
of every shard; each shard is its own pysyncobj Raft group on its own port.
Each shard has one thread that runs the leader's duties and pysyncobj's tick;
it sleeps in pysyncobj's poller until a Raft message or a new request wakes
it (or ``raft.tick.ms`` passes), so an idle node costs little CPU. Each shard
this node leads (ready) has a marker writer (:mod:`raftcoord.coordinator.markers`) that
completes its Prepare* transactions.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import grpc

from fsm import Outcome, TransactionStateMachine
from fsm.partitions import imbalanced
from raftcoord.coordinator import raft_journal
from raftcoord.coordinator.controller import NodeLeases, PreferredLeaders, run_controller
from raftcoord.coordinator.leader import ImbalanceChecks, Unstamped
from raftcoord.coordinator.markers import METADATA_SHARD, MarkerWriters
from raftcoord.coordinator.metrics import CoordinatorCollector
from raftcoord.coordinator.raft import RaftTransportSettings, raft_conf
from raftcoord.coordinator.raft_journal import JournalCorruptError
from raftcoord.coordinator.replica import (
    AppliedListener,
    EntryNotApplied,
    ShardReplica,
    SnapshotDamaged,
    SnapshotListener,
)
from raftcoord.coordinator.services import AdminService, CoordinatorService
from raftcoord.coordinator.settings import fsm_config
from raftcoord.coordinator.shard import (
    FOLLOWER_WAIT_SHARE,
    Reader,
    Shard,
    ShardStatus,
    ShardTimers,
    TransitionsLog,
    caller_waits,
)
from raftcoord.protocol.cluster_link import ADD_PARTITIONS_TO_TXN, ClusterListener, serve_cluster
from raftcoord.protocol.config import ClusterConfig, NodeAddress
from raftcoord.protocol.data_dir import DirectoryRefused, DirectoryUnusable, load_or_create
from raftcoord.protocol.data_files import COORDINATOR, DataFilesService
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.health import Health
from raftcoord.protocol.metrics import Metrics, RpcMetrics
from raftcoord.protocol.process import (
    EXIT_DATA_DAMAGED,
    EXIT_STORAGE_FAILED,
    fail_stop,
    serve,
)
from raftcoord.protocol.routing import preferred_leader
from raftcoord.protocol.tls import (
    add_port,
    cluster_refusal,
    node_identity,
)
from raftcoord.protocol.types import WriteMarkers
from raftcoord.protocol.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    coordinator_pb2,
    coordinator_pb2_grpc,
    data_files_pb2,
    data_files_pb2_grpc,
)

log = logging.getLogger("raftcoord.coordinator.node")

#: The exit status of a node that met a committed entry it cannot apply
#: (EX_SOFTWARE): restarting it replays the same entry, so it needs a fix.
EXIT_APPLY_FAILED = 70
#: Cluster-link connections a coordinator answers per node of the cluster:
#: a partition-log node's one link to it, and room for links being
#: redialled while their old connections are still being closed.
LINK_CONNECTIONS_PER_NODE = 4

T = TypeVar("T")


class CoordinatorNode:
    """One coordinator process. :meth:`start`, then :meth:`wait` or :meth:`stop`.

    Its services and marker writers see it as :class:`raftcoord.coordinator.shard.Shards`.
    """

    def __init__(
        self, config: ClusterConfig, node_id: int, data_dir: Path, raft_key: bytes | None
    ) -> None:
        self.config = config
        self.raft_transport = RaftTransportSettings(raft_key)
        self.me: NodeAddress = config.coordinator(node_id)
        self.node_id = node_id
        self.data_dir = data_dir
        self.shards: list[Shard] = []
        #: When this node checks its leaderships for imbalance (from its start).
        self.imbalance_checks = ImbalanceChecks(
            int(time.time() * 1000),
            config.settings.leader_imbalance_check_interval_seconds * 1000,
        )
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._server: grpc.Server | None = None
        self._service: CoordinatorService | None = None
        #: Where the partition-log nodes' adds arrive over cluster links
        #: (None: the config gives this node no link address).
        self._link: ClusterListener | None = None
        #: What the node presents and trusts on gRPC (None: plaintext, no [tls]).
        self.tls_identity = node_identity(config, node_id)
        self.credentials = (
            None if self.tls_identity is None else self.tls_identity.channel_credentials()
        )
        self.markers = MarkerWriters(self, config, node_id, self.credentials)
        #: The node's Prometheus metrics, when its config gives it an address.
        self.metrics: Metrics | None = None
        if self.me.metrics is not None:
            self.metrics = Metrics()
            self.metrics.add(CoordinatorCollector(self))

    # --- addresses -------------------------------------------------------------------

    def coordinator_for_raft(self, shard: int, raft_address: str) -> NodeAddress | None:
        """The coordinator whose Raft address for ``shard`` is ``raft_address``."""
        for node in self.config.coordinators:
            if node.raft[shard] == raft_address:
                return node
        return None

    # --- what services see (raftcoord.coordinator.shard.Shards) -----------------------------------

    def leader_of(self, shard: int) -> NodeAddress | None:
        replica = self.shards[shard].replica
        if replica.is_leader():
            return self.me
        leader = replica.leader_address()
        return None if leader is None else self.coordinator_for_raft(shard, leader)

    def availability(self, shard: int) -> ErrorCode:
        return self.shards[shard].availability()

    def submit(
        self,
        shard: int,
        build: Unstamped,
        parkable: bool = True,
        parked: Callable[[], None] | None = None,
        park_ms: int | None = None,
    ) -> Future[Outcome]:
        return self.shards[shard].submit(build, parkable, parked, park_ms)

    def query(self, shard: int, reader: Reader[T]) -> T:
        return self.shards[shard].replica.query(reader)

    def read(self, shard: int, reader: Reader[T]) -> Future[T | Outcome]:
        return self.shards[shard].read(reader)

    def change_count(self, shard: int) -> int:
        return self.shards[shard].change_count()

    def now_ms(self, shard: int) -> int:
        return self.shards[shard].clock.now_ms()

    def await_change(self, shard: int, seen: int, timeout_s: float) -> int:
        return self.shards[shard].await_change(seen, timeout_s)

    def take_producer_id(self) -> int | None:
        # The stripes of all shards share one id space without overlapping.
        for shard in self.shards:
            pid = shard.take_producer_id()
            if pid is not None:
                return pid
        return None

    def status(self, shard: int) -> ShardStatus:
        return self.shards[shard].status()

    def term(self, shard: int) -> int:
        return int(self.shards[shard].replica.raftCurrentTerm)

    # --- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Start the shards and serve.

        Raises:
            DirectoryRefused: the data directory is another node's, or its
                identity file is damaged.
            DirectoryUnusable: the data directory cannot be used.
        """
        identity, created = load_or_create(self.data_dir, "coordinator", self.node_id)
        if created:
            log.info(
                "node=%d event=directory_created directory=%s data_dir=%s",
                self.node_id,
                identity.directory_id,
                self.data_dir,
            )
        # Votes and acknowledgements go out with the directory id: a shard
        # counts them only from the directory it recorded for this node.
        self.raft_transport = replace(self.raft_transport, directory_id=identity.directory_id)
        raft_journal.install()
        settings = self.config.settings
        self.shards = [self._make_shard(number) for number in range(self.config.shard_count)]
        for shard in self.shards:
            thread = threading.Thread(
                target=self._run_shard,
                args=(shard, settings.raft_tick_ms / 1000.0),
                name=f"shard-{shard.shard}",
                daemon=True,
            )
            self._threads.append(thread)
            thread.start()
        self.leases = NodeLeases(
            self.shards[METADATA_SHARD],
            [n.node_id for n in self.config.partition_nodes],
            settings.broker_session_timeout_ms,
        )
        duties: list[Callable[[], object]] = [self.leases.check]
        if settings.auto_leader_rebalance_enable:
            balancer = PreferredLeaders(
                self.shards[METADATA_SHARD],
                settings.leader_imbalance_check_interval_seconds,
                settings.leader_imbalance_per_broker_percentage,
            )
            duties.append(balancer.check)
        controller = threading.Thread(
            target=run_controller,
            args=(duties, self.node_id, self._stopping),
            name="controller",
            daemon=True,
        )
        self._threads.append(controller)
        controller.start()
        self._server = self._make_server()
        self._server.start()
        self._threads.append(self.health.start(self._stopping))
        if self.metrics is not None and self.me.metrics is not None:
            raft_journal.fsync_observer = self.metrics.fsyncs()
            self.metrics.serve(self.me.metrics, self.config, self.node_id)
        log.info(
            "node=%d event=started grpc=%s metrics=%s shards=%d data_dir=%s",
            self.node_id,
            self.me.grpc,
            self.me.metrics or "-",
            len(self.shards),
            self.data_dir,
        )

    def _make_shard(self, shard: int) -> Shard:
        settings = self.config.settings
        shard_dir = self.data_dir / f"shard-{shard}"
        shard_dir.mkdir(parents=True, exist_ok=True)
        journal = str(shard_dir / "journal")
        snapshot = str(shard_dir / "snapshot")
        raft_journal.register_journal(journal, settings.fsync, snapshot_file=snapshot)
        low, high = settings.raft_election_timeout_ms
        conf = raft_conf(
            settings.raft_heartbeat_ms / 1000.0, (low / 1000.0, high / 1000.0), journal, snapshot
        )
        me = self.me.raft[shard]
        partners = [n.raft[shard] for n in self.config.coordinators if n.node_id != self.node_id]
        machine = TransactionStateMachine(
            shard, self.config.shard_count, fsm_config(settings), settings.pid_block_size
        )
        timers = ShardTimers(
            settings.abort_timed_out_cleanup_interval_ms,
            settings.remove_expired_cleanup_interval_ms,
            settings.transaction_park_timeout_ms,
            follower_wait_ms=low * FOLLOWER_WAIT_SHARE,
        )

        def replica_factory(
            on_applied: AppliedListener, on_snapshot: SnapshotListener
        ) -> ShardReplica:
            return ShardReplica(
                me,
                partners,
                conf,
                machine,
                on_applied,
                node_id=self.node_id,
                transport=self.raft_transport,
                on_snapshot=on_snapshot,
            )

        transitions = TransitionsLog(shard_dir / "transitions.jsonl", shard)
        coordinators = self.config.coordinators
        preferred = coordinators[preferred_leader(shard, len(coordinators))]
        made = Shard(
            shard,
            self.node_id,
            replica_factory,
            transitions,
            timers,
            self._hand_off,
            preferred_leader=(
                preferred.raft[shard]
                if settings.auto_leader_rebalance_enable and preferred.node_id != self.node_id
                else None
            ),
            checks=self.imbalance_checks,
            imbalanced=lambda: self._imbalanced(preferred.node_id),
        )
        raft_journal.attach_tick_sync(made.replica, journal)
        return made

    def _imbalanced(self, node_id: int) -> bool:
        """Whether coordinator ``node_id`` leads too few of the shards that
        prefer it (leader.imbalance.per.broker.percentage), as this node sees
        the shards' leaders."""
        coordinators = self.config.coordinators
        shards = range(self.config.shard_count)
        leaders = [getattr(self.leader_of(s), "node_id", None) for s in shards]
        preferred = [coordinators[preferred_leader(s, len(coordinators))].node_id for s in shards]
        percentage = self.config.settings.leader_imbalance_per_broker_percentage
        return imbalanced(leaders, preferred, node_id, percentage)

    def elect_preferred_leaders(self) -> list[int]:
        """Kafka's preferred leader election on this node: the shards it leads
        whose preferred leader is another node, each asked to hand over now."""
        return [s.shard for s in self.shards if s.elect_preferred()]

    def _hand_off(self, shard: int, markers: WriteMarkers) -> None:
        self.markers.hand_off(self.shards[shard], markers)

    def _run_shard(self, shard: Shard, tick_s: float) -> None:
        while not self._stopping.is_set():
            try:
                shard.tick(tick_s)
                self.markers.sync(shard)
            except SnapshotDamaged as exc:
                fail_stop(log, EXIT_DATA_DAMAGED, "snapshot_damaged", f"node={self.node_id} {exc}")
            except EntryNotApplied as exc:
                # Retrying would apply the entry again; going on would skip it.
                log.critical(
                    "node=%d shard=%d event=apply_failed index=%d: a committed entry "
                    "cannot be applied; the node stops (exit status %d)",
                    self.node_id,
                    shard.shard,
                    exc.index,
                    EXIT_APPLY_FAILED,
                    exc_info=exc,
                )
                logging.shutdown()
                os._exit(EXIT_APPLY_FAILED)
            except Exception:
                log.exception("node=%d shard=%d event=tick_failed", self.node_id, shard.shard)
                self._stopping.wait(tick_s)

    def _make_server(self) -> grpc.Server:
        rpc = None if self.metrics is None else RpcMetrics(self.metrics)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="grpc"),
            interceptors=[*([] if rpc is None else [rpc]), CallerDeadlines()],
            options=[("grpc.so_reuseport", 0)],
        )
        self._service = CoordinatorService(
            self, self.config, self.node_id, self.markers, self.leases, self.credentials
        )
        if self.me.link is not None:
            self._link = self._serve_link(self.me.link, self._service, rpc)
        coordinator_pb2_grpc.add_TransactionCoordinatorServicer_to_server(self._service, server)
        admin_pb2_grpc.add_CoordinatorAdminServicer_to_server(
            AdminService(self, self.config, self.node_id), server
        )
        data_files_pb2_grpc.add_DataFilesServicer_to_server(
            DataFilesService(
                self.data_dir,
                self.node_id,
                COORDINATOR,
                lambda context: cluster_refusal(self.config, context),
            ),
            server,
        )
        self.health = Health(
            server,
            [
                coordinator_pb2.DESCRIPTOR.services_by_name["TransactionCoordinator"].full_name,
                admin_pb2.DESCRIPTOR.services_by_name["CoordinatorAdmin"].full_name,
                data_files_pb2.DESCRIPTOR.services_by_name["DataFiles"].full_name,
            ],
            self.can_serve,
        )
        if add_port(server, self.me.grpc, self.tls_identity) == 0:
            raise OSError(f"cannot listen on {self.me.grpc}")
        return server

    def can_serve(self) -> bool:
        """The node's health: every shard has a leader (this node or one it
        hears from), and the shards it leads have applied their logs."""
        return all(
            self.leader_of(shard) is not None
            and (not replica.is_leader or replica.availability() is ErrorCode.NONE)
            for shard, replica in enumerate(self.shards)
        )

    def _serve_link(
        self, address: str, service: CoordinatorService, rpc: RpcMetrics | None
    ) -> ClusterListener:
        """The listener of the partition-log nodes' adds to transactions (one
        thread per connection), counted in the RPC metrics as the gRPC calls
        are; with ``[tls]`` only the cluster's principals are answered."""
        return serve_cluster(
            self.config,
            self.node_id,
            address,
            {ADD_PARTITIONS_TO_TXN: service.transactions.add_partitions_over_link},
            rpc,
            LINK_CONNECTIONS_PER_NODE * max(1, len(self.config.partition_nodes)),
        )

    def stop(self) -> None:
        """Stop serving, stop ticking, close journals (SIGTERM path)."""
        self._stopping.set()
        self.markers.stop()
        if self._link is not None:
            self._link.stop()
        if self._server is not None:
            self._server.stop(grace=1.0).wait(2.0)
        if self._service is not None:
            self._service.close()
        for shard in self.shards:
            shard.wake()
        for thread in self._threads:
            thread.join(timeout=5.0)
        for shard in self.shards:
            shard.stop()
        if self.metrics is not None:
            self.metrics.close()
        log.info("node=%d event=stopped", self.node_id)

    def wait(self) -> None:
        self._stopping.wait()


class CallerDeadlines(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc is untyped
    """Makes each unary call's deadline known to the shards it submits to
    (:data:`raftcoord.coordinator.shard.CALLER_DEADLINE`), so that a
    parked request never outlives its caller."""

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        behavior = handler.unary_unary

        def with_deadline(request: Any, context: Any) -> Any:
            with caller_waits(context.time_remaining()):
                return behavior(request, context)

        return grpc.unary_unary_rpc_method_handler(
            with_deadline,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def run_node(config: ClusterConfig, node_id: int, data_dir: Path, raft_key: bytes | None) -> int:
    """Run a node until SIGTERM/SIGINT; returns the exit status. Without a
    ``raft_key`` its Raft traffic is unauthenticated (``--insecure-raft``)."""
    logging.getLogger("pysyncobj").setLevel(logging.WARNING)
    if raft_key is None:
        log.warning(
            "node=%d event=insecure_raft: Raft peers are not authenticated; anyone who "
            "reaches the Raft ports can act as a member",
            node_id,
        )
    raft_journal.fsync_failure_handler = _journal_fsync_failed
    node = CoordinatorNode(config, node_id, data_dir, raft_key)
    try:
        return serve(node, config, node_id, data_dir, log)
    except JournalCorruptError as exc:
        fail_stop(log, EXIT_DATA_DAMAGED, "journal_damaged", f"node={node_id} {exc}")
    except DirectoryRefused as exc:
        fail_stop(log, EXIT_DATA_DAMAGED, "directory_refused", f"node={node_id} {exc}")
    except DirectoryUnusable as exc:
        fail_stop(log, EXIT_STORAGE_FAILED, "directory_unusable", f"node={node_id} {exc}")


def _journal_fsync_failed(path: str, exc: OSError) -> None:
    fail_stop(
        log,
        EXIT_STORAGE_FAILED,
        "fsync_failed",
        f"{path}: {exc}; the entries being written may not be on disk, so this node "
        "stops instead of acknowledging them (it is never retried); restarted, it "
        "recovers from what its journal holds",
    )
