"""Consume-transform-produce, exactly once.

Reads an input topic (read_committed), writes a transformed copy of every
record to an output topic, and commits the consumed offsets in the same
transaction (send_offsets_to_transaction). If the worker dies at any point
and a new one starts with the same transactional.id, init_transactions
fences the old one and aborts its open transaction; the new worker resumes
from the committed offsets, so every input record appears in the output
exactly once.

Run against a local cluster (`raftcoord cluster up`)::

    python examples/consume_transform_produce.py --cluster-dir .raftcoord \\
        --input input --output output --group copier

Topics that do not exist are created first (the output with the input's
partition count). ``--fill N`` first writes N records to the input (one
transaction); without it an input created here is empty, so the run copies
nothing and says so::

    python examples/consume_transform_produce.py --cluster-dir .raftcoord --fill 100
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from raftcoord.client import (
    Admin,
    Consumer,
    TopicPartition,
    TransactionAbortableError,
    TransactionalProducer,
)
from raftcoord.protocol.tls import SslFiles


def transform(value: bytes) -> bytes:
    return b"copied:" + value


def copy_topic(
    bootstrap: Sequence[str],
    input_topic: str,
    output_topic: str,
    group: str,
    transactional_id: str,
    records_per_transaction: int = 20,
    die_in_transaction: int | None = None,
    on_commit: Callable[[int], None] | None = None,
    tls: SslFiles | None = None,
) -> int:
    """Copy until the input is drained; returns how many records were copied.

    ``die_in_transaction``: kill this process with SIGKILL in the middle of
    that transaction (1-based), after its records were sent and its offsets
    added, before the commit. ``on_commit`` is told the running count.
    ``tls``: the clients' TLS files for a cluster with TLS (``ssl_cafile``...).
    """
    tls = tls or SslFiles()
    with Admin(bootstrap, **tls) as admin:
        partitions = [
            TopicPartition(input_topic, p) for p in range(admin.list_topics()[input_topic])
        ]
    copied = 0
    with (
        TransactionalProducer(bootstrap, transactional_id=transactional_id, **tls) as producer,
        Consumer(bootstrap, group_id=group, isolation_level="read_committed", **tls) as consumer,
    ):
        # First fence any older worker with this transactional.id (its open
        # transaction is aborted), then start from the group's committed offsets.
        producer.init_transactions()
        consumer.assign(partitions)
        transactions = 0
        while True:
            ends = consumer.end_offsets(partitions)
            if all(consumer.position(tp) >= ends[tp] for tp in partitions):
                return copied
            polled = consumer.poll(timeout_ms=500)
            records, untaken = polled[:records_per_transaction], polled[records_per_transaction:]
            if not records:
                continue
            transactions += 1
            producer.begin_transaction()
            try:
                offsets: dict[TopicPartition, int] = {}
                for record in records:
                    producer.send(
                        output_topic, key=record.key, value=transform(record.value or b"")
                    )
                    offsets[TopicPartition(record.topic, record.partition)] = record.offset + 1
                producer.send_offsets_to_transaction(offsets, group)
                if transactions == die_in_transaction:
                    producer.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
                producer.commit_transaction()
            except TransactionAbortableError:
                producer.abort_transaction()
                for tp in partitions:  # rewind to what is committed
                    committed = consumer.committed(tp)
                    consumer.seek(tp, committed if committed is not None else 0)
                continue
            # Records polled but not taken are read again by the next poll.
            rewind: dict[TopicPartition, int] = {}
            for record in untaken:
                rewind.setdefault(TopicPartition(record.topic, record.partition), record.offset)
            for tp, offset in rewind.items():
                consumer.seek(tp, offset)
            copied += len(records)
            if on_commit is not None:
                on_commit(copied)


def fill(bootstrap: Sequence[str], topic: str, count: int, tls: SslFiles | None = None) -> None:
    """Write ``count`` records (``record-0``, ...) to ``topic`` in one transaction."""
    with TransactionalProducer(
        bootstrap, transactional_id=f"{topic}-filler", **(tls or SslFiles())
    ) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(count):
            value = b"record-%d" % i
            producer.send(topic, key=value, value=value)
        producer.commit_transaction()


def ensure_topics(
    bootstrap: Sequence[str],
    input_topic: str,
    output_topic: str,
    partitions: int,
    tls: SslFiles | None = None,
) -> list[str]:
    """Create whichever of the two topics does not exist (the output with the
    input's partition count); returns the names created."""
    with Admin(bootstrap, **(tls or SslFiles())) as admin:
        existing = admin.list_topics()
        count = existing.get(input_topic, partitions)
        missing = {t: count for t in (input_topic, output_topic) if t not in existing}
        if missing:
            admin.create_topics(missing, exist_ok=True)
    return sorted(missing)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster-dir", default=".raftcoord", help="a `raftcoord cluster up` dir")
    parser.add_argument("--input", default="input")
    parser.add_argument("--output", default="output")
    parser.add_argument("--group", default="copier")
    parser.add_argument("--transactional-id", default="copier-1")
    parser.add_argument("--records-per-transaction", type=int, default=20)
    parser.add_argument(
        "--partitions", type=int, default=3, help="partitions of a topic created here (3)"
    )
    parser.add_argument(
        "--fill",
        type=int,
        default=0,
        metavar="N",
        help="first write N records to the input, in a transaction (0)",
    )
    parser.add_argument(
        "--die-in-transaction",
        type=int,
        help="kill -9 this worker in the middle of transaction N (to test recovery)",
    )
    args = parser.parse_args(argv)
    from raftcoord.cluster.launcher import LocalCluster

    cluster = LocalCluster(Path(args.cluster_dir))
    bootstrap, tls = cluster.bootstrap(), cluster.client_tls()
    for topic in ensure_topics(bootstrap, args.input, args.output, args.partitions, tls):
        print(f"topic {topic!r} did not exist: created it", flush=True)
        if topic == args.input and not args.fill:
            print(
                f"{args.input!r} is empty: produce records to it (--fill N) and run again",
                flush=True,
            )
    if args.fill:
        fill(bootstrap, args.input, args.fill, tls)
        print(f"wrote {args.fill} records to {args.input}", flush=True)
    copied = copy_topic(
        bootstrap,
        args.input,
        args.output,
        args.group,
        args.transactional_id,
        args.records_per_transaction,
        args.die_in_transaction,
        on_commit=lambda n: print(f"committed {n} records", flush=True),
        tls=tls,
    )
    print(f"done: copied {copied} records from {args.input} to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
