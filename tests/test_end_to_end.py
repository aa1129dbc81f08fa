"""Exactly-once transactions end to end: the client library against real
coordinator and partition-log processes, with the marker writer closing
transactions, and faults in the middle."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftcoord.client import (
    Admin,
    Consumer,
    KafkaTimeoutError,
    Producer,
    ProducerFencedError,
    TopicPartition,
    TransactionAbortableError,
    TransactionalProducer,
)
from raftcoord.client.errors import (
    TransactionalIdAuthorizationFailedError,
    TransactionalIdNotFoundError,
)
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.v1 import coordinator_pb2, coordinator_pb2_grpc
from tests.local_cluster import running_cluster

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(
        tmp_path_factory.mktemp("e2e") / "cluster", abort_interval_ms=100
    ) as cluster:
        yield cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "cluster", abort_interval_ms=100) as cluster:
        yield cluster


def create(cluster: LocalCluster, name: str, partitions: int = 3) -> list[TopicPartition]:
    with Admin(cluster.bootstrap()) as admin:
        admin.create_topics({name: partitions})
    return [TopicPartition(name, p) for p in range(partitions)]


def read(cluster: LocalCluster, partitions: list[TopicPartition], committed: bool) -> list[bytes]:
    """Every value in ``partitions``, once no transaction is open on them
    (markers land just after a commit returns); bounded wait."""
    bootstrap = cluster.bootstrap()
    isolation = "read_committed" if committed else "read_uncommitted"
    with (
        Consumer(bootstrap, isolation_level=isolation) as consumer,
        Consumer(bootstrap, isolation_level="read_uncommitted") as latest,
    ):
        if committed:
            wait_for(
                lambda: consumer.end_offsets(partitions) == latest.end_offsets(partitions),
                20,
                "a transaction stayed open",
            )
        ends = consumer.end_offsets(partitions)
        consumer.assign(partitions)
        consumer.seek_to_beginning(partitions)
        values: list[bytes] = []
        deadline = time.monotonic() + 20
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            assert time.monotonic() < deadline, "reading did not reach the end offsets"
            values += [r.value or b"" for r in consumer.poll(timeout_ms=200)]
        return values


def wait_for(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)


def state_of(cluster: LocalCluster, transactional_id: str) -> str:
    with Admin(cluster.bootstrap()) as admin:
        return admin.describe_transactions([transactional_id])[transactional_id].state


def metadata(cluster: LocalCluster) -> Any:
    stub = coordinator_pb2_grpc.TransactionCoordinatorStub(
        grpc.insecure_channel(cluster.bootstrap()[0])
    )
    return stub, coordinator_pb2


def owner_of(cluster: LocalCluster, topic: str) -> int:
    """The id of the partition-log node that owns partition 0 of ``topic``."""
    stub, pb = metadata(cluster)
    answer = stub.Metadata(pb.MetadataRequest(topics=[topic]), timeout=5)
    return int(answer.topics[0].partitions[0].node_id)


def coordinator_of(cluster: LocalCluster, transactional_id: str) -> int:
    """The id of the coordinator node leading ``transactional_id``'s shard."""
    stub, pb = metadata(cluster)
    answer = stub.FindCoordinator(
        pb.FindCoordinatorRequest(key=transactional_id, key_type=pb.TRANSACTION), timeout=5
    )
    assert answer.error_code == 0, answer
    return int(answer.node_id)


# --- a healthy cluster -----------------------------------------------------------------


def test_commit_is_all_or_nothing_across_nodes(shared_cluster: LocalCluster) -> None:
    partitions = create(shared_cluster, "e2e-orders")
    bootstrap = shared_cluster.bootstrap()
    with TransactionalProducer(bootstrap, transactional_id="e2e-all") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for tp in partitions:
            producer.send(tp.topic, value=b"commit-%d" % tp.partition, partition=tp.partition)
        producer.commit_transaction()
        producer.begin_transaction()
        for tp in partitions:
            producer.send(tp.topic, value=b"abort-%d" % tp.partition, partition=tp.partition)
        producer.flush()
        producer.abort_transaction()
    committed = sorted(read(shared_cluster, partitions, committed=True))
    assert committed == [b"commit-0", b"commit-1", b"commit-2"]
    everything = sorted(read(shared_cluster, partitions, committed=False))
    assert everything == sorted(
        [b"commit-%d" % p for p in range(3)] + [b"abort-%d" % p for p in range(3)]
    )
    assert state_of(shared_cluster, "e2e-all") == "CompleteAbort"


