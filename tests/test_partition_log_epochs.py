"""Leader-epoch history (KIP-101) and log truncation: the pure history, its
checkpoint file, and the store keeping both in step with its segments."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fsm.errors import ErrorCode
from partition_log import codec, epochs
from partition_log.cluster_view import Followed
from partition_log.codec import RecordData, encode_batch, parse_header, set_partition_leader_epoch
from partition_log.epochs import UNDEFINED, EpochEnd, EpochEntry, LeaderEpochs
from partition_log.log import FsyncPolicy, PartitionLogStore
from partition_log.partition import BatchSpec, Partition
from partition_log.replica_fetcher import GrpcLink, LeaderFetcher
from raftcoord.protocol.v1 import partition_log_pb2
from tests.reserved import reserved

CHECKPOINT = "leader-epoch-checkpoint"


def batch_at(epoch: int, label: str, n: int = 1, pad: int = 200) -> bytearray:
    records = [RecordData(None, f"{label}:{i}".encode() + b"x" * pad, (), 1_000) for i in range(n)]
    batch = encode_batch(
        records, producer_id=-1, producer_epoch=-1, base_sequence=-1, transactional=False
    )
    set_partition_leader_epoch(batch, epoch)
    return batch


def history_of(store: PartitionLogStore) -> list[EpochEntry]:
    """The history the log's batches imply."""
    derived = LeaderEpochs()
    for header, _ in store.batches():
        derived.assign(header.partition_leader_epoch, header.base_offset)
    return derived.entries


# -- the history ---------------------------------------------------------------------------------


def test_end_offsets_answer_as_kafkas_leader_epoch_cache() -> None:
    history = LeaderEpochs([EpochEntry(1, 0), EpochEntry(3, 10), EpochEntry(6, 25)])
    assert history.end_offset_for(6, 40) == EpochEnd(6, 40)  # the latest: the log end
    assert history.end_offset_for(3, 40) == EpochEnd(3, 25)
    assert history.end_offset_for(4, 40) == EpochEnd(3, 25)  # never led: the one below
    assert history.end_offset_for(1, 40) == EpochEnd(1, 10)
    assert history.end_offset_for(0, 40) == UNDEFINED  # older than the log
    assert history.end_offset_for(7, 40) == UNDEFINED  # newer than the log
    assert LeaderEpochs().end_offset_for(0, 0) == UNDEFINED
    assert history.epoch_at(9) == 1 and history.epoch_at(10) == 3 and history.epoch_at(99) == 6


def test_assign_keeps_only_new_epochs_and_cuts_what_a_new_start_overlaps() -> None:
    history = LeaderEpochs()
    assert not history.assign(-1, 0)  # a batch without a leader epoch
    assert history.assign(2, 0)
    assert not history.assign(2, 5) and not history.assign(1, 7)
    assert history.assign(4, 5)
    assert history.assign(5, 5)  # epoch 4 appended nothing
    assert history.entries == [EpochEntry(2, 0), EpochEntry(5, 5)]
    assert history.assign(7, 3)  # a start below an entry's: that entry is gone
    assert history.entries == [EpochEntry(2, 0), EpochEntry(7, 3)]


def test_truncation_from_either_end() -> None:
    history = LeaderEpochs([EpochEntry(1, 0), EpochEntry(3, 10), EpochEntry(6, 25)])
    assert not history.truncate_from_end(26)
    assert history.truncate_from_end(25)
    assert history.entries == [EpochEntry(1, 0), EpochEntry(3, 10)]
    assert history.truncate_from_start(12)
    assert history.entries == [EpochEntry(3, 12)]
    assert not history.truncate_from_start(12) and not history.truncate_from_start(5)


