"""KIP-890 part 2 against real coordinator and partition-log processes: the
partition-log node adds a partition to the transaction with the
transaction's first batch there, so a producer commits and aborts across
partitions without ever calling AddPartitionsToTxn; a fenced producer's
batch is refused and changes nothing; the batched (many transactions)
AddPartitionsToTxn answers each transaction on its own (over the cluster
link each as soon as it is ready, a fenced producer failing alone); a
transaction whose previous one is still completing never holds up another
transactional id's first batch; and with
``transaction.partition.verification.enable=false`` producers add their
partitions themselves, end to end."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftcoord.client import Admin, TransactionalProducer
from raftcoord.client._net import CoordinatorClient
from raftcoord.cluster.launcher import CONFIG_FILE, LocalCluster
from raftcoord.protocol.cluster_link import ADD_PARTITIONS_TO_TXN, ConcurrentLink
from raftcoord.protocol.config import load_config
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.routing import shard_for
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc
from tests import plog_client
from tests.local_cluster import running_cluster
from tests.test_end_to_end import create, read

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("adds") / "cluster") as made:
        yield made


@pytest.fixture
def coordinator_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """The methods the client library calls on shard leaders, in order, with
    their requests."""
    calls: list[tuple[str, Any]] = []
    original = CoordinatorClient.call

    def spy(
        self: CoordinatorClient,
        key_type: int,
        key: str,
        method: str,
        request: Any,
        *a: Any,
        **k: Any,
    ) -> Any:
        calls.append((method, request))
        return original(self, key_type, key, method, request, *a, **k)

    monkeypatch.setattr(CoordinatorClient, "call", spy)
    return calls


def leader_stub(cluster: LocalCluster, transactional_id: str) -> Any:
    """A stub of the shard leader of ``transactional_id``."""
    answer = coordinator_pb2_grpc.TransactionCoordinatorStub(
        grpc.insecure_channel(cluster.bootstrap()[0])
    ).FindCoordinator(
        coordinator_pb2.FindCoordinatorRequest(
            key=transactional_id, key_type=coordinator_pb2.TRANSACTION
        ),
        timeout=5,
    )
    assert answer.error_code == ErrorCode.NONE, answer
    return coordinator_pb2_grpc.TransactionCoordinatorStub(grpc.insecure_channel(answer.address))


def init(stub: Any, transactional_id: str) -> tuple[int, int]:
    answer = stub.InitProducerId(
        coordinator_pb2.InitProducerIdRequest(
            transactional_id=transactional_id, transaction_timeout_ms=60_000
        ),
        timeout=10,
    )
    assert answer.error_code == ErrorCode.NONE, answer
    return int(answer.producer_id), int(answer.producer_epoch)


def describe(cluster: LocalCluster, transactional_id: str) -> tuple[str, set[tuple[str, int]]]:
    with Admin(cluster.bootstrap()) as admin:
        found = admin.describe_transactions([transactional_id])[transactional_id]
    return found.state, {(tp.topic, tp.partition) for tp in found.partitions}


def test_a_producer_commits_and_aborts_without_adding_partitions(
    cluster: LocalCluster, coordinator_calls: list[tuple[str, Any]]
) -> None:
    partitions = create(cluster, "adds-eos", 3)
    with TransactionalProducer(cluster.bootstrap(), transactional_id="adds-eos") as producer:
        producer.init_transactions()
        for round_ in range(3):
            producer.begin_transaction()
            for tp in partitions:
                producer.send(
                    tp.topic, value=b"c%d-%d" % (round_, tp.partition), partition=tp.partition
                )
            producer.commit_transaction()
        producer.begin_transaction()
        for tp in partitions:
            producer.send(tp.topic, value=b"a-%d" % tp.partition, partition=tp.partition)
        producer.flush()
        producer.abort_transaction()
    methods = [method for method, _ in coordinator_calls]
    assert "AddPartitionsToTxn" not in methods
    assert methods.count("EndTxn") == 4
    committed = sorted(read(cluster, partitions, committed=True))
    assert committed == sorted(b"c%d-%d" % (r, p) for r in range(3) for p in range(3))
    everything = read(cluster, partitions, committed=False)
    assert sorted(everything) == sorted(committed + [b"a-%d" % p for p in range(3)])
    assert describe(cluster, "adds-eos")[0] == "CompleteAbort"


def test_a_fenced_producers_batch_is_refused_and_changes_nothing(cluster: LocalCluster) -> None:
    topic, tid = "adds-zombie", "adds-zombie"
    nodes = plog_client.create_topic(cluster, topic, 2)
    stub = leader_stub(cluster, tid)
    pid, zombie_epoch = init(stub, tid)
    assert init(stub, tid) == (pid, zombie_epoch + 1)  # the successor fences the zombie

    def produce(partition: int, epoch: int, value: bytes) -> Any:
        return plog_client.produce(
            plog_client.stub(nodes[partition]),
            topic,
            partition,
            [value],
            producer_id=pid,
            epoch=epoch,
            sequence=0,
            transactional=True,
            transactional_id=tid,
        )

    refused = produce(0, zombie_epoch, b"zombie")
    assert refused.error_code == ErrorCode.PRODUCER_FENCED, refused
    assert describe(cluster, tid) == ("Empty", set())  # no transaction started
    assert produce(1, zombie_epoch + 1, b"successor").error_code == ErrorCode.NONE
    assert describe(cluster, tid) == ("Ongoing", {(topic, 1)})
    refused = produce(0, zombie_epoch, b"zombie-again")
    assert refused.error_code == ErrorCode.PRODUCER_FENCED, refused
    assert describe(cluster, tid) == ("Ongoing", {(topic, 1)})  # not added
    for partition in (0, 1):
        values = [
            v
            for _, v in plog_client.read_all(
                plog_client.stub(nodes[partition]), topic, partition, committed=False
            )[0]
        ]
        assert values == ([b"successor"] if partition == 1 else [])


def test_one_batched_request_answers_each_transaction(cluster: LocalCluster) -> None:
    topic = "adds-batched"
    create(cluster, topic, 2)
    bootstrap_stub = coordinator_pb2_grpc.TransactionCoordinatorStub(
        grpc.insecure_channel(cluster.bootstrap()[0])
    )
    # Two transactional ids whose shards one node leads.
    by_leader: dict[str, list[str]] = {}
    for i in range(200):
        tid = f"adds-batched-{i}"
        found = bootstrap_stub.FindCoordinator(
            coordinator_pb2.FindCoordinatorRequest(key=tid, key_type=coordinator_pb2.TRANSACTION),
            timeout=5,
        )
        by_leader.setdefault(found.address, []).append(tid)
        if len(by_leader[found.address]) == 2:
            address, (good, fenced) = found.address, by_leader[found.address]
            break
    stub = coordinator_pb2_grpc.TransactionCoordinatorStub(grpc.insecure_channel(address))
    good_pid, good_epoch = init(stub, good)
    fenced_pid, fenced_epoch = init(stub, fenced)

    def add(tid: str, pid: int, epoch: int, **extra: Any) -> Any:
        return coordinator_pb2.AddPartitionsToTxnRequest(
            transactional_id=tid,
            producer_id=pid,
            producer_epoch=epoch,
            topics=[common_pb2.TopicPartitions(topic=topic, partitions=[0, 1])],
            **extra,
        )

    answer = stub.AddPartitionsToTxn(
        coordinator_pb2.AddPartitionsToTxnRequest(
            transactions=[
                add(good, good_pid, good_epoch),
                add(fenced, fenced_pid, fenced_epoch + 1),
                add(good, good_pid, good_epoch, transactions=[add(good, good_pid, good_epoch)]),
            ]
        ),
        timeout=10,
    )
    assert answer.error_code == ErrorCode.NONE, answer
    assert [t.error_code for t in answer.transactions] == [
        ErrorCode.NONE,
        ErrorCode.PRODUCER_FENCED,
        ErrorCode.INVALID_REQUEST,
    ]
    assert [r.error_code for r in answer.transactions[0].results] == [ErrorCode.NONE] * 2
    assert describe(cluster, good) == ("Ongoing", {(topic, 0), (topic, 1)})
    assert describe(cluster, fenced) == ("Empty", set())


@pytest.fixture
def unverified(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(
        tmp_path / "cluster", settings={"transaction.partition.verification.enable": False}
    ) as made:
        yield made


def test_without_verification_the_producer_adds_its_partitions(
    unverified: LocalCluster, coordinator_calls: list[tuple[str, Any]]
) -> None:
    partitions = create(unverified, "adds-off", 2)
    with TransactionalProducer(unverified.bootstrap(), transactional_id="adds-off") as producer:
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
    # Per transaction, each partition is added once, before its batch: in
    # one call when both batches are ready together, in one call each when
    # the sender finds the first batch ready (lingered) before the second
    # record is sent.
    methods = [method for method, _ in coordinator_calls]
    assert methods[0] == "InitProducerId" and methods.count("EndTxn") == 2, methods
    added: list[list[tuple[str, int]]] = [[]]
    for method, request in coordinator_calls[1:]:
        if method == "EndTxn":
            added.append([])
        elif method == "AddPartitionsToTxn":
            added[-1] += [(t.topic, p) for t in request.topics for p in t.partitions]
    assert added == [sorted(partitions)] * 2 + [[]], methods
    assert sorted(read(unverified, partitions, committed=True)) == [b"commit-0", b"commit-1"]
    assert len(read(unverified, partitions, committed=False)) == 4


@pytest.fixture
def stalling(tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster whose coordinators park requests, and whose partition-log
    nodes wait after CONCURRENT_TRANSACTIONS, for far longer than the test
    runs."""
    with running_cluster(
        tmp_path / "cluster",
        settings={
            "transaction.park.timeout.ms": 60_000,
            "add.partitions.to.txn.retry.backoff.max.ms": 60_000,
        },
    ) as made:
        yield made


