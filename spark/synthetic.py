"""A synthetic, consistent run for the audit's benchmark and tests.

:func:`generate` builds in memory what a clean run leaves behind: the batches
of every partition log (transactional data closed by COMMIT/ABORT markers),
the coordinator's applied transitions (identical on every replica) and the
workload history of docs/history.md (transactional producers writing the
input topic, a consume-transform-produce worker copying it to the output
topic, two pollers reading everything, a final read). A test edits the
:class:`Run` to plant an anomaly, then :meth:`Run.write` lays it out on disk
exactly as a cluster does: ``partition-node-N/<topic>-<partition>/`` holding
``<base offset, 20 digits>.log`` segments of Kafka RecordBatch v2 batches
(built with kafka-python's ``DefaultRecordBatchBuilder``) with their
``.index`` files, ``node-N/shard-S/transitions.jsonl``, and ``history.jsonl``.

Offsets are assigned when the run is written, so a planted batch shifts the
offsets of the batches after it, and the history's offsets follow: a send or
a read names its value (a read or a send's ``source`` may name another value,
whose offset it then reads, or an offset outright), and its offset is the one
that value ends up at. ``Run.log_edits`` damage the logs after that, behind
the history's back, and ``Run.file_edits`` the files once written.
"""

from __future__ import annotations

import copy
import json
import random
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder

#: The highest producer epoch a batch can carry (a signed 16-bit field).
MAX_EPOCH = 32_767
INPUT = "input"
EVENTS = "events"
OUTPUT = "output"
GROUP = "copier"
START_MS = 1_790_000_000_000
_INDEX_INTERVAL = 4096
_INDEX_ENTRY = struct.Struct(">II")
#: One write of a transaction: topic, partition, value, and the record it copies (or None).
Write = tuple[str, int, str, list[Any] | None]


class _ControlBatchBuilder(DefaultRecordBatchBuilder):  # type: ignore[misc]
    """kafka-python's builder with the control bit set (it only sets transactional)."""

    def _get_attributes(self, include_compression_type: bool = True) -> int:
        attributes: int = super()._get_attributes(include_compression_type)
        control: int = self.CONTROL_MASK
        return attributes | control


@dataclass
class Batch:
    """One batch of a partition log; ``control`` is ``COMMIT``/``ABORT`` for a marker."""

    producer_id: int
    epoch: int
    sequence: int
    values: list[str]
    timestamp: int
    transactional: bool = True
    control: str | None = None
    coordinator_epoch: int = 0
    #: a marker's transaction number, written after Kafka's marker value (-1: none)
    txn_number: int = -1
    #: the magic byte written (a v2 batch's is 2)
    magic: int = 2
    #: the partition leader epoch of the leader that appended it
    leader_epoch: int = 0

    def encode(self) -> bytearray:
        if self.control is not None:
            builder = _ControlBatchBuilder(2, 0, True, self.producer_id, self.epoch, -1, 1 << 30)
            key = struct.pack(">hh", 0, 1 if self.control == "COMMIT" else 0)
            marker = struct.pack(">hi", 0, self.coordinator_epoch)
            if self.txn_number >= 0:
                marker += struct.pack(">q", self.txn_number)
            builder.append(0, self.timestamp, key, marker, [])
        else:
            builder = DefaultRecordBatchBuilder(
                2, 0, self.transactional, self.producer_id, self.epoch, self.sequence, 1 << 30
            )
            for i, value in enumerate(self.values):
                builder.append(i, self.timestamp, None, value.encode(), [])
        batch: bytearray = builder.build()
        batch[16] = self.magic  # outside the CRC, as in Kafka
        struct.pack_into(">i", batch, 12, self.leader_epoch)  # outside the CRC too
        return batch

    @property
    def size(self) -> int:
        return 1 if self.control is not None else len(self.values)