def test_the_checkpoint_round_trips_and_refuses_damage() -> None:
    history = LeaderEpochs([EpochEntry(0, 0), EpochEntry(4, 100)])
    data = epochs.encode(history)
    assert epochs.decode(data).entries == history.entries
    flipped = bytearray(data)
    flipped[3] ^= 0x01
    for bad in (bytes(flipped), data[:-1], b"", b"\x00" * 3):
        with pytest.raises(epochs.CheckpointError):
            epochs.decode(bad)
    out_of_order = LeaderEpochs()
    out_of_order.entries = [EpochEntry(4, 100), EpochEntry(2, 200)]
    with pytest.raises(epochs.CheckpointError, match="out of order"):
        epochs.decode(epochs.encode(out_of_order))


# -- the store -----------------------------------------------------------------------------------


def test_the_checkpoint_follows_appends_and_restarts(tmp_path: Path) -> None:
    with PartitionLogStore(tmp_path, segment_bytes=1024) as store:
        for i, epoch in enumerate((0, 0, 2, 2, 2, 5)):
            store.append(batch_at(epoch, f"b{i}"))
        assert store.epochs.entries == [EpochEntry(0, 0), EpochEntry(2, 2), EpochEntry(5, 5)]
        assert epochs.decode((tmp_path / CHECKPOINT).read_bytes()).entries == store.epochs.entries
    with PartitionLogStore(tmp_path, segment_bytes=1024) as store:
        assert store.epochs.entries == [EpochEntry(0, 0), EpochEntry(2, 2), EpochEntry(5, 5)]
        assert store.latest_leader_epoch == 5


@pytest.mark.parametrize("damage", ["missing", "flipped", "stale"])
def test_a_lost_or_damaged_checkpoint_is_rebuilt_from_the_log(tmp_path: Path, damage: str) -> None:
    with PartitionLogStore(tmp_path, segment_bytes=1024) as store:
        for i, epoch in enumerate((1, 1, 3, 3, 4, 8, 8)):
            store.append(batch_at(epoch, f"b{i}"))
        expected = store.epochs.entries
    path = tmp_path / CHECKPOINT
    if damage == "missing":
        path.unlink()
    elif damage == "flipped":
        data = bytearray(path.read_bytes())
        data[5] ^= 0x40
        path.write_bytes(bytes(data))
    else:  # names epochs past the log: a torn append after its checkpoint
        path.write_bytes(epochs.encode(LeaderEpochs([*expected, EpochEntry(9, 7)])))
    with PartitionLogStore(tmp_path, segment_bytes=1024) as store:
        assert store.epochs.entries == expected == history_of(store)
    assert epochs.decode(path.read_bytes()).entries == expected


def test_truncation_cuts_segments_index_snapshots_and_epochs(tmp_path: Path) -> None:
    with PartitionLogStore(tmp_path, segment_bytes=1024, index_interval_bytes=0) as store:
        for i, epoch in enumerate((1, 1, 1, 2, 2, 3, 3, 3)):
            store.append(batch_at(epoch, f"b{i}", n=2))  # two records: offsets 2i, 2i+1
        store.write_snapshot(6, b"state at 6")
        store.write_snapshot(12, b"state at 12")
        assert len(store.segment_base_offsets) > 2
        with pytest.raises(ValueError, match="inside the batch"):
            store.truncate_to(7)
        with pytest.raises(ValueError, match="outside"):
            store.truncate_to(17)
        store.truncate_to(8)
        assert store.log_end_offset == 8
        assert store.epochs.entries == [EpochEntry(1, 0), EpochEntry(2, 6)]
        assert store.snapshot_offsets() == [6]
        assert [h.base_offset for h, _ in store.batches()] == [0, 2, 4, 6]
        assert store.append(batch_at(4, "after", n=2)) == 8  # the cut segment is the active one
        assert store.epochs.entries[-1] == EpochEntry(4, 8)
    with PartitionLogStore(tmp_path, segment_bytes=1024, index_interval_bytes=0) as store:
        assert store.recovered.bytes_truncated == 0 and store.recovered.indexes_rebuilt == 0
        assert store.log_end_offset == 10
        assert store.epochs.entries == history_of(store)
        assert [parse_header(b).base_offset for b in store.read(0, 1 << 20, 10)] == [0, 2, 4, 6, 8]
        store.truncate_to(0)
        assert store.log_end_offset == 0 and store.epochs.entries == []
        assert store.segment_base_offsets == (0,)


