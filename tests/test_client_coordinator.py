"""The client library against real clusters (LocalCluster: coordinator
processes and partition-log processes on loopback).

The first half needs only the coordinators: producer ids, offsets-only
transactions, fencing, admin calls, group offsets, coordinator discovery
and a shard leader killed between calls. The second half writes and reads
records through the partition-log nodes; faults (lost answers, failing
nodes) are injected through the client's channel factory, so the real
nodes see exactly what a real network would deliver.

Long on purpose: the cases of one component, sharing this module's helpers
and fixtures.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftcoord.client import (
    Admin,
    Consumer,
    ConsumerRecord,
    IllegalStateError,
    KafkaConnectionError,
    KafkaTimeoutError,
    Producer,
    ProducerFencedError,
    TopicAlreadyExistsError,
    TopicPartition,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionalProducer,
)
from raftcoord.client._net import CHANNEL_OPTIONS, client_closed
from raftcoord.client.errors import (
    InvalidPartitionsError,
    InvalidTopicError,
    RecordTooLargeError,
    TransactionalIdNotFoundError,
)
from raftcoord.client.partitioner import murmur2
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.channels import ChannelCache
from raftcoord.protocol.routing import shard_for
from raftcoord.protocol.v1 import (
    coordinator_pb2,
    coordinator_pb2_grpc,
    partition_log_pb2,
)
from raftcoord.protocol.v1.common_pb2 import ErrorCode
from tests.local_cluster import running_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One cluster (3 coordinators, 3 shards, 3 partition-log nodes) for the
    tests that do not fault it; every test uses its own ids and topics."""
    with running_cluster(tmp_path_factory.mktemp("client") / "cluster") as running:
        yield running


@pytest.fixture(scope="module")
def bootstrap(cluster: LocalCluster) -> list[str]:
    return cluster.bootstrap()


@pytest.fixture(scope="module")
def topics(bootstrap: list[str]) -> dict[str, int]:
    wanted = {"orders": 3, "txn-out": 3, "idem": 2, "dedupe": 2, "fail": 1, "fence": 1}
    with Admin(bootstrap) as admin:
        admin.create_topics(wanted, exist_ok=True)
    return wanted


def describe(bootstrap: list[str], tid: str) -> Any:
    with Admin(bootstrap) as admin:
        return admin.describe_transactions([tid])[tid]


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout_s} s")
        time.sleep(0.05)


def read_all(
    bootstrap: list[str], tps: list[TopicPartition], isolation: str, settle_s: float = 0.3
) -> list[ConsumerRecord]:
    """Everything readable now from ``tps`` (polls until a quiet ``settle_s``)."""
    records: list[ConsumerRecord] = []
    with Consumer(bootstrap, isolation_level=isolation) as consumer:
        consumer.assign(tps)
        while True:
            batch = consumer.poll(timeout_ms=int(settle_s * 1000))
            if not batch:
                return records
            records.extend(batch)


# --- coordinators only ---------------------------------------------------------------------


def test_init_transactions_gets_a_producer_id_and_epoch(bootstrap: list[str]) -> None:
    with TransactionalProducer(bootstrap, "init-1", transaction_timeout_ms=45_000) as producer:
        assert producer.producer_id == -1
        producer.init_transactions()
        assert producer.producer_id >= 0 and producer.producer_epoch >= 0
        assert producer.state == "ready"
        meta = describe(bootstrap, "init-1")
        assert (meta.producer_id, meta.producer_epoch) == (
            producer.producer_id,
            producer.producer_epoch,
        )
        assert meta.state == "Empty" and meta.transaction_timeout_ms == 45_000
        with pytest.raises(IllegalStateError):
            producer.init_transactions()


