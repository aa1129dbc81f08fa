"""Disks that lie and disks that fail, under real clusters.

One flipped bit in a replica's Raft journal (in the middle, in its last
record, or in its header's end of the log) is never applied and never
silently cut, and a term/vote file deleted beside its journal is never
started without: the node stops with ``event=journal_damaged`` (exit status
65), the shard goes on with the other replicas, and ``raftcoord
repair-shard`` lets the replica catch up from the leader to the very same
state. A node whose fsync fails (``cluster up --faults``: EIO from a
preloaded shim over the C library) stops at once with ``event=fsync_failed`` (exit status
74): it never acknowledges what it could not make durable, and a leader's
shard moves to another replica within an election.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from partition_log import codec
from raftcoord.client import (
    AbortTransactionSpec,
    Admin,
    Consumer,
    TopicPartition,
    TransactionalProducer,
)
from raftcoord.client.errors import InvalidTxnStateError
from raftcoord.cluster.launcher import ClusterError, LocalCluster
from raftcoord.coordinator import raft_journal
from raftcoord.protocol.data_dir import META_FILE, parse
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.process import EXIT_DATA_DAMAGED, EXIT_STORAGE_FAILED
from tests import plog_client
from tests.local_cluster import commit_offsets, running_cluster

pytestmark = pytest.mark.slow

HEADER = raft_journal.HEADER_SIZE


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "cluster", shards=1, partition_nodes=0) as running:
        yield running


@pytest.fixture
def failing_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "cluster", shards=1, partition_nodes=0, faults=True) as running:
        yield running


def stopped_for_storage(cluster: LocalCluster, node_id: int) -> None:
    wait_for_exit(cluster, node_id)
    log = (cluster.data_dir / f"node-{node_id}.log").read_text()
    assert "event=fsync_failed" in log and f"exit_status={EXIT_STORAGE_FAILED}" in log


def agreed(cluster: LocalCluster, timeout_s: float = 30.0) -> None:
    """Every replica of shard 0 reaches the same applied index and state."""
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = [shard_status(cluster, r.node_id) for r in cluster.coordinators()]
        digests = {s.state_digest for s in statuses}  # type: ignore[attr-defined]
        applied = {s.applied_index for s in statuses}  # type: ignore[attr-defined]
        if len(digests) == 1 and len(applied) == 1:
            return
        assert time.monotonic() < deadline, statuses
        time.sleep(0.1)


def test_a_follower_whose_fsync_fails_stops_before_acknowledging(
    failing_cluster: LocalCluster,
) -> None:
    cluster = failing_cluster
    commit_offsets(cluster, "before")
    agreed(cluster)  # the follower too is up (a majority commits without it)
    leader = cluster.leaders()[0]
    follower = next(r.node_id for r in cluster.coordinators() if r.node_id != leader)
    cluster.fail_disk(follower)
    commit_offsets(cluster, "while-failing")  # the leader and the other follower commit it
    stopped_for_storage(cluster, follower)
    cluster.fail_disk(follower, failing=False)
    cluster.start(follower)
    commit_offsets(cluster, "after")
    agreed(cluster)


def test_a_leader_whose_fsync_fails_stops_and_another_replica_leads(
    failing_cluster: LocalCluster,
) -> None:
    cluster = failing_cluster
    commit_offsets(cluster, "before")
    leader = cluster.leaders()[0]
    cluster.fail_disk(leader)
    started = time.monotonic()
    commit_offsets(cluster, "while-failing")  # its first entry fails the leader; the client retries
    stopped_for_storage(cluster, leader)
    new_leader = cluster.wait_for_leaders(timeout_s=30)[0]
    took = time.monotonic() - started
    print(f"leader {leader} stopped; {new_leader} leads; the commit took {took:.2f} s")
    assert new_leader != leader
    assert took < 10.0
    cluster.fail_disk(leader, failing=False)
    cluster.start(leader)
    commit_offsets(cluster, "after")
    agreed(cluster)


def shard_status(cluster: LocalCluster, node_id: int) -> object:
    status = cluster.node_status(node_id, timeout_s=5.0)
    assert status is not None, f"coordinator {node_id} does not answer"
    return status.shards[0]


def record_starts(journal: Path) -> list[int]:
    """The offsets of the journal's records, as its reader finds them."""
    data = journal.read_bytes()[HEADER:]
    starts, pos = [], 0
    while (found := raft_journal._record_at(data, pos)) is not None:
        starts.append(HEADER + pos)
        pos = found[0]
    return starts


