"""The history checker passes a clean history and flags each planted anomaly, and only it.

The histories are built here by ``Run``, a toy model of the cluster (logs
with control records, read_committed up to the first open transaction, a
consumer group's committed offsets) that records what a workload would:
producers committing and aborting over several partitions, commits of
unknown outcome, a fenced producer, a consume-transform-produce worker that
aborts and rewinds, pollers, faults and the final read.

Long on purpose: the cases of one component, sharing this module's helpers
and fixtures.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.history_checker import INVARIANTS, MALFORMED, check, main

ROOT = Path(__file__).resolve().parents[1]

VALUES, INPUT, OUTPUT = "values", "input", "output"
TOPICS = {VALUES: 3, INPUT: 2, OUTPUT: 2}
INPUTS_PER_PARTITION = 5
#: What the pollers read.
POLLED = [(VALUES, p) for p in range(TOPICS[VALUES])] + [(OUTPUT, p) for p in range(TOPICS[OUTPUT])]

Event = dict[str, Any]


@dataclass
class Record:
    offset: int
    value: str | None  # None for a control record
    state: str  # "open", "committed", "aborted" or "control"


class Run:
    """A workload's history over a toy cluster."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.logs: dict[tuple[str, int], list[Record]] = defaultdict(list)
        self.positions: dict[tuple[str, str, int], int] = defaultdict(int)
        self.committed: dict[int, int] = {}  # input partition -> the group's next offset
        self.producer_ids: dict[str, int] = {}
        self.epochs: Counter[str] = Counter()
        self.txn_counts: Counter[str] = Counter()
        #: process -> its open transaction: name, writes, the records it appended.
        self.open: dict[str, tuple[str, list[tuple[str, int, str]], list[Record]]] = {}
        for partition in range(TOPICS[INPUT]):
            for n in range(INPUTS_PER_PARTITION):
                self.append(INPUT, partition, f"in-{partition}-{n}", "committed")
        self.event(
            "workload",
            "info",
            "run",
            seed=7,
            topics=TOPICS,
            input_topic=INPUT,
            output_topic=OUTPUT,
            group="ctp",
            bootstrap=["127.0.0.1:1"],
            args={},
        )

    def event(self, process: str, type: str, op: str, **fields: Any) -> None:
        n = len(self.events)
        self.events.append(
            {
                "time_ms": 1.7e12 + n,
                "mono_ns": n * 1000,
                "process": process,
                "type": type,
                "op": op,
                **fields,
            }
        )

    def call(
        self,
        process: str,
        op: str,
        outcome: str = "ok",
        error: str | None = None,
        result: dict[str, Any] | None = None,
        **fields: Any,
    ) -> None:
        self.event(process, "invoke", op, **fields)
        if error is not None:
            fields = {**fields, "error": error}
        self.event(process, outcome, op, **fields, **(result or {}))

    def append(self, topic: str, partition: int, value: str | None, state: str) -> Record:
        log = self.logs[(topic, partition)]
        log.append(Record(len(log), value, state))
        return log[-1]

    # Producers and workers.

    def init(self, process: str) -> None:
        """A new producer for the process's transactional id: the same id, the next epoch."""
        self.producer_ids.setdefault(process, 1000 + len(self.producer_ids))
        self.epochs[process] += 1
        self.call(process, "init", result=self.identity(process))

    def identity(self, process: str) -> dict[str, int]:
        return {"producer_id": self.producer_ids[process], "producer_epoch": self.epochs[process]}

    def begin(self, process: str) -> str:
        txn = f"{process}:{self.txn_counts[process]}"
        self.txn_counts[process] += 1
        self.open[process] = (txn, [], [])
        return txn

    def send(
        self,
        process: str,
        topic: str,
        partition: int,
        value: str,
        outcome: str = "ok",
        source: list[Any] | None = None,
    ) -> None:
        txn, writes, records = self.open[process]
        writes.append((topic, partition, value))
        invoke = {
            "txn": txn,
            "topic": topic,
            "partition": partition,
            "value": value,
            **({"source": source} if source else {}),
            **self.identity(process),
        }
        if outcome == "fail":
            self.call(process, "send", "fail", error="KafkaError", **invoke)
        else:
            records.append(self.append(topic, partition, value, "open"))
            self.call(process, "send", result={"offset": records[-1].offset}, **invoke)

    def end(
        self,
        process: str,
        op: str,
        outcome: str = "ok",
        error: str | None = None,
        visible: bool | None = None,
    ) -> None:
        """Commit or abort; ``visible`` (default: a commit ok) is what the markers say."""
        txn, writes, records = self.open[process]
        visible = op == "commit" and outcome == "ok" if visible is None else visible
        self.call(
            process,
            op,
            outcome,
            error,
            txn=txn,
            writes=[list(w) for w in writes],
            **self.identity(process),
        )
        if outcome == "fail" and error != "ProducerFencedError":
            return  # still open: the process aborts it next
        for record in records:
            record.state = "committed" if visible else "aborted"
        for topic, partition in dict.fromkeys((t, p) for t, p, _ in writes):
            self.append(topic, partition, None, "control")
        del self.open[process]

    def transaction(
        self, process: str, partitions: list[tuple[str, int]], op: str = "commit", **end: Any
    ) -> str:
        txn = self.begin(process)
        for n, (topic, partition) in enumerate(partitions):
            self.send(process, topic, partition, f"{txn}#{n}")
        self.end(process, op, **end)
        return txn

    def transform(
        self,
        process: str,
        partition: int,
        count: int,
        op: str = "commit",
        reverse: bool = False,
        skip: int = 0,
    ) -> None:
        """A worker's transaction: outputs for ``count`` inputs (but the ``skip`` first),
        in ``reverse`` order if asked, then its input offsets and the end."""
        reads = self.poll(process, [(INPUT, partition)], limit=count)
        txn = self.begin(process)
        for topic, p, offset, value in (reads[::-1] if reverse else reads)[skip:]:
            self.send(process, OUTPUT, p, f"{txn}/{value}", source=[topic, p, offset, value])
        next_offset = reads[-1][2] + 1
        self.call(
            process,
            "offsets",
            txn=txn,
            group="ctp",
            offsets=[[INPUT, partition, next_offset]],
            **self.identity(process),
        )
        self.end(process, op)
        if op == "commit":
            self.committed[partition] = next_offset
        else:  # rewind to the group's offset, as a worker does after an abort
            self.seek(process, partition, self.committed.get(partition, 0))

    def seek(self, process: str, partition: int, offset: int) -> None:
        self.positions[(process, INPUT, partition)] = offset

    # Readers.

    def read(
        self, topic: str, partition: int, start: int, limit: int | None = None
    ) -> tuple[list[list[Any]], int]:
        """read_committed from ``start``: (records, next position), stopping at an open one."""
        reads: list[list[Any]] = []
        position = start
        for record in self.logs[(topic, partition)][start:]:
            if record.state == "open" or (limit is not None and len(reads) == limit):
                break
            if record.state == "committed":
                reads.append([topic, partition, record.offset, record.value])
            position = record.offset + 1
        return reads, position

    def poll(
        self, process: str, partitions: list[tuple[str, int]], limit: int | None = None
    ) -> list[list[Any]]:
        reads = []
        for topic, partition in partitions:
            key = (process, topic, partition)
            got, self.positions[key] = self.read(topic, partition, self.positions[key], limit)
            reads += got
        self.call(
            process,
            "poll",
            result={"reads": reads},
            isolation="read_committed",
            partitions=[list(tp) for tp in partitions],
        )
        return reads

    def fault(self, fault: str, targets: list[Any], phase: str) -> None:
        self.event(
            "nemesis",
            "info",
            "fault",
            phase=phase,
            fault=fault,
            targets=targets,
            detail=f"{fault} {targets}",
        )

    def finish(self) -> list[Event]:
        """Pollers catch up (one poll comes back empty), the final read, the run's end."""
        for poller in ("poller-0", "poller-1", "poller-0"):
            self.poll(poller, POLLED)
        reads = []
        for topic, partition in sorted(self.logs):
            reads += self.read(topic, partition, 0)[0]
        self.event(
            "workload",
            "ok",
            "final",
            reads=reads,
            end_offsets={f"{t}/{p}": len(log) for (t, p), log in self.logs.items()},
            committed={f"{INPUT}/{p}": n for p, n in self.committed.items()},
        )
        self.event("workload", "ok", "run", summary={})
        return self.events


