"""The Spark audit: a clean run passes, and each planted anomaly is flagged by its check
and no other (``spark/synthetic.py`` writes the logs, transitions and history; the tests
edit them first). Spark's cost is per job, not per row, so the anomalies are planted
together, each in its own partitions and transactions, into one run: each check must
find exactly its own anomaly. One local SparkSession serves every test (``spark``)."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from spark import audit, synthetic
from spark.checks import CHECKS, CheckResult
from spark.synthetic import EVENTS, INPUT, OUTPUT, Batch, Run

# Spark jobs are slow on a busy 2-core machine: a generous bound.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

Logs = dict[tuple[str, int], list[Batch]]


@pytest.fixture(scope="module")
def clean() -> Run:
    return synthetic.generate(600, partitions=12, seed=7)


def _audit(spark: Any, cluster: Path, history: Path | None) -> dict[str, CheckResult]:
    try:
        _, results = audit.audit(spark, cluster, history)
    finally:
        spark.catalog.clearCache()
    return {r.name: r for r in results}


@dataclass
class Planted:
    """What a plant expects of its check: the number of violations, and a string that
    each example shows (one of ``needles``)."""

    count: int
    needles: tuple[str, ...]


@dataclass
class Picker:
    """Hands out partitions and transactions no other plant touches."""

    run: Run
    partitions: set[tuple[str, int]] = field(default_factory=set)
    txns: set[str] = field(default_factory=set)
    #: partition-log nodes whose restart a plant recorded in the history
    restarted: set[int] = field(default_factory=set)

    def take(self, tp: tuple[str, int] | None = None, txn: str | None = None) -> None:
        if tp is not None:
            assert tp not in self.partitions
            self.partitions.add(tp)
        if txn is not None:
            assert txn not in self.txns
            self.txns.add(txn)

    def free(self, tp: tuple[str, int] | None = None, txn: str | None = None) -> bool:
        return tp not in self.partitions and txn not in self.txns


# --- finding things in a run ---------------------------------------------------------------


def _transactions(run: Run) -> dict[str, dict[str, Any]]:
    """txn -> producer id, epoch, writes [(topic, partition, value)], outcome, in order;
    the plants' candidates, so not the transactions of the producer of transactions
    v1 (its producer id and epoch name many of them)."""
    txns: dict[str, dict[str, Any]] = {}
    for e in run.events:
        if e.get("process") == synthetic.V1_PRODUCER:
            continue
        if e["op"] == "send" and e["type"] == "invoke":
            t = txns.setdefault(
                e["txn"], {"pid": e["producer_id"], "epoch": e["producer_epoch"], "writes": []}
            )
            t["writes"].append((e["topic"], e["partition"], e["value"]))
        elif e["op"] in ("commit", "abort") and e["type"] == "ok":
            txns[e["txn"]]["outcome"] = e["op"]
    return txns


def _ending_with_commit(
    pick: Picker, topics: tuple[str, ...] = (EVENTS,)
) -> tuple[tuple[str, int], str]:
    """A free partition of ``topics`` whose log ends with a free committed transaction's
    data batch and COMMIT marker, with that transaction; both taken."""
    txns = _transactions(pick.run)
    by_batch = {(t["pid"], t["epoch"]): name for name, t in txns.items()}
    for tp, batches in sorted(pick.run.logs.items()):
        if tp[0] not in topics or len(batches) < 2:
            continue
        data, marker = batches[-2], batches[-1]
        txn = by_batch.get((data.producer_id, data.epoch))
        if (
            marker.control == "COMMIT"
            and data.control is None
            and data.producer_id == marker.producer_id
            and txn is not None
            and pick.free(tp, txn)
        ):
            pick.take(tp, txn)
            return tp, txn
    raise AssertionError("no free partition ends with a committed transaction")


def _input_first(item: tuple[tuple[str, int], Any]) -> tuple[bool, tuple[str, int]]:
    """Sorts partitions of INPUT first (fewer plants need them than EVENTS)."""
    return item[0][0] != INPUT, item[0]


def _polls(run: Run, process: str | None = None) -> list[dict[str, Any]]:
    return [
        e
        for e in run.events
        if e["op"] == "poll" and e["type"] == "ok" and process in (None, e["process"])
    ]


def _drop_reads(run: Run, value: str, final: bool = True) -> None:
    for e in _polls(run):
        e["reads"] = [r for r in e["reads"] if r[3] != value]
    if final:
        run.final_reads = [r for r in run.final_reads if r[2] != value]


# --- the anomalies -------------------------------------------------------------------------


def plant_duplicate(pick: Picker) -> Planted:
    """A committed batch appended twice (its retry not recognised)."""
    tp, _ = _ending_with_commit(pick)
    batches = pick.run.logs[tp]
    batches.insert(len(batches) - 1, copy.deepcopy(batches[-2]))
    return Planted(len(batches[-2].values), tuple(batches[-2].values))


def plant_lost_write(pick: Picker) -> Planted:
    """A committed transaction's batch and marker vanish from a log after the workload
    saw them in its polls (the final read misses them too)."""
    tp, txn = _ending_with_commit(pick)
    lost = pick.run.logs[tp][-2].values
    pick.run.final_reads = [r for r in pick.run.final_reads if r[2] not in lost]

    def cut(logs: Logs) -> None:
        del logs[tp][-2:]

    pick.run.log_edits.append(cut)
    return Planted(len(lost), (txn,))


def plant_aborted_read(pick: Picker) -> Planted:
    """The final (read_committed) read returns a record of an aborted transaction: its
    history says aborted, and so does its log's marker."""
    name, t = next(
        (n, t)
        for n, t in _transactions(pick.run).items()
        if t.get("outcome") == "abort"
        and pick.free(txn=n)
        and all(pick.free((w[0], w[1])) for w in t["writes"])
    )
    pick.take(txn=name)
    topic, partition, value = t["writes"][0]
    pick.take((topic, partition))
    pick.run.final_reads.append([topic, partition, value])
    return Planted(2, (value,))


