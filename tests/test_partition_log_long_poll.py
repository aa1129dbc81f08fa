"""Long polls, in process: a Fetch with max_wait_ms / min_bytes is parked until
records arrive (under read_committed: until the LSO moves past them), and
answered at once when it asks for no wait, when an error shows up, or when
every parking place is taken. The consumer's side is in tests/test_partition_nodes.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fsm.errors import ErrorCode
from partition_log import codec
from partition_log import service as service_module
from partition_log.cluster_view import TopicPartition
from partition_log.log import FsyncPolicy
from partition_log.partition import BatchSpec, Partition
from partition_log.service import LogChanges, PartitionLogService
from raftcoord.protocol.v1 import common_pb2, partition_log_pb2
from tests.reserved import reserved


class NoVerifier:
    def verify(self, *args: Any) -> dict[TopicPartition, tuple[ErrorCode, str]]:
        raise AssertionError("not used")


def partition_at(directory: Path, changes: LogChanges) -> Partition:
    """Partition t-0 in ``directory``, telling ``changes`` of its changes."""
    return Partition(
        "t",
        0,
        directory,
        segment_bytes=1 << 20,
        index_interval_bytes=256,
        fsync=FsyncPolicy.NEVER,
        on_change=changes.changed,
    )


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Partition, LogChanges]]:
    changes = LogChanges()
    part = reserved(partition_at(tmp_path / "t-0", changes))
    try:
        yield part, changes
    finally:
        changes.close()
        part.close()


def service_for(part: Partition, changes: LogChanges, parking: int = 4) -> PartitionLogService:
    def lookup(
        topic: str, index: int, leader_epoch: int | None = None
    ) -> Partition | tuple[ErrorCode, str]:
        if (topic, index) == ("t", 0):
            return part
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "unknown"

    return PartitionLogService(lookup, NoVerifier(), 1 << 20, changes, parking)  # type: ignore[arg-type]


def fetch_request(
    offset: int, max_wait_ms: int, min_bytes: int = 1, committed: bool = False, topic: str = "t"
) -> Any:
    return partition_log_pb2.FetchRequest(
        isolation_level=common_pb2.READ_COMMITTED if committed else common_pb2.READ_UNCOMMITTED,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        partitions=[
            partition_log_pb2.FetchPartition(topic=topic, partition=0, fetch_offset=offset)
        ],
    )


def send(part: Partition, value: bytes, pid: int = -1, seq: int = -1, txn: bool = False) -> None:
    record = codec.RecordData(key=None, value=value, headers=(), timestamp_ms=1)
    epoch = 0 if pid >= 0 else -1
    batch = codec.encode_batch(
        [record], producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=txn
    )
    assert part.append(BatchSpec(pid, epoch, seq, 1, txn), batch, verified=True).ok


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


class InBackground:
    """Runs ``service.Fetch(request)`` on a thread."""

    def __init__(self, service: PartitionLogService, request: Any) -> None:
        self.answer: Any = None
        self.thread = threading.Thread(target=self._run, args=(service, request), daemon=True)
        self.thread.start()

    def _run(self, service: PartitionLogService, request: Any) -> None:
        self.answer = service.Fetch(request, None)

    def result(self) -> Any:
        self.thread.join(timeout=20)
        assert not self.thread.is_alive(), "the parked Fetch was not woken"
        return self.answer.partitions[0]


def test_a_parked_fetch_returns_as_soon_as_a_record_arrives(
    node: tuple[Partition, LogChanges],
) -> None:
    part, changes = node
    service = service_for(part, changes)
    parked = InBackground(service, fetch_request(0, max_wait_ms=30_000))
    wait_for(lambda: service.parked_fetches == 1, "the Fetch to park")
    send(part, b"hello")
    answer = parked.result()
    assert answer.error_code == ErrorCode.NONE
    assert [r.value for r in answer.records] == [b"hello"]
    assert service.parked_fetches == 0


def test_read_committed_waits_for_the_lso_not_for_the_data(
    node: tuple[Partition, LogChanges],
) -> None:
    part, changes = node
    service = service_for(part, changes)
    send(part, b"in-txn", pid=7, seq=0, txn=True)
    parked = InBackground(service, fetch_request(0, max_wait_ms=30_000, committed=True))
    wait_for(lambda: service.parked_fetches == 1, "the Fetch to park")
    assert parked.thread.is_alive()
    assert part.write_marker(7, 1, 1, True, 1) == (ErrorCode.NONE, "")
    answer = parked.result()
    assert [r.value for r in answer.records] == [b"in-txn"]


def test_min_bytes_waits_for_enough_records(node: tuple[Partition, LogChanges]) -> None:
    part, changes = node
    service = service_for(part, changes)
    parked = InBackground(service, fetch_request(0, max_wait_ms=30_000, min_bytes=10))
    wait_for(lambda: service.parked_fetches == 1, "the Fetch to park")
    send(part, b"12345")
    wait_for(lambda: changes.generation == 1, "the append")
    assert parked.thread.is_alive()
    send(part, b"67890")
    assert [r.value for r in parked.result().records] == [b"12345", b"67890"]


def test_no_wait_errors_and_full_parking_answer_at_once(
    node: tuple[Partition, LogChanges],
) -> None:
    part, changes = node
    service = service_for(part, changes, parking=1)
    # max_wait_ms 0 (the default of older clients) and min_bytes 0 never park.
    assert not service.Fetch(fetch_request(0, max_wait_ms=0), None).partitions[0].records
    assert not service.Fetch(fetch_request(0, 30_000, min_bytes=0), None).partitions[0].records
    # An error is answered at once.
    unknown = service.Fetch(fetch_request(0, 30_000, topic="nope"), None).partitions[0]
    assert unknown.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    out_of_range = service.Fetch(fetch_request(5, 30_000), None).partitions[0]
    assert out_of_range.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    # The one parking place is taken: the next Fetch is answered at once.
    parked = InBackground(service, fetch_request(0, max_wait_ms=30_000))
    wait_for(lambda: service.parked_fetches == 1, "the Fetch to park")
    assert not service.Fetch(fetch_request(0, 30_000), None).partitions[0].records
    # Closing (the node stops) answers parked Fetches.
    changes.close()
    assert not parked.result().records


def test_the_wait_ends_after_max_wait_ms(node: tuple[Partition, LogChanges]) -> None:
    part, changes = node
    answer = service_for(part, changes).Fetch(fetch_request(0, max_wait_ms=20), None)
    assert answer.partitions[0].error_code == ErrorCode.NONE
    assert not answer.partitions[0].records


@pytest.mark.parametrize(("max_wait_ms", "min_bytes"), [(-1, 1), (30_001, 1), (10, -1)])
def test_bad_wait_settings_are_invalid_requests(
    node: tuple[Partition, LogChanges], max_wait_ms: int, min_bytes: int
) -> None:
    part, changes = node
    answer = service_for(part, changes).Fetch(fetch_request(0, max_wait_ms, min_bytes), None)
    assert answer.partitions[0].error_code == ErrorCode.INVALID_REQUEST
    assert "must be" in answer.partitions[0].error_message


def test_followers_wait_for_appends_and_consumers_for_the_high_watermark(
    tmp_path: Path,
) -> None:
    """A leader's append moves both counters; the high watermark moving when a
    follower catches up moves only the consumers' one (a parked ReplicaFetch
    has nothing new to answer then); a follower's own appends move neither
    (nothing fetches from a follower)."""
    changes = LogChanges()
    leader = reserved(partition_at(tmp_path / "leader", changes))
    follower_changes = LogChanges()
    follower = partition_at(tmp_path / "follower", follower_changes)
    try:
        leader.lead(1, in_sync_followers=frozenset({2}), followers=frozenset({2}))
        follower.follow(1)
        # The follower that joined may have parked a fetch: woken.
        assert (changes.generation, changes.appended) == (1, 1)
        send(leader, b"one")
        assert (changes.generation, changes.appended) == (2, 2)
        assert leader.high_watermark == 0  # the follower does not have it yet
        read = leader.replica_read(2, 0, -1, 1 << 20)
        follower.append_replicated([read.records])
        assert (follower_changes.generation, follower_changes.appended) == (0, 0)
        leader.replica_read(2, follower.log_end(), 1, 1 << 20)
        assert leader.high_watermark == 1
        assert (changes.generation, changes.appended) == (3, 2)
        # A parked ReplicaFetch waits on `appended`: one that saw 2 waits its time out.
        started = time.monotonic()
        changes.wait_appended_past(2, 0.05)
        assert time.monotonic() - started >= 0.05
        # The same replicas again wake nothing.
        leader.lead(1, in_sync_followers=frozenset({2}), followers=frozenset({2}))
        assert (changes.generation, changes.appended) == (3, 2)
    finally:
        changes.close()
        leader.close()
        follower.close()


def test_appends_to_a_partition_without_other_replicas_wake_no_replica_fetch(
    node: tuple[Partition, LogChanges],
) -> None:
    """Parked ReplicaFetches of a node's replicated partitions sleep through
    the appends of its partitions of one replica (nobody fetches those)."""
    part, changes = node
    part.lead(1)
    send(part, b"one")
    send(part, b"two")
    assert part.high_watermark == 2
    assert (changes.generation, changes.appended) == (2, 0)


def test_a_fetch_answers_at_most_the_nodes_bound_whatever_it_asks(
    node: tuple[Partition, LogChanges], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Fetch's max_bytes (up to 2 GiB) and a partition named many times
    cannot make the answer bigger than FETCH_MAX_BYTES (and its first batch)."""
    part, changes = node
    for i in range(20):
        send(part, b"%02d" % i + b"x" * 1000)
    monkeypatch.setattr(service_module, "FETCH_MAX_BYTES", 4096)
    request = partition_log_pb2.FetchRequest(
        max_bytes=2**31 - 1,
        raw=True,
        partitions=[
            partition_log_pb2.FetchPartition(
                topic="t", partition=0, fetch_offset=0, partition_max_bytes=2**31 - 1
            )
        ]
        * 100,
    )
    answer = service_for(part, changes).Fetch(request, None)
    sizes = [len(p.raw_batches) for p in answer.partitions]
    assert len(sizes) == 100 and sizes[0] > 0
    assert sum(sizes) <= 4096 + 1100  # the bound, and the batch that crossed it
