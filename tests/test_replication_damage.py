"""Damage to one copy of a partition on a real cluster (3 coordinators, 3
partition-log nodes, 3 replicas, ``log.flush.policy = always``). A
leader's copy damaged while it is down: one flipped byte in a data batch
or a marker in the middle of the active segment, in a closed segment, in a
batch's base offset or in the last batch, or its last batch torn; the node
comes back within its lease, while the coordinators still record it as the
leader. A follower's copy damaged the same way, and a closed segment of a
running leader damaged under it. Every committed value is readable again
within 30 s from the healthy replicas, the damaged copy is set aside (kept
under ``damaged/``) and fetched again until it is back in the ISR, and no
offset is handed out twice (docs/partition-log.md, "Damage")."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from partition_log.codec import HEADER_SIZE, BatchHeader, parse_header
from raftcoord.client import Admin, Consumer, TopicPartition, TransactionalProducer
from raftcoord.client.records import TopicDescription
from raftcoord.cluster.launcher import LocalCluster
from tests.local_cluster import running_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOPIC = "flipped"
#: Small segments: the log has closed segments after a few dozen transactions.
SEGMENT_BYTES = 2048
SETTINGS = {
    "broker.heartbeat.interval.ms": 300,
    # A lease far longer than a restart: the damaged node is back while the
    # coordinators still record it as the leader.
    "broker.session.timeout.ms": 20_000,
    "log.segment.bytes": SEGMENT_BYTES,
    "log.flush.policy": "always",
}
#: How long every committed value may take to be readable again.
READABLE_WITHIN_S = 30.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "cluster", settings=SETTINGS) as running:
        with Admin(running.bootstrap()) as admin:
            admin.create_topics({TOPIC: 1}, replication_factor=3, min_insync_replicas=2)
        yield running


def describe(cluster: LocalCluster) -> TopicDescription:
    with Admin(cluster.bootstrap()) as admin:
        return admin.describe_topics([TOPIC])[TOPIC]


def partition_dir(cluster: LocalCluster, node_id: int) -> Path:
    return cluster.node_dir(node_id) / f"{TOPIC}-0"


def segments(cluster: LocalCluster, node_id: int) -> list[Path]:
    return sorted(partition_dir(cluster, node_id).glob("*.log"))


def batches(path: Path) -> list[tuple[int, BatchHeader]]:
    """(position, header) of every batch of a segment file."""
    data = path.read_bytes()
    found, pos = [], 0
    while pos < len(data):
        header = parse_header(data, pos)
        found.append((pos, header))
        pos += header.size
    return found


def log_bytes(cluster: LocalCluster, node_id: int) -> bytes:
    return b"".join(path.read_bytes() for path in segments(cluster, node_id))


def wait_identical(cluster: LocalCluster, nodes: list[int], timeout_s: float) -> None:
    sizes: dict[int, int] = {}

    def same() -> bool:
        logs = {n: log_bytes(cluster, n) for n in nodes}
        sizes.update({n: len(b) for n, b in logs.items()})
        return len(set(logs.values())) == 1

    cluster.wait_until(same, timeout_s, f"the replicas never matched: {sizes}")


def commit(producer: TransactionalProducer, n: int, label: str) -> list[bytes]:
    values = []
    for i in range(n):
        value = f"{label}-{i}".encode()
        producer.begin_transaction()
        producer.send(TOPIC, value, partition=0)
        producer.commit_transaction()
        values.append(value)
    return values


def read_committed(
    cluster: LocalCluster, expected: set[bytes], timeout_s: float
) -> dict[int, bytes]:
    """offset -> value of every committed record, once ``expected`` are all
    read (or the time is out), from the start of the partition."""
    consumer = Consumer(cluster.bootstrap(), isolation_level="read_committed")
    read: dict[int, bytes] = {}
    offsets: list[int] = []
    try:
        consumer.assign([TopicPartition(TOPIC, 0)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + timeout_s
        while not expected <= set(read.values()) and time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=500):
                assert record.value is not None
                offsets.append(record.offset)
                read[record.offset] = record.value
        for record in consumer.poll(timeout_ms=1000):  # nothing more, nothing twice
            assert record.value is not None
            offsets.append(record.offset)
            read[record.offset] = record.value
    finally:
        consumer.close()
    assert len(offsets) == len(set(offsets)), f"an offset read twice: {offsets}"
    return read


# -- the damage, done to the leader's files while it is down --------------------------------


def _flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(data)


def _middle(found: list[tuple[int, BatchHeader]], control: bool) -> int:
    """The position of a batch of that kind with batches before and after it."""
    inner = [(p, h) for p, h in found[1:-1] if h.is_control == control]
    return inner[len(inner) // 2][0]


def middle_batch(files: list[Path]) -> None:
    _flip(files[-1], _middle(batches(files[-1]), control=False) + HEADER_SIZE + 5)


def middle_marker(files: list[Path]) -> None:
    _flip(files[-1], _middle(batches(files[-1]), control=True) + HEADER_SIZE + 5)


def closed_segment(files: list[Path]) -> None:
    _flip(files[0], _middle(batches(files[0]), control=False) + HEADER_SIZE + 5)


def base_offset(files: list[Path]) -> None:
    _flip(files[-1], _middle(batches(files[-1]), control=False) + 7)


def last_batch(files: list[Path]) -> None:
    _flip(files[-1], files[-1].stat().st_size - 3)  # the last marker's coordinator epoch


def torn_last_batch(files: list[Path]) -> None:
    """The last batch (a COMMIT marker) cut short: a write that never
    completed here, which the followers hold whole."""
    with files[-1].open("r+b") as f:
        f.truncate(files[-1].stat().st_size - 5)


def fill(cluster: LocalCluster, producer: TransactionalProducer, node: int) -> list[bytes]:
    """Commit transactions until ``node``'s log has a closed segment and
    markers inside its active one, and every replica holds all of it (the
    last marker too); returns the values committed."""
    committed = commit(producer, 30, "first")
    for n in range(20):
        files = segments(cluster, node)
        active = batches(files[-1])
        if len(files) >= 2 and sum(h.is_control for _, h in active[1:-1]) >= 2:
            break
        committed += commit(producer, 3, f"more{n}")
    wait_identical(cluster, sorted(n.node_id for n in cluster.partition_nodes()), 30.0)
    return committed


def read_again(cluster: LocalCluster, committed: list[bytes], since: float) -> dict[int, bytes]:
    """Every committed value, read within :data:`READABLE_WITHIN_S` of ``since``."""
    read = read_committed(cluster, set(committed), READABLE_WITHIN_S)
    took = time.monotonic() - since
    print(f"every committed value read {took:.1f} s after the damage met the node")
    unread = set(committed) - set(read.values())
    assert not unread, f"{len(unread)} committed values unread after {took:.1f} s"
    assert took <= READABLE_WITHIN_S + 2
    return read


def check_rebuilt(
    cluster: LocalCluster,
    producer: TransactionalProducer,
    node: int,
    committed: list[bytes],
    read: dict[int, bytes],
    kept: dict[str, bytes] | None,
) -> None:
    """``node``'s copy was set aside (its files as ``kept``; None: none was)
    and fetched again: it rejoins the ISR, every replica holds the same log,
    and later transactions take offsets never handed out before."""
    cluster.wait_until(
        lambda: node in describe(cluster).partitions[0].isr, 60.0, "the rebuilt copy in the ISR"
    )
    later = commit(producer, 5, "later")
    wait_identical(cluster, sorted(n.node_id for n in cluster.partition_nodes()), 30.0)
    after = read_committed(cluster, set(committed + later), READABLE_WITHIN_S)
    assert {o: v for o, v in after.items() if o in read} == read, "an offset changed its value"
    assert min(o for o, v in after.items() if v in later) > max(read), "an offset handed out twice"
    node_log = Path(cluster.state.node(node).log).read_text()  # type: ignore[union-attr]
    assert "event=fenced_for_lost_data" in node_log
    aside = cluster.node_dir(node) / "damaged"
    if kept is None:
        assert not aside.exists()
        assert "event=partition_damaged" not in node_log
        return
    (moved,) = aside.iterdir()
    assert moved.name.startswith(f"{TOPIC}-0.")
    aside_logs = {p.name: p.read_bytes() for p in moved.glob("*.log")}
    assert aside_logs.keys() == kept.keys()
    for name, data in kept.items():  # a running leader may have appended since
        assert aside_logs[name].startswith(data), f"{name} set aside is not the damaged copy"
    assert "event=partition_set_aside" in node_log


@pytest.mark.parametrize(
    "damage",
    [middle_batch, middle_marker, closed_segment, base_offset, last_batch, torn_last_batch],
)
def test_a_damaged_leader_hands_over_and_is_fetched_again(
    cluster: LocalCluster, damage: Callable[[list[Path]], None]
) -> None:
    nodes = sorted(n.node_id for n in cluster.partition_nodes())
    before = describe(cluster).partitions[0]
    assert sorted(before.isr) == nodes
    victim = before.leader
    with TransactionalProducer(cluster.bootstrap(), "damage-txn") as producer:
        producer.init_transactions()
        committed = fill(cluster, producer, victim)
        cluster.kill(victim, "KILL")
        damage(segments(cluster, victim))
        kept = {p.name: p.read_bytes() for p in segments(cluster, victim)}
        restarted = time.monotonic()
        cluster.start(victim)
        read = read_again(cluster, committed, restarted)
        moved = describe(cluster).partitions[0]
        assert moved.leader not in (victim, -1) and moved.leader_epoch > before.leader_epoch
        check_rebuilt(
            cluster, producer, victim, committed, read, None if damage is torn_last_batch else kept
        )


def test_a_damaged_follower_is_fetched_again(cluster: LocalCluster) -> None:
    """A follower whose copy was damaged while it was down leaves the ISR
    at once and is fetched again; the leader stays."""
    before = describe(cluster).partitions[0]
    follower = next(n for n in before.replicas if n != before.leader)
    with TransactionalProducer(cluster.bootstrap(), "damage-txn") as producer:
        producer.init_transactions()
        committed = fill(cluster, producer, follower)
        cluster.kill(follower, "KILL")
        middle_batch(segments(cluster, follower))
        kept = {p.name: p.read_bytes() for p in segments(cluster, follower)}
        restarted = time.monotonic()
        cluster.start(follower)
        cluster.wait_until(
            lambda: (
                "event=partition_set_aside" in Path(cluster.state.node(follower).log).read_text()
            ),  # type: ignore[union-attr]
            10.0,
            "the damaged copy set aside",
        )
        read = read_again(cluster, committed, restarted)
        assert describe(cluster).partitions[0].leader == before.leader
        check_rebuilt(cluster, producer, follower, committed, read, kept)


def test_damage_a_reader_meets_moves_the_leadership(cluster: LocalCluster) -> None:
    """A closed segment of a running leader damaged under it (a bad sector):
    the reader that meets it is answered KAFKA_STORAGE_ERROR, retries at the
    in-sync replica that takes over, and reads every committed value."""
    before = describe(cluster).partitions[0]
    victim = before.leader
    with TransactionalProducer(cluster.bootstrap(), "damage-txn") as producer:
        producer.init_transactions()
        committed = fill(cluster, producer, victim)
        closed_segment(segments(cluster, victim))
        kept = {p.name: p.read_bytes() for p in segments(cluster, victim)}
        damaged = time.monotonic()
        read = read_again(cluster, committed, damaged)
        moved = describe(cluster).partitions[0]
        assert moved.leader not in (victim, -1) and moved.leader_epoch > before.leader_epoch
        check_rebuilt(cluster, producer, victim, committed, read, kept)
