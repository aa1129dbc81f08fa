"""Two-phase commit for external transaction managers (KIP-939) on a real
cluster: a prepared transaction survives its producer's crash (SIGKILL), a
kill of its shard's leader and its own timeout many times over, and is then
committed by a new producer holding the prepared state, or aborted when the
state does not match; the example that makes a SQLite database and a topic
agree is run through both crashes; a Kafka client's InitProducerId v6
keeps a transaction through the gateway."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.serial import entity_reader

from raftcoord.client import (
    Admin,
    FatalError,
    IllegalStateError,
    PreparedTxnState,
    TopicPartition,
    TransactionalProducer,
)
from raftcoord.client.errors import TransactionalIdNotFoundError
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.routing import shard_for
from tests.local_cluster import after_first_checks, running_cluster
from tests.test_end_to_end import read, state_of
from tests.test_kafka_gateway import gateway_socket, read_frame, request_frame
from tests.test_metrics_cluster import scrape, value

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_MS = 1_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(
        tmp_path_factory.mktemp("two-phase") / "cluster",
        abort_interval_ms=100,
        kafka_listeners=1,
        settings={"transaction.two.phase.commit.enable": True},
    ) as running:
        yield running


@pytest.fixture(scope="module")
def ready_at(cluster: LocalCluster) -> float:
    """When the module's cluster was up (time.monotonic())."""
    return time.monotonic()


def topic(cluster: LocalCluster, name: str) -> list[TopicPartition]:
    with Admin(cluster.bootstrap()) as admin:
        admin.create_topics({name: 2})
    return [TopicPartition(name, p) for p in range(2)]


def outlive_the_timeout() -> None:
    """Let the transaction timeout pass many times over, with the abort
    sweep every 100 ms: what must not happen is the condition here."""
    time.sleep(TIMEOUT_MS * 3 / 1000)


def test_a_prepared_transaction_survives_its_producer_and_a_leader_kill(
    cluster: LocalCluster, ready_at: float
) -> None:
    partitions = topic(cluster, "prepared")
    script = f"""
import sys
from raftcoord.client import TransactionalProducer
p = TransactionalProducer({cluster.bootstrap()!r}, "survivor",
                          enable_two_phase_commit=True, transaction_timeout_ms={TIMEOUT_MS})
p.init_transactions()
p.begin_transaction()
for n in range(4):
    p.send("prepared", value=b"kept-%d" % n, partition=n % 2)
print(p.prepare_transaction(), flush=True)
sys.stdin.read()
"""
    with subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    ) as client:
        try:
            assert client.stdout is not None and client.stderr is not None
            line = client.stdout.readline().strip()
        finally:
            client.kill()
            _, errors = client.communicate(timeout=30)
        assert line, errors
        state = PreparedTxnState.parse(line)
    assert client.returncode == -9

    assert cluster.state is not None
    shard = shard_for("survivor", cluster.state.shard_count)
    after_first_checks(ready_at)  # no preferred-leader hand-off moves the shard meanwhile
    cluster.wait_until(lambda: shard in cluster.leaders(), 30, f"shard {shard} has no leader")
    leader = cluster.leaders()[shard]
    cluster.kill(leader, "KILL")
    cluster.wait_until(
        lambda: cluster.leaders().get(shard) not in (None, leader),
        30,
        f"shard {shard} did not elect another leader",
    )
    outlive_the_timeout()
    assert state_of(cluster, "survivor") == "Ongoing"
    assert read(cluster, partitions, committed=False) != []
    cluster.start(leader)

    with TransactionalProducer(
        cluster.bootstrap(), "survivor", enable_two_phase_commit=True
    ) as producer:
        producer.init_transactions(keep_prepared_txn=True)
        assert producer.prepared_state == state
        assert producer.state == "prepared-transaction"
        with Admin(cluster.bootstrap()) as admin:
            described = admin.describe_transactions(["survivor"])["survivor"]
        assert described.state == "Ongoing" and described.two_phase_commit
        assert (described.ongoing_txn_producer_id, described.ongoing_txn_producer_epoch) == (
            state.producer_id,
            state.producer_epoch,
        )
        assert described.producer_epoch == state.producer_epoch + 1  # the keep fenced it
        with pytest.raises(IllegalStateError):
            producer.send("prepared", value=b"late", partition=0)
        with pytest.raises(IllegalStateError):
            producer.begin_transaction()
        assert producer.complete_transaction(state) is True
        assert producer.prepared_state is None
        assert sorted(read(cluster, partitions, committed=True)) == [
            b"kept-%d" % n for n in range(4)
        ]
        # The producer goes on with ordinary transactions.
        producer.begin_transaction()
        producer.send("prepared", value=b"next", partition=1)
        producer.commit_transaction()
    assert b"next" in read(cluster, partitions, committed=True)


