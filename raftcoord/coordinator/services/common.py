"""What every RPC family of a coordinator node shares: routing a request to
its shard, refusing it here when it cannot be served, replicating or reading
through the shard's log, and asking another node that leads the shard.

Requests are translated into :mod:`fsm` commands for the shard that owns the
key (``crc32(key) % S``); a node that does not lead that shard answers
NOT_COORDINATOR naming the leader it knows, a leader that has not applied
its log yet answers COORDINATOR_LOAD_IN_PROGRESS, and every answer comes after
the command is committed by Raft and applied. Reads go through a log barrier
so a deposed leader never serves stale state as current; topic metadata is
the exception (see :meth:`raftcoord.coordinator.services.topics.TopicRPCs.Metadata`).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import grpc

from fsm import ErrorCode, Outcome
from fsm.limits import request_refusal
from fsm.metadata import TopicPartition
from raftcoord.coordinator.leader import CHECK_ONLY, Unstamped
from raftcoord.coordinator.markers import METADATA_SHARD
from raftcoord.coordinator.settings import fsm_config
from raftcoord.coordinator.shard import Reader, Shards
from raftcoord.protocol.acl import CLUSTER_NAME, Operation, Principal, ResourceType
from raftcoord.protocol.channels import ChannelCache
from raftcoord.protocol.config import ClusterConfig
from raftcoord.protocol.routing import shard_for
from raftcoord.protocol.tls import Authorizer, NodeKind, acting_for, cluster_refusal
from raftcoord.protocol.v1 import common_pb2
from raftcoord.protocol.wire import wire_error

REQUEST_TIMEOUT_S = 10.0
FORWARDED_HEADER = "x-raftcoord-forwarded-by"
#: Deadline of a request forwarded to another node.
FORWARD_TIMEOUT_S = 2.0
T = TypeVar("T")
#: One authorization: (operation, resource type, resource name).
Check = tuple[Operation, ResourceType, str]
#: Kafka's answer when the ACLs refuse an operation on a resource type.
AUTHORIZATION_FAILED = {
    ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}


class Refused(Exception):
    """The shard cannot serve the request here; carries the answer."""

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


class NotForwarded(Exception):
    """A request could not be asked of another node; says why."""


class ShardRouter:
    """A node's way to its shards, shared by the RPC families."""

    def __init__(
        self,
        shards: Shards,
        config: ClusterConfig,
        node_id: int,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.shards = shards
        #: One channel per other coordinator (with ``credentials``, the node's
        #: TLS identity), kept: a forwarded request (say a partition-log
        #: node's Metadata read, every second, that reached a node not
        #: leading shard 0) does not pay a connection of its own.
        self.channels = ChannelCache(credentials=credentials)
        self.config = config
        self.node_id = node_id
        self.fsm_config = fsm_config(config.settings)
        #: ACL decisions, from this node's replica of shard 0 (it may lag the
        #: leader's by what replication has not brought yet).
        self.authorizer = Authorizer(
            config, lambda: shards.query(METADATA_SHARD, lambda machine: machine.state.acls)
        )

    def caller(self, context: Any) -> Principal:
        """Who a request is for (:meth:`raftcoord.protocol.tls.Authorizer.caller`)."""
        return self.authorizer.caller(context)

    def allows(
        self, who: Principal, operation: Operation, resource_type: ResourceType, name: str
    ) -> bool:
        """Whether the ACLs let ``who`` do ``operation`` on the resource."""
        return self.authorizer.allows(who, operation, resource_type, name)

    def denied(self, who: Principal, *checks: Check) -> Outcome | None:
        """The refusal of the first of ``checks`` (operation, resource type,
        name) the ACLs do not let ``who`` do, with Kafka's error for the
        resource type; None when all are allowed."""
        for operation, resource_type, name in checks:
            if not self.authorizer.allows(who, operation, resource_type, name):
                return Outcome(
                    error=AUTHORIZATION_FAILED[resource_type],
                    message=f"{who.name} may not {operation.name} "
                    f"{resource_type.name} {name[:200]!r}",
                )
        return None

    def cluster_refusal(self, context: Any, *kinds: NodeKind) -> str | None:
        """Why the caller may not send what only the cluster's nodes (of
        ``kinds``, all without) send, or None
        (:func:`raftcoord.protocol.tls.cluster_refusal`)."""
        return cluster_refusal(self.config, context, *kinds)

    def shard_of(self, key: str) -> int:
        return shard_for(key, self.config.shard_count)

    def check(self, shard: int) -> None:
        """Return when this node is the ready leader of ``shard``.

        Raises:
            Refused: NOT_COORDINATOR naming the leader known, or
                COORDINATOR_LOAD_IN_PROGRESS.
        """
        error = self.shards.availability(shard)
        if error is ErrorCode.NONE:
            return
        if error is ErrorCode.NOT_COORDINATOR:
            leader = self.shards.leader_of(shard)
            where = "unknown" if leader is None else f"node {leader.node_id} at {leader.grpc}"
            raise Refused(error, f"not the coordinator of shard {shard}; leader: {where}")
        raise Refused(error, f"shard {shard} is loading its state")

    def refusal(self, build: Unstamped) -> Outcome | None:
        """The answer to a request that must not be proposed (fsm.limits), or None."""
        refusal = request_refusal(build(CHECK_ONLY), self.fsm_config)
        return None if refusal is None else Outcome(error=refusal[0], message=refusal[1])

    def run(
        self,
        shard: int,
        build: Unstamped,
        precheck: Callable[[], Outcome | None] | None = None,
    ) -> Outcome:
        """Replicate the command of ``build`` on ``shard``; a refusal comes back
        as an error outcome.

        ``precheck`` validates what the command's own shard cannot (state of
        other shards) once this node is known to lead ``shard``: its outcome,
        if any, is the answer and nothing is proposed.
        """
        result: Outcome = wait(self.start(shard, build, precheck))
        return result

    def start(
        self,
        shard: int,
        build: Unstamped,
        precheck: Callable[[], Outcome | None] | None = None,
        parkable: bool = True,
        parked: Callable[[], None] | None = None,
        park_ms: int | None = None,
    ) -> Future[Outcome]:
        """:meth:`run` without the wait: the future of the command's outcome
        (resolved already when the request is refused here). Commands started
        one after the other are queued together and usually share one Raft
        entry (group commit). Not ``parkable``: answered at once rather than
        parked behind a completing transaction; ``parked``: called each time
        the request is parked; ``park_ms``: how long it may stay parked from
        its first parking (None: the park timeout)."""
        # A request that breaks a limit is refused by any node, before routing
        # to a leader: it never reaches the log.
        refused_here = self.refusal(build)
        if refused_here is not None:
            return answered(refused_here)
        try:
            self.check(shard)
            refused_before = None if precheck is None else precheck()
        except Refused as refused:
            return answered(Outcome(error=refused.error, message=refused.message))
        if refused_before is not None:
            return answered(refused_before)
        return self.shards.submit(shard, build, parkable, parked, park_ms)

    def read(self, shard: int, reader: Reader[T]) -> T:
        """``reader``'s answer from ``shard``'s leader (this node), through its log.

        Raises:
            Refused: this node cannot answer (not the ready leader, timed out).
        """
        self.check(shard)
        result = wait(self.shards.read(shard, reader))
        if isinstance(result, Outcome):  # refused or timed out
            raise Refused(result.error, result.message)
        return result

    def forward(self, shard: int, context: Any | None, method: str, request: Any) -> Any:
        """The answer of ``shard``'s leader, another node, to ``method`` with
        ``request``. A request that was itself forwarded is not forwarded
        again (no loops). ``context`` is None for a call of a cluster node
        over a cluster link: this node then asks as itself.

        Raises:
            NotForwarded: already forwarded, no other node leads ``shard``
                as far as this node knows, or the call failed.
        """
        if context is not None and dict(context.invocation_metadata()).get(FORWARDED_HEADER):
            raise NotForwarded("already forwarded")
        leader = self.shards.leader_of(shard)
        if leader is None or leader.node_id == self.node_id:
            raise NotForwarded("no leader")
        metadata = [(FORWARDED_HEADER, str(self.node_id))]
        if self.authorizer.enabled and context is not None:  # the leader checks them too
            metadata += acting_for(self.caller(context))
        try:
            stub = self.channels.coordinator(leader.grpc)
        except RuntimeError as exc:  # the node is stopping
            raise NotForwarded(str(exc)) from exc
        try:
            return getattr(stub, method)(request, timeout=FORWARD_TIMEOUT_S, metadata=metadata)
        except grpc.RpcError as exc:
            raise NotForwarded(exc.code().name) from exc

    def close(self) -> None:
        """Close the channels to the other coordinators (the node is stopping)."""
        self.channels.close()

    def security_refusal(self, context: Any, operation: Operation) -> Outcome | None:
        """The refusal of a request about the cluster's security (ACLs, SASL
        users): SECURITY_DISABLED without an authorizer (no ``[tls]``), or
        the caller may not ``operation`` the cluster; else None."""
        if not self.authorizer.enabled:
            return Outcome(
                error=ErrorCode.SECURITY_DISABLED,
                message="the cluster has no authorizer: ACLs and SASL users need [tls]",
            )
        return self.denied(self.caller(context), (operation, ResourceType.CLUSTER, CLUSTER_NAME))

    def leader_answer(self, shard: int, context: Any, method: str, request: Any) -> Any | None:
        """``shard``'s leader's answer to ``method`` when this node does not
        lead it; None when this node should answer (it leads the shard, or
        no leader could be asked: its own refusal then says why)."""
        if self.shards.availability(shard) is ErrorCode.NONE:
            return None
        try:
            return self.forward(shard, context, method, request)
        except NotForwarded:
            return None


def answered(outcome: Outcome) -> Future[Outcome]:
    """A future that already holds ``outcome``."""
    future: Future[Outcome] = Future()
    future.set_result(outcome)
    return future


def wait(future: Future[T]) -> T | Outcome:
    try:
        return future.result(timeout=REQUEST_TIMEOUT_S)
    except FutureTimeout:
        return Outcome(error=ErrorCode.REQUEST_TIMED_OUT, message="not committed in time; retry")


def partition_result(tp: TopicPartition, error: ErrorCode) -> Any:
    return common_pb2.PartitionResult(topic=tp[0], partition=tp[1], error_code=wire_error(error))
