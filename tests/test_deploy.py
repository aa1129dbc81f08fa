"""The multi-host example of deploy/: its config parses into the documented
shape, its systemd units run exactly the launcher's commands, every command
of its README is one the command line takes, its firewall rules and port
table open exactly the config's ports, Prometheus scrapes every metrics
address with a certificate it may read and the config lets scrape, and the
same config runs with each host in a network namespace of its own."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import TopicPartition as KafkaPartition

from raftcoord.chaos.verdict import UsageParser
from raftcoord.cli.main import main
from raftcoord.client import Admin, Consumer, TopicPartition, TransactionalProducer
from raftcoord.cluster import netns
from raftcoord.cluster.launcher import NODE_COMMANDS, node_command
from raftcoord.protocol.config import ClusterConfig, load_config
from tests.local_cluster import running_cluster

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
README = DEPLOY / "README.md"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
UNITS = {
    "coordinator": DEPLOY / "raftcoord-node@.service",
    "partition-log": DEPLOY / "raftcoord-partition-node@.service",
    "kafka-gateway": DEPLOY / "raftcoord-kafka-gateway@.service",
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
    assert [k.node_id for k in config.kafka_listeners] == [201, 202, 203]
    assert [host(k.address) for k in config.kafka_listeners] == hosts
    assert {k.security_protocol for k in config.kafka_listeners} == {"SSL"}


@pytest.mark.parametrize("kind", sorted(UNITS))
def test_the_systemd_units_run_the_commands_of_the_launcher(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = UNITS[kind].read_text().splitlines()
    [exec_start] = [line for line in lines if line.startswith("ExecStart=")]
    command = shlex.split(exec_start.removeprefix("ExecStart="))
    assert command == node_command(
        kind,
        "/etc/raftcoord/cluster.toml",
        "%i",
        f"/var/lib/raftcoord/{NODE_COMMANDS[kind]}-%i",
        python="/opt/raftcoord/.venv/bin/python",
    )
    assert command[1:3] == ["-m", "raftcoord.cli"]
    parsed = parse_only(monkeypatch, [a.replace("%i", "201") for a in command[3:]])
    assert parsed.func.__name__.removeprefix("_").replace("_", "-") == NODE_COMMANDS[kind]
    assert UNITS[kind].name in README.read_text()  # the README installs it


class Parsed(Exception):
    """What the command line parsed, before it would run anything."""


def parse_only(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> Any:
    """The namespace ``raftcoord ARGV`` parses to, running nothing (a
    subcommand or option the command line does not take fails the test as
    it fails the command: exit status 64)."""
    parse_known_args = UsageParser.parse_known_args

    def stop_after_parsing(self: UsageParser, *args: Any, **kwargs: Any) -> Any:
        result = parse_known_args(self, *args, **kwargs)
        if self.prog == "raftcoord":  # the top-level parser, after the subcommands'
            raise Parsed(result)
        return result

    monkeypatch.setattr(UsageParser, "parse_known_args", stop_after_parsing)
    with pytest.raises(Parsed) as parsed:
        main(argv)
    namespace, unknown = parsed.value.args[0]
    assert unknown == [], f"raftcoord {shlex.join(argv)}: unrecognized {unknown}"
    return namespace


def readme_commands() -> list[list[str]]:
    """Every `raftcoord` command of the README's shell blocks (continued
    lines joined, comments and `runuser -u raftcoord --` left out), the
    placeholders N (a node id) and S (a shard) given values."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", README.read_text(), re.DOTALL):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            words = shlex.split(line, comments=True)
            if words[:4] == ["runuser", "-u", "raftcoord", "--"]:
                words = words[4:]
            if words and (words[0] == "raftcoord" or words[0].endswith("/bin/raftcoord")):
                given = (re.sub(r"\bS\b", "0", re.sub(r"\bN\b", "1", w)) for w in words[1:])
                commands.append(list(given))
    return commands


def test_every_command_of_the_readme_is_one_the_command_line_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    commands = readme_commands()
    named = {tuple(c[:2]) if c[0] in ("certs", "cluster", "txn") else (c[0],) for c in commands}
    assert {("node",), ("partition-node",), ("kafka-gateway",), ("repair-shard",)} <= named
    assert {("accept-directory",), ("audit",), ("certs", "client"), ("txn", "list")} <= named
    for argv in commands:
        parsed = parse_only(monkeypatch, argv)
        if argv[0] in ("node", "partition-node", "repair-shard", "accept-directory"):
            # Where the units keep the node's data, never the default next to the config.
            kind = "node" if argv[0] in ("node", "repair-shard") else "partition-node"
            assert parsed.data_dir == f"/var/lib/raftcoord/{kind}-{parsed.id}", argv
            assert parsed.config == "/etc/raftcoord/cluster.toml", argv


def ports(spec: str) -> set[int]:
    """``7100,7201:7203`` as ports."""
    found: set[int] = set()
    for part in spec.split(","):
        low, _, high = part.partition(":")
        found.update(range(int(low), int(high or low) + 1))
    return found


