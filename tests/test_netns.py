"""Network namespaces: a cut really drops packets between namespaces while the
root namespace reaches every one, heal restores it, and a cluster runs,
fails over and stops in namespaces (raftcoord.cluster.netns, cluster up --netns)."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftcoord.cli.main import main
from raftcoord.client import Admin, Producer
from raftcoord.cluster import netns
from raftcoord.cluster.launcher import ClusterError, ClusterState, LocalCluster, NodeRecord
from raftcoord.protocol.errors import ErrorCode
from tests import plog_client
from tests.local_cluster import running_cluster

ROOT = Path(__file__).resolve().parents[1]
needs_netns = pytest.mark.skipif(
    netns.unavailable() is not None,
    reason=f"network namespaces cannot be created here: {netns.unavailable()}",
)
PORT = 9000
ECHO_SERVER = """
import socket, sys, threading
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
def echo(conn):
    while data := conn.recv(100):
        conn.sendall(data)
while True:
    threading.Thread(target=echo, args=(server.accept()[0],), daemon=True).start()
"""
#: Connects to argv[1]:argv[2] within argv[3] seconds; prints "ok", or the
#: error's errno name ("TimeoutError" when it timed out).
CONNECT = """
import errno, socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("ok")
except OSError as exc:
    print(errno.errorcode.get(exc.errno or 0, type(exc).__name__))
"""
#: One connection to argv[1]:PORT; each stdin line "SECONDS TEXT" sends TEXT (if
#: any) and prints what comes back within SECONDS, or "timeout".
CHATTER = """
import socket, sys
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
for line in sys.stdin:
    seconds, _, text = line.strip().partition(" ")
    conn.sendall(text.encode())
    conn.settimeout(float(seconds))
    try:
        print(conn.recv(100).decode(), flush=True)
    except TimeoutError:
        print("timeout", flush=True)
