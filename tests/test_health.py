"""gRPC health checking and server reflection on the nodes' ports: every
node is SERVING once it can do its job; a coordinator whose shards lost
their quorum goes NOT_SERVING and comes back once the others return;
reflection lists the services (what `grpcurl list` shows)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from raftcoord.cluster.launcher import LocalCluster
from tests.local_cluster import running_cluster

pytestmark = pytest.mark.slow

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("health")
    with running_cluster(root / "cluster", shards=2, partition_nodes=1) as running:
        yield running


def health(cluster: LocalCluster, address: str, service: str = "") -> int:
    with cluster.channel(address) as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=2
            )
        except grpc.RpcError:
            return -1
    return int(answer.status)


def test_every_node_serves_and_reflection_lists_its_services(cluster: LocalCluster) -> None:
    nodes = {n.grpc: n.kind for n in cluster.coordinators() + cluster.partition_nodes()}
    LocalCluster.wait_until(
        lambda: all(health(cluster, a) == SERVING for a in nodes), 20, "every node serving"
    )
    for address, kind in nodes.items():
        with cluster.channel(address) as channel:
            services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
        mine = (
            {"raftcoord.v1.TransactionCoordinator", "raftcoord.v1.CoordinatorAdmin"}
            if kind == "coordinator"
            else {"raftcoord.v1.PartitionLog"}
        )
        assert mine | {"grpc.health.v1.Health"} <= services, (address, services)
        for service in mine:
            assert health(cluster, address, service) == SERVING


def test_a_coordinator_without_quorum_stops_serving_and_comes_back(cluster: LocalCluster) -> None:
    first, *others = cluster.coordinators()
    for node in others:
        cluster.kill(node.node_id)
    try:
        LocalCluster.wait_until(
            lambda: health(cluster, first.grpc) == NOT_SERVING, 30, "NOT_SERVING without quorum"
        )
    finally:
        for node in others:
            cluster.start(node.node_id)
    LocalCluster.wait_until(
        lambda: health(cluster, first.grpc) == SERVING, 30, "SERVING again with its quorum"
    )