def clean_run(**last_transform: Any) -> Run:
    """Everything a chaos run records, all of it correct (``last_transform``: options of the
    worker's last transaction)."""
    run = Run()
    for process in ("txn-0", "txn-1", "ctp-0"):
        run.init(process)
    run.transaction("txn-0", [(VALUES, 0), (VALUES, 1), (VALUES, 2), (VALUES, 0)])
    run.poll("poller-0", POLLED)
    run.transaction("txn-1", [(VALUES, 1), (VALUES, 2)], "abort")
    # A commit of unknown outcome that went through, with a poll while it is open.
    run.fault("leader-kill", [2], "start")
    run.begin("txn-0")
    run.send("txn-0", VALUES, 0, "txn-0:1#0")
    run.poll("poller-1", POLLED)
    run.send("txn-0", VALUES, 2, "txn-0:1#1")
    run.end("txn-0", "commit", "info", "KafkaTimeoutError", visible=True)
    run.fault("leader-kill", [2], "end")
    run.init("txn-0")
    # A failed send: the commit fails, the process aborts.
    run.begin("txn-1")
    run.send("txn-1", VALUES, 0, "txn-1:1#0")
    run.send("txn-1", VALUES, 1, "txn-1:1#1", outcome="fail")
    run.end("txn-1", "commit", "fail", "KafkaError")
    run.end("txn-1", "abort")
    # Fenced while paused, then a new producer.
    run.fault("pause", [1], "start")
    run.transaction(
        "txn-1",
        [(VALUES, 2), (VALUES, 1)],
        "commit",
        outcome="fail",
        error="ProducerFencedError",
        visible=False,
    )
    run.fault("pause", [1], "end")
    run.init("txn-1")
    # A commit of unknown outcome that did not go through.
    run.transaction(
        "txn-0",
        [(VALUES, 1), (VALUES, 2)],
        "commit",
        outcome="info",
        error="KafkaTimeoutError",
        visible=False,
    )
    run.init("txn-0")
    run.transaction("txn-1", [(VALUES, 0), (VALUES, 1), (VALUES, 2)])
    # The worker: an aborted transaction, a rewind, a partition-log restart.
    run.transform("ctp-0", 0, 3)
    run.poll("poller-1", POLLED)
    run.transform("ctp-0", 1, 2, "abort")
    run.fault("plog-restart", [101], "start")
    run.transform("ctp-0", 1, INPUTS_PER_PARTITION)
    run.fault("plog-restart", [101], "end")
    run.poll("poller-0", POLLED)
    run.transform("ctp-0", 0, **{"count": 2, **last_transform})
    return run


