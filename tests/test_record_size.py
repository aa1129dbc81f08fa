"""Record sizes and timestamps in the client: ``send`` refuses a record larger
than ``max_request_size`` at once (RecordTooLargeError, nothing sent) and a
timestamp outside 0..2**63-1; the size estimate bounds what the partition-log
node builds, and a Produce request's protobuf bytes stay within the gRPC
limit the node derives from ``message.max.bytes``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_log import codec
from raftcoord.client import (
    Producer,
    TopicPartition,
    TransactionAbortableError,
    TransactionalProducer,
)
from raftcoord.client._accumulator import BATCH_HEADER_SIZE, PendingRecord, ProducerBatch
from raftcoord.client._wire import produce_request
from raftcoord.client.errors import RecordTooLargeError
from raftcoord.protocol.config import REQUEST_BYTES_PER_BATCH_BYTE
from raftcoord.protocol.v1 import partition_log_pb2
from tests.test_client_unit import FAST, FakeChannels, FakeCluster

LIMIT = 1000

records = st.builds(
    PendingRecord,
    st.none() | st.binary(max_size=300),
    st.none() | st.binary(max_size=3000),
    st.lists(st.tuples(st.text(max_size=10), st.binary(max_size=20)), max_size=4),
    st.sampled_from([-1, 0, 2**63 - 1]) | st.integers(0, 2**63 - 1),
)


def encoded(batch: list[PendingRecord]) -> bytearray:
    return codec.encode_batch(
        [codec.RecordData(r.key, r.value, tuple(r.headers), r.timestamp_ms) for r in batch],
        producer_id=1,
        producer_epoch=0,
        base_sequence=0,
        transactional=False,
    )


def request_of(batch: list[PendingRecord]) -> partition_log_pb2.ProduceRequest:
    """The Produce request the client's sender builds for ``batch``."""
    produced = ProducerBatch(TopicPartition("a-topic", 7), created_s=0.0)
    for record in batch:
        produced.append(record)
    produced.producer_id, produced.producer_epoch, produced.base_sequence = 1, 0, 0
    return produce_request([produced], "a-transactional-id")


@settings(max_examples=300, deadline=None)
@given(st.lists(records, min_size=1, max_size=20))
def test_the_size_estimate_bounds_the_batch_the_node_builds(batch: list[PendingRecord]) -> None:
    assert len(encoded(batch)) <= BATCH_HEADER_SIZE + sum(r.size() for r in batch)


@settings(max_examples=300, deadline=None)
@given(st.lists(records, min_size=1, max_size=20))
def test_a_request_takes_at_most_the_configured_multiple_of_its_batch(
    batch: list[PendingRecord],
) -> None:
    assert request_of(batch).ByteSize() <= REQUEST_BYTES_PER_BATCH_BYTE * len(encoded(batch))


def test_the_worst_request_to_batch_ratio_is_under_the_configured_multiple() -> None:
    # Empty (not null) key and value, no timestamp: 17 protobuf bytes, 7 in the batch.
    tiny = [PendingRecord(b"", b"", [], -1)] * 10_000
    ratio = request_of(tiny).ByteSize() / len(encoded(tiny))
    assert 2 < ratio < 2.5 < REQUEST_BYTES_PER_BATCH_BYTE


def test_a_record_too_large_fails_at_once_and_is_never_sent() -> None:
    fake = FakeCluster()
    with Producer(
        ["fake-coordinator:9092"], channels=FakeChannels(fake), max_request_size=LIMIT, **FAST
    ) as producer:
        largest = producer.send("t", b"x" * (LIMIT - BATCH_HEADER_SIZE - 24), partition=0)
        too_large = producer.send("t", b"x" * LIMIT, partition=0)
        error = too_large.exception(0)  # already failed: no waiting, no retries
        assert isinstance(error, RecordTooLargeError)
        assert f"max_request_size={LIMIT}" in str(error)
        assert largest.result(5).offset == 0
        assert producer.send("t", b"after", partition=0).result(5).offset == 1
    sent = [r for m, r in fake.calls if m == "Produce"]
    assert [len(p.batch.records) for r in sent for p in r.partitions] == [1, 1]


def test_a_record_too_large_makes_the_transaction_abortable_not_the_producer_fatal() -> None:
    fake = FakeCluster()
    producer = TransactionalProducer(
        ["fake-coordinator:9092"], "tx", channels=FakeChannels(fake), max_request_size=LIMIT, **FAST
    )
    producer.init_transactions()
    producer.begin_transaction()
    refused = producer.send("t", b"x" * LIMIT, partition=0)
    assert isinstance(refused.exception(0), RecordTooLargeError)
    with pytest.raises(TransactionAbortableError) as raised:
        producer.commit_transaction()
    assert isinstance(raised.value.__cause__, RecordTooLargeError)
    producer.abort_transaction()
    producer.begin_transaction()
    assert producer.send("t", b"fits", partition=0).result(5).offset == 0
    producer.commit_transaction()
    producer.begin_transaction()
    producer.send("t", b"x" * LIMIT, partition=1)
    producer.close()  # aborts the open transaction; nothing was fenced
    assert fake.methods() == ["InitProducerId", "AddPartitionsToTxn", "Produce", "EndTxn"]


def test_batches_sent_to_one_node_are_split_into_requests_of_max_request_size() -> None:
    fake = FakeCluster(partitions=6)
    with Producer(
        ["fake-coordinator:9092"],
        channels=FakeChannels(fake),
        max_request_size=LIMIT,
        linger_ms=60_000,
        retry_backoff_ms=1,
    ) as producer:
        futures = [producer.send("t", b"x" * 300, partition=p % 6) for p in range(12)]
        producer.flush()
        assert all(f.result(0) for f in futures)
    requests = [r for m, r in fake.calls if m == "Produce"]
    # Batches of two 300-byte records (a third would pass the limit); two
    # batches would pass it too, so one batch per request.
    assert [[len(p.batch.records) for p in r.partitions] for r in requests] == [[2]] * 6
    for request in requests:
        assert len(encoded_request([p.batch for p in request.partitions])) <= LIMIT


def encoded_request(batches: list[partition_log_pb2.RecordBatch]) -> bytes:
    return b"".join(
        bytes(
            encoded(
                [
                    PendingRecord(
                        r.key if r.HasField("key") else None,
                        r.value if r.HasField("value") else None,
                        [(h.key, h.value) for h in r.headers],
                        r.timestamp_ms,
                    )
                    for r in batch.records
                ]
            )
        )
        for batch in batches
    )


@pytest.mark.parametrize("timestamp", [-1, -5, 2**63])
def test_send_refuses_a_timestamp_outside_0_to_2_63(timestamp: int) -> None:
    fake = FakeCluster()
    with Producer(["fake-coordinator:9092"], channels=FakeChannels(fake), **FAST) as producer:
        with pytest.raises(ValueError, match="timestamp_ms"):
            producer.send("t", b"v", partition=0, timestamp_ms=timestamp)
        with pytest.raises(TypeError, match="timestamp_ms"):
            producer.send("t", b"v", partition=0, timestamp_ms=1.5)  # type: ignore[arg-type]
        assert producer.send("t", b"v", partition=0, timestamp_ms=2**63 - 1).result(5)
    assert "Produce" in fake.methods()
