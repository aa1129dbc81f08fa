"""Network namespaces for a local cluster: every host its own namespace, and
real network partitions between them.

``raftcoord cluster up --netns`` puts each node in a network namespace of
its own (``--config FILE --netns``: each host the config names), with its
own address on a Linux bridge in the root namespace. Clients in the root
namespace reach every node through the bridge; nodes reach each other the
same way, so traffic between two nodes can be cut without touching the
root namespace's view::

    root namespace      rcbrK 10.201.K.254/24 (bridge)
                         |            |            |
                       rcK-1        rcK-2        rcK-3        (veth, host side)
    namespace       eth0 10.201.K.1  10.201.K.2  10.201.K.3   raftcoord-K-<host>

``K`` is the first /24 of 10.201.0.0/16 that no bridge of another cluster
and no address or route of the root namespace uses, chosen under a lock
file, so clusters (and concurrent test runs) never share names or
addresses. Nothing outside the bridge, the veth pairs and the namespaces
this module creates is touched.

A cut is a policy-routing rule inside the receiving namespace that drops
packets from the peer's address arriving on ``eth0``::

    ip -n raftcoord-K-<a> rule add pref 100 from 10.201.K.<b> iif eth0 blackhole

added on both sides, so packets between the two are sent and silently lost
in both directions, as on a real partitioned network: new connections time
out and established ones stop delivering. ARP requests are answered only
along a route, so the two stop resolving each other's address too. The root
namespace's address is never cut. The kernel looks up the ``local`` table at
rule priority 0, which would deliver the packet before any other rule is
consulted, so each namespace moves that lookup to priority 1000, after the
cuts. Healing removes the cuts and the neighbour entries that failed during
them::

    ip -n raftcoord-K-<a> rule flush pref 100
    ip -n raftcoord-K-<a> neigh flush dev eth0

Only ``iproute2`` is needed (no nftables or iptables); ``tc netem`` is not used.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import ipaddress
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

#: Each cluster takes one /24 of this range: 10.201.K.0/24.
SUPERNET = ipaddress.IPv4Network("10.201.0.0/16")
#: The bridge's (root namespace's) host number in every cluster's /24.
BRIDGE_HOST = 254
#: The interface name of a node's end of its veth pair, inside its namespace.
INTERFACE = "eth0"
#: Priority of the rules that cut traffic; the ``local`` table lookup moves
#: behind them to LOCAL_PRIORITY.
CUT_PRIORITY = 100
LOCAL_PRIORITY = 1000
#: Serializes the choice of K between launchers (``ip netns`` needs /run too).
LOCK_FILE = Path("/run/raftcoord-netns.lock")
_LABEL = re.compile(r"[A-Za-z0-9_.-]+")


class NetnsError(Exception):
    """A namespace operation failed or was asked something impossible."""


@dataclass
class Host:
    """One namespace: the host it stands for, and its address on the bridge."""

    label: str
    namespace: str
    address: str
    veth: str  # the root namespace's end of the veth pair


@dataclass
class Network:
    """A cluster's bridge and namespaces, as recorded in ``cluster.json``."""

    subnet: str
    bridge: str
    hosts: list[Host] = field(default_factory=list)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Network:
        return cls(raw["subnet"], raw["bridge"], [Host(**h) for h in raw["hosts"]])

    def host(self, label: str) -> Host:
        for host in self.hosts:
            if host.label == label:
                return host
        known = [h.label for h in self.hosts]
        raise NetnsError(f"no host {label!r} in {self.bridge} (hosts: {known})")

    def by_address(self, address: str) -> Host:
        for host in self.hosts:
            if host.address == address:
                return host
        raise NetnsError(f"no namespace of {self.bridge} has address {address}")

    def cut(self, groups: Sequence[Sequence[str]]) -> None:
        """Replace every cut by this one: hosts (labels) in different groups
        exchange no packets; hosts in no group and the root namespace keep
        reaching everyone."""
        seen: dict[str, int] = {}
        for index, group in enumerate(groups):
            for label in group:
                self.host(label)
                if seen.setdefault(label, index) != index:
                    raise NetnsError(f"host {label!r} is in two groups")
        self.heal()
        for host in self.hosts:
            mine = seen.get(host.label)
            if mine is None:
                continue
            peers = [self.host(label) for label, group in seen.items() if group != mine]
            commands = [
                f"rule add pref {CUT_PRIORITY} from {peer.address} iif {INTERFACE} blackhole"
                for peer in peers
            ]
            if commands:
                _ip_batch(commands, namespace=host.namespace)

    def heal(self) -> None:
        """Remove every cut, and forget the neighbours that stopped answering
        ARP during it (else the first packets after the heal fail with
        EHOSTUNREACH until the failed entries expire)."""
        for host in self.hosts:
            _ip_batch(
                [f"rule flush pref {CUT_PRIORITY}", f"neigh flush dev {INTERFACE}"],
                namespace=host.namespace,
            )


