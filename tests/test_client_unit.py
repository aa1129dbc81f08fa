"""The client's parts without I/O: the murmur2 partitioner, batching and
sequence bookkeeping, the reaction to Produce answers, the transactional
producer's state table, deadlines and backoff; then the producers over an
in-memory transport (a fake coordinator and partition log injected through
the channel factory, no sockets).

Long on purpose: the cases of one component, sharing this module's helpers
and fixtures.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from raftcoord.client import (
    Consumer,
    KafkaTimeoutError,
    OutOfOrderSequenceError,
    PreparedTxnState,
    Producer,
    ProducerFencedError,
    TopicPartition,
    TransactionAbortableError,
    TransactionalProducer,
)
from raftcoord.client._accumulator import (
    PendingRecord,
    ProduceAction,
    RecordAccumulator,
    SequenceNumbers,
    produce_action,
)
from raftcoord.client._net import CHANNEL_OPTIONS, Deadline, client_closed
from raftcoord.client._producer_txn_state import TRANSITIONS, ProducerTxnState, check_transition
from raftcoord.client._wire import first_error, offset_topics, topic_partitions
from raftcoord.client.errors import (
    CorruptMessageError,
    IllegalStateError,
    TransactionAbortedError,
)
from raftcoord.client.partitioner import DefaultPartitioner, murmur2, to_positive
from raftcoord.client.records import RecordMetadata
from raftcoord.protocol.backoff import Backoff
from raftcoord.protocol.channels import ChannelCache
from raftcoord.protocol.limits import MAX_SEQUENCE
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2, partition_log_pb2
from raftcoord.protocol.v1.common_pb2 import ErrorCode

TP0 = TopicPartition("orders", 0)
TP1 = TopicPartition("orders", 1)

# --- murmur2 ---------------------------------------------------------------------------

# The expected values of Kafka's own UtilsTest.testMurmur2 (signed Java ints).
KAFKA_MURMUR2_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("data", sorted(KAFKA_MURMUR2_VECTORS))
def test_murmur2_matches_kafkas_test_vectors(data: bytes) -> None:
    assert murmur2(data) == KAFKA_MURMUR2_VECTORS[data]


@given(st.binary(max_size=64))
def test_murmur2_agrees_with_kafka_python(data: bytes) -> None:
    """kafka-python's port of the Java murmur2 (unsigned result) as an oracle."""
    assert murmur2(data) & 0xFFFFFFFF == kafka_python_murmur2(data)
    assert -(2**31) <= murmur2(data) < 2**31


def test_to_positive_clears_the_sign_bit_not_abs() -> None:
    assert to_positive(-(2**31)) == 0  # abs() would overflow a Java int here
    assert to_positive(-1) == 2**31 - 1
    assert to_positive(5) == 5
    assert to_positive(-973932308) == -973932308 & 0x7FFFFFFF


@given(st.binary(min_size=0, max_size=32), st.integers(min_value=1, max_value=1000))
def test_keyed_partition_is_kafkas_formula(key: bytes, partitions: int) -> None:
    partitioner = DefaultPartitioner()
    chosen = partitioner.partition("t", key, partitions)
    assert chosen == (murmur2(key) & 0x7FFFFFFF) % partitions
    assert chosen == partitioner.partition("other-topic", key, partitions)  # deterministic
    assert 0 <= chosen < partitions


def test_keyed_partitions_spread_evenly() -> None:
    partitioner = DefaultPartitioner()
    counts = Counter(partitioner.partition("t", f"key-{i}".encode(), 8) for i in range(8000))
    assert set(counts) == set(range(8))
    assert max(counts.values()) < 1.15 * 1000 and min(counts.values()) > 0.85 * 1000


def test_null_keys_stick_to_a_partition_for_about_a_batch_then_move() -> None:
    partitioner = DefaultPartitioner(batch_size=100, rng=random.Random(7))
    chosen = [partitioner.partition("t", None, 4, record_size=10) for _ in range(40)]
    runs = [chosen[i : i + 10] for i in range(0, 40, 10)]
    for run in runs:
        assert len(set(run)) == 1  # 10 records of 10 bytes fill a batch of 100
    for a, b in itertools.pairwise(runs):
        assert a[0] != b[0]  # the next batch goes elsewhere
    # Null keys reach every partition over time.
    many = {partitioner.partition("t", None, 4, record_size=100) for _ in range(200)}
    assert many == {0, 1, 2, 3}


def test_sticky_partition_follows_a_shrunk_partition_count_and_one_partition() -> None:
    partitioner = DefaultPartitioner(batch_size=10_000, rng=random.Random(1))
    for _ in range(20):
        assert partitioner.partition("single", None, 1) == 0
    first = partitioner.partition("t", None, 50)
    assert 0 <= first < 50
    assert partitioner.partition("t", None, 3) < 3
    with pytest.raises(ValueError):
        partitioner.partition("t", b"k", 0)


# --- sequences -------------------------------------------------------------------------


ID = (7, 0)
BUMPED = (7, 1)