def test_truncation_drops_gaps_past_the_cut(tmp_path: Path) -> None:
    with PartitionLogStore(tmp_path) as store:
        store.append(batch_at(1, "a"))
        store.skip_to(100)
        store.append(batch_at(1, "b"))
        store.truncate_to(50)  # inside the gap: the log ends where the gap starts
        assert store.log_end_offset == 1 and store.segment_base_offsets == (0,)
        store.append(batch_at(2, "c"))
    with PartitionLogStore(tmp_path) as store:
        assert store.log_end_offset == 2
        assert store.epochs.entries == [EpochEntry(1, 0), EpochEntry(2, 1)]


def test_truncations_appends_and_restarts_keep_the_history_true(tmp_path: Path) -> None:
    """Random appends at growing epochs, cuts at batch boundaries and reopens:
    the history always equals the one the remaining batches imply."""
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    rng = random.Random(seed)
    store = PartitionLogStore(tmp_path, segment_bytes=900, fsync=FsyncPolicy.NEVER)
    epoch = 0
    try:
        for step in range(120):
            action = rng.random()
            if action < 0.6:
                epoch += rng.random() < 0.3
                store.append(batch_at(epoch, f"s{step}", n=rng.randint(1, 3)))
            elif action < 0.8:
                bounds = [h.base_offset for h, _ in store.batches()] + [store.log_end_offset]
                store.truncate_to(rng.choice(bounds))
            else:
                store.close()
                store = PartitionLogStore(tmp_path, segment_bytes=900, fsync=FsyncPolicy.NEVER)
            assert store.epochs.entries == history_of(store), f"seed={seed} step={step}"
    finally:
        store.close()


# -- a follower's partition ----------------------------------------------------------------------


def open_partition(path: Path) -> Partition:
    return reserved(
        Partition(
            "t", 0, path, segment_bytes=2048, index_interval_bytes=256, fsync=FsyncPolicy.NEVER
        )
    )


def send(part: Partition, pid: int, seq: int, value: bytes, txn: bool) -> int:
    batch = codec.encode_batch(
        [codec.RecordData(None, value, (), 1)],
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
        transactional=txn,
    )
    check = part.append(BatchSpec(pid, 0, seq, 1, txn), batch, verified=True)
    assert check.ok, check
    return check.base_offset


def replicate(leader: Partition, follower: Partition) -> None:
    """Copy what the follower lacks and the leader's high watermark, as a
    follower's fetch would."""
    end = follower.store.log_end_offset
    follower.append_replicated(leader.store.read(end, 1 << 20, leader.store.log_end_offset))
    follower.set_follower_high_watermark(leader.high_watermark)


def state_of(part: Partition) -> tuple[object, ...]:
    return (
        part.offsets(),
        part.states.aborted,
        {
            pid: (p.epoch, list(p.batches), p.txn_first_offset, p.last_offset)
            for pid, p in part.states.producers.items()
        },
        part.store.epochs.entries,
    )


def test_a_follower_rebuilds_the_transaction_state_from_the_batches(tmp_path: Path) -> None:
    leader = open_partition(tmp_path / "leader")
    follower = open_partition(tmp_path / "follower")
    try:
        leader.lead(3)
        send(leader, 1, 0, b"commit-me", txn=True)
        send(leader, 2, 0, b"abort-me", txn=True)
        replicate(leader, follower)
        leader.lead(4)
        assert leader.write_marker(2, 0, 0, False, 0, transaction_version=1) == (ErrorCode.NONE, "")
        send(leader, 3, 0, b"open", txn=True)
        assert leader.write_marker(1, 0, 0, True, 0, transaction_version=1) == (ErrorCode.NONE, "")
        replicate(leader, follower)
        assert state_of(follower) == state_of(leader)
        assert follower.offsets() == (0, 3, 5)  # producer 3 still open at offset 3
        assert follower.leader_epoch == 4
        # A new leader deduplicates at once: the retried batch gets its old offset.
        retried = follower.check(BatchSpec(3, 0, 0, 1, True))
        assert retried.base_offset == 3
        with pytest.raises(ValueError, match="below the log end"):
            follower.append_replicated(leader.store.read(0, 1 << 20, 5))
        damaged = bytearray(leader.store.read(4, 1 << 20, 5)[0])
        damaged[-1] ^= 0xFF
        with pytest.raises(ValueError, match="CRC"):
            follower.append_replicated([bytes(damaged)])
    finally:
        leader.close()
        follower.close()


