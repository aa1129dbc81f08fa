"""Transfers recorded in a SQLite database and published to a topic, atomically.

The database is the transaction manager of a two-phase commit (KIP-939):
each transfer's record is sent in a transaction that the producer prepares
(``prepare_transaction``: flushed, held open, never timed out), then one
database transaction stores the transfer together with the prepared state;
that database commit is the decision. Only then is the Kafka transaction
committed (``complete_transaction``). A run that crashes anywhere leaves
either both or neither: the next run starts with
``init_transactions(keep_prepared_txn=True)``, which keeps a prepared
transaction open, and completes it with the state the database holds (the
decision was made: commit) or aborts it (no state: the database never
decided).

Run against a local cluster started with two-phase commit enabled
(``raftcoord cluster up --setting transaction.two.phase.commit.enable=true``)::

    python examples/two_phase_commit.py --cluster-dir .raftcoord --db transfers.db

``--crash-after prepare`` or ``--crash-after decision`` kills the process
(SIGKILL) in the last transfer at that point; run it again to see the
recovery.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import sys
from pathlib import Path

from raftcoord.client import Admin, PreparedTxnState, TransactionalProducer
from raftcoord.client.errors import TransactionalIdAuthorizationFailedError


def open_db(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)  # explicit BEGIN/COMMIT below
    db.execute("CREATE TABLE IF NOT EXISTS transfers (id INTEGER PRIMARY KEY, amount INTEGER)")
    db.execute("CREATE TABLE IF NOT EXISTS prepared (one INTEGER PRIMARY KEY, state TEXT)")
    return db


def recover(producer: TransactionalProducer, db: sqlite3.Connection) -> str:
    """End the transaction a crashed run left prepared, as the database decided."""
    row = db.execute("SELECT state FROM prepared").fetchone()
    if producer.prepared_state is None:
        outcome = "nothing to recover"
    elif row is None:  # the database never decided: abort
        producer.abort_transaction()
        outcome = "aborted"
    else:
        committed = producer.complete_transaction(PreparedTxnState.parse(row[0]))
        outcome = "committed" if committed else "aborted"
    db.execute("DELETE FROM prepared")
    return outcome


def transfer(
    producer: TransactionalProducer,
    db: sqlite3.Connection,
    topic: str,
    amount: int,
    crash_after: str | None,
) -> int:
    """One transfer, in the database and on the topic or in neither."""
    (last,) = db.execute("SELECT COALESCE(MAX(id), 0) FROM transfers").fetchone()
    transfer_id = last + 1
    producer.begin_transaction()
    producer.send(topic, key=b"%d" % transfer_id, value=b"transfer-%d:%d" % (transfer_id, amount))
    state = producer.prepare_transaction()
    if crash_after == "prepare":
        os.kill(os.getpid(), signal.SIGKILL)
    db.execute("BEGIN")
    db.execute("INSERT INTO transfers VALUES (?, ?)", (transfer_id, amount))
    db.execute("INSERT OR REPLACE INTO prepared VALUES (1, ?)", (str(state),))
    db.execute("COMMIT")  # the decision
    if crash_after == "decision":
        os.kill(os.getpid(), signal.SIGKILL)
    producer.complete_transaction(state)
    db.execute("DELETE FROM prepared")
    return transfer_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster-dir", default=".raftcoord", help="a `raftcoord cluster up` dir")
    parser.add_argument("--db", type=Path, default=Path("transfers.db"))
    parser.add_argument("--topic", default="transfers")
    parser.add_argument("--transactional-id", default="transfers-producer")
    parser.add_argument("--transfers", type=int, default=3)
    parser.add_argument("--crash-after", choices=["prepare", "decision"])
    args = parser.parse_args(argv)
    from raftcoord.cluster.launcher import LocalCluster

    bootstrap = LocalCluster(Path(args.cluster_dir)).bootstrap()
    with Admin(bootstrap) as admin:
        admin.create_topics({args.topic: 2}, exist_ok=True)
    db = open_db(args.db)
    producer = TransactionalProducer(
        bootstrap, transactional_id=args.transactional_id, enable_two_phase_commit=True
    )
    try:
        try:
            producer.init_transactions(keep_prepared_txn=True)
        except TransactionalIdAuthorizationFailedError as exc:
            print(
                "two_phase_commit.py: the cluster refuses two-phase commit; start it with "
                "`raftcoord cluster up --setting transaction.two.phase.commit.enable=true` "
                f"({exc})",
                file=sys.stderr,
            )
            return 1
        print(f"recovery: {recover(producer, db)}", flush=True)
        for n in range(args.transfers):
            crash = args.crash_after if n == args.transfers - 1 else None
            print(f"transfer {transfer(producer, db, args.topic, 10 * (n + 1), crash)} done")
    finally:
        producer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