"""


def raftcoord(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftcoord.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_in(namespace: str | None, code: str, *args: str) -> str:
    prefix = netns.exec_prefix(namespace) if namespace else []
    result = subprocess.run(
        [*prefix, sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout.strip()


#: What a connect across a cut sees: no answer at all, so it times out (or,
#: once the neighbour stopped answering ARP, the host is unreachable); never
#: a refusal or a reset.
UNANSWERED = {"TimeoutError", "EHOSTUNREACH"}


def connect(namespace: str | None, address: str, timeout_s: float) -> str:
    return run_in(namespace, CONNECT, address, str(PORT), str(timeout_s))


@pytest.fixture
def network() -> Iterator[netns.Network]:
    """Three namespaces a, b, c, each running an echo server; all removed
    even when the test fails."""
    network = netns.create(["a", "b", "c"])
    servers = []
    try:
        for host in network.hosts:
            servers.append(
                subprocess.Popen(
                    [
                        *netns.exec_prefix(host.namespace),
                        sys.executable,
                        "-c",
                        ECHO_SERVER,
                        host.address,
                        str(PORT),
                    ]
                )
            )
        for host in network.hosts:
            LocalCluster.wait_until(
                lambda h=host: connect(None, h.address, 5) == "ok", 30, f"{host.label} listening"
            )
        yield network
    finally:
        for server in servers:
            server.kill()
            server.wait(10)
        netns.destroy(network)
        assert not any(netns.exists(h.namespace) for h in network.hosts)
        assert not Path("/sys/class/net", network.bridge).exists()


@pytest.mark.slow
@needs_netns
def test_a_cut_drops_packets_between_groups_and_heal_restores_them(
    network: netns.Network,
) -> None:
    a, b, c = network.hosts
    with subprocess.Popen(
        [*netns.exec_prefix(a.namespace), sys.executable, "-c", CHATTER, b.address, str(PORT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as chatter:
        assert chatter.stdin is not None and chatter.stdout is not None
        stdin, stdout = chatter.stdin, chatter.stdout

        def say(seconds: float, text: str = "") -> str:
            stdin.write(f"{seconds} {text}\n")
            stdin.flush()
            return stdout.readline().strip()

        try:
            assert say(10, "before") == "before"  # an established connection a -> b
            assert connect(a.namespace, b.address, 10) == "ok"

            network.cut([[a.label], [b.label, c.label]])
            # Packets between a and the others are lost silently, both ways: a
            # new connection gets no answer, an established one delivers nothing.
            assert connect(a.namespace, b.address, 1) in UNANSWERED
            assert connect(c.namespace, a.address, 1) in UNANSWERED
            assert say(1, "during") == "timeout"
            # Within a group and from the root namespace, everything still flows.
            assert connect(b.namespace, c.address, 10) == "ok"
            for host in network.hosts:
                assert connect(None, host.address, 10) == "ok"

            network.heal()
            assert connect(a.namespace, b.address, 10) == "ok"
            assert connect(c.namespace, a.address, 10) == "ok"
            # TCP retransmits what the cut dropped: the echo arrives after all.
            assert say(60) == "during"
        finally:
            chatter.kill()


@pytest.mark.slow
@needs_netns
def test_a_new_cut_replaces_the_last_and_hosts_in_no_group_reach_everyone(
    network: netns.Network,
) -> None:
    a, b, c = network.hosts
    network.cut([[a.label], [b.label]])
    assert connect(a.namespace, b.address, 1) in UNANSWERED
    assert connect(c.namespace, a.address, 10) == "ok"  # c is in no group
    assert connect(c.namespace, b.address, 10) == "ok"
    network.cut([[b.label], [c.label]])
    assert connect(a.namespace, b.address, 10) == "ok"  # the earlier cut is gone
    assert connect(b.namespace, c.address, 1) in UNANSWERED
    with pytest.raises(netns.NetnsError, match="'a' is in two groups"):
        network.cut([[a.label], [a.label, b.label]])


@pytest.mark.slow
@needs_netns
def test_two_networks_never_share_names_or_addresses(network: netns.Network) -> None:
    other = netns.create(["a", "b", "c"])
    try:
        assert other.subnet != network.subnet and other.bridge != network.bridge
        mine = {h.namespace for h in network.hosts} | {h.veth for h in network.hosts}
        assert not mine & ({h.namespace for h in other.hosts} | {h.veth for h in other.hosts})
        for net in (network, other):
            assert all(
                ipaddress.ip_address(h.address) in ipaddress.ip_network(net.subnet)
                for h in net.hosts
            )
        # Both answer from the root namespace at the same time.
        assert connect(None, network.hosts[0].address, 10) == "ok"
    finally:
        netns.destroy(other)


@pytest.mark.slow
@needs_netns
def test_a_number_whose_namespaces_were_left_behind_is_not_reused(
    network: netns.Network,
) -> None:
    """A cluster killed without `cluster down` keeps its namespaces; the next
    network takes another number rather than failing on their names."""
    number = int(network.bridge.removeprefix("rcbr")) + 1
    leaked = f"raftcoord-{number}-node-1"
    subprocess.run(["ip", "netns", "add", leaked], check=True)
    try:
        other = netns.create(["node-1"])
        netns.destroy(other)
        assert other.bridge != f"rcbr{number}" and other.hosts[0].namespace != leaked
    finally:
        subprocess.run(["ip", "netns", "del", leaked], check=True)


@pytest.mark.slow
@needs_netns
def test_removal_is_checked_before_another_process_may_take_the_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once a network's names are gone, another process may create a network
    of the same number and names; destroy checks what is left under the lock
    that creation takes, so that one is not taken for this one's remains."""
    held: list[bool] = []
    exists = netns.exists

    def lock_held(namespace: str) -> bool:
        with netns.LOCK_FILE.open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(True)
            else:
                fcntl.flock(lock, fcntl.LOCK_UN)
                held.append(False)
        return exists(namespace)

    network = netns.create(["lock-a", "lock-b"])
    monkeypatch.setattr(netns, "exists", lock_held)
    netns.destroy(network)
    assert held == [True, True]
    assert not any(exists(h.namespace) for h in network.hosts)