def test_a_completing_transaction_does_not_hold_up_another_ids_first_batch(
    stalling: LocalCluster,
) -> None:
    """X's previous transaction cannot complete (the node of one of its
    partitions is paused) while X's next transaction's first batch asks,
    from another node, to add a partition: the coordinator parks X's add
    in that node's batched call over the cluster link. Meanwhile Y, whose shard has the
    same leader, commits a transaction through the same node, before X's
    batch is answered: X's parked add holds up no batch of that node.
    Asked directly, the coordinator holds a batched add of X for the
    completion only when asked to, and then no longer than the request says
    (``wait_for_completion_ms``), however long it could park it."""
    cluster = stalling
    topic = "adds-stall"
    nodes = plog_client.create_topic(cluster, topic, 3)
    paused_partition = 0
    other = next(p for p, address in nodes.items() if address != nodes[paused_partition])
    paused_node = next(n.node_id for n in cluster.partition_nodes() if n.grpc == nodes[0])
    bootstrap = coordinator_pb2_grpc.TransactionCoordinatorStub(
        grpc.insecure_channel(cluster.bootstrap()[0])
    )
    # Two transactional ids of one shard: one leader, one destination for the node's adds.
    by_shard: dict[int, list[Any]] = {}
    for i in range(200):
        found = bootstrap.FindCoordinator(
            coordinator_pb2.FindCoordinatorRequest(
                key=f"adds-stall-{i}", key_type=coordinator_pb2.TRANSACTION
            ),
            timeout=5,
        )
        assert found.error_code == ErrorCode.NONE, found
        by_shard.setdefault(found.shard, []).append((f"adds-stall-{i}", found))
        if len(by_shard[found.shard]) == 2:
            (x, found), (y, _) = by_shard[found.shard]
            break
    stub = coordinator_pb2_grpc.TransactionCoordinatorStub(grpc.insecure_channel(found.address))

    def produce(tid: str, pid: int, epoch: int, partition: int, timeout_s: float = 10) -> Any:
        return plog_client.produce(
            plog_client.stub(nodes[partition]),
            topic,
            partition,
            [tid.encode()],
            producer_id=pid,
            epoch=epoch,
            sequence=0,
            transactional=True,
            transactional_id=tid,
            timeout_s=timeout_s,
        )

    def commit(tid: str, pid: int, epoch: int) -> Any:
        answer = stub.EndTxn(
            coordinator_pb2.EndTxnRequest(
                transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=True
            ),
            timeout=10,
        )
        assert answer.error_code == ErrorCode.NONE, answer
        return answer

    def accepts_plain_batches(partition: int) -> bool:
        answer = plog_client.produce(plog_client.stub(nodes[partition]), topic, partition, [b"-"])
        return bool(answer.error_code == ErrorCode.NONE)

    for partition in (paused_partition, other):  # both nodes know the topic
        cluster.wait_until(
            lambda p=partition: accepts_plain_batches(p), 30, f"partition {partition} refuses"
        )
    x_pid, x_epoch = init(stub, x)
    assert produce(x, x_pid, x_epoch, paused_partition).error_code == ErrorCode.NONE
    cluster.kill(paused_node, "STOP")
    try:
        ended = commit(x, x_pid, x_epoch)  # its markers wait for the paused node
        assert describe(cluster, x)[0] == "PrepareCommit"
        x_add = coordinator_pb2.AddPartitionsToTxnRequest(
            transactional_id=x,
            producer_id=ended.producer_id,
            producer_epoch=ended.producer_epoch,
            topics=[common_pb2.TopicPartitions(topic=topic, partitions=[other])],
        )
        for wait, wait_ms in ((False, 0), (True, 300)):
            started = time.monotonic()
            answer = stub.AddPartitionsToTxn(
                coordinator_pb2.AddPartitionsToTxnRequest(
                    transactions=[x_add], wait_for_completion=wait, wait_for_completion_ms=wait_ms
                ),
                timeout=20,
            )
            held = time.monotonic() - started
            assert answer.error_code == ErrorCode.NONE, answer
            (x_answer,) = answer.transactions
            assert x_answer.error_code == ErrorCode.CONCURRENT_TRANSACTIONS, x_answer
            if wait:  # parked for its 300 ms, not for the 60 s the cluster allows
                assert 0.3 <= held < 10, held
        assert describe(cluster, x)[0] == "PrepareCommit"
        x_answers: list[Any] = []

        def next_batch() -> None:
            try:
                x_answers.append(
                    produce(x, ended.producer_id, ended.producer_epoch, other, timeout_s=90)
                )
            except Exception as exc:  # surfaced by the test
                x_answers.append(exc)

        def parked() -> int:
            status = cluster.node_status(found.node_id)
            assert status is not None
            return int(status.shards[found.shard].parked_requests)

        thread = threading.Thread(target=next_batch)
        thread.start()
        cluster.wait_until(lambda: parked() == 1, 30, "X's add is not parked")
        y_pid, y_epoch = init(stub, y)
        assert produce(y, y_pid, y_epoch, other).error_code == ErrorCode.NONE
        commit(y, y_pid, y_epoch)
        # Y committed while X's batch is still unanswered; only X's add is parked.
        assert not x_answers, x_answers
        assert parked() == 1
        assert describe(cluster, x)[0] == "PrepareCommit"
    finally:
        cluster.kill(paused_node, "CONT")
    # The completion applies: X's batch is added to its next transaction.
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert x_answers[0].error_code == ErrorCode.NONE, x_answers
    assert describe(cluster, x) == ("Ongoing", {(topic, other)})


