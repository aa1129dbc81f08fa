"""``raftcoord audit``: the Spark exactly-once audit of a run.

    raftcoord audit --cluster-dir DIR [--history FILE] [--master URL] [--report DIR]
    raftcoord audit --cluster-config cluster.toml [--ssl-...] [--history FILE] ...

also runnable as ``python -m spark ...`` or ``spark-submit spark/__main__.py ...``.
Local mode (``local[*]``) by default; with ``--master spark://HOST:PORT`` the
same job runs on a standalone cluster, whose executors read the files (the
paths must be readable from them). With ``--cluster-config`` the data files
are read from the nodes the config lists, over their DataFiles RPC
(:mod:`spark.nodes`): a cluster on several hosts is audited in place, the
executors calling the nodes with a node's or a super user's certificate
(by default the config's ``[tls]`` directory's ``admin``). Prints the checks and the verdict,
writes ``audit.json`` and ``audit.html`` into the report directory, and
exits with the verdict (:mod:`raftcoord.chaos.verdict`, which also holds the
run's fault report to its rule): 0 on PASS, 1 on FAIL, 2 on INCOMPLETE (a
check did not run or had nothing to judge, a fault kind asked for changed
nothing); 64 on a command line it cannot parse or inputs that are not a run's.

This module does not import pyspark until the audit runs, so that the rest of
the ``raftcoord`` command line starts fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from raftcoord.chaos.arguments import HISTORY_FILE
from raftcoord.chaos.verdict import EXIT_STATUS, EXIT_USAGE, UsageParser

if TYPE_CHECKING:
    from spark.nodes import Cluster


def parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="raftcoord audit", description="Spark exactly-once audit of a run")
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--cluster-dir", help="the cluster's data directory")
    where.add_argument(
        "--cluster-config",
        help="the cluster's config (cluster.toml): read the data files from its nodes",
    )
    for flag, what in (
        ("--ssl-cafile", "the cluster CA's certificate (default: the config's ca_file)"),
        ("--ssl-certfile", "a node's or super user's certificate (default: CERT_DIR/admin.pem)"),
        ("--ssl-keyfile", "its key (default: CERT_DIR/admin.key)"),
    ):
        p.add_argument(flag, help=f"with --cluster-config of a cluster with [tls]: {what}")
    p.add_argument(
        "--history",
        help="the workload's history.jsonl (docs/history.md); default CLUSTER_DIR/"
        f"{HISTORY_FILE} when it is there",
    )
    p.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    p.add_argument(
        "--report",
        help="directory for audit.json and audit.html (default CLUSTER_DIR/audit, "
        "or ./audit with --cluster-config)",
    )
    p.add_argument(
        "--shuffle-partitions",
        type=int,
        help="spark.sql.shuffle.partitions (default: this machine's cores)",
    )


def configure(p: argparse.ArgumentParser) -> None:
    """The arguments of ``raftcoord audit``."""
    add_arguments(p)
    p.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    """Run the audit from parsed arguments; returns the exit status."""
    cluster: Path | Cluster
    if args.cluster_config:
        history = Path(args.history).resolve() if args.history else None
        found = _network_inputs(args, history)
        if isinstance(found, str):
            print(f"raftcoord audit: {found}", file=sys.stderr)
            return EXIT_USAGE
        cluster = found
        report_dir = Path(args.report or "audit").resolve()
    else:
        cluster = Path(args.cluster_dir).resolve()
        history = history_of(cluster, args.history)
        if history is not None and not args.history:
            print(f"history: {history} (the workload's, in the cluster directory)")
        problem = _check_inputs(cluster, history)
        if problem is not None:
            print(f"raftcoord audit: {problem}", file=sys.stderr)
            return EXIT_USAGE
        report_dir = Path(args.report).resolve() if args.report else cluster / "audit"
    from rich.console import Console

    from spark.audit import run_audit, session
    from spark.report import print_table, print_verdict

    console = Console()
    spark = session(args.master, args.shuffle_partitions)
    try:
        outcome = run_audit(spark, cluster, history, report_dir, console)
    finally:
        spark.stop()
    print_table(outcome.results, console)
    if outcome.document["stats"].get("faults") == []:
        console.print("faults: none (the history records no fault)")
    print_verdict(outcome.document, console)
    console.print(f"audit: {outcome.seconds:.0f} s")
    print(f"report: {outcome.html_path}\njson:   {outcome.json_path}")
    return EXIT_STATUS[outcome.verdict]


def history_of(cluster_dir: Path, given: str | None) -> Path | None:
    """The history to audit: ``--history``, else the one ``raftcoord
    workload`` writes into the cluster directory (``history.jsonl``) when it
    is there, else None (the checks that need it are skipped)."""
    if given:
        return Path(given).resolve()
    written = cluster_dir / HISTORY_FILE
    return written if written.is_file() else None


def _check_inputs(cluster_dir: Path, history: Path | None) -> str | None:
    if not cluster_dir.is_dir():
        return f"--cluster-dir {cluster_dir} is not a directory"
    if not any(
        p.is_dir() and (p.name.startswith("partition-node-") or p.name.startswith("node-"))
        for p in cluster_dir.iterdir()
    ):
        return f"{cluster_dir} holds no node-N or partition-node-N directory: not a cluster dir"
    if history is not None and not history.is_file():
        return f"--history {history} is not a file"
    return None


def _network_inputs(args: argparse.Namespace, history: Path | None) -> Cluster | str:
    """The cluster ``--cluster-config`` names with the TLS files to call its
    nodes with, or why it cannot be audited."""
    from raftcoord.protocol.config import ConfigError, load_config
    from raftcoord.protocol.tls import ADMIN_CERT_NAME
    from spark.nodes import Cluster

    path = Path(args.cluster_config).resolve()
    try:
        config = load_config(path)
    except (OSError, ConfigError) as exc:
        return f"--cluster-config {path}: {exc}"
    if history is not None and not history.is_file():
        return f"--history {history} is not a file"
    given = (args.ssl_cafile, args.ssl_certfile, args.ssl_keyfile)
    if config.tls is None:
        if any(given):
            return f"--ssl-* given, but {path} has no [tls] table"
        return Cluster(path)
    ca, cert, key = (
        given[0] or config.tls.ca_file,
        given[1] or config.tls.cert_dir / f"{ADMIN_CERT_NAME}.pem",
        given[2] or config.tls.cert_dir / f"{ADMIN_CERT_NAME}.key",
    )
    for flag, file in (("--ssl-cafile", ca), ("--ssl-certfile", cert), ("--ssl-keyfile", key)):
        if not Path(file).is_file():
            return f"{flag} {file} is not a file ({path} has [tls]: a node's or super user's)"
    return Cluster(path, (str(ca), str(cert), str(key)))


def main(argv: list[str] | None = None) -> int:
    return command(parser().parse_args(argv))
