"""Topic RPCs of TransactionCoordinator: Metadata and CreateTopics, the
partition-log nodes' RegisterDirectory, ReserveOffsets and NodeHeartbeat,
and the topic lookups the transaction RPCs need. Topics, directories,
offset ceilings and fenced nodes live in shard 0."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Mapping
from typing import Any

import grpc

from fsm import (
    AlterPartition,
    CreateTopic,
    ErrorCode,
    OffsetReservation,
    Outcome,
    RegisterDirectory,
    ReserveOffsets,
    UnfenceNode,
)
from fsm.metadata import TopicPartition
from fsm.partitions import (
    NO_LEADER,
    PartitionRegistration,
    TopicRegistration,
    assign_replicas,
)
from raftcoord.coordinator.controller import NodeLeases, fence_node
from raftcoord.coordinator.leader import Unstamped
from raftcoord.coordinator.markers import METADATA_SHARD
from raftcoord.coordinator.services.common import NotForwarded, Refused, ShardRouter
from raftcoord.protocol.acl import CLUSTER_NAME, Acl, Operation, ResourceType
from raftcoord.protocol.tls import node_refusal
from raftcoord.protocol.v1 import coordinator_pb2
from raftcoord.protocol.wire import acl_to_proto, wire_error

log = logging.getLogger("raftcoord.coordinator")


class TopicRPCs:
    def __init__(self, router: ShardRouter, leases: NodeLeases) -> None:
        self.router = router
        self.leases = leases

    def local_topics(self) -> dict[str, TopicRegistration]:
        """Topic placement in this node's replica of shard 0 (it may lag)."""
        return self.router.shards.query(METADATA_SHARD, lambda machine: dict(machine.state.topics))

    def leader_topics(
        self, context: Any | None, read_barrier: bool
    ) -> dict[str, TopicRegistration] | None:
        """Topic placement as shard 0's leader has it (topics live in shard 0),
        or None when no leader answers.

        The leader answers from its applied state, or with ``read_barrier``
        through its log (so that a deposed leader cannot answer); another
        node asks the leader once, so that a node that is behind (just
        restarted, cut off) does not answer with a stale list.
        """
        if self.router.shards.availability(METADATA_SHARD) is ErrorCode.NONE:
            if not read_barrier:
                return self.local_topics()
            try:
                topics: dict[str, TopicRegistration] = self.router.read(
                    METADATA_SHARD, lambda machine: dict(machine.state.topics)
                )
                return topics
            except Refused:
                return None
        try:
            answer = self.router.forward(
                METADATA_SHARD,
                context,
                "Metadata",
                coordinator_pb2.MetadataRequest(read_barrier=read_barrier),
            )
        except NotForwarded:
            return None
        return {
            t.name: _registration_from_proto(t)
            for t in answer.topics
            if t.error_code == ErrorCode.NONE
        }

    def unknown_partitions(
        self, partitions: tuple[TopicPartition, ...], context: Any | None
    ) -> dict[TopicPartition, str]:
        """The partitions that do not exist, with why.

        This node's replica of shard 0 may lag behind a topic just created, so
        a miss there is confirmed with shard 0's leader through a read barrier
        before it counts: a topic created and acknowledged before the request
        is never reported unknown.

        Raises:
            Refused: a miss could not be confirmed (shard 0 has no leader).
        """
        unknown = self.router.shards.query(
            METADATA_SHARD, lambda machine: _missing(machine.state.topics, partitions)
        )
        if not unknown:
            return unknown
        topics = self.leader_topics(context, read_barrier=True)
        if topics is None:
            raise Refused(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"cannot confirm topic {next(iter(unknown))[0]!r} with the leader "
                f"of shard {METADATA_SHARD}; retry",
            )
        return _missing(topics, tuple(unknown))

    def Metadata(self, request: Any, context: Any) -> Any:
        """Topic placement from shard 0's leader, without writing to its log
        unless ``read_barrier`` asks to confirm (a miss). Without it, a node
        with no leader to ask answers from its own replica; with it, such a
        node fails the call (UNAVAILABLE) rather than answer unconfirmed.
        The ACLs (``include_acls``) come from this node's replica of shard 0,
        or with ``read_barrier`` from shard 0's leader through its log."""
        confirmed_acls: frozenset[Acl] | None = None
        topics: dict[str, TopicRegistration] | None
        if request.include_acls and request.read_barrier:
            forwarded = self.router.leader_answer(METADATA_SHARD, context, "Metadata", request)
            if forwarded is not None:
                return forwarded
            # Topics and ACLs through one barrier of shard 0's leader (this node).
            try:
                topics, confirmed_acls = self.router.read(
                    METADATA_SHARD, lambda machine: (dict(machine.state.topics), machine.state.acls)
                )
            except Refused:
                context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"shard {METADATA_SHARD} has no leader to confirm the topics and ACLs with",
                )
        else:
            topics = self.leader_topics(context, request.read_barrier)
        if topics is None:
            if request.read_barrier:
                context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"shard {METADATA_SHARD} has no leader to confirm the topics with",
                )
            topics = self.local_topics()
        who = self.router.caller(context)
        authorizer = self.router.authorizer
        if request.topics:
            wanted = list(request.topics)
            visible = set(authorizer.filter(who, Operation.DESCRIBE, ResourceType.TOPIC, wanted))
        else:  # every topic the caller may see
            wanted = authorizer.filter(who, Operation.DESCRIBE, ResourceType.TOPIC, sorted(topics))
            visible = set(wanted)
        config = self.router.config
        acls: list[Any] = []
        acls_included = request.include_acls and authorizer.acts_as_cluster(who)
        if acls_included:
            current = confirmed_acls
            if current is None:
                index = authorizer.index()
                current = index.acls if index is not None else frozenset()
            acls = [acl_to_proto(a) for a in sorted(current, key=Acl.to_wire)]
        return coordinator_pb2.MetadataResponse(
            coordinators=[
                coordinator_pb2.NodeInfo(node_id=n.node_id, address=n.grpc)
                for n in config.coordinators
            ],
            partition_nodes=[
                coordinator_pb2.NodeInfo(node_id=n.node_id, address=n.grpc)
                for n in config.partition_nodes
            ],
            shard_count=config.shard_count,
            topics=[
                _topic_metadata(name, topics.get(name))
                if name in visible
                else coordinator_pb2.TopicMetadata(
                    name=name, error_code=wire_error(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                )
                for name in wanted
            ],
            acls=acls,
            acls_included=acls_included,
            shard_epochs=[self.router.shards.term(i) for i in range(config.shard_count)],
        )

    def CreateTopics(self, request: Any, context: Any) -> Any:
        nodes = [n.node_id for n in self.router.config.partition_nodes]
        # Replicas go to the nodes holding a lease (Kafka places on unfenced
        # brokers only); every node when none does. A topic placed anyway on a
        # node fenced by then is not led by it (fsm.partitions.new_topic).
        fenced = self.router.shards.query(
            METADATA_SHARD, lambda machine: machine.state.fenced_nodes
        )
        leased = [n for n in nodes if n not in fenced] or nodes
        results = []
        who = self.router.caller(context)
        authorizer = self.router.authorizer
        may_create_any = authorizer.enabled and authorizer.allows(
            who, Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME
        )
        for topic in request.topics:
            if not may_create_any and not authorizer.allows(
                who, Operation.CREATE, ResourceType.TOPIC, topic.name
            ):
                results.append(
                    coordinator_pb2.CreateTopicResult(
                        name=topic.name,
                        error_code=wire_error(ErrorCode.TOPIC_AUTHORIZATION_FAILED),
                        error_message=f"{who.name} may not CREATE the topic",
                    )
                )
                continue
            if not nodes:
                results.append(
                    coordinator_pb2.CreateTopicResult(
                        name=topic.name,
                        error_code=wire_error(ErrorCode.INVALID_REQUEST),
                        error_message="the cluster has no partition-log nodes",
                    )
                )
                continue
            most = self.router.fsm_config.max_partitions_per_request
            if not 1 <= topic.num_partitions <= most:
                results.append(
                    coordinator_pb2.CreateTopicResult(
                        name=topic.name,
                        error_code=wire_error(ErrorCode.INVALID_PARTITIONS),
                        error_message=f"num_partitions {topic.num_partitions} not in 1..{most}",
                    )
                )
                continue
            settings = self.router.config.settings
            factor = (
                topic.replication_factor
                if topic.replication_factor > 0
                else min(settings.default_replication_factor, len(leased))
            )
            if factor > len(leased):
                results.append(
                    coordinator_pb2.CreateTopicResult(
                        name=topic.name,
                        error_code=wire_error(ErrorCode.INVALID_REPLICATION_FACTOR),
                        error_message=(
                            f"replication factor {factor} is larger than the "
                            f"{len(nodes)} partition-log nodes"
                            if factor > len(nodes)
                            else f"replication factor {factor}: only {len(leased)} of the "
                            f"{len(nodes)} partition-log nodes hold a lease now"
                        ),
                    )
                )
                continue
            min_insync = topic.min_insync_replicas or min(settings.min_insync_replicas, factor)
            start = zlib.crc32(topic.name.encode()) % len(leased)
            assignment = assign_replicas(leased, topic.num_partitions, factor, start)
            command = _create_topic(topic.name, assignment, min_insync)
            if request.validate_only:
                outcome = self.router.refusal(command) or Outcome()
            else:
                outcome = self.router.run(METADATA_SHARD, command)
            results.append(
                coordinator_pb2.CreateTopicResult(
                    name=topic.name,
                    error_code=wire_error(outcome.error),
                    error_message="" if outcome.ok else outcome.message,
                )
            )
        return coordinator_pb2.CreateTopicsResponse(results=results)

    # --- partition-log nodes ---------------------------------------------------------

    def RegisterDirectory(self, request: Any, context: Any) -> Any:
        """Record a partition-log node's data directory (shard 0's leader
        answers; another node forwards to it)."""
        early = self._node_request(context, "RegisterDirectory", request)
        if early is not None:
            return early
        node_id, directory_id, replace = request.node_id, request.directory_id, request.replace
        outcome = self.router.run(
            METADATA_SHARD,
            lambda stamp: RegisterDirectory(node_id, directory_id, replace, stamp.now_ms),
        )
        if outcome.error is ErrorCode.KAFKA_STORAGE_ERROR and not replace:
            outcome = self._accept_replaced(node_id, directory_id) or outcome
        registered = ""
        if outcome.error in (ErrorCode.NONE, ErrorCode.KAFKA_STORAGE_ERROR):
            registered = self.router.shards.query(
                METADATA_SHARD, lambda machine: machine.state.directories.get(node_id, "")
            )
        return coordinator_pb2.RegisterDirectoryResponse(
            error_code=wire_error(outcome.error),
            error_message="" if outcome.ok else outcome.message,
            registered_directory_id=registered,
        )

    def ReserveOffsets(self, request: Any, context: Any) -> Any:
        """Raise a partition-log node's offset ceilings; answers each
        partition's ceiling from before (read through shard 0's log: only the
        directory on record reserves, so nothing moves it in between)."""
        early = self._node_request(context, "ReserveOffsets", request)
        if early is not None:
            return early
        wanted = tuple(
            OffsetReservation(r.topic, r.partition, r.ceiling) for r in request.reservations
        )
        node_id, directory_id = request.node_id, request.directory_id

        def before(machine: Any) -> list[int]:
            return [
                dict(enumerate(machine.offset_ceilings(topic))).get(index, 0)
                for topic, index, _ceiling in wanted
            ]

        try:
            previous = self.router.read(METADATA_SHARD, before)
        except Refused as not_read:
            return coordinator_pb2.ReserveOffsetsResponse(
                error_code=wire_error(not_read.error), error_message=not_read.message
            )
        outcome = self.router.run(
            METADATA_SHARD,
            lambda stamp: ReserveOffsets(node_id, directory_id, wanted, stamp.now_ms),
        )
        if not outcome.ok:
            return coordinator_pb2.ReserveOffsetsResponse(
                error_code=wire_error(outcome.error), error_message=outcome.message
            )
        return coordinator_pb2.ReserveOffsetsResponse(
            previous=[
                coordinator_pb2.PartitionCeiling(topic=r.topic, partition=r.partition, ceiling=c)
                for r, c in zip(wanted, previous, strict=True)
            ]
        )

    def NodeHeartbeat(self, request: Any, context: Any) -> Any:
        """Renew a partition-log node's lease with shard 0's leader (another
        node forwards to it); a fenced node is unfenced, answered once that
        applied. Only the directory on record holds a lease."""
        early = self._node_request(context, "NodeHeartbeat", request)
        if early is not None:
            return early
        availability = self.router.shards.availability(METADATA_SHARD)
        if availability is not ErrorCode.NONE:  # not the leader, and it could not be asked
            return coordinator_pb2.NodeHeartbeatResponse(
                error_code=wire_error(availability),
                error_message=f"no leader of shard {METADATA_SHARD} to hold the lease; retry",
            )
        node_id = request.node_id
        on_record, fenced = self.router.shards.query(
            METADATA_SHARD,
            lambda machine: (
                machine.state.directories.get(node_id),
                node_id in machine.state.fenced_nodes,
            ),
        )
        if on_record != request.directory_id:
            return coordinator_pb2.NodeHeartbeatResponse(
                error_code=wire_error(ErrorCode.KAFKA_STORAGE_ERROR),
                error_message=f"directory {request.directory_id} of partition-log node "
                f"{node_id} is not the one on record ({on_record or 'none'})",
            )
        self.leases.heard(node_id)
        if request.lost_data:
            outcome = self.router.run(METADATA_SHARD, fence_node(node_id))
            if not outcome.ok:
                return coordinator_pb2.NodeHeartbeatResponse(
                    error_code=wire_error(outcome.error), error_message=outcome.message
                )
            log.warning(
                "node=%d event=partition_node_fenced partition_node=%d: it may have lost "
                "acknowledged records; it leads nothing until its leaders catch it up",
                self.router.node_id,
                node_id,
            )
            return coordinator_pb2.NodeHeartbeatResponse(was_fenced=True)
        if fenced:
            outcome = self.router.run(
                METADATA_SHARD, lambda stamp: UnfenceNode(node_id, stamp.now_ms)
            )
            if not outcome.ok:
                return coordinator_pb2.NodeHeartbeatResponse(
                    error_code=wire_error(outcome.error), error_message=outcome.message
                )
        return coordinator_pb2.NodeHeartbeatResponse(was_fenced=fenced)

    def AlterPartition(self, request: Any, context: Any) -> Any:
        """A partition leader's new ISR (shard 0's leader applies it; another
        node forwards): answered with the registration once applied. Only
        the directory on record is heard."""
        early = self._node_request(context, "AlterPartition", request)
        if early is not None:
            return early
        node_id = request.node_id
        on_record = self.router.shards.query(
            METADATA_SHARD, lambda machine: machine.state.directories.get(node_id)
        )
        if on_record != request.directory_id:
            return coordinator_pb2.AlterPartitionResponse(
                error_code=wire_error(ErrorCode.KAFKA_STORAGE_ERROR),
                error_message=f"directory {request.directory_id} of partition-log node "
                f"{node_id} is not the one on record ({on_record or 'none'})",
            )
        topic, index = request.topic, request.partition
        leader_epoch, partition_epoch = request.leader_epoch, request.partition_epoch
        isr = tuple(request.isr)
        outcome = self.router.run(
            METADATA_SHARD,
            lambda stamp: AlterPartition(
                topic, index, node_id, leader_epoch, partition_epoch, isr, stamp.now_ms
            ),
        )
        if not outcome.ok:
            return coordinator_pb2.AlterPartitionResponse(
                error_code=wire_error(outcome.error), error_message=outcome.message
            )
        now = self.router.shards.query(
            METADATA_SHARD, lambda machine: machine.state.topics[topic].partitions[index]
        )
        return coordinator_pb2.AlterPartitionResponse(
            isr=now.isr, leader_epoch=now.leader_epoch, partition_epoch=now.partition_epoch
        )

    def _accept_replaced(self, node_id: int, directory_id: str) -> Outcome | None:
        """A new data directory of a node (a replaced disk) whose every
        partition has another in-sync replica: the node is fenced first (it
        leaves every ISR and leads nothing, its logs being gone), then the
        directory is recorded; its leaders catch it up and add it to their
        ISR again. None (refused as before) while some partition would lose
        its only in-sync copy: an operator decides (`raftcoord
        accept-directory`)."""

        def in_sync_elsewhere(machine: Any) -> bool:
            return all(
                any(r != node_id for r in p.isr)
                for topic in machine.state.topics.values()
                for p in topic.partitions
                if node_id in p.replicas
            )

        if not self.router.shards.query(METADATA_SHARD, in_sync_elsewhere):
            return None
        fenced = self.router.run(METADATA_SHARD, fence_node(node_id))
        # Fenced, the node is only left in the ISRs it was the last member of.
        if not fenced.ok or not self.router.shards.query(METADATA_SHARD, in_sync_elsewhere):
            return None
        accepted = self.router.run(
            METADATA_SHARD,
            lambda stamp: RegisterDirectory(node_id, directory_id, True, stamp.now_ms),
        )
        if accepted.ok:
            log.warning(
                "node=%d event=directory_replaced_accepted partition_node=%d directory=%s: "
                "every partition it holds has another in-sync replica; it is fenced until its "
                "leaders catch it up",
                self.router.node_id,
                node_id,
                directory_id,
            )
        return accepted

    def _node_request(self, context: Any, method: str, request: Any) -> Any | None:
        """The answer to a partition-log node's ``method`` request that this
        node does not handle itself, or None: a caller that is not that node
        (or a super user), a node id that is not a partition-log node's, or
        (when this node does not lead shard 0) shard 0's leader's answer."""
        response = getattr(coordinator_pb2, f"{method}Response")
        refused = node_refusal(
            self.router.config, self.router.caller(context).name, request.node_id
        )
        if refused is not None:
            return response(
                error_code=wire_error(ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
                error_message=refused,
            )
        if not any(n.node_id == request.node_id for n in self.router.config.partition_nodes):
            return response(
                error_code=wire_error(ErrorCode.INVALID_REQUEST),
                error_message=f"node {request.node_id} is not a partition-log node of this cluster",
            )
        return self.router.leader_answer(METADATA_SHARD, context, method, request)


def _create_topic(
    name: str, assignment: tuple[tuple[int, ...], ...], min_insync_replicas: int
) -> Unstamped:
    leaders = tuple(replicas[0] for replicas in assignment)
    return lambda stamp: CreateTopic(name, leaders, stamp.now_ms, assignment, min_insync_replicas)


def _missing(
    topics: Mapping[str, TopicRegistration], partitions: tuple[TopicPartition, ...]
) -> dict[TopicPartition, str]:
    """The partitions ``topics`` does not have, with why."""
    missing: dict[TopicPartition, str] = {}
    for topic, partition in partitions:
        registered = topics.get(topic)
        if registered is None:
            missing[TopicPartition(topic, partition)] = f"topic {topic!r} does not exist"
        elif not 0 <= partition < len(registered.partitions):
            missing[TopicPartition(topic, partition)] = (
                f"topic {topic!r} has partitions 0..{len(registered.partitions) - 1}, "
                f"not {partition}"
            )
    return missing


def _topic_metadata(name: str, registered: TopicRegistration | None) -> Any:
    if registered is None:
        return coordinator_pb2.TopicMetadata(
            name=name, error_code=wire_error(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        )
    return coordinator_pb2.TopicMetadata(
        name=name,
        error_code=wire_error(ErrorCode.NONE),
        partitions=[
            coordinator_pb2.PartitionMetadata(
                partition=i,
                node_id=p.leader,
                error_code=wire_error(
                    ErrorCode.LEADER_NOT_AVAILABLE if p.leader == NO_LEADER else ErrorCode.NONE
                ),
                replicas=p.replicas,
                isr=p.isr,
                leader_epoch=p.leader_epoch,
                partition_epoch=p.partition_epoch,
            )
            for i, p in enumerate(registered.partitions)
        ],
        min_insync_replicas=registered.min_insync_replicas,
    )


def _registration_from_proto(topic: Any) -> TopicRegistration:
    """What another coordinator's Metadata answer says of ``topic`` (an
    answer of a version before replicas names one replica, the leader)."""
    return TopicRegistration(
        tuple(
            PartitionRegistration(
                tuple(p.replicas) or (p.node_id,),
                tuple(p.isr) or (p.node_id,),
                p.node_id,
                p.leader_epoch,
                p.partition_epoch,
            )
            for p in sorted(topic.partitions, key=lambda p: p.partition)
        ),
        topic.min_insync_replicas or 1,
    )