def write(path: Path, events: list[Event]) -> Path:
    path.write_text("".join(json.dumps({"index": n, **e}) + "\n" for n, e in enumerate(events)))
    return path


def violations(path: Path) -> dict[str, list[dict[str, Any]]]:
    return {name: found for name, found in check(path).items() if found}


# Edits of a finished history.


def final(events: list[Event]) -> Event:
    return next(e for e in events if e["op"] == "final")


def polls(events: list[Event], process: str | None = None) -> list[Event]:
    """The pollers' (or ``process``'s) completed polls."""
    return [
        e
        for e in events
        if e["op"] == "poll"
        and e["type"] == "ok"
        and e["process"].startswith("poller")
        and process in (None, e["process"])
    ]


def forget(value: str, where: list[Event]) -> None:
    """Take ``value`` out of the reads of the events ``where``."""
    for event in where:
        event["reads"] = [r for r in event["reads"] if r[3] != value]


def show(events: list[Event], value: str, topic: str, partition: int) -> None:
    """Put ``value`` in the final read, past every record of the partition."""
    reads = final(events)["reads"]
    offset = 1 + max(r[2] for r in reads if (r[0], r[1]) == (topic, partition))
    reads.append([topic, partition, offset, value])


def test_the_checker_judges_every_invariant_of_the_documentation(tmp_path: Path) -> None:
    table = (ROOT / "docs" / "history.md").read_text().split("## The invariants")[1]
    documented = set(re.findall(r"^\| `([a-z-]+)`(?:, `([a-z-]+)`)? \|", table, re.M))
    names = {name for row in documented for name in row if name}
    assert names == set(INVARIANTS)
    assert set(check(write(tmp_path / "h.jsonl", clean_run().finish()))) == {*names, MALFORMED}


