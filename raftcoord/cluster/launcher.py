"""A local cluster, as ``raftcoord cluster up|status|down|kill|start`` runs it
(the command line is :mod:`raftcoord.cli.cluster`).

The launcher writes the cluster config from ``cluster.toml.template`` (beside
this module) and a new Raft key beside the config (``raft.key``, mode 600), starts every node as
its own OS process (same data dir and ports on a restart), and records
what it started in ``<data-dir>/cluster.json``: addresses, pids, log files
and, with ``--netns``, the network namespaces.
Nodes listen on 127.0.0.1 with free ports, or with ``--netns`` each in its
own network namespace with its own address and the ports a host of a real
deployment uses (:mod:`raftcoord.cluster.netns`). The tests drive clusters through
:class:`LocalCluster`, the same code the command line uses.

About 600 lines: :class:`LocalCluster` is one object whose start, stop,
restart and status share the recorded state of ``cluster.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from raftcoord.client import Admin
from raftcoord.cluster import certs, node_faults
from raftcoord.cluster import netns as namespaces
from raftcoord.protocol.acl import (
    CLUSTER_NAME,
    WILDCARD,
    Acl,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from raftcoord.protocol.channels import open_channel
from raftcoord.protocol.config import (
    KAFKA_SECURITY_PROTOCOLS,
    ClusterConfig,
    ConfigError,
    load_config,
    shape_refusal,
    write_raft_key,
)
from raftcoord.protocol.routing import preferred_leader
from raftcoord.protocol.tls import ADMIN_CERT_NAME, Identity, SslFiles
from raftcoord.protocol.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    coordinator_pb2,
    coordinator_pb2_grpc,
    partition_log_pb2,
    partition_log_pb2_grpc,
)
from raftcoord.protocol.wire import acl_from_proto

#: The config a local cluster is given, filled in by :func:`write_config` (package data).
TEMPLATE = Path(__file__).with_name("cluster.toml.template")
STATE_FILE = "cluster.json"
CONFIG_FILE = "cluster.toml"
#: The cluster's Raft key, beside its config (mode 600).
RAFT_KEY_FILE = "raft.key"
#: Where ``--tls`` puts the CA and the certificates, under the cluster directory.
TLS_DIR = "tls"
#: The client certificates ``--tls`` makes: a super user and an ordinary client.
TLS_ADMIN = ADMIN_CERT_NAME
TLS_CLIENT = "client"
TLS_CLIENTS = (TLS_ADMIN, TLS_CLIENT)
#: Partition-log node ids start here, so that they never collide with coordinator ids.
PARTITION_NODE_BASE_ID = 101
#: The ports of a node that has an address of its own (a namespace, a host of
#: deploy/cluster.toml): a coordinator's gRPC port, shard S's Raft port
#: (RAFT_BASE_PORT + S) and the port where it serves the partition-log
#: nodes' adds to transactions, a partition-log node's gRPC port and the port
#: where it serves its followers' fetches, a Kafka gateway's listener (Kafka's
#: own port).
COORDINATOR_PORT = 7100
COORDINATOR_LINK_PORT = 7120
RAFT_BASE_PORT = 7201
PARTITION_NODE_PORT = 7300
PARTITION_NODE_REPLICATION_PORT = 7320
KAFKA_PORT = 9092
#: The metrics endpoints' ports of nodes with an address of their own.
COORDINATOR_METRICS_PORT = 7110
PARTITION_NODE_METRICS_PORT = 7310
KAFKA_METRICS_PORT = 7410
SIGNALS = {
    "KILL": signal.SIGKILL,
    "STOP": signal.SIGSTOP,
    "CONT": signal.SIGCONT,
    "TERM": signal.SIGTERM,
}


class ClusterError(Exception):
    """The cluster could not be started, found or reached."""


@dataclass
class NodeRecord:
    """One process the launcher manages."""

    node_id: int
    kind: str  # "coordinator", "partition-log" or "kafka-gateway"
    grpc: str  # "" for a Kafka gateway
    pid: int = 0
    log: str = ""
    netns: str = ""  # the network namespace it runs in ("": the root namespace)
    kafka: str = ""  # a Kafka gateway's address for Kafka clients
    metrics: str = ""  # its Prometheus endpoint ("": none)

    @property
    def address(self) -> str:
        """Where it listens: its gRPC address, a gateway's Kafka listener."""
        return self.grpc or self.kafka

    @property
    def host(self) -> str:
        """The host (IP address) of :attr:`address`."""
        return _host(self.address)


@dataclass
class ClusterState:
    data_dir: str
    config: str
    shard_count: int
    nodes: list[NodeRecord] = field(default_factory=list)
    network: namespaces.Network | None = None  # the namespaces, bridge and addresses (--netns)
    #: Where the node-faults library was built (--faults), else None.
    faults: str | None = None
    #: The directory of the cluster's CA and certificates (--tls), else None.
    tls: str | None = None

    def node(self, node_id: int) -> NodeRecord:
        for record in self.nodes:
            if record.node_id == node_id:
                return record
        raise ClusterError(
            f"no node {node_id} in {self.data_dir} (nodes: {[n.node_id for n in self.nodes]})"
        )


#: The names of what nodes keep in the cluster directory: each node's data
#: directory (``KIND-ID``, :data:`NODE_COMMANDS`) and its log (``KIND-ID.log``).
_NODE_FILE = re.compile(r"(node|partition-node|kafka-gateway)-\d+(\.log)?")

#: The lowest port :func:`free_ports` hands out.
LOWEST_FREE_PORT = 10_000


def ephemeral_ports_start() -> int:
    """The first port the kernel hands to outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1, below the kernel's range
    of ephemeral ports: a node killed and started again listens on its ports
    again, which an outgoing connection made while it was down could have
    taken as its own local port had they been ephemeral."""
    top = ephemeral_ports_start()
    candidates = random.sample(range(LOWEST_FREE_PORT, top), top - LOWEST_FREE_PORT)
    sockets: list[socket.socket] = []
    try:
        for port in candidates:
            if len(sockets) == count:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            sockets.append(s)
        if len(sockets) < count:
            raise ClusterError(f"fewer than {count} free ports below {top}")
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