@functools.cache
def unavailable() -> str | None:
    """None when namespaces, veth pairs and cuts work here, else why not
    (probed once per process: two namespaces are made, cut, healed and removed)."""
    if os.geteuid() != 0:
        return "not root (network namespaces need root)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    try:
        network = create(["probe-a", "probe-b"])
        try:
            network.cut([["probe-a"], ["probe-b"]])
            network.heal()
        finally:
            destroy(network)
    except (NetnsError, OSError) as exc:
        return str(exc)
    return None


class NodeHost(Protocol):
    """A node of a cluster's record, as the network sees it."""

    @property
    def node_id(self) -> int: ...

    @property
    def host(self) -> str: ...


class NetworkRecord(Protocol):
    """What a cluster's record holds of its nodes and namespaces."""

    @property
    def nodes(self) -> Sequence[NodeHost]: ...

    @property
    def network(self) -> Network | None: ...


class NamespaceCluster(Protocol):
    """What cutting and healing a cluster's network needs of it (a
    :class:`~raftcoord.cluster.launcher.LocalCluster` is one)."""

    @property
    def data_dir(self) -> Path: ...

    @property
    def state(self) -> NetworkRecord | None: ...


def enabled(cluster: NamespaceCluster) -> bool:
    """Whether ``cluster`` runs its nodes in namespaces of their own."""
    return cluster.state is not None and cluster.state.network is not None


def partition(cluster: NamespaceCluster, groups: list[list[int]]) -> None:
    """Cut the network so that nodes (ids) in different groups can no longer
    exchange packets, replacing any earlier cut; nodes in no group keep
    talking to everyone, and the root namespace (clients) reaches every node.

    Raises:
        NetnsError: not a namespace cluster, an unknown node, a node in two
            groups, two nodes of one namespace in different groups, or a
            failing ``ip`` command.
    """
    network = _network(cluster)
    state = cluster.state
    assert state is not None
    host_groups: list[list[str]] = []
    placed: dict[str, tuple[int, int]] = {}  # host -> (group index, a node of it)
    listed: set[int] = set()
    for index, group in enumerate(groups):
        labels = []
        for node_id in group:
            record = next((n for n in state.nodes if n.node_id == node_id), None)
            if record is None:
                known = [n.node_id for n in state.nodes]
                raise NetnsError(f"no node {node_id} in the cluster (nodes: {known})")
            if node_id in listed:
                raise NetnsError(f"node {node_id} is in two groups")
            listed.add(node_id)
            label = network.by_address(record.host).label
            other_index, other = placed.setdefault(label, (index, node_id))
            if other_index != index:
                raise NetnsError(
                    f"nodes {other} and {node_id} share host {label!r}: "
                    "they cannot be in different groups"
                )
            if label not in labels:
                labels.append(label)
        host_groups.append(labels)
    network.cut(host_groups)


def heal(cluster: NamespaceCluster) -> None:
    """Remove every cut of ``cluster``'s network."""
    _network(cluster).heal()


def _network(cluster: NamespaceCluster) -> Network:
    if cluster.state is None or cluster.state.network is None:
        raise NetnsError(
            f"the cluster in {cluster.data_dir} does not run in network namespaces "
            "(start it with `raftcoord cluster up --netns`)"
        )
    return cluster.state.network


def exec_prefix(namespace: str) -> list[str]:
    """The command prefix that runs a program inside ``namespace``."""
    return ["ip", "netns", "exec", namespace]


def exists(namespace: str) -> bool:
    return (Path("/run/netns") / namespace).exists()


