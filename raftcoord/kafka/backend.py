"""The gateway's side of the cluster: gRPC calls to the coordinators and the
partition-log nodes, with the shard leaders and partition owners it has learnt.

Every call is made for the Kafka client being served (:data:`CALLER`, set
per client connection): with TLS, the gateway is a node and names that
client's principal in each call, so that the coordinators and partition
nodes check the client's rights, not the gateway's.

Every call is bounded by ``rpc_timeout_s``. A node that cannot be reached
answers as Kafka would name it: COORDINATOR_NOT_AVAILABLE for a coordinator,
NOT_LEADER_OR_FOLLOWER for a partition's node; the cached leader or owner is
forgotten so that the next request asks again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

import grpc
import grpc.aio

from raftcoord.protocol.acl import Principal
from raftcoord.protocol.channels import CHANNEL_POLICY
from raftcoord.protocol.config import ClusterConfig
from raftcoord.protocol.errors import REDISCOVER, ErrorCode
from raftcoord.protocol.routing import shard_for
from raftcoord.protocol.tls import acting_for
from raftcoord.protocol.v1 import (
    coordinator_pb2,
    coordinator_pb2_grpc,
    partition_log_pb2_grpc,
)

log = logging.getLogger(__name__)
#: Answers of a coordinator that did not take a request (it does not lead the
#: shard, or not yet): the same request may go to the leader found now.
NOT_PROCESSED = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})

T = TypeVar("T")


#: The Kafka client a call is made for (None: the gateway's own calls).
CALLER: ContextVar[Principal | None] = ContextVar("kafka_caller", default=None)


class Unreachable(Exception):
    """No node could answer the call in time."""


class _ActingFor(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Names :data:`CALLER` in every call's metadata."""

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        who = CALLER.get()
        if who is not None:
            metadata = grpc.aio.Metadata(*(client_call_details.metadata or ()))
            for key, value in acting_for(who):
                metadata.add(key, value)
            client_call_details = client_call_details._replace(metadata=metadata)
        return await continuation(client_call_details, request)


