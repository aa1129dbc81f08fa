"""``raftcoord txn``: transactions and hanging transactions, as Kafka's
``kafka-transactions.sh`` (KIP-664).

A *hanging* transaction is open on a partition while no coordinator will ever
write its marker there: the coordinator does not know the partition is in the
transaction (or has forgotten the transaction), so the partition's last stable
offset stays at the transaction's first offset and read_committed consumers
never get past it. ``find-hanging`` looks for them; ``abort`` ends one by
writing an ABORT marker straight to the partition.

Every command prints a table (rich; ``describe`` one ``header: value`` line
per column instead), or JSON with ``--json``. Errors are one
line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from raftcoord.cli.connection import add_connection_options, run_rows_command

if TYPE_CHECKING:  # the others import the client where they use it (--help needs none)
    from raftcoord.client import Admin

__all__ = ["configure"]

#: find-hanging's default --max-transaction-timeout (Kafka's, and
#: transaction.max.timeout.ms's default), in minutes.
DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN = 15
#: What a command that found nothing says instead of an empty table.
NOTHING_FOUND = {
    "list": "no transactional id matches",
    "describe-producers": "no producer has state on the partition",
    "find-hanging": "no hanging transaction",
}


class TxnCommandError(Exception):
    """A command that cannot be done as asked; the message says why."""


# --- commands -----------------------------------------------------------------------


def _list(admin: Admin, args: argparse.Namespace) -> Any:
    listings = admin.list_transactions(
        states=args.state or (),
        producer_ids=[args.producer_id] if args.producer_id is not None else (),
        min_duration_ms=args.min_duration,
    )
    rows = [asdict(t) for t in listings]
    columns = [
        ("TransactionalId", "transactional_id"),
        ("ProducerId", "producer_id"),
        ("TransactionState", "state"),
        ("TransactionDurationMs", "duration_ms"),
    ]
    return rows, columns


def _describe(admin: Admin, args: argparse.Namespace) -> Any:
    description = admin.describe_transactions([args.transactional_id])[args.transactional_id]
    coordinator = admin.find_coordinator(args.transactional_id)
    start = description.transaction_start_time_ms
    row = {
        "coordinator": coordinator,
        "transactional_id": description.transactional_id,
        "producer_id": description.producer_id,
        "producer_epoch": description.producer_epoch,
        "state": description.state,
        "transaction_timeout_ms": description.transaction_timeout_ms,
        "transaction_start_time_ms": start,
        "transaction_duration_ms": _now_ms() - start if start >= 0 else -1,
        "topic_partitions": [f"{t}-{p}" for t, p in sorted(description.partitions)],
        "pending_markers": [str(m) for m in description.pending_markers],
        "two_phase_commit": description.two_phase_commit,
        "ongoing_txn_producer": (
            f"{description.ongoing_txn_producer_id}/{description.ongoing_txn_producer_epoch}"
            if description.ongoing_txn_producer_id >= 0
            else "-"
        ),
    }
    columns = [
        ("Coordinator", "coordinator"),
        ("TransactionalId", "transactional_id"),
        ("ProducerId", "producer_id"),
        ("ProducerEpoch", "producer_epoch"),
        ("TransactionState", "state"),
        ("TransactionTimeoutMs", "transaction_timeout_ms"),
        ("CurrentTransactionStartTimeMs", "transaction_start_time_ms"),
        ("TransactionDurationMs", "transaction_duration_ms"),
        ("TopicPartitions", "topic_partitions"),
        ("PendingMarkers", "pending_markers"),
        ("TwoPhaseCommit", "two_phase_commit"),
        ("OngoingTxnProducer", "ongoing_txn_producer"),
    ]
    return [row], columns


def _describe_producers(admin: Admin, args: argparse.Namespace) -> Any:
    from raftcoord.client import TopicPartition

    tp = TopicPartition(args.topic, args.partition)
    rows = [asdict(p) for p in admin.describe_producers([tp])[tp]]
    columns = [
        ("ProducerId", "producer_id"),
        ("ProducerEpoch", "producer_epoch"),
        ("LatestCoordinatorEpoch", "coordinator_epoch"),
        ("LastSequence", "last_sequence"),
        ("LastTimestamp", "last_timestamp_ms"),
        ("CurrentTransactionStartOffset", "current_transaction_start_offset"),
    ]
    return rows, columns


def _find_hanging(admin: Admin, args: argparse.Namespace) -> Any:
    from raftcoord.client import TopicPartition
    from raftcoord.client.hanging import find_hanging

    if args.partition is not None and args.topic is None:
        raise TxnCommandError("--partition needs --topic")
    if args.max_transaction_timeout < 0:
        raise TxnCommandError("--max-transaction-timeout must be >= 0 minutes")
    topics = admin.list_topics()
    if args.topic is not None and args.topic not in topics:
        raise TxnCommandError(f"no topic {args.topic!r}")
    if args.partition is not None:
        partitions = [TopicPartition(args.topic, args.partition)]
    else:
        chosen = [args.topic] if args.topic is not None else sorted(topics)
        partitions = [TopicPartition(t, p) for t in chosen for p in range(topics[t])]
    now_ms = _now_ms()
    max_timeout_ms = args.max_transaction_timeout * 60_000
    hanging = find_hanging(admin, admin.describe_producers(partitions), now_ms, max_timeout_ms)
    rows = [
        {
            "topic": t.topic_partition.topic,
            "partition": t.topic_partition.partition,
            "producer_id": t.producer.producer_id,
            "producer_epoch": t.producer.producer_epoch,
            "coordinator_epoch": t.producer.coordinator_epoch,
            "start_offset": t.producer.current_transaction_start_offset,
            "last_timestamp_ms": t.producer.last_timestamp_ms,
            "duration_min": (now_ms - t.producer.last_timestamp_ms) // 60_000,
        }
        for t in hanging
    ]
    columns = [
        ("Topic", "topic"),
        ("Partition", "partition"),
        ("ProducerId", "producer_id"),
        ("ProducerEpoch", "producer_epoch"),
        ("CoordinatorEpoch", "coordinator_epoch"),
        ("StartOffset", "start_offset"),
        ("LastTimestamp", "last_timestamp_ms"),
        ("Duration(min)", "duration_min"),
    ]
    return rows, columns


def _abort(admin: Admin, args: argparse.Namespace) -> Any:
    from raftcoord.client import AbortTransactionSpec, TopicPartition

    tp = TopicPartition(args.topic, args.partition)
    given = [args.producer_id, args.producer_epoch, args.coordinator_epoch]
    if args.start_offset is not None:
        if any(v is not None for v in given):
            raise TxnCommandError(
                "give either --start-offset or --producer-id, --producer-epoch and "
                "--coordinator-epoch"
            )
        producers = admin.describe_producers([tp])[tp]
        match = [p for p in producers if p.current_transaction_start_offset == args.start_offset]
        if not match:
            raise TxnCommandError(
                f"no open transaction starts at offset {args.start_offset} on "
                f"{tp.topic}-{tp.partition}"
            )
        producer = match[0]
        spec = AbortTransactionSpec(
            tp, producer.producer_id, producer.producer_epoch, max(0, producer.coordinator_epoch)
        )
    else:
        missing = [
            f"--{name.replace('_', '-')}"
            for name in ("producer_id", "producer_epoch")
            if getattr(args, name) is None
        ]
        if missing:
            raise TxnCommandError(f"give --start-offset, or {', '.join(missing)} as well")
        coordinator_epoch = args.coordinator_epoch
        if coordinator_epoch is None:  # the one the partition has for the producer
            known = [
                p for p in admin.describe_producers([tp])[tp] if p.producer_id == args.producer_id
            ]
            if not known:
                raise TxnCommandError(
                    f"producer {args.producer_id} has no state on {tp.topic}-{tp.partition}: "
                    "give --coordinator-epoch"
                )
            coordinator_epoch = max(0, known[0].coordinator_epoch)
        spec = AbortTransactionSpec(tp, args.producer_id, args.producer_epoch, coordinator_epoch)
    admin.abort_transaction(spec)
    row = {
        "topic": tp.topic,
        "partition": tp.partition,
        "producer_id": spec.producer_id,
        "producer_epoch": spec.producer_epoch,
        "coordinator_epoch": spec.coordinator_epoch,
    }
    columns = [
        ("Topic", "topic"),
        ("Partition", "partition"),
        ("ProducerId", "producer_id"),
        ("ProducerEpoch", "producer_epoch"),
        ("CoordinatorEpoch", "coordinator_epoch"),
    ]
    return [row], columns


def _force_terminate(admin: Admin, args: argparse.Namespace) -> Any:
    description = admin.force_terminate_transaction(args.transactional_id)
    row = {
        "transactional_id": description.transactional_id,
        "state": description.state,
        "producer_id": description.producer_id,
        "producer_epoch": description.producer_epoch,
    }
    columns = [
        ("TransactionalId", "transactional_id"),
        ("TransactionState", "state"),
        ("ProducerId", "producer_id"),
        ("ProducerEpoch", "producer_epoch"),
    ]
    return [row], columns


def _state(name: str) -> str:
    """A transaction state's name, as ``--state`` takes it."""
    from raftcoord.client.admin import TRANSACTION_STATES

    if name not in TRANSACTION_STATES.values():
        names = ", ".join(sorted(TRANSACTION_STATES.values()))
        raise argparse.ArgumentTypeError(f"{name!r} is not a state (one of {names})")
    return name