@dataclass
class Run:
    """Everything a run leaves: logs, transitions, history (see the module doc)."""

    partitions: int
    logs: dict[tuple[str, int], list[Batch]] = field(default_factory=dict)
    #: shard -> transitions, identical on every replica unless ``replica_edits`` says otherwise
    transitions: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    #: (node, shard) -> {line number: replacement transition, or None to leave it out}
    replica_edits: dict[tuple[int, int], dict[int, dict[str, Any] | None]] = field(
        default_factory=dict
    )
    events: list[dict[str, Any]] = field(default_factory=list)
    #: final read: [topic, partition, value]; offsets resolved when written
    final_reads: list[list[Any]] = field(default_factory=list)
    #: applied to a copy of ``logs`` after the history's offsets are taken from ``logs``:
    #: damage that the workload did not see
    log_edits: list[Callable[[dict[tuple[str, int], list[Batch]]], None]] = field(
        default_factory=list
    )
    #: added to the group's committed offsets of the final event
    committed_delta: dict[tuple[str, int], int] = field(default_factory=dict)
    #: applied to the cluster directory once everything is written (damage to the bytes)
    file_edits: list[Callable[[Path], None]] = field(default_factory=list)
    #: follower replicas of a partition: each edit makes one copy of its log
    #: (after ``log_edits``) on the next node round the ring
    replica_copies: dict[tuple[str, int], list[Callable[[list[Batch]], None]]] = field(
        default_factory=dict
    )
    coordinators: int = 3
    shards: int = 3
    plog_nodes: int = 3

    @property
    def values(self) -> int:
        """How many values were sent."""
        return sum(1 for e in self.events if e["op"] == "send" and e["type"] == "invoke")

    def write(self, root: Path, segment_bytes: int = 1 << 20) -> tuple[Path, Path]:
        """Lay the run out under ``root``; returns (cluster dir, history file)."""
        cluster = root / "cluster"
        offsets: dict[tuple[str, int, str], int] = {}
        ends = {tp: _layout(tp, batches, offsets) for tp, batches in self.logs.items()}
        logs = copy.deepcopy(self.logs)
        for edit in self.log_edits:
            edit(logs)
        for (topic, index), batches in sorted(logs.items()):
            node = 101 + index % self.plog_nodes
            directory = cluster / f"partition-node-{node}" / f"{topic}-{index}"
            _write_log(directory, batches, segment_bytes)
            for k, copy_edit in enumerate(self.replica_copies.get((topic, index), []), 1):
                replica = copy.deepcopy(batches)
                copy_edit(replica)
                node = 101 + (index + k) % self.plog_nodes
                directory = cluster / f"partition-node-{node}" / f"{topic}-{index}"
                _write_log(directory, replica, segment_bytes)
        for shard, transitions in self.transitions.items():
            for node in range(1, self.coordinators + 1):
                path = cluster / f"node-{node}" / f"shard-{shard}" / "transitions.jsonl"
                path.parent.mkdir(parents=True, exist_ok=True)
                edits = self.replica_edits.get((node, shard), {})
                with path.open("w") as f:
                    for n, t in enumerate(transitions):
                        line = edits.get(n, t)
                        if line is not None:
                            f.write(json.dumps(line) + "\n")
        history = root / "history.jsonl"
        with history.open("w") as f:
            for i, event in enumerate(self.events):
                f.write(json.dumps(self._resolve(event, i, offsets, ends)) + "\n")
        for damage in self.file_edits:
            damage(cluster)
        return cluster, history

    def base_offsets(self, tp: tuple[str, int]) -> list[int]:
        """The base offset each batch of ``tp`` is written at (before ``log_edits``)."""
        bases, next_offset = [], 0
        for batch in self.logs[tp]:
            bases.append(next_offset)
            next_offset += batch.size
        return bases

    def _resolve(
        self,
        event: dict[str, Any],
        index: int,
        offsets: dict[tuple[str, int, str], int],
        ends: dict[tuple[str, int], int],
    ) -> dict[str, Any]:
        e = {"index": index, **event}
        if e["op"] == "send" and e["type"] == "ok":
            e["offset"] = offsets.get((e["topic"], e["partition"], e["value"]), -1)
        if e.get("source") is not None:
            t, p, o, v = e["source"]
            e["source"] = [t, p, _offset(offsets, t, p, o, v), v]
        if "reads" in e:
            e["reads"] = [[t, p, _offset(offsets, t, p, o, v), v] for t, p, o, v in e["reads"]]
        if e["op"] == "offsets" and "offsets" in e:
            e["offsets"] = [[t, p, offsets[(t, p, v)] + 1] for t, p, v in e["offsets"]]
        if e["op"] == "final":
            e["reads"] = [[t, p, offsets.get((t, p, v), -1), v] for t, p, v in self.final_reads]
            e["end_offsets"] = {f"{t}/{p}": n for (t, p), n in sorted(ends.items())}
            e["committed"] = {
                f"{INPUT}/{p}": ends[(INPUT, p)] + self.committed_delta.get((INPUT, p), 0)
                for p in range(self.partitions)
            }
        return e