def test_a_follower_cut_back_forgets_the_state_past_the_cut(tmp_path: Path) -> None:
    part = open_partition(tmp_path / "p")
    try:
        part.lead(1)
        send(part, 1, 0, b"a", txn=True)
        part.write_marker(1, 0, 0, True, 0, transaction_version=1)  # offset 1, rolls no segment
        part.lead(2)
        send(part, 2, 0, b"b", txn=True)  # offset 2: unacknowledged, the leader died
        send(part, 4, 0, b"c", txn=False)  # offset 3
        assert part.epoch_end(1) == EpochEnd(1, 2)
        assert part.epoch_end(2) == EpochEnd(2, 4)
        part.truncate_to(2)
        assert part.offsets() == (0, 2, 2)
        assert 2 not in part.states.producers and 4 not in part.states.producers
        assert part.states.producers[1].last_offset == 1  # its marker
        assert part.store.epochs.entries == [EpochEntry(1, 0)]
    finally:
        part.close()


# -- a leader's high watermark and in-sync replicas ---------------------------------------------


def test_the_high_watermark_is_the_in_sync_replicas_lowest_log_end(tmp_path: Path) -> None:
    leader = open_partition(tmp_path / "leader")
    try:
        leader.lead(1, frozenset({2, 3}), 2, frozenset({2, 3}))
        send(leader, -1, -1, b"a", txn=False)
        send(leader, -1, -1, b"b", txn=False)
        assert leader.offsets() == (0, 0, 0)  # nobody has fetched yet
        assert leader.fetch(0, 1 << 20, False).batches == []  # not above the high watermark
        assert leader.wait_replicated(2, 0.01)[0] is ErrorCode.REQUEST_TIMED_OUT
        assert leader.replica_read(2, 2, 1, 1 << 20).records == b""
        assert leader.high_watermark == 0  # replica 3 still lacks them
        assert leader.replica_read(3, 1, 1, 1 << 20).records  # offset 1 on
        assert leader.high_watermark == 1
        leader.replica_read(3, 2, 1, 1 << 20)
        assert leader.wait_replicated(2, 1.0) == (ErrorCode.NONE, "")
        assert [r.value for b in leader.fetch(0, 1 << 20, False).batches for r in b.records] == [
            b"a",
            b"b",
        ]
        # A follower whose log goes past the leader's end: it cuts at the end.
        assert leader.replica_read(2, 5, 1, 1 << 20).diverging == EpochEnd(1, 2)
        assert leader.replica_read(2, 2, 0, 1 << 20).diverging == EpochEnd(-1, -1)
        # Fewer in-sync replicas than min.insync.replicas: writes are refused.
        leader.lead(1, frozenset(), 2, frozenset({2, 3}))
        problem = leader.replication_problem()
        assert problem is not None and problem[0] is ErrorCode.NOT_ENOUGH_REPLICAS
        send(leader, -1, -1, b"c", txn=False)
        assert leader.wait_replicated(3, 1.0)[0] is ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        leader.follow(2)
        assert leader.wait_replicated(4, 1.0)[0] is ErrorCode.NOT_LEADER_OR_FOLLOWER
    finally:
        leader.close()