#: The ``raftcoord`` subcommand that runs each kind of node.
NODE_COMMANDS = {
    "coordinator": "node",
    "partition-log": "partition-node",
    "kafka-gateway": "kafka-gateway",
}
#: Kafka gateway ids ([[kafka_listeners]]) start here, after the partition-log nodes'.
KAFKA_LISTENER_BASE_ID = 201


def node_command(
    kind: str, config: str, node_id: int | str, data_dir: str, python: str = sys.executable
) -> list[str]:
    """The command that runs one node: what the launcher starts (inside the
    node's namespace with --netns), and what deploy/'s systemd units run."""
    command = [python, "-m", "raftcoord.cli", NODE_COMMANDS[kind], "--config", config]
    command += ["--id", str(node_id)]
    if kind != "kafka-gateway":  # a gateway keeps no data
        command += ["--data-dir", data_dir]
    return command


def node_ids(coordinators: int, partition_nodes: int, kafka_listeners: int = 0) -> list[int]:
    """The ids of a launched cluster's nodes: coordinators 1..N, then
    partition-log nodes from PARTITION_NODE_BASE_ID, then Kafka gateways
    from KAFKA_LISTENER_BASE_ID."""
    return (
        list(range(1, coordinators + 1))
        + list(range(PARTITION_NODE_BASE_ID, PARTITION_NODE_BASE_ID + partition_nodes))
        + list(range(KAFKA_LISTENER_BASE_ID, KAFKA_LISTENER_BASE_ID + kafka_listeners))
    )


def _host_label(node_id: int) -> str:
    """The host (namespace) label of a node of ``cluster up --netns``."""
    return f"node-{node_id}"


def _host(address: str) -> str:
    return address.rsplit(":", 1)[0]


def _hosts(config: ClusterConfig) -> list[str]:
    """The distinct hosts a config's addresses name, in order of appearance."""
    addresses = [a for n in config.coordinators for a in (n.grpc, *n.raft)]
    addresses += [n.grpc for n in config.partition_nodes]
    addresses += [k.address for k in config.kafka_listeners]
    return list(dict.fromkeys(_host(a) for a in addresses))


def _read_multi_host_config(path: Path) -> tuple[str, ClusterConfig]:
    try:
        config = load_config(path)
        return path.read_text(), config
    except (OSError, ConfigError) as exc:
        raise ClusterError(str(exc)) from None


#: A quoted "host:port" string of a TOML config.
_ADDRESS = re.compile(r"""(["'])([^"':\s]+):(\d+)\1""")


def _rehost(text: str, network: namespaces.Network) -> str:
    """A config's text with each host's addresses moved to that host's
    namespace (the hosts are ``network``'s labels)."""
    moved = {h.label: h.address for h in network.hosts}
    return _ADDRESS.sub(lambda m: f"{m[1]}{moved.get(m[2], m[2])}:{m[3]}{m[1]}", text)


def _add_tls_table(config_path: Path) -> None:
    """Append the ``[tls]`` table of ``cluster up --tls`` to a config file: the
    CA and certificates in ``tls/`` beside it, the super user ``admin``."""
    with config_path.open("a") as out:
        out.write(
            f'\n[tls]\nca_file = "{TLS_DIR}/{certs.CA_CERT}"\ncert_dir = "{TLS_DIR}"\n'
            f'super_users = ["User:{TLS_ADMIN}"]\n'
        )


def _without_tls(text: str) -> str:
    """A config's text without its ``[tls]`` table (a deployment's names the
    certificate files of its hosts; the launcher makes its own)."""
    kept, inside = [], False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            inside = stripped == "[tls]"
        if not inside:
            kept.append(line)
    return "\n".join(kept) + "\n"


def _local_raft_key(text: str) -> str:
    """A config's text with its Raft key in the cluster's directory (a
    deployment's config names the key file of its hosts)."""
    kept = [line for line in text.splitlines() if not line.startswith("raft_key_file")]
    return f'raft_key_file = "{RAFT_KEY_FILE}"\n' + "\n".join(kept) + "\n"


def _create_network(labels: list[str]) -> namespaces.Network:
    reason = namespaces.unavailable()
    if reason is not None:
        raise ClusterError(f"--netns: network namespaces cannot be created here: {reason}")
    try:
        return namespaces.create(labels)
    except namespaces.NetnsError as exc:
        raise ClusterError(f"--netns: {exc}") from None