def test_a_mismatched_state_aborts_and_the_old_producer_is_fenced(cluster: LocalCluster) -> None:
    partitions = topic(cluster, "mismatch")
    old = TransactionalProducer(
        cluster.bootstrap(), "mismatched", enable_two_phase_commit=True, linger_ms=0
    )
    old.init_transactions()
    old.begin_transaction()
    old.send("mismatch", value=b"doomed", partition=0)
    state = old.prepare_transaction()
    outlive_the_timeout()
    # It waits for its manager: counted apart, not as a hanging transaction.
    coordinators = [n.metrics for n in cluster.coordinators()]
    assert sum(value(scrape(m)[1], "raftcoord_two_phase_transactions_open") for m in coordinators)
    ages = [value(scrape(m)[1], "raftcoord_transaction_open_age_max_seconds") for m in coordinators]
    assert ages == [0.0] * len(coordinators)

    with TransactionalProducer(
        cluster.bootstrap(), "mismatched", enable_two_phase_commit=True
    ) as producer:
        producer.init_transactions(keep_prepared_txn=True)
        assert producer.prepared_state == state
        # The old producer was fenced by the keep.
        with pytest.raises(FatalError):
            old.complete_transaction(state)
        other = PreparedTxnState(state.producer_id, state.producer_epoch + 1)
        assert producer.complete_transaction(other) is False
    assert read(cluster, partitions, committed=True) == []
    assert state_of(cluster, "mismatched") == "CompleteAbort"
    # Nothing is prepared any more: a new producer has nothing to complete.
    with TransactionalProducer(
        cluster.bootstrap(), "mismatched", enable_two_phase_commit=True
    ) as producer:
        producer.init_transactions(keep_prepared_txn=True)
        assert producer.prepared_state is None
        assert producer.complete_transaction(state) is None
    old.close()


@pytest.mark.parametrize("crash_after", ["prepare", "decision"])
def test_the_database_and_the_topic_agree_after_a_crash(
    cluster: LocalCluster, tmp_path: Path, crash_after: str
) -> None:
    db_path = tmp_path / "transfers.db"
    name = f"transfers-{crash_after}"

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                str(ROOT / "examples" / "two_phase_commit.py"),
                "--cluster-dir",
                str(cluster.data_dir),
                "--db",
                str(db_path),
                "--topic",
                name,
                "--transactional-id",
                name,
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )

    crashed = run("--transfers", "3", "--crash-after", crash_after)
    assert crashed.returncode == -9, crashed.stderr
    assert "transfer 2 done" in crashed.stdout and "transfer 3" not in crashed.stdout
    recovered = run("--transfers", "1")
    assert recovered.returncode == 0, recovered.stderr
    expected = "committed" if crash_after == "decision" else "aborted"
    assert f"recovery: {expected}" in recovered.stdout

    with sqlite3.connect(db_path) as db:
        stored = sorted(
            b"transfer-%d:%d" % row for row in db.execute("SELECT id, amount FROM transfers")
        )
    assert len(stored) == (4 if crash_after == "decision" else 3)
    partitions = [TopicPartition(name, p) for p in range(2)]
    assert sorted(read(cluster, partitions, committed=True)) == stored


