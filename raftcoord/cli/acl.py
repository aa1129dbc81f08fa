"""``raftcoord acl``: the cluster's ACLs, in the shape of Kafka's ``kafka-acls.sh``.

``add`` binds each principal (``--allow-principal``/``--deny-principal``)
to each ``--operation`` on each resource (``--topic``, ``--group``,
``--transactional-id``, ``--cluster``), LITERAL or PREFIXED
(``--resource-pattern-type``), from ``--host`` (any by default). ``list``
prints the bindings on the resources named (all without any), ``remove``
removes the bindings the same flags select (every principal, operation or
host when those flags are left out) and prints them. Errors are one line on
stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import product
from typing import TYPE_CHECKING

from raftcoord.cli.connection import add_connection_options, bootstrap, print_table, ssl_files
from raftcoord.protocol.acl import (
    CLUSTER_NAME,
    WILDCARD,
    Acl,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

if TYPE_CHECKING:  # the client is imported where it is used (--help needs none)
    from raftcoord.client import Admin

__all__ = ["configure"]

#: --operation's names, as kafka-acls.sh spells them.
OPERATIONS = {
    "All": Operation.ALL,
    "Read": Operation.READ,
    "Write": Operation.WRITE,
    "Create": Operation.CREATE,
    "Delete": Operation.DELETE,
    "Alter": Operation.ALTER,
    "Describe": Operation.DESCRIBE,
    "ClusterAction": Operation.CLUSTER_ACTION,
    "DescribeConfigs": Operation.DESCRIBE_CONFIGS,
    "AlterConfigs": Operation.ALTER_CONFIGS,
    "IdempotentWrite": Operation.IDEMPOTENT_WRITE,
    "TwoPhaseCommit": Operation.TWO_PHASE_COMMIT,
}
_PATTERNS = {
    "literal": PatternType.LITERAL,
    "prefixed": PatternType.PREFIXED,
    "match": PatternType.MATCH,
    "any": PatternType.ANY,
}
_COLUMNS = [
    ("Principal", "principal"),
    ("Permission", "permission"),
    ("Operation", "operation"),
    ("Resource", "resource_type"),
    ("Pattern", "pattern_type"),
    ("Name", "resource_name"),
    ("Host", "host"),
]


class AclCommandError(Exception):
    """A command that cannot be done as asked; the message says why."""


def configure(acl: argparse.ArgumentParser) -> None:
    """The arguments of ``raftcoord acl``."""
    sub = acl.add_subparsers(dest="acl_command", required=True)
    add = sub.add_parser("add", help="bind principals to operations on resources")
    listing = sub.add_parser("list", help="the bindings on the resources named (all by default)")
    remove = sub.add_parser("remove", help="remove the bindings the flags select")
    for p in (add, listing, remove):
        p.add_argument("--topic", action="append", default=[], help="a topic; repeatable")
        p.add_argument("--group", action="append", default=[], help="a consumer group; repeatable")
        p.add_argument(
            "--transactional-id", action="append", default=[], help="a transactional id; repeatable"
        )
        p.add_argument("--cluster", action="store_true", help="the cluster resource")
        p.add_argument(
            "--resource-pattern-type",
            choices=sorted(_PATTERNS),
            default=None,
            help="literal (default for add and remove) or prefixed; list and remove also "
            "take match (every binding that applies to the name) and any (list's default)",
        )
        add_connection_options(p)
    for p in (add, remove):
        p.add_argument("--allow-principal", action="append", default=[], metavar="User:NAME")
        p.add_argument("--deny-principal", action="append", default=[], metavar="User:NAME")
        p.add_argument(
            "--operation",
            action="append",
            default=[],
            choices=sorted(OPERATIONS),
            help="repeatable (add: at least one; remove: every one when left out)",
        )
        p.add_argument("--host", help=f"the client's address (add: {WILDCARD}, any)")
    listing.add_argument("--principal", help="only this principal's bindings")
    add.set_defaults(run=_add)
    listing.set_defaults(run=_list)
    remove.set_defaults(run=_remove)
    acl.set_defaults(func=_run)


def _resources(args: argparse.Namespace) -> list[tuple[ResourceType, str]]:
    named = [(ResourceType.TOPIC, t) for t in args.topic]
    named += [(ResourceType.GROUP, g) for g in args.group]
    named += [(ResourceType.TRANSACTIONAL_ID, x) for x in args.transactional_id]
    if args.cluster:
        named.append((ResourceType.CLUSTER, CLUSTER_NAME))
    return named


def _principals(args: argparse.Namespace) -> list[tuple[str, Permission]]:
    return [(p, Permission.ALLOW) for p in args.allow_principal] + [
        (p, Permission.DENY) for p in args.deny_principal
    ]


def _add(admin: Admin, args: argparse.Namespace) -> list[Acl]:
    resources, principals = _resources(args), _principals(args)
    if not resources or not principals or not args.operation:
        raise AclCommandError(
            "add needs a resource (--topic, --group, --transactional-id or --cluster), "
            "a principal (--allow-principal or --deny-principal) and an --operation"
        )
    pattern = _PATTERNS[args.resource_pattern_type or "literal"]
    if pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise AclCommandError("add takes --resource-pattern-type literal or prefixed")
    acls = [
        Acl(kind, pattern, name, principal, args.host or WILDCARD, OPERATIONS[op], permission)
        for (kind, name), (principal, permission), op in product(
            resources, principals, args.operation
        )
    ]
    admin.create_acls(acls)
    return acls


def _list(admin: Admin, args: argparse.Namespace) -> list[Acl]:
    pattern = _PATTERNS[args.resource_pattern_type or "any"]
    filters = [
        AclFilter(kind, pattern, name, args.principal) for kind, name in _resources(args)
    ] or [AclFilter(principal=args.principal)]
    found: dict[Acl, None] = {}
    for acl_filter in filters:
        found.update(dict.fromkeys(admin.describe_acls(acl_filter)))
    return list(found)


def _remove(admin: Admin, args: argparse.Namespace) -> list[Acl]:
    resources = _resources(args)
    if not resources:
        raise AclCommandError(
            "remove needs a resource (--topic, --group, --transactional-id or --cluster)"
        )
    pattern = _PATTERNS[args.resource_pattern_type or "literal"]
    principals: list[tuple[str | None, Permission]] = list(_principals(args)) or [
        (None, Permission.ANY)
    ]
    operations = [OPERATIONS[op] for op in args.operation] or [Operation.ANY]
    filters = [
        AclFilter(kind, pattern, name, principal, args.host, operation, permission)
        for (kind, name), (principal, permission), operation in product(
            resources, principals, operations
        )
    ]
    return [acl for removed in admin.delete_acls(filters) for acl in removed]


def _row(acl: Acl) -> dict[str, str]:
    return {
        "principal": acl.principal,
        "permission": acl.permission.name,
        "operation": acl.operation.name,
        "resource_type": acl.resource_type.name,
        "pattern_type": acl.pattern_type.name,
        "resource_name": acl.resource_name,
        "host": acl.host,
    }


def _run(args: argparse.Namespace) -> int:
    from raftcoord.client import Admin, KafkaError
    from raftcoord.cluster.launcher import ClusterError

    try:
        timeout_ms = int(args.timeout * 1000)
        with Admin(bootstrap(args), request_timeout_ms=timeout_ms, **ssl_files(args)) as admin:
            acls = args.run(admin, args)
    except (KafkaError, AclCommandError, ClusterError, ValueError) as exc:
        print(f"raftcoord acl {args.acl_command}: {exc}", file=sys.stderr)
        return 1
    rows = [_row(a) for a in sorted(acls, key=Acl.to_wire)]
    if args.json:
        print(json.dumps(rows, indent=2))
    elif args.acl_command == "list" or rows:
        print_table(rows, _COLUMNS)
    else:
        print(f"raftcoord acl {args.acl_command}: no binding matched")
    return 0
