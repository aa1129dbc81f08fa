"""``raftcoord console``: serve the read-only web console of a cluster
(:mod:`raftcoord.console`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from raftcoord.chaos.arguments import positive_seconds
from raftcoord.cli.connection import add_connection_options, bootstrap, ssl_files
from raftcoord.protocol.process import exit_with_watched_process

__all__ = ["configure", "connection_options"]

#: find-hanging's default --max-transaction-timeout, in minutes (Kafka's).
DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN = 15


def configure(console: argparse.ArgumentParser) -> None:
    """The arguments of ``raftcoord console``."""
    console.description = (
        "Serve a read-only web console of a cluster: its coordinators and each shard's "
        "leader, the partition-log nodes, topics with their log end and last stable offsets, "
        "transactions (hanging ones highlighted, with the command that ends them), producers, "
        "consumer groups and the audit reports in the cluster directory. The pages refresh "
        "themselves; the console asks the cluster through the client library only."
    )
    add_connection_options(console, json_output=False, timeout_s=5.0)
    console.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    console.add_argument(
        "--port", type=int, default=8080, help="port to listen on; 0: a free one (default: 8080)"
    )
    console.add_argument(
        "--refresh",
        type=positive_seconds,
        default=2.0,
        metavar="SECONDS",
        help="how often the cluster is asked and the pages refresh (default: %(default)s)",
    )
    console.add_argument(
        "--max-transaction-timeout",
        type=int,
        default=DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN,
        metavar="MINUTES",
        help="a transaction is hanging once its producer has written nothing to the partition "
        "for longer than this, as with txn find-hanging (default: %(default)s)",
    )
    console.add_argument(
        "--group",
        action="append",
        default=[],
        metavar="GROUP",
        help=(
            "a consumer group to show first (repeatable); every group the coordinators "
            "list is shown"
        ),
    )
    console.set_defaults(func=_run)


def connection_options(args: argparse.Namespace) -> list[str]:
    """The options of a ``raftcoord txn`` command that reach the cluster the
    console reaches (shown in the commands the console suggests)."""
    if not args.bootstrap_server:
        return ["--cluster-dir", args.cluster_dir]
    given = ["--bootstrap-server", args.bootstrap_server]
    for flag in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        value = getattr(args, flag)
        if value is not None:
            given += [f"--{flag.replace('_', '-')}", value]
    return given


def _run(args: argparse.Namespace) -> int:
    from raftcoord.cluster.launcher import ClusterError
    from raftcoord.console.collect import ConsoleOptions
    from raftcoord.console.server import ConsoleError, serve

    if args.max_transaction_timeout < 0:
        print("raftcoord console: --max-transaction-timeout must be >= 0", file=sys.stderr)
        return 2
    if args.timeout <= 0:
        print("raftcoord console: --timeout must be > 0", file=sys.stderr)
        return 2
    try:
        addresses = bootstrap(args)
        tls = ssl_files(args)
    except (ClusterError, ValueError) as exc:
        print(f"raftcoord console: {exc}", file=sys.stderr)
        return 1
    cluster_dir = Path(args.cluster_dir)
    options = ConsoleOptions(
        bootstrap=addresses,
        ssl_cafile=tls.get("ssl_cafile"),
        ssl_certfile=tls.get("ssl_certfile"),
        ssl_keyfile=tls.get("ssl_keyfile"),
        refresh_s=args.refresh,
        request_timeout_ms=int(args.timeout * 1000),
        max_transaction_timeout_ms=args.max_transaction_timeout * 60_000,
        groups=tuple(args.group),
        cluster_dir=cluster_dir.resolve() if cluster_dir.is_dir() else None,
        connection=connection_options(args),
    )
    exit_with_watched_process()  # a test session's console ends with it
    try:
        return serve(options, args.host, args.port)
    except ConsoleError as exc:
        print(f"raftcoord console: {exc}", file=sys.stderr)
        return 1