def test_sequences_start_at_zero_advance_per_partition_and_restart_per_identity() -> None:
    seq = SequenceNumbers()
    assert seq.number(TP0, ID) == 0 and seq.number(TP1, ID) == 0
    seq.advance(TP0, ID, 5)
    seq.advance(TP0, ID, 3)
    seq.advance(TP1, ID, 1)
    assert (seq.number(TP0, ID), seq.number(TP1, ID)) == (8, 1)
    # TP1 moves to the bumped epoch; a late acknowledgement under the old
    # one no longer moves it, while TP0 is still on the old epoch.
    assert seq.number(TP1, BUMPED) == 0
    seq.advance(TP1, ID, 4)
    seq.advance(TP0, ID, 1)
    assert seq.snapshot() == {TP0: (ID, 9), TP1: (BUMPED, 0)}
    seq.forget(TP0)
    assert seq.number(TP0, BUMPED) == 0


def test_sequences_wrap_like_kafkas_int32() -> None:
    seq = SequenceNumbers()
    seq.number(TP0, ID)
    seq.advance(TP0, ID, MAX_SEQUENCE)
    assert seq.number(TP0, ID) == MAX_SEQUENCE
    seq.advance(TP0, ID, 3)
    assert seq.number(TP0, ID) == 2


# --- batching --------------------------------------------------------------------------


def record(value: bytes = b"v", key: bytes | None = None) -> PendingRecord:
    return PendingRecord(key, value, [], 1000)


def test_records_batch_per_partition_until_full() -> None:
    acc = RecordAccumulator(batch_size=3 * record().size(), linger_s=1.0)
    assert acc.append(TP0, record(), 0.0) is True  # a new batch: its linger starts
    assert acc.append(TP0, record(), 0.0) is False
    assert acc.append(TP0, record(), 0.0) is True  # full
    assert acc.append(TP0, record(), 0.0) is True  # a second batch queued behind
    acc.append(TP1, record(), 0.0)
    assert [len(b.records) for b in acc.incomplete()] == [3, 1, 1]
    assert acc.partitions() == {TP0, TP1}
    assert len(acc) == 3


def test_a_batch_waits_for_linger_unless_full_or_flushing() -> None:
    acc = RecordAccumulator(batch_size=10_000, linger_s=0.005)
    acc.append(TP0, record(), 10.0)
    assert acc.ready(10.001) == []
    assert acc.ready(10.001, flush=True) == [TP0]
    assert acc.next_ready_s(10.001) == pytest.approx(10.005)
    assert acc.ready(10.005) == [TP0]


def test_one_batch_in_flight_per_partition_with_a_fixed_sequence_on_retry() -> None:
    acc = RecordAccumulator(batch_size=10_000, linger_s=0.0)
    seq = SequenceNumbers()
    for _ in range(3):
        acc.append(TP0, record(), 0.0)
    [batch] = acc.drain(acc.ready(0.0))
    batch.base_sequence = seq.number(TP0, ID)
    batch.attempts += 1
    # Records sent after the first attempt go to a new batch: a retry carries
    # exactly the records of the first attempt.
    acc.append(TP0, record(), 0.0)
    assert [len(b.records) for b in acc.incomplete()] == [3, 1]
    assert acc.ready(1.0) == []  # in flight
    acc.retry(batch, at_s=2.0)
    assert acc.ready(1.0) == []  # backing off
    assert acc.drain(acc.ready(2.0)) == [batch]
    assert batch.base_sequence == 0  # the same sequence again
    acc.remove(batch)
    seq.advance(TP0, ID, len(batch.records))
    [second] = acc.drain(acc.ready(2.0))
    assert second is not batch and seq.number(TP0, ID) == 3


def test_futures_resolve_with_consecutive_offsets_or_fail() -> None:
    acc = RecordAccumulator(batch_size=10_000, linger_s=0.0)
    records = [record(bytes([i])) for i in range(3)]
    for r in records:
        acc.append(TP0, r, 0.0)
    [batch] = acc.drain([TP0])
    acc.remove(batch)
    batch.complete(base_offset=40)
    assert [r.future.result(0) for r in records] == [
        RecordMetadata("orders", 0, 40),
        RecordMetadata("orders", 0, 41),
        RecordMetadata("orders", 0, 42),
    ]
    assert batch.done.is_set()
    batch.fail(TransactionAbortedError("late"))  # settled once: ignored
    assert records[0].future.exception(0) is None


def test_take_undrained_leaves_the_batch_in_flight() -> None:
    acc = RecordAccumulator(batch_size=10_000, linger_s=0.0)
    acc.append(TP0, record(), 0.0)
    [in_flight] = acc.drain([TP0])
    in_flight.attempts = 1
    acc.append(TP0, record(), 0.0)
    acc.append(TP1, record(), 0.0)
    taken = acc.take_undrained()
    assert {b.tp for b in taken} == {TP0, TP1} and in_flight not in taken
    assert acc.incomplete() == [in_flight] and acc.ready(0.0, flush=True) == []


def test_batches_expire_after_the_delivery_timeout_unless_in_flight() -> None:
    acc = RecordAccumulator(batch_size=10_000, linger_s=0.0)
    acc.append(TP0, record(), 0.0)
    acc.append(TP1, record(), 15.0)
    [in_flight] = acc.drain([TP0])
    assert acc.expired(20.0, delivery_timeout_s=10.0) == []  # TP0 is in flight, TP1 young
    acc.retry(in_flight, at_s=20.0)
    assert acc.expired(20.0, delivery_timeout_s=10.0) == [in_flight]
    assert [b.tp for b in acc.expired(25.0, delivery_timeout_s=10.0)] == [TP1]
    assert len(acc) == 0


