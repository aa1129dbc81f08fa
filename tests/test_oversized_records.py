"""Oversized records against a real cluster: the node answers MESSAGE_TOO_LARGE
(never a transport error) for a batch over message.max.bytes and accepts one
of exactly that size; the client refuses a record over max_request_size at
once, and the producer goes on (its transaction aborted, nothing fenced)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from fsm.errors import ErrorCode
from partition_log import codec
from raftcoord.client import TransactionAbortableError, TransactionalProducer
from raftcoord.client._accumulator import BATCH_HEADER_SIZE, PendingRecord
from raftcoord.client.errors import RecordTooLargeError
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.config import Settings
from tests.local_cluster import running_cluster
from tests.plog_client import create_topic, produce, read_all, records, stub

pytestmark = pytest.mark.slow
MESSAGE_MAX_BYTES = Settings().message_max_bytes
TEN_MB = 10 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("big") / "cluster") as cluster:
        yield cluster


def batch_bytes(value_size: int) -> int:
    """Bytes of the batch the node builds for one record as plog_client sends it."""
    (record,) = records(b"y" * value_size)
    data = codec.RecordData(record.key, record.value, (), record.timestamp_ms)
    batch = codec.encode_batch(
        [data], producer_id=-1, producer_epoch=-1, base_sequence=-1, transactional=False
    )
    return len(batch)


def test_the_node_answers_message_too_large_and_takes_the_largest_legal_batch(
    cluster: LocalCluster,
) -> None:
    owners = create_topic(cluster, "big-raw", 1)
    node = stub(owners[0])
    refused = produce(node, "big-raw", 0, [b"x" * TEN_MB])
    assert (refused.error_code, refused.base_offset) == (ErrorCode.MESSAGE_TOO_LARGE, -1), refused
    assert "message.max.bytes" in refused.error_message
    size = MESSAGE_MAX_BYTES - 100
    while batch_bytes(size) < MESSAGE_MAX_BYTES:
        size += 1
    assert batch_bytes(size) == MESSAGE_MAX_BYTES
    one_more = produce(node, "big-raw", 0, [b"y" * (size + 1)])
    assert one_more.error_code == ErrorCode.MESSAGE_TOO_LARGE
    largest = produce(node, "big-raw", 0, [b"y" * size])
    assert (largest.error_code, largest.base_offset) == (ErrorCode.NONE, 0)
    seen, _ = read_all(node, "big-raw", 0, committed=True)
    assert [(offset, len(value)) for offset, value in seen] == [(0, size)]


def test_the_client_refuses_a_10_mb_record_at_once_and_goes_on(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    owners = create_topic(cluster, "big-client", 1)
    largest = MESSAGE_MAX_BYTES - BATCH_HEADER_SIZE - 100
    while BATCH_HEADER_SIZE + PendingRecord(None, b"w" * (largest + 1), [], 0).size() <= (
        MESSAGE_MAX_BYTES
    ):
        largest += 1
    caplog.set_level(logging.WARNING, logger="raftcoord.client")
    producer = TransactionalProducer(cluster.bootstrap(), "big-tx")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        refused = producer.send("big-client", b"z" * TEN_MB, partition=0)
        assert isinstance(refused.exception(0), RecordTooLargeError)  # settled already
        with pytest.raises(TransactionAbortableError):
            producer.commit_transaction()
        producer.abort_transaction()

        producer.begin_transaction()
        sent = producer.send("big-client", b"w" * largest, partition=0)
        producer.commit_transaction()
        assert sent.result(0).offset == 0

        producer.begin_transaction()
        producer.send("big-client", b"z" * TEN_MB, partition=0)
    finally:
        producer.close()  # aborts the open transaction
    assert producer.state == "closed"  # not fatal: nothing was fenced
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    node = stub(owners[0])

    def committed() -> list[tuple[int, int]]:
        return [(o, len(v)) for o, v in read_all(node, "big-client", 0, committed=True)[0]]

    cluster.wait_until(lambda: committed() == [(0, largest)], 20, "the commit marker is missing")
