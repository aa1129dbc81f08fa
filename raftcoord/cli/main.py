"""The raftcoord command line: a local cluster, its nodes, the chaos workload
and nemesis, the Spark audit and the benchmarks."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from raftcoord.chaos.arguments import FAULTS, fault_list, positive_seconds
from raftcoord.chaos.verdict import EXIT_USAGE, UsageParser
from raftcoord.protocol.process import exit_with_watched_process, private_files

if TYPE_CHECKING:
    from raftcoord.protocol.config import ClusterConfig


def _demo(args: argparse.Namespace) -> int:
    import secrets

    from raftcoord.cli.demo import run_demo

    seed = args.seed if args.seed is not None else secrets.randbelow(1_000_000_000)
    cluster_dir = Path(args.cluster_dir) if args.cluster_dir else None
    return run_demo(cluster_dir, args.duration, seed, args.input_records, args.nemesis)


def _data_dir(args: argparse.Namespace, kind: str) -> Path:
    """``--data-dir``, else ``CONFIG_DIR/KIND-ID`` (where `cluster up` puts it)."""
    return Path(args.data_dir) if args.data_dir else Path(args.config).parent / f"{kind}-{args.id}"


def _check_tls_files(config: ClusterConfig, node_id: int) -> None:
    """Raises ConfigError when node ``node_id`` cannot read its ``[tls]`` files."""
    from raftcoord.protocol.config import ConfigError
    from raftcoord.protocol.tls import node_files_error

    problem = node_files_error(config, node_id)
    if problem is not None:
        raise ConfigError(problem)


def _checked_tls(config: ClusterConfig, node_id: int, addresses: list[str | None]) -> str:
    """What ``--check`` found of node ``node_id``'s ``[tls]`` files: its
    certificate and key, signed by the cluster's CA, naming the hosts of
    ``addresses``.

    Raises:
        ConfigError: a file it could not serve with, and why.
    """
    from raftcoord.cluster.certs import host_of, node_certificate_refusal
    from raftcoord.protocol.config import ConfigError

    if config.tls is None:
        return "no [tls]"
    cert, key = config.tls.node_files(node_id)
    hosts = [host_of(a) for a in addresses if a]
    refusal = node_certificate_refusal(config.tls.ca_file, cert, key, hosts)
    if refusal is not None:
        raise ConfigError(f"[tls]: {refusal}")
    return f"certificate {cert} (CA {config.tls.ca_file})"


def _checked_data_dir(data_dir: Path, config: ClusterConfig, kind: str, node_id: int) -> str:
    """What ``--check`` found of a node's data directory, writing nothing:
    one it may write, of its own node and of the config's shape, or none
    yet (the node makes it).

    Raises:
        ConfigError: the node could not use it, and why.
    """
    from raftcoord.protocol.config import ConfigError, shape_refusal
    from raftcoord.protocol.data_dir import DirectoryRefused, DirectoryUnusable, inspect

    if not data_dir.exists():
        return f"data directory {data_dir} (not made yet)"
    if not data_dir.is_dir():
        raise ConfigError(f"data directory {data_dir} is not a directory")
    if not os.access(data_dir, os.R_OK | os.W_OK | os.X_OK):
        raise ConfigError(f"data directory {data_dir} is not writable by this user")
    try:
        inspect(data_dir, kind, node_id)
    except (DirectoryRefused, DirectoryUnusable) as exc:
        raise ConfigError(str(exc)) from None
    refusal = shape_refusal(data_dir, config)
    if refusal is not None:
        raise ConfigError(refusal)
    return f"data directory {data_dir}"


def _checked(command: str, node_id: int, config_path: str, found: list[str]) -> int:
    """``--check``'s line: what was checked of the node; exit status 0."""
    print(
        f"raftcoord {command} --id {node_id}: config {config_path}, {', '.join(found)}: "
        "fine; nothing started"
    )
    return 0