# --- reactions to Produce answers -----------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "transactional", "action"),
    [
        (ErrorCode.NONE, True, ProduceAction.COMPLETE),
        (ErrorCode.DUPLICATE_SEQUENCE_NUMBER, False, ProduceAction.COMPLETE),
        (None, True, ProduceAction.RETRY),  # transport failure
        (ErrorCode.REQUEST_TIMED_OUT, False, ProduceAction.RETRY),
        (ErrorCode.NOT_LEADER_OR_FOLLOWER, True, ProduceAction.RETRY_REFRESH),
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, False, ProduceAction.RETRY_REFRESH),
        (ErrorCode.PRODUCER_FENCED, True, ProduceAction.FATAL),
        (ErrorCode.INVALID_PRODUCER_EPOCH, True, ProduceAction.FATAL),
        (ErrorCode.INVALID_TXN_STATE, True, ProduceAction.FAIL),
        (ErrorCode.TRANSACTION_ABORTABLE, True, ProduceAction.FAIL),
        (ErrorCode.UNKNOWN_PRODUCER_ID, True, ProduceAction.FAIL),
        (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, True, ProduceAction.FAIL),
        (ErrorCode.CORRUPT_MESSAGE, True, ProduceAction.FAIL),
        (ErrorCode.MESSAGE_TOO_LARGE, False, ProduceAction.FAIL),
        (ErrorCode.INVALID_REQUEST, False, ProduceAction.FAIL),
        (ErrorCode.UNKNOWN_PRODUCER_ID, False, ProduceAction.RETRY_BUMP_EPOCH),
        (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, False, ProduceAction.FAIL_BUMP_EPOCH),
        (ErrorCode.INVALID_PRODUCER_EPOCH, False, ProduceAction.FAIL_BUMP_EPOCH),
        (ErrorCode.UNKNOWN_SERVER_ERROR, False, ProduceAction.FAIL_BUMP_EPOCH),
    ],
)
def test_produce_action(code: int | None, transactional: bool, action: ProduceAction) -> None:
    assert produce_action(code, transactional) is action


@pytest.mark.parametrize("transactional", [True, False])
def test_every_error_code_has_a_produce_action(transactional: bool) -> None:
    for _, code in common_pb2.ErrorCode.items():
        assert isinstance(produce_action(code, transactional), ProduceAction)


# --- the transactional producer's states ------------------------------------------------------


def test_state_table_walk_every_pair() -> None:
    for current in ProducerTxnState:
        for target in ProducerTxnState:
            allowed = current is not ProducerTxnState.CLOSED and (
                target in TRANSITIONS[current]
                or target in (ProducerTxnState.FATAL_ERROR, ProducerTxnState.CLOSED)
            )
            if allowed:
                check_transition(current, target, "op")
            else:
                with pytest.raises(IllegalStateError):
                    check_transition(current, target, "op")


def test_the_happy_path_and_the_retries_are_legal() -> None:
    path = [
        ProducerTxnState.UNINITIALIZED,
        ProducerTxnState.INITIALIZING,
        ProducerTxnState.READY,
        ProducerTxnState.IN_TRANSACTION,
        ProducerTxnState.COMMITTING,
        ProducerTxnState.COMMITTING,  # commit_transaction again after a timeout
        ProducerTxnState.READY,
        ProducerTxnState.IN_TRANSACTION,
        ProducerTxnState.ABORTABLE_ERROR,
        ProducerTxnState.ABORTING,
        ProducerTxnState.READY,
    ]
    for a, b in itertools.pairwise(path):
        check_transition(a, b, "op")


def test_misuse_is_refused_with_the_operation_named() -> None:
    with pytest.raises(IllegalStateError, match="cannot send in state ready"):
        check_transition(ProducerTxnState.READY, ProducerTxnState.COMMITTING, "send")
    with pytest.raises(IllegalStateError, match="closed"):
        check_transition(ProducerTxnState.CLOSED, ProducerTxnState.READY, "begin_transaction")
    with pytest.raises(IllegalStateError):
        check_transition(
            ProducerTxnState.ABORTABLE_ERROR, ProducerTxnState.COMMITTING, "commit_transaction"
        )
    with pytest.raises(IllegalStateError):
        check_transition(
            ProducerTxnState.FATAL_ERROR, ProducerTxnState.ABORTING, "abort_transaction"
        )


# --- deadlines, backoff, request helpers --------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_deadline_attempts_are_capped_and_the_timeout_error_names_the_cause() -> None:
    clock = FakeClock()
    deadline = Deadline(10.0, "EndTxn", clock)
    assert deadline.attempt(2.0) == 2.0
    clock.now += 9.5
    assert deadline.attempt(2.0) == pytest.approx(0.5)
    clock.now += 1
    assert deadline.expired() and deadline.attempt(2.0) == 0.001
    cause = KafkaTimeoutError("inner")
    error = deadline.timeout_error(cause)
    assert "EndTxn" in str(error) and "inner" in str(error) and error.__cause__ is cause


