"""A small retrying gRPC caller for the coordinator tests: finds the shard
leader, follows NOT_COORDINATOR and retries retriable answers with backoff."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc

from fsm import ErrorCode
from raftcoord.protocol.v1 import coordinator_pb2, coordinator_pb2_grpc

RETRIABLE = {
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.REQUEST_TIMED_OUT,
}


class Coordinators:
    def __init__(self, addresses: list[str]) -> None:
        self.addresses = list(addresses)
        self._channels = {a: grpc.insecure_channel(a) for a in addresses}
        self.stubs = {
            a: coordinator_pb2_grpc.TransactionCoordinatorStub(c) for a, c in self._channels.items()
        }
        self._leader: dict[str, str] = {}

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()

    def find(self, key: str, deadline: float) -> str:
        """The gRPC address of the leader for ``key``, asking every node in turn."""
        while True:
            for stub in self.stubs.values():
                try:
                    answer = stub.FindCoordinator(
                        coordinator_pb2.FindCoordinatorRequest(
                            key=key, key_type=coordinator_pb2.TRANSACTION
                        ),
                        timeout=1.0,
                    )
                except grpc.RpcError:
                    continue
                if answer.error_code == ErrorCode.NONE:
                    return str(answer.address)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no coordinator for {key!r}")
            time.sleep(0.05)

    def call(
        self, key: str, method: str, request: Any, timeout_s: float = 20.0, call_s: float = 5.0
    ) -> Any:
        """Call ``method`` on the leader for ``key`` until a non-retriable
        answer; one call may take ``call_s`` (a JoinGroup waits for its rebalance)."""
        deadline = time.monotonic() + timeout_s
        delay = 0.02
        while True:
            address = self._leader.get(key) or self.find(key, deadline)
            try:
                answer = getattr(self.stubs[address], method)(request, timeout=call_s)
            except grpc.RpcError:
                answer = None
            if answer is not None and _error_of(answer) not in RETRIABLE:
                self._leader[key] = address
                return answer
            self._leader.pop(key, None)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{method} for {key!r} kept failing: {answer}")
            time.sleep(delay)
            delay = min(delay * 2, 0.3)

    def create_topic(self, name: str, num_partitions: int, timeout_s: float = 20.0) -> None:
        """Create ``name`` (or find it created) on shard 0's leader, whichever node that is."""
        request = coordinator_pb2.CreateTopicsRequest(
            topics=[coordinator_pb2.CreatableTopic(name=name, num_partitions=num_partitions)]
        )

        def created() -> bool:
            for stub in self.stubs.values():
                try:
                    answer = stub.CreateTopics(request, timeout=5.0)
                except grpc.RpcError:
                    continue
                code = answer.results[0].error_code
                if code in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                    return True
            return False

        self.until(created, timeout_s, f"topic {name!r} was not created")

    def until(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(what)
            time.sleep(0.05)


def _error_of(answer: Any) -> ErrorCode:
    """The answer's error code (DescribeTransactions and DescribeGroups: the
    first description's)."""
    if "error_code" in answer.DESCRIPTOR.fields_by_name:
        return ErrorCode(answer.error_code)
    if "groups" in answer.DESCRIPTOR.fields_by_name:
        return ErrorCode(answer.groups[0].error_code)
    return ErrorCode(answer.transactions[0].error_code)


def join_group(
    client: Coordinators,
    group_id: str,
    member_id: str = "",
    session_timeout_ms: int = 10_000,
    rebalance_timeout_ms: int = 20_000,
    group_instance_id: str = "",
    protocols: tuple[tuple[str, bytes], ...] = (("range", b"subscription"),),
) -> Any:
    """JoinGroup as a Kafka consumer sends it (v4+): a first join with an
    empty member id is answered MEMBER_ID_REQUIRED, and joins again with the
    id it was given. Returns the answer of the join that waited."""
    wait_s = rebalance_timeout_ms / 1000 + 10

    def request(member: str) -> Any:
        return coordinator_pb2.JoinGroupRequest(
            group_id=group_id,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            member_id=member,
            group_instance_id=group_instance_id,
            protocol_type="consumer",
            protocols=[coordinator_pb2.JoinGroupProtocol(name=n, metadata=m) for n, m in protocols],
            client_id="test-client",
        )

    answer = client.call(group_id, "JoinGroup", request(member_id), wait_s, wait_s)
    if answer.error_code == ErrorCode.MEMBER_ID_REQUIRED:
        answer = client.call(group_id, "JoinGroup", request(answer.member_id), wait_s, wait_s)
    return answer


def describe_group(client: Coordinators, group_id: str) -> Any:
    """The DescribedGroup of ``group_id`` from its shard's leader."""
    request = coordinator_pb2.DescribeGroupsRequest(group_ids=[group_id])
    return client.call(group_id, "DescribeGroups", request).groups[0]


def partitions(topic: str, *numbers: int) -> list[Any]:
    from raftcoord.protocol.v1 import common_pb2

    return [common_pb2.TopicPartitions(topic=topic, partitions=list(numbers))]