@pytest.mark.slow
@needs_netns
def test_a_cluster_in_namespaces_fails_over_across_a_partition(tmp_path: Path) -> None:
    """`cluster up --netns`: every node in its own namespace, reached from the
    root namespace; `cluster partition` isolating a shard's leader from the
    majority elects another, `cluster heal` lets it rejoin; kill, start and
    status work; down removes the namespaces."""
    data = str(tmp_path / "c")
    try:
        up = raftcoord(
            "cluster",
            "up",
            "--netns",
            "--shards",
            "2",
            "--partition-nodes",
            "2",
            "--cluster-dir",
            data,
        )
        assert up.returncode == 0, up.stderr
        cluster = LocalCluster(data)
        assert netns.enabled(cluster)
        state = json.loads((Path(data) / "cluster.json").read_text())
        network = netns.Network.from_dict(state["network"])
        namespaces = [n["netns"] for n in state["nodes"]]
        assert len(set(namespaces)) == 5 and all(netns.exists(ns) for ns in namespaces)
        for node in state["nodes"]:  # each node runs in the namespace that has its address
            assert network.by_address(node["grpc"].split(":")[0]).namespace == node["netns"]
            inside = os.stat(f"/proc/{node['pid']}/ns/net").st_ino
            assert inside == os.stat(f"/run/netns/{node['netns']}").st_ino

        old = cluster.wait_for_leaders()[0]
        others = ",".join(str(n["node_id"]) for n in state["nodes"] if n["node_id"] != old)
        cut = raftcoord("cluster", "partition", str(old), others, "--cluster-dir", data)
        assert cut.returncode == 0, cut.stderr

        def new_leader() -> bool:
            leader = cluster.leaders().get(0)
            return leader is not None and leader != old

        cluster.wait_until(new_leader, 60, "the majority elected no new leader of shard 0")
        healed = raftcoord("cluster", "heal", "--cluster-dir", data)
        assert healed.returncode == 0, healed.stderr

        def converged() -> bool:
            """Every coordinator answers, on one term with one leader of shard 0."""
            answers = [cluster.node_status(n.node_id) for n in cluster.coordinators()]
            views = [a.shards[0] for a in answers if a is not None]
            return (
                len(views) == 3
                and len({v.term for v in views}) == 1
                and sum(v.is_leader for v in views) == 1
            )

        cluster.wait_until(converged, 60, "shard 0 did not converge after the heal")

        assert raftcoord("cluster", "kill", "2", "--cluster-dir", data).returncode == 0
        assert not cluster.alive(2)
        started = raftcoord("cluster", "start", "2", "--cluster-dir", data)
        assert started.returncode == 0, started.stderr
        status = raftcoord("cluster", "status", "--cluster-dir", data)
        table = status.stdout.split("\n\n")[0]  # the partitions' summary follows
        nodes = [line for line in table.splitlines()[1:] if line.strip()]
        assert len(nodes) == 5 and all(" 10.201." in line for line in nodes), status.stdout
        assert " no " not in status.stdout
    finally:
        down = raftcoord("cluster", "down", "--cluster-dir", data)
    assert down.returncode == 0, down.stderr
    assert not netns.enabled(LocalCluster(data))
    assert not any(netns.exists(ns) for ns in namespaces)
    assert not Path("/sys/class/net", network.bridge).exists()
    start = raftcoord("cluster", "start", "1", "--cluster-dir", data)
    assert start.returncode == 1 and "namespace raftcoord-" in start.stderr
    assert "is gone" in start.stderr and "Traceback" not in start.stderr


def test_where_namespaces_cannot_be_made_netns_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    netns.unavailable.cache_clear()
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    try:
        assert netns.unavailable() == "not root (network namespaces need root)"
        assert main(["cluster", "up", "--netns", "--cluster-dir", str(tmp_path / "c")]) == 1
    finally:
        netns.unavailable.cache_clear()
    err = capsys.readouterr().err
    assert "--netns: network namespaces cannot be created here: not root" in err
    assert "Traceback" not in err
    assert not (tmp_path / "c" / "cluster.json").exists()  # nothing was started