def test_the_checker_imports_only_the_standard_library() -> None:
    tree = ast.parse((ROOT / "tests" / "history_checker.py").read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported - {"__future__"} <= sys.stdlib_module_names


def test_a_clean_run_passes(tmp_path: Path) -> None:
    events = clean_run().finish()
    results = check(write(tmp_path / "h.jsonl", events))
    assert results == {name: [] for name in (*INVARIANTS, MALFORMED)}
    # The run has what makes it a test: gaps of control records and aborted
    # records in the final read, an empty poll, every kind of transaction end.
    offsets = [r[2] for r in final(events)["reads"] if r[:2] == [VALUES, 1]]
    assert offsets != list(range(len(offsets)))
    assert any(not e["reads"] for e in polls(events))
    ends = {(e["op"], e["type"]) for e in events if e["op"] in ("commit", "abort")}
    assert ends >= {("commit", "ok"), ("commit", "fail"), ("commit", "info"), ("abort", "ok")}


def test_lost_write(tmp_path: Path) -> None:
    events = clean_run().finish()
    forget("txn-0:0#1", [final(events)])
    found = violations(write(tmp_path / "h.jsonl", events))
    assert list(found) == ["lost-write"]
    assert found["lost-write"] == [
        {
            "txn": "txn-0:0",
            "value": "txn-0:0#1",
            "topic": VALUES,
            "partition": 1,
            "index": found["lost-write"][0]["index"],
        }
    ]


def test_a_polled_value_the_final_read_lacks_is_lost(tmp_path: Path) -> None:
    # txn-0:1's commit timed out, but pollers saw it: it committed.
    events = clean_run().finish()
    for value in ("txn-0:1#0", "txn-0:1#1"):
        forget(value, [final(events)])
    found = violations(write(tmp_path / "h.jsonl", events))
    assert list(found) == ["lost-write"]
    assert {v["value"] for v in found["lost-write"]} == {"txn-0:1#0", "txn-0:1#1"}


def test_duplicate(tmp_path: Path) -> None:
    events = clean_run().finish()
    show(events, "txn-0:0#2", VALUES, 2)
    found = violations(write(tmp_path / "h.jsonl", events))
    assert list(found) == ["duplicate"]
    [duplicate] = found["duplicate"]
    assert duplicate["value"] == "txn-0:0#2" and len(duplicate["offsets"]) == 2


@pytest.mark.parametrize("where", ["final", "poll"])
def test_aborted_read(tmp_path: Path, where: str) -> None:
    events = clean_run().finish()
    if where == "final":
        show(events, "txn-1:0#0", VALUES, 1)
    else:  # past everything, in the last poll that read something
        last = [e for e in polls(events, "poller-0") if e["reads"]][-1]
        last["reads"].append([VALUES, 1, 1000, "txn-1:0#0"])
    found = violations(write(tmp_path / "h.jsonl", events))
    assert list(found) == ["aborted-read"]
    [aborted] = found["aborted-read"]
    assert (aborted["txn"], aborted["value"]) == ("txn-1:0", "txn-1:0#0")


@pytest.mark.parametrize(
    ("value", "partition"),
    [
        ("txn-1:1#0", 0),  # its commit failed, then it aborted
        ("txn-1:2#0", 2),  # fenced: its commit failed with ProducerFencedError
    ],
)
def test_a_fenced_or_failed_transaction_is_aborted(
    tmp_path: Path, value: str, partition: int
) -> None:
    events = clean_run().finish()
    show(events, value, VALUES, partition)
    assert list(violations(write(tmp_path / "h.jsonl", events))) == ["aborted-read"]


def test_torn_transaction(tmp_path: Path) -> None:
    # txn-0:1's commit timed out: all of it or none, not half.
    events = clean_run().finish()
    forget("txn-0:1#1", [final(events), *polls(events)])
    found = violations(write(tmp_path / "h.jsonl", events))
    assert list(found) == ["torn-transaction"]
    [torn] = found["torn-transaction"]
    assert torn["txn"] == "txn-0:1" and torn["missing"] == [[VALUES, 2, "txn-0:1#1"]]


def test_nonmonotonic_poll(tmp_path: Path) -> None:
    events = clean_run().finish()
    last = [e for e in polls(events, "poller-0") if e["reads"]][-1]
    again = last["reads"][-1]
    last["reads"].append(list(again))
    found = violations(write(tmp_path / "h.jsonl", events))
    assert list(found) == ["nonmonotonic-poll"]
    [back] = found["nonmonotonic-poll"]
    assert (back["process"], back["offset"], back["previous_offset"]) == (
        "poller-0",
        again[2],
        again[2],
    )


def test_skipped_poll(tmp_path: Path) -> None:
    # poller-0 jumps over the first record of values/0 (poller-1 still reads it).
    events = clean_run().finish()
    first = polls(events, "poller-0")[0]
    skipped = next(r for r in first["reads"] if r[:2] == [VALUES, 0])
    first["reads"].remove(skipped)
    found = violations(write(tmp_path / "h.jsonl", events))
    assert list(found) == ["skipped-poll"]
    [skip] = found["skipped-poll"]
    assert (skip["process"], skip["skipped"], skip["previous_offset"]) == (
        "poller-0",
        [skipped[2]],
        -1,
    )


def test_a_partition_that_leaves_a_pollers_assignment_starts_over(tmp_path: Path) -> None:
    run = clean_run()
    run.poll("poller-0", POLLED[1:])
    run.positions[("poller-0", VALUES, 0)] = 0
    run.poll("poller-0", POLLED)
    assert violations(write(tmp_path / "h.jsonl", run.finish())) == {}


def test_pipeline_duplicate(tmp_path: Path) -> None:
    # The worker reprocesses partition 0's last input and commits it again.
    run = clean_run()
    run.seek("ctp-0", 0, INPUTS_PER_PARTITION - 1)
    run.transform("ctp-0", 0, 1)
    found = violations(write(tmp_path / "h.jsonl", run.finish()))
    assert list(found) == ["duplicate"]
    [duplicate] = found["duplicate"]
    assert duplicate["source"] == [INPUT, 0, INPUTS_PER_PARTITION - 1, "in-0-4"]
    assert duplicate["txns"] == ["ctp-0:3", "ctp-0:4"]


@pytest.mark.parametrize(
    ("plant", "problem"),
    [
        ({"skip": 1}, "consumed input without a visible output"),
        ({"count": 1}, "committed offset short of the input's last record"),
    ],
    ids=["no-output", "unconsumed"],
)
def test_pipeline_missing_output(tmp_path: Path, plant: dict[str, int], problem: str) -> None:
    found = violations(write(tmp_path / "h.jsonl", clean_run(**plant).finish()))
    assert list(found) == ["exactly-once-pipeline"]
    assert [v["problem"] for v in found["exactly-once-pipeline"]] == [problem]


def test_pipeline_output_of_an_input_past_the_committed_offset(tmp_path: Path) -> None:
    events = clean_run().finish()
    final(events)["committed"][f"{INPUT}/1"] -= 1  # and the end: short of the last input
    found = violations(write(tmp_path / "h.jsonl", events))
    assert list(found) == ["exactly-once-pipeline"]
    assert sorted(v["problem"] for v in found["exactly-once-pipeline"]) == [
        "committed offset short of the input's last record",
        "output of an input past the committed offset",
    ]


def test_outputs_out_of_order(tmp_path: Path) -> None:
    found = violations(write(tmp_path / "h.jsonl", clean_run(reverse=True).finish()))
    assert list(found) == ["order"]
    [order] = found["order"]
    assert order["input"] == [INPUT, 0] and order["source_offsets"] == [4, 3]


def test_unseen(tmp_path: Path) -> None:
    # The last record of values/1 was the pollers' last read there; drop it.
    events = clean_run().finish()
    last = [r for r in final(events)["reads"] if r[:2] == [VALUES, 1]][-1]
    forget(last[3], polls(events))
    found = violations(write(tmp_path / "h.jsonl", events))
    assert list(found) == ["unseen"]
    assert [v["value"] for v in found["unseen"]] == [last[3]]


def test_an_unfinished_transaction(tmp_path: Path) -> None:
    events = [
        e for e in clean_run().finish() if not (e["op"] == "abort" and e.get("txn") == "txn-1:0")
    ]
    found = violations(write(tmp_path / "h.jsonl", events))
    assert list(found) == ["liveness"]
    assert [(v["txn"], v["writes"]) for v in found["liveness"]] == [("txn-1:0", 2)]


def drop_last_completion(events: list[Event]) -> list[Event]:
    """poller-0's last poll (an empty one) never completes."""
    last = max(i for i, e in enumerate(events) if e["op"] == "poll" and e["type"] == "ok")
    assert events[last]["process"] == "poller-0" and not events[last]["reads"]
    return events[:last] + events[last + 1 :]


def complete_twice(events: list[Event]) -> list[Event]:
    last = max(i for i, e in enumerate(events) if e["op"] == "poll" and e["type"] == "ok")
    return [*events[: last + 1], events[last], *events[last + 1 :]]


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (drop_last_completion, "poller-0's poll never completes"),
        (complete_twice, "poller-0 completes poll that it never invoked"),
        (lambda events: [e for e in events if e["op"] != "final"], "no final read"),
        (lambda events: [e for e in events if e["op"] != "run"], "no run event"),
        (lambda events: [e for e in events if e.get("phase") != "end"], "fault pause never ends"),
    ],
    ids=["never-completed", "completed-twice", "no-final", "no-run", "fault-never-ends"],
)
def test_malformed(tmp_path: Path, edit: Any, problem: str) -> None:
    found = violations(write(tmp_path / "h.jsonl", edit(clean_run().finish())))
    assert list(found) == [MALFORMED]
    assert problem in [v["problem"] for v in found[MALFORMED]]


