"""Marker delivery on a coordinator node: the network and Raft side of :mod:`marker_writer`.

:class:`MarkerWriters` keeps one :class:`marker_writer.MarkerWriter` per shard
this node leads, created when the shard becomes a ready leader and stopped
when that leadership ends (or the node stops). Each writer talks to the
world through a :class:`NodeMarkerTransport`:

* a data partition's marker goes to the partition-log node that owns it
  (cluster topics replicated by shard 0: topic -> node id per partition;
  node id -> address from the config), with ``PartitionLog.WriteTxnMarkers``
  over a connection of the writer's own to the node's replication address
  (:mod:`raftcoord.protocol.cluster_link`; a unary gRPC call to its gRPC
  address in a config without one);
* a consumer group's marker goes to the coordinator leading the group's
  shard, with ``TransactionCoordinator.WriteTxnMarkers`` (groups only);
* completion proposes ``MarkersWritten`` on the writer's own shard, only
  while that shard is still the ready leader of the writer's term.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import grpc

from fsm import MarkersWritten, Outcome
from marker_writer import (
    Completion,
    ConsumerGroup,
    DataPartition,
    DeliveryProblem,
    Destination,
    DestinationKind,
    MarkerRequest,
    MarkerResponse,
    MarkerWriter,
    Participant,
    TransportError,
    TxnKey,
)
from raftcoord.coordinator.leader import Unstamped
from raftcoord.coordinator.shard import Shard, Shards
from raftcoord.protocol.channels import ChannelCache
from raftcoord.protocol.cluster_link import WRITE_TXN_MARKERS, ClusterLink, LinkError
from raftcoord.protocol.config import ClusterConfig
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.routing import shard_for
from raftcoord.protocol.tls import node_ssl_context
from raftcoord.protocol.types import TopicPartition, WriteMarkers
from raftcoord.protocol.v1 import (
    common_pb2,
    partition_log_pb2,
)

log = logging.getLogger("raftcoord.coordinator.markers")

#: Deadline of one WriteTxnMarkers call.
CALL_TIMEOUT_S = 5.0
#: How long completing a batch of transactions may wait for Raft.
COMPLETE_TIMEOUT_S = 10.0
#: The shard whose replicated state holds the cluster's metadata: topics,
#: partition-log directories and offset ceilings, ACLs.
METADATA_SHARD = 0
#: How often a completion waiting for Raft checks whether the node is stopping.
_STOP_CHECK_S = 0.1


def _node_stopping() -> TransportError:
    return TransportError("the node is stopping")


class NodeMarkerTransport:
    """:class:`marker_writer.MarkerTransport` for one shard leadership (shard, term)."""

    def __init__(
        self,
        shards: Shards,
        config: ClusterConfig,
        shard: Shard,
        term: int,
        channels: ChannelCache,
        stopping: threading.Event,
        link_tls: ssl.SSLContext | None = None,
    ) -> None:
        self.shards = shards
        self.shard_count = config.shard_count
        self.shard = shard
        self.term = term
        self.channels = channels
        self.stopping = stopping
        self._partition_nodes = {n.node_id: n.grpc for n in config.partition_nodes}
        #: node id -> replication address, of the partition-log nodes that have one.
        self._link_addresses = {
            n.node_id: n.replication for n in config.partition_nodes if n.replication is not None
        }
        self._link_tls = link_tls
        self._links: dict[int, ClusterLink] = {}
        self._links_lock = threading.Lock()
        self._closed = False

    # --- where markers go ----------------------------------------------------------

    def resolve(self, participant: Participant) -> Destination | None:
        if isinstance(participant, DataPartition):
            return self._partition_destination(participant)
        leader = self.shards.leader_of(shard_for(participant.group_id, self.shard_count))
        if leader is None:
            return None
        return Destination(DestinationKind.COORDINATOR, leader.node_id, leader.grpc)

    def _partition_destination(self, partition: DataPartition) -> Destination | None:
        registered = self.shards.query(
            METADATA_SHARD, lambda machine: machine.state.topics.get(partition.topic)
        )
        # Unknown here may only mean this replica of shard 0 lags: ask again later.
        if registered is None or not 0 <= partition.partition < len(registered.partitions):
            return None
        node_id = registered.partitions[partition.partition].leader
        address = self._partition_nodes.get(node_id)
        if address is None:
            return None
        return Destination(DestinationKind.PARTITION_LOG, node_id, address)

    # --- sending -------------------------------------------------------------------

    def send(
        self, destination: Destination, markers: Sequence[MarkerRequest]
    ) -> Sequence[MarkerResponse]:
        request = partition_log_pb2.WriteTxnMarkersRequest(
            markers=[_txn_marker(m) for m in markers]
        )
        link = self._link(destination)
        if link is not None:
            try:
                response = link.call(WRITE_TXN_MARKERS, request, CALL_TIMEOUT_S)
            except LinkError as exc:
                raise TransportError(str(exc)) from exc
        else:
            if destination.kind is DestinationKind.PARTITION_LOG:
                stub = self.channels.partition_log(destination.address)
            else:
                stub = self.channels.coordinator(destination.address)
            try:
                response = stub.WriteTxnMarkers(request, timeout=CALL_TIMEOUT_S)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                name = code.name if isinstance(code, grpc.StatusCode) else "RPC_ERROR"
                raise TransportError(name) from exc
        if len(response.markers) != len(markers):
            raise TransportError(f"{len(response.markers)} results for {len(markers)} markers")
        answers = []
        for sent, result in zip(markers, response.markers, strict=True):
            if (result.producer_id, result.producer_epoch) != (
                sent.producer_id,
                sent.producer_epoch,
            ):
                raise TransportError("results out of order")
            errors: dict[Participant, int] = {
                DataPartition(p.topic, p.partition): int(p.error_code) for p in result.partitions
            }
            errors.update({ConsumerGroup(g.group_id): int(g.error_code) for g in result.groups})
            answers.append(MarkerResponse(errors))
        return answers

    def _link(self, destination: Destination) -> ClusterLink | None:
        """This writer's connection to a partition-log node's replication
        address (None: a coordinator, or a node without one: gRPC)."""
        if destination.kind is not DestinationKind.PARTITION_LOG:
            return None
        address = self._link_addresses.get(destination.node_id)
        if address is None:
            return None
        with self._links_lock:
            if self._closed:
                raise TransportError("this writer's leadership ended: its connections are closed")
            link = self._links.get(destination.node_id)
            if link is None:
                link = self._links[destination.node_id] = ClusterLink(address, self._link_tls)
            return link

    def close(self) -> None:
        """Close this writer's connections (its leadership ended); a call in
        flight on one ends at once."""
        with self._links_lock:
            self._closed = True
            links, self._links = list(self._links.values()), {}
        for link in links:
            link.close()

    # --- completion ----------------------------------------------------------------

    def complete(self, completions: Sequence[Completion]) -> Sequence[int]:
        if not self._still_leading():
            return [int(ErrorCode.NOT_COORDINATOR)] * len(completions)
        # Queued together, they go out in one Raft entry.
        futures = self.shard.submit_all([markers_written(c) for c in completions])
        deadline = time.monotonic() + COMPLETE_TIMEOUT_S
        return [self._outcome_code(future, deadline) for future in futures]

    def _outcome_code(self, future: Future[Any], deadline: float) -> int:
        # Waits in slices so that a stopping node does not wait out the deadline.
        while not self.stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return int(ErrorCode.REQUEST_TIMED_OUT)
            try:
                outcome = future.result(timeout=min(_STOP_CHECK_S, remaining))
            except FutureTimeout:
                continue
            return int(outcome.error) if isinstance(outcome, Outcome) else -1
        return int(ErrorCode.NOT_COORDINATOR)

    def _still_leading(self) -> bool:
        shard = self.shard
        return shard.is_leader and shard.ready and shard.leader_term == self.term


def markers_written(completion: Completion) -> Unstamped:
    """The MarkersWritten command that ends ``completion``'s transaction."""
    return lambda stamp: MarkersWritten(
        completion.transactional_id,
        completion.producer_id,
        completion.producer_epoch,
        tuple(TopicPartition(p.topic, p.partition) for p in completion.partitions),
        tuple(g.group_id for g in completion.groups),
        stamp.now_ms,
        completion.txn_number,
    )