def test_backoff_doubles_from_20ms_to_1s_with_jitter() -> None:
    backoff = Backoff(0.02, 1.0, jitter=0.2, rng=random.Random(3))
    delays = [backoff.next_delay() for _ in range(10)]
    nominal = [min(1.0, 0.02 * 2**i) for i in range(10)]
    for delay, expected in zip(delays, nominal, strict=True):
        assert 0.8 * expected <= delay <= expected
    backoff.reset()
    assert backoff.next_delay() <= 0.02


def test_request_helpers_group_by_topic() -> None:
    grouped = topic_partitions([TP1, TopicPartition("a", 2), TP0, TP1])
    assert [(t.topic, list(t.partitions)) for t in grouped] == [("a", [2]), ("orders", [0, 1])]
    topics = offset_topics({TP1: 7, ("orders", 0): 3})  # plain tuples are accepted
    assert [(t.topic, [(p.partition, p.offset) for p in t.partitions]) for t in topics] == [
        ("orders", [(0, 3), (1, 7)])
    ]
    with pytest.raises(ValueError):
        offset_topics({TP0: -1})


def test_first_error_prefers_the_request_level_code() -> None:
    ok = coordinator_pb2.AddPartitionsToTxnResponse(
        results=[common_pb2.PartitionResult(topic="t", partition=0)]
    )
    assert first_error(ok) == (ErrorCode.NONE, "")
    partial = coordinator_pb2.AddPartitionsToTxnResponse(
        results=[
            common_pb2.PartitionResult(topic="t", partition=0),
            common_pb2.PartitionResult(
                topic="t", partition=1, error_code=ErrorCode.INVALID_TXN_STATE
            ),
        ]
    )
    assert first_error(partial) == (ErrorCode.INVALID_TXN_STATE, "partition t-1")
    fenced = coordinator_pb2.AddPartitionsToTxnResponse(
        error_code=ErrorCode.PRODUCER_FENCED, error_message="old epoch"
    )
    assert first_error(fenced) == (ErrorCode.PRODUCER_FENCED, "old epoch")


def test_pending_record_futures_are_not_cancellable_once_queued() -> None:
    pending = record()
    assert isinstance(pending.future, Future)
    pending.future.set_running_or_notify_cancel()
    assert pending.future.cancel() is False


# --- producers over an in-memory transport ------------------------------------------------------


class InjectedTransportError(grpc.RpcError):
    """A transport failure made up by the test."""