def test_offsets_only_transaction_commits_and_adopts_the_new_epoch(bootstrap: list[str]) -> None:
    tp = TopicPartition("in", 0)
    with TransactionalProducer(bootstrap, "offsets-1") as producer:
        producer.init_transactions()
        pid, epoch = producer.producer_id, producer.producer_epoch
        producer.begin_transaction()
        producer.send_offsets_to_transaction({tp: 42}, "group-offsets-1")
        meta = describe(bootstrap, "offsets-1")
        assert meta.state == "Ongoing" and meta.groups == {"group-offsets-1"}
        producer.commit_transaction()
        # KIP-890: EndTxn bumped the epoch; the producer uses the new one.
        assert (producer.producer_id, producer.producer_epoch) == (pid, epoch + 1)
        assert producer.state == "ready"
        meta = describe(bootstrap, "offsets-1")
        assert meta.state in ("PrepareCommit", "CompleteCommit")
        assert (meta.producer_id, meta.producer_epoch) == (pid, epoch + 1)
    with Consumer(bootstrap, group_id="group-offsets-1") as consumer:
        try:
            committed = consumer.committed(tp, timeout_ms=10_000)
        except KafkaTimeoutError:
            # The group's marker has not arrived: the offset is still pending.
            assert describe(bootstrap, "offsets-1").state == "PrepareCommit"
        else:
            assert committed == 42


def test_a_transaction_with_nothing_in_it_stays_local(bootstrap: list[str]) -> None:
    with TransactionalProducer(bootstrap, "empty-1") as producer:
        producer.init_transactions()
        identity = (producer.producer_id, producer.producer_epoch)
        producer.begin_transaction()
        producer.commit_transaction()
        producer.begin_transaction()
        producer.abort_transaction()
        assert (producer.producer_id, producer.producer_epoch) == identity
        assert describe(bootstrap, "empty-1").state == "Empty"


def test_misuse_raises_illegal_state(bootstrap: list[str]) -> None:
    with TransactionalProducer(bootstrap, "misuse-1") as producer:
        with pytest.raises(IllegalStateError):
            producer.begin_transaction()  # before init_transactions
        producer.init_transactions()
        for call in (
            producer.commit_transaction,
            producer.abort_transaction,
            lambda: producer.send_offsets_to_transaction({TopicPartition("in", 0): 1}, "g"),
        ):
            with pytest.raises(IllegalStateError):
                call()
        producer.begin_transaction()
        with pytest.raises(IllegalStateError):
            producer.begin_transaction()
    with pytest.raises(IllegalStateError):
        producer.begin_transaction()  # closed


def test_zombie_is_fenced_at_init_and_stays_fenced(bootstrap: list[str]) -> None:
    tp = TopicPartition("in", 0)
    with (
        TransactionalProducer(bootstrap, "zombie-1") as old,
        TransactionalProducer(bootstrap, "zombie-1") as new,
    ):
        old.init_transactions()
        new.init_transactions()
        assert new.producer_id == old.producer_id
        assert new.producer_epoch > old.producer_epoch
        old.begin_transaction()  # local: nothing to fence yet
        with pytest.raises(ProducerFencedError):
            old.send_offsets_to_transaction({tp: 7}, "zombie-group")
        for call in (
            old.commit_transaction,
            old.abort_transaction,
            old.begin_transaction,
            old.init_transactions,
            lambda: old.send("orders", b"late"),
        ):
            with pytest.raises(ProducerFencedError):
                call()
        assert old.state == "fatal-error"
        new.begin_transaction()
        new.send_offsets_to_transaction({tp: 8}, "zombie-group")
        new.commit_transaction()


def test_admin_creates_and_lists_topics(bootstrap: list[str]) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topics({"admin-a": 3, "admin-b": 1})
        # Any coordinator answers Metadata; a follower may lag for a moment.
        wait_for(
            lambda: {"admin-a": 3, "admin-b": 1}.items() <= admin.list_topics().items(),
            10,
            "topics not listed",
        )
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics({"admin-a": 3})
        admin.create_topics({"admin-a": 3, "admin-c": 2}, exist_ok=True)
        with pytest.raises(InvalidPartitionsError):
            admin.create_topics({"admin-zero": 0})
        with pytest.raises(InvalidTopicError):
            admin.create_topics({"bad name!": 1})
        admin.create_topics({"admin-validate": 2}, validate_only=True)
        with pytest.raises(InvalidTopicError):  # validating checks the name too
            admin.create_topics({"bad name!": 1}, validate_only=True)
        wait_for(lambda: "admin-c" in admin.list_topics(), 10, "admin-c not listed")
        assert "admin-validate" not in admin.list_topics()
        cluster = admin.describe_cluster()
        assert len(cluster["coordinators"]) == 3 and len(cluster["partition_nodes"]) == 3