def _node(args: argparse.Namespace) -> int:
    from raftcoord.protocol.config import ConfigError, check_shape, load_config, read_raft_key

    private_files()
    data_dir = _data_dir(args, "node")
    try:
        config = load_config(args.config)
        address = config.coordinator(args.id)
        if args.check:
            found = [_checked_tls(config, args.id, [address.grpc, address.link])]
            found.append(_checked_data_dir(data_dir, config, "coordinator", args.id))
        else:
            _check_tls_files(config, args.id)
            check_shape(data_dir, config)
        if args.insecure_raft:
            raft_key = None
        elif config.raft_key_file is None:
            raise ConfigError(
                "the config names no raft_key_file, so Raft traffic would be "
                "unauthenticated (deploy/README.md says how to make one); "
                "--insecure-raft runs without it"
            )
        else:
            raft_key = read_raft_key(config.raft_key_file)
    except ConfigError as exc:
        print(f"raftcoord node: {exc}", file=sys.stderr)
        return 2
    if args.check:
        key = "no Raft key" if raft_key is None else f"Raft key {config.raft_key_file}"
        return _checked("node", args.id, args.config, [key, *found])
    from raftcoord.coordinator.node import run_node

    exit_with_watched_process()
    return run_node(config, args.id, data_dir, raft_key)


def _partition_node(args: argparse.Namespace) -> int:
    from raftcoord.protocol.config import ConfigError, check_shape, load_config

    private_files()
    data_dir = _data_dir(args, "partition-node")
    try:
        config = load_config(args.config)
        address = config.partition_node(args.id)
        if args.check:
            found = [_checked_tls(config, args.id, [address.grpc, address.replication])]
            found.append(_checked_data_dir(data_dir, config, "partition-log", args.id))
        else:
            _check_tls_files(config, args.id)
            check_shape(data_dir, config)
    except ConfigError as exc:
        print(f"raftcoord partition-node: {exc}", file=sys.stderr)
        return 2
    if args.check:
        return _checked("partition-node", args.id, args.config, found)
    from partition_log.node import run_partition_node

    exit_with_watched_process()
    return run_partition_node(config, args.id, data_dir)


def _kafka_gateway(args: argparse.Namespace) -> int:
    from raftcoord.protocol.config import ConfigError, load_config

    private_files()
    try:
        config = load_config(args.config)
        listener = next((k for k in config.kafka_listeners if k.node_id == args.id), None)
        if listener is None:
            raise ConfigError(f"no [[kafka_listeners]] entry with id {args.id}")
        if args.check:
            found = [_checked_tls(config, args.id, [listener.address])]
        else:
            _check_tls_files(config, args.id)
    except ConfigError as exc:
        print(f"raftcoord kafka-gateway: {exc}", file=sys.stderr)
        return 2
    if args.check:
        return _checked("kafka-gateway", args.id, args.config, found)
    from raftcoord.kafka.gateway import run_gateway

    exit_with_watched_process()
    return run_gateway(config, listener)


def _repair_shard(args: argparse.Namespace) -> int:
    import time

    from raftcoord.coordinator.repair import RepairRefused, set_replica_aside
    from raftcoord.protocol.config import ConfigError, load_config

    data_dir = _data_dir(args, "node")
    try:
        config = load_config(args.config)
        config.coordinator(args.id)
        if not 0 <= args.shard < config.shard_count:
            raise ConfigError(f"--shard must be in 0..{config.shard_count - 1}")
    except ConfigError as exc:
        print(f"raftcoord repair-shard: {exc}", file=sys.stderr)
        return 2
    if not args.yes:
        print(
            f"raftcoord repair-shard: this sets node {args.id}'s replica of shard {args.shard} "
            "aside; it then catches up from the shard's leader. Do it only while the shard's "
            "other replicas serve (`raftcoord cluster status`, or NodeStatus of the other "
            "coordinators); give --yes to go on.",
            file=sys.stderr,
        )
        return 2
    try:
        moved = set_replica_aside(data_dir, args.shard, time.strftime("%Y%m%dT%H%M%S"))
    except RepairRefused as exc:
        print(f"raftcoord repair-shard: {exc}", file=sys.stderr)
        return 2
    for source, target in moved:
        print(f"moved {source} -> {target.name}")
    print(
        f"node {args.id} starts shard {args.shard} empty and catches up from the leader "
        "(a snapshot, then the entries after it)"
    )
    return 0