def test_zombie_producer_is_fenced(shared_cluster: LocalCluster) -> None:
    partitions = create(shared_cluster, "e2e-zombie", 2)
    bootstrap = shared_cluster.bootstrap()
    with (
        TransactionalProducer(bootstrap, transactional_id="e2e-zombie") as zombie,
        TransactionalProducer(bootstrap, transactional_id="e2e-zombie") as successor,
    ):
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.send("e2e-zombie", value=b"zombie-1", partition=0)
        zombie.flush()
        successor.init_transactions()  # fences the zombie, aborts its transaction
        zombie.send("e2e-zombie", value=b"zombie-2", partition=1)
        with pytest.raises(ProducerFencedError):
            zombie.flush()
            zombie.commit_transaction()
        with pytest.raises(ProducerFencedError):
            zombie.commit_transaction()
        successor.begin_transaction()
        successor.send("e2e-zombie", value=b"successor", partition=1)
        successor.commit_transaction()
    assert read(shared_cluster, partitions, committed=True) == [b"successor"]


def test_abandoned_transaction_times_out_and_unblocks_the_lso(
    shared_cluster: LocalCluster,
) -> None:
    partitions = create(shared_cluster, "e2e-timeout", 1)
    bootstrap = shared_cluster.bootstrap()
    producer = TransactionalProducer(
        bootstrap, transactional_id="e2e-timeout", transaction_timeout_ms=1000
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("e2e-timeout", value=b"abandoned", partition=0)
        producer.flush()
        wait_for(
            lambda: state_of(shared_cluster, "e2e-timeout") == "CompleteAbort",
            20,
            "the coordinator did not abort the abandoned transaction",
        )
    finally:
        producer.close()
    with Producer(bootstrap) as plain:
        plain.send("e2e-timeout", value=b"after", partition=0).result(timeout=20)
    assert read(shared_cluster, partitions, committed=True) == [b"after"]


def test_consume_transform_produce_survives_a_killed_worker(
    shared_cluster: LocalCluster,
) -> None:
    inputs = create(shared_cluster, "e2e-in")
    outputs = create(shared_cluster, "e2e-out")
    bootstrap = shared_cluster.bootstrap()
    values = [b"record-%03d" % i for i in range(120)]
    with Producer(bootstrap) as producer:
        for value in values:
            producer.send("e2e-in", key=value, value=value)
        producer.flush()

    def worker(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                str(ROOT / "examples" / "consume_transform_produce.py"),
                "--cluster-dir",
                str(shared_cluster.data_dir),
                "--input",
                "e2e-in",
                "--output",
                "e2e-out",
                "--group",
                "e2e-copier",
                "--transactional-id",
                "e2e-copier",
                "--records-per-transaction",
                "15",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )

    killed = worker("--die-in-transaction", "3")
    assert killed.returncode == -9, killed.stderr
    finished = worker()
    assert finished.returncode == 0, finished.stderr
    copied = read(shared_cluster, outputs, committed=True)
    assert sorted(copied) == sorted(b"copied:" + v for v in values)  # each exactly once
    with Consumer(bootstrap, group_id="e2e-copier", isolation_level="read_committed") as consumer:
        ends = consumer.end_offsets(inputs)
        assert {tp: consumer.committed(tp) for tp in inputs} == ends


# --- faults between PrepareCommit and CompleteCommit -----------------------------------


def _prepared_commit(
    cluster: LocalCluster, topic: str, tid: str
) -> tuple[list[TopicPartition], int]:
    """A committed transaction whose markers cannot be delivered yet: the
    partition's node is stopped after the records were written. Returns the
    partitions and the stopped partition node's id."""
    partitions = create(cluster, topic, 1)
    bootstrap = cluster.bootstrap()
    owner = owner_of(cluster, topic)
    with TransactionalProducer(bootstrap, transactional_id=tid) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(5):
            producer.send(topic, value=b"v%d" % i, partition=0)
        producer.flush()
        cluster.kill(owner, "STOP")
        producer.commit_transaction()  # answered once PrepareCommit is replicated
    assert state_of(cluster, tid) == "PrepareCommit"
    return partitions, owner


def test_new_leader_finishes_the_markers_after_a_leader_kill(cluster: LocalCluster) -> None:
    partitions, owner = _prepared_commit(cluster, "e2e-failover", "e2e-failover")
    cluster.kill(coordinator_of(cluster, "e2e-failover"))  # kill -9 the transaction's coordinator
    cluster.kill(owner, "CONT")
    wait_for(
        lambda: state_of(cluster, "e2e-failover") == "CompleteCommit",
        30,
        "the new leader did not complete the transaction",
    )
    assert read(cluster, partitions, committed=True) == [b"v%d" % i for i in range(5)]


def test_markers_reach_a_restarted_partition_node(cluster: LocalCluster) -> None:
    partitions, owner = _prepared_commit(cluster, "e2e-restart", "e2e-restart")
    cluster.kill(owner)  # kill -9 the stopped partition node
    cluster.start(owner)
    wait_for(
        lambda: state_of(cluster, "e2e-restart") == "CompleteCommit",
        30,
        "the markers were not delivered after the restart",
    )
    assert read(cluster, partitions, committed=True) == [b"v%d" % i for i in range(5)]
    with Consumer(cluster.bootstrap()) as consumer:
        assert consumer.end_offsets(partitions) == {partitions[0]: 6}  # 5 records + 1 marker


def test_aborting_the_next_transaction_while_markers_wait_is_not_fatal(
    shared_cluster: LocalCluster,
) -> None:
    """Commit N returns in PrepareCommit (its partition's node is paused);
    N + 1's partition on another node cannot join N + 1 until N completes
    (the coordinator answers its add CONCURRENT_TRANSACTIONS, retried until
    the batch's delivery timeout), so N + 1 becomes abortable. Aborting it
    must neither fail the producer (it was never fenced) nor touch N, which
    completes once the node resumes."""
    cluster, topic, tid = shared_cluster, "e2e-next", "e2e-next"
    create(cluster, topic, 6)
    stub, pb = metadata(cluster)
    placement = stub.Metadata(pb.MetadataRequest(topics=[topic]), timeout=5).topics[0]
    first_on: dict[int, int] = {}
    for p in placement.partitions:
        first_on.setdefault(int(p.node_id), int(p.partition))
    (paused, p_paused), (_, p_other) = list(first_on.items())[:2]
    with TransactionalProducer(
        cluster.bootstrap(),
        transactional_id=tid,
        request_timeout_ms=1_500,
        delivery_timeout_ms=3_000,
    ) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, value=b"n", partition=p_paused).result(10)
        cluster.kill(paused, "STOP")
        try:
            producer.commit_transaction()  # answered once PrepareCommit is replicated
            assert state_of(cluster, tid) == "PrepareCommit"
            producer.begin_transaction()
            producer.send(topic, value=b"n+1", partition=p_other)
            with pytest.raises(TransactionAbortableError):
                producer.commit_transaction()
            try:
                producer.abort_transaction()
            except KafkaTimeoutError:
                # An add whose answer was too slow may have opened N + 1, so
                # the abort waits for N's markers: retriable, never fatal.
                cluster.kill(paused, "CONT")
                producer.abort_transaction()
            assert producer.state == "ready"
        finally:
            cluster.kill(paused, "CONT")
        # The abort of N + 1 reached the coordinator (a Produce may have opened
        # N + 1, as far as the producer knows), so once N completes the
        # coordinator aborts the empty N + 1 too.
        wait_for(
            lambda: state_of(cluster, tid) in ("CompleteCommit", "CompleteAbort"),
            30,
            "N did not complete",
        )
        producer.begin_transaction()
        producer.send(topic, value=b"n+2", partition=p_other)
        producer.commit_transaction()
    partitions = [TopicPartition(topic, p_paused), TopicPartition(topic, p_other)]
    assert sorted(read(cluster, partitions, committed=True)) == [b"n", b"n+2"]