def wait_for_exit(cluster: LocalCluster, node_id: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while cluster.alive(node_id):
        assert time.monotonic() < deadline, f"node {node_id} kept running"
        time.sleep(0.05)


def test_a_flipped_bit_in_a_follower_journal_stops_it_and_repair_rejoins_it(
    cluster: LocalCluster,
) -> None:
    for i in range(5):
        commit_offsets(cluster, f"before-{i}")
    leader = cluster.leaders()[0]
    follower = next(r.node_id for r in cluster.coordinators() if r.node_id != leader)
    cluster.kill(follower, "TERM")
    journal = cluster.data_dir / f"node-{follower}" / "shard-0" / "journal"
    starts = record_starts(journal)
    assert len(starts) > 4
    middle = starts[len(starts) // 2]
    with journal.open("r+b") as f:  # one bit of one record's command
        f.seek(middle + 20)
        byte = f.read(1)[0]
        f.seek(middle + 20)
        f.write(bytes([byte ^ 0x04]))

    with pytest.raises(ClusterError):
        cluster.start(follower, timeout_s=5.0)
    wait_for_exit(cluster, follower)
    log = (cluster.data_dir / f"node-{follower}.log").read_text()
    assert "event=journal_damaged" in log and f"exit_status={EXIT_DATA_DAMAGED}" in log
    assert "damaged, not torn" in log
    commit_offsets(cluster, "while-refused")  # the other two replicas serve

    config = cluster.data_dir / "cluster.toml"
    base = [sys.executable, "-m", "raftcoord.cli", "repair-shard", "--config", str(config)]
    args = [*base, "--id", str(follower), "--shard", "0"]
    refused = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    meta = cluster.data_dir / f"node-{follower}" / META_FILE
    before = parse(meta.read_text()).directory_id
    repaired = subprocess.run([*args, "--yes"], capture_output=True, text=True, timeout=60)
    assert repaired.returncode == 0, repaired.stderr
    assert "journal.damaged-" in repaired.stdout
    renewed = parse(meta.read_text()).directory_id
    assert renewed != before  # a learner until it has caught up

    seen = len(log_path(cluster, follower).read_text())
    cluster.start(follower)
    commit_offsets(cluster, "after-repair")
    agreed(cluster)
    deadline = time.monotonic() + 30
    while "voter=True" not in log_path(cluster, follower).read_text()[seen:]:
        assert time.monotonic() < deadline, "the repaired replica was not recorded again"
        time.sleep(0.1)


def _damage(shard_dir: Path, damage: str) -> str:
    """Damage a stopped replica's shard directory; the phrase of its refusal."""
    journal = shard_dir / "journal"
    if damage == "meta-deleted":
        (shard_dir / "journal.meta").unlink()
        return "missing beside its journal"
    if damage == "last-record":
        offset = record_starts(journal)[-1] + 20  # one bit of its command
        phrase = "the last record"
    else:  # the header's last-record offset (which ends the log)
        offset = HEADER - 8
        phrase = "header fails its checksum"
    with journal.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x04]))
    return phrase


def test_a_damaged_journal_end_or_a_lost_vote_stops_the_node_under_fsync_always(
    cluster: LocalCluster,
) -> None:
    """Under fsync=always a follower's last record, or its header's end of
    the log, with a flipped bit, or its term/vote file deleted: the node
    exits with status 65 and says why, instead of dropping acknowledged
    entries as a torn tail (or voting again in a term); put back, the same
    files start and agree with the others."""
    for i in range(5):
        commit_offsets(cluster, f"before-{i}")
    leader = cluster.leaders()[0]
    follower = next(r.node_id for r in cluster.coordinators() if r.node_id != leader)
    shard_dir = cluster.data_dir / f"node-{follower}" / "shard-0"
    log_path = cluster.data_dir / f"node-{follower}.log"
    for damage in ("last-record", "header-offset", "meta-deleted"):
        cluster.kill(follower, "TERM")
        kept = {p.name: p.read_bytes() for p in shard_dir.iterdir() if p.is_file()}
        seen = len(log_path.read_text())
        phrase = _damage(shard_dir, damage)
        with pytest.raises(ClusterError):
            cluster.start(follower, timeout_s=5.0)
        wait_for_exit(cluster, follower)
        log = log_path.read_text()[seen:]
        assert "event=journal_damaged" in log, (damage, log[-2000:])
        assert f"exit_status={EXIT_DATA_DAMAGED}" in log and phrase in log, (damage, log[-2000:])
        assert "torn journal tail" not in log
        commit_offsets(cluster, f"while-{damage}")  # the other two replicas serve
        for name, data in kept.items():
            (shard_dir / name).write_bytes(data)
        cluster.start(follower)
        commit_offsets(cluster, f"after-{damage}")
        agreed(cluster)