def _txn_marker(marker: MarkerRequest) -> Any:
    topics: dict[str, list[int]] = {}
    for partition in marker.partitions:
        topics.setdefault(partition.topic, []).append(partition.partition)
    message = partition_log_pb2.TxnMarker(
        producer_id=marker.producer_id,
        producer_epoch=marker.producer_epoch,
        coordinator_epoch=marker.coordinator_epoch,
        result=common_pb2.COMMIT if marker.commit else common_pb2.ABORT,
        topics=[common_pb2.TopicPartitions(topic=t, partitions=ps) for t, ps in topics.items()],
        transactional_id=marker.transactional_id,
        groups=[g.group_id for g in marker.groups],
        transaction_version=marker.transaction_version,
    )
    if marker.txn_number >= 0:
        message.txn_number = marker.txn_number
    return message


class MarkerWriters:
    """The node's marker writers: one per shard it leads (ready), per term."""

    def __init__(
        self,
        shards: Shards,
        config: ClusterConfig,
        node_id: int,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.shards = shards
        self.config = config
        self.node_id = node_id
        #: One channel per address, shared by every writer of the node.
        self.channels = ChannelCache(closed_error=_node_stopping, credentials=credentials)
        #: The TLS of the writers' connections to replication addresses.
        self._link_tls = node_ssl_context(config, node_id, server=False)
        self._lock = threading.Lock()
        self._writers: dict[int, MarkerWriter] = {}
        self._transports: dict[int, NodeMarkerTransport] = {}
        self._stopping = threading.Event()

    def sync(self, shard: Shard) -> MarkerWriter | None:
        """Match the writer of ``shard`` to its leadership: stop a writer whose
        leadership ended, start one for a ready leadership without one.
        Called on the shard's tick thread after every tick and on hand-off."""
        leading = shard.is_leader and shard.ready
        term = shard.leader_term
        # Nearly every call changes nothing: decided without the lock the
        # node's shard threads share (the map only changes under it, and only
        # this shard's thread changes this shard's writer, but for stop()).
        current = self._writers.get(shard.shard)
        if current is None and not leading:
            return None
        if current is not None and leading and current.term == term and not current.stopped:
            return current
        stale: MarkerWriter | None = None
        stale_transport: NodeMarkerTransport | None = None
        with self._lock:
            writer = self._writers.get(shard.shard)
            if writer is not None and (not leading or writer.term != term or writer.stopped):
                stale = self._writers.pop(shard.shard)
                stale_transport = self._transports.pop(shard.shard, None)
                writer = None
            created = writer is None and leading and not self._stopping.is_set()
            if created:
                transport = self._transports[shard.shard] = NodeMarkerTransport(
                    self.shards,
                    self.config,
                    shard,
                    term,
                    self.channels,
                    self._stopping,
                    self._link_tls,
                )
                writer = self._writers[shard.shard] = MarkerWriter(
                    shard.shard, term, transport, logger=log, label=f"node={self.node_id}"
                )
        if stale is not None:
            stale.stop(timeout_s=0)
        if stale_transport is not None:
            stale_transport.close()
        if created and writer is not None:
            # Seeded from the applied state, a new writer owes every Prepare*
            # transaction's markers even if a hand-off came before it existed
            # (or its predecessor of the same term stopped itself).
            pending = shard.replica.query(lambda machine: machine.pending_markers())
            for markers in pending:
                writer.add(markers, term)
            writer.start()
            log.info(
                "node=%d shard=%d term=%d event=marker_writer_started pending=%d",
                self.node_id,
                shard.shard,
                term,
                len(pending),
            )
        return writer

    def hand_off(self, shard: Shard, markers: WriteMarkers) -> None:
        """The shard applied a Prepare* transition: queue its markers on this
        leadership's writer. Before the leadership is ready there is no
        writer; the writer of the ready leadership starts from every Prepare*
        transaction's markers in the applied state."""
        writer = self.sync(shard)
        if writer is None:
            log.debug(
                "node=%d shard=%d event=markers_deferred transactional_id=%s",
                self.node_id,
                shard.shard,
                markers.transactional_id,
            )
            return
        writer.add(markers, shard.leader_term)

    def stop(self) -> None:
        """Stop every writer and close the channels (the node is stopping)."""
        with self._lock:
            self._stopping.set()
            writers, self._writers = list(self._writers.values()), {}
            transports, self._transports = list(self._transports.values()), {}
        for writer in writers:
            writer.stop(timeout_s=1.0)
        for transport in transports:
            transport.close()
        self.channels.close()

    def metrics(self) -> list[dict[str, Any]]:
        """Each running writer's :meth:`MarkerWriter.metrics`."""
        with self._lock:
            writers = list(self._writers.values())
        return [writer.metrics() for writer in writers]

    def pending(self, shard: int, key: TxnKey) -> dict[Participant, DeliveryProblem | None] | None:
        """What this node's writer of ``shard`` still owes transaction ``key``
        (see :meth:`MarkerWriter.pending`); None without such a writer."""
        with self._lock:
            writer = self._writers.get(shard)
        return None if writer is None else writer.pending(key)
