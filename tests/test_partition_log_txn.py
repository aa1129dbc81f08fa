"""Transactions on one partition, in process: visibility, LSO, markers, and
the Produce service's verification batching (coordinator answers faked;
the real coordinator is exercised in tests/test_partition_nodes.py)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from fsm.errors import ErrorCode
from partition_log import codec
from partition_log.cluster_view import MAX_FLUSH_PARTITIONS
from partition_log.log import FsyncPolicy
from partition_log.partition import BatchSpec, Partition
from partition_log.service import PartitionLogService
from raftcoord.protocol.v1 import common_pb2, partition_log_pb2
from tests.reserved import reserved

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafka.record.memory_records import MemoryRecords


def open_partition(path: Path) -> Partition:
    return reserved(
        Partition(
            "t", 0, path, segment_bytes=1 << 20, index_interval_bytes=256, fsync=FsyncPolicy.NEVER
        )
    )


@pytest.fixture
def partition(tmp_path: Path) -> Iterator[Partition]:
    made = open_partition(tmp_path / "t-0")
    try:
        yield made
    finally:
        made.close()


def send(part: Partition, pid: int, seq: int, *values: bytes, txn: bool, epoch: int = 0) -> int:
    records = [codec.RecordData(key=None, value=v, headers=(), timestamp_ms=1) for v in values]
    batch = codec.encode_batch(
        records,
        producer_id=pid,
        producer_epoch=epoch if pid >= 0 else -1,
        base_sequence=seq,
        transactional=txn,
    )
    spec = BatchSpec(pid, epoch if pid >= 0 else -1, seq, len(values), txn)
    check = part.append(spec, batch, verified=True)
    assert check.ok, check
    return check.base_offset


def visible(part: Partition, committed: bool) -> list[bytes]:
    result = part.fetch(0, 1 << 20, committed)
    assert result.error is ErrorCode.NONE
    return [r.value or b"" for b in result.batches for r in b.records]


def test_interleaved_transactions_read_committed_sees_exactly_the_committed(
    partition: Partition,
) -> None:
    send(partition, -1, -1, b"plain-0", txn=False)
    send(partition, 1, 0, b"commit-a", txn=True)  # offset 1
    send(partition, 2, 0, b"abort-a", txn=True)  # offset 2
    send(partition, 1, 1, b"commit-b", txn=True)
    send(partition, -1, -1, b"plain-1", txn=False)
    send(partition, 2, 1, b"abort-b", txn=True)
    assert partition.offsets() == (0, 1, 6)
    assert visible(partition, committed=True) == [b"plain-0"]  # stops at the LSO

    assert partition.write_marker(2, 1, 0, False, 0) == (ErrorCode.NONE, "")  # ABORT at offset 6
    assert partition.offsets() == (0, 1, 7)  # producer 1 still open at offset 1
    send(partition, 3, 0, b"open", txn=True)  # offset 7, stays open
    assert partition.write_marker(1, 1, 0, True, 0) == (ErrorCode.NONE, "")  # COMMIT at offset 8
    assert partition.offsets() == (0, 7, 9)  # the LSO moves to the open transaction
    send(partition, -1, -1, b"plain-2", txn=False)

    assert visible(partition, committed=True) == [b"plain-0", b"commit-a", b"commit-b", b"plain-1"]
    assert visible(partition, committed=False) == [
        b"plain-0",
        b"commit-a",
        b"abort-a",
        b"commit-b",
        b"plain-1",
        b"abort-b",
        b"open",
        b"plain-2",
    ]
    assert partition.write_marker(3, 1, 0, True, 0) == (ErrorCode.NONE, "")
    assert visible(partition, committed=True)[-2:] == [b"open", b"plain-2"]
    assert partition.offsets() == (0, 11, 11)

    # Offsets stay dense: a consumer continuing from next_fetch_offset moves
    # past the control records it never sees.
    position, offsets = 0, []
    while True:
        result = partition.fetch(position, 1, read_committed=True)
        offsets += [r.offset for b in result.batches for r in b.records]
        if result.next_fetch_offset == position:
            break
        position = result.next_fetch_offset
    assert offsets == [0, 1, 3, 4, 7, 9]
    assert position == 11


def test_state_is_rebuilt_from_the_log(tmp_path: Path) -> None:
    part = open_partition(tmp_path / "t-0")
    send(part, 1, 0, b"a", txn=True)
    send(part, 2, 0, b"b", txn=True)
    part.write_marker(2, 1, 4, False, 0)
    send(part, 5, 0, b"x", b"y", txn=False)
    part.close()
    again = open_partition(tmp_path / "t-0")
    try:
        assert again.offsets() == (0, 0, 5)
        assert [(t.producer_id, t.first_offset, t.last_offset) for t in again.states.aborted] == [
            (2, 1, 2)
        ]
        assert again.states.producers[2].coordinator_epoch == 4
        assert again.write_marker(2, 2, 3, True, 0)[0] is ErrorCode.TRANSACTION_COORDINATOR_FENCED
        retry = again.append(
            BatchSpec(5, 0, 0, 2, False),
            codec.encode_batch(
                [codec.RecordData(None, b"x", (), 1), codec.RecordData(None, b"y", (), 1)],
                producer_id=5,
                producer_epoch=0,
                base_sequence=0,
                transactional=False,
            ),
            verified=False,
        )
        assert retry.base_offset == 3  # still deduplicated after the restart
    finally:
        again.close()


class CountingAdder:
    """Answers verification questions like a coordinator that added ``allowed``."""

    def __init__(self, allowed: set[tuple[str, int]]) -> None:
        self.allowed = allowed
        self.calls: list[tuple[str, int, int, list[tuple[str, int]]]] = []
        #: The flush partitions each call named.
        self.flushes: list[list[tuple[str, int]]] = []

    def add_partitions(
        self,
        tid: str,
        pid: int,
        epoch: int,
        partitions: Sequence[tuple[str, int]],
        flush_partitions: Sequence[tuple[str, int]] = (),
    ) -> dict[tuple[str, int], tuple[ErrorCode, str]]:
        self.calls.append((tid, pid, epoch, list(partitions)))
        self.flushes.append(list(flush_partitions))
        return {
            tp: (ErrorCode.NONE, "")
            if tp in self.allowed
            else (ErrorCode.INVALID_TXN_STATE, "not added")
            for tp in partitions
        }


def txn_produce(partitions: Iterable[int], sequence: int) -> partition_log_pb2.ProduceRequest:
    """Producer 9's (epoch 0) transactional Produce of one record on each of
    ``partitions`` of topic t, at ``sequence``."""
    return partition_log_pb2.ProduceRequest(
        transactional_id="tx",
        partitions=[
            partition_log_pb2.PartitionProduceData(
                topic="t",
                partition=i,
                batch=partition_log_pb2.RecordBatch(
                    producer_id=9,
                    producer_epoch=0,
                    base_sequence=sequence,
                    is_transactional=True,
                    records=[partition_log_pb2.Record(value=b"v")],
                ),
            )
            for i in partitions
        ],
    )


def test_produce_asks_once_per_request_and_caches_the_answer(tmp_path: Path) -> None:
    parts = {("t", i): open_partition(tmp_path / f"t-{i}") for i in range(3)}
    adder = CountingAdder({("t", 0), ("t", 1)})
    service = PartitionLogService(
        lambda topic, i, _epoch: (
            parts.get((topic, i)) or (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no")
        ),
        adder,  # type: ignore[arg-type]
        1 << 20,
    )

    try:
        first = service.Produce(txn_produce(range(3), 0), None)
        assert [p.error_code for p in first.partitions] == [
            ErrorCode.NONE,
            ErrorCode.NONE,
            ErrorCode.INVALID_TXN_STATE,
        ]
        assert adder.calls == [("tx", 9, 0, [("t", 0), ("t", 1), ("t", 2)])]
        assert parts[("t", 2)].offsets() == (0, 0, 0)  # refused: nothing appended
        second = service.Produce(txn_produce(range(3), 1), None)
        assert [p.error_code for p in second.partitions] == [
            ErrorCode.NONE,
            ErrorCode.NONE,
            ErrorCode.UNKNOWN_PRODUCER_ID,  # its first batch was refused, so sequence 1 is unknown
        ]
        assert len(adder.calls) == 1  # the open transactions need no second question
        assert adder.flushes == [[]]  # the request named no flush partitions
    finally:
        for part in parts.values():
            part.close()


def test_the_flush_partitions_a_produce_names_go_with_its_add_bounded(tmp_path: Path) -> None:
    """``transaction_partitions`` (the partitions the producer's flush adds,
    on every node) are asked for with the node's own, at most
    MAX_FLUSH_PARTITIONS of them."""
    part = open_partition(tmp_path / "t-0")
    adder = CountingAdder({("t", 0)})
    service = PartitionLogService(
        lambda topic, i, _epoch: (
            part if (topic, i) == ("t", 0) else (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no")
        ),
        adder,  # type: ignore[arg-type]
        1 << 20,
    )
    named = MAX_FLUSH_PARTITIONS + 5
    request = txn_produce([0], 0)
    request.transaction_partitions.extend(
        [
            common_pb2.TopicPartitions(topic="t", partitions=[0, 1]),
            common_pb2.TopicPartitions(topic="u", partitions=list(range(named - 2))),
        ]
    )
    try:
        answer = service.Produce(request, None)
        assert [p.error_code for p in answer.partitions] == [ErrorCode.NONE]
        assert adder.calls == [("tx", 9, 0, [("t", 0)])]
        [flush] = adder.flushes
        assert len(flush) == MAX_FLUSH_PARTITIONS
        assert flush[:3] == [("t", 0), ("t", 1), ("u", 0)]
    finally:
        part.close()


# --- raw batches: what the Kafka gateway sends and reads ------------------------------


def raw_batch(pid: int, seq: int, value: bytes, txn: bool, epoch: int = 0) -> bytes:
    """A batch as a Kafka producer encodes it (kafka-python's builder)."""
    builder = DefaultRecordBatchBuilder(
        2, 1, txn, pid, epoch if pid >= 0 else -1, seq, 2**31 - 1
    )  # gzip, as a producer may
    builder.append(0, 1, None, value, [])
    return bytes(builder.build())


def raw_produce(service: PartitionLogService, pid: int, seq: int, value: bytes, txn: bool) -> Any:
    request = partition_log_pb2.ProduceRequest(
        partitions=[
            partition_log_pb2.PartitionProduceData(
                topic="t", partition=0, raw_batch=raw_batch(pid, seq, value, txn)
            )
        ]
    )
    if txn:
        request.transactional_id = "tx"
    (answer,) = service.Produce(request, None).partitions
    return answer


def raw_fetch(service: PartitionLogService, committed: bool, offset: int = 0) -> Any:
    (answer,) = service.Fetch(
        partition_log_pb2.FetchRequest(
            isolation_level=common_pb2.READ_COMMITTED if committed else common_pb2.READ_UNCOMMITTED,
            partitions=[
                partition_log_pb2.FetchPartition(topic="t", partition=0, fetch_offset=offset)
            ],
            raw=True,
        ),
        None,
    ).partitions
    return answer


def test_raw_batches_in_and_out_with_the_aborted_transactions(partition: Partition) -> None:
    service = PartitionLogService(
        lambda topic, i, _epoch: partition if (topic, i) == ("t", 0) else (ErrorCode.NONE, ""),
        CountingAdder({("t", 0)}),  # type: ignore[arg-type]
        1 << 20,
    )
    assert raw_produce(service, -1, -1, b"plain", txn=False).base_offset == 0
    assert raw_produce(service, 1, 0, b"commit-a", txn=True).base_offset == 1
    assert raw_produce(service, 2, 0, b"abort-a", txn=True).base_offset == 2
    duplicate = raw_produce(service, 1, 0, b"commit-a", txn=True)
    assert (duplicate.error_code, duplicate.base_offset) == (ErrorCode.NONE, 1)
    assert partition.write_marker(2, 1, 0, False, 0) == (ErrorCode.NONE, "")  # offset 3
    assert partition.write_marker(1, 1, 0, True, 0) == (ErrorCode.NONE, "")  # offset 4
    # The stored batches are uncompressed; the Python client reads them too.
    assert visible(partition, committed=True) == [b"plain", b"commit-a"]

    committed = raw_fetch(service, committed=True)
    assert committed.error_code == ErrorCode.NONE and not committed.records
    assert [(a.producer_id, a.first_offset) for a in committed.aborted_transactions] == [(2, 2)]
    assert committed.next_fetch_offset == 5 and committed.last_stable_offset == 5
    batches = read_raw(committed.raw_batches)
    assert [(b.base_offset, b.is_control_batch, b.producer_id) for b in batches] == [
        (0, False, -1),
        (1, False, 1),
        (2, False, 2),
        (3, True, 2),
        (4, True, 1),
    ]
    assert [r.value for r in batches[1]] == [b"commit-a"]
    uncommitted = raw_fetch(service, committed=False, offset=3)
    assert list(uncommitted.aborted_transactions) == []
    assert [b.base_offset for b in read_raw(uncommitted.raw_batches)] == [3, 4]

    both = partition_log_pb2.PartitionProduceData(
        topic="t",
        partition=0,
        raw_batch=raw_batch(-1, -1, b"x", txn=False),
        batch=partition_log_pb2.RecordBatch(producer_id=-1, records=[partition_log_pb2.Record()]),
    )
    (refused,) = service.Produce(
        partition_log_pb2.ProduceRequest(partitions=[both]), None
    ).partitions
    assert refused.error_code == ErrorCode.INVALID_REQUEST
    bad = bytearray(raw_batch(-1, -1, b"y", txn=False))
    bad[-1] ^= 1
    (corrupt,) = service.Produce(
        partition_log_pb2.ProduceRequest(
            partitions=[
                partition_log_pb2.PartitionProduceData(topic="t", partition=0, raw_batch=bytes(bad))
            ]
        ),
        None,
    ).partitions
    assert corrupt.error_code == ErrorCode.CORRUPT_MESSAGE
    assert partition.offsets() == (0, 5, 5)  # nothing appended by the refused ones


def test_a_raw_fetch_checks_every_batch_against_its_crc(partition: Partition) -> None:
    send(partition, -1, -1, b"first", txn=False)
    send(partition, -1, -1, b"second", txn=False)
    segment = next(partition.store.directory.glob("*.log"))
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0xFF  # the second batch's last byte
    segment.write_bytes(data)
    served = partition.fetch_raw(0, 1 << 20, read_committed=False)
    assert served.error is ErrorCode.NONE and served.next_fetch_offset == 1
    assert [b.base_offset for b in read_raw(served.raw)] == [0]
    at = partition.fetch_raw(1, 1 << 20, read_committed=False)
    assert at.error is ErrorCode.CORRUPT_MESSAGE and "CRC" in at.message and at.raw == b""


@pytest.mark.parametrize("elsewhere", [False, True], ids=["only-copy", "other-replica"])
def test_a_damaged_closed_segment_is_reported_and_answered_by_where_the_data_is(
    tmp_path: Path, elsewhere: bool
) -> None:
    """A batch of a closed segment (opened without its CRCs checked) that
    fails its CRC-32C: reads serve the batches before it, and a read that
    starts at it reports the damage and answers KAFKA_STORAGE_ERROR when
    another replica takes over (the client retries there), CORRUPT_MESSAGE
    when this copy is the only one. The check of the stored batches finds it
    without a reader."""
    reports: list[str] = []

    def on_damage(why: str) -> bool:
        reports.append(why)
        return elsewhere

    def open_it() -> Partition:
        return reserved(
            Partition(
                "t",
                0,
                tmp_path / "t-0",
                segment_bytes=300,
                index_interval_bytes=1,
                fsync=FsyncPolicy.NEVER,
                on_damage=on_damage,
            )
        )

    part = open_it()
    for i in range(12):
        send(part, -1, -1, f"value-{i}".encode(), txn=False)
    bases = part.store.segment_base_offsets
    assert len(bases) >= 3
    part.close()
    first = tmp_path / "t-0" / f"{0:020d}.log"
    data = bytearray(first.read_bytes())
    data[-1] ^= 0xFF  # the first segment's last batch: offset bases[1] - 1
    first.write_bytes(data)
    damaged = bases[1] - 1
    code = ErrorCode.KAFKA_STORAGE_ERROR if elsewhere else ErrorCode.CORRUPT_MESSAGE

    part = open_it()  # opens: closed segments' batches are checked later
    try:
        before = part.fetch(0, 1 << 20, read_committed=False)
        assert before.error is ErrorCode.NONE and before.next_fetch_offset == damaged
        assert [r.value for b in before.batches for r in b.records] == [
            f"value-{i}".encode() for i in range(damaged)
        ]
        assert reports == []
        assert part.fetch(damaged, 1 << 20, read_committed=False).error is code
        assert part.fetch_raw(damaged, 1 << 20, read_committed=False).error is code
        served = part.replica_read(2, 0, -1, 1 << 20)
        assert served.error is ErrorCode.NONE and len(read_raw(served.records)) == damaged
        at = part.replica_read(2, damaged, -1, 1 << 20)
        assert at.error is ErrorCode.KAFKA_STORAGE_ERROR and "CRC" in at.message
        assert len(reports) == 3
        reports.clear()
        while part.verify_stored(100):
            pass
        (found,) = reports
        assert f"(offset {damaged}) fails its CRC" in found
    finally:
        part.close()


def read_raw(data: bytes) -> list[Any]:
    records = MemoryRecords(data)
    batches = []
    while (batch := records.next_batch()) is not None:
        assert batch.validate_crc()
        batches.append(batch)
    return batches


def _leader_epochs(part: Partition) -> list[tuple[int, int]]:
    """(base offset, partition leader epoch) of every batch in the log."""
    return [(h.base_offset, h.partition_leader_epoch) for h, _ in part.store.batches(0)]


def test_every_batch_carries_the_leader_epoch_it_was_appended_at(tmp_path: Path) -> None:
    part = open_partition(tmp_path / "t-0")
    try:
        send(part, 1, 0, b"a", txn=False)
        part.lead(3)
        send(part, 1, 1, b"b", txn=False)
        part.lead(2)  # an older epoch never lowers it
        send(part, 1, 2, b"c", txn=True)
        part.lead(4)
        assert part.write_marker(1, 1, 1, True, 5) == (ErrorCode.NONE, "")
        assert _leader_epochs(part) == [(0, 0), (1, 3), (2, 3), (3, 4)]
    finally:
        part.close()
    # Opened again (after a clean close: nothing replayed), it starts at the
    # epoch of its last batch, not below.
    again = open_partition(tmp_path / "t-0")
    try:
        assert again.leader_epoch == 4
        again.lead(1)
        send(again, 2, 0, b"d", txn=False)
        assert _leader_epochs(again)[-1] == (4, 4)
    finally:
        again.close()
