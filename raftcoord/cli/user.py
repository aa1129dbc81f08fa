"""``raftcoord user``: the SASL/SCRAM users of the Kafka gateways' SASL_SSL
listeners (Kafka's ``kafka-configs.sh --entity-type users``).

``add`` sets a user's password for a mechanism (SCRAM-SHA-256 by default;
the same credential serves SASL PLAIN), read from ``--password-file`` (``-``:
standard input) or asked for on the terminal, never from the command line;
``list`` prints each user's mechanisms; ``remove`` deletes one. Errors are
one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raftcoord.cli.connection import add_connection_options, bootstrap, print_table, ssl_files
from raftcoord.protocol.scram import MECHANISMS

if TYPE_CHECKING:  # the client is imported where it is used (--help needs none)
    from raftcoord.client import Admin

__all__ = ["configure"]


_COLUMNS = [("User", "user"), ("Mechanism", "mechanism"), ("Iterations", "iterations")]


class UserCommandError(Exception):
    """A command that cannot be done as asked; the message says why."""


def configure(user: argparse.ArgumentParser) -> None:
    """The arguments of ``raftcoord user``."""
    sub = user.add_subparsers(dest="user_command", required=True)
    add = sub.add_parser("add", help="set a user's password (SCRAM, and PLAIN against it)")
    listing = sub.add_parser("list", help="every user's mechanisms")
    remove = sub.add_parser("remove", help="remove a user's credential of one mechanism")
    for p in (add, remove):
        p.add_argument("--name", required=True, help="the user (principal User:<name>)")
        p.add_argument(
            "--mechanism",
            choices=sorted(MECHANISMS),
            default="SCRAM-SHA-256",
            help="(SCRAM-SHA-256)",
        )
    add.add_argument(
        "--password-file",
        help="a file holding the password on its first line ('-': standard input); "
        "without it the password is asked for on the terminal",
    )
    add.add_argument(
        "--iterations", type=int, help="PBKDF2 iterations (default: the admin client's)"
    )
    for p in (add, listing, remove):
        add_connection_options(p)
    add.set_defaults(run=_add)
    listing.set_defaults(run=_list)
    remove.set_defaults(run=_remove)
    user.set_defaults(func=_run)


def _password(args: argparse.Namespace) -> str:
    if args.password_file == "-":
        text = sys.stdin.readline()
    elif args.password_file is not None:
        lines = Path(args.password_file).read_text().splitlines()
        text = lines[0] if lines else ""
    else:
        text = getpass.getpass(f"password for {args.name}: ")
    password = text.rstrip("\r\n")
    if not password:
        raise UserCommandError("the password must not be empty")
    return password


def _add(admin: Admin, args: argparse.Namespace) -> list[dict[str, Any]]:
    from raftcoord.client.admin import DEFAULT_SCRAM_ITERATIONS

    iterations = DEFAULT_SCRAM_ITERATIONS if args.iterations is None else args.iterations
    admin.upsert_scram_credential(args.name, args.mechanism, _password(args), iterations)
    return [{"user": args.name, "mechanism": args.mechanism, "iterations": iterations}]


def _list(admin: Admin, args: argparse.Namespace) -> list[dict[str, Any]]:
    return [
        {"user": user, "mechanism": mechanism, "iterations": iterations}
        for user, mechanisms in sorted(admin.describe_scram_credentials().items())
        for mechanism, iterations in sorted(mechanisms.items())
    ]


def _remove(admin: Admin, args: argparse.Namespace) -> list[dict[str, Any]]:
    admin.delete_scram_credential(args.name, args.mechanism)
    return [{"user": args.name, "mechanism": args.mechanism, "iterations": "-"}]


def _run(args: argparse.Namespace) -> int:
    from raftcoord.client import Admin, KafkaError
    from raftcoord.cluster.launcher import ClusterError

    try:
        timeout_ms = int(args.timeout * 1000)
        with Admin(bootstrap(args), request_timeout_ms=timeout_ms, **ssl_files(args)) as admin:
            rows = args.run(admin, args)
    except (KafkaError, UserCommandError, ClusterError, OSError, ValueError) as exc:
        print(f"raftcoord user {args.user_command}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(
            rows, [("User", "user"), ("Mechanism", "mechanism"), ("Iterations", "iterations")]
        )
    return 0