def write_config(
    path: Path,
    coordinators: int,
    shards: int,
    fsync: str = "always",
    abort_interval_ms: int = 1000,
    partition_nodes: int = 3,
    log_flush: str = "always",
    settings: dict[str, Any] | None = None,
    hosts: dict[int, str] | None = None,
    kafka_listeners: int = 0,
    kafka_security: str = "PLAINTEXT",
    metrics: bool = True,
) -> None:
    """Write a cluster config for a local cluster; ``settings`` adds entries
    to its ``[settings]`` table (Kafka-style names), in place of the
    template's own entry of the same name. Nodes listen on
    127.0.0.1 with free ports, or, given ``hosts`` (node id -> IP address),
    each on its own address with the fixed ports COORDINATOR_PORT,
    RAFT_BASE_PORT + shard, COORDINATOR_LINK_PORT, PARTITION_NODE_PORT and
    PARTITION_NODE_REPLICATION_PORT. ``kafka_listeners``
    Kafka gateways listen the same way (on KAFKA_PORT given ``hosts``), with
    ``kafka_security`` (their ``security_protocol``). With ``metrics`` every
    process gets a metrics endpoint (COORDINATOR_METRICS_PORT,
    PARTITION_NODE_METRICS_PORT and KAFKA_METRICS_PORT given ``hosts``)."""
    processes = coordinators + partition_nodes + kafka_listeners
    if hosts is None:
        ports = iter(
            free_ports(
                coordinators * (2 + shards) + 2 * partition_nodes + kafka_listeners + processes
            )
        )

        def address(node_id: int, port: int) -> str:
            return f'"127.0.0.1:{next(ports)}"'

    else:

        def address(node_id: int, port: int) -> str:
            return f'"{hosts[node_id]}:{port}"'

    def metrics_line(node_id: int, port: int) -> str:
        return f"metrics = {address(node_id, port)}\n" if metrics else ""

    ids = node_ids(coordinators, partition_nodes)
    blocks = []
    for node_id in ids[:coordinators]:
        grpc_address = address(node_id, COORDINATOR_PORT)
        raft = ", ".join(address(node_id, RAFT_BASE_PORT + s) for s in range(shards))
        blocks.append(
            f"[[coordinators]]\nid = {node_id}\ngrpc = {grpc_address}\nraft = [{raft}]\n"
            f"link = {address(node_id, COORDINATOR_LINK_PORT)}\n"
            + metrics_line(node_id, COORDINATOR_METRICS_PORT)
        )
    partition_blocks = [
        f"[[partition_nodes]]\nid = {node_id}\ngrpc = {address(node_id, PARTITION_NODE_PORT)}\n"
        f"replication = {address(node_id, PARTITION_NODE_REPLICATION_PORT)}\n"
        + metrics_line(node_id, PARTITION_NODE_METRICS_PORT)
        for node_id in ids[coordinators:]
    ]
    overridden = {json.dumps(k) for k in settings or {}}
    template = "".join(
        line
        for line in TEMPLATE.read_text().splitlines(keepends=True)
        if line.split(" = ", 1)[0] not in overridden
    )
    text = template.format(
        shard_count=shards,
        fsync=fsync,
        abort_interval_ms=abort_interval_ms,
        log_flush=log_flush,
        extra_settings="".join(
            f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in (settings or {}).items()
        ),
        coordinators="\n".join(blocks),
        partition_nodes="\n".join(partition_blocks),
    )
    for node_id in node_ids(0, 0, kafka_listeners):
        text += (
            f"\n[[kafka_listeners]]\nid = {node_id}\naddress = {address(node_id, KAFKA_PORT)}\n"
            f'security_protocol = "{kafka_security}"\n' + metrics_line(node_id, KAFKA_METRICS_PORT)
        )
    path.write_text(text)
    key = path.parent / RAFT_KEY_FILE
    if not key.exists():
        write_raft_key(key)