def create(labels: Sequence[str]) -> Network:
    """A new bridge with one namespace per host label, each with its own
    address; removed again when anything fails.

    Raises:
        NetnsError: a label is not a plain name, or an ``ip`` command failed.
    """
    for label in labels:
        if not _LABEL.fullmatch(label):
            raise NetnsError(f"host {label!r} is not a plain name (letters, digits, '_.-')")
    if len(set(labels)) != len(labels) or not 1 <= len(labels) < BRIDGE_HOST:
        raise NetnsError(f"need 1..{BRIDGE_HOST - 1} distinct hosts, got {list(labels)}")
    with _locked():
        index = _free_subnet()
        subnet = list(SUPERNET.subnets(new_prefix=24))[index]
        network = Network(
            str(subnet),
            f"rcbr{index}",
            [
                Host(label, f"raftcoord-{index}-{label}", str(subnet[i]), f"rc{index}-{i}")
                for i, label in enumerate(labels, start=1)
            ],
        )
        try:
            root = [
                f"link add {network.bridge} type bridge",
                f"addr add {subnet[BRIDGE_HOST]}/24 dev {network.bridge}",
                f"link set {network.bridge} up",
            ]
            for host in network.hosts:
                root += [
                    f"netns add {host.namespace}",
                    f"link add {host.veth} type veth peer name {INTERFACE} netns {host.namespace}",
                    f"link set {host.veth} master {network.bridge} up",
                ]
            _ip_batch(root)
            for host in network.hosts:
                _ip_batch(
                    [
                        f"addr add {host.address}/24 dev {INTERFACE}",
                        f"link set {INTERFACE} up",
                        "link set lo up",
                        f"rule add pref {LOCAL_PRIORITY} lookup local",
                        "rule del pref 0",
                    ],
                    namespace=host.namespace,
                )
        except NetnsError:
            _destroy(network)
            raise
    return network


def destroy(network: Network) -> None:
    """Remove the namespaces, veth pairs and bridge of ``network`` (whatever
    of them exists). Processes still running in a namespace keep it alive,
    unreachable, until they exit: stop them first.

    Under the lock :func:`create` takes: once the names are gone another
    process may pick the same subnet and names, and what it creates must not
    be taken for something of this network left behind.

    Raises:
        NetnsError: something of ``network`` is still there afterwards.
    """
    with _locked():
        _destroy(network)


def _destroy(network: Network) -> None:
    """:func:`destroy`, the lock held."""
    commands = []
    for host in network.hosts:
        commands += [f"link del {host.veth}", f"netns del {host.namespace}"]
    commands.append(f"link del {network.bridge}")
    subprocess.run(
        ["ip", "-force", "-batch", "-"],
        input="\n".join(commands) + "\n",
        capture_output=True,
        text=True,
        check=False,
    )
    left = [h.namespace for h in network.hosts if exists(h.namespace)]
    left += [name for name in [network.bridge] + [h.veth for h in network.hosts] if _link(name)]
    if left:
        raise NetnsError(f"could not remove {left}")


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    with LOCK_FILE.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _free_subnet() -> int:
    """The first K whose bridge and namespace names and 10.201.K.0/24 nobody
    uses (a cluster that was never stopped keeps its K)."""
    used: list[ipaddress.IPv4Network] = []
    for kind in ("addr", "route"):
        for entry in json.loads(_ip("-j", "-4", kind, "show") or "[]"):
            for item in entry.get("addr_info", [entry]):
                prefix = item.get("local") or item.get("dst")
                if prefix and prefix != "default":
                    length = item.get("prefixlen")
                    text = f"{prefix}/{length}" if length is not None else prefix
                    used.append(ipaddress.IPv4Network(text, strict=False))
    for index, subnet in enumerate(SUPERNET.subnets(new_prefix=24)):
        if (
            not _link(f"rcbr{index}")
            and not any(Path("/run/netns").glob(f"raftcoord-{index}-*"))
            and not any(subnet.overlaps(u) for u in used)
        ):
            return index
    raise NetnsError(f"every /24 of {SUPERNET} is in use")


def _link(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _ip(*args: str) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def _ip_batch(commands: list[str], namespace: str | None = None) -> None:
    where = ["-n", namespace] if namespace else []
    result = subprocess.run(
        ["ip", *where, "-batch", "-"],
        input="\n".join(commands) + "\n",
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        inside = f" in {namespace}" if namespace else ""
        raise NetnsError(f"ip -batch{inside} failed: {result.stderr.strip()}")
