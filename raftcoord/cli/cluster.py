"""``raftcoord cluster up|status|down|kill|start|elect-leaders|partition|heal``: the
command line of the local cluster launcher (:mod:`raftcoord.cluster.launcher`)
and of its network namespaces (:mod:`raftcoord.cluster.netns`)."""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raftcoord.chaos.arguments import CHAOS_HISTORY_FILE, HISTORY_FILE
from raftcoord.cluster import netns as namespaces
from raftcoord.protocol.config import ConfigError

if TYPE_CHECKING:  # the launcher and the client are imported where they are used
    from raftcoord.cluster.launcher import LocalCluster

_CLUSTER_DIR_HELP = (
    "the cluster's directory: config, node data and logs (default: %(default)s); "
    "--data-dir is an older name for it"
)


def configure(cluster: argparse.ArgumentParser) -> None:
    """The arguments of ``raftcoord cluster``."""
    sub = cluster.add_subparsers(dest="cluster_command", required=True)
    up = sub.add_parser(
        "up",
        help="write the config, start all nodes, wait for leaders",
        description="Write the cluster config into the data directory, start every node, "
        "and wait until every shard has a leader and every partition-log node answers. "
        "If they do not in time, the nodes started are stopped again.",
    )
    up.add_argument(
        "--coordinators",
        type=int,
        default=3,
        help="coordinator nodes (1..9), one Raft group (default: %(default)s)",
    )
    up.add_argument(
        "--shards",
        type=int,
        default=3,
        help="shards of the transaction state (1..64), each replicated by every "
        "coordinator (default: %(default)s)",
    )
    up.add_argument(
        "--partition-nodes",
        type=int,
        default=3,
        help="partition-log nodes (0..50) (default: %(default)s)",
    )
    up.add_argument(
        "--kafka-listeners",
        type=int,
        default=0,
        help="Kafka wire-protocol gateways (0..9) on 127.0.0.1 (each in a namespace of its "
        "own with --netns), for unmodified Kafka "
        "clients (docs/kafka.md) (default: %(default)s)",
    )
    up.add_argument(
        "--fsync",
        choices=["always", "batch", "never"],
        default="always",
        help="when the coordinators' Raft journals are fsynced (default: %(default)s)",
    )
    up.add_argument(
        "--log-flush",
        choices=["always", "interval", "never"],
        default="always",
        help="partition logs' fsync policy (log.flush.policy) (default: %(default)s)",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds to wait for shard leaders and partition-log nodes (default: %(default)s)",
    )
    up.add_argument(
        "--setting",
        action="append",
        default=[],
        type=_setting,
        metavar="NAME=VALUE",
        help="add a [settings] entry to the config (a TOML value, e.g. "
        "transaction.partition.verification.enable=false); repeatable",
    )
    up.add_argument(
        "--netns",
        action="store_true",
        help="run every node in a network namespace of its own (root only; "
        "'raftcoord cluster partition' can then cut the network)",
    )
    up.add_argument(
        "--tls",
        action="store_true",
        help="mutual TLS on every gRPC connection: a new CA and certificates in DIR/tls "
        "(every node's; clients 'admin', a super user, and 'client')",
    )
    up.add_argument(
        "--kafka-security",
        choices=["PLAINTEXT", "SSL", "SASL_SSL"],
        default="PLAINTEXT",
        help="the Kafka gateways' security.protocol; SSL and SASL_SSL need --tls "
        "(docs/security.md) (default: %(default)s)",
    )
    up.add_argument(
        "--faults",
        action="store_true",
        help="preload a library into every node that makes its fsync fail or steps its wall "
        "clock on demand (needs a C compiler); the chaos workload's disk fault uses it",
    )
    up.add_argument(
        "--fresh",
        action="store_true",
        help="start anew: first remove the nodes' data and logs, the histories and the audit "
        "report a stopped cluster left in the cluster's directory (only one that "
        "'cluster up' made); without it, the nodes resume their data",
    )
    up.add_argument(
        "--config",
        help="with --netns: start the nodes of this multi-host config (e.g. "
        "deploy/cluster.toml), each host a namespace; its shape and settings replace "
        "the options above",
    )
    partition = sub.add_parser(
        "partition",
        help="cut the network (--netns clusters) between groups of nodes, replacing any cut",
    )
    partition.add_argument(
        "groups",
        nargs="+",
        type=_group,
        help="comma-separated node ids per group, e.g. '1 2,3,101'; "
        "nodes in no group keep reaching everyone",
    )
    heal = sub.add_parser("heal", help="remove every cut of 'cluster partition'")
    status = sub.add_parser(
        "status",
        help="node, role and term per shard, pid, alive; exits 1 unless every node answers "
        "and every shard has a leader (saying which do not on stderr)",
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    down = sub.add_parser("down", help="SIGTERM every node, SIGKILL after a bound")
    kill = sub.add_parser("kill", help="send a signal to one node")
    kill.add_argument("node", type=int)
    kill.add_argument(
        "--signal", default="KILL", type=_signal, help="KILL (default), STOP, CONT or TERM"
    )
    start = sub.add_parser(
        "start", help="start stopped nodes again, all at once (same data dirs, ports)"
    )
    start.add_argument("node", type=int, nargs="+")
    elect = sub.add_parser(
        "elect-leaders",
        help="move every shard's leadership to its preferred coordinator now "
        "(Kafka's preferred leader election; otherwise the next imbalance check does)",
    )
    for p in (up, partition, heal, status, down, kill, start, elect):
        p.add_argument(
            "--cluster-dir",
            "--data-dir",
            dest="cluster_dir",
            default=".raftcoord",
            help=_CLUSTER_DIR_HELP,
        )
    cluster.set_defaults(func=_run)


#: What runs against a cluster leave in its directory beside the nodes' data:
#: the workload's and the chaos command's histories, the audit's report
#: (``raftcoord audit``'s default report directory there).
RUN_FILES = (HISTORY_FILE, CHAOS_HISTORY_FILE, "audit")


def _described(paths: list[Path]) -> str:
    """``paths`` of a cluster directory in a few words: how many nodes'
    data, then the names of the others ("" for none)."""
    nodes = {p.name.removesuffix(".log") for p in paths if p.name not in RUN_FILES}
    said = [f"the data of {len(nodes)} nodes"] if nodes else []
    return ", ".join(said + [p.name for p in paths if p.name in RUN_FILES])


def _setting(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"not NAME=VALUE: {text!r}")
    try:
        parsed = tomllib.loads(f"value = {value}")["value"]
    except tomllib.TOMLDecodeError:
        parsed = value  # a bare word is a string
    return name, parsed


def _signal(name: str) -> str:
    from raftcoord.cluster.launcher import SIGNALS

    if name not in SIGNALS:
        raise argparse.ArgumentTypeError(f"{name!r} is not one of {sorted(SIGNALS)}")
    return name


def _group(text: str) -> list[int]:
    try:
        return [int(node) for node in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated node ids: {text!r}") from None


def _run(args: argparse.Namespace) -> int:
    from raftcoord.cluster.launcher import ClusterError, LocalCluster

    cluster = LocalCluster(args.cluster_dir)
    try:
        if args.cluster_command == "up":
            if not 1 <= args.coordinators <= 9 or not 1 <= args.shards <= 64:
                raise ClusterError("use 1..9 coordinators and 1..64 shards")
            if not 0 <= args.partition_nodes <= 50:
                raise ClusterError("use 0..50 partition-log nodes")
            if not 0 <= args.kafka_listeners <= 9:
                raise ClusterError("use 0..9 Kafka gateways")
            what = (
                f"the nodes of {args.config}"
                if args.config
                else f"{args.coordinators} coordinators, {args.shards} shards, "
                f"{args.partition_nodes} partition-log nodes"
            )
            where = " in network namespaces" if args.netns else ""
            if args.fresh:
                removed = _described(cluster.wipe(RUN_FILES))
                if removed:
                    print(f"--fresh: removed {removed} from {cluster.data_dir}")
            left = _described(
                [p for p in cluster.node_data() if p.is_dir()]
                + [cluster.data_dir / n for n in RUN_FILES if (cluster.data_dir / n).exists()]
            )

            def starting() -> None:
                if left:
                    print(
                        f"resuming {left} in {cluster.data_dir} (the topics, transactions "
                        "and terms of the cluster stopped there, and what `raftcoord audit` "
                        "reads there); --fresh starts anew"
                    )
                print(f"starting {what}{where} in {cluster.data_dir} ...", flush=True)

            cluster.up(
                args.coordinators,
                args.shards,
                args.fsync,
                timeout_s=args.timeout,
                partition_nodes=args.partition_nodes,
                log_flush=args.log_flush,
                settings=dict(args.setting),
                netns=args.netns,
                config=args.config,
                kafka_listeners=args.kafka_listeners,
                faults=args.faults,
                tls=args.tls,
                kafka_security=args.kafka_security,
                starting=starting,
            )
            print(cluster.status_table())
            if args.kafka_listeners:
                print(f"Kafka bootstrap.servers: {cluster.kafka_bootstrap()}")
        elif args.cluster_command == "status":
            nodes = cluster.status()
            if args.json:
                print(json.dumps(nodes, indent=2))
            else:
                print(cluster.status_table(nodes))
                print()
                print(_partition_summary(cluster))
            problem = cluster.unhealthy(nodes)
            if problem is not None:
                print(f"raftcoord cluster status: {problem}", file=sys.stderr)
                return 1
        elif args.cluster_command == "down":
            cluster.down()
            print(f"stopped the cluster in {cluster.data_dir}")
        elif args.cluster_command == "kill":
            cluster.kill(args.node, args.signal)
            print(f"sent SIG{args.signal} to node {args.node}")
        elif args.cluster_command == "start":
            cluster.start(*args.node)
            print(f"started node(s) {', '.join(map(str, args.node))}")
        elif args.cluster_command == "elect-leaders":
            leaders = cluster.elect_preferred_leaders()
            print(", ".join(f"shard {s}: node {n}" for s, n in sorted(leaders.items())))
        elif args.cluster_command == "partition":
            namespaces.partition(cluster, args.groups)
            print("cut the network between " + " | ".join(map(str, args.groups)))
        elif args.cluster_command == "heal":
            namespaces.heal(cluster)
            print("healed the network")
    except ConfigError as exc:  # a config (or --setting) no node could run with
        print(f"raftcoord cluster: {exc}", file=sys.stderr)
        return 2
    except (ClusterError, namespaces.NetnsError) as exc:
        print(f"raftcoord cluster: {exc}", file=sys.stderr)
        return 1
    return 0


#: How long ``cluster status`` waits for the topics' records.
SUMMARY_TIMEOUT_MS = 2_000
#: The most partitions ``cluster status`` names in each problem list.
SUMMARY_NAMED = 10


def _partition_summary(cluster: LocalCluster) -> str:
    """The partitions as the coordinators' controller records them: how many
    each partition-log node leads, and those without a leader or with fewer
    in-sync replicas than replicas (`raftcoord topic describe` has them all)."""
    from raftcoord.client import Admin, KafkaError

    try:
        with Admin(
            cluster.bootstrap(), request_timeout_ms=SUMMARY_TIMEOUT_MS, **cluster.client_tls()
        ) as admin:
            topics = admin.describe_topics(timeout_ms=SUMMARY_TIMEOUT_MS)
    except KafkaError as exc:
        return f"partitions: unknown, no coordinator answered ({exc})"
    partitions = [(t.name, p) for t in topics.values() for p in t.partitions]
    led = collections.Counter(p.leader for _, p in partitions if p.leader >= 0)
    offline = [f"{name}-{p.partition}" for name, p in partitions if p.leader < 0]
    under = [f"{name}-{p.partition}" for name, p in partitions if p.under_replicated]
    lines = [
        f"partitions: {len(partitions)} in {len(topics)} topics; leaders: "
        + (", ".join(f"node {n} {c}" for n, c in sorted(led.items())) or "none")
    ]
    for what, names in (("without a leader", offline), ("under-replicated", under)):
        listed = ", ".join(names[:SUMMARY_NAMED]) + (" ..." if len(names) > SUMMARY_NAMED else "")
        lines.append(f"{what}: {len(names)}" + (f" ({listed})" if names else ""))
    return "\n".join(lines)