def test_a_replica_never_follows_a_leader_of_an_older_epoch(tmp_path: Path) -> None:
    """A placement naming a leader at an older epoch than this replica knows
    is stale: the replica keeps leading, and its fetcher does not ask that
    leader (whose answer could cut back what was appended at the newer
    epoch)."""
    part = open_partition(tmp_path / "p")
    try:
        part.lead(2, frozenset(), 1, frozenset())
        send(part, -1, -1, b"a", txn=False)
        assert not part.follow(1)
        assert part.leading and part.leader_epoch == 2
        asked: list[Any] = []

        class Stub:
            def ReplicaFetch(self, request: Any, timeout: float) -> Any:
                asked.append(request)
                raise AssertionError("a stale leader was asked")

        fetcher = LeaderFetcher(
            1,
            2,
            None,
            GrpcLink(lambda: Stub()),
            lambda f: part,
            threading.Event(),  # type: ignore[arg-type]
        )
        assert fetcher.fetch_once([Followed("t", 0, 1, 1)]) is False
        assert asked == [] and part.leading
        # A newer leader is followed; the same epoch again changes nothing.
        assert part.follow(3) and not part.leading and part.leader_epoch == 3
        assert part.follow(3) and not part.follow(2)
    finally:
        part.close()


def test_a_stale_placement_never_makes_a_second_leader_of_an_epoch(tmp_path: Path) -> None:
    """A request that looked its placement up (this node leads at epoch 1)
    before a refresh moved the leadership (another node at epoch 2) must not
    lead the replica again: it would append batches stamped with the new
    leader's epoch, which no divergence check tells apart from that leader's
    (a demo run showed two replicas with different first batches of epoch
    2). Nor may a replica that stopped leading append."""
    part = open_partition(tmp_path / "p")
    try:
        assert part.lead(1)
        send(part, -1, -1, b"as-leader", txn=False)
        # The refresh came first: the stale placement is refused.
        assert part.follow(2)
        assert not part.lead(1) and not part.lead(2)
        assert not part.leading and part.leader_epoch == 2
        # The lookup came first: the append after the refresh is refused.
        batch = codec.encode_batch(
            [codec.RecordData(None, b"late", (), 1)],
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            transactional=False,
        )
        refused = part.append(BatchSpec(-1, -1, -1, 1, False), batch, verified=True)
        assert refused.error is ErrorCode.NOT_LEADER_OR_FOLLOWER, refused
        assert part.write_marker(7, 0, 0, True, 0)[0] is ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert part.log_end() == 1 and part.store.epochs.entries == [EpochEntry(1, 0)]
        # A placement of a newer epoch leads it again.
        assert part.lead(3)
        assert send(part, -1, -1, b"new-leader", txn=False) == 1
    finally:
        part.close()
    # Restarted, a replica leads again at the epoch of its last batch.
    again = open_partition(tmp_path / "p")
    try:
        assert again.leader_epoch == 3 and again.lead(3)
    finally:
        again.close()


def test_a_fetch_answered_after_the_replica_changed_is_dropped(tmp_path: Path) -> None:
    """Fetchers of two leader nodes may fetch one partition at once while the
    placement moves: an answer for a log end the replica no longer has (the
    other fetcher appended or cut meanwhile) is dropped, never appended
    past a gap or over another leader's batches."""
    leader = open_partition(tmp_path / "leader")
    follower = open_partition(tmp_path / "follower")
    try:
        assert leader.lead(1)
        for value in (b"a", b"b", b"c"):
            send(leader, -1, -1, value, txn=False)
        assert follower.follow(1)
        replicate(leader, follower)  # offsets 0..2
        send(leader, -1, -1, b"d", txn=False)

        class Stub:
            def ReplicaFetch(self, request: Any, timeout: float) -> Any:
                # Meanwhile another fetcher cut the replica back to offset 1.
                follower.truncate_to(1)
                entry = request.partitions[0]
                read = leader.replica_read(2, entry.fetch_offset, entry.last_fetched_epoch, 1 << 20)
                answer = partition_log_pb2.ReplicaFetchResponse()
                answer.partitions.add(
                    topic="t",
                    partition=0,
                    high_watermark=read.high_watermark,
                    log_start_offset=read.log_start_offset,
                    records=read.records,
                )
                return answer

        fetcher = LeaderFetcher(
            1,
            2,
            None,  # type: ignore[arg-type]
            GrpcLink(lambda: Stub()),
            lambda f: follower,
            threading.Event(),
        )
        assert fetcher.fetch_once([Followed("t", 0, 1, 1)])
        assert follower.log_end() == 1  # not 4 over a gap at 1..2
        assert [h.base_offset for h, _ in follower.store.batches()] == [0]
    finally:
        leader.close()
        follower.close()