def log_path(cluster: LocalCluster, node_id: int) -> Path:
    return cluster.data_dir / f"node-{node_id}.log"


def read_committed(cluster: LocalCluster, tp: TopicPartition) -> list[bytes]:
    values: list[bytes] = []
    with Consumer(cluster.bootstrap(), isolation_level="read_committed") as consumer:
        consumer.assign([tp])
        while batch := consumer.poll(timeout_ms=500):
            values.extend(r.value for r in batch if r.value is not None)
    return values


def test_a_partition_node_whose_fsync_fails_stops_and_recovers_its_log(
    tmp_path: Path,
) -> None:
    """Every partition-log node's fsync fails while a transaction writes: each
    stops (never acknowledging the append it could not make durable); healed
    and restarted, each serves the committed data it had, the interrupted
    transaction's outcome is what its producer was told (its retries may
    commit it once the nodes are back), and the next transaction commits."""
    with running_cluster(tmp_path / "cluster", shards=1, faults=True) as cluster:
        tp = TopicPartition("durable", 0)
        with Admin(cluster.bootstrap()) as admin:
            admin.create_topics({"durable": 3})
        with TransactionalProducer(cluster.bootstrap(), "writer") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            for i in range(3):
                producer.send("durable", f"kept-{i}".encode(), partition=0)
            producer.commit_transaction()
        assert read_committed(cluster, tp) == [b"kept-0", b"kept-1", b"kept-2"]

        nodes = [r.node_id for r in cluster.partition_nodes()]
        for node_id in nodes:
            cluster.fail_disk(node_id)

        outcome: list[str] = []

        def interrupted() -> None:
            try:
                with TransactionalProducer(
                    cluster.bootstrap(), "doomed", request_timeout_ms=5_000
                ) as producer:
                    producer.init_transactions()
                    producer.begin_transaction()
                    for p in range(3):
                        producer.send("durable", b"interrupted", partition=p)
                    producer.commit_transaction()
                    outcome.append("committed")
            except Exception as exc:
                outcome.append(f"failed: {exc!r}")

        writer = threading.Thread(target=interrupted, daemon=True)
        writer.start()
        for node_id in nodes:
            wait_for_exit(cluster, node_id)
            log = (cluster.data_dir / f"partition-node-{node_id}.log").read_text()
            assert "event=fsync_failed" in log and f"exit_status={EXIT_STORAGE_FAILED}" in log
        for node_id in nodes:
            cluster.fail_disk(node_id, failing=False)
            cluster.start(node_id)
        writer.join(timeout=90)
        assert outcome, "the interrupted transaction's producer never returned"
        with TransactionalProducer(cluster.bootstrap(), "writer") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("durable", b"after", partition=0)
            producer.commit_transaction()
        values = read_committed(cluster, tp)
        assert values[:3] == [b"kept-0", b"kept-1", b"kept-2"] and values[-1] == b"after"
        expected = 1 if outcome == ["committed"] else 0
        assert values.count(b"interrupted") == expected, (outcome, values)


def test_an_owed_commit_marker_reaches_a_restarted_partition_node_at_once(
    tmp_path: Path,
) -> None:
    """The partition-log nodes die after a transaction's appends and before
    its commit; the commit is acknowledged (its markers are owed), and an
    operator's `txn abort` of it is refused (it would lose committed data);
    once the nodes answer again the markers arrive within about a second
    (the channels' reconnect back-off is capped at 1 s, not gRPC's 2
    minutes)."""
    with running_cluster(tmp_path / "cluster", shards=1) as cluster:
        tp = TopicPartition("owed", 0)
        with Admin(cluster.bootstrap()) as admin:
            admin.create_topics({"owed": 1})
        nodes = [r.node_id for r in cluster.partition_nodes()]
        with TransactionalProducer(cluster.bootstrap(), "owing") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("owed", b"owed-value", partition=0)
            producer.flush()
            for node_id in nodes:
                cluster.kill(node_id, "KILL")
            time.sleep(3.0)  # the marker writer's channels back off while the nodes are away
            producer.commit_transaction()
            pid, epoch = producer.producer_id, producer.producer_epoch - 1  # the data's epoch
        with (
            Admin(cluster.bootstrap()) as admin,
            pytest.raises(InvalidTxnStateError, match="committed this transaction"),
        ):
            admin.abort_transaction(AbortTransactionSpec(tp, pid, epoch, 0), timeout_ms=5_000)
        for node_id in nodes:
            cluster.start(node_id)
        answered = time.monotonic()
        while b"owed-value" not in read_committed(cluster, tp):
            assert time.monotonic() - answered < 10.0, "the owed COMMIT marker never arrived"
        took = time.monotonic() - answered
        print(f"the owed COMMIT was readable {took:.2f} s after the nodes answered")
        assert took < 4.0


