"""Producer-state snapshots: the state a partition reopens with from a snapshot
plus the log's tail is the state a full replay of the log rebuilds, and a
damaged or missing snapshot falls back to an older one or to a full replay."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from partition_log import codec
from partition_log.log import SNAPSHOTS_KEPT, FsyncPolicy
from partition_log.partition import BatchSpec, Partition
from partition_log.producer_state import (
    ProducerStates,
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
)
from tests.reserved import reserved


def open_partition(path: Path, segment_bytes: int = 2048) -> Partition:
    return reserved(
        Partition(
            "t",
            0,
            path,
            segment_bytes=segment_bytes,
            index_interval_bytes=256,
            fsync=FsyncPolicy.NEVER,
        )
    )


class Workload:
    """Random appends (plain, idempotent, transactional) and markers from a few
    producers; refused requests are part of the mix and change nothing."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.sequence = dict.fromkeys(range(1, 6), 0)
        self.epoch = dict.fromkeys(range(1, 6), 0)
        self.in_txn: set[int] = set()

    def step(self, part: Partition) -> None:
        rng = self.rng
        pid = rng.choice([-1, 1, 2, 3, 4, 5])
        if pid >= 0 and pid in self.in_txn and rng.random() < 0.3:
            self.epoch[pid] += 1
            part.write_marker(pid, self.epoch[pid], 1, rng.random() < 0.5, 1_700_000_000_000)
            self.in_txn.discard(pid)
            self.sequence[pid] = 0
            return
        count = rng.randint(1, 4)
        txn = pid >= 0 and (pid in self.in_txn or rng.random() < 0.5)
        epoch = self.epoch[pid] if pid >= 0 else -1
        sequence = self.sequence[pid] if pid >= 0 else -1
        if pid >= 0 and rng.random() < 0.1:  # a retry of the previous batch, or a gap
            sequence = max(0, sequence - count) if rng.random() < 0.5 else sequence + 7
        records = [
            codec.RecordData(
                key=b"k", value=b"v%d" % rng.randrange(10**6), headers=(), timestamp_ms=1
            )
            for _ in range(count)
        ]
        batch = codec.encode_batch(
            records,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=sequence,
            transactional=txn,
        )
        check = part.append(BatchSpec(pid, epoch, sequence, count, txn), batch, verified=True)
        if check.ok and pid >= 0 and sequence == self.sequence[pid]:
            self.sequence[pid] += count
            if txn:
                self.in_txn.add(pid)


def build(path: Path, seed: int, steps: int) -> dict[str, object]:
    """Run the workload on a fresh partition, crash it (store closed without the
    shutdown snapshot) and return its state just before."""
    part = open_partition(path)
    workload = Workload(seed)
    for _ in range(steps):
        workload.step(part)
    state = part.states.snapshot()
    part.store.close()
    return state


def reopened_state(path: Path) -> tuple[dict[str, object], int]:
    part = open_partition(path)
    try:
        return part.states.snapshot(), part.snapshot_loaded
    finally:
        part.store.close()


def remove_snapshots(path: Path) -> None:
    for snapshot in path.glob("*.snapshot"):
        snapshot.unlink()


@pytest.mark.parametrize("seed", range(12))
def test_snapshot_plus_tail_equals_full_replay(tmp_path: Path, seed: int) -> None:
    print(f"seed={seed}")
    path = tmp_path / "t-0"
    before = build(path, seed, 300)
    assert len(list(path.glob("*.log"))) > 3, "the workload should roll segments"
    assert 0 < len(list(path.glob("*.snapshot"))) <= SNAPSHOTS_KEPT
    from_snapshot, loaded = reopened_state(path)
    assert loaded > 0, "the roll snapshot should be used after a crash"
    remove_snapshots(path)
    replayed, loaded = reopened_state(path)
    assert loaded == 0
    assert from_snapshot == replayed == before


@pytest.mark.parametrize("seed", range(4))
def test_clean_shutdown_snapshot_restarts_without_replay(tmp_path: Path, seed: int) -> None:
    print(f"seed={seed}")
    path = tmp_path / "t-0"
    part = open_partition(path, segment_bytes=1 << 20)
    workload = Workload(seed)
    for _ in range(400):
        workload.step(part)
    before = part.states.snapshot()
    end = part.store.log_end_offset
    part.close()

    part = open_partition(path, segment_bytes=1 << 20)
    replay_with = part.store.headers_scanned - part.store.recovered.batches_scanned
    assert part.snapshot_loaded == end
    assert part.states.snapshot() == before
    part.close()

    remove_snapshots(path)
    part = open_partition(path, segment_bytes=1 << 20)
    replay_without = part.store.headers_scanned - part.store.recovered.batches_scanned
    assert part.snapshot_loaded == 0
    assert part.states.snapshot() == before
    part.store.close()
    # A full replay reads every batch header; from the snapshot at the end only the
    # headers between the active segment's last index entry and the end are read.
    assert replay_without == part.store.recovered.batches_scanned > 100
    assert replay_with <= 256 // codec.HEADER_SIZE + 1


def test_a_corrupt_snapshot_falls_back_to_an_older_one_then_to_a_full_replay(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t-0"
    before = build(path, 99, 300)
    offsets = sorted(int(p.stem) for p in path.glob("*.snapshot"))
    assert len(offsets) == SNAPSHOTS_KEPT
    newest = path / f"{offsets[-1]:020d}.snapshot"
    data = bytearray(newest.read_bytes())
    data[-3] ^= 0x40
    newest.write_bytes(bytes(data))
    state, loaded = reopened_state(path)
    assert (state, loaded) == (before, offsets[-2])

    for offset in offsets:
        (path / f"{offset:020d}.snapshot").write_bytes(b"RCPS\x00")  # torn
    state, loaded = reopened_state(path)
    assert (state, loaded) == (before, 0)


def test_snapshots_past_the_recovered_end_are_deleted(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    build(path, 5, 300)
    offsets = sorted(int(p.stem) for p in path.glob("*.snapshot"))
    segments = sorted(int(p.stem) for p in path.glob("*.log"))
    assert offsets == segments[-2:]
    # The two newest segments are lost (a disk restored from an older copy): the
    # newest snapshot describes records that are gone, the other one is the new end.
    for base in segments[-2:]:
        (path / f"{base:020d}.log").unlink()
        (path / f"{base:020d}.index").unlink()
    part = open_partition(path)
    try:
        assert part.store.log_end_offset == offsets[0]
        assert part.store.snapshot_offsets() == [offsets[0]]
        assert part.snapshot_loaded == offsets[0]
    finally:
        part.store.close()


def test_decode_refuses_damaged_snapshots() -> None:
    states = ProducerStates()
    states.on_append(7, 0, 0, 0, 3, True)
    states.on_marker(7, 1, 2, False, 4)
    states.on_append(8, 2, 0, 5, 5, False)
    data = encode_snapshot(states, 6)
    offset, decoded = decode_snapshot(data)
    assert offset == 6 and decoded.snapshot() == states.snapshot()
    for bad in (data[:10], data[:-1], b"XXXX" + data[4:], data[:-1] + b"X"):
        with pytest.raises(SnapshotError):
            decode_snapshot(bad)
