"""A local cluster on 127.0.0.1: ``raftcoord cluster up|status|down|kill|start``.

The launcher writes the cluster config from ``deploy/cluster.toml.template``,
starts every node as its own OS process (same data dir and ports on a
restart), and records what it started in ``<data-dir>/cluster.json``:
addresses, pids and log files. The tests drive clusters through
:class:`LocalCluster`, the same code the command line uses.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from raftcoord.config import load_config, shape_refusal
from raftcoord.v1 import admin_pb2, admin_pb2_grpc, partition_log_pb2, partition_log_pb2_grpc

TEMPLATE = Path(__file__).resolve().parents[1] / "deploy" / "cluster.toml.template"
STATE_FILE = "cluster.json"
CONFIG_FILE = "cluster.toml"
#: Partition-log node ids start here, so that they never collide with coordinator ids.
PARTITION_NODE_BASE_ID = 101
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
    kind: str  # "coordinator" or "partition-log"
    grpc: str
    pid: int = 0
    log: str = ""


@dataclass
class ClusterState:
    data_dir: str
    config: str
    shard_count: int
    nodes: list[NodeRecord] = field(default_factory=list)

    def node(self, node_id: int) -> NodeRecord:
        for record in self.nodes:
            if record.node_id == node_id:
                return record
        raise ClusterError(
            f"no node {node_id} in {self.data_dir} (nodes: {[n.node_id for n in self.nodes]})"
        )


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def write_config(
    path: Path,
    coordinators: int,
    shards: int,
    fsync: str = "always",
    abort_interval_ms: int = 1000,
    partition_nodes: int = 3,
    log_flush: str = "always",
    settings: dict[str, Any] | None = None,
) -> None:
    """Write a cluster config for a local cluster with free ports; ``settings``
    adds entries to its ``[settings]`` table (Kafka-style names)."""
    ports = iter(free_ports(coordinators * (1 + shards) + partition_nodes))
    blocks = []
    for node_id in range(1, coordinators + 1):
        grpc_port = next(ports)
        raft = ", ".join(f'"127.0.0.1:{next(ports)}"' for _ in range(shards))
        blocks.append(
            f'[[coordinators]]\nid = {node_id}\ngrpc = "127.0.0.1:{grpc_port}"\nraft = [{raft}]\n'
        )
    partition_blocks = [
        f'[[partition_nodes]]\nid = {node_id}\ngrpc = "127.0.0.1:{next(ports)}"\n'
        for node_id in range(PARTITION_NODE_BASE_ID, PARTITION_NODE_BASE_ID + partition_nodes)
    ]
    text = TEMPLATE.read_text().format(
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
    path.write_text(text)


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
    ) -> ClusterState:
        """Write the config, start every node, wait until every shard has a leader
        and every partition-log node answers."""
        if self.state is not None and any(self.alive(n.node_id) for n in self.state.nodes):
            raise ClusterError(
                f"a cluster is already running in {self.data_dir}; "
                "run `raftcoord cluster down` first"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config_path = self.data_dir / CONFIG_FILE
        candidate = self.data_dir / (CONFIG_FILE + ".new")
        write_config(
            candidate,
            coordinators,
            shards,
            fsync,
            abort_interval_ms,
            partition_nodes,
            log_flush,
            settings,
        )
        config = load_config(candidate)
        for node_dir in sorted(self.data_dir.glob("*node-*")):
            refusal = shape_refusal(node_dir, config) if node_dir.is_dir() else None
            if refusal is not None:
                candidate.unlink()
                raise ClusterError(
                    f"{refusal}. Start the cluster with the same shape, or use another --data-dir."
                )
        candidate.replace(config_path)
        self.state = ClusterState(
            str(self.data_dir),
            str(config_path),
            config.shard_count,
            [NodeRecord(n.node_id, "coordinator", n.grpc) for n in config.coordinators]
            + [NodeRecord(n.node_id, "partition-log", n.grpc) for n in config.partition_nodes],
        )
        for record in self.state.nodes:
            self._spawn(record)
        self._save()
        self.wait_for_leaders(timeout_s)
        for record in self.partition_nodes():
            self.wait_until(
                lambda r=record: self.node_status(r.node_id) is not None,
                timeout_s,
                f"partition-log node {record.node_id} did not answer",
            )
        return self.state

    def coordinators(self) -> list[NodeRecord]:
        return [n for n in self._require().nodes if n.kind == "coordinator"]

    def partition_nodes(self) -> list[NodeRecord]:
        return [n for n in self._require().nodes if n.kind == "partition-log"]

    def bootstrap(self) -> list[str]:
        """The coordinators' gRPC addresses: what a client is given to start from."""
        return [n.grpc for n in self.coordinators()]

    def _spawn(self, record: NodeRecord) -> None:
        assert self.state is not None
        name = "node" if record.kind == "coordinator" else "partition-node"
        log_path = self.data_dir / f"{name}-{record.node_id}.log"
        command = [
            sys.executable,
            "-m",
            "raftcoord.cli",
            name,
            "--config",
            self.state.config,
            "--id",
            str(record.node_id),
            "--data-dir",
            str(self.data_dir / f"{name}-{record.node_id}"),
        ]
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._procs[record.node_id] = proc
        record.pid, record.log = proc.pid, str(log_path)

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

    def start(self, node_id: int, timeout_s: float = 15.0) -> None:
        """Start a stopped node again with the same data dir and ports."""
        record = self._require().node(node_id)
        if self.alive(node_id):
            raise ClusterError(f"node {node_id} is running (pid {record.pid})")
        self._spawn(record)
        self._save()
        self.wait_until(
            lambda: self.node_status(node_id) is not None,
            timeout_s,
            f"node {node_id} did not answer",
        )

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
        """SIGTERM every node, SIGKILL what is left after ``grace_s``."""
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

    def _reap(self, node_id: int, timeout_s: float) -> None:
        proc = self._procs.get(node_id)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout_s)
            return
        self.wait_until(lambda: not self.alive(node_id), timeout_s, "", raise_on_timeout=False)

    # --- inspection ----------------------------------------------------------------

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
        """A coordinator's NodeStatus (a partition-log node: an empty ListOffsets
        answer), or None when the node does not answer."""
        record = self._require().node(node_id)
        with grpc.insecure_channel(record.grpc) as channel:
            try:
                if record.kind == "partition-log":
                    return partition_log_pb2_grpc.PartitionLogStub(channel).ListOffsets(
                        partition_log_pb2.ListOffsetsRequest(), timeout=timeout_s
                    )
                return admin_pb2_grpc.CoordinatorAdminStub(channel).NodeStatus(
                    admin_pb2.NodeStatusRequest(), timeout=timeout_s
                )
            except grpc.RpcError:
                return None

    def leaders(self) -> dict[int, int]:
        """shard -> node id of the ready leader, for shards with one."""
        found: dict[int, int] = {}
        for record in self.coordinators():
            status = self.node_status(record.node_id, timeout_s=0.5)
            if status is None:
                continue
            for shard in status.shards:
                if shard.is_leader:
                    found[shard.shard] = record.node_id
        return found

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

    def status_table(self) -> str:
        """A readable table: node, pid, alive, then role@term per shard."""
        state = self._require()
        header = ["node", "grpc", "pid", "alive"] + [f"shard {s}" for s in range(state.shard_count)]
        rows = []
        for record in state.nodes:
            alive = self.alive(record.node_id)
            status = self.node_status(record.node_id, 0.5) if alive else None
            cells = [str(record.node_id), record.grpc, str(record.pid), "yes" if alive else "no"]
            if record.kind == "partition-log":
                answer = "no answer" if status is None else "serving"
                cells += [f"partition-log, {answer}" if alive else "-"]
                cells += [""] * (state.shard_count - 1)
                rows.append(cells)
                continue
            for s in range(state.shard_count):
                if status is None:
                    cells.append("-" if not alive else "no answer")
                    continue
                shard = status.shards[s]
                role = "leader" if shard.is_leader else "follower"
                cells.append(f"{role} t{shard.term} @{shard.applied_index}")
            rows.append(cells)
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in [header, *rows]
        ]
        return "\n".join(lines)