def plant_torn_transaction(pick: Picker) -> Planted:
    """A transaction whose commit timed out (``info``) shows in some partitions only: the
    COMMIT marker of one never arrived, and nobody read its data there."""
    run = pick.run
    txns = _transactions(run)
    while True:
        tp, txn = _ending_with_commit(pick)
        if len({(w[0], w[1]) for w in txns[txn]["writes"]}) > 1:
            break
    for w in txns[txn]["writes"]:
        pick.partitions.add((w[0], w[1]))
    for e in run.events:
        if e.get("txn") == txn and e["op"] == "commit" and e["type"] == "ok":
            e["type"] = "info"
            e["error"] = "KafkaTimeoutError"
    for w in txns[txn]["writes"]:
        if (w[0], w[1]) == tp:
            _drop_reads(run, w[2])

    def drop_marker(logs: Logs) -> None:
        del logs[tp][-1]

    run.log_edits.append(drop_marker)
    t = txns[txn]
    return Planted(2, (txn, f"{t['pid']}/{t['epoch']}"))


def plant_uncommitted_read(pick: Picker) -> Planted:
    """A read_committed poll returns a record before its transaction committed."""
    run = pick.run
    txns = _transactions(run)
    i, send = next(
        (i, e)
        for i, e in enumerate(run.events)
        if e["op"] == "send"
        and e["type"] == "ok"
        and e["topic"] == EVENTS
        and txns[e["txn"]].get("outcome") == "commit"
        and pick.free((e["topic"], e["partition"]), e["txn"])
    )
    pick.take((send["topic"], send["partition"]), send["txn"])
    read = [send["topic"], send["partition"], None, send["value"]]
    poll = {"process": "poller-9", "op": "poll", "mono_ns": send["mono_ns"] + 1}
    run.events[i + 1 : i + 1] = [
        {
            **poll,
            "time_ms": send["time_ms"] + 0.2,
            "type": "invoke",
            "isolation": "read_committed",
            "partitions": [read[:2]],
        },
        {**poll, "time_ms": send["time_ms"] + 0.4, "type": "ok", "reads": [read]},
    ]
    return Planted(1, (send["value"],))


def plant_one_decision(pick: Picker) -> Planted:
    """An ABORT marker after the COMMIT of the same transaction."""
    tp, _ = _ending_with_commit(pick)
    marker = pick.run.logs[tp][-1]
    pick.run.logs[tp].append(dataclasses.replace(marker, control="ABORT"))
    return Planted(1, (f'"producer_id":{marker.producer_id},"marker_epoch":{marker.epoch}',))