def test_each_transaction_of_a_shared_link_call_is_answered_on_its_own(
    stalling: LocalCluster,
) -> None:
    """One batched AddPartitionsToTxn over the coordinator's cluster link,
    as partition-log nodes send it, carries three producers' adds: X's
    previous transaction cannot complete (the node of its partition is
    paused), Z's producer is fenced (its id was initialised again), W's is
    fine. W is added and Z refused PRODUCER_FENCED at once, each in an
    answer of its own, while X's add is parked (the call is told) and,
    with no second call, answered once the completion applies: added."""
    cluster = stalling
    topic = "adds-shared"
    nodes = plog_client.create_topic(cluster, topic, 3)
    other = next(p for p, address in nodes.items() if address != nodes[0])
    paused_node = next(n.node_id for n in cluster.partition_nodes() if n.grpc == nodes[0])
    bootstrap = coordinator_pb2_grpc.TransactionCoordinatorStub(
        grpc.insecure_channel(cluster.bootstrap()[0])
    )
    by_shard: dict[int, list[str]] = {}
    for i in range(400):  # three transactional ids of one shard: one leader, one call
        found = bootstrap.FindCoordinator(
            coordinator_pb2.FindCoordinatorRequest(
                key=f"adds-shared-{i}", key_type=coordinator_pb2.TRANSACTION
            ),
            timeout=5,
        )
        assert found.error_code == ErrorCode.NONE, found
        by_shard.setdefault(found.shard, []).append(f"adds-shared-{i}")
        if len(by_shard[found.shard]) == 3:
            x, w, z = by_shard[found.shard]
            break
    stub = coordinator_pb2_grpc.TransactionCoordinatorStub(grpc.insecure_channel(found.address))
    config = load_config(cluster.data_dir / CONFIG_FILE)
    (link_address,) = [n.link for n in config.coordinators if n.grpc == found.address]
    assert link_address is not None
    cluster.wait_until(
        lambda: (
            plog_client.produce(plog_client.stub(nodes[0]), topic, 0, [b"-"]).error_code
            == ErrorCode.NONE
        ),
        30,
        "partition 0 refuses",
    )
    x_pid, x_epoch = init(stub, x)
    first = plog_client.produce(
        plog_client.stub(nodes[0]),
        topic,
        0,
        [b"x"],
        producer_id=x_pid,
        epoch=x_epoch,
        sequence=0,
        transactional=True,
        transactional_id=x,
    )
    assert first.error_code == ErrorCode.NONE, first
    w_pid, w_epoch = init(stub, w)
    z_pid, z_epoch = init(stub, z)
    assert init(stub, z)[1] > z_epoch  # z's first producer is fenced now

    def add(tid: str, pid: int, epoch: int) -> Any:
        return coordinator_pb2.AddPartitionsToTxnRequest(
            transactional_id=tid,
            producer_id=pid,
            producer_epoch=epoch,
            topics=[common_pb2.TopicPartitions(topic=topic, partitions=[other])],
        )

    answers: dict[int, Any] = {}
    answered = threading.Condition()

    def deliver(item: int, answer: Any) -> None:
        with answered:
            answers[item] = answer
            answered.notify_all()

    link = ConcurrentLink(link_address, None)
    cluster.kill(paused_node, "STOP")
    try:
        ended = stub.EndTxn(
            coordinator_pb2.EndTxnRequest(
                transactional_id=x, producer_id=x_pid, producer_epoch=x_epoch, committed=True
            ),
            timeout=10,
        )
        assert ended.error_code == ErrorCode.NONE, ended
        assert describe(cluster, x)[0] == "PrepareCommit"  # its markers wait for the paused node
        whole = link.call_items(
            ADD_PARTITIONS_TO_TXN,
            coordinator_pb2.AddPartitionsToTxnRequest(
                transactions=[
                    add(x, ended.producer_id, ended.producer_epoch),
                    add(w, w_pid, w_epoch),
                    add(z, z_pid, z_epoch),
                ],
                wait_for_completion=True,
                wait_for_completion_ms=60_000,
            ),
            90,
            deliver,
        )
        assert whole is None  # answered transaction by transaction
        with answered:  # returned with W and Z answered and X parked
            assert sorted(answers) == [1, 2], answers
            assert answers[1].error_code == ErrorCode.NONE, answers[1]
            assert answers[2].error_code == ErrorCode.PRODUCER_FENCED, answers[2]
        assert describe(cluster, w) == ("Ongoing", {(topic, other)})
        assert describe(cluster, z) == ("Empty", set())
        assert describe(cluster, x)[0] == "PrepareCommit"
    finally:
        cluster.kill(paused_node, "CONT")
    try:
        with answered:
            assert answered.wait_for(lambda: 0 in answers, 60), "X's add never answered"
        assert answers[0].error_code == ErrorCode.NONE, answers[0]
        assert describe(cluster, x) == ("Ongoing", {(topic, other)})
    finally:
        link.close()