# --- command line --------------------------------------------------------------------


def add_parser(commands: Any) -> None:
    cluster = commands.add_parser("cluster", help="run a local cluster on 127.0.0.1")
    sub = cluster.add_subparsers(dest="cluster_command", required=True)
    up = sub.add_parser("up", help="write the config, start all nodes, wait for leaders")
    up.add_argument("--coordinators", type=int, default=3)
    up.add_argument("--shards", type=int, default=3)
    up.add_argument("--partition-nodes", type=int, default=3)
    up.add_argument("--fsync", choices=["always", "batch", "never"], default="always")
    up.add_argument(
        "--log-flush",
        choices=["always", "interval", "never"],
        default="always",
        help="partition logs' fsync policy (log.flush.policy)",
    )
    up.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for leaders")
    for p in (
        up,
        sub.add_parser("status", help="node, role and term per shard, pid, alive"),
        sub.add_parser("down", help="SIGTERM every node, SIGKILL after a bound"),
    ):
        p.add_argument("--data-dir", default=".raftcoord")
    kill = sub.add_parser("kill", help="send a signal to one node")
    kill.add_argument("node", type=int)
    kill.add_argument("--signal", default="KILL", choices=sorted(SIGNALS))
    start = sub.add_parser("start", help="start a stopped node again (same data dir, ports)")
    start.add_argument("node", type=int)
    for p in (kill, start):
        p.add_argument("--data-dir", default=".raftcoord")
    cluster.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.data_dir)
    try:
        if args.cluster_command == "up":
            if not 1 <= args.coordinators <= 9 or not 1 <= args.shards <= 64:
                raise ClusterError("use 1..9 coordinators and 1..64 shards")
            if not 0 <= args.partition_nodes <= 50:
                raise ClusterError("use 0..50 partition-log nodes")
            print(
                f"starting {args.coordinators} coordinators, {args.shards} shards, "
                f"{args.partition_nodes} partition-log nodes in {cluster.data_dir} ...",
                flush=True,
            )
            cluster.up(
                args.coordinators,
                args.shards,
                args.fsync,
                timeout_s=args.timeout,
                partition_nodes=args.partition_nodes,
                log_flush=args.log_flush,
            )
            print(cluster.status_table())
        elif args.cluster_command == "status":
            print(cluster.status_table())
        elif args.cluster_command == "down":
            cluster.down()
            print(f"stopped the cluster in {cluster.data_dir}")
        elif args.cluster_command == "kill":
            cluster.kill(args.node, args.signal)
            print(f"sent SIG{args.signal} to node {args.node}")
        elif args.cluster_command == "start":
            cluster.start(args.node)
            print(f"started node {args.node}")
    except ClusterError as exc:
        print(f"raftcoord cluster: {exc}", file=sys.stderr)
        return 1
    return 0