def plant_zombie_write(pick: Picker) -> Planted:
    """Data at its producer's previous epoch lands in a partition of the producer's next
    transaction and is committed with it (the readers saw it: only the epoch is wrong)."""
    run = pick.run
    touched: dict[int, set[tuple[str, int]]] = {}
    for name, t in _transactions(run).items():  # in history order
        parts = {(w[0], w[1]) for w in t["writes"]}
        seen = touched.setdefault(t["pid"], set())
        fresh = sorted(tp for tp in parts - seen if tp[0] == EVENTS and pick.free(tp))
        if t["epoch"] > 0 and t.get("outcome") == "commit" and fresh and pick.free(txn=name):
            tp = fresh[0]
            break
        seen |= parts
    else:
        raise AssertionError("no transaction writes a partition its producer never wrote to")
    pick.take(tp, name)
    batches = run.logs[tp]
    at = next(
        i for i, b in enumerate(batches) if b.producer_id == t["pid"] and b.epoch == t["epoch"]
    )
    batches.insert(at, Batch(t["pid"], t["epoch"] - 1, 0, ["zombie-0"], batches[at].timestamp))
    first = next(w[2] for w in t["writes"] if (w[0], w[1]) == tp)
    for e in _polls(run):
        for j, r in enumerate(e["reads"]):
            if r[3] == first:
                e["reads"].insert(j, [*tp, None, "zombie-0"])
                break
    j = next(j for j, r in enumerate(run.final_reads) if r[2] == first)
    run.final_reads.insert(j, [*tp, "zombie-0"])
    return Planted(1, (f'"topic":"{tp[0]}","partition":{tp[1]},',))


def plant_epoch_order(pick: Picker) -> Planted:
    """A producer's marker of its previous transaction, written again after its newer one
    (of the same decision, so that only the order is wrong)."""
    txns = _transactions(pick.run)
    while True:
        tp, txn = _ending_with_commit(pick)
        t = txns[txn]
        previous = [
            p for p in txns.values() if p["pid"] == t["pid"] and p["epoch"] == t["epoch"] - 1
        ]
        if previous:
            break
    decision = "COMMIT" if previous[0].get("outcome") == "commit" else "ABORT"
    marker = pick.run.logs[tp][-1]
    # The previous transaction's marker: its epoch, its number (the one before).
    pick.run.logs[tp].append(
        dataclasses.replace(
            marker, epoch=t["epoch"], control=decision, txn_number=marker.txn_number - 1
        )
    )
    return Planted(1, (f'"topic":"{tp[0]}","partition":{tp[1]},',))


def plant_leader_epoch_order(pick: Picker) -> Planted:
    """A partition's last batch appended at a lower leader epoch than those before it."""
    tp = next(tp for tp, log in pick.run.logs.items() if pick.free(tp) and len(log) >= 2)
    pick.take(tp)
    log = pick.run.logs[tp]
    log[:] = [dataclasses.replace(b, leader_epoch=3) for b in log]
    log[-1] = dataclasses.replace(log[-1], leader_epoch=2)
    return Planted(1, (f'"topic":"{tp[0]}","partition":{tp[1]},',))


def plant_inconsistent_offsets(pick: Picker) -> Planted:
    """A poll returns another value at a record's offset."""
    tp = (INPUT, 1)
    pick.take(tp)
    reads = next(
        e["reads"]
        for e in _polls(pick.run, "poller-1")
        if any(r[:2] == list(tp) for r in e["reads"])
    )
    j = next(j for j, r in enumerate(reads) if r[:2] == list(tp))
    reads[j] = [*tp, reads[j][3], "bogus-value"]
    return Planted(1, ("bogus-value",))


def plant_nonmonotonic_poll(pick: Picker) -> Planted:
    """A poller reads one offset twice."""
    tp = (INPUT, 2)
    pick.take(tp)
    reads = next(
        e["reads"]
        for e in _polls(pick.run, "poller-0")
        if any(r[:2] == list(tp) for r in e["reads"])
    )
    j = next(j for j, r in enumerate(reads) if r[:2] == list(tp))
    reads.insert(j + 1, list(reads[j]))
    return Planted(1, (f'"topic":"{tp[0]}","partition":{tp[1]},',))


def plant_skipped_poll(pick: Picker) -> Planted:
    """A poller jumps over a visible record (the other poller still reads it)."""
    tp = (OUTPUT, 0)
    pick.take(tp)
    reads = next(
        e["reads"]
        for e in _polls(pick.run, "poller-0")
        if sum(r[:2] == list(tp) for r in e["reads"]) > 2
    )
    j = next(j for j, r in enumerate(reads) if r[:2] == list(tp))
    del reads[j + 1]
    return Planted(1, (f'"topic":"{tp[0]}","partition":{tp[1]},',))


def plant_replica_divergence(pick: Picker) -> Planted:
    """One replica applied a transition with another timestamp."""
    transitions = pick.run.transitions[0]
    line = next(i for i, t in enumerate(transitions) if t["to"] == "COMPLETE_COMMIT")
    changed = dict(transitions[line], time_ms=transitions[line]["time_ms"] + 5)
    pick.run.replica_edits[(2, 0)] = {line: changed}
    return Planted(1, (f'"shard":0,"index":{changed["index"]},',))