def test_a_flipped_byte_in_a_segment_is_reported_and_its_offsets_never_reused(
    tmp_path: Path,
) -> None:
    """Four acknowledged batches (fsync always) on partition 0; one byte of
    the second flipped while its node is down. Restarted, the node refuses
    that partition (KAFKA_STORAGE_ERROR, a CRITICAL line) instead of cutting
    three acknowledged batches and handing their offsets out again; its
    other partition serves."""
    with running_cluster(tmp_path / "cluster", shards=1, partition_nodes=1) as cluster:
        owners = plog_client.create_topic(cluster, "flipped", 2)
        node = plog_client.stub(owners[0])
        for i in range(4):
            answer = plog_client.produce(node, "flipped", 0, [f"v{i}".encode()])
            assert answer.error_code == 0, answer
        plog_client.produce(node, "flipped", 1, [b"other"])
        (node_id,) = [r.node_id for r in cluster.partition_nodes()]
        cluster.kill(node_id, "TERM")
        segment = next((cluster.data_dir / f"partition-node-{node_id}" / "flipped-0").glob("*.log"))
        data = bytearray(segment.read_bytes())
        assert len(data) > 100
        data[len(data) // 4 + 30] ^= 0x08
        segment.write_bytes(bytes(data))
        size = len(data)
        cluster.start(node_id)

        node = plog_client.stub(owners[0])
        answer = plog_client.produce(node, "flipped", 0, [b"new"])
        assert answer.error_code == ErrorCode.KAFKA_STORAGE_ERROR, answer
        assert "damaged" in answer.error_message
        assert segment.stat().st_size == size  # nothing cut, nothing appended
        seen, _ = plog_client.read_all(node, "flipped", 1, committed=False)
        assert [v for _, v in seen] == [b"other"]
        log = (cluster.data_dir / f"partition-node-{node_id}.log").read_text()
        assert "event=partition_damaged partition=flipped-0" in log


def test_an_emptied_data_directory_is_refused_until_accepted_and_reuses_no_offset(
    tmp_path: Path,
) -> None:
    """A partition-log node restarted on an empty data directory (a replaced
    disk) serves none of its partitions (KAFKA_STORAGE_ERROR, CRITICAL
    ``directory_replaced``, ``cluster status`` says so) until
    ``raftcoord accept-directory``; then its partition continues above every
    offset handed out before instead of at 0."""
    with running_cluster(tmp_path / "cluster", shards=1, partition_nodes=1) as cluster:
        owners = plog_client.create_topic(cluster, "replaced", 1)
        node = plog_client.stub(owners[0])
        for i in range(3):
            answer = plog_client.produce(node, "replaced", 0, [f"v{i}".encode()])
            assert (answer.error_code, answer.base_offset) == (0, i), answer
        (node_id,) = [r.node_id for r in cluster.partition_nodes()]
        data_dir = cluster.data_dir / f"partition-node-{node_id}"
        cluster.kill(node_id, "TERM")
        shutil.rmtree(data_dir)
        cluster.start(node_id)

        node = plog_client.stub(owners[0])
        answer = plog_client.produce(node, "replaced", 0, [b"too-early"])
        assert answer.error_code == ErrorCode.KAFKA_STORAGE_ERROR, answer
        assert "accept-directory" in answer.error_message
        offsets = plog_client.list_offsets(node, "replaced", 0, 0)
        assert offsets.error_code == ErrorCode.KAFKA_STORAGE_ERROR
        assert "REFUSING ALL" in cluster.status_table()
        log = (cluster.data_dir / f"partition-node-{node_id}.log").read_text()
        assert "event=directory_replaced" in log

        accept = [sys.executable, "-m", "raftcoord.cli", "accept-directory"]
        accept += ["--config", str(cluster.data_dir / "cluster.toml"), "--id", str(node_id)]
        refused = subprocess.run(accept, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "--yes" in refused.stderr  # asks first
        done = subprocess.run([*accept, "--yes"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr

        def produced() -> Any:
            answer = plog_client.produce(node, "replaced", 0, [b"after"])
            return answer if answer.error_code == 0 else None

        cluster.wait_until(lambda: produced() is not None, 15, "the node never served again")
        answer = produced()
        assert answer.base_offset >= 3  # not 0, 1 or 2 again
        start = plog_client.list_offset(node, "replaced", 0, 0)  # earliest
        seen, _ = plog_client.read_all(node, "replaced", 0, committed=False, start=start)
        assert [offset for offset, _ in seen] == [start, start + 1]
        assert start >= 3
        log = (cluster.data_dir / f"partition-node-{node_id}.log").read_text()
        assert "event=offsets_skipped partition=replaced-0 from=0" in log
        assert "REFUSING" not in cluster.status_table()


def test_an_unflushed_log_that_lost_its_tail_continues_above_every_offset_handed_out(
    tmp_path: Path,
) -> None:
    """Under ``log.flush.policy = never`` a machine crash can lose acknowledged
    batches: the node then continues above every offset it reserved instead
    of handing the lost offsets out again; a clean stop loses nothing and
    skips nothing."""
    with running_cluster(
        tmp_path / "cluster", shards=1, partition_nodes=1, log_flush="never"
    ) as cluster:
        owners = plog_client.create_topic(cluster, "unflushed", 1)
        (node_id,) = [r.node_id for r in cluster.partition_nodes()]
        node = plog_client.stub(owners[0])
        for i in range(2):
            assert plog_client.produce(node, "unflushed", 0, [f"a{i}".encode()]).base_offset == i
        cluster.kill(node_id, "TERM")  # clean: flushed and marked
        cluster.start(node_id)
        node = plog_client.stub(owners[0])
        for i in range(2, 4):
            assert plog_client.produce(node, "unflushed", 0, [f"a{i}".encode()]).base_offset == i
        cluster.kill(node_id, "KILL")
        # The page cache died with the machine: the last two batches never
        # reached the disk.
        segment = next(
            (cluster.data_dir / f"partition-node-{node_id}" / "unflushed-0").glob("*.log")
        )
        data = segment.read_bytes()
        segment.write_bytes(data[: len(data) // 2])
        cluster.start(node_id)
        node = plog_client.stub(owners[0])
        answer = plog_client.produce(node, "unflushed", 0, [b"after"])
        assert answer.error_code == 0, answer
        assert answer.base_offset >= 4  # not 2 or 3 again
        seen, _ = plog_client.read_all(node, "unflushed", 0, committed=False)
        assert [value for _, value in seen] == [b"a0", b"a1", b"after"]
        log = (cluster.data_dir / f"partition-node-{node_id}.log").read_text()
        assert "event=offsets_skipped partition=unflushed-0 from=2" in log


def test_a_commit_marker_lost_with_an_unflushed_tail_is_written_again(tmp_path: Path) -> None:
    """Under ``log.flush.policy = never`` a machine crash took a partition's
    COMMIT marker after the coordinator completed the transaction (so it
    never sends it again). Restarted, the node asks the coordinators about
    its open transactions and writes the marker again: the committed record
    becomes visible to read_committed instead of holding the partition's
    last stable offset forever."""
    with running_cluster(
        tmp_path / "cluster", shards=1, partition_nodes=1, log_flush="never"
    ) as cluster:
        owners = plog_client.create_topic(cluster, "owed", 1)
        (node_id,) = [r.node_id for r in cluster.partition_nodes()]
        with TransactionalProducer(cluster.bootstrap(), "owed-txn") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("owed", b"committed", partition=0)
            producer.commit_transaction()
        with Admin(cluster.bootstrap()) as admin:
            cluster.wait_until(
                lambda: (
                    admin.describe_transactions(["owed-txn"])["owed-txn"].state == "CompleteCommit"
                ),
                15,
                "the transaction did not complete",
            )
        cluster.kill(node_id, "KILL")
        # The machine died before the page cache held the marker on disk.
        segment = next((cluster.data_dir / f"partition-node-{node_id}" / "owed-0").glob("*.log"))
        data = segment.read_bytes()
        position = last = 0
        while position < len(data):
            last = position
            position += codec.parse_header(data, position).size
        assert codec.parse_header(data, last).is_control
        segment.write_bytes(data[:last])
        cluster.start(node_id)

        node = plog_client.stub(owners[0])
        deadline = time.monotonic() + 15
        while not plog_client.read_all(node, "owed", 0, committed=True)[0]:
            assert time.monotonic() < deadline, "the lost COMMIT marker was never written again"
            time.sleep(0.2)
        seen, _ = plog_client.read_all(node, "owed", 0, committed=True)
        assert [value for _, value in seen] == [b"committed"]
        log = (cluster.data_dir / f"partition-node-{node_id}.log").read_text()
        assert "event=owed_marker partition=owed-0" in log and "result=COMMIT" in log