def test_partition_of_a_cluster_outside_namespaces_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = LocalCluster(tmp_path)
    cluster.state = ClusterState(
        str(tmp_path), "", 1, [NodeRecord(1, "coordinator", "127.0.0.1:1")]
    )
    assert not netns.enabled(cluster)
    with pytest.raises(netns.NetnsError, match="does not run in network namespaces"):
        netns.partition(cluster, [[1]])
    cluster._save()
    assert main(["cluster", "heal", "--cluster-dir", str(tmp_path)]) == 1
    assert "cluster up --netns" in capsys.readouterr().err


def test_a_multi_host_config_starts_only_in_namespaces(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="only with --netns"):
        LocalCluster(tmp_path / "c").up(config=ROOT / "deploy" / "cluster.toml")
    with pytest.raises(ClusterError, match=r"nope\.toml: config file not found"):
        LocalCluster(tmp_path / "c").up(netns=True, config=tmp_path / "nope.toml")
    assert not (tmp_path / "c").exists()  # nothing was started


@needs_netns
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_partition_leader_cut_off_acknowledges_nothing_and_cuts_its_tail_after_heal(
    tmp_path: Path,
) -> None:
    """A partition's leader cut off from the coordinators and its followers
    (clients still reach it) appends an acks=all write but never acknowledges
    it; the other side elects a follower and serves; after the heal the old
    leader follows, and cuts the write it never acknowledged (by leader
    epoch, KIP-101)."""
    settings = {
        "broker.heartbeat.interval.ms": 300,
        "broker.session.timeout.ms": 3_000,
        "replica.lag.time.max.ms": 2_000,
    }
    with running_cluster(tmp_path / "c", netns=True, settings=settings) as cluster:
        with Admin(cluster.bootstrap()) as admin:
            admin.create_topics({"cut": 1}, replication_factor=3, min_insync_replicas=2)

            def registration() -> Any:
                return admin.describe_topics(["cut"])["cut"].partitions[0]

            old = registration()
            with Producer(cluster.bootstrap()) as producer:
                producer.send("cut", b"before", partition=0).result(30)
            others = [n.node_id for n in cluster.state.nodes if n.node_id != old.leader]  # type: ignore[union-attr]
            netns.partition(cluster, [[old.leader], others])
            isolated = plog_client.stub(cluster.state.node(old.leader).grpc)  # type: ignore[union-attr]
            answer = None
            with contextlib.suppress(grpc.RpcError):  # the call's deadline: not acknowledged
                answer = plog_client.produce(isolated, "cut", 0, [b"cut-off"], timeout_s=8)
            assert answer is None or answer.error_code != ErrorCode.NONE, answer
            cluster.wait_until(
                lambda: registration().leader not in (old.leader, -1), 30, "no new leader"
            )
            new = registration()
            assert new.leader_epoch > old.leader_epoch and old.leader not in new.isr
            with Producer(cluster.bootstrap()) as producer:
                producer.send("cut", b"during", partition=0).result(30)
            netns.heal(cluster)
            cluster.wait_until(lambda: old.leader in registration().isr, 60, "no rejoin")

        def replica_log(node_id: int) -> bytes:
            record = cluster.state.node(node_id)  # type: ignore[union-attr]
            directory = Path(record.log).with_suffix("") / "cut-0"
            return b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))

        cluster.wait_until(
            lambda: replica_log(old.leader) == replica_log(new.leader), 30, "logs differ"
        )
        assert b"cut-off" not in replica_log(old.leader)
        leader = plog_client.stub(cluster.state.node(new.leader).grpc)  # type: ignore[union-attr]
        seen, _ = plog_client.read_all(leader, "cut", 0, committed=False)
        assert [value for _, value in seen] == [b"before", b"during"]
        logs = "".join(p.read_text() for p in cluster.data_dir.glob("*.log"))
        assert "event=replica_truncated" in logs
