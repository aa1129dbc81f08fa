"""What the admin commands (``raftcoord txn``, ``topic``, ``acl``, ``user``)
share: how they find and reach the coordinators, and how they print rows.

The client library, the launcher and rich are imported by the functions that
use them, not by the module: ``raftcoord txn describe --help`` (and every
other subcommand's help) is answered without loading gRPC and cryptography.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raftcoord.client import Admin
    from raftcoord.protocol.tls import SslFiles

#: What a command returns: its rows, and the table's (header, key) columns.
Rows = tuple[list[dict[str, Any]], list[tuple[str, str]]]


def add_connection_options(
    parser: argparse.ArgumentParser, json_output: bool = True, timeout_s: float = 30.0
) -> None:
    """--cluster-dir or --bootstrap-server, the TLS files, --json (unless not
    ``json_output``), --timeout (default ``timeout_s``)."""
    parser.add_argument(
        "--cluster-dir",
        default=".raftcoord",
        help="a `raftcoord cluster up` data dir, to find the coordinators (.raftcoord)",
    )
    parser.add_argument(
        "--bootstrap-server",
        type=addresses,
        help="comma-separated coordinator addresses (host:port), instead of --cluster-dir",
    )
    for flag, what in (
        ("--ssl-cafile", "the cluster CA's certificate"),
        ("--ssl-certfile", "this client's certificate"),
        ("--ssl-keyfile", "this client's key"),
    ):
        parser.add_argument(
            flag,
            help=f"a cluster with TLS: {what} (PEM); with --cluster-dir of a `cluster up "
            "--tls` cluster, its admin certificate by default",
        )
    if json_output:
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--timeout", type=float, default=timeout_s, help=f"seconds for each request ({timeout_s:g})"
    )


def addresses(text: str) -> str:
    """``--bootstrap-server``'s value, refused (a usage error) when it names no address."""
    if not any(a.strip() for a in text.split(",")):
        raise argparse.ArgumentTypeError(
            f"{text!r} names no address (give host:port,... or leave the option out "
            "to use --cluster-dir)"
        )
    return text


def bootstrap(args: argparse.Namespace) -> list[str]:
    """The coordinators' addresses: --bootstrap-server, else the local cluster's."""
    if args.bootstrap_server is not None:
        return [a.strip() for a in args.bootstrap_server.split(",") if a.strip()]
    from raftcoord.cluster.launcher import LocalCluster

    return LocalCluster(args.cluster_dir).bootstrap()


def ssl_files(args: argparse.Namespace) -> SslFiles:
    """The client's TLS files: the ones given, else a local TLS cluster's admin's."""
    from raftcoord.cluster.launcher import TLS_ADMIN, LocalCluster
    from raftcoord.protocol.tls import SslFiles

    given = SslFiles()
    if args.ssl_cafile is not None:
        given["ssl_cafile"] = args.ssl_cafile
    if args.ssl_certfile is not None:
        given["ssl_certfile"] = args.ssl_certfile
    if args.ssl_keyfile is not None:
        given["ssl_keyfile"] = args.ssl_keyfile
    if given or args.bootstrap_server:
        return given
    return LocalCluster(args.cluster_dir).client_tls(TLS_ADMIN)


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> None:
    """``rows`` as a table of ``columns`` (header, key) on stdout, never
    wrapped (:func:`~raftcoord.chaos.tables.print_unwrapped`)."""
    from rich.console import Console
    from rich.table import Table

    from raftcoord.chaos.tables import print_unwrapped

    table = Table(*(header for header, _ in columns))
    for row in rows:
        table.add_row(*(_cell(row[key]) for _, key in columns))
    print_unwrapped(Console(), table)


def print_record(row: Mapping[str, Any], columns: Sequence[tuple[str, str]]) -> None:
    """One row as ``header: value`` lines, the values aligned (what a table
    of many columns for one row would cut)."""
    width = max(len(header) for header, _ in columns)
    for header, key in columns:
        print(f"{header + ':':<{width + 1}} {_cell(row[key])}")


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def run_rows_command(
    args: argparse.Namespace,
    name: str,
    run: Callable[[Admin, argparse.Namespace], Rows],
    refusal: type[Exception],
    nothing_found: Mapping[str, str],
    records: frozenset[str] = frozenset(),
) -> int:
    """Run ``run`` (a subcommand of ``raftcoord NAME``, ``args.<name>_command``)
    with an Admin client and print its rows: JSON with ``--json``, else a
    table (for the subcommands in ``records``, which answer one row, its
    ``header: value`` lines), or the subcommand's ``nothing_found`` line when
    it found none. A failure is one line on stderr and exit status 1."""
    from raftcoord.client import Admin, KafkaError
    from raftcoord.cluster.launcher import ClusterError

    command = getattr(args, f"{name}_command")
    try:
        timeout_ms = int(args.timeout * 1000)
        with Admin(bootstrap(args), request_timeout_ms=timeout_ms, **ssl_files(args)) as admin:
            rows, columns = run(admin, args)
    except (KafkaError, refusal, ClusterError, ValueError) as exc:
        print(f"raftcoord {name} {command}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows and command in nothing_found:
        print(nothing_found[command])
        return 0
    if command in records and len(rows) == 1:
        print_record(rows[0], columns)
    else:
        print_table(rows, columns)
    return 0