def test_force_terminate_ends_a_prepared_transaction_whose_manager_is_gone(
    cluster: LocalCluster,
) -> None:
    """`raftcoord txn force-terminate` (Kafka's forceTerminateTransaction):
    the prepared transaction, which no timeout would end, is aborted and its
    producer fenced; an id nobody used is not created."""
    partitions = topic(cluster, "orphaned")
    orphan = TransactionalProducer(cluster.bootstrap(), "orphan", enable_two_phase_commit=True)
    orphan.init_transactions()
    orphan.begin_transaction()
    orphan.send("orphaned", value=b"never", partition=0)
    orphan.prepare_transaction()
    outlive_the_timeout()
    assert state_of(cluster, "orphan") == "Ongoing"
    done = subprocess.run(
        [str(Path(sys.executable).parent / "raftcoord"), "txn", "force-terminate", "orphan",
         "--cluster-dir", str(cluster.data_dir), "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    # Aborted (the coordinator may already have run the InitProducerId it
    # held while the abort completed: Empty, at a bumped epoch).
    assert row["state"] in ("CompleteAbort", "Empty"), row
    assert read(cluster, partitions, committed=True) == []  # and the LSO moved past it
    with pytest.raises(FatalError):  # the orphan was fenced
        orphan.complete_transaction(orphan.prepared_state or PreparedTxnState(0, 0))
    orphan.close()
    with Admin(cluster.bootstrap()) as admin, pytest.raises(TransactionalIdNotFoundError):
        admin.force_terminate_transaction("nobody")
    with Admin(cluster.bootstrap()) as admin, pytest.raises(TransactionalIdNotFoundError):
        admin.describe_transactions(["nobody"])


def kafka_call(cluster: LocalCluster, api_key: int, version: int, body: dict[str, Any]) -> Any:
    """One request of a flexible ``version`` to the gateway, on a connection of
    its own (as a restarted client's); its answer."""
    schema = load_response_schema(api_key, version)
    with gateway_socket(cluster) as sock:
        sock.sendall(request_frame(api_key, version, 1, body))
        frame = read_frame(sock)
    # Response header v1: the correlation id, then no tagged fields (one byte).
    return entity_reader(schema)(frame, 5)[0]


def test_a_kafka_clients_init_producer_id_v6_keeps_a_prepared_transaction(
    cluster: LocalCluster,
) -> None:
    """KIP-939 through the Kafka gateway: InitProducerId v6 with Enable2Pc
    opens a two-phase producer; after its "crash" a new one asks with
    KeepPreparedTxn, learns the kept transaction's producer id and epoch,
    and commits it with EndTxn (transactions v1); the old epoch is fenced."""
    partitions = topic(cluster, "kafka-kept")
    tid = "kafka-two-phase"
    init = {"transactional_id": tid, "transaction_timeout": 1_000, "enable2_pc": True}
    first = kafka_call(cluster, 22, 6, init)
    assert int(first.error_code) == 0, first
    assert (int(first.ongoing_txn_producer_id), int(first.ongoing_txn_producer_epoch)) == (-1, -1)
    pid, epoch = int(first.producer_id), int(first.producer_epoch)
    added = kafka_call(
        cluster,
        24,
        3,
        {
            "v3_and_below_transactional_id": tid,
            "v3_and_below_producer_id": pid,
            "v3_and_below_producer_epoch": epoch,
            "v3_and_below_topics": [{"name": partitions[0].topic, "partitions": [0]}],
        },
    )
    [result] = added.results_by_topic_v3_and_below[0].results_by_partition
    assert int(result.partition_error_code) == 0, added
    outlive_the_timeout()  # a two-phase transaction does not time out
    assert state_of(cluster, tid) == "Ongoing"

    kept = kafka_call(cluster, 22, 6, {**init, "keep_prepared_txn": True})
    assert int(kept.error_code) == 0, kept
    assert (int(kept.producer_id), int(kept.producer_epoch)) == (pid, epoch + 1)
    assert (int(kept.ongoing_txn_producer_id), int(kept.ongoing_txn_producer_epoch)) == (
        pid,
        epoch,
    )
    assert state_of(cluster, tid) == "Ongoing"
    end = {"transactional_id": tid, "producer_id": pid, "committed": True}
    fenced = kafka_call(cluster, 26, 3, {**end, "producer_epoch": epoch})
    assert int(fenced.error_code) == ErrorCode.PRODUCER_FENCED, fenced
    ended = kafka_call(cluster, 26, 3, {**end, "producer_epoch": epoch + 1})
    assert int(ended.error_code) == 0, ended
    with Admin(cluster.bootstrap()) as admin:
        cluster.wait_until(
            lambda: admin.describe_transactions([tid])[tid].state == "CompleteCommit",
            30,
            "the kept transaction did not complete",
        )
        description = admin.describe_transactions([tid])[tid]
    assert (description.producer_id, description.producer_epoch) == (pid, epoch + 1)
