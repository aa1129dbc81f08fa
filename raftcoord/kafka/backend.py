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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
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
#: How long the gateway itself keeps sending a coordinator request that was
#: not taken (the shard's leadership is moving: an election after a kill, a
#: preferred leader taking its shard back) before the client gets the error,
#: and the pauses between tries. Not every Kafka client retries every such
#: answer (librdkafka's committed() and CreateTopics do not).
LEADER_MOVE_WAIT_S = 2.0
LEADER_MOVE_BACKOFF_S = (0.05, 0.1, 0.2, 0.4)

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
        such as CreateTopics), in rounds for up to :data:`LEADER_MOVE_WAIT_S`;
        COORDINATOR_NOT_AVAILABLE when none accepts."""
        async for _ in _while_leadership_moves():
            answer = await self._accepting_round(method, request)
            if answer is not None:
                return answer
        return _failed(method, ErrorCode.COORDINATOR_NOT_AVAILABLE, "no coordinator accepted")

    async def _accepting_round(self, method: str, request: Any) -> Any | None:
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
        return None

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
        not_taken: Callable[[Any], bool] | None = None,
    ) -> Any:
        """``method(request)`` on the leader of the shard of ``key`` (a
        transactional id or a group id, as ``key_type`` says), bounded by
        ``rpc_timeout_s`` plus ``wait_s`` (the time the coordinator may hold
        the request by design, as a JoinGroup waiting for its rebalance).

        Returns the coordinator's answer; on a REDISCOVER answer the leader
        is forgotten (the client rediscovers, and the gateway with it). A
        leader that cannot be reached is answered as COORDINATOR_NOT_AVAILABLE.
        An answer that the request was not taken (:data:`NOT_PROCESSED`, or
        no connection to the leader, or what ``not_taken`` says of an answer
        whose errors are per item) is not the client's yet: the gateway
        finds the leader again and resends, for up to :data:`LEADER_MOVE_WAIT_S`.
        """
        shard = shard_for(key, self.config.shard_count)
        answer = None
        async for _ in _while_leadership_moves():
            answer, taken = await self._to_leader_once(
                shard, key, key_type, method, request, wait_s
            )
            if taken and not_taken is not None and not_taken(answer):
                self._leaders.pop(shard, None)
                taken = False
            if taken:
                break
        return answer

    async def _to_leader_once(
        self,
        shard: int,
        key: str,
        key_type: coordinator_pb2.KeyType,
        method: str,
        request: Any,
        wait_s: float,
    ) -> tuple[Any, bool]:
        """One try of :meth:`to_leader`: the answer, and whether the request
        may have been taken (False: the coordinator said it did not take it,
        or the connection failed; resending it is what the client would do)."""
        address = self._leaders.get(shard)
        if address is None:
            found = await self.find_coordinator(key, key_type)
            if int(found.error_code) != ErrorCode.NONE:
                taken = int(found.error_code) not in NOT_PROCESSED
                return _failed(method, found.error_code, found.error_message), taken
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
            failed = _failed(
                method, ErrorCode.COORDINATOR_NOT_AVAILABLE, f"coordinator {address}: {exc.code()}"
            )
            # No connection: the request never left; a timeout: it may have run
            # (the client is told, and decides).
            return failed, exc.code() is not grpc.StatusCode.UNAVAILABLE
        code = getattr(answer, "error_code", ErrorCode.NONE)
        if code in REDISCOVER:
            log.info(
                "event=leader_moved shard=%d address=%s error=%s",
                shard,
                address,
                ErrorCode(code).name,
            )
            self._leaders.pop(shard, None)
        return answer, code not in NOT_PROCESSED

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

    async def owner(self, topic: str, partition: int) -> str | ErrorCode:
        """The gRPC address of the partition-log node leading
        ``topic``/``partition``; UNKNOWN_TOPIC_OR_PARTITION when the topic or
        partition does not exist (or no coordinator answered), and
        LEADER_NOT_AVAILABLE when it has no leader now (the topic is asked
        about again next time)."""
        known = self._topics.get(topic)
        if known is None:
            try:
                await self.metadata([topic])
            except Unreachable:
                return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            known = self._topics.get(topic)
            if known is None:
                return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        for p in known.partitions:
            if p.partition == partition:
                address = self._partition_nodes.get(p.node_id)
                if address is None:
                    self.forget_topic(topic)
                    return ErrorCode.LEADER_NOT_AVAILABLE
                return address
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

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
        partition, error) for items with no node (:meth:`owner`'s error) or
        whose node failed (NOT_LEADER_OR_FOLLOWER, the topic forgotten).
        """
        groups: dict[str, list[tuple[str, int, T]]] = {}
        failed: list[tuple[str, int, ErrorCode]] = []
        missing: set[str] = set()  # asked about once here, and unknown
        for topic, partition, payload in items:
            if topic in missing:
                failed.append((topic, partition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                continue
            address = await self.owner(topic, partition)
            if isinstance(address, ErrorCode):
                failed.append((topic, partition, address))
                if address is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and topic not in self._topics:
                    missing.add(topic)
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


async def _while_leadership_moves() -> AsyncIterator[None]:
    """One step per try, for up to :data:`LEADER_MOVE_WAIT_S`, with
    :data:`LEADER_MOVE_BACKOFF_S` between them: the caller breaks out when a
    try was taken."""
    deadline = asyncio.get_running_loop().time() + LEADER_MOVE_WAIT_S
    tries = 0
    while True:
        yield
        pause = LEADER_MOVE_BACKOFF_S[min(tries, len(LEADER_MOVE_BACKOFF_S) - 1)]
        if asyncio.get_running_loop().time() + pause > deadline:
            return
        await asyncio.sleep(pause)
        tries += 1


def _failed(method: str, code: int, message: str) -> Any:
    """An answer of ``method`` that carries only an error (nothing, for an
    answer without a top-level error: its items are then missing)."""
    response_type = getattr(coordinator_pb2, f"{method}Response")
    if "error_code" not in response_type.DESCRIPTOR.fields_by_name:
        return response_type()
    return response_type(error_code=code, error_message=message)