def test_followers_leave_the_isr_when_they_lag_and_join_when_they_catch_up(
    tmp_path: Path,
) -> None:
    leader = open_partition(tmp_path / "leader")
    try:
        leader.lead(1, frozenset({2, 3}), 1, frozenset({2, 3}))
        start = time.monotonic()
        for i in range(3):
            send(leader, -1, -1, f"v{i}".encode(), txn=False)
        leader.replica_read(2, 3, 1, 1 << 20)  # replica 2 has everything, 3 fetched nothing
        assert leader.wanted_in_sync(start, 10.0) is None
        assert leader.wanted_in_sync(start + 20.0, 10.0) == frozenset()  # both lag 10 s later
        leader.replica_read(2, 3, 1, 1 << 20)
        assert leader.wanted_in_sync(time.monotonic() + 5.0, 10.0) is None
        leader.lead(1, frozenset({2}), 1, frozenset({2, 3}))  # the controller dropped 3
        assert leader.high_watermark == 3
        leader.replica_read(3, 2, 1, 1 << 20)  # below the high watermark: not yet
        assert leader.wanted_in_sync(time.monotonic(), 10.0) is None
        leader.replica_read(3, 3, 1, 1 << 20)
        assert leader.wanted_in_sync(time.monotonic(), 10.0) == frozenset({2, 3})
    finally:
        leader.close()


def test_a_follower_fsyncs_once_per_fetched_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader = open_partition(tmp_path / "leader")
    follower = reserved(
        Partition(
            "t", 0, tmp_path / "follower", segment_bytes=1 << 20, index_interval_bytes=256,
            fsync=FsyncPolicy.ALWAYS,
        )
    )  # fmt: skip
    try:
        for i in range(6):
            send(leader, -1, -1, f"v{i}".encode(), txn=False)
        follower.append_replicated(leader.store.read(0, 1 << 20, 1))  # the epoch's checkpoint
        calls: list[int] = []
        real = os.fsync
        monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
        replicate(leader, follower)
        assert follower.store.log_end_offset == 6 and len(calls) == 1
        assert not follower.store.dirty
    finally:
        leader.close()
        follower.close()


def test_a_committed_transaction_is_readable_only_once_its_marker_is_replicated(
    tmp_path: Path,
) -> None:
    """Kafka's unreplicated transactions: a marker above the high watermark
    may yet be cut (its leader fails before a follower has it), so the LSO
    stays at the transaction's first offset until the high watermark passes
    the marker."""
    leader = open_partition(tmp_path / "leader")
    try:
        leader.lead(1, frozenset({2}), 2, frozenset({2}))
        send(leader, 7, 0, b"in-txn", txn=True)  # offset 0
        leader.replica_read(2, 1, 1, 1 << 20)  # the follower has it
        assert leader.offsets() == (0, 0, 1)  # open: LSO at its first offset
        assert leader.write_marker(7, 0, 0, True, 0, transaction_version=1)[0] is ErrorCode.NONE
        assert leader.offsets() == (0, 0, 1)  # the COMMIT (offset 1) is not replicated yet
        assert leader.fetch(0, 1 << 20, read_committed=True).batches == []
        leader.replica_read(2, 2, 1, 1 << 20)  # now it is
        assert leader.offsets() == (0, 2, 2)
        fetched = leader.fetch(0, 1 << 20, read_committed=True)
        assert [r.value for b in fetched.batches for r in b.records] == [b"in-txn"]
    finally:
        leader.close()