class LocalCluster:
    """Start, inspect, fault and stop the processes of one local cluster."""

    def __init__(self, data_dir: str | Path) -> None:
        self.data_dir = Path(data_dir).resolve()
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self.state: ClusterState | None = None
        state_file = self.data_dir / STATE_FILE
        if state_file.exists():
            raw = json.loads(state_file.read_text())
            raw["nodes"] = [NodeRecord(**n) for n in raw["nodes"]]
            if raw.get("network") is not None:
                raw["network"] = namespaces.Network.from_dict(raw["network"])
            self.state = ClusterState(**raw)

    # --- lifecycle -----------------------------------------------------------------

    def up(
        self,
        coordinators: int = 3,
        shards: int = 3,
        fsync: str = "always",
        abort_interval_ms: int = 1000,
        timeout_s: float = 30.0,
        partition_nodes: int = 3,
        log_flush: str = "always",
        settings: dict[str, Any] | None = None,
        netns: bool = False,
        config: str | Path | None = None,
        kafka_listeners: int = 0,
        faults: bool = False,
        tls: bool = False,
        kafka_security: str = "PLAINTEXT",
        starting: Callable[[], None] | None = None,
        metrics: bool = True,
    ) -> ClusterState:
        """Write the config, start every node, wait until every shard has a leader
        (its preferred one with auto.leader.rebalance.enable) and every
        partition-log node answers.

        With ``faults``, every node runs with the node-faults library
        preloaded (:mod:`raftcoord.cluster.node_faults`; needs a C compiler),
        so that :meth:`fail_disk` can make its fsync fail and
        :meth:`shift_clock` can step its wall clock.

        With ``tls`` (or a given ``config`` with a ``[tls]`` table), a new
        CA and certificates (every node's, and the clients ``admin``, a super
        user, and ``client``) go to ``DIR/tls/`` and the config's ``[tls]``
        names them: every gRPC connection is then
        mutual TLS (:mod:`raftcoord.protocol.tls`; :meth:`client_tls`).

        With ``netns``, every node runs in a network namespace of its own, or,
        given ``config`` (a multi-host config such as deploy/cluster.toml,
        whose shape and settings are then used instead of the arguments),
        every host the config names becomes one namespace and its address is
        replaced by the namespace's. ``kafka_listeners`` Kafka gateways
        (docs/kafka.md) start after the nodes (each in a namespace of its
        own with ``netns``; a multi-host config lists its own), with
        ``kafka_security`` (PLAINTEXT, or with ``tls`` SSL or SASL_SSL;
        :meth:`kafka_client_config`). With ``metrics`` (the default) every
        process serves Prometheus metrics (docs/metrics.md; the addresses are
        in :meth:`status`). ``starting`` is called once every check has
        passed, just before the first node starts.

        Raises:
            ClusterError: the data directory cannot be used, a cluster runs
                there already, or the nodes did not come up in ``timeout_s``
                (then every node started is stopped again).
        """
        if self.state is not None and any(self.alive(n.node_id) for n in self.state.nodes):
            raise ClusterError(
                f"a cluster is already running in {self.data_dir}; "
                "run `raftcoord cluster down` first"
            )
        if kafka_listeners and config is not None:
            raise ClusterError(
                "--kafka-listeners with a multi-host config: list them in its [[kafka_listeners]]"
            )
        if kafka_security not in KAFKA_SECURITY_PROTOCOLS:
            raise ClusterError(f"--kafka-security must be one of {list(KAFKA_SECURITY_PROTOCOLS)}")
        if kafka_security != "PLAINTEXT" and not tls:
            raise ClusterError(f"--kafka-security {kafka_security} needs --tls")
        if config is not None and not netns:
            raise ClusterError(
                "a multi-host config starts only with --netns (each of its hosts a namespace)"
            )
        given = None if config is None else _read_multi_host_config(Path(config))
        faults_dir = None
        if faults:
            try:
                faults_dir = str(node_faults.build(self.data_dir / "faults"))
            except node_faults.FaultsUnavailable as exc:
                raise ClusterError(f"--faults: {exc}") from None
        self._remove_network()  # left by a cluster whose nodes all stopped without `down`
        self._check_data_dir()
        network = None
        if netns:
            labels = (
                [_host_label(i) for i in node_ids(coordinators, partition_nodes, kafka_listeners)]
                if given is None
                else _hosts(given[1])
            )
            network = _create_network(labels)
        config_path = self.data_dir / CONFIG_FILE
        candidate = self.data_dir / (CONFIG_FILE + ".new")
        try:
            if given is not None:
                assert network is not None
                candidate.write_text(_without_tls(_local_raft_key(_rehost(given[0], network))))
                tls = tls or given[1].tls is not None
                if not (self.data_dir / RAFT_KEY_FILE).exists():
                    write_raft_key(self.data_dir / RAFT_KEY_FILE)
            else:
                hosts = None
                if network is not None:
                    ids = node_ids(coordinators, partition_nodes, kafka_listeners)
                    hosts = {i: network.host(_host_label(i)).address for i in ids}
                write_config(
                    candidate,
                    coordinators,
                    shards,
                    fsync,
                    abort_interval_ms,
                    partition_nodes,
                    log_flush,
                    settings,
                    hosts,
                    kafka_listeners,
                    kafka_security,
                    metrics,
                )
            if tls:
                _add_tls_table(candidate)
            cluster_config = load_config(candidate)
            if network is not None:
                stray = set(_hosts(cluster_config)) - {h.address for h in network.hosts}
                if stray:
                    raise ClusterError(f"could not move the addresses of {sorted(stray)}")
            if tls:
                self._make_certs(cluster_config)
            for node_dir in sorted(self.data_dir.glob("*node-*")):
                refusal = shape_refusal(node_dir, cluster_config) if node_dir.is_dir() else None
                if refusal is not None:
                    raise ClusterError(
                        f"{refusal}. Start the cluster with the same shape, "
                        "or use another --cluster-dir."
                    )
        except BaseException:
            candidate.unlink(missing_ok=True)
            if network is not None:
                namespaces.destroy(network)
            raise
        records = [
            NodeRecord(n.node_id, "coordinator", n.grpc, metrics=n.metrics or "")
            for n in cluster_config.coordinators
        ] + [
            NodeRecord(n.node_id, "partition-log", n.grpc, metrics=n.metrics or "")
            for n in cluster_config.partition_nodes
        ]
        records += [
            NodeRecord(k.node_id, "kafka-gateway", "", kafka=k.address, metrics=k.metrics or "")
            for k in cluster_config.kafka_listeners
        ]
        if network is not None:
            for record in records:
                record.netns = network.by_address(record.host).namespace
        candidate.replace(config_path)
        self.state = ClusterState(
            str(self.data_dir),
            str(config_path),
            cluster_config.shard_count,
            records,
            network,
            faults_dir,
            str(self.data_dir / TLS_DIR) if cluster_config.tls is not None else None,
        )
        if starting is not None:
            starting()
        try:
            for record in self.state.nodes:
                self._spawn(record)
            self._save()
            self.wait_for_leaders(timeout_s)
            if cluster_config.settings.auto_leader_rebalance_enable:
                self.elect_preferred_leaders(timeout_s)
            for record in self.partition_nodes() + self.kafka_gateways():
                self.wait_until(
                    lambda r=record: self._settled(r.node_id),
                    timeout_s,
                    f"{record.kind} node {record.node_id} did not answer",
                )
            if cluster_config.tls is not None:
                self._grant_client(timeout_s)
        except BaseException as exc:
            self.down(grace_s=3)  # stop what was started
            if isinstance(exc, ClusterError):
                raise ClusterError(f"{exc}; stopped the nodes started") from None
            raise
        return self.state

    def node_data(self) -> list[Path]:
        """The data directories and logs of nodes in the cluster directory,
        left by an earlier ``up``: what the next ``up`` starts its nodes on."""
        if not self.data_dir.is_dir():
            return []
        return sorted(p for p in self.data_dir.iterdir() if _NODE_FILE.fullmatch(p.name))

    def wipe(self, also: tuple[str, ...] = ()) -> list[Path]:
        """Remove :meth:`node_data` and the files and directories named
        ``also`` (a workload's history, an audit's report) from the cluster
        directory of a stopped cluster, so that the next ``up`` starts anew;
        what was removed.

        Raises:
            ClusterError: a node of the cluster runs, or the directory holds
                files but is not one ``up`` made (it has no cluster.json).
        """
        if self.state is not None and any(self.alive(n.node_id) for n in self.state.nodes):
            raise ClusterError(
                f"a cluster is running in {self.data_dir}; run `raftcoord cluster down` first"
            )
        if not self.data_dir.is_dir() or not any(self.data_dir.iterdir()):
            return []
        if self.state is None:
            raise ClusterError(
                f"{self.data_dir} has no {STATE_FILE}, so it is not a directory of "
                "`raftcoord cluster up`: nothing removed"
            )
        removed = self.node_data() + [
            self.data_dir / name for name in also if (self.data_dir / name).exists()
        ]
        for path in removed:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        return removed

    def _check_data_dir(self) -> None:
        """Create the data directory and check that files can be written there.

        Raises:
            ClusterError: it is a file, lies under a file, or is not writable.
        """
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.data_dir):
                pass
        except OSError as exc:
            raise ClusterError(
                f"cannot use {self.data_dir} as the data directory: {exc.strerror or exc}"
            ) from None

    def _remove_network(self) -> None:
        """Remove the namespaces of this cluster, whose nodes are all stopped."""
        if self.state is None or self.state.network is None:
            return
        try:
            namespaces.destroy(self.state.network)
        except namespaces.NetnsError as exc:
            raise ClusterError(str(exc)) from None
        self.state.network = None
        self._save()

    def coordinators(self) -> list[NodeRecord]:
        return [n for n in self._require().nodes if n.kind == "coordinator"]

    def partition_nodes(self) -> list[NodeRecord]:
        return [n for n in self._require().nodes if n.kind == "partition-log"]

    def kafka_gateways(self) -> list[NodeRecord]:
        return [n for n in self._require().nodes if n.kind == "kafka-gateway"]

    def kafka_bootstrap(self) -> str:
        """The Kafka gateways' addresses as Kafka's bootstrap.servers."""
        return ",".join(n.kafka for n in self.kafka_gateways())

    def kafka_client_config(
        self, name: str = TLS_CLIENT, sasl: tuple[str, str, str] | None = None
    ) -> dict[str, str]:
        """A Kafka client's connection settings (librdkafka's names) for the
        gateways' listeners: ``bootstrap.servers``, and for SSL the cluster's
        CA and the client certificate ``name``; for SASL_SSL the CA and
        ``sasl`` (mechanism, user, password)."""
        settings = {"bootstrap.servers": self.kafka_bootstrap()}
        protocol = self._kafka_security()
        if protocol in ("", "PLAINTEXT"):
            return settings
        files = self.client_tls(name)
        settings |= {"security.protocol": protocol, "ssl.ca.location": files["ssl_cafile"]}
        if protocol == "SSL":
            settings["ssl.certificate.location"] = files["ssl_certfile"]
            settings["ssl.key.location"] = files["ssl_keyfile"]
        elif sasl is not None:
            mechanism, user, password = sasl
            settings |= {
                "sasl.mechanism": mechanism,
                "sasl.username": user,
                "sasl.password": password,
            }
        return settings

    def bootstrap(self) -> list[str]:
        """The coordinators' gRPC addresses: what a client is given to start from."""
        return [n.grpc for n in self.coordinators()]

    def _spawn(self, record: NodeRecord) -> None:
        assert self.state is not None
        directory = self.node_dir(record.node_id)
        log_path = directory.with_name(directory.name + ".log")
        command = node_command(record.kind, self.state.config, record.node_id, str(directory))
        if record.netns:
            if not namespaces.exists(record.netns):
                raise ClusterError(
                    f"network namespace {record.netns} of node {record.node_id} is gone "
                    "(`cluster down` removes them); start the cluster with `cluster up --netns`"
                )
            command = namespaces.exec_prefix(record.netns) + command
        env = None
        if self.state.faults is not None:
            env = {**os.environ, **node_faults.environment(Path(self.state.faults))}
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        self._procs[record.node_id] = proc
        record.pid, record.log = proc.pid, str(log_path)

    def node_dir(self, node_id: int) -> Path:
        """The data directory of node ``node_id``."""
        record = self._require().node(node_id)
        return self.data_dir / f"{NODE_COMMANDS[record.kind]}-{node_id}"

    def _save(self) -> None:
        assert self.state is not None
        data = asdict(self.state)
        tmp = self.data_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self.data_dir / STATE_FILE)

    def _require(self) -> ClusterState:
        if self.state is None:
            raise ClusterError(f"no cluster in {self.data_dir} (run `raftcoord cluster up`)")
        return self.state

    def start(self, *node_ids: int, timeout_s: float = 15.0) -> None:
        """Start stopped nodes again, all at once, with the same data dirs and
        ports; return once every one answers."""
        records = [self._require().node(node_id) for node_id in node_ids]
        for record in records:
            if self.alive(record.node_id):
                raise ClusterError(
                    f"node {record.node_id} is running (pid {record.pid}); the end of "
                    f"{record.log}:\n" + _log_tail(record, 40)
                )
        for record in records:
            self._spawn(record)
        self._save()

        waiting = list(records)

        def answered() -> bool:
            for record in list(waiting):
                if not self.alive(record.node_id):
                    raise ClusterError(
                        f"node {record.node_id} exited while starting; the end of "
                        f"{record.log}:\n" + _log_tail(record, 5)
                    )
                if self.node_status(record.node_id) is not None:
                    waiting.remove(record)
            return not waiting

        names = ", ".join(map(str, node_ids))
        self.wait_until(answered, timeout_s, f"node(s) {names} did not answer")

    def kill(self, node_id: int, sig: str = "KILL") -> None:
        """Send ``sig`` (KILL, STOP, CONT or TERM) to one node."""
        record = self._require().node(node_id)
        if sig not in SIGNALS:
            raise ClusterError(f"unknown signal {sig!r}; use one of {sorted(SIGNALS)}")
        if record.pid <= 0:
            raise ClusterError(f"node {node_id} was never started")
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, SIGNALS[sig])
        if sig in ("KILL", "TERM"):
            self._reap(node_id, 10.0)

    def down(self, grace_s: float = 5.0) -> None:
        """SIGTERM every node, SIGKILL what is left after ``grace_s``, then
        remove the network namespaces (--netns)."""
        state = self._require()
        for record in state.nodes:
            if record.pid <= 0:  # never started (pid 0 would signal our own group)
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, signal.SIGCONT)
                os.kill(record.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for record in state.nodes:
            self._reap(record.node_id, max(0.0, deadline - time.monotonic()))
        for record in state.nodes:
            if record.pid > 0 and self.alive(record.node_id):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(record.pid, signal.SIGKILL)
                self._reap(record.node_id, 5.0)
        self._remove_network()

    def _reap(self, node_id: int, timeout_s: float) -> None:
        proc = self._procs.get(node_id)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout_s)
            return
        self.wait_until(lambda: not self.alive(node_id), timeout_s, "", raise_on_timeout=False)

    # --- inspection ----------------------------------------------------------------

    def _make_certs(self, config: ClusterConfig) -> None:
        """A new CA, certificates for every node of ``config`` and the clients."""
        nodes = {n.node_id: [certs.host_of(n.grpc)] for n in config.coordinators}
        nodes |= {n.node_id: [certs.host_of(n.grpc)] for n in config.partition_nodes}
        nodes |= {k.node_id: [certs.host_of(k.address)] for k in config.kafka_listeners}
        certs.make_cluster_certs(self.data_dir / TLS_DIR, nodes, TLS_CLIENTS)

    def _grant_client(self, timeout_s: float) -> None:
        """ACLs that let the ``client`` certificate do what a workload does:
        every operation on every topic, group and transactional id, and
        idempotent writes (remove them with ``raftcoord acl remove``)."""
        everything = [
            Acl(
                kind,
                PatternType.LITERAL,
                WILDCARD,
                f"User:{TLS_CLIENT}",
                WILDCARD,
                Operation.ALL,
                Permission.ALLOW,
            )
            for kind in (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID)
        ]
        everything.append(
            Acl(
                ResourceType.CLUSTER,
                PatternType.LITERAL,
                CLUSTER_NAME,
                f"User:{TLS_CLIENT}",
                WILDCARD,
                Operation.IDEMPOTENT_WRITE,
                Permission.ALLOW,
            )
        )
        with Admin(
            self.bootstrap(), request_timeout_ms=int(timeout_s * 1000), **self.client_tls(TLS_ADMIN)
        ) as admin:
            admin.create_acls(everything)
        # Each coordinator authorizes with its own replica of shard 0, which
        # learns the grants a moment after its leader: `up` returns once every
        # one of them enforces them, so that the client's first request is let in.
        wanted = frozenset(everything)
        for record in self.coordinators():
            self.wait_until(
                lambda record=record: wanted <= self._acls_of(record.grpc),
                timeout_s,
                f"coordinator {record.node_id} did not learn the client's ACLs",
            )

    def _acls_of(self, address: str) -> frozenset[Acl]:
        """The ACLs the coordinator at ``address`` holds in its own replica of
        shard 0 (empty when it does not answer)."""
        try:
            with self.channel(address) as channel:
                answer = coordinator_pb2_grpc.TransactionCoordinatorStub(channel).Metadata(
                    coordinator_pb2.MetadataRequest(topics=["-"], include_acls=True),
                    timeout=2.0,
                )
        except grpc.RpcError:
            return frozenset()
        return frozenset(acl_from_proto(a) for a in answer.acls)

    def client_tls(self, name: str = TLS_CLIENT) -> SslFiles:
        """The client library's TLS arguments (``ssl_cafile``, ``ssl_certfile``,
        ``ssl_keyfile``) for the client certificate ``name`` (``client``:
        allowed everything a workload does; ``admin``: a super user; another
        name: a certificate made now, with no rights until ACLs grant them);
        empty without ``--tls``.

        Raises:
            ClusterError: ``name`` is a node's (``node-<id>``) or not a file name.
        """
        refused = certs.client_name_refusal(name)
        if refused is not None:
            raise ClusterError(f"no client certificate {name!r}: {refused}")
        return self._tls_files(name, issue=True)

    def _tls_files(self, name: str, issue: bool) -> SslFiles:
        """The TLS files of certificate ``name`` (made now when ``issue`` and
        missing); empty without ``--tls``."""
        state = self._require()
        if state.tls is None:
            return {}
        directory = Path(state.tls)
        if issue and not (directory / f"{name}.pem").exists():
            certs.issue(certs.load_ca(directory), directory, name, name, [])
        return {
            "ssl_cafile": str(directory / certs.CA_CERT),
            "ssl_certfile": str(directory / f"{name}.pem"),
            "ssl_keyfile": str(directory / f"{name}.key"),
        }

    def channel(self, address: str, name: str = TLS_ADMIN) -> grpc.Channel:
        """A gRPC channel to ``address`` as the client certificate ``name``
        (the super user ``admin`` by default), or as a node with its own
        certificate (``node-<id>``: tests of what a node may do), with
        ``--tls``; else plaintext."""
        is_node = certs.is_node_name(name)
        files = self._tls_files(name, issue=False) if is_node else self.client_tls(name)
        if not files:
            return open_channel(address)
        identity = Identity.load(
            Path(files["ssl_cafile"]), Path(files["ssl_certfile"]), Path(files["ssl_keyfile"])
        )
        return open_channel(address, identity.channel_credentials())

    def fail_disk(self, node_id: int, failing: bool = True) -> None:
        """Make fsync and fdatasync of node ``node_id`` fail with EIO (or, with
        ``failing`` False, work again); the cluster must have been started
        with ``faults``."""
        directory, pid = self._faults_of(node_id)
        if failing:
            node_faults.fail_disk(directory, pid)
        else:
            node_faults.heal_disk(directory, pid)

    def shift_clock(self, node_id: int, shift_ms: int) -> None:
        """Step node ``node_id``'s wall clock to ``shift_ms`` ahead of the
        machine's (behind if negative; 0: back to the machine's); the
        cluster must have been started with ``faults``."""
        directory, pid = self._faults_of(node_id)
        node_faults.shift_clock(directory, pid, shift_ms)

    def _faults_of(self, node_id: int) -> tuple[Path, int]:
        state = self._require()
        if state.faults is None:
            raise ClusterError("the cluster was not started with --faults")
        return Path(state.faults), state.node(node_id).pid

    def alive(self, node_id: int) -> bool:
        """Whether the node's process exists (a stopped process counts as alive)."""
        proc = self._procs.get(node_id)
        if proc is not None:
            return proc.poll() is None
        record = self._require().node(node_id)
        if record.pid <= 0:
            return False
        try:
            stat = Path(f"/proc/{record.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"

    def node_status(self, node_id: int, timeout_s: float = 1.0) -> Any | None:
        """A coordinator's NodeStatus (a partition-log node's
        PartitionNodeStatus; a Kafka gateway: True once it accepts
        connections), or None when the node does not answer."""
        record = self._require().node(node_id)
        if record.kind == "kafka-gateway":
            return True if self._gateway_answers(record, timeout_s) else None
        with self.channel(record.grpc) as channel:
            try:
                if record.kind == "partition-log":
                    return partition_log_pb2_grpc.PartitionLogStub(channel).PartitionNodeStatus(
                        partition_log_pb2.PartitionNodeStatusRequest(), timeout=timeout_s
                    )
                return admin_pb2_grpc.CoordinatorAdminStub(channel).NodeStatus(
                    admin_pb2.NodeStatusRequest(), timeout=timeout_s
                )
            except grpc.RpcError:
                return None

    def _gateway_answers(self, record: NodeRecord, timeout_s: float) -> bool:
        """Whether a Kafka gateway answers an ApiVersions request in time (a
        stopped one still accepts connections: the kernel does), over TLS
        with the admin certificate on a TLS listener."""
        host, port = record.kafka.rsplit(":", 1)
        files = self.client_tls(TLS_ADMIN)
        try:
            with contextlib.ExitStack() as closing:
                sock = closing.enter_context(
                    socket.create_connection((host, int(port)), timeout=timeout_s)
                )
                if files and self._kafka_security() != "PLAINTEXT":
                    context = ssl.create_default_context(cafile=files["ssl_cafile"])
                    context.load_cert_chain(files["ssl_certfile"], files["ssl_keyfile"])
                    sock = closing.enter_context(context.wrap_socket(sock, server_hostname=host))
                sock.sendall(_API_VERSIONS_PROBE)
                answer = b""
                while len(answer) < 8:
                    chunk = sock.recv(8 - len(answer))
                    if not chunk:
                        return False
                    answer += chunk
        except (OSError, ssl.SSLError):
            return False
        return answer[4:8] == _PROBE_CORRELATION.to_bytes(4, "big")

    def _kafka_security(self) -> str:
        """The gateways' security_protocol ("" without gateways)."""
        config = load_config(self._require().config)
        return config.kafka_listeners[0].security_protocol if config.kafka_listeners else ""

    def _settled(self, node_id: int) -> bool:
        """Whether the node answers, a partition-log node once the coordinators
        told it whether its data directory is the one on record."""
        status = self.node_status(node_id)
        registering = getattr(status, "directory_state", "") == "registering"
        return status is not None and not registering

    def leaders(self) -> dict[int, int]:
        """shard -> node id of the ready leader, for shards with one."""
        return _leaders(self._coordinator_statuses())

    def _coordinator_statuses(self) -> dict[int, Any | None]:
        """Each coordinator's NodeStatus (None: it did not answer in 0.5 s)."""
        return {
            record.node_id: self.node_status(record.node_id, timeout_s=0.5)
            for record in self.coordinators()
        }

    def preferred_leaders(self) -> dict[int, int]:
        """shard -> node id of the coordinator the shard prefers as its
        leader (auto.leader.rebalance.enable; see
        :func:`raftcoord.protocol.routing.preferred_leader`)."""
        coordinators = self.coordinators()
        return {
            shard: coordinators[preferred_leader(shard, len(coordinators))].node_id
            for shard in range(self._require().shard_count)
        }

    def elect_preferred_leaders(self, timeout_s: float = 30.0) -> dict[int, int]:
        """Kafka's preferred leader election: ask every coordinator to hand
        the shards it leads to their preferred coordinators now (asked again
        while it has not happened: a leadership that is not ready yet, a
        follower that is behind), and wait until each shard is led so. When
        that does not happen in time, the error says what each coordinator
        last answered about the shards that are not."""
        preferred = self.preferred_leaders()
        seen: dict[int, Any | None] = {}

        def elected() -> bool:
            seen.clear()
            seen.update(self._coordinator_statuses())
            if _leaders(seen) == preferred:
                return True
            for record in self.coordinators():
                with self.channel(record.grpc) as channel, contextlib.suppress(grpc.RpcError):
                    admin_pb2_grpc.CoordinatorAdminStub(channel).ElectLeaders(
                        admin_pb2.ElectLeadersRequest(), timeout=1.0
                    )
            return False

        if not self.wait_until(elected, timeout_s, "", raise_on_timeout=False):
            raise ClusterError(
                "the shards' leaders did not move to their preferred coordinators within "
                f"{timeout_s:.0f} s ({_leadership_view(preferred, seen)})"
            )
        return preferred

    def wait_for_leaders(self, timeout_s: float = 30.0) -> dict[int, int]:
        """Wait until every shard has a ready leader."""
        state = self._require()
        result: dict[int, int] = {}

        def all_led() -> bool:
            result.clear()
            result.update(self.leaders())
            return len(result) == state.shard_count

        self.wait_until(all_led, timeout_s, "not every shard elected a leader")
        return result

    @staticmethod
    def wait_until(
        condition: Any, timeout_s: float, message: str, raise_on_timeout: bool = True
    ) -> bool:
        deadline = time.monotonic() + timeout_s
        delay = 0.02
        while True:
            if condition():
                return True
            if time.monotonic() >= deadline:
                if raise_on_timeout:
                    raise ClusterError(f"{message} within {timeout_s:.0f} s")
                return False
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def status(self) -> list[dict[str, Any]]:
        """Each node as ``cluster status`` shows it: ``node``, ``kind``,
        ``address``, ``metrics`` (its metrics endpoint, "" for none), ``pid``,
        ``alive`` (its process), ``answers`` (it
        answered within half a second: a coordinator's NodeStatus, a
        partition node's status, a gateway's ApiVersions), and per kind
        ``shards`` (a coordinator's role, term and applied index per shard)
        or ``serving`` (what the others serve)."""
        state = self._require()
        nodes = []
        for record in state.nodes:
            alive = self.alive(record.node_id)
            status = self.node_status(record.node_id, 0.5) if alive else None
            node: dict[str, Any] = {
                "node": record.node_id,
                "kind": record.kind,
                "address": record.address,
                "metrics": record.metrics,
                "pid": record.pid,
                "alive": alive,
                "answers": status is not None,
            }
            if record.kind == "coordinator":
                node["shards"] = [
                    {
                        "shard": shard.shard,
                        "role": "leader" if shard.is_leader else "follower",
                        "term": shard.term,
                        "applied_index": shard.applied_index,
                    }
                    for shard in (status.shards if status is not None else ())
                ]
            else:
                node["serving"] = None if status is None else _serving(status)
            nodes.append(node)
        return nodes

    def status_table(self, nodes: list[dict[str, Any]] | None = None) -> str:
        """A readable table of :meth:`status`: node, addresses, pid, alive, then
        role@term per shard (or what a partition node or gateway serves)."""
        state = self._require()
        nodes = self.status() if nodes is None else nodes
        header = ["node", "address", "metrics", "pid", "alive"] + [
            f"shard {s}" for s in range(state.shard_count)
        ]
        rows = []
        for node in nodes:
            alive = node["alive"]
            cells = [
                str(node["node"]),
                node["address"],
                node["metrics"] or "-",
                str(node["pid"]),
                "yes" if alive else "no",
            ]
            if node["kind"] != "coordinator":
                answer = node["serving"] or "no answer"
                cells += [f"{node['kind']}, {answer}" if alive else "-"]
                cells += [""] * (state.shard_count - 1)
            elif not node["answers"]:
                cells += ["no answer" if alive else "-"] * state.shard_count
            else:
                cells += [f"{s['role']} t{s['term']} @{s['applied_index']}" for s in node["shards"]]
            rows.append(cells)
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in [header, *rows]
        ]
        return "\n".join(lines)

    def unhealthy(self, nodes: list[dict[str, Any]]) -> str | None:
        """Why the cluster of :meth:`status` (``nodes``) is not healthy, in
        one line: the nodes that do not answer (and which of them are not
        running), the shards without a leader; None when every node answers
        and every shard has a leader."""
        said = []
        silent = [n for n in nodes if not n["answers"]]
        if silent:
            stopped = [str(n["node"]) for n in silent if not n["alive"]]
            said.append(
                "nodes not answering: "
                + ", ".join(str(n["node"]) for n in silent)
                + (f" (not running: {', '.join(stopped)})" if stopped else "")
            )
        led = {s["shard"] for n in nodes for s in n.get("shards", ()) if s["role"] == "leader"}
        leaderless = sorted(set(range(self._require().shard_count)) - led)
        if leaderless:
            said.append("shards without a leader: " + ", ".join(map(str, leaderless)))
        return "; ".join(said) or None