def plant_partition_replicas(pick: Picker) -> Planted:
    """A partition with three replicas: one holds a tail its old leader never
    had acknowledged (another batch at an older leader epoch: allowed); one
    lags (a shorter log, allowed) and holds another value at an offset and
    leader epoch of the newest leader's log."""
    tp, data = next(
        (tp, i)
        for tp, log in pick.run.logs.items()
        if pick.free(tp)
        for i in range(len(log) - 1)
        if log[i].control is None
    )
    pick.take(tp)
    log = pick.run.logs[tp]
    log[:] = [dataclasses.replace(b, leader_epoch=1) for b in log]
    log[-1] = dataclasses.replace(log[-1], leader_epoch=2)

    def old_leader_tail(batches: list[Batch]) -> None:
        batches[-1] = dataclasses.replace(
            batches[-1], leader_epoch=1, control=None, values=["never-acknowledged"]
        )

    def lagging_and_diverged(batches: list[Batch]) -> None:
        del batches[-1]
        changed = batches[data]
        batches[data] = dataclasses.replace(changed, values=["diverged", *changed.values[1:]])

    pick.run.replica_copies[tp] = [old_leader_tail, lagging_and_diverged]
    return Planted(1, ("holds value diverged",))


def plant_pipeline(pick: Picker) -> Planted:
    """The worker's committed offset of an input partition stops short of its end."""
    tp = next((INPUT, p) for p in range(pick.run.partitions) if pick.free((INPUT, p)))
    pick.take(tp)
    pick.run.committed_delta[tp] = -1
    return Planted(1, ("not at the input's end",))


def plant_unseen(pick: Picker) -> Planted:
    """No poller reads the last committed record of a partition."""
    tp, _ = _ending_with_commit(pick)
    value = pick.run.logs[tp][-2].values[-1]
    _drop_reads(pick.run, value, final=False)
    return Planted(1, (value,))


def plant_liveness(pick: Picker) -> Planted:
    """A transaction's commit never completes in the history."""
    run = pick.run
    txns = _transactions(run)
    i, e = next(
        (i, e)
        for i, e in enumerate(run.events)
        if e["op"] == "commit"
        and e["type"] == "ok"
        and e["txn"] in txns
        and pick.free(txn=e["txn"])
        and all(pick.free((w[0], w[1])) for w in txns[e["txn"]]["writes"])
    )
    pick.take(txn=e["txn"])
    del run.events[i]
    return Planted(1, (e["txn"],))


def plant_pipeline_source(pick: Picker) -> Planted:
    """An output's send names an input at a real offset of its input partition, but
    with a value that the input log does not hold there."""
    run = pick.run
    p = next(p for p in range(run.partitions) if pick.free((OUTPUT, p)) and pick.free((INPUT, p)))
    pick.take((OUTPUT, p))
    pick.take((INPUT, p))
    send = next(
        e
        for e in run.events
        if e["op"] == "send"
        and e["type"] == "invoke"
        and e["topic"] == OUTPUT
        and e["partition"] == p
    )
    topic, partition, _, value = send["source"]
    send["source"] = [topic, partition, value, "not-the-input"]  # at the offset of ``value``
    return Planted(1, ("holds another value",))


def plant_order_sequences(pick: Picker) -> Planted:
    """A producer's sequence numbers go backwards in a log: batches of an idempotent
    producer that is not in the history (as the input topic's pre-filler), at the end
    of a partition, with base sequences 5 then 3."""
    tp = next(tp for tp in sorted(pick.run.logs) if tp[0] == EVENTS and pick.free(tp))
    pick.take(tp)
    batches = pick.run.logs[tp]
    ts = batches[-1].timestamp
    batches.append(Batch(900, 0, 5, ["resent-5"], ts, transactional=False))
    batches.append(Batch(900, 0, 3, ["resent-3"], ts, transactional=False))
    return Planted(1, ("base sequence 3 after 5",))


def _committed_pair(pick: Picker) -> tuple[tuple[str, int], str, int]:
    """A free EVENTS partition, a free committed transaction with at least two values in
    one batch there, and that batch's position; both taken."""
    txns = _transactions(pick.run)
    for name, t in txns.items():
        if t.get("outcome") != "commit" or not pick.free(txn=name):
            continue
        for tp in sorted({(w[0], w[1]) for w in t["writes"]}):
            batches = pick.run.logs[tp]
            at = next(
                (
                    i
                    for i, b in enumerate(batches)
                    if b.control is None and (b.producer_id, b.epoch) == (t["pid"], t["epoch"])
                ),
                None,
            )
            if tp[0] == EVENTS and pick.free(tp) and at is not None and len(batches[at].values) > 1:
                pick.take(tp, name)
                return tp, name, at
    raise AssertionError("no free committed transaction writes two values to a partition")


