"""Hanging transactions in process: the find-hanging decision (pure), and a
partition-log service (real partitions, coordinator faked) that describes its
producers, appends unverified transactional batches when verification is off,
and accepts an administrator's ABORT only for the open transaction it names.
The real cluster is exercised in tests/test_txn_cli.py."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from fsm.errors import ErrorCode
from partition_log.log import FsyncPolicy
from partition_log.partition import Partition
from partition_log.service import PartitionLogService
from raftcoord.client import (
    PendingMarker,
    ProducerState,
    TopicPartition,
    TransactionDescription,
)
from raftcoord.client import admin as admin_module
from raftcoord.client.hanging import OpenTransaction, is_candidate, is_hanging
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2, partition_log_pb2
from tests.reserved import reserved

TP = TopicPartition("t", 0)
MINUTE_MS = 60_000


def producer(
    pid: int = 7, epoch: int = 3, start: int = 10, last_timestamp_ms: int = 0
) -> ProducerState:
    return ProducerState(
        producer_id=pid,
        producer_epoch=epoch,
        last_sequence=4,
        last_timestamp_ms=last_timestamp_ms,
        coordinator_epoch=2,
        current_transaction_start_offset=start,
    )


def description(
    state: str = "Ongoing",
    pid: int = 7,
    epoch: int = 3,
    partitions: frozenset[TopicPartition] = frozenset({TP}),
) -> TransactionDescription:
    return TransactionDescription(
        transactional_id="tx",
        state=state,
        producer_id=pid,
        producer_epoch=epoch,
        transaction_timeout_ms=60_000,
        transaction_start_time_ms=0,
        last_update_time_ms=0,
        partitions=partitions,
        groups=frozenset(),
        coordinator_epoch=2,
    )


# --- the decision --------------------------------------------------------------------


def test_candidates_are_open_transactions_idle_longer_than_the_max_timeout() -> None:
    now = 100 * MINUTE_MS
    old = now - 16 * MINUTE_MS
    assert is_candidate(producer(last_timestamp_ms=old), now, 15 * MINUTE_MS)
    assert not is_candidate(producer(last_timestamp_ms=now - MINUTE_MS), now, 15 * MINUTE_MS)
    assert not is_candidate(producer(start=-1, last_timestamp_ms=old), now, 15 * MINUTE_MS)
    assert is_candidate(producer(last_timestamp_ms=now - 1), now, 0)


@pytest.mark.parametrize(
    ("descriptions", "hanging"),
    [
        ([], True),  # the coordinators do not know the producer id
        ([description()], False),  # ongoing with this partition: its markers will come
        ([description(epoch=4)], False),  # a later epoch's markers close it too
        ([description(partitions=frozenset({TopicPartition("t", 1)}))], True),
        ([description(pid=8)], True),
        ([description(state="PrepareCommit", epoch=4)], False),  # markers on their way
        ([description(state="PrepareAbort", epoch=4)], False),
        ([description(state="PrepareEpochFence", epoch=4)], False),
        ([description(state="PrepareAbort", epoch=3)], True),  # its markers cannot close it
        ([description(state="CompleteCommit", epoch=4)], True),
        ([description(state="CompleteAbort", epoch=4)], True),
        ([description(state="Empty", epoch=4)], True),
        ([description(epoch=2)], True),  # an older epoch's markers do not close it
        ([description(state="Empty", epoch=4), description()], False),
    ],
)
def test_hanging_unless_a_coordinator_will_write_a_closing_marker(
    descriptions: list[TransactionDescription], hanging: bool
) -> None:
    assert is_hanging(OpenTransaction(TP, producer()), descriptions) is hanging


# --- the partition-log service -------------------------------------------------------


class RefusingAdder:
    """A coordinator that never added any partition to any transaction."""

    def __init__(self) -> None:
        self.calls = 0

    def add_partitions(
        self,
        tid: str,
        pid: int,
        epoch: int,
        partitions: Sequence[tuple[str, int]],
        flush_partitions: Sequence[tuple[str, int]] = (),
    ) -> dict[tuple[str, int], tuple[ErrorCode, str]]:
        self.calls += 1
        return {tp: (ErrorCode.INVALID_TXN_STATE, "not in the transaction") for tp in partitions}


def open_partition(path: Path) -> Partition:
    return reserved(
        Partition(
            "t", 0, path, segment_bytes=1 << 20, index_interval_bytes=256, fsync=FsyncPolicy.NEVER
        )
    )


class Node:
    """One partition "t-0" behind a PartitionLogService."""

    def __init__(self, path: Path, verify: bool) -> None:
        self.path = path
        self.partition = open_partition(path)
        self.adder = RefusingAdder()
        self.service = PartitionLogService(
            self.lookup,
            self.adder,  # type: ignore[arg-type]
            1 << 20,
            verify_transactions=verify,
        )

    def lookup(
        self, topic: str, index: int, leader_epoch: int | None = None
    ) -> Partition | tuple[ErrorCode, str]:
        if (topic, index) == TP:
            return self.partition
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no such partition"

    def produce(
        self, pid: int, epoch: int, sequence: int, timestamp_ms: int, transactional: bool = True
    ) -> Any:
        request = partition_log_pb2.ProduceRequest(
            transactional_id="tx",
            partitions=[
                partition_log_pb2.PartitionProduceData(
                    topic="t",
                    partition=0,
                    batch=partition_log_pb2.RecordBatch(
                        producer_id=pid,
                        producer_epoch=epoch,
                        base_sequence=sequence,
                        is_transactional=transactional,
                        records=[
                            partition_log_pb2.Record(value=b"a", timestamp_ms=timestamp_ms - 5),
                            partition_log_pb2.Record(value=b"b", timestamp_ms=timestamp_ms),
                        ],
                    ),
                )
            ],
        )
        return self.service.Produce(request, None).partitions[0]

    def producers(self) -> Any:
        request = partition_log_pb2.DescribeProducersRequest(
            topics=[common_pb2.TopicPartitions(topic="t", partitions=[0, 9])]
        )
        return self.service.DescribeProducers(request, None).partitions

    def marker(
        self, pid: int, epoch: int, coordinator_epoch: int, admin: bool, commit: bool = False
    ) -> Any:
        request = partition_log_pb2.WriteTxnMarkersRequest(
            markers=[
                partition_log_pb2.TxnMarker(
                    producer_id=pid,
                    producer_epoch=epoch,
                    coordinator_epoch=coordinator_epoch,
                    result=common_pb2.COMMIT if commit else common_pb2.ABORT,
                    topics=[common_pb2.TopicPartitions(topic="t", partitions=[0])],
                    admin_abort=admin,
                )
            ]
        )
        return self.service.WriteTxnMarkers(request, None).markers[0].partitions[0]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    made = Node(tmp_path / "t-0", verify=False)
    try:
        yield made
    finally:
        made.partition.close()


def test_verification_on_asks_the_coordinator(tmp_path: Path) -> None:
    on = Node(tmp_path / "t-0", verify=True)
    try:
        assert on.produce(7, 3, 0, 1_000).error_code == ErrorCode.INVALID_TXN_STATE
        assert on.adder.calls == 1
        assert on.partition.offsets() == (0, 0, 0)
    finally:
        on.partition.close()


def test_verification_off_appends_without_asking(node: Node) -> None:
    assert node.produce(7, 3, 0, 1_000).error_code == ErrorCode.NONE
    assert node.adder.calls == 0
    assert node.partition.offsets() == (0, 0, 2)  # the open transaction holds the LSO at 0


def test_describe_producers_reports_open_transactions_also_after_a_restart(node: Node) -> None:
    node.produce(-1, -1, -1, 500, transactional=False)  # offsets 0-1, no producer state
    node.produce(7, 3, 0, 1_000)  # offsets 2-3
    node.produce(7, 3, 2, 2_000)  # offsets 4-5
    node.produce(8, 0, 0, 3_000, transactional=False)  # offsets 6-7
    expected = [
        partition_log_pb2.ActiveProducer(
            producer_id=7,
            producer_epoch=3,
            last_sequence=3,
            last_timestamp_ms=2_000,
            coordinator_epoch=-1,
            current_txn_start_offset=2,
        ),
        partition_log_pb2.ActiveProducer(
            producer_id=8,
            producer_epoch=0,
            last_sequence=1,
            last_timestamp_ms=3_000,
            coordinator_epoch=-1,
            current_txn_start_offset=-1,
        ),
    ]
    found, unknown = node.producers()
    assert found.error_code == ErrorCode.NONE and list(found.active_producers) == expected
    assert unknown.partition == 9 and unknown.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    node.partition.close()
    node.partition = open_partition(node.path)  # the state is rebuilt from the log
    assert list(node.producers()[0].active_producers) == expected


def test_an_admin_abort_must_name_the_open_transaction(node: Node) -> None:
    node.produce(7, 3, 0, 1_000)  # open at offset 0, data epoch 3
    node.marker(9, 1, 5, admin=False)  # producer 9 has seen coordinator epoch 5
    before = node.partition.offsets()
    refusals = [
        (node.marker(7, 5, 0, admin=True), ErrorCode.INVALID_PRODUCER_EPOCH),  # names data epoch 4
        (node.marker(7, 3, 0, admin=True), ErrorCode.INVALID_PRODUCER_EPOCH),  # names data epoch 2
        (node.marker(8, 1, 0, admin=True), ErrorCode.INVALID_TXN_STATE),  # no such producer
        (node.marker(9, 2, 5, admin=True), ErrorCode.INVALID_TXN_STATE),  # nothing open
        (node.marker(7, 4, 0, admin=True, commit=True), ErrorCode.INVALID_REQUEST),  # only aborts
    ]
    for result, code in refusals:
        assert result.error_code == code, result
        assert result.error_message
    assert node.partition.offsets() == before  # nothing was written
    assert node.marker(7, 4, 0, admin=True).error_code == ErrorCode.NONE
    _, lso, end = node.partition.offsets()
    assert lso == end == before[2] + 1  # the marker closed it: the LSO moved to the end
    assert node.producers()[0].active_producers[0].current_txn_start_offset == -1
    again = node.marker(7, 4, 0, admin=True)  # a second abort finds nothing open
    assert again.error_code == ErrorCode.INVALID_TXN_STATE


def test_an_admin_abort_is_fenced_by_a_newer_coordinator_epoch(node: Node) -> None:
    node.produce(7, 3, 0, 1_000)
    node.marker(7, 4, 6, admin=False, commit=True)  # the coordinator (epoch 6) commits it
    node.produce(7, 4, 0, 2_000)  # the next transaction, open at epoch 4
    before = node.partition.offsets()
    fenced = node.marker(7, 5, 5, admin=True)
    assert fenced.error_code == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert node.partition.offsets() == before
    assert node.marker(7, 5, 6, admin=True).error_code == ErrorCode.NONE


def test_a_description_carries_the_markers_still_owed_and_why() -> None:
    """What DescribeTransactions says of undelivered markers reaches
    Admin.describe_transactions and the `txn describe` table."""
    answer = coordinator_pb2.TransactionDescription(
        transactional_id="stuck",
        state=common_pb2.TRANSACTION_STATE_PREPARE_COMMIT,
        pending_markers=[
            coordinator_pb2.PendingMarker(
                topic="orders",
                partition=3,
                last_error_code=common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
                last_error_message="no partition-log node is known for orders-3",
            ),
            coordinator_pb2.PendingMarker(group_id="billing"),
        ],
    )
    description = admin_module._description(answer)
    assert description.pending_markers == (
        PendingMarker(
            TopicPartition("orders", 3),
            None,
            "UNKNOWN_TOPIC_OR_PARTITION",
            "no partition-log node is known for orders-3",
        ),
        PendingMarker(None, "billing", "NONE", ""),
    )
    assert [str(m) for m in description.pending_markers] == [
        "orders-3: UNKNOWN_TOPIC_OR_PARTITION (no partition-log node is known for orders-3)",
        "group billing",
    ]