def test_list_transactions_asks_every_coordinator_and_describe_routes_each_id(
    bootstrap: list[str],
) -> None:
    ids = [f"listed-{i}" for i in range(6)]
    assert len({shard_for(tid, 3) for tid in ids}) == 3  # every shard is involved
    producers = [TransactionalProducer(bootstrap, tid) for tid in ids]
    try:
        for producer in producers:
            producer.init_transactions()
        producers[0].begin_transaction()
        producers[0].send_offsets_to_transaction({TopicPartition("in", 0): 1}, "listed-group")
        with Admin(bootstrap) as admin:
            listed = {t.transactional_id: t for t in admin.list_transactions()}
            assert set(ids) <= set(listed)
            assert listed["listed-0"].state == "Ongoing" and listed["listed-0"].duration_ms >= 0
            assert listed["listed-1"].state == "Empty"
            ongoing = {t.transactional_id for t in admin.list_transactions(states=["Ongoing"])}
            assert "listed-0" in ongoing and "listed-1" not in ongoing
            by_pid = admin.list_transactions(producer_ids=[producers[2].producer_id])
            assert [t.transactional_id for t in by_pid] == ["listed-2"]
            described = admin.describe_transactions(ids)
            assert set(described) == set(ids)
            assert described["listed-0"].groups == {"listed-group"}
            assert described["listed-3"].producer_id == producers[3].producer_id
            with pytest.raises(TransactionalIdNotFoundError):
                admin.describe_transactions(["listed-1", "never-used-id"])
            with pytest.raises(ValueError):
                admin.list_transactions(states=["Bogus"])
    finally:
        for producer in producers:
            producer.close()


def test_consumer_commits_and_reads_group_offsets(bootstrap: list[str]) -> None:
    a, b = TopicPartition("group-topic", 0), TopicPartition("group-topic", 1)
    with Consumer(bootstrap, group_id="plain-group") as consumer:
        assert consumer.committed(a) is None
        consumer.commit({a: 5, b: 9})
        assert (consumer.committed(a), consumer.committed(b)) == (5, 9)
        consumer.commit({a: 6})
        assert consumer.committed(a) == 6
    with Consumer(bootstrap, group_id="other-group") as other:
        assert other.committed(a) is None
    with Consumer(bootstrap) as no_group:
        with pytest.raises(IllegalStateError):
            no_group.committed(a)
        with pytest.raises(IllegalStateError):
            no_group.commit({a: 1})


def test_discovery_survives_a_dead_bootstrap_address(bootstrap: list[str]) -> None:
    from raftcoord.cluster.launcher import free_ports

    dead = f"127.0.0.1:{free_ports(1)[0]}"
    for live in bootstrap:
        # Only one live node is named: FindCoordinator there finds every leader.
        with TransactionalProducer([dead, live], f"discover-{live}") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send_offsets_to_transaction({TopicPartition("in", 0): 3}, f"g-{live}")
            producer.commit_transaction()


def test_coordinator_calls_fail_at_once_when_no_coordinator_was_ever_reached() -> None:
    from raftcoord.cluster.launcher import free_ports

    dead = [f"127.0.0.1:{p}" for p in free_ports(2)]
    with TransactionalProducer(dead, "nobody-home", request_timeout_ms=30_000) as producer:
        started = time.monotonic()
        with pytest.raises(KafkaConnectionError, match=f"no coordinator answers at .*{dead[1]}"):
            producer.init_transactions()
        assert time.monotonic() - started < 3  # not the 30 s request timeout
        assert producer.state == "initializing"  # may be called again