def _accept_directory(args: argparse.Namespace) -> int:
    from partition_log.cluster_view import ClusterView
    from raftcoord.protocol.channels import ChannelCache
    from raftcoord.protocol.config import ConfigError, load_config
    from raftcoord.protocol.data_dir import META_FILE, DirectoryRefused, parse
    from raftcoord.protocol.tls import node_identity

    data_dir = _data_dir(args, "partition-node")
    try:
        config = load_config(args.config)
        config.partition_node(args.id)
        identity = parse((data_dir / META_FILE).read_text(encoding="utf-8"), data_dir / META_FILE)
        if (identity.kind, identity.node_id) != ("partition-log", args.id):
            raise DirectoryRefused(
                f"{data_dir} belongs to {identity.kind} node {identity.node_id}, "
                f"not to partition-log node {args.id}"
            )
    except (ConfigError, DirectoryRefused) as exc:
        print(f"raftcoord accept-directory: {exc}", file=sys.stderr)
        return 2
    except (OSError, UnicodeDecodeError) as exc:
        print(
            f"raftcoord accept-directory: cannot read {data_dir / META_FILE} ({exc}); "
            "start the node once so that it writes one",
            file=sys.stderr,
        )
        return 2
    if not args.yes:
        print(
            f"raftcoord accept-directory: this makes directory {identity.directory_id} "
            f"({data_dir}) node {args.id}'s data directory of record. Records the previous "
            "directory held and that this one lacks are lost for good (the node's partitions "
            "continue above every offset handed out before); give --yes to go on.",
            file=sys.stderr,
        )
        return 2
    try:  # with [tls], as the node itself: only the cluster records directories
        tls_identity = node_identity(config, args.id)
    except OSError as exc:
        print(f"raftcoord accept-directory: the node's certificate: {exc}", file=sys.stderr)
        return 2
    credentials = None if tls_identity is None else tls_identity.channel_credentials()
    view = ClusterView(
        ChannelCache(credentials=credentials), [n.grpc for n in config.coordinators], args.id
    )
    answer = view.register_directory(identity.directory_id, replace=True)
    if answer is None:
        print("raftcoord accept-directory: no coordinator answered; retry", file=sys.stderr)
        return 1
    if answer.error_code != 0:
        print(f"raftcoord accept-directory: {answer.error_message}", file=sys.stderr)
        return 1
    print(
        f"node {args.id}'s data directory of record is now {identity.directory_id}; "
        "the node serves its partitions within a second"
    )
    return 0


def _certs(args: argparse.Namespace) -> int:
    from raftcoord.cluster import certs

    directory = Path(args.dir)
    refused = certs.client_name_refusal(args.name) if args.certs_command == "client" else None
    if refused is not None:
        print(f"raftcoord certs client: --name {refused}", file=sys.stderr)
        return 2
    try:
        if args.certs_command == "ca":
            if (directory / certs.CA_KEY).exists():
                print(f"raftcoord certs ca: {directory / certs.CA_KEY} exists", file=sys.stderr)
                return 2
            certs.make_ca(directory)
            print(
                f"wrote {directory / certs.CA_CERT} and {directory / certs.CA_KEY} (keep it safe)"
            )
            return 0
        ca = certs.load_ca(directory)
        if args.certs_command == "node":
            name = f"node-{args.id}"
            written = certs.issue(ca, directory, name, name, args.host)
        else:
            written = certs.issue(ca, directory, args.name, args.name, [])
    except (OSError, ValueError) as exc:
        print(f"raftcoord certs {args.certs_command}: {exc}", file=sys.stderr)
        return 2
    print("wrote " + " and ".join(str(p) for p in written))
    return 0


#: The commands whose modules import much (the client, the chaos workload,
#: Spark): their one-line help, and the function of their module that adds
#: their arguments, imported only when the command is the one given, so that
#: `raftcoord cluster --help` does not load Spark nor the Kafka codec.
LAZY_COMMANDS: dict[str, tuple[str, str, str]] = {
    "cluster": (
        "run a local cluster (on 127.0.0.1, or in network namespaces)",
        "raftcoord.cli.cluster",
        "configure",
    ),
    "workload": (
        "transactional traffic with faults, recorded in a history",
        "raftcoord.chaos.commands",
        "configure_workload",
    ),
    "chaos": (
        "the nemesis alone against a running cluster",
        "raftcoord.chaos.commands",
        "configure_chaos",
    ),
    "txn": (
        "list, describe and abort transactions; find hanging ones (KIP-664)",
        "raftcoord.cli.txn",
        "configure",
    ),
    "console": (
        "a read-only web console of a cluster (docs/console.md)",
        "raftcoord.cli.console",
        "configure",
    ),
    "topic": (
        "create, list and describe topics (kafka-topics.sh)",
        "raftcoord.cli.topic",
        "configure",
    ),
    "acl": ("add, list and remove ACLs (kafka-acls.sh)", "raftcoord.cli.acl", "configure"),
    "user": ("add, list and remove SASL/SCRAM users", "raftcoord.cli.user", "configure"),
    "bench": (
        "benchmarks: with no suite, a local cluster against its ceilings and the targets",
        "raftcoord.cli.bench",
        "configure",
    ),
    "audit": (
        "Spark exactly-once audit of a run's logs and history (docs/audit.md)",
        "spark.cli",
        "configure",
    ),
}


