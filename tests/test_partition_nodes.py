"""Partition-log nodes as real processes beside a real coordinator cluster."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fsm import ErrorCode
from partition_log import codec
from partition_log.log import PartitionLogStore
from raftcoord.client import Consumer, TopicPartition
from raftcoord.client._net import CHANNEL_OPTIONS, client_closed
from raftcoord.client.errors import NoOffsetForPartitionError, OffsetOutOfRangeError
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.channels import ChannelCache
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2, partition_log_pb2
from tests.coord_client import Coordinators
from tests.local_cluster import running_cluster
from tests.plog_client import (
    create_topic,
    list_offset,
    produce,
    read_all,
    stub,
    write_marker,
)
from tests.seeds import chosen_seed

pytestmark = pytest.mark.slow
NO_PRODUCER: dict[str, Any] = {
    "producer_id": -1,
    "producer_epoch": -1,
    "base_sequence": -1,
    "transactional": False,
}


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("plog") / "cluster") as cluster:
        yield cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "cluster") as cluster:
        yield cluster


def node_id_of(cluster: LocalCluster, address: str) -> int:
    return next(n.node_id for n in cluster.partition_nodes() if n.grpc == address)


def test_cluster_up_starts_partition_nodes(shared_cluster: LocalCluster) -> None:
    nodes = shared_cluster.partition_nodes()
    assert [n.node_id for n in nodes] == [101, 102, 103]
    table = shared_cluster.status_table()
    assert table.count("partition-log, serving") == 3, table


def test_produce_fetch_round_trip_and_bad_input(shared_cluster: LocalCluster) -> None:
    owners = create_topic(shared_cluster, "roundtrip", 3)
    assert len(set(owners.values())) == 3  # one partition per node
    for partition, address in owners.items():
        node = stub(address)
        values = [b"p%d-%d" % (partition, i) for i in range(5)]
        first = produce(node, "roundtrip", partition, values[:2])
        second = produce(node, "roundtrip", partition, values[2:])
        assert (first.error_code, first.base_offset) == (ErrorCode.NONE, 0)
        assert (second.error_code, second.base_offset) == (ErrorCode.NONE, 2)
        for committed in (False, True):
            seen, answer = read_all(node, "roundtrip", partition, committed)
            assert seen == list(enumerate(values))
            assert answer.high_watermark == answer.last_stable_offset == 5
        assert (
            list_offset(node, "roundtrip", partition, partition_log_pb2.OFFSET_SPEC_EARLIEST) == 0
        )
        assert list_offset(node, "roundtrip", partition, partition_log_pb2.OFFSET_SPEC_LATEST) == 5
        assert (
            list_offset(node, "roundtrip", partition, partition_log_pb2.OFFSET_SPEC_LAST_STABLE)
            == 5
        )

    node = stub(owners[0])
    wrong = stub(owners[1])
    bad: list[tuple[Any, ErrorCode]] = [
        (produce(node, "no-such-topic", 0, [b"x"]), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        (produce(node, "roundtrip", 7, [b"x"]), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        (produce(wrong, "roundtrip", 0, [b"x"]), ErrorCode.NOT_LEADER_OR_FOLLOWER),
        (produce(node, "roundtrip", 0, [b"x" * (1 << 20)]), ErrorCode.MESSAGE_TOO_LARGE),
        (produce(node, "roundtrip", 0, []), ErrorCode.INVALID_REQUEST),
        (produce(node, "roundtrip", 0, [b"x"], 5, 70000, 0), ErrorCode.INVALID_REQUEST),
        (
            produce(node, "roundtrip", 0, [b"x"], 5, 0, 0, transactional=True),
            ErrorCode.INVALID_REQUEST,
        ),
        (produce(node, "roundtrip", 0, [b"x"], -5, 0, 0), ErrorCode.INVALID_REQUEST),
        (produce(node, "roundtrip", 0, [b"x"], 9, 0, 3), ErrorCode.UNKNOWN_PRODUCER_ID),
    ]
    for answer, code in bad:
        assert (answer.error_code, answer.base_offset) == (code, -1), answer
        assert answer.error_message
    assert (
        list_offset(node, "roundtrip", 0, partition_log_pb2.OFFSET_SPEC_LATEST) == 5
    )  # nothing appended
    beyond = node.Fetch(
        partition_log_pb2.FetchRequest(
            partitions=[
                partition_log_pb2.FetchPartition(topic="roundtrip", partition=0, fetch_offset=99)
            ]
        ),
        timeout=5,
    ).partitions[0]
    assert beyond.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    marker = node.WriteTxnMarkers(
        partition_log_pb2.WriteTxnMarkersRequest(
            markers=[partition_log_pb2.TxnMarker(producer_id=-3, groups=["g"])]
        ),
        timeout=5,
    ).markers[0]
    assert [g.error_code for g in marker.groups] == [ErrorCode.INVALID_REQUEST]
    assert list_offset(node, "roundtrip", 0, partition_log_pb2.OFFSET_SPEC_LATEST) == 5


def test_the_first_transactional_batch_adds_the_partition_to_the_transaction(
    shared_cluster: LocalCluster,
) -> None:
    owners = create_topic(shared_cluster, "verified", 2)
    node = stub(owners[0])
    coordinators = Coordinators([n.grpc for n in shared_cluster.coordinators()])
    tid = "verify-tx"
    try:
        init = coordinators.call(
            tid,
            "InitProducerId",
            coordinator_pb2.InitProducerIdRequest(
                transactional_id=tid, transaction_timeout_ms=60_000
            ),
        )
        pid, epoch = init.producer_id, init.producer_epoch
        txn = {"transactional": True, "transactional_id": tid}

        # The first batch of the transaction here: the node has the coordinator
        # add the partition to the producer's transaction (KIP-890 part 2),
        # which starts it; the producer never called AddPartitionsToTxn.
        ok = produce(node, "verified", 0, [b"a", b"b"], pid, epoch, 0, **txn)
        assert (ok.error_code, ok.base_offset) == (ErrorCode.NONE, 0)
        described = coordinators.call(
            tid,
            "DescribeTransactions",
            coordinator_pb2.DescribeTransactionsRequest(transactional_ids=[tid]),
        ).transactions[0]
        assert described.state == common_pb2.TRANSACTION_STATE_ONGOING
        assert [(t.topic, list(t.partitions)) for t in described.topics] == [("verified", [0])]
        more = produce(node, "verified", 0, [b"c"], pid, epoch, 2, **txn)
        assert (more.error_code, more.base_offset) == (ErrorCode.NONE, 2)
        retried = produce(node, "verified", 0, [b"c"], pid, epoch, 2, **txn)
        assert (retried.error_code, retried.base_offset) == (ErrorCode.NONE, 2)
        # The same producer may not write outside its open transaction here.
        plain = produce(node, "verified", 0, [b"z"], pid, epoch, 3)
        assert plain.error_code == ErrorCode.INVALID_TXN_STATE
        other = produce(node, "verified", 0, [b"plain"])  # someone else's plain record
        assert (other.error_code, other.base_offset) == (ErrorCode.NONE, 3)

        seen, answer = read_all(node, "verified", 0, committed=True)
        assert seen == [] and answer.last_stable_offset == 0 and answer.high_watermark == 4
        assert len(read_all(node, "verified", 0, committed=False)[0]) == 4

        end = coordinators.call(
            tid,
            "EndTxn",
            coordinator_pb2.EndTxnRequest(
                transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=True
            ),
        )
        assert end.error_code == ErrorCode.NONE and end.producer_epoch == epoch + 1
        # The marker as the coordinator sends it (it may already have arrived),
        # with the coordinator epoch of the shard's leader now: a lower one
        # is fenced once the coordinator's own marker is here.
        leader_epoch = (
            coordinators.call(
                tid,
                "DescribeTransactions",
                coordinator_pb2.DescribeTransactionsRequest(transactional_ids=[tid]),
            )
            .transactions[0]
            .coordinator_epoch
        )
        marker = write_marker(
            node,
            "verified",
            0,
            pid,
            end.producer_epoch,
            commit=True,
            coordinator_epoch=leader_epoch,
        )
        assert marker.error_code == ErrorCode.NONE
        seen, answer = read_all(node, "verified", 0, committed=True)
        assert seen == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"plain")]
        assert answer.last_stable_offset == answer.high_watermark == 5  # + the COMMIT record
        # A late batch of the finished transaction is refused.
        late = produce(node, "verified", 0, [b"late"], pid, epoch, 3, **txn)
        assert late.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    finally:
        coordinators.close()


def test_idempotent_retry_is_deduplicated_across_a_restart(cluster: LocalCluster) -> None:
    owners = create_topic(cluster, "dedupe", 1)
    address = owners[0]
    node = stub(address)
    first = produce(node, "dedupe", 0, [b"a", b"b"], 42, 0, 0)
    second = produce(node, "dedupe", 0, [b"c"], 42, 0, 2)
    assert (first.base_offset, second.base_offset) == (0, 2)
    assert produce(node, "dedupe", 0, [b"c"], 42, 0, 2).base_offset == 2
    gap = produce(node, "dedupe", 0, [b"d"], 42, 0, 5)
    assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER

    node_id = node_id_of(cluster, address)
    cluster.kill(node_id)
    cluster.start(node_id)
    node = stub(address)
    again = produce(node, "dedupe", 0, [b"c"], 42, 0, 2)
    assert (again.error_code, again.base_offset) == (ErrorCode.NONE, 2)
    assert produce(node, "dedupe", 0, [b"d"], 42, 0, 3).base_offset == 3
    assert produce(node, "dedupe", 0, [b"e"], 42, 1, 0).base_offset == 4  # new epoch
    assert (
        produce(node, "dedupe", 0, [b"f"], 42, 0, 4).error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    )
    assert [v for _, v in read_all(node, "dedupe", 0, committed=True)[0]] == [
        b"a",
        b"b",
        b"c",
        b"d",
        b"e",
    ]


def test_kill_9_mid_append_and_torn_tail_lose_nothing_acknowledged(
    cluster: LocalCluster,
) -> None:
    seed = chosen_seed(20261126)
    rng = random.Random(seed)
    owners = create_topic(cluster, "durable", 1)
    address = owners[0]
    node_id = node_id_of(cluster, address)
    acked: dict[int, bytes] = {}
    stop = threading.Event()

    def produce_until_failure() -> None:
        node = stub(address)
        for i in range(100_000):
            if stop.is_set():
                return
            value = b"v%d-" % i + rng.randbytes(rng.randrange(1, 200))
            try:
                answer = produce(node, "durable", 0, [value])
            except Exception:
                return  # the node died under us
            if answer.error_code == ErrorCode.NONE:
                acked[answer.base_offset] = value

    writer = threading.Thread(target=produce_until_failure)
    writer.start()
    try:
        cluster.wait_until(lambda: len(acked) >= 50, 20, "no appends acknowledged")
        cluster.kill(node_id)
    finally:
        stop.set()
        writer.join(timeout=20)
    # Tear the tail as a crash in the middle of a write would.
    data_dir = Path(cluster.data_dir) / f"partition-node-{node_id}" / "durable-0"
    segment = sorted(data_dir.glob("*.log"))[-1]
    with segment.open("ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x01\x00torn")
    cluster.start(node_id)
    node = stub(address)
    seen = dict(read_all(node, "durable", 0, committed=False)[0])
    assert {o: seen.get(o) for o in acked} == acked
    # Recovery cut the torn tail: the partition continues above every offset
    # handed out before (its ceiling), so none of the cut ones is reused.
    after = produce(node, "durable", 0, [b"after-restart"])
    assert after.error_code == ErrorCode.NONE and after.base_offset > max(seen) + 1, after
    log = Path(cluster.state.node(node_id).log).read_text()  # type: ignore[union-attr]
    assert "event=offsets_skipped partition=durable-0" in log


def fetch_both(node: Any, wanted: list[tuple[str, int, int]], committed: bool) -> list[Any]:
    """One Fetch for several (topic, partition, offset); the partition answers."""
    return list(
        node.Fetch(
            partition_log_pb2.FetchRequest(
                isolation_level=common_pb2.READ_COMMITTED if committed else 0,
                partitions=[
                    partition_log_pb2.FetchPartition(topic=t, partition=p, fetch_offset=o)
                    for t, p, o in wanted
                ],
            ),
            timeout=10,
        ).partitions
    )


def test_a_poison_batch_is_refused_and_an_unreadable_one_fails_only_its_partition(
    cluster: LocalCluster,
) -> None:
    owners = create_topic(cluster, "poison", 6)
    by_node: dict[str, list[int]] = {}
    for partition, address in sorted(owners.items()):
        by_node.setdefault(address, []).append(partition)
    address, (bad, good) = next((a, ps[:2]) for a, ps in by_node.items() if len(ps) >= 2)
    node = stub(address)
    poison = partition_log_pb2.RecordBatch(
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        records=[partition_log_pb2.Record(value=b"v", timestamp_ms=ts) for ts in (-1, 2**63 - 1)],
    )
    refused = node.Produce(
        partition_log_pb2.ProduceRequest(
            partitions=[
                partition_log_pb2.PartitionProduceData(topic="poison", partition=bad, batch=poison)
            ]
        ),
        timeout=10,
    ).partitions[0]
    assert (refused.error_code, refused.base_offset) == (ErrorCode.INVALID_TIMESTAMP, -1), refused
    for partition in (bad, good):
        assert produce(node, "poison", partition, [b"a", b"b"]).base_offset == 0
    for committed in (False, True):
        answers = fetch_both(node, [("poison", bad, 0), ("poison", good, 0)], committed)
        assert [(a.error_code, [r.value for r in a.records]) for a in answers] == [
            (ErrorCode.NONE, [b"a", b"b"]),
            (ErrorCode.NONE, [b"a", b"b"]),
        ]

    # The same batch written to disk before the checks existed (the node
    # stopped, the batch appended to the partition's segment directly).
    node_id = node_id_of(cluster, address)
    cluster.kill(node_id)
    directory = Path(cluster.data_dir) / f"partition-node-{node_id}" / f"poison-{bad}"
    with PartitionLogStore(directory, segment_bytes=1 << 20, index_interval_bytes=4096) as store:
        data = [codec.RecordData(None, b"v", (), ts) for ts in (-1, 2**63 - 1)]
        assert store.append(codec.encode_batch(data, **NO_PRODUCER)) == 2
        assert store.append(codec.encode_batch(data[:1], **NO_PRODUCER)) == 4
    cluster.start(node_id)
    node = stub(address)
    for committed in (False, True):
        before, other = fetch_both(node, [("poison", bad, 0), ("poison", good, 0)], committed)
        assert (before.error_code, [r.offset for r in before.records]) == (ErrorCode.NONE, [0, 1])
        assert before.next_fetch_offset == 2
        assert [r.value for r in other.records] == [b"a", b"b"]
        at, other = fetch_both(node, [("poison", bad, 2), ("poison", good, 1)], committed)
        assert at.error_code == ErrorCode.CORRUPT_MESSAGE and not at.records, at
        assert (other.error_code, [r.offset for r in other.records]) == (ErrorCode.NONE, [1])
        (past,) = fetch_both(node, [("poison", bad, 4)], committed)
        assert (past.error_code, [r.offset for r in past.records]) == (ErrorCode.NONE, [4])
    assert produce(node, "poison", bad, [b"c"]).base_offset == 5


class CountingChannels(ChannelCache):
    """Real channels that count the Fetch requests sent to partition-log nodes."""

    def __init__(self) -> None:
        super().__init__(CHANNEL_OPTIONS, closed_error=client_closed)
        self.fetches = 0

    def partition_log(self, address: str) -> Any:
        return _CountingFetchStub(self, super().partition_log(address))


class _CountingFetchStub:
    def __init__(self, owner: CountingChannels, stub: Any) -> None:
        self._owner, self._stub = owner, stub
        self.Fetch = self

    def __call__(self, request: Any, timeout: float) -> Any:
        self._owner.fetches += 1
        return self._stub.Fetch(request, timeout=timeout)

    def future(self, request: Any, timeout: float) -> Any:
        self._owner.fetches += 1
        return self._stub.Fetch.future(request, timeout=timeout)

    def __getattr__(self, method: str) -> Any:
        return getattr(self._stub, method)


def test_an_idle_consumer_long_polls_instead_of_spinning(shared_cluster: LocalCluster) -> None:
    owners = create_topic(shared_cluster, "idle", 1)
    tp = TopicPartition("idle", 0)
    channels = CountingChannels()
    with Consumer(shared_cluster.bootstrap(), fetch_max_wait_ms=500, channels=channels) as consumer:
        consumer.assign([tp])
        assert consumer.position(tp) == 0
        assert consumer.poll(timeout_ms=3000) == []
        # About one Fetch per fetch_max_wait_ms of the poll; a consumer without
        # long polls sends one every few tens of milliseconds (its backoff).
        assert 1 <= channels.fetches <= 10, channels.fetches

        # A Fetch parked on the node returns as soon as a record arrives.
        got: list[Any] = []
        poller = threading.Thread(target=lambda: got.extend(consumer.poll(timeout_ms=20_000)))
        poller.start()
        assert produce(stub(owners[0]), "idle", 0, [b"wake"]).error_code == ErrorCode.NONE
        poller.join(timeout=30)
        assert not poller.is_alive()
        assert [r.value for r in got] == [b"wake"]


def test_retention_deletes_segments_and_a_consumer_from_0_resets(tmp_path: Path) -> None:
    settings = {
        "log.segment.bytes": 1024,
        "log.retention.bytes": 2048,
        "log.retention.check.interval.ms": 100,
    }
    with running_cluster(
        tmp_path / "cluster", coordinators=1, shards=1, partition_nodes=1, settings=settings
    ) as small:
        owners = create_topic(small, "retained", 1)
        node = stub(owners[0])
        known = partition_log_pb2.ListOffsetsRequest(
            partitions=[partition_log_pb2.ListOffsetsPartition(topic="retained")]
        )
        small.wait_until(
            lambda: node.ListOffsets(known, timeout=5).partitions[0].error_code == ErrorCode.NONE,
            30,
            "the node did not learn the topic",
        )
        for i in range(40):
            answer = produce(node, "retained", 0, [b"value-%03d-" % i + b"x" * 200])
            assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, i)

        def log_start() -> int:
            return list_offset(node, "retained", 0, partition_log_pb2.OFFSET_SPEC_EARLIEST)

        small.wait_until(lambda: log_start() > 0, 30, "retention deleted nothing")
        start = log_start()
        assert 0 < start < 40
        assert list_offset(node, "retained", 0, partition_log_pb2.OFFSET_SPEC_LATEST) == 40
        below = node.Fetch(
            partition_log_pb2.FetchRequest(
                partitions=[partition_log_pb2.FetchPartition(topic="retained", fetch_offset=0)]
            ),
            timeout=5,
        ).partitions[0]
        assert below.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
        assert below.log_start_offset >= start

        tp = TopicPartition("retained", 0)
        with Consumer(small.bootstrap(), auto_offset_reset="earliest") as consumer:
            consumer.assign([tp])
            consumer.seek(tp, 0)
            records = consumer.poll(timeout_ms=10_000)
            assert records and records[0].offset >= start
            assert [r.offset for r in records] == list(range(records[0].offset, 40))[: len(records)]
        with Consumer(small.bootstrap(), auto_offset_reset="none") as consumer:
            consumer.assign([tp])
            with pytest.raises(NoOffsetForPartitionError):
                consumer.poll(timeout_ms=1000)
            consumer.seek(tp, 0)
            with pytest.raises(OffsetOutOfRangeError):
                consumer.poll(timeout_ms=10_000)
            assert consumer.position(tp) == 0  # not reset

        # The log start offset survives a restart of the node.
        [plog] = small.partition_nodes()
        small.kill(plog.node_id, "KILL")
        small.start(plog.node_id)
        assert log_start() >= start