def test_malformed_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "h.jsonl", clean_run().finish())
    lines = path.read_text().splitlines()
    lines[3] = json.dumps({**json.loads(lines[3]), "index": 30})
    lines.insert(5, "{not json")
    lines.insert(6, '{"index": 6, "process": "txn-0"}')
    path.write_text("\n".join(lines) + "\n")
    found = violations(path)
    assert list(found) == [MALFORMED]
    problems = [v["problem"] for v in found[MALFORMED]]
    assert problems[:2] == ["line 4: index 30, 3 expected", "line 5: index 4, 31 expected"]
    assert problems[2].startswith("line 6 is not JSON")
    assert problems[3:] == ["line 7: no str 'type'"]


def corrupt_a_worker_read(events: list[Event]) -> None:
    poll = next(
        e for e in events if e["op"] == "poll" and e["process"] == "ctp-0" and e["type"] == "ok"
    )
    poll["reads"][0][2] = "0"


def corrupt_the_writes(events: list[Event]) -> None:
    next(e for e in events if e["op"] == "commit")["writes"] = "all of them"


def corrupt_the_committed_offsets(events: list[Event]) -> None:
    final(events)["committed"][INPUT] = 5


def corrupt_a_txn(events: list[Event]) -> None:
    send = next(e for e in events if e["op"] == "send" and e["type"] == "invoke")
    send["txn"] = [send["txn"]]


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (corrupt_a_worker_read, "an item of reads is not [str, int, int, str]"),
        (corrupt_the_writes, "writes is not a list"),
        (corrupt_the_committed_offsets, "committed has 'input': 5"),
        (corrupt_a_txn, "send without a txn"),
    ],
    ids=["read", "writes", "committed", "txn"],
)
def test_malformed_fields_are_reported_not_a_crash(tmp_path: Path, edit: Any, problem: str) -> None:
    events = clean_run().finish()
    edit(events)
    found = violations(write(tmp_path / "h.jsonl", events))
    assert list(found) == [MALFORMED]
    assert problem in [v["problem"] for v in found[MALFORMED]]


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clean = write(tmp_path / "clean.jsonl", clean_run().finish())
    assert main([str(clean)]) == 0
    table = capsys.readouterr().out
    assert all(re.search(rf"^{name} +0$", table, re.M) for name in (*INVARIANTS, MALFORMED))
    events = clean_run().finish()
    forget("txn-0:0#1", [final(events)])
    lost = write(tmp_path / "lost.jsonl", events)
    result = subprocess.run(
        [sys.executable, "-m", "tests.history_checker", str(lost)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert re.search(r"^lost-write +1$", result.stdout, re.M) and '"txn-0:0#1"' in result.stdout
    with pytest.raises(SystemExit) as raised:
        main([str(tmp_path / "missing.jsonl")])
    assert raised.value.code == 2 and "cannot read" in capsys.readouterr().err
