"""A coordinator that does not lead a shard forwards the request to the one
that does over a channel it keeps: two forwards to the same leader arrive
on one connection (each used to open, resolve and close its own). The
leader is a real gRPC server in this process; the router is the node's."""

from __future__ import annotations

from concurrent import futures
from typing import Any

import grpc

from raftcoord.cluster.launcher import free_ports
from raftcoord.coordinator.services.common import ShardRouter
from raftcoord.protocol.config import ClusterConfig, parse_config
from raftcoord.protocol.v1 import coordinator_pb2, coordinator_pb2_grpc


class Leader(coordinator_pb2_grpc.TransactionCoordinatorServicer):
    """Answers FindCoordinator and notes from which connection each call came."""

    def __init__(self) -> None:
        self.peers: list[str] = []

    def FindCoordinator(self, request: Any, context: Any) -> Any:
        self.peers.append(context.peer())
        return coordinator_pb2.FindCoordinatorResponse(node_id=2)


class Shards:
    """Every shard is led by node 2 of ``config``; the rest of Shards is not used."""

    def __init__(self, config: ClusterConfig) -> None:
        self.leader = config.coordinator(2)

    def leader_of(self, shard: int) -> Any:
        return self.leader


class Context:
    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


def _config(address: str) -> ClusterConfig:
    raft = free_ports(2)
    return parse_config(
        {
            "shard_count": 1,
            "coordinators": [
                {"id": 1, "grpc": "127.0.0.1:1", "raft": [f"127.0.0.1:{raft[0]}"]},
                {"id": 2, "grpc": address, "raft": [f"127.0.0.1:{raft[1]}"]},
            ],
        }
    )


def test_forwards_to_one_leader_share_a_connection() -> None:
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    leader = Leader()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    coordinator_pb2_grpc.add_TransactionCoordinatorServicer_to_server(leader, server)
    server.add_insecure_port(address)
    server.start()
    config = _config(address)
    router = ShardRouter(Shards(config), config, 1)  # type: ignore[arg-type]
    try:
        for _ in range(3):
            answer = router.forward(
                0, Context(), "FindCoordinator", coordinator_pb2.FindCoordinatorRequest(key="t")
            )
            assert answer.node_id == 2
        assert len(leader.peers) == 3 and len(set(leader.peers)) == 1, leader.peers
    finally:
        router.close()
        server.stop(None)