def plant_order_sends(pick: Picker) -> Planted:
    """The log holds a producer's first two values of a batch in the order opposite to
    their sends (the pollers read them in log order)."""
    tp, _, at = _committed_pair(pick)
    batch = pick.run.logs[tp][at]
    first, second = batch.values[:2]
    batch.values[:2] = [second, first]
    for e in _polls(pick.run):
        reads = e["reads"]
        for j in range(len(reads) - 1):
            if [reads[j][3], reads[j + 1][3]] == [first, second]:
                reads[j], reads[j + 1] = reads[j + 1], reads[j]
    return Planted(1, (second,))


def plant_order_outputs(pick: Picker) -> Planted:
    """Two successive outputs of the worker name their inputs in the opposite order."""
    run = pick.run
    p = next(p for p in range(run.partitions) if pick.free((OUTPUT, p)) and pick.free((INPUT, p)))
    pick.take((OUTPUT, p))
    pick.take((INPUT, p))
    sends = [
        e
        for e in run.events
        if e["op"] == "send"
        and e["type"] == "invoke"
        and e["topic"] == OUTPUT
        and e["partition"] == p
    ]
    a, b = sends[0], sends[1]
    assert a["txn"] == b["txn"]
    a["source"], b["source"] = b["source"], a["source"]
    return Planted(1, ("outputs out of their inputs' order",))


def plant_skipped_to_marker(pick: Picker) -> Planted:
    """A poller's read lands on the offset of a COMMIT marker (a record no read_committed
    read can return), jumping over the visible record before it."""
    run = pick.run
    reads_of = _polls(run, "poller-0")
    for tp, batches in sorted(run.logs.items(), key=_input_first):
        if tp[0] not in (INPUT, EVENTS) or not pick.free(tp):
            continue
        bases = run.base_offsets(tp)
        for i in range(1, len(batches)):
            data, marker = batches[i - 1], batches[i]
            if marker.control != "COMMIT" or data.control is not None or len(data.values) < 2:
                continue
            last = data.values[-1]
            for e in reads_of:
                j = next((j for j, r in enumerate(e["reads"]) if r[3] == last), None)
                if j is not None and j > 0 and e["reads"][j - 1][:2] == list(tp):
                    pick.take(tp)
                    e["reads"][j] = [*tp, bases[i], "phantom"]
                    return Planted(1, ('"visible_skipped":1',))
    raise AssertionError("no free partition for the skipped read")


def plant_replica_hole(pick: Picker) -> Planted:
    """One replica lacks an entry in the middle of its transitions log."""
    transitions = pick.run.transitions[1]
    line = len(transitions) // 2
    pick.run.replica_edits[(3, 1)] = {line: None}
    return Planted(1, (f'"shard":1,"index":{transitions[line]["index"]},',))


def plant_torn_entry_tail(pick: Picker) -> Planted:
    """Not an anomaly: a replica's log ends in the torn second line of a two-transition
    entry (kill -9 while it wrote the entry); the other replicas hold both lines."""
    transitions = pick.run.transitions[2]
    transitions[-1]["index"] = transitions[-2]["index"]

    def tear(cluster: Path) -> None:
        path = cluster / "node-1" / "shard-2" / "transitions.jsonl"
        data = path.read_bytes()
        path.write_bytes(data[: data.rindex(b"\n", 0, len(data) - 1) + 1 + 40])

    pick.run.file_edits.append(tear)
    return Planted(0, ())