def _offset(
    offsets: dict[tuple[str, int, str], int], topic: str, partition: int, at: Any, value: str
) -> int:
    """The offset a read or source names: ``at`` None, the offset of ``value``; a string,
    the offset of that value; an int, that offset."""
    if isinstance(at, int):
        return at
    return offsets.get((topic, partition, value if at is None else at), -1)


def _layout(
    tp: tuple[str, int], batches: list[Batch], offsets: dict[tuple[str, int, str], int]
) -> int:
    """Record the offset of every value of one partition; returns the log end offset."""
    next_offset = 0
    for batch in batches:
        if batch.control is None:
            for i, value in enumerate(batch.values):
                offsets.setdefault((*tp, value), next_offset + i)
        next_offset += batch.size
    return next_offset


def _write_log(directory: Path, batches: list[Batch], segment_bytes: int) -> None:
    """Write one partition's segments and offset indexes as the partition-log node does."""
    directory.mkdir(parents=True, exist_ok=True)
    next_offset = 0
    segment_base = 0
    log = bytearray()
    entries = bytearray()
    last_indexed = 0

    def flush() -> None:
        (directory / f"{segment_base:020d}.log").write_bytes(log)
        (directory / f"{segment_base:020d}.index").write_bytes(entries)

    for batch in batches:
        data = batch.encode()
        if log and len(log) + len(data) > segment_bytes:
            flush()
            segment_base, log, entries, last_indexed = next_offset, bytearray(), bytearray(), 0
        struct.pack_into(">q", data, 0, next_offset)
        if len(log) - last_indexed >= _INDEX_INTERVAL:
            entries += _INDEX_ENTRY.pack(next_offset - segment_base, len(log))
            last_indexed = len(log)
        log += data
        next_offset += batch.size
    flush()


class _Clock:
    def __init__(self) -> None:
        self.ms = float(START_MS)

    def tick(self) -> float:
        self.ms += 1.0
        return self.ms


