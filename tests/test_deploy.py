"""The multi-host example of deploy/: its config parses into the documented
shape, its systemd units run exactly the launcher's commands, and the same
config runs with each host in a network namespace of its own."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from raftcoord.client import Admin, Consumer, TopicPartition, TransactionalProducer
from raftcoord.cluster import netns
from raftcoord.cluster.launcher import NODE_COMMANDS, node_command
from raftcoord.protocol.config import load_config
from tests.local_cluster import running_cluster

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
UNITS = {
    "coordinator": DEPLOY / "raftcoord-node@.service",
    "partition-log": DEPLOY / "raftcoord-partition-node@.service",
}


def host(address: str) -> str:
    return address.rsplit(":", 1)[0]


def test_the_example_config_is_three_hosts_each_with_a_coordinator_and_a_partition_node() -> None:
    config = load_config(DEPLOY / "cluster.toml")
    assert config.shard_count == 3
    assert [n.node_id for n in config.coordinators] == [1, 2, 3]
    assert [n.node_id for n in config.partition_nodes] == [101, 102, 103]
    hosts = [host(n.grpc) for n in config.coordinators]
    assert len(set(hosts)) == 3
    for coordinator, partition_node in zip(
        config.coordinators, config.partition_nodes, strict=True
    ):
        assert len(coordinator.raft) == 3
        assert {host(a) for a in coordinator.raft} == {host(coordinator.grpc)}
        assert host(partition_node.grpc) == host(coordinator.grpc)
    assert config.settings.fsync == "always" and config.settings.log_flush_policy == "always"
    assert config.tls is not None and config.tls.super_users == ("User:admin",)


@pytest.mark.parametrize("kind", sorted(UNITS))
def test_the_systemd_units_run_the_commands_of_the_launcher(kind: str) -> None:
    lines = UNITS[kind].read_text().splitlines()
    [exec_start] = [line for line in lines if line.startswith("ExecStart=")]
    assert shlex.split(exec_start.removeprefix("ExecStart=")) == node_command(
        kind,
        "/etc/raftcoord/cluster.toml",
        "%i",
        f"/var/lib/raftcoord/{NODE_COMMANDS[kind]}-%i",
        python="/opt/raftcoord/.venv/bin/python",
    )


@pytest.mark.slow
@pytest.mark.skipif(
    netns.unavailable() is not None,
    reason=f"network namespaces cannot be created here: {netns.unavailable()}",
)
def test_the_example_runs_with_each_host_in_its_own_namespace(tmp_path: Path) -> None:
    """Three namespaces stand for the three hosts, with real addresses: the
    example elects leaders and serves a transaction to a client in the root
    namespace."""
    with running_cluster(tmp_path / "c", netns=True, config=DEPLOY / "cluster.toml") as cluster:
        state = cluster.state
        assert state is not None and state.network is not None
        assert len(state.network.hosts) == 3
        namespaces = {n.node_id: n.netns for n in state.nodes}
        assert namespaces[1] == namespaces[101] != namespaces[2] == namespaces[102]
        assert all(host(n.grpc) != "127.0.0.1" for n in state.nodes)

        bootstrap, tls = cluster.bootstrap(), cluster.client_tls()
        assert tls  # the example runs with TLS
        with Admin(bootstrap, **tls) as admin:
            admin.create_topics({"orders": 3}, exist_ok=True)
        with TransactionalProducer(bootstrap, transactional_id="deploy", **tls) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            for i in range(3):
                producer.send("orders", value=b"paid %d" % i, partition=i)
            producer.commit_transaction()
        partitions = [TopicPartition("orders", p) for p in range(3)]
        seen: list[bytes] = []
        with Consumer(bootstrap, isolation_level="read_committed", **tls) as consumer:
            consumer.assign(partitions)
            consumer.seek_to_beginning(partitions)

            def read_all() -> bool:
                seen.extend(r.value for r in consumer.poll(timeout_ms=500))
                return len(seen) >= 3

            cluster.wait_until(read_all, 30, "the committed records were not read")
        assert sorted(seen) == [b"paid 0", b"paid 1", b"paid 2"]
    assert not any(netns.exists(ns) for ns in namespaces.values())
