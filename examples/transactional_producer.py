"""A transactional producer that aborts when its work fails.

The first transaction writes five orders and commits. The second fails
half-way (a simulated exception) and is aborted: a read_committed consumer
never sees its records, even though some of them reached the partition logs.

Run against a local cluster (`raftcoord cluster up`)::

    python examples/transactional_producer.py --cluster-dir .raftcoord
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from raftcoord.client import Admin, Consumer, TopicPartition, TransactionalProducer


class PaymentServiceDown(Exception):
    """The failure the second transaction runs into."""


def produce_orders(
    bootstrap: Sequence[str], topic: str, transactional_id: str
) -> dict[str, list[bytes]]:
    """Run the two transactions; returns the values committed and aborted."""
    committed: list[bytes] = []
    aborted: list[bytes] = []
    with TransactionalProducer(bootstrap, transactional_id=transactional_id) as producer:
        producer.init_transactions()

        producer.begin_transaction()
        batch = [b"order-%d" % i for i in range(5)]
        for value in batch:
            producer.send(topic, key=value, value=value)
        producer.commit_transaction()
        committed += batch

        producer.begin_transaction()
        sent: list[bytes] = []
        try:
            for i in range(5, 10):
                value = b"order-%d" % i
                producer.send(topic, key=value, value=value)
                sent.append(value)
                if i == 7:
                    raise PaymentServiceDown(f"payment for order-{i} failed")
            producer.commit_transaction()
            committed += sent
        except PaymentServiceDown:
            producer.abort_transaction()
            aborted += sent
    return {"committed": committed, "aborted": aborted}


def read_topic(bootstrap: Sequence[str], topic: str, isolation_level: str) -> list[bytes]:
    """Every value of ``topic`` a consumer with ``isolation_level`` sees once
    no transaction is open on it any more (markers are written just after a
    commit returns, so a read_committed reader may lag it for a moment)."""
    with Admin(bootstrap) as admin:
        count = admin.list_topics()[topic]
    partitions = [TopicPartition(topic, p) for p in range(count)]
    with (
        Consumer(bootstrap, isolation_level=isolation_level) as consumer,
        Consumer(bootstrap, isolation_level="read_uncommitted") as latest,
    ):
        deadline = time.monotonic() + 30
        while True:
            ends = consumer.end_offsets(partitions)
            if ends == latest.end_offsets(partitions) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        consumer.assign(partitions)
        consumer.seek_to_beginning(partitions)
        values: list[bytes] = []
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            values += [r.value or b"" for r in consumer.poll(timeout_ms=500)]
        return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster-dir", default=".raftcoord", help="a `raftcoord cluster up` dir")
    parser.add_argument(
        "--topic",
        default="aborted-orders-example",
        help="a topic of its own: its count is of this program's records only "
        "(default: %(default)s)",
    )
    parser.add_argument("--transactional-id", default="orders-producer")
    args = parser.parse_args(argv)
    from raftcoord.cluster.launcher import LocalCluster

    bootstrap = LocalCluster(Path(args.cluster_dir)).bootstrap()
    with Admin(bootstrap) as admin:
        admin.create_topics({args.topic: 3}, exist_ok=True)
    outcome = produce_orders(bootstrap, args.topic, args.transactional_id)
    seen = read_topic(bootstrap, args.topic, "read_committed")
    print(f"committed: {len(outcome['committed'])}  aborted: {len(outcome['aborted'])}")
    print(f"read_committed sees {len(seen)} records: {sorted(v.decode() for v in seen)}")
    leaked = set(seen) & set(outcome["aborted"])
    print("aborted records visible:", sorted(v.decode() for v in leaked) or "none")
    return 1 if leaked else 0


if __name__ == "__main__":
    sys.exit(main())