class _Builder:
    """Generates a clean run step by step (one process acts at a time)."""

    def __init__(self, partitions: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.clock = _Clock()
        self.run = Run(partitions)
        for topic in (INPUT, EVENTS, OUTPUT):
            for p in range(partitions):
                self.run.logs[(topic, p)] = []
        self.visible: dict[tuple[str, int], list[str]] = {tp: [] for tp in self.run.logs}
        self.read_upto: dict[str, dict[tuple[str, int], int]] = {}
        self.raft_index = dict.fromkeys(range(self.run.shards), 0)
        self.term = 1

    def event(self, process: str, kind: str, op: str, **fields: Any) -> dict[str, Any]:
        ms = self.clock.tick()
        e = {
            "time_ms": ms,
            "mono_ns": int((ms - START_MS) * 1_000_000),
            "process": process,
            "type": kind,
            "op": op,
            **fields,
        }
        self.run.events.append(e)
        return e

    def transition(
        self, tid: str, pid: int, epoch: int, old: str | None, new: str, **kw: Any
    ) -> None:
        """One line of the applied-transitions log (``txn_number`` in ``kw``:
        the id's latest transaction's number, when given)."""
        shard = zlib.crc32(tid.encode()) % self.run.shards
        self.raft_index[shard] += 1
        self.run.transitions.setdefault(shard, []).append(
            {
                "index": self.raft_index[shard],
                "term": self.term,
                "shard": shard,
                "transactional_id": tid,
                "producer_id": pid,
                "producer_epoch": epoch,
                "from": old,
                "to": new,
                "partitions": kw.get("partitions", []),
                "groups": kw.get("groups", []),
                "time_ms": int(self.clock.ms),
                **({"txn_number": kw["txn_number"]} if "txn_number" in kw else {}),
            }
        )

    def transaction(
        self,
        process: str,
        pid: int,
        epoch: int,
        n: int,
        writes: list[Write],
        commit: bool,
        state: str,
        offsets: list[list[Any]] | None = None,
        kept: bool = False,
        v1: bool = False,
        sequences: dict[tuple[str, int], int] | None = None,
    ) -> str:
        """One transaction of ``process`` at ``epoch``, its ``n``-th (numbered
        ``n`` + 1 at the coordinator); returns the state it ends in. A
        ``kept`` one is kept for a two-phase commit before it ends: the
        coordinator bumps its epoch while it stays Ongoing, and its markers
        carry an epoch two above its records'. A ``v1`` one (transactions
        v1) ends without a bump: its markers carry its records' epoch, and
        its batches' sequences go on from ``sequences`` (per partition)."""
        number = n + 1
        txn = f"{process}:{n}"
        ident = {"txn": txn, "producer_id": pid, "producer_epoch": epoch}
        parts = sorted({(t, p) for t, p, _, _ in writes})
        self.transition(
            process,
            pid,
            epoch,
            state,
            "ONGOING",
            partitions=[list(tp) for tp in parts],
            groups=[GROUP] if offsets else [],
            txn_number=number,
        )
        by_partition: dict[tuple[str, int], list[str]] = {}
        for topic, p, value, source in writes:
            extra = {"source": source} if source is not None else {}
            self.event(
                process, "invoke", "send", topic=topic, partition=p, value=value, **ident, **extra
            )
            self.event(
                process, "ok", "send", topic=topic, partition=p, value=value, offset=None, **ident
            )
            by_partition.setdefault((topic, p), []).append(value)
        for (topic, p), values in by_partition.items():
            # Under v2 every transaction has its own epoch, so each batch starts
            # the sequence at 0; under v1 the sequence goes on.
            sequence = 0
            if v1 and sequences is not None:
                sequence = sequences.get((topic, p), 0)
                sequences[(topic, p)] = sequence + len(values)
            self.run.logs[(topic, p)].append(
                Batch(pid, epoch, sequence, values, int(self.clock.ms))
            )
        if offsets:
            self.event(process, "invoke", "offsets", group=GROUP, offsets=offsets, **ident)
            self.event(process, "ok", "offsets", **ident)
        op = "commit" if commit else "abort"
        listed = [[t, p, v] for t, p, v, _ in writes]
        self.event(process, "invoke", op, writes=listed, **ident)
        decision = "COMMIT" if commit else "ABORT"
        marker_epoch = epoch if v1 else epoch + 1
        if kept:
            self.transition(
                process,
                pid,
                marker_epoch,
                "ONGOING",
                "ONGOING",
                partitions=[list(tp) for tp in parts],
                groups=[GROUP] if offsets else [],
                txn_number=number,
            )
            marker_epoch += 1
        self.transition(
            process,
            pid,
            marker_epoch,
            "ONGOING",
            f"PREPARE_{decision}",
            partitions=[list(tp) for tp in parts],
            txn_number=number,
        )
        for tp in parts:
            self.run.logs[tp].append(
                Batch(
                    pid,
                    marker_epoch,
                    -1,
                    [],
                    int(self.clock.ms),
                    control=decision,
                    coordinator_epoch=self.term,
                    txn_number=number,
                )
            )
            if commit:
                self.visible[tp].extend(by_partition[tp])
        self.transition(
            process,
            pid,
            marker_epoch,
            f"PREPARE_{decision}",
            f"COMPLETE_{decision}",
            partitions=[list(tp) for tp in parts],
            txn_number=number,
        )
        self.event(process, "ok", op, **ident)
        return f"COMPLETE_{decision}"

    def poll(self, poller: str) -> None:
        upto = self.read_upto.setdefault(poller, dict.fromkeys(self.visible, 0))
        reads: list[list[str | int | None]] = []
        for tp, values in sorted(self.visible.items()):
            reads.extend([tp[0], tp[1], None, v] for v in values[upto[tp] :])
            upto[tp] = len(values)
        assigned = [list(tp) for tp in sorted(self.visible)]
        self.event(poller, "invoke", "poll", isolation="read_committed", partitions=assigned)
        self.event(poller, "ok", "poll", reads=reads)


#: The producer of the synthetic runs that speaks transactions v1.
V1_PRODUCER = "txn-2"


def generate(values: int, *, partitions: int = 3, producers: int = 4, seed: int = 1) -> Run:
    """A clean run with about ``values`` sends: half written by transactional producers
    (one transaction in ten aborted), the committed ones copied by one worker."""
    b = _Builder(partitions, seed)
    rng = b.rng
    b.event(
        "workload",
        "info",
        "run",
        seed=seed,
        args=["--synthetic", str(values)],
        topics={INPUT: partitions, EVENTS: partitions, OUTPUT: partitions},
        input_topic=INPUT,
        output_topic=OUTPUT,
        group=GROUP,
        bootstrap=[],
    )
    procs = [f"txn-{i}" for i in range(producers)] + ["ctp-0"]
    state: dict[str, tuple[int, int, int, str | None]] = {}  # pid, epoch, txn count, state
    for pid, proc in enumerate(procs):
        b.event(proc, "invoke", "init")
        b.event(proc, "ok", "init", producer_id=pid, producer_epoch=0)
        b.transition(proc, pid, 0, None, "EMPTY")
        state[proc] = (pid, 0, 0, "EMPTY")

    next_pid = [len(procs)]
    #: The v1 producer's next sequence per partition.
    v1_sequences: dict[tuple[str, int], int] = {}

    def step(
        proc: str,
        writes: list[Write],
        commit: bool,
        offsets: list[list[Any]] | None = None,
    ) -> None:
        pid, epoch, n, st = state[proc]
        # One transaction in seven of one producer is kept for a two-phase
        # commit (a second epoch bump) before it ends.
        kept = proc == "txn-1" and n % 7 == 3
        # One producer speaks transactions v1: its epoch stays.
        v1 = proc == V1_PRODUCER
        bumps = 0 if v1 else 2 if kept else 1
        if epoch + bumps >= MAX_EPOCH:
            # Its epochs are spent (each transaction bumps one): as a coordinator
            # does, the transactional id goes on under a new producer id from epoch 0.
            pid, epoch = next_pid[0], 0
            next_pid[0] += 1
            b.event(proc, "invoke", "init")
            b.event(proc, "ok", "init", producer_id=pid, producer_epoch=0)
            b.transition(proc, pid, 0, st, "EMPTY")
            st = "EMPTY"
        st = b.transaction(
            proc, pid, epoch, n, writes, commit, st or "EMPTY", offsets, kept, v1, v1_sequences
        )
        state[proc] = (pid, epoch + bumps, n + 1, st)

    written = 0
    target = max(values // 2, 1)
    # Two faults during the producers' phase; a killed leader means a new Raft term.
    faults = {
        target // 4: ("start", "leader-kill", [1]),
        target // 2: ("end", "leader-kill", [1]),
        (2 * target) // 3: ("start", "pause", [2]),
        (3 * target) // 4: ("end", "pause", [2]),
    }
    while written < target:
        for mark in [m for m in faults if m <= written]:
            phase, fault, targets = faults.pop(mark)
            b.event(
                "nemesis",
                "info",
                "fault",
                phase=phase,
                fault=fault,
                targets=targets,
                detail="synthetic",
            )
            if phase == "start" and fault == "leader-kill":
                b.term += 1
        proc = procs[rng.randrange(producers)]
        n = state[proc][2]
        count = min(rng.randint(1, 4), target - written)
        writes: list[Write] = [
            (rng.choice((INPUT, EVENTS)), rng.randrange(partitions), f"{proc}-{n}-{i}", None)
            for i in range(count)
        ]
        if proc == V1_PRODUCER:  # its transactions stay out of the events topic's partitions
            writes = [(INPUT, p, value, source) for _, p, value, source in writes]
        step(proc, writes, commit=rng.random() >= 0.1)
        written += count
        if rng.random() < 0.05:
            for poller in ("poller-0", "poller-1"):
                b.poll(poller)
    # The worker copies every committed input, partition by partition, five at a time.
    for p in range(partitions):
        pending = list(b.visible[(INPUT, p)])
        for start in range(0, len(pending), 5):
            chunk = pending[start : start + 5]
            writes = [(OUTPUT, p, f"copied:{v}", [INPUT, p, None, v]) for v in chunk]
            step("ctp-0", writes, True, offsets=[[INPUT, p, chunk[-1]]])
            if rng.random() < 0.05:
                for poller in ("poller-0", "poller-1"):
                    b.poll(poller)
    for poller in ("poller-0", "poller-1"):
        b.poll(poller)
    b.event("workload", "ok", "final")
    b.run.final_reads = [[t, p, v] for (t, p), vs in sorted(b.visible.items()) for v in vs]
    b.event("workload", "ok", "run", summary={"values": b.run.values})
    return b.run