def _now_ms() -> int:
    return int(time.time() * 1000)


# --- command line -------------------------------------------------------------------


def configure(txn: argparse.ArgumentParser) -> None:
    """The arguments of ``raftcoord txn``."""
    sub = txn.add_subparsers(dest="txn_command", required=True)
    listing = sub.add_parser("list", help="the transactional ids the coordinators know")
    listing.add_argument(
        "--state",
        action="append",
        type=_state,
        help="only transactions in this state (Kafka's name: Ongoing, PrepareCommit, "
        "CompleteAbort, ...); repeatable",
    )
    listing.add_argument(
        "--min-duration", type=int, default=-1, metavar="MS", help="only those open longer"
    )
    listing.add_argument("--producer-id", type=int, help="only this producer id")
    listing.set_defaults(run=_list)
    describe = sub.add_parser("describe", help="the coordinator's state of a transactional id")
    describe.add_argument("transactional_id", metavar="ID")
    describe.set_defaults(run=_describe)
    producers = sub.add_parser(
        "describe-producers", help="the producers of a partition and their open transactions"
    )
    producers.add_argument("topic", metavar="TOPIC")
    producers.add_argument("partition", metavar="PARTITION", type=int)
    producers.set_defaults(run=_describe_producers)
    hanging = sub.add_parser(
        "find-hanging",
        help="open transactions that no coordinator will end (they hold the LSO back)",
    )
    hanging.add_argument("--topic", help="only this topic (default: every topic)")
    hanging.add_argument("--partition", type=int, help="only this partition of --topic")
    hanging.add_argument(
        "--max-transaction-timeout",
        type=int,
        default=DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN,
        metavar="MINUTES",
        help="only transactions whose producer has written nothing for longer than this "
        f"(the longest transaction timeout; default {DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN})",
    )
    hanging.set_defaults(run=_find_hanging)
    abort = sub.add_parser(
        "abort",
        help="abort a hanging transaction: write an ABORT marker to its partition",
    )
    abort.add_argument("--topic", required=True)
    abort.add_argument("--partition", type=int, required=True)
    abort.add_argument(
        "--start-offset",
        type=int,
        help="the transaction's first offset (find-hanging's StartOffset)",
    )
    abort.add_argument("--producer-id", type=int)
    abort.add_argument("--producer-epoch", type=int, help="the epoch of the transaction's data")
    abort.add_argument(
        "--coordinator-epoch",
        type=int,
        help="default: the one the partition holds for the producer (a higher one than any "
        "leader of the shards had is refused)",
    )
    abort.set_defaults(run=_abort)
    terminate = sub.add_parser(
        "force-terminate",
        help="abort a transactional id's open transaction and fence its producer (a prepared "
        "two-phase commit transaction never times out)",
    )
    terminate.add_argument("transactional_id", metavar="ID")
    terminate.set_defaults(run=_force_terminate)
    for p in (listing, describe, producers, hanging, abort, terminate):
        add_connection_options(p)
    txn.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return run_rows_command(
        args, "txn", args.run, TxnCommandError, NOTHING_FOUND, records=frozenset({"describe"})
    )