def config_ports(config: ClusterConfig) -> dict[str, set[int]]:
    """The ports of one host of the config, by who needs them."""

    def port(address: str | None) -> set[int]:
        return set() if address is None else {int(address.rsplit(":", 1)[1])}

    first_host = host(config.coordinators[0].grpc)
    coordinators = [n for n in config.coordinators if host(n.grpc) == first_host]
    partition_nodes = [n for n in config.partition_nodes if host(n.grpc) == first_host]
    gateways = [k for k in config.kafka_listeners if host(k.address) == first_host]
    cluster: set[int] = set()
    for c in coordinators:
        cluster |= port(c.grpc) | port(c.link) | set().union(*(port(r) for r in c.raft))
    for p in partition_nodes:
        cluster |= port(p.grpc) | port(p.replication)
    metrics = set().union(*(port(n.metrics) for n in [*coordinators, *partition_nodes]))
    metrics |= set().union(*(port(k.metrics) for k in gateways))
    clients = set().union(*(port(n.grpc) for n in [*coordinators, *partition_nodes]))
    clients |= set().union(*(port(k.address) for k in gateways))
    return {"hosts": cluster, "clients": clients, "prometheus": metrics}


def test_the_firewall_and_the_port_table_open_exactly_the_configs_ports() -> None:
    config = load_config(DEPLOY / "cluster.toml")
    wanted = config_ports(config)
    text = README.read_text()
    rules = re.findall(r"ufw allow proto tcp from (\S+) to any port (\S+)", text)
    opened: dict[str, set[int]] = {"hosts": set(), "clients": set(), "prometheus": set()}
    for source, spec in rules:
        who = "hosts" if source == "$host" else "prometheus" if "7110" in spec else "clients"
        opened[who] |= ports(spec)
    assert opened == wanted
    assert re.search(r"for host in ((?:10\.0\.0\.\d+ ?)+); do", text).group(1).split() == [
        host(c.grpc) for c in config.coordinators
    ]
    [row] = [line for line in text.splitlines() if line.startswith("| 10.0.0.11 |")]
    listed = ports(
        ",".join(m.replace("-", ":") for m in re.findall(r"\b(\d{4}(?:-\d{4})?) \(", row))
    )
    assert listed == wanted["hosts"] | wanted["clients"] | wanted["prometheus"]


def test_prometheus_scrapes_every_metrics_address_with_a_certificate_it_may_use() -> None:
    """(promtool checks the file's syntax; the figures are read with
    patterns, the file being as simple as it is.)"""
    config = load_config(DEPLOY / "cluster.toml")
    text = PROMETHEUS.read_text()
    targets = {
        kind: re.findall(r'"([^"]+)"', listed)
        for listed, kind in re.findall(r"- targets: \[(.*?)\]\s+labels:\s+kind: (\S+)", text)
    }
    assert targets == {
        "coordinator": [n.metrics for n in config.coordinators],
        "partition-log": [n.metrics for n in config.partition_nodes],
        "kafka-gateway": [k.metrics for k in config.kafka_listeners],
    }
    assert "scheme: https" in text and config.tls is not None
    files = dict(re.findall(r"^\s+(ca_file|cert_file|key_file): (\S+)$", text, re.MULTILINE))
    assert len(files) == 3
    cert = Path(files["cert_file"])
    # Not the raftcoord user's directory (mode 700): one Prometheus reads.
    assert all(not f.startswith(str(config.tls.cert_dir)) for f in files.values())
    assert f"User:{cert.stem}" in config.tls.metrics_users
    assert Path(files["key_file"]) == cert.with_suffix(".key")
    readme = README.read_text()
    assert f"certs client --dir /root/raftcoord-ca --name {cert.stem}" in readme
    for path in files.values():
        assert f"/etc/prometheus/{Path(path).parent.name}/" in readme
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: `make install` installs Debian's prometheus package"
    checked = subprocess.run(
        [promtool, "check", "config", "--syntax-only", PROMETHEUS.name],
        cwd=PROMETHEUS.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    netns.unavailable() is not None,
    reason=f"network namespaces cannot be created here: {netns.unavailable()}",
)
def test_the_example_runs_with_each_host_in_its_own_namespace(tmp_path: Path) -> None:
    """Three namespaces stand for the three hosts, with real addresses: the
    example elects leaders and serves a transaction to a client in the root
    namespace, and through its Kafka gateways to a Kafka client."""
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

        # A Kafka client reads them through the gateways (SSL, its certificate).
        kafka = KafkaConsumer(
            cluster.kafka_client_config()
            | {"group.id": "deploy", "isolation.level": "read_committed"}
        )
        try:
            kafka.assign([KafkaPartition("orders", p, 0) for p in range(3)])
            through_gateway: list[bytes] = []

            def read_through_gateway() -> bool:
                message = kafka.poll(0.5)
                if message is not None and message.error() is None:
                    through_gateway.append(message.value())
                return len(through_gateway) >= 3

            cluster.wait_until(read_through_gateway, 60, "no record through the gateways")
        finally:
            kafka.close()
        assert sorted(through_gateway) == sorted(seen)
    assert not any(netns.exists(ns) for ns in namespaces.values())