class Done:
    """A finished call, shaped like what ``Stub.Method.future`` returns."""

    def __init__(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error

    def result(self, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        return self._result

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        callback(self)


class FakeCluster:
    """One coordinator and one partition-log node in memory. The partition log
    keeps, per partition, (producer id, epoch, base sequence, records) and
    deduplicates a batch it already has, like the real node."""

    def __init__(self, partitions: int = 2) -> None:
        self.lock = threading.Lock()
        self.partitions = partitions
        self.next_pid = 1000
        self.epoch = 0
        self.calls: list[tuple[str, Any]] = []
        self.logs: dict[int, list[tuple[int, int, int, int]]] = {}
        #: Scripted Produce outcomes, used in order before the log answers:
        #: an ErrorCode for every partition, "lost" (appended, answer lost)
        #: or "down" (transport failure, nothing appended).
        self.script: list[Any] = []
        #: Coordinator methods answered with an ErrorCode, or failed with a
        #: transport error ("down"), while listed.
        self.coordinator_faults: dict[str, Any] = {}
        #: InitProducerId's produce_adds_partitions: the partition-log node adds
        #: partitions to transactions (KIP-890 part 2).
        self.produce_adds_partitions = False
        #: The identity of a transaction InitProducerId(keep_prepared_txn) keeps (KIP-939).
        self.kept: tuple[int, int] | None = None

    # coordinator --------------------------------------------------------------------

    def coordinator_call(self, method: str, request: Any) -> Any:
        with self.lock:
            self.calls.append((method, request))
            fault = self.coordinator_faults.get(method)
        if fault == "down":
            raise InjectedTransportError()
        if method == "FindCoordinator":
            return coordinator_pb2.FindCoordinatorResponse(address="fake-coordinator", node_id=1)
        if method == "Metadata":
            return coordinator_pb2.MetadataResponse(
                coordinators=[coordinator_pb2.NodeInfo(node_id=1, address="fake-coordinator")],
                partition_nodes=[coordinator_pb2.NodeInfo(node_id=7, address="fake-log")],
                topics=[
                    coordinator_pb2.TopicMetadata(
                        name="t",
                        partitions=[
                            coordinator_pb2.PartitionMetadata(partition=p, node_id=7)
                            for p in range(self.partitions)
                        ],
                    )
                ],
            )
        if method == "InitProducerId":
            with self.lock:
                if request.HasField("transactional_id"):
                    kept = self.kept if request.keep_prepared_txn else None
                    return coordinator_pb2.InitProducerIdResponse(
                        producer_id=1,
                        producer_epoch=self.epoch,
                        produce_adds_partitions=self.produce_adds_partitions,
                        ongoing_txn_producer_id=-1 if kept is None else kept[0],
                        ongoing_txn_producer_epoch=-1 if kept is None else kept[1],
                    )
                self.next_pid += 1
                return coordinator_pb2.InitProducerIdResponse(
                    producer_id=self.next_pid, producer_epoch=0
                )
        if method == "EndTxn":
            with self.lock:
                self.epoch += 1
                return coordinator_pb2.EndTxnResponse(producer_id=1, producer_epoch=self.epoch)
        answers = {
            "AddPartitionsToTxn": coordinator_pb2.AddPartitionsToTxnResponse,
            "AddOffsetsToTxn": coordinator_pb2.AddOffsetsToTxnResponse,
            "TxnOffsetCommit": coordinator_pb2.TxnOffsetCommitResponse,
        }
        return answers[method](error_code=fault or ErrorCode.NONE)

    # partition log ------------------------------------------------------------------

    def produce(self, request: Any) -> Done:
        with self.lock:
            self.calls.append(("Produce", request))
            step = self.script.pop(0) if self.script else None
        if step == "down":
            return Done(error=InjectedTransportError())
        if isinstance(step, int):
            return Done(
                partition_log_pb2.ProduceResponse(
                    partitions=[
                        partition_log_pb2.PartitionProduceResponse(
                            topic=p.topic, partition=p.partition, error_code=step, base_offset=-1
                        )
                        for p in request.partitions
                    ]
                )
            )
        answers = [self._append(p) for p in request.partitions]
        if step == "lost":
            return Done(error=InjectedTransportError())
        return Done(partition_log_pb2.ProduceResponse(partitions=answers))

    def _append(self, entry: Any) -> Any:
        batch = entry.batch
        with self.lock:
            log = self.logs.setdefault(entry.partition, [])
            ident = (batch.producer_id, batch.producer_epoch, batch.base_sequence)
            offset = sum(n for *_, n in log)
            for pid, epoch, seq, count in log:
                if (pid, epoch, seq) == ident:  # a duplicate: the original offset
                    offset = sum(n for *_, n in log[: log.index((pid, epoch, seq, count))])
                    break
            else:
                log.append((*ident, len(batch.records)))
        return partition_log_pb2.PartitionProduceResponse(
            topic=entry.topic, partition=entry.partition, base_offset=offset
        )

    def sequences(self, partition: int) -> list[tuple[int, int, int]]:
        return [(pid, epoch, seq) for pid, epoch, seq, _ in self.logs.get(partition, [])]

    def methods(self) -> list[str]:
        return [m for m, _ in self.calls if m not in ("Metadata", "FindCoordinator")]


class FakeChannels(ChannelCache):
    def __init__(self, cluster: FakeCluster) -> None:
        super().__init__(CHANNEL_OPTIONS, closed_error=client_closed)
        self.cluster = cluster

    def coordinator(self, address: str) -> Any:
        cluster = self.cluster

        class Stub:
            def __getattr__(self, method: str) -> Any:
                return lambda request, timeout: cluster.coordinator_call(method, request)

        return Stub()

    def partition_log(self, address: str) -> Any:
        cluster = self.cluster

        class Produce:
            def future(self, request: Any, timeout: float) -> Done:
                return cluster.produce(request)

            def __call__(self, request: Any, timeout: float) -> Any:
                return self.future(request, timeout).result()

        class Stub:
            pass

        stub = Stub()
        stub.Produce = Produce()  # type: ignore[attr-defined]
        return stub


FAST = {"linger_ms": 0, "retry_backoff_ms": 1, "retry_backoff_max_ms": 5}


def test_idempotent_sequences_advance_per_partition_only_on_success() -> None:
    fake = FakeCluster()
    with Producer(["fake-coordinator:9092"], channels=FakeChannels(fake), **FAST) as producer:
        for _ in range(3):
            producer.send("t", b"a", partition=0).result(5)
        producer.send("t", b"b", partition=1).result(5)
        # A corrupt batch is refused: its sequence is not used up.
        fake.script = [ErrorCode.CORRUPT_MESSAGE]
        refused = producer.send("t", b"bad", partition=0)
        assert isinstance(refused.exception(5), CorruptMessageError)
        assert producer.send("t", b"c", partition=0).result(5).offset == 3
    pid = producer.producer_id
    assert fake.sequences(0) == [(pid, 0, 0), (pid, 0, 1), (pid, 0, 2), (pid, 0, 3)]
    assert fake.sequences(1) == [(pid, 0, 0)]


def test_idempotent_retries_keep_the_sequence_and_get_the_original_offset() -> None:
    fake = FakeCluster()
    with Producer(["fake-coordinator:9092"], channels=FakeChannels(fake), **FAST) as producer:
        producer.send("t", b"first", partition=0).result(5)
        fake.script = [
            "lost",
            "down",
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            ErrorCode.REQUEST_TIMED_OUT,
        ]
        future = producer.send("t", b"second", partition=0)
        assert future.result(5) == RecordMetadata("t", 0, 1)
    attempts = [r for m, r in fake.calls if m == "Produce"][1:]
    assert len(attempts) == 5
    assert {p.batch.base_sequence for r in attempts for p in r.partitions} == {1}
    assert len(fake.sequences(0)) == 2  # written once, although sent five times


def test_idempotent_producer_bumps_its_epoch_when_out_of_step() -> None:
    fake = FakeCluster()
    with Producer(["fake-coordinator:9092"], channels=FakeChannels(fake), **FAST) as producer:
        producer.send("t", b"x", partition=0).result(5)
        pid = producer.producer_id
        fake.script = [ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER]
        failed = producer.send("t", b"y", partition=0)
        assert isinstance(failed.exception(5), OutOfOrderSequenceError)
        producer.send("t", b"z", partition=0).result(5)
        assert (producer.producer_id, producer.producer_epoch) == (pid, 1)
        # UNKNOWN_PRODUCER_ID: the batch is retried under the next epoch from sequence 0.
        fake.script = [ErrorCode.UNKNOWN_PRODUCER_ID]
        producer.send("t", b"w", partition=1).result(5)
        assert (producer.producer_id, producer.producer_epoch) == (pid, 2)
    assert fake.sequences(0) == [(pid, 0, 0), (pid, 1, 0)]
    assert fake.sequences(1) == [(pid, 2, 0)]
    assert fake.methods().count("InitProducerId") == 1  # the epoch is bumped locally


def test_transactional_producer_batches_partitions_and_adopts_the_end_txn_epoch() -> None:
    fake = FakeCluster(partitions=3)
    with TransactionalProducer(
        ["fake-coordinator:9092"], "tx", channels=FakeChannels(fake), linger_ms=60_000
    ) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        futures = [producer.send("t", b"v", partition=p % 3) for p in range(9)]
        producer.send_offsets_to_transaction({TopicPartition("in", 0): 5}, "group")
        producer.commit_transaction()
        assert [f.result(0).offset for f in futures[:3]] == [0, 0, 0]
        assert fake.methods() == [
            "InitProducerId",
            "AddOffsetsToTxn",
            "TxnOffsetCommit",
            "AddPartitionsToTxn",  # all three partitions in one call, at flush time
            "Produce",  # one request: one node, one batch per partition
            "EndTxn",
        ]
        [add] = [r for m, r in fake.calls if m == "AddPartitionsToTxn"]
        assert [(t.topic, list(t.partitions)) for t in add.topics] == [("t", [0, 1, 2])]
        [produce] = [r for m, r in fake.calls if m == "Produce"]
        assert produce.transactional_id == "tx"
        assert [
            (p.partition, p.batch.base_sequence, len(p.batch.records)) for p in produce.partitions
        ] == [(0, 0, 3), (1, 0, 3), (2, 0, 3)]
        assert all(p.batch.is_transactional for p in produce.partitions)
        assert producer.producer_epoch == 1  # from EndTxn's answer
        producer.begin_transaction()
        producer.send("t", b"next", partition=0)
        producer.commit_transaction()
    last = [r for m, r in fake.calls if m == "Produce"][-1].partitions[0].batch
    assert (last.producer_epoch, last.base_sequence) == (1, 0)  # new epoch: sequences from 0


def test_when_partitions_add_themselves_the_producer_never_adds_them() -> None:
    """KIP-890 part 2 (InitProducerId says so): no AddPartitionsToTxn; a
    transaction whose batches went out is ended with EndTxn, one that sent
    nothing ends locally."""
    fake = FakeCluster(partitions=3)
    fake.produce_adds_partitions = True
    with TransactionalProducer(
        ["fake-coordinator:9092"], "tx", channels=FakeChannels(fake), linger_ms=60_000
    ) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for p in range(3):
            producer.send("t", b"v", partition=p)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send("t", b"w", partition=0)
        producer.flush()
        producer.abort_transaction()
        producer.begin_transaction()
        producer.abort_transaction()  # nothing sent: nothing to end
    assert fake.methods() == ["InitProducerId", "Produce", "EndTxn", "Produce", "EndTxn"]


def test_a_batch_refused_while_the_previous_transaction_completes_is_retried_soon() -> None:
    """CONCURRENT_TRANSACTIONS from a partition (its add waits for the
    previous transaction's markers) is retried with the short backoff of
    that answer, not retry_backoff_ms."""
    fake = FakeCluster()
    fake.produce_adds_partitions = True
    fake.script = [ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.CONCURRENT_TRANSACTIONS]
    with TransactionalProducer(
        ["fake-coordinator:9092"],
        "tx",
        channels=FakeChannels(fake),
        linger_ms=0,
        retry_backoff_ms=60_000,
        retry_backoff_max_ms=60_000,
    ) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        assert producer.send("t", b"v", partition=0).result(10).offset == 0
        producer.commit_transaction()
    assert fake.methods().count("Produce") == 3


@pytest.mark.parametrize("code", [ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED])
def test_fenced_while_producing_is_fatal_for_every_later_call(code: int) -> None:
    fake = FakeCluster()
    with TransactionalProducer(["fake-coordinator:9092"], "tx", channels=FakeChannels(fake)) as p:
        p.init_transactions()
        p.begin_transaction()
        fake.script = [code]
        future = p.send("t", b"v", partition=0)
        assert isinstance(future.exception(5), ProducerFencedError)
        for call in (
            p.commit_transaction,
            p.abort_transaction,
            p.begin_transaction,
            lambda: p.send("t", b"v"),
        ):
            with pytest.raises(ProducerFencedError):
                call()
    assert "EndTxn" not in fake.methods()


@pytest.mark.parametrize("code", [ErrorCode.TRANSACTION_ABORTABLE, ErrorCode.INVALID_TXN_STATE])
def test_an_abortable_send_error_blocks_the_commit_until_aborted(code: int) -> None:
    """A partition refusing a batch because it is not in the transaction
    (KIP-890 verification; INVALID_TXN_STATE from older nodes): abort, go on."""
    fake = FakeCluster()
    with TransactionalProducer(
        ["fake-coordinator:9092"], "tx", channels=FakeChannels(fake), **FAST
    ) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        fake.script = [code]
        refused = producer.send("t", b"v", partition=0)
        assert isinstance(refused.exception(5), TransactionAbortableError)
        with pytest.raises(TransactionAbortableError):
            producer.commit_transaction()
        producer.abort_transaction()
        assert fake.methods()[-1] == "EndTxn"
        [end] = [r for m, r in fake.calls if m == "EndTxn"]
        assert end.committed is False
        producer.begin_transaction()
        producer.send("t", b"again", partition=0).result(5)
        producer.commit_transaction()


@pytest.mark.parametrize("add", ["AddPartitionsToTxn", "AddOffsetsToTxn"])
def test_abort_skips_end_txn_when_the_coordinator_refused_every_add(add: str) -> None:
    """As Kafka's client: a transaction the coordinator never opened is ended
    locally. An EndTxn would carry the identity of the previous transaction's
    answer and be judged against it while its markers are still written."""
    fake = FakeCluster()
    with TransactionalProducer(
        ["fake-coordinator:9092"], "tx", channels=FakeChannels(fake), request_timeout_ms=300, **FAST
    ) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        fake.coordinator_faults[add] = ErrorCode.CONCURRENT_TRANSACTIONS
        with pytest.raises(TransactionAbortableError):
            if add == "AddOffsetsToTxn":
                producer.send_offsets_to_transaction({TopicPartition("in", 0): 1}, "g")
            else:
                producer.send("t", b"v", partition=0)
                producer.commit_transaction()
        producer.abort_transaction()
        assert "EndTxn" not in fake.methods() and producer.state == "ready"
        fake.coordinator_faults.clear()
        producer.begin_transaction()
        producer.send("t", b"next", partition=0).result(5)
        producer.commit_transaction()
        assert fake.methods()[-1] == "EndTxn"


def test_abort_ends_the_transaction_when_an_add_may_have_been_applied() -> None:
    fake = FakeCluster()
    with TransactionalProducer(
        ["fake-coordinator:9092"], "tx", channels=FakeChannels(fake), request_timeout_ms=300, **FAST
    ) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        fake.coordinator_faults["AddPartitionsToTxn"] = "down"  # answers lost
        producer.send("t", b"v", partition=0)
        with pytest.raises(TransactionAbortableError):
            producer.commit_transaction()
        fake.coordinator_faults.clear()
        producer.abort_transaction()
        [end] = [r for m, r in fake.calls if m == "EndTxn"]
        assert end.committed is False


def test_delivery_timeout_fails_the_batch_and_the_transaction() -> None:
    fake = FakeCluster()
    with TransactionalProducer(
        ["fake-coordinator:9092"],
        "tx",
        channels=FakeChannels(fake),
        request_timeout_ms=100,
        delivery_timeout_ms=200,
        **FAST,
    ) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        fake.script = ["down"] * 10_000
        future = producer.send("t", b"v", partition=0)
        assert isinstance(future.exception(5), KafkaTimeoutError)
        with pytest.raises(TransactionAbortableError):
            producer.commit_transaction()
        fake.script = []
        producer.abort_transaction()


# --- the consumer over an in-memory transport -------------------------------------------------


class FetchChannels(FakeChannels):
    """The fake cluster's metadata; Fetch answers come from ``answers``, one
    list of partition answers per call (an empty answer per partition after)."""

    def __init__(self, answers: list[list[Any]]) -> None:
        super().__init__(FakeCluster())
        self.answers = answers

    def partition_log(self, address: str) -> Any:
        answers = self.answers

        class Fetch:
            def future(self, request: Any, timeout: float) -> Done:
                partitions = answers.pop(0) if answers else []
                if not partitions:
                    partitions = [
                        fetched(p.topic, p.partition, p.fetch_offset) for p in request.partitions
                    ]
                return Done(partition_log_pb2.FetchResponse(partitions=partitions))

            def __call__(self, request: Any, timeout: float) -> Any:
                return self.future(request, timeout).result()

        class Stub:
            pass

        stub = Stub()
        stub.Fetch = Fetch()  # type: ignore[attr-defined]
        return stub


def fetched(
    topic: str, partition: int, offset: int, *values: bytes, code: int = ErrorCode.NONE
) -> Any:
    return partition_log_pb2.FetchPartitionResponse(
        topic=topic,
        partition=partition,
        error_code=code,  # type: ignore[arg-type]
        error_message="batch unreadable" if code else "",
        next_fetch_offset=offset + len(values),
        records=[
            partition_log_pb2.FetchedRecord(offset=offset + i, value=v)
            for i, v in enumerate(values)
        ],
    )


def test_one_partitions_error_does_not_cost_the_others_their_records() -> None:
    t0, t1 = TopicPartition("t", 0), TopicPartition("t", 1)
    corrupt = fetched("t", 0, 0, code=ErrorCode.CORRUPT_MESSAGE)
    channels = FetchChannels(
        [
            [corrupt, fetched("t", 1, 0, b"a", b"b")],
            [corrupt],
            [corrupt, fetched("t", 1, 2, b"c")],
            [fetched("t", 0, 7, b"x")],
        ]
    )
    with Consumer(["fake-coordinator:9092"], channels=channels) as consumer:
        consumer.assign([t0, t1])
        consumer.seek(t0, 0)
        consumer.seek(t1, 0)
        # As Kafka's consumer: t-1's records first, t-0's error on the next poll.
        assert [(r.partition, r.value) for r in consumer.poll(5_000)] == [(1, b"a"), (1, b"b")]
        assert consumer.position(t1) == 2
        with pytest.raises(CorruptMessageError, match="unreadable"):
            consumer.poll(5_000)
        with pytest.raises(CorruptMessageError):  # fetched again, nothing else to return
            consumer.poll(5_000)
        assert [r.value for r in consumer.poll(5_000)] == [b"c"]
        consumer.seek(t0, 7)  # past the bad batch: the held error is dropped
        assert [(r.partition, r.offset) for r in consumer.poll(5_000)] == [(0, 7)]


# --- two-phase commit (KIP-939) -----------------------------------------------------


def end_txns(fake: FakeCluster) -> list[bool]:
    return [r.committed for m, r in fake.calls if m == "EndTxn"]


def test_prepare_needs_two_phase_commit_enabled() -> None:
    fake = FakeCluster()
    with TransactionalProducer(["fake:9092"], "tx", channels=FakeChannels(fake)) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        with pytest.raises(IllegalStateError, match="enable_two_phase_commit"):
            producer.prepare_transaction()
    [init] = [r for m, r in fake.calls if m == "InitProducerId"]
    assert not init.enable_two_phase_commit and not init.keep_prepared_txn


@pytest.mark.parametrize("matches", [True, False])
def test_prepare_then_complete_commits_only_the_matching_state(matches: bool) -> None:
    fake = FakeCluster()
    with TransactionalProducer(
        ["fake:9092"], "tx", channels=FakeChannels(fake), enable_two_phase_commit=True
    ) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        future = producer.send("t", b"v", partition=0)
        state = producer.prepare_transaction()
        assert future.done() and state == PreparedTxnState(1, 0)  # flushed
        assert producer.state == "prepared-transaction" and producer.prepared_state == state
        with pytest.raises(IllegalStateError):
            producer.send("t", b"late", partition=0)
        with pytest.raises(IllegalStateError):
            producer.begin_transaction()
        given = state if matches else PreparedTxnState(1, 7)
        assert producer.complete_transaction(given) is matches
        assert producer.state == "ready" and producer.prepared_state is None
        assert producer.complete_transaction(state) is None  # nothing prepared any more
    [init] = [r for m, r in fake.calls if m == "InitProducerId"]
    assert init.enable_two_phase_commit
    assert end_txns(fake) == [matches]


def test_a_kept_transaction_is_prepared_after_init_and_close_leaves_it() -> None:
    fake = FakeCluster()
    fake.epoch, fake.kept = 4, (1, 3)
    with TransactionalProducer(
        ["fake:9092"], "tx", channels=FakeChannels(fake), enable_two_phase_commit=True
    ) as producer:
        producer.init_transactions(keep_prepared_txn=True)
        assert producer.state == "prepared-transaction"
        assert producer.prepared_state == PreparedTxnState(1, 3)
    assert end_txns(fake) == []  # closing does not abort a prepared transaction
    with TransactionalProducer(
        ["fake:9092"], "tx", channels=FakeChannels(fake), enable_two_phase_commit=True
    ) as producer:
        producer.init_transactions(keep_prepared_txn=True)
        assert producer.complete_transaction(PreparedTxnState(1, 3)) is True
    [*_, end] = [r for m, r in fake.calls if m == "EndTxn"]
    assert end.committed and (end.producer_id, end.producer_epoch) == (1, 4)
    [*_, init] = [r for m, r in fake.calls if m == "InitProducerId"]
    assert init.keep_prepared_txn


def test_a_coordinator_without_two_phase_commit_keeps_nothing() -> None:
    fake = FakeCluster()
    with TransactionalProducer(
        ["fake:9092"], "tx", channels=FakeChannels(fake), enable_two_phase_commit=True
    ) as producer:
        original = fake.coordinator_call
        fake.coordinator_call = lambda method, request: (  # type: ignore[method-assign]
            coordinator_pb2.InitProducerIdResponse(producer_id=1, producer_epoch=0)
            if method == "InitProducerId"
            else original(method, request)
        )
        producer.init_transactions(keep_prepared_txn=True)  # no ongoing_txn_* fields
        assert producer.state == "ready" and producer.prepared_state is None


def test_prepared_state_text_round_trip() -> None:
    state = PreparedTxnState(12345, 6)
    assert str(state) == "12345:6" and PreparedTxnState.parse(str(state)) == state
    for bad in ("", "12", "a:1", "1:", "-1:2", "1:2:3"):
        with pytest.raises(ValueError, match="prepared transaction state"):
            PreparedTxnState.parse(bad)