def plant_caught_up_by_snapshot(pick: Picker) -> Planted:
    """Not an anomaly: a replica that fell far behind got the leader's snapshot, so
    it logged no transitions for the entries the snapshot covers, and one marker line
    in their place (what a coordinator writes then)."""
    transitions = pick.run.transitions[0]
    index = [t["index"] for t in transitions]
    first = next(i for i in range(len(index) // 2, len(index)) if index[i] != index[i - 1])
    last = next(i for i in range(3 * len(index) // 4, len(index) - 1) if index[i] != index[i + 1])
    marker = {"index": index[last], "term": transitions[last]["term"], "shard": 0}
    edits: dict[int, dict[str, Any] | None] = dict.fromkeys(range(first, last))
    edits[last] = {**marker, "snapshot": True}
    pick.run.replica_edits[(1, 0)] = edits
    return Planted(0, ())


def plant_torn_line_continued(pick: Picker) -> Planted:
    """A replica's line torn and then continued by the restarted node on the same line:
    the torn bytes are unreadable (the whole object after them is read)."""
    line = len(pick.run.transitions[1]) // 3

    def tear(cluster: Path) -> None:
        path = cluster / "node-1" / "shard-1" / "transitions.jsonl"
        lines = path.read_text().splitlines(keepends=True)
        lines[line] = lines[line][:25] + lines[line]
        path.write_text("".join(lines))

    pick.run.file_edits.append(tear)
    return Planted(1, ("torn line continued",))


def plant_crc(pick: Picker) -> Planted:
    """A damaged batch of aborted data: its CRC no longer matches, so it is not decoded
    (and, aborted, nothing else misses it)."""
    for tp, batches in sorted(pick.run.logs.items(), key=_input_first):
        at = next(
            (
                i
                for i in range(len(batches) - 1)
                if batches[i].control is None
                and batches[i + 1].control == "ABORT"
                and batches[i + 1].producer_id == batches[i].producer_id
            ),
            None,
        )
        if tp[0] in (INPUT, EVENTS) and pick.free(tp) and at is not None:
            break
    else:
        raise AssertionError("no free partition with aborted data")
    pick.take(tp)
    position = sum(len(b.encode()) for b in batches[:at])

    def damage(cluster: Path) -> None:
        segment = next(cluster.glob(f"partition-node-*/{tp[0]}-{tp[1]}/*.log"))
        data = bytearray(segment.read_bytes())
        data[position + 17] ^= 0xFF
        segment.write_bytes(bytes(data))

    pick.run.file_edits.append(damage)
    return Planted(1, ("CRC-32C mismatch",))


def plant_bad_magic(pick: Picker) -> Planted:
    """A copy of a committed batch with magic 1 at the end of a log: not a v2 batch, so
    not decoded (decoded as v2 it would add its values a second time)."""
    tp, _ = _ending_with_commit(pick, (OUTPUT,))
    batches = pick.run.logs[tp]
    batches.append(dataclasses.replace(copy.deepcopy(batches[-2]), magic=1))
    return Planted(1, ("magic 1, not 2",))


def _node_of(run: Run, tp: tuple[str, int]) -> int:
    return 101 + tp[1] % run.plog_nodes  # as Run.write lays the partitions out


def _tear_segment(run: Run, tp: tuple[str, int]) -> None:
    """Append the first 50 bytes of a batch (a whole header, part of the records) to the
    newest segment of ``tp``."""
    last = run.logs[tp][-1]
    torn = Batch(800, 0, 0, ["never-acknowledged"] * 3, last.timestamp).encode()[:50]
    struct.pack_into(">q", torn, 0, run.base_offsets(tp)[-1] + last.size)

    def tear(cluster: Path) -> None:
        directory = cluster / f"partition-node-{_node_of(run, tp)}" / f"{tp[0]}-{tp[1]}"
        with max(directory.glob("*.log")).open("ab") as f:
            f.write(torn)

    run.file_edits.append(tear)


def _fault_before_final(run: Run, fault: str, node: int, **end: Any) -> None:
    """A fault on ``node`` (its start, then its end with ``end``'s fields) recorded in
    the history just before the final read, after every write."""
    final = next(i for i, e in enumerate(run.events) if e["op"] == "final")
    at = run.events[final]
    run.events[final:final] = [
        {
            "time_ms": at["time_ms"] - 0.5 + 0.25 * n,
            "mono_ns": at["mono_ns"] - 500_000 + 250_000 * n,
            "process": "nemesis",
            "type": "info",
            "op": "fault",
            "phase": phase,
            "fault": fault,
            "targets": [node],
            "detail": f"{fault} on partition-log node {node}",
            **(end if phase == "end" else {}),
        }
        for n, phase in enumerate(("start", "end"))
    ]


def plant_torn_tail_restarted(pick: Picker) -> Planted:
    """A torn tail in the newest segment of a partition-log node that the history says
    was restarted after the partition's last write: its recovery would have cut it."""
    run = pick.run
    tp = next(tp for tp in sorted(run.logs) if tp[0] == OUTPUT and pick.free(tp))
    pick.take(tp)
    _tear_segment(run, tp)
    node = _node_of(run, tp)
    pick.restarted.add(node)
    _fault_before_final(run, "plog-restart", node)
    return Planted(1, (f"partition-node/{node}/{tp[0]}/{tp[1]}",))


def plant_torn_tail_excused(pick: Picker) -> Planted:
    """Not an anomaly: a torn tail in the newest segment of a partition-log node that was
    never restarted (it died during that write; nothing after it was acknowledged): a
    disk fault on it ended without stopping it."""
    run = pick.run
    tp = next(
        tp
        for tp in sorted(run.logs)
        if tp[0] == OUTPUT and pick.free(tp) and _node_of(run, tp) not in pick.restarted
    )
    pick.take(tp)
    _tear_segment(run, tp)
    _fault_before_final(run, "disk", _node_of(run, tp), stopped=False)
    return Planted(0, ())


#: (the check that must find it, the plant), in the order they are planted; a check may
#: have several, and a plant of something that is not an anomaly expects nothing at all
PLANTS: list[tuple[str, Callable[[Picker], Planted]]] = [
    # first: few partitions have what these need
    ("order", plant_order_sends),
    ("order", plant_order_sequences),
    ("torn-transaction", plant_torn_transaction),
    ("duplicate", plant_duplicate),
    ("lost-write", plant_lost_write),
    ("one-decision", plant_one_decision),
    ("epoch-order", plant_epoch_order),
    ("unseen", plant_unseen),
    ("aborted-read", plant_aborted_read),
    ("uncommitted-read", plant_uncommitted_read),
    ("zombie-write", plant_zombie_write),
    ("inconsistent-offsets", plant_inconsistent_offsets),
    ("nonmonotonic-poll", plant_nonmonotonic_poll),
    ("skipped-poll", plant_skipped_poll),
    ("replica-divergence", plant_replica_divergence),
    ("replica-divergence", plant_partition_replicas),
    ("exactly-once-pipeline", plant_pipeline),
    ("liveness", plant_liveness),
    # then the plants that take whichever partition is left
    ("skipped-poll", plant_skipped_to_marker),
    ("replica-divergence", plant_replica_hole),
    ("replica-divergence", plant_torn_entry_tail),
    ("replica-divergence", plant_caught_up_by_snapshot),
    ("exactly-once-pipeline", plant_pipeline_source),
    ("leader-epoch-order", plant_leader_epoch_order),
    ("order", plant_order_outputs),
    ("unreadable-data", plant_crc),
    ("unreadable-data", plant_bad_magic),
    ("unreadable-data", plant_torn_line_continued),
    ("unreadable-data", plant_torn_tail_restarted),
    ("unreadable-data", plant_torn_tail_excused),
]


def test_clean_run_passes_and_reports(spark: Any, clean: Run, tmp_path: Path) -> None:
    cluster, history = clean.write(tmp_path)
    outcome = audit.run_audit(spark, cluster, history, tmp_path / "report")
    assert {r.name: r.status for r in outcome.results} == {n: "PASS" for n, _ in CHECKS}
    assert outcome.verdict == "PASS"
    document = json.loads(outcome.json_path.read_text())
    assert document["verdict"] == "PASS"
    assert [c["name"] for c in document["checks"]] == [n for n, _ in CHECKS]
    stats = document["stats"]
    assert [w["fault"] for w in stats["faults"]] == ["leader-kill", "pause"]
    assert len(stats["partitions"]) == 36
    # every second of the run, quiet ones included, for every outcome
    seconds = sorted({row["second"] for row in stats["timeline"]})
    assert seconds == list(range(seconds[0], seconds[-1] + 1))
    assert seconds[0] == stats["summary"]["start_ms"] // 1000
    assert seconds[-1] == stats["summary"]["end_ms"] // 1000
    assert stats["run"]["seed"] == 7
    assert document["cluster"]["shards"] == sorted(clean.transitions)
    page = outcome.html_path.read_text()
    sections = ["id='verdict'", "id='run'", "id='checks'", "id='timeline'", "id='terms'",
                "id='leader-changes'", "id='partitions'", "id='totals'"]  # fmt: skip
    assert [page.index(s) for s in sections] == sorted(page.index(s) for s in sections)
    assert page.count("<img ") == page.count("src='data:image/png;base64,") == 4
    assert page.count("data-lanes='leader-kill pause'") == 2  # under both time plots
    shards = re.findall(r"<tr data-shard='(\d+)'>", page)
    assert shards == [str(s) for s in sorted(clean.transitions)]
    assert "transactions committed (commit ok)" in page
    assert "http://" not in page and "https://" not in page


def test_a_run_audited_without_its_history_is_incomplete(
    spark: Any, clean: Run, tmp_path: Path
) -> None:
    cluster, _history = clean.write(tmp_path)
    outcome = audit.run_audit(spark, cluster, None, tmp_path / "report")
    skipped = [r.name for r in outcome.results if r.status == "SKIP"]
    assert skipped and not outcome.failed()
    assert outcome.verdict == "INCOMPLETE"
    document = json.loads(outcome.json_path.read_text())
    assert [r.split(":")[0] for r in document["incomplete"]] == skipped
    page = outcome.html_path.read_text()
    assert "INCOMPLETE" in page and "Not everything was judged" in page
    assert page.index("Not everything was judged") < page.index("<h2>Checks</h2>")


def test_each_planted_anomaly_is_found_by_its_check_only(
    spark: Any, clean: Run, tmp_path: Path
) -> None:
    run = copy.deepcopy(clean)
    pick = Picker(run)
    planted: dict[str, Planted] = {}
    for check, plant in PLANTS:
        more = plant(pick)
        have = planted.setdefault(check, Planted(0, ()))
        have.count += more.count
        have.needles += more.needles
    cluster, history = run.write(tmp_path)
    results = _audit(spark, cluster, history)
    found = {
        name: (r.count, [json.dumps(e, separators=(",", ":")) for e in r.examples])
        for name, r in results.items()
    }
    wrong = [
        (name, expected.count, found.get(name))
        for name, expected in planted.items()
        if name not in found
        or found[name][0] != expected.count
        or not all(any(n in e for n in expected.needles) for e in found[name][1])
    ]
    assert not wrong, "\n".join(map(str, wrong))  # (check, planted, (found, examples))
    assert set(planted) == {name for name, _ in CHECKS}


_SESSION_SCRIPT = """
import json
import sys
from pathlib import Path

from spark.audit import session

root = Path(sys.argv[1])
spark = session("local[1]", shuffle_partitions=1)
assert spark.range(3).count() == 3
before = sorted(str(p) for p in root.rglob("raftcoord_audit.zip"))
spark.stop()
after = sorted(str(p) for p in root.rglob("raftcoord_audit.zip"))
print(json.dumps([before, after]))
"""


def test_a_session_leaves_no_temporary_files_when_it_stops(tmp_path: Path) -> None:
    """The package zip shipped to the executors is gone once the session stopped (its
    own process: stopping the shared session would stop the other tests')."""
    temp, local = tmp_path / "tmp", tmp_path / "local"
    temp.mkdir()
    local.mkdir()
    env = {
        **os.environ,
        "TMPDIR": str(temp),
        "SPARK_LOCAL_DIRS": str(local),
        "RAFTCOORD_AUDIT_DRIVER_MEMORY": "512m",
    }
    done = subprocess.run(
        [sys.executable, "-c", _SESSION_SCRIPT, str(tmp_path)],
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert before  # shipped while the session ran
    assert after == []
    assert list(temp.glob("raftcoord-audit-*")) == []


def test_each_kind_of_divergence_shows_among_many_of_another_and_faults_are_judged(
    spark: Any, clean: Run, tmp_path: Path
) -> None:
    """replica-divergence keeps examples per kind: seven replicas' different
    transitions (whose rows sort first) do not hide a partition replica's
    other record nor a replica's missing entry. The same audit holds the
    run's fault report (the history's summary) to the verdict rule: a kind
    asked for that changed nothing is named among what is incomplete."""
    run = copy.deepcopy(clean)
    pick = Picker(run)
    transitions = run.transitions[0]
    lines = [i for i, t in enumerate(transitions) if t["to"] == "COMPLETE_COMMIT"][:7]
    assert len(lines) == 7
    run.replica_edits[(2, 0)] = {
        i: dict(transitions[i], time_ms=transitions[i]["time_ms"] + 5) for i in lines
    }
    plant_partition_replicas(pick)
    plant_replica_hole(pick)
    summary = run.events[-1]["summary"]
    summary["fault_report"] = [
        {"fault": "leader-kill", "happened": 1, "changed": 1, "not_run": ""},
        {"fault": "pause", "happened": 1, "changed": 0, "not_run": ""},
    ]
    cluster, history = run.write(tmp_path)
    outcome = audit.run_audit(spark, cluster, history, tmp_path / "report")
    (divergence,) = [r for r in outcome.results if r.name == "replica-divergence"]
    assert divergence.count == 9, divergence
    kinds = [e["problem"] for e in divergence.examples]
    assert sorted(set(kinds)) == [
        "different transitions",
        "entry missing from a replica",
        "partition replicas differ",
    ], kinds
    assert kinds.count("different transitions") == 5  # checks.EXAMPLES of that kind
    document = outcome.document
    assert document["verdict"] == "FAIL"
    assert document["failed"] == ["replica-divergence: 9 violations"]
    assert document["incomplete"] == [
        "fault pause never changed anything the cluster or the clients saw (1 ended)"
    ]
    page = outcome.html_path.read_text()
    assert "data-fault='pause'" in page and "data-fault='leader-kill'" in page
    assert "none: the history records no fault" not in page
