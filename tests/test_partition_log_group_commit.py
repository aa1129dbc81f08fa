"""Group commit in a partition (log.flush.policy always): appends written
under the partition's lock share the fsync one thread runs outside it;
nothing past what is on disk is read, fetched by a follower or acknowledged;
a failed fsync fails every append waiting for it and is never retried; one
WriteTxnMarkers fsyncs each partition it touches once."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import partition_log.log
import partition_log.partition
from fsm.errors import ErrorCode
from partition_log import codec
from partition_log.log import FsyncPolicy
from partition_log.partition import BatchSpec, Partition
from partition_log.producer_state import AppendCheck
from partition_log.service import PartitionLogService
from raftcoord.protocol.v1 import common_pb2, partition_log_pb2
from tests.reserved import reserved

WAIT_S = 10.0
#: Appenders queued behind one fsync.
APPENDERS = 8


class GatedFsync:
    """``os.fsync`` that holds each call until :meth:`open` (then runs the
    real one, or raises EIO with ``fail``), counting calls."""

    def __init__(self, real: Callable[[int], None], fail: bool = False) -> None:
        self._real = real
        self._fail = fail
        self._gate = threading.Event()
        self.entered = threading.Event()
        self.calls = 0

    def __call__(self, fd: int) -> None:
        self.calls += 1
        self.entered.set()
        assert self._gate.wait(WAIT_S), "the gate was never opened"
        if self._fail:
            raise OSError(errno.EIO, "I/O error")
        self._real(fd)

    def open(self) -> None:
        self._gate.set()


def open_partition(path: Path, followers: frozenset[int] = frozenset()) -> Partition:
    part = reserved(
        Partition(
            "t", 0, path, segment_bytes=1 << 20, index_interval_bytes=256, fsync=FsyncPolicy.ALWAYS
        )
    )
    if followers:
        part.lead(part.leader_epoch + 1, followers, 1, followers)
    return part


def batch(pid: int, seq: int, value: bytes, txn: bool = False) -> tuple[BatchSpec, bytearray]:
    record = codec.RecordData(key=None, value=value, headers=(), timestamp_ms=1)
    epoch = 0 if pid >= 0 else -1
    encoded = codec.encode_batch(
        [record], producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=txn
    )
    return BatchSpec(pid, epoch, seq, 1, txn), encoded


def send(part: Partition, pid: int, seq: int, value: bytes, txn: bool = False) -> AppendCheck:
    spec, encoded = batch(pid, seq, value, txn)
    return part.append(spec, encoded, verified=True)


def values(part: Partition) -> list[bytes]:
    fetched = part.fetch(0, 1 << 20, read_committed=False)
    assert fetched.error is ErrorCode.NONE
    return [r.value or b"" for b in fetched.batches for r in b.records]


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


@pytest.fixture
def partition(tmp_path: Path) -> Iterator[Partition]:
    part = open_partition(tmp_path / "t-0")
    try:
        assert send(part, -1, -1, b"first").ok  # also writes the leader-epoch checkpoint
        yield part
    finally:
        part.close()


def start_appenders(
    part: Partition, gate: GatedFsync
) -> tuple[list[threading.Thread], dict[int, AppendCheck]]:
    """One appender whose fsync the gate holds, then APPENDERS - 1 more
    written behind it (not synced yet), each on its own thread."""
    checks: dict[int, AppendCheck] = {}

    def appender(i: int) -> None:
        checks[i] = send(part, 100 + i, 0, f"v{i}".encode())

    threads = [threading.Thread(target=appender, args=(i,), daemon=True) for i in range(APPENDERS)]
    threads[0].start()
    assert gate.entered.wait(WAIT_S)
    for thread in threads[1:]:
        thread.start()
    wait_for(lambda: part.log_end() == 1 + APPENDERS, "every appender has written")
    return threads, checks


def join(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(WAIT_S)
        assert not thread.is_alive(), "an appender was never released"


def test_concurrent_appends_share_one_fsync_and_are_all_released(
    partition: Partition, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = GatedFsync(os.fsync)
    monkeypatch.setattr(os, "fsync", gate)
    depths: list[int] = []
    monkeypatch.setattr(partition_log.partition, "group_commit_observer", depths.append)
    threads, checks = start_appenders(partition, gate)
    # Written but not on disk: not readable, not under the high watermark.
    assert partition.offsets() == (0, 1, 1)
    assert values(partition) == [b"first"]
    gate.open()
    join(threads)
    # The first fsync covered the first appender; one more covered the rest.
    assert gate.calls == 2
    assert depths == [1, APPENDERS - 1]
    assert all(check.ok for check in checks.values()), checks
    assert sorted(check.base_offset for check in checks.values()) == list(range(1, 1 + APPENDERS))
    assert partition.offsets() == (0, 1 + APPENDERS, 1 + APPENDERS)
    assert len(values(partition)) == 1 + APPENDERS
    assert not partition.store.dirty


def test_a_follower_is_served_only_what_the_leader_has_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    part = open_partition(tmp_path / "t-0", followers=frozenset({2}))
    try:
        assert send(part, -1, -1, b"first").ok
        epoch = part.leader_epoch
        assert part.replica_read(2, 1, epoch, 1 << 20).records == b""  # caught up
        gate = GatedFsync(os.fsync)
        monkeypatch.setattr(os, "fsync", gate)
        appended: list[AppendCheck] = []
        thread = threading.Thread(
            target=lambda: appended.append(send(part, 5, 0, b"late")), daemon=True
        )
        thread.start()
        assert gate.entered.wait(WAIT_S)
        assert part.log_end() == 2
        assert part.replica_read(2, 1, epoch, 1 << 20).records == b""
        gate.open()
        join([thread])
        assert appended[0].ok and appended[0].base_offset == 1
        read = part.replica_read(2, 1, epoch, 1 << 20)
        assert codec.parse_header(read.records).base_offset == 1
        assert part.offsets()[2] == 1  # the follower does not have it yet
        part.replica_read(2, 2, epoch, 1 << 20)
        assert part.offsets()[2] == 2
    finally:
        part.close()


def test_a_failed_fsync_fails_every_waiting_append_and_is_never_retried(
    partition: Partition, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures: list[tuple[str, OSError]] = []
    monkeypatch.setattr(
        partition_log.log, "fsync_failure_handler", lambda what, exc: failures.append((what, exc))
    )
    gate = GatedFsync(os.fsync, fail=True)
    monkeypatch.setattr(os, "fsync", gate)
    threads, checks = start_appenders(partition, gate)
    gate.open()
    join(threads)
    assert gate.calls == 1
    assert len(failures) == 1 and failures[0][1].errno == errno.EIO
    assert [c.error for c in checks.values()] == [ErrorCode.KAFKA_STORAGE_ERROR] * APPENDERS
    assert partition.offsets() == (0, 1, 1)  # nothing past the failed fsync became visible
    assert send(partition, 7, 0, b"after").error is ErrorCode.KAFKA_STORAGE_ERROR


def marker(
    pid: int, coordinator_epoch: int, commit: bool, partitions: list[int]
) -> partition_log_pb2.TxnMarker:
    return partition_log_pb2.TxnMarker(
        producer_id=pid,
        producer_epoch=0,
        coordinator_epoch=coordinator_epoch,
        result=common_pb2.COMMIT if commit else common_pb2.ABORT,
        topics=[common_pb2.TopicPartitions(topic="t", partitions=partitions)],
        transaction_version=1,
    )


def test_one_write_txn_markers_fsyncs_each_partition_once_and_answers_each_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = {i: open_partition(tmp_path / f"t-{i}") for i in range(2)}
    service = PartitionLogService(
        lambda topic, i, _epoch: parts.get(i) or (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no"),
        None,  # type: ignore[arg-type]  # no verification asked
        1 << 20,
    )
    try:
        for pid in (7, 8, 9):
            assert send(parts[0], pid, 0, b"t0", txn=True).ok
        assert send(parts[1], 7, 0, b"t1", txn=True).ok
        # Producer 9 has seen coordinator epoch 5: a marker of epoch 3 is fenced.
        assert parts[0].write_marker(9, 0, 5, False, 0, transaction_version=1)[0] is ErrorCode.NONE
        assert send(parts[0], 9, 1, b"again", txn=True).ok
        calls: list[int] = []
        real = os.fsync

        def counting(fd: int) -> None:
            calls.append(fd)
            real(fd)

        monkeypatch.setattr(os, "fsync", counting)
        request = partition_log_pb2.WriteTxnMarkersRequest(
            markers=[
                marker(7, 1, True, [0, 1]),
                marker(8, 1, False, [0]),
                marker(9, 3, False, [0]),
                marker(10, 1, True, [2]),
            ]
        )
        answers = service.WriteTxnMarkers(request, None).markers
        assert [(m.producer_id, [p.error_code for p in m.partitions]) for m in answers] == [
            (7, [ErrorCode.NONE, ErrorCode.NONE]),
            (8, [ErrorCode.NONE]),
            (9, [ErrorCode.TRANSACTION_COORDINATOR_FENCED]),
            (10, [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]),
        ]
        assert len(calls) == 2  # one per partition written to
        # t-0: the COMMIT at 5 and the ABORT at 6 are readable; producer 9's
        # transaction from offset 4 is still open.
        assert [p.offsets()[1:] for p in parts.values()] == [(4, 7), (2, 2)]
        assert [p.store.dirty for p in parts.values()] == [False, False]
    finally:
        for part in parts.values():
            part.close()