def applied_index(cluster: LocalCluster, node_id: int, shard: int) -> int:
    status = cluster.node_status(node_id)
    assert status is not None
    return int(status.shards[shard].applied_index)


def test_the_nodes_of_one_flush_add_its_partitions_with_one_entry(cluster: LocalCluster) -> None:
    """A transaction whose two partitions live on two partition-log nodes:
    each Produce names the flush's partitions, both nodes ask the
    coordinator for the same add, and the one that arrives second is
    answered with the first one's outcome: a transaction is at most 3 Raft
    entries (the add, EndTxn, the completion) instead of 4; fewer (about
    2.5 on a quiet 2-core machine) when the add arrives while the previous
    transaction's markers are being written, as it then goes into the
    completion's entry."""
    partitions = create(cluster, "adds-one-entry", 2)
    with grpc.insecure_channel(cluster.bootstrap()[0]) as channel:
        metadata = coordinator_pb2_grpc.TransactionCoordinatorStub(channel).Metadata(
            coordinator_pb2.MetadataRequest(topics=["adds-one-entry"]), timeout=10
        )
    owners = {p.node_id for t in metadata.topics for p in t.partitions}
    assert len(owners) == 2, metadata  # on two nodes
    tid, rounds = "adds-one-entry", 20
    shard = shard_for(tid, 3)
    leader = cluster.leaders()[shard]
    with TransactionalProducer(cluster.bootstrap(), transactional_id=tid) as producer:
        producer.init_transactions()

        def transaction(n: int) -> None:
            producer.begin_transaction()
            for tp in partitions:
                producer.send(tp.topic, value=b"%d-%d" % (n, tp.partition), partition=tp.partition)
            producer.commit_transaction()

        transaction(-1)
        cluster.wait_until(lambda: describe(cluster, tid)[0] == "CompleteCommit", 30, "completion")
        before = applied_index(cluster, leader, shard)
        for n in range(rounds):
            transaction(n)
        cluster.wait_until(lambda: describe(cluster, tid)[0] == "CompleteCommit", 30, "completion")
        entries = applied_index(cluster, leader, shard) - before
    assert cluster.leaders()[shard] == leader
    assert entries < 3.5 * rounds, f"{entries} entries for {rounds} transactions"
    assert sorted(read(cluster, partitions, committed=True)) == sorted(
        b"%d-%d" % (n, p) for n in range(-1, rounds) for p in range(2)
    )