def _chosen(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The (sub)command parser that ``argv`` chose, following its command names."""
    for token in argv:
        commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not commands:
            break
        chosen = commands[0].choices.get(token)
        if chosen is not None:
            parser = chosen
    return parser


#: The exit status of a command whose output's reader went away, as of one
#: killed by SIGPIPE (a shell's 128 + 13).
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``raftcoord`` console script. A reader of its
    output that goes away (``raftcoord cluster status | head``) ends it
    quietly, with :data:`EXIT_BROKEN_PIPE`."""
    try:
        status = _main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # What is still buffered would fail again at exit: stdout goes nowhere now.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return status


def _check_help(key: str) -> str:
    return (
        f"check the config, {key}the TLS certificate and key, and the data directory as this "
        "user, start nothing: one line saying what was checked (exit 0), or what is wrong "
        "(exit 2)"
    )


def _main(argv: list[str] | None) -> int:
    parser = UsageParser(prog="raftcoord", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="start a local cluster, run the chaos workload with faults, audit it with Spark",
        description="Start a local cluster (3 coordinators x 3 shards, 3 partition-log nodes; "
        "each node in a network namespace of its own where this machine allows it (root "
        "and iproute2), else on 127.0.0.1 and without the partition fault), run the "
        "transactional chaos workload for --duration seconds while the nemesis injects "
        "the faults asked for, one at a time and each at least once (the traffic goes on, "
        "up to twice as long, until each has happened), then heal, "
        "let the workload finish, stop the cluster and run the Spark exactly-once audit of "
        "the partition logs and the workload's history. Prints the faults and what they "
        "did, the audit's checks and the verdict: PASS (exit 0), FAIL (1: a violation, a "
        "crash), INCOMPLETE (2: a check did not run or had nothing to judge, or a fault "
        "asked for never changed anything, e.g. a partition without network namespaces); "
        "64 on a command line it cannot parse; 130 when interrupted (Ctrl-C during the "
        "traffic heals, drains and stops, then skips the audit and says how to run it).",
    )
    demo.add_argument(
        "--nemesis",
        "--faults",
        dest="nemesis",
        type=fault_list,
        default=FAULTS,
        help=f"comma-separated faults ({', '.join(FAULTS)}), all or none (default: all)",
    )
    demo.add_argument(
        "--duration",
        type=positive_seconds,
        default=60.0,
        help="seconds of traffic with faults; the heal, drain and audit come after "
        "(default: %(default)s)",
    )
    demo.add_argument(
        "--seed",
        type=int,
        help="seed of the workload's and the nemesis's choices, to repeat them "
        "(default: a random one, printed)",
    )
    demo.add_argument(
        "--input-records",
        type=int,
        default=2_000,
        help="records pre-filled into the input topic of the consume-transform-produce "
        "workers (default: %(default)s)",
    )
    demo.add_argument(
        "--cluster-dir",
        "--data-dir",
        dest="cluster_dir",
        help="where the cluster's files, the history and the audit report go "
        "(default: a new temporary directory); --data-dir is an older name for it",
    )
    demo.set_defaults(func=_demo)
    node = commands.add_parser("node", help="run one coordinator node")
    node.add_argument("--config", required=True, help="cluster config (TOML)")
    node.add_argument("--id", required=True, type=int, help="this node's id in the config")
    node.add_argument("--data-dir", help="journal, snapshots, logs (default: CONFIG_DIR/node-ID)")
    node.add_argument(
        "--insecure-raft",
        action="store_true",
        help="accept and send Raft traffic without authentication (no raft_key_file); "
        "anyone who reaches the Raft ports can then act as a member",
    )
    node.add_argument("--check", action="store_true", help=_check_help("the Raft key, "))
    node.set_defaults(func=_node)
    repair = commands.add_parser(
        "repair-shard",
        help="set a coordinator's damaged replica of one shard aside (it catches up "
        "from the leader)",
        description="For a coordinator that stopped with event=journal_damaged or "
        "snapshot_damaged: rename that shard's journal and snapshot under the node's data "
        "directory to NAME.damaged-TIME (the term/vote file too if it is damaged). Started "
        "again, the node receives the shard's state from its leader. Only while the shard's "
        "other replicas serve.",
    )
    repair.add_argument("--config", required=True, help="cluster config (TOML)")
    repair.add_argument("--id", required=True, type=int, help="the coordinator's id")
    repair.add_argument("--shard", required=True, type=int, help="the shard to repair")
    repair.add_argument(
        "--data-dir", help="the node's data directory (default: CONFIG_DIR/node-ID)"
    )
    repair.add_argument("--yes", action="store_true", help="do it (the other replicas serve)")
    repair.set_defaults(func=_repair_shard)
    accept = commands.add_parser(
        "accept-directory",
        help="accept a partition-log node's new (empty or foreign) data directory",
        description="For a partition-log node that logged event=directory_replaced (its data "
        "directory is not the one the coordinators have on record, e.g. after a disk was "
        "replaced): record its current directory instead. The node then serves its "
        "partitions again; their offsets continue above every offset handed out before. "
        "Run it on the node's host (it reads the directory's meta.properties).",
    )
    accept.add_argument("--config", required=True, help="cluster config (TOML)")
    accept.add_argument("--id", required=True, type=int, help="the partition-log node's id")
    accept.add_argument(
        "--data-dir", help="the node's data directory (default: CONFIG_DIR/partition-node-ID)"
    )
    accept.add_argument("--yes", action="store_true", help="do it (what was lost is lost)")
    accept.set_defaults(func=_accept_directory)
    certs = commands.add_parser(
        "certs",
        help="make a cluster's CA and certificates (docs/security.md)",
        description="A cluster with a [tls] table needs a CA, a certificate node-ID for every "
        "node (naming the hosts it is reached at) and one per client (its principal is "
        "User:NAME). Keys are written with mode 600.",
    )
    certs_commands = certs.add_subparsers(dest="certs_command", required=True)
    for name, text in (
        ("ca", "a new CA (ca.pem, ca.key)"),
        ("node", "node-ID.pem/.key for one node"),
        ("client", "NAME.pem/.key for one client"),
    ):
        sub = certs_commands.add_parser(name, help=text)
        sub.add_argument("--dir", required=True, help="the directory of the CA and certificates")
        if name == "node":
            sub.add_argument("--id", required=True, type=int, help="the node's id in the config")
            sub.add_argument(
                "--host",
                required=True,
                action="append",
                help="a host name or IP address the node is reached at (repeatable)",
            )
        if name == "client":
            sub.add_argument("--name", required=True, help="the principal's name (User:NAME)")
    certs.set_defaults(func=_certs)
    pnode = commands.add_parser("partition-node", help="run one partition-log node")
    pnode.add_argument("--config", required=True, help="cluster config (TOML)")
    pnode.add_argument("--id", required=True, type=int, help="this node's id in the config")
    pnode.add_argument("--data-dir", help="partition logs (default: CONFIG_DIR/partition-node-ID)")
    pnode.add_argument("--check", action="store_true", help=_check_help(""))
    pnode.set_defaults(func=_partition_node)
    gateway = commands.add_parser(
        "kafka-gateway", help="run one Kafka wire-protocol gateway (docs/kafka.md)"
    )
    gateway.add_argument("--config", required=True, help="cluster config (TOML)")
    gateway.add_argument(
        "--id", required=True, type=int, help="this gateway's id in [[kafka_listeners]]"
    )
    gateway.add_argument(
        "--check",
        action="store_true",
        help="check the config and the TLS certificate and key as this user, start nothing: "
        "one line saying what was checked (exit 0), or what is wrong (exit 2)",
    )
    gateway.set_defaults(func=_kafka_gateway)
    given = sys.argv[1:] if argv is None else argv
    chosen = next((token for token in given if not token.startswith("-")), None)
    for name, (text, module, function) in LAZY_COMMANDS.items():
        sub = commands.add_parser(name, help=text, description=text)
        if name == chosen:  # only the command given is built, with what it imports
            getattr(importlib.import_module(module), function)(sub)
    args, unknown = parser.parse_known_args(argv)
    if not hasattr(args, "func"):  # a command that was not built (options before it)
        parser.print_usage(sys.stderr)
        return EXIT_USAGE
    if unknown:  # told with the usage of the subcommand that was given them
        _chosen(parser, given).error(f"unrecognized arguments: {' '.join(unknown)}")
    result: int = args.func(args)
    return result