class Backend:
    """gRPC stubs of every node of ``config`` on one asyncio loop."""

    def __init__(
        self,
        config: ClusterConfig,
        rpc_timeout_s: float = 10.0,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.config = config
        #: The gateway's TLS credentials (its node certificate); None: plaintext.
        self.credentials = credentials
        self.rpc_timeout_s = rpc_timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._leaders: dict[int, str] = {}  # shard -> the leader's gRPC address
        self._topics: dict[str, coordinator_pb2.TopicMetadata] = {}
        self._partition_nodes: dict[int, str] = {n.node_id: n.grpc for n in config.partition_nodes}

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            options = [
                *CHANNEL_POLICY,
                ("grpc.max_receive_message_length", 128 * 1024 * 1024),
                ("grpc.max_send_message_length", 128 * 1024 * 1024),
            ]
            if self.credentials is None:
                channel = grpc.aio.insecure_channel(address, options=options)
            else:
                channel = grpc.aio.secure_channel(
                    address, self.credentials, options=options, interceptors=[_ActingFor()]
                )
            self._channels[address] = channel
        return channel

    def coordinator_stub(self, address: str) -> Any:
        return coordinator_pb2_grpc.TransactionCoordinatorStub(self._channel(address))

    def partition_stub(self, address: str) -> Any:
        return partition_log_pb2_grpc.PartitionLogStub(self._channel(address))

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    # --- coordinators ------------------------------------------------------------

    async def any_coordinator(self, call: Callable[[Any], Awaitable[T]]) -> T:
        """``call(stub)`` on the first coordinator that answers, in config order.

        Raises:
            Unreachable: none answered.
        """
        for node in self.config.coordinators:
            try:
                return await call(self.coordinator_stub(node.grpc))
            except grpc.aio.AioRpcError as exc:
                log.debug(
                    "event=coordinator_unreachable address=%s code=%s", node.grpc, exc.code().name
                )
        raise Unreachable("no coordinator answered")

    async def accepting_coordinator(self, method: str, request: Any) -> Any:
        """``method(request)`` on every coordinator in turn until one does not
        answer NOT_COORDINATOR (for requests that belong to shard 0's leader,
        such as CreateTopics); COORDINATOR_NOT_AVAILABLE when none accepts."""
        for node in self.config.coordinators:
            try:
                answer = await getattr(self.coordinator_stub(node.grpc), method)(
                    request, timeout=self.rpc_timeout_s
                )
            except grpc.aio.AioRpcError as exc:
                log.debug(
                    "event=coordinator_unreachable address=%s code=%s", node.grpc, exc.code().name
                )
                continue
            results = getattr(answer, "results", ())
            if (
                not any(r.error_code == ErrorCode.NOT_COORDINATOR for r in results)
                and getattr(answer, "error_code", ErrorCode.NONE) not in REDISCOVER
            ):
                return answer
        return _failed(method, ErrorCode.COORDINATOR_NOT_AVAILABLE, "no coordinator accepted")

    async def find_coordinator(
        self, key: str, key_type: coordinator_pb2.KeyType
    ) -> coordinator_pb2.FindCoordinatorResponse:
        """The coordinators' FindCoordinator answer for ``key``; remembers the leader."""
        request = coordinator_pb2.FindCoordinatorRequest(key=key, key_type=key_type)
        try:
            answer: coordinator_pb2.FindCoordinatorResponse = await self.any_coordinator(
                lambda stub: stub.FindCoordinator(request, timeout=self.rpc_timeout_s)
            )
        except Unreachable as exc:
            return coordinator_pb2.FindCoordinatorResponse(
                error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE,  # type: ignore[arg-type]
                error_message=str(exc),
            )
        if int(answer.error_code) == ErrorCode.NONE:
            self._leaders[answer.shard] = answer.address
        return answer

    async def to_leader(
        self,
        key: str,
        key_type: coordinator_pb2.KeyType,
        method: str,
        request: Any,
        wait_s: float = 0.0,
    ) -> Any:
        """``method(request)`` on the leader of the shard of ``key`` (a
        transactional id or a group id, as ``key_type`` says), bounded by
        ``rpc_timeout_s`` plus ``wait_s`` (the time the coordinator may hold
        the request by design, as a JoinGroup waiting for its rebalance).

        Returns the coordinator's answer; on a REDISCOVER answer the leader
        is forgotten (the client rediscovers, and the gateway with it). A
        leader that cannot be reached is answered as COORDINATOR_NOT_AVAILABLE.
        A remembered leader that answers that it did not take the request
        (:data:`NOT_PROCESSED`) is forgotten and the request sent once more to
        the leader found now.
        """
        shard = shard_for(key, self.config.shard_count)
        cached = self._leaders.get(shard)
        answer = await self._to_leader_once(shard, key, key_type, method, request, wait_s)
        code = getattr(answer, "error_code", ErrorCode.NONE)
        if cached is not None and code in NOT_PROCESSED:
            # The leader this gateway remembered no longer leads (a leadership
            # moved while no call of it failed): ask once more, of the leader
            # the coordinators name now, rather than hand the client an error
            # that not every client retries (librdkafka's committed() does not).
            answer = await self._to_leader_once(shard, key, key_type, method, request, wait_s)
        return answer

    async def _to_leader_once(
        self,
        shard: int,
        key: str,
        key_type: coordinator_pb2.KeyType,
        method: str,
        request: Any,
        wait_s: float,
    ) -> Any:
        address = self._leaders.get(shard)
        if address is None:
            found = await self.find_coordinator(key, key_type)
            if int(found.error_code) != ErrorCode.NONE:
                return _failed(method, found.error_code, found.error_message)
            address = found.address
        try:
            answer = await getattr(self.coordinator_stub(address), method)(
                request, timeout=self.rpc_timeout_s + wait_s
            )
        except grpc.aio.AioRpcError as exc:
            log.info(
                "event=leader_unreachable shard=%d address=%s code=%s",
                shard,
                address,
                exc.code().name,
            )
            self._leaders.pop(shard, None)
            return _failed(
                method, ErrorCode.COORDINATOR_NOT_AVAILABLE, f"coordinator {address}: {exc.code()}"
            )
        code = getattr(answer, "error_code", ErrorCode.NONE)
        if code in REDISCOVER:
            log.info(
                "event=leader_moved shard=%d address=%s error=%s",
                shard,
                address,
                ErrorCode(code).name,
            )
            self._leaders.pop(shard, None)
        return answer

    def forget_leader(self, key: str) -> None:
        """Ask the coordinators again who leads ``key``'s shard next time (an
        answer without a top-level error said NOT_COORDINATOR per item)."""
        self._leaders.pop(shard_for(key, self.config.shard_count), None)

    # --- topics and partitions ---------------------------------------------------

    async def metadata(self, topics: Sequence[str] | None) -> coordinator_pb2.MetadataResponse:
        """The coordinators' topic table (all topics when ``topics`` is None).

        Raises:
            Unreachable: no coordinator answered.
        """
        request = coordinator_pb2.MetadataRequest(topics=list(topics or ()))
        answer: coordinator_pb2.MetadataResponse = await self.any_coordinator(
            lambda stub: stub.Metadata(request, timeout=self.rpc_timeout_s)
        )
        for node in answer.partition_nodes:
            self._partition_nodes[node.node_id] = node.address
        for topic in answer.topics:
            if int(topic.error_code) == ErrorCode.NONE:
                self._topics[topic.name] = topic
        return answer

    async def owner(self, topic: str, partition: int) -> str | None:
        """The gRPC address of the partition-log node of ``topic``/``partition``,
        or None when the topic or partition does not exist."""
        known = self._topics.get(topic)
        if known is None:
            try:
                await self.metadata([topic])
            except Unreachable:
                return None
            known = self._topics.get(topic)
            if known is None:
                return None
        for p in known.partitions:
            if p.partition == partition:
                return self._partition_nodes.get(p.node_id)
        return None

    def forget_topic(self, topic: str) -> None:
        """Ask the coordinators again about ``topic`` next time (its owner moved or failed)."""
        self._topics.pop(topic, None)

    async def per_owner(
        self,
        items: Sequence[tuple[str, int, T]],
        call: Callable[[Any, list[T]], Awaitable[Any]],
    ) -> tuple[list[tuple[list[T], Any]], list[tuple[str, int, ErrorCode]]]:
        """Group ``items`` (topic, partition, payload) by their partition-log
        node, run ``call(stub, payloads)`` per node concurrently.

        Returns (payloads, answer) per node that answered, and (topic,
        partition, error) for items with no node (UNKNOWN_TOPIC_OR_PARTITION)
        or whose node failed (NOT_LEADER_OR_FOLLOWER, the topic forgotten).
        """
        groups: dict[str, list[tuple[str, int, T]]] = {}
        failed: list[tuple[str, int, ErrorCode]] = []
        for topic, partition, payload in items:
            address = await self.owner(topic, partition)
            if address is None:
                failed.append((topic, partition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
            else:
                groups.setdefault(address, []).append((topic, partition, payload))

        async def one(address: str, group: list[tuple[str, int, T]]) -> Any:
            return await call(self.partition_stub(address), [payload for _, _, payload in group])

        addresses = list(groups)
        answers = await asyncio.gather(
            *(one(a, groups[a]) for a in addresses), return_exceptions=True
        )
        done: list[tuple[list[T], Any]] = []
        for address, answer in zip(addresses, answers, strict=True):
            group = groups[address]
            if isinstance(answer, BaseException):
                if not isinstance(answer, grpc.aio.AioRpcError):
                    raise answer
                log.info(
                    "event=partition_node_unreachable address=%s code=%s",
                    address,
                    answer.code().name,
                )
                for topic, partition, _ in group:
                    self.forget_topic(topic)
                    failed.append((topic, partition, ErrorCode.NOT_LEADER_OR_FOLLOWER))
            else:
                done.append(([payload for _, _, payload in group], answer))
        return done, failed


def _failed(method: str, code: int, message: str) -> Any:
    """An answer of ``method`` that carries only an error (nothing, for an
    answer without a top-level error: its items are then missing)."""
    response_type = getattr(coordinator_pb2, f"{method}Response")
    if "error_code" not in response_type.DESCRIPTOR.fields_by_name:
        return response_type()
    return response_type(error_code=code, error_message=message)