def test_transactional_producer_example_runs(shared_cluster: LocalCluster) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "transactional_producer.py"),
            "--cluster-dir",
            str(shared_cluster.data_dir),
            "--topic",
            "e2e-orders",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "committed: 5  aborted: 3" in result.stdout
    assert "aborted records visible: none" in result.stdout


def test_readme_python_example_runs(
    shared_cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = readme.split("```python\n")[1:]
    example = next(b.split("```")[0] for b in blocks if "TransactionalProducer" in b)
    assert 'LocalCluster(".raftcoord")' in example
    code = example.replace('".raftcoord"', repr(str(shared_cluster.data_dir)))
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == "42", printed


def test_the_copy_example_creates_missing_topics_and_says_so(shared_cluster: LocalCluster) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "consume_transform_produce.py"),
            "--cluster-dir",
            str(shared_cluster.data_dir),
            "--input",
            "fresh-in",
            "--output",
            "fresh-out",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "'fresh-in' is empty: produce records to it (--fill N) and run again" in result.stdout
    assert "copied 0 records" in result.stdout
    with Admin(shared_cluster.bootstrap()) as admin:
        topics = admin.list_topics()
    assert topics["fresh-in"] == topics["fresh-out"] == 3
    # --fill writes its input first.
    filled = run_example(
        "consume_transform_produce.py", shared_cluster, "--input", "filled-in", "--output",
        "filled-out", "--group", "filled", "--fill", "40",
    )  # fmt: skip
    assert filled.returncode == 0, filled.stderr
    assert "wrote 40 records to filled-in" in filled.stdout and "is empty" not in filled.stdout
    assert "done: copied 40 records from filled-in to filled-out" in filled.stdout


