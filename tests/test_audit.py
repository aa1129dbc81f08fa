"""The Spark audit: a clean run passes, and each planted anomaly is flagged by its check
and no other (``spark/synthetic.py`` writes the logs, transitions and history; the tests
edit them first). Spark's cost is per job, not per row, so the anomalies are planted
together, each in its own partitions and transactions, into one run: each check must
find exactly its own anomaly. One local SparkSession serves every test (``spark``)."""

from __future__ import annotations

import copy
import dataclasses
import json
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
    """txn -> producer id, epoch, writes [(topic, partition, value)], outcome, in order."""
    txns: dict[str, dict[str, Any]] = {}
    for e in run.events:
        if e["op"] == "send" and e["type"] == "invoke":
            t = txns.setdefault(
                e["txn"], {"pid": e["producer_id"], "epoch": e["producer_epoch"], "writes": []}
            )
            t["writes"].append((e["topic"], e["partition"], e["value"]))
        elif e["op"] in ("commit", "abort") and e["type"] == "ok":
            txns[e["txn"]]["outcome"] = e["op"]
    return txns


def _ending_with_commit(pick: Picker) -> tuple[tuple[str, int], str]:
    """A free partition of EVENTS whose log ends with a free committed transaction's data
    batch and COMMIT marker, with that transaction; both taken."""
    txns = _transactions(pick.run)
    by_batch = {(t["pid"], t["epoch"]): name for name, t in txns.items()}
    for tp, batches in sorted(pick.run.logs.items()):
        if tp[0] != EVENTS or len(batches) < 2:
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
    pick.run.logs[tp].append(dataclasses.replace(marker, epoch=t["epoch"], control=decision))
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


def plant_pipeline(pick: Picker) -> Planted:
    """The worker's committed offset of an input partition stops short of its end."""
    pick.take((INPUT, 0))
    pick.run.committed_delta[(INPUT, 0)] = -1
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
        and e["process"].startswith("txn-")
        and pick.free(txn=e["txn"])
        and all(pick.free((w[0], w[1])) for w in txns[e["txn"]]["writes"])
    )
    pick.take(txn=e["txn"])
    del run.events[i]
    return Planted(1, (e["txn"],))


PLANTS: dict[str, Callable[[Picker], Planted]] = {
    "torn-transaction": plant_torn_transaction,
    "duplicate": plant_duplicate,
    "lost-write": plant_lost_write,
    "one-decision": plant_one_decision,
    "epoch-order": plant_epoch_order,
    "unseen": plant_unseen,
    "aborted-read": plant_aborted_read,
    "uncommitted-read": plant_uncommitted_read,
    "zombie-write": plant_zombie_write,
    "inconsistent-offsets": plant_inconsistent_offsets,
    "nonmonotonic-poll": plant_nonmonotonic_poll,
    "skipped-poll": plant_skipped_poll,
    "replica-divergence": plant_replica_divergence,
    "exactly-once-pipeline": plant_pipeline,
    "liveness": plant_liveness,
}


def test_clean_run_passes_and_reports(spark: Any, clean: Run, tmp_path: Path) -> None:
    cluster, history = clean.write(tmp_path)
    outcome = audit.run_audit(spark, cluster, history, tmp_path / "report")
    assert {r.name: r.status for r in outcome.results} == {n: "PASS" for n, _ in CHECKS}
    assert outcome.verdict == "PASS"
    document = json.loads(outcome.json_path.read_text())
    assert document["verdict"] == "PASS"
    assert [c["name"] for c in document["checks"]] == [n for n, _ in CHECKS]
    assert [w["fault"] for w in document["stats"]["faults"]] == ["leader-kill", "pause"]
    assert len(document["stats"]["partitions"]) == 36
    page = outcome.html_path.read_text()
    assert page.index("PASS") < page.index("Transactions over time") < page.index("Partitions")
    assert page.count("<img src='data:image/png;base64,") == 4
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
    assert "INCOMPLETE" in page and "Not every check ran" in page
    assert page.index("Not every check ran") < page.index("<h2>Checks</h2>")


def test_each_planted_anomaly_is_found_by_its_check_only(
    spark: Any, clean: Run, tmp_path: Path
) -> None:
    run = copy.deepcopy(clean)
    pick = Picker(run)
    planted = {check: plant(pick) for check, plant in PLANTS.items()}
    cluster, history = run.write(tmp_path)
    # A damaged batch, in a partition no plant touched: its CRC no longer matches.
    spare = next(p for p in range(12) if (EVENTS, p) not in pick.partitions)
    segment = next(cluster.glob(f"partition-node-*/{EVENTS}-{spare}/*.log"))
    data = bytearray(segment.read_bytes())
    data[17] ^= 0xFF
    segment.write_bytes(bytes(data))
    planted["unreadable-data"] = Planted(1, ("CRC-32C mismatch",))
    results = _audit(spark, cluster, history)
    assert set(planted) == {name for name, _ in CHECKS}
    found = {
        name: (r.count, [json.dumps(e, separators=(",", ":")) for e in r.examples])
        for name, r in results.items()
    }
    for name, expected in planted.items():
        count, examples = found[name]
        assert count == expected.count, (name, found[name])
        assert all(any(n in e for n in expected.needles) for e in examples), (name, found[name])