#: An ApiVersions v0 request (api key 18, version 0, correlation id, client
#: id "status"), size-prefixed: what a Kafka client first sends.
_PROBE_CORRELATION = 0x5A5A
_API_VERSIONS_PROBE = struct.pack(">ihhih", 16, 18, 0, _PROBE_CORRELATION, 6) + b"status"


def _serving(status: Any) -> str:
    """What a node that answered serves: a gateway all; a partition-log node
    nothing while its data directory is not the one on record, else all but
    the partitions it refuses."""
    if status is True:
        return "serving"
    if status.directory_state == "replaced":
        return f"REFUSING ALL: directory {status.directory_id} not on record (accept-directory)"
    if status.directory_state == "registering":
        return "registering its directory"
    if status.refused:
        names = ", ".join(f"{r.topic}-{r.partition}" for r in status.refused[:3])
        return f"serving; REFUSING {len(status.refused)} damaged: {names}"
    return "serving"


def _log_tail(record: NodeRecord, lines: int) -> str:
    """The last ``lines`` lines of ``record``'s log, for an error message."""
    try:
        return "\n".join(Path(record.log).read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(unreadable: {exc})"


def _leaders(statuses: Mapping[int, Any | None]) -> dict[int, int]:
    """shard -> node id of the coordinator that says it leads the shard, from
    the coordinators' NodeStatus answers (node id -> answer or None); of two
    that say so, the one in the later term (the other has not heard of it yet)."""
    found: dict[int, tuple[int, int]] = {}
    for node_id, status in statuses.items():
        for shard in () if status is None else status.shards:
            if shard.is_leader and shard.term >= found.get(shard.shard, (-1, 0))[0]:
                found[shard.shard] = (shard.term, node_id)
    return {shard: node_id for shard, (_term, node_id) in found.items()}


def _leadership_view(preferred: Mapping[int, int], statuses: Mapping[int, Any | None]) -> str:
    """What the coordinators last said of the shards not led by their
    preferred coordinator: each one's role and term, and who did not answer."""
    leaders = _leaders(statuses)
    parts = []
    for shard, node_id in sorted(preferred.items()):
        if leaders.get(shard) == node_id:
            continue
        roles = []
        for member, status in sorted(statuses.items()):
            if status is None:
                continue
            for replica in status.shards:
                if replica.shard == shard:
                    leads = replica.is_leader
                    role = "leader" if leads else f"follower of {replica.leader_node_id}"
                    roles.append(f"{member} {role} in term {replica.term}")
        parts.append(f"shard {shard}, preferred {node_id}: " + (", ".join(roles) or "no answer"))
    silent = [str(n) for n, status in sorted(statuses.items()) if status is None]
    if silent:
        parts.append("no answer from coordinator " + ", ".join(silent))
    return "; ".join(parts)
