"""``raftcoord topic``: create, list and describe topics, as Kafka's
``kafka-topics.sh``.

``describe [TOPIC]`` (or ``--topic TOPIC``) prints one row per partition in
kafka-topics.sh's shape (topic, partition, leader, leader epoch, replicas,
ISR), with
``--under-replicated-partitions`` or ``--unavailable-partitions`` only
those. Every command prints a table (rich), or JSON with ``--json``. Errors
are one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from raftcoord.cli.connection import add_connection_options, run_rows_command

if TYPE_CHECKING:  # the client is imported where it is used (--help needs none)
    from raftcoord.client import Admin

__all__ = ["configure"]

#: What a command that found nothing says instead of an empty table.
NOTHING_FOUND = {"describe": "no partition matches"}
#: The only topic config CreateTopics takes.
MIN_INSYNC_REPLICAS = "min.insync.replicas"


class TopicCommandError(Exception):
    """A command that cannot be done as asked; the message says why."""


def _create(admin: Admin, args: argparse.Namespace) -> Any:
    configs = dict(_config(c) for c in args.config or ())
    unknown = sorted(set(configs) - {MIN_INSYNC_REPLICAS})
    if unknown:
        raise TopicCommandError(f"unknown config {unknown[0]!r} (only {MIN_INSYNC_REPLICAS})")
    min_insync = configs.get(MIN_INSYNC_REPLICAS)
    admin.create_topics(
        {args.topic: args.partitions},
        replication_factor=args.replication_factor,
        min_insync_replicas=None if min_insync is None else _positive(min_insync),
    )
    return [{"topic": args.topic, "partitions": args.partitions}], [
        ("Topic", "topic"),
        ("PartitionCount", "partitions"),
    ]


def _list(admin: Admin, args: argparse.Namespace) -> Any:
    rows = [{"topic": name, "partitions": n} for name, n in admin.list_topics().items()]
    return rows, [("Topic", "topic"), ("PartitionCount", "partitions")]


def _describe(admin: Admin, args: argparse.Namespace) -> Any:
    from raftcoord.client.errors import UnknownTopicOrPartitionError

    if args.name is not None and args.topic is not None and args.name != args.topic:
        raise TopicCommandError(f"two topics given: {args.name!r} and --topic {args.topic!r}")
    name = args.name if args.name is not None else args.topic
    try:
        described = admin.describe_topics([name] if name else [])
    except UnknownTopicOrPartitionError:
        raise TopicCommandError(f"topic {name!r} does not exist") from None
    rows = []
    for topic in described.values():
        for p in topic.partitions:
            if args.under_replicated_partitions and not p.under_replicated:
                continue
            if args.unavailable_partitions and p.leader >= 0:
                continue
            rows.append(
                {
                    "topic": topic.name,
                    "partition": p.partition,
                    "leader": p.leader,
                    "leader_epoch": p.leader_epoch,
                    "replicas": list(p.replicas),
                    "isr": list(p.isr),
                    "replication_factor": topic.replication_factor,
                    "min_insync_replicas": topic.min_insync_replicas,
                }
            )
    columns = [
        ("Topic", "topic"),
        ("Partition", "partition"),
        ("Leader", "leader"),
        ("LeaderEpoch", "leader_epoch"),
        ("Replicas", "replicas"),
        ("Isr", "isr"),
        ("ReplicationFactor", "replication_factor"),
        ("MinInsyncReplicas", "min_insync_replicas"),
    ]
    return rows, columns


def _config(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep:
        raise TopicCommandError(f"--config {text!r}: expected NAME=VALUE")
    return name.strip(), value.strip()


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise TopicCommandError(f"{MIN_INSYNC_REPLICAS} {text!r} is not a number") from None
    if value < 1:
        raise TopicCommandError(f"{MIN_INSYNC_REPLICAS} must be at least 1, got {value}")
    return value


def configure(topic: argparse.ArgumentParser) -> None:
    """The arguments of ``raftcoord topic``."""
    sub = topic.add_subparsers(dest="topic_command", required=True)
    create = sub.add_parser("create", help="create a topic")
    create.add_argument("topic", metavar="TOPIC")
    create.add_argument("--partitions", type=int, required=True)
    create.add_argument(
        "--replication-factor", type=int, help="replicas per partition (the cluster's default)"
    )
    create.add_argument(
        "--config",
        action="append",
        metavar="NAME=VALUE",
        help=f"a topic config; only {MIN_INSYNC_REPLICAS}",
    )
    create.set_defaults(run=_create)
    listing = sub.add_parser("list", help="every topic and its partition count")
    listing.set_defaults(run=_list)
    describe = sub.add_parser(
        "describe", help="each partition's leader, leader epoch, replicas and in-sync replicas"
    )
    describe.add_argument(
        "name", nargs="?", metavar="TOPIC", help="only this topic (default: every topic)"
    )
    describe.add_argument("--topic", help="the same, as kafka-topics.sh takes it")
    only = describe.add_mutually_exclusive_group()
    only.add_argument(
        "--under-replicated-partitions",
        action="store_true",
        help="only partitions with fewer in-sync replicas than replicas",
    )
    only.add_argument(
        "--unavailable-partitions", action="store_true", help="only partitions without a leader"
    )
    describe.set_defaults(run=_describe)
    for p in (create, listing, describe):
        add_connection_options(p)
    topic.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return run_rows_command(args, "topic", args.run, TopicCommandError, NOTHING_FOUND)