def test_a_killed_shard_leader_is_rediscovered(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "cluster", partition_nodes=0) as faulted:
        tid = "leader-kill-1"
        bootstrap = faulted.bootstrap()
        with TransactionalProducer(bootstrap, tid) as producer:
            producer.init_transactions()
            leader = faulted.wait_for_leaders()[shard_for(tid, 3)]
            faulted.kill(leader, "KILL")
            producer.begin_transaction()
            producer.send_offsets_to_transaction({TopicPartition("in", 0): 11}, "kill-group")
            producer.commit_transaction()
            assert producer.state == "ready"
            survivors = [n.grpc for n in faulted.coordinators() if n.node_id != leader]
            assert describe(survivors, tid).state in ("PrepareCommit", "CompleteCommit")


# --- with partition-log nodes --------------------------------------------------------------


class InjectedRpcError(grpc.RpcError):
    """A transport failure made up by the test."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "injected by the test"


class Settled:
    """A finished call, shaped like the future ``Stub.Method.future`` returns."""

    def __init__(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error

    def result(self, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        return self._result

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        callback(self)


class RecordingChannels(ChannelCache):
    """Real channels whose Produce calls are recorded and can be faulted, and
    whose coordinator calls are counted per method."""

    def __init__(self) -> None:
        super().__init__(CHANNEL_OPTIONS, closed_error=client_closed)
        self.lock = threading.Lock()
        self.produced: list[tuple[str, Any]] = []
        self.coordinator_calls: Counter[str] = Counter()
        #: Forward the next N Produce requests, then lose their answers.
        self.lose_answers = 0
        #: Fail the next N Produce requests without forwarding them.
        self.fail_requests = 0
        #: Answer the next N Produce requests NOT_LEADER_OR_FOLLOWER.
        self.not_leader = 0
        #: Coordinator method -> forward the next N calls, then lose their answers.
        self.lose_coordinator_answers: Counter[str] = Counter()
        #: Coordinator method -> fail the next N calls without forwarding them.
        self.fail_coordinator_calls: Counter[str] = Counter()

    def partition_log(self, address: str) -> Any:
        return _PartitionLogStub(self, address, super().partition_log(address))

    def coordinator(self, address: str) -> Any:
        return _CountingStub(self, super().coordinator(address))


class _CountingStub:
    def __init__(self, owner: RecordingChannels, stub: Any) -> None:
        self._owner, self._stub = owner, stub

    def __getattr__(self, method: str) -> Any:
        def call(request: Any, **kwargs: Any) -> Any:
            owner = self._owner
            with owner.lock:
                owner.coordinator_calls[method] += 1
                fail = owner.fail_coordinator_calls[method] > 0
                lose = not fail and owner.lose_coordinator_answers[method] > 0
                owner.fail_coordinator_calls[method] -= fail
                owner.lose_coordinator_answers[method] -= lose
            if fail:
                raise InjectedRpcError()
            answer = getattr(self._stub, method)(request, **kwargs)
            if lose:
                raise InjectedRpcError()
            return answer

        return call


class _Produce:
    def __init__(self, owner: RecordingChannels, address: str, stub: Any) -> None:
        self._owner, self._address, self._stub = owner, address, stub

    def __call__(self, request: Any, timeout: float) -> Any:
        return self.future(request, timeout).result()

    def future(self, request: Any, timeout: float) -> Any:
        owner = self._owner
        with owner.lock:
            owner.produced.append((self._address, request))
            fail, lose, not_leader = owner.fail_requests, owner.lose_answers, owner.not_leader
            owner.fail_requests = max(0, fail - 1)
            owner.lose_answers = max(0, lose - 1) if not fail else lose
            owner.not_leader = max(0, not_leader - 1) if not (fail or lose) else not_leader
        if fail:
            return Settled(error=InjectedRpcError())
        if lose:
            self._stub.Produce(request, timeout=timeout)  # written, answer lost
            return Settled(error=InjectedRpcError())
        if not_leader:
            return Settled(
                partition_log_pb2.ProduceResponse(
                    partitions=[
                        partition_log_pb2.PartitionProduceResponse(
                            topic=p.topic,
                            partition=p.partition,
                            error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
                            base_offset=-1,
                        )
                        for p in request.partitions
                    ]
                )
            )
        return self._stub.Produce.future(request, timeout=timeout)


class _PartitionLogStub:
    def __init__(self, owner: RecordingChannels, address: str, stub: Any) -> None:
        self.Produce = _Produce(owner, address, stub)
        self._stub = stub

    def __getattr__(self, method: str) -> Any:
        return getattr(self._stub, method)


def placement(bootstrap: list[str], topic: str) -> dict[TopicPartition, str]:
    """partition -> address of its partition-log node, from the coordinators."""
    with grpc.insecure_channel(bootstrap[0]) as channel:
        stub = coordinator_pb2_grpc.TransactionCoordinatorStub(channel)
        answer = stub.Metadata(coordinator_pb2.MetadataRequest(topics=[topic]), timeout=5)
    nodes = {n.node_id: n.address for n in answer.partition_nodes}
    [meta] = answer.topics
    return {TopicPartition(topic, p.partition): nodes[p.node_id] for p in meta.partitions}


def test_idempotent_producer_round_trip(bootstrap: list[str], topics: dict[str, int]) -> None:
    tps = [TopicPartition("idem", p) for p in range(topics["idem"])]
    channels = RecordingChannels()
    sent = {f"key-{i}".encode(): f"value-{i}".encode() for i in range(40)}
    with Producer(bootstrap, channels=channels) as producer:
        futures = {
            key: producer.send("idem", value, key=key, headers=[("h", key)])
            for key, value in sent.items()
        }
        null_key = producer.send("idem", None, partition=1, timestamp_ms=1234)
        producer.flush()
        assert producer.producer_id >= 0
        metadata = {key: f.result(0) for key, f in futures.items()}
    for key, meta in metadata.items():
        assert meta.partition == (murmur2(key) & 0x7FFFFFFF) % 2  # Kafka's default partitioner
    for tp in tps:
        offsets = sorted(m.offset for m in metadata.values() if m.partition == tp.partition)
        offsets += [null_key.result(0).offset] if tp.partition == 1 else []
        assert sorted(offsets) == list(range(len(offsets)))  # dense, no duplicates
    # One request per node per round; every batch goes to the node owning it.
    owners = placement(bootstrap, "idem")
    for address, request in channels.produced:
        names = [(p.topic, p.partition) for p in request.partitions]
        assert len(names) == len(set(names))
        assert all(owners[TopicPartition(*n)] == address for n in names)
        assert all(not p.batch.is_transactional for p in request.partitions)
    records = read_all(bootstrap, tps, "read_uncommitted")
    got = {r.key: r for r in records if r.key is not None}
    assert {k: r.value for k, r in got.items()} == sent
    assert all(r.headers == [("h", r.key)] for r in got.values())
    [tombstone] = [r for r in records if r.key is None]
    assert (tombstone.value, tombstone.partition, tombstone.timestamp_ms) == (None, 1, 1234)
    for tp in tps:
        offsets = [r.offset for r in records if r.partition == tp.partition]
        assert offsets == sorted(offsets)
    with Consumer(bootstrap) as consumer:
        ends = consumer.end_offsets(tps)
        assert sum(ends.values()) == len(sent) + 1
        assert consumer.beginning_offsets(tps) == dict.fromkeys(tps, 0)
        consumer.assign([tps[0]])
        consumer.seek(tps[0], ends[tps[0]] - 1)
        [last] = consumer.poll(timeout_ms=2000)
        assert last.offset == ends[tps[0]] - 1
        assert consumer.position(tps[0]) == ends[tps[0]]


def test_lost_answers_are_retried_with_the_same_sequence(
    bootstrap: list[str], topics: dict[str, int]
) -> None:
    tps = [TopicPartition("dedupe", p) for p in range(topics["dedupe"])]
    channels = RecordingChannels()
    with Producer(bootstrap, channels=channels, linger_ms=50) as producer:
        first = [producer.send("dedupe", b"warm-up", partition=p) for p in (0, 1)]
        producer.flush()
        channels.lose_answers = 2  # the next two requests are written, their answers lost
        channels.not_leader = 1  # then one is refused: metadata refresh and retry
        futures = [producer.send("dedupe", f"r{i}".encode(), partition=i % 2) for i in range(20)]
        producer.flush()
        acknowledged = {f"r{i}".encode(): f.result(0) for i, f in enumerate(futures)}
        assert all(f.exception(0) is None for f in first)
    assert channels.lose_answers == 0 and channels.not_leader == 0
    # Every attempt of a batch carried the same sequence numbers.
    attempts: dict[tuple[int, int, int], list[int]] = {}
    for _, request in channels.produced:
        for p in request.partitions:
            key = (p.partition, p.batch.producer_id, p.batch.base_sequence)
            attempts.setdefault(key, []).append(len(p.batch.records))
    assert any(len(sizes) > 1 for sizes in attempts.values())  # something was retried
    assert all(len(set(sizes)) == 1 for sizes in attempts.values())
    # Each record is in the log once, at the offset its future reported.
    records = read_all(bootstrap, tps, "read_uncommitted")
    values = [r.value for r in records]
    assert sorted(values) == sorted([b"warm-up"] * 2 + list(acknowledged))
    for r in records:
        if r.value in acknowledged:
            assert (r.partition, r.offset) == (
                acknowledged[r.value].partition,
                acknowledged[r.value].offset,
            )


def test_transaction_with_records_is_atomic_for_read_committed(
    bootstrap: list[str], topics: dict[str, int]
) -> None:
    tps = [TopicPartition("txn-out", p) for p in range(topics["txn-out"])]
    channels = RecordingChannels()
    with TransactionalProducer(
        bootstrap, "records-1", channels=channels, linger_ms=2000
    ) as producer:
        producer.init_transactions()
        epoch = producer.producer_epoch
        producer.begin_transaction()
        futures = [producer.send("txn-out", f"c{i}".encode(), partition=i % 3) for i in range(30)]
        producer.send_offsets_to_transaction({TopicPartition("in", 0): 30}, "records-group")
        producer.commit_transaction()
        assert all(f.done() and f.exception() is None for f in futures)
        # The partition-log nodes added the three partitions to the transaction
        # (KIP-890 part 2): the producer never calls AddPartitionsToTxn.
        assert channels.coordinator_calls["AddPartitionsToTxn"] == 0
        first_round = list(channels.produced)
        assert len(first_round) == len({a for a, _ in first_round})  # one request per node
        for _, request in first_round:
            assert request.transactional_id == "records-1"
            for p in request.partitions:
                assert p.batch.is_transactional and p.batch.producer_epoch == epoch
                assert p.batch.base_sequence == 0
        assert producer.producer_epoch == epoch + 1
        # The next transaction: new epoch, sequences from 0 again; then aborted.
        producer.begin_transaction()
        aborted = [producer.send("txn-out", f"a{i}".encode(), partition=i % 3) for i in range(6)]
        producer.flush()
        producer.abort_transaction()
        assert all(f.exception() is None for f in aborted)  # written, then aborted
        second_round = channels.produced[len(first_round) :]
        batches = [p.batch for _, r in second_round for p in r.partitions]
        assert {(b.producer_epoch, b.base_sequence) for b in batches} == {(epoch + 1, 0)}
        assert producer.producer_epoch == epoch + 2

    def committed_visible() -> bool:
        values = {r.value for r in read_all(bootstrap, tps, "read_committed", 0.1)}
        return values == {f"c{i}".encode() for i in range(30)}

    wait_for(committed_visible, 15, "the committed records are not all visible")
    uncommitted = {r.value for r in read_all(bootstrap, tps, "read_uncommitted")}
    assert {f"a{i}".encode() for i in range(6)} <= uncommitted


def test_a_failed_send_makes_the_transaction_abortable(
    bootstrap: list[str], topics: dict[str, int]
) -> None:
    # max_request_size above the nodes' message.max.bytes (1 MiB): the client
    # sends the record and the node refuses its batch.
    with TransactionalProducer(bootstrap, "abortable-1", max_request_size=4 << 20) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        good = producer.send("fail", b"fine")
        bad = producer.send("fail", b"x" * (2 << 20))
        producer.flush()
        errors = [f.exception() for f in (good, bad)]
        assert any(isinstance(e, RecordTooLargeError) for e in errors), errors
        assert "message.max.bytes" in str(bad.exception())
        with pytest.raises(TransactionAbortableError) as raised:
            producer.commit_transaction()
        assert isinstance(raised.value.__cause__, RecordTooLargeError)
        with pytest.raises(TransactionAbortableError):
            producer.send("fail", b"more")
        assert producer.state == "abortable-error"
        producer.abort_transaction()
        # The producer goes on with a new transaction.
        producer.begin_transaction()
        ok = producer.send("fail", b"after")
        producer.commit_transaction()
        assert ok.result(0).offset >= 0


def test_abort_drops_records_not_yet_sent(bootstrap: list[str], topics: dict[str, int]) -> None:
    with TransactionalProducer(bootstrap, "drop-1", linger_ms=60_000) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        futures = [producer.send("orders", f"drop-{i}".encode(), partition=0) for i in range(5)]
        producer.abort_transaction()
        for future in futures:
            assert isinstance(future.exception(5), TransactionAbortedError)
        assert producer.state == "ready"
    values = {
        r.value for r in read_all(bootstrap, [TopicPartition("orders", 0)], "read_uncommitted")
    }
    assert not values & {f"drop-{i}".encode() for i in range(5)}


def test_a_zombie_fenced_while_producing(bootstrap: list[str], topics: dict[str, int]) -> None:
    tp = TopicPartition("fence", 0)
    with (
        TransactionalProducer(bootstrap, "fence-1") as old,
        TransactionalProducer(bootstrap, "fence-1") as new,
    ):
        old.init_transactions()
        old.begin_transaction()
        old.send("fence", b"zombie-1")
        old.flush()
        new.init_transactions()  # fences old and aborts its open transaction
        late = old.send("fence", b"zombie-2")
        old.flush()
        assert isinstance(late.exception(0), ProducerFencedError)
        with pytest.raises(ProducerFencedError):
            old.commit_transaction()
        new.begin_transaction()
        new.send("fence", b"successor")
        new.commit_transaction()

    def successor_only() -> bool:
        values = [r.value for r in read_all(bootstrap, [tp], "read_committed", 0.1)]
        return values == [b"successor"]

    wait_for(successor_only, 15, "read_committed should see only the successor's record")


def test_send_to_an_unknown_topic_times_out(bootstrap: list[str]) -> None:
    with Producer(bootstrap, max_block_ms=300) as producer:
        with pytest.raises(KafkaTimeoutError, match="no-such-topic"):
            producer.send("no-such-topic", b"v")
        with pytest.raises(ValueError):
            producer.send("orders", b"v", partition=99)
        with pytest.raises(TypeError):
            producer.send("orders", "not bytes")  # type: ignore[arg-type]


def test_batches_expire_and_the_idempotent_producer_bumps_its_epoch(
    bootstrap: list[str], topics: dict[str, int]
) -> None:
    channels = RecordingChannels()
    with Producer(
        bootstrap,
        channels=channels,
        request_timeout_ms=500,
        delivery_timeout_ms=600,
        retry_backoff_max_ms=50,
    ) as producer:
        ok = producer.send("orders", b"before", partition=2)
        producer.flush()
        assert ok.result(0).offset >= 0
        pid = producer.producer_id
        channels.fail_requests = 10_000  # the node is unreachable from now on
        doomed = producer.send("orders", b"doomed", partition=2)
        assert isinstance(doomed.exception(10), KafkaTimeoutError)
        channels.fail_requests = 0
        after = producer.send("orders", b"after", partition=2)
        producer.flush()
        assert after.result(0).offset > ok.result(0).offset
        # The doomed batch's fate was unknown: the next epoch, sequences from 0.
        assert (producer.producer_id, producer.producer_epoch) == (pid, 1)
        last = channels.produced[-1][1].partitions[0].batch
        assert (last.producer_id, last.producer_epoch, last.base_sequence) == (pid, 1, 0)


def test_end_txn_is_retried_after_a_lost_answer_and_after_a_timeout(
    bootstrap: list[str], topics: dict[str, int]
) -> None:
    tp = TopicPartition("orders", 1)
    channels = RecordingChannels()
    with TransactionalProducer(
        bootstrap, "end-retry-1", channels=channels, request_timeout_ms=1500
    ) as producer:
        producer.init_transactions()
        epoch = producer.producer_epoch
        # Lost answers of AddPartitionsToTxn and EndTxn: both are retried; the
        # EndTxn retry (old epoch) is answered once the commit is complete.
        channels.lose_coordinator_answers.update({"AddPartitionsToTxn": 1, "EndTxn": 1})
        producer.begin_transaction()
        first = producer.send("orders", b"lost-answers", partition=1)
        producer.commit_transaction()
        assert producer.producer_epoch == epoch + 1
        assert channels.coordinator_calls["EndTxn"] >= 2
        # Every EndTxn attempt fails for longer than request_timeout_ms: the
        # commit times out, stays pending, and a second call completes it.
        producer.begin_transaction()
        second = producer.send("orders", b"timed-out-once", partition=1)
        channels.fail_coordinator_calls["EndTxn"] = 1_000_000
        with pytest.raises(KafkaTimeoutError, match="commit_transaction"):
            producer.commit_transaction()
        assert producer.state == "committing"
        channels.fail_coordinator_calls["EndTxn"] = 0
        producer.commit_transaction()
        assert producer.state == "ready" and producer.producer_epoch == epoch + 2
    offsets = {first.result(0).offset, second.result(0).offset}

    def both_committed() -> bool:
        records = read_all(bootstrap, [tp], "read_committed", 0.1)
        return offsets <= {r.offset for r in records}

    wait_for(both_committed, 15, "both transactions should be visible")


def test_a_killed_partition_log_node_is_retried_without_duplicates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="raftcoord.client.producer")
    with running_cluster(tmp_path / "cluster", partition_nodes=1) as faulted:
        bootstrap = faulted.bootstrap()
        [node] = faulted.partition_nodes()
        with Admin(bootstrap) as admin:
            admin.create_topics({"survivor": 2})
        with Producer(bootstrap, linger_ms=0) as producer:
            before = [
                producer.send("survivor", f"b{i}".encode(), partition=i % 2) for i in range(10)
            ]
            producer.flush()
            faulted.kill(node.node_id, "KILL")
            during = [
                producer.send("survivor", f"d{i}".encode(), partition=i % 2) for i in range(10)
            ]
            # The sends fail in transport and are retried, never completed.
            wait_for(
                lambda: any(r.getMessage().startswith("retrying") for r in caplog.records),
                15,
                "a send to the killed node should be retried",
            )
            assert not any(f.done() for f in during)
            faulted.start(node.node_id)
            producer.flush()
            acknowledged = [f.result(0) for f in before + during]
        tps = [TopicPartition("survivor", p) for p in (0, 1)]
        records = read_all(bootstrap, tps, "read_uncommitted")
        assert sorted(r.value for r in records) == sorted(
            [f"b{i}".encode() for i in range(10)] + [f"d{i}".encode() for i in range(10)]
        )
        assert {(r.partition, r.offset) for r in records} == {
            (m.partition, m.offset) for m in acknowledged
        }