def run_example(name: str, cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``examples/NAME ARGS`` against ``cluster``."""
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / name),
            "--cluster-dir",
            str(cluster.data_dir),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_producer_example_counts_only_its_own_topic(shared_cluster: LocalCluster) -> None:
    """By default it writes a topic of its own, not the "orders" of the
    README's example: its count is its own records'."""
    with Admin(shared_cluster.bootstrap()) as admin:
        admin.create_topics({"orders": 3}, exist_ok=True)
    with TransactionalProducer(shared_cluster.bootstrap(), "readme-like") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("orders", key=b"k", value=b"paid")
        producer.commit_transaction()
    result = run_example("transactional_producer.py", shared_cluster)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "read_committed sees 5 records" in result.stdout


def test_the_two_phase_commit_example_says_what_the_cluster_lacks(
    shared_cluster: LocalCluster, tmp_path: Path
) -> None:
    result = run_example("two_phase_commit.py", shared_cluster, "--db", str(tmp_path / "t.db"))
    assert result.returncode == 1 and result.stdout == "" and "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert "transaction.two.phase.commit.enable=true" in result.stderr


def test_two_phase_commit_needs_the_cluster_setting(shared_cluster: LocalCluster) -> None:
    """transaction.two.phase.commit.enable is off by default: a producer that
    asks for two-phase commit (KIP-939) is refused, and nothing is created."""
    producer = TransactionalProducer(
        shared_cluster.bootstrap(), "two-phase-off", enable_two_phase_commit=True
    )
    with (
        producer,
        pytest.raises(TransactionalIdAuthorizationFailedError, match=r"two\.phase\.commit\.enable"),
    ):
        producer.init_transactions()
    with Admin(shared_cluster.bootstrap()) as admin, pytest.raises(TransactionalIdNotFoundError):
        admin.describe_transactions(["two-phase-off"])
