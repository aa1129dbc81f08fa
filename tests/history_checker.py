"""An independent checker for workload histories (docs/history.md).

It reads the JSON-lines history and decides every invariant of the table in
docs/history.md, using the standard library only and no code of the project:
what it knows about Kafka it knows from the history alone. ``check(path)``
maps each invariant name (and ``malformed``, for a history that breaks its
own format) to a list of violations, each a small dict naming the events
(``index``), transactions, values and offsets involved; all lists empty means
the run is clean.

The definitions follow Jepsen's Kafka workload where it has them:

* a transaction's outcome is *committed* (``commit`` ok), *aborted* (an
  ``abort`` ok, or a ``commit`` fail or ``abort`` fail/info with no
  ``commit`` info before), *unknown* (``commit`` info, not followed by an
  ``abort`` ok) or *open* (no end at all: ``liveness``);
* ``lost-write``: a write of a committed transaction missing from the final
  read at its partition, or a value a read_committed poll returned (and that
  no aborted transaction wrote) missing from the final read;
* ``duplicate``: one value at more than one (topic, partition, offset) over
  the final read and every poll, or one input record with more than one
  visible output;
* ``aborted-read``: a value of an aborted transaction in the final read or in
  a read_committed poll;
* ``torn-transaction``: a transaction of unknown outcome (or still open) with
  some of its writes visible in the final read and some not (a committed one
  missing writes is a ``lost-write``, an aborted one showing any is an
  ``aborted-read``);
* ``nonmonotonic-poll``: a poller reads offset o of a partition after having
  read o' >= o there (successive reads, within a poll or across polls);
* ``skipped-poll``: successive reads of a partition by a poller (its first
  read starts from the beginning) jump over the offset of a record the final
  read shows; control records and aborted records take offsets too, so
  only the visible records' offsets count. A poller has no seek: a
  partition leaving its assignment and coming back starts over from the
  beginning;
* ``exactly-once-pipeline``: an input record below the group's committed
  offset without a visible output, a visible output made from an input at
  or past the committed offset (or from a record the input partition does
  not hold at that offset), or a committed offset short of the input's
  last visible record (or past its end offset);
* ``order``: the visible outputs of one input partition are not in input
  offset order in their output partition, or are not in the output
  partition of the same number;
* ``unseen``: a visible write of a transaction that is not aborted which no
  poller read (a committed write missing from the final read is a
  ``lost-write`` instead);
* ``liveness``: a transaction with no end (``commit``/``abort`` completion).

``python -m tests.history_checker HISTORY`` prints a table of the counts and
the violations, and exits 1 when there is any (2 when the file cannot be
read).

One file on purpose (about 760 lines): it is a standalone program that
shares no code with the workload, so a bug in one cannot hide in the other.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INVARIANTS = (
    "lost-write",
    "duplicate",
    "aborted-read",
    "torn-transaction",
    "nonmonotonic-poll",
    "skipped-poll",
    "exactly-once-pipeline",
    "order",
    "unseen",
    "liveness",
)
MALFORMED = "malformed"

COMPLETIONS = frozenset({"ok", "fail", "info"})
#: Ops recorded as a single event, with no invoke before them.
STANDALONE_OPS = frozenset({"run", "fault", "final"})
#: Ops that belong to a transaction and must name it.
TXN_OPS = frozenset({"send", "offsets", "commit", "abort"})

COMMITTED, ABORTED, UNKNOWN, OPEN = "committed", "aborted", "unknown", "open"

#: How many skipped offsets a skipped-poll violation lists.
SKIPPED_SHOWN = 10

Event = dict[str, Any]
Violation = dict[str, Any]
TP = tuple[str, int]


@dataclass(frozen=True)
class Read:
    """One record returned by a poll or by the final read."""

    topic: str
    partition: int
    offset: int
    value: str
    index: int  # the poll's (or final read's) completion event
    process: str
    read_committed: bool

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)

    @property
    def where(self) -> list[Any]:
        return [self.topic, self.partition, self.offset]


#: Input record (topic, partition, offset) -> its visible outputs and the sources they name.
Outputs = dict[tuple[str, int, int], list[tuple[Read, list[Any]]]]


@dataclass
class Txn:
    name: str
    process: str
    first_index: int
    #: value -> (topic, partition), for every send invoked in it.
    writes: dict[str, TP] = field(default_factory=dict)
    #: value -> [topic, partition, offset, value] of its input (workers).
    sources: dict[str, list[Any]] = field(default_factory=dict)
    #: (op, type, index) of each commit/abort completion.
    ends: list[tuple[str, str, int]] = field(default_factory=list)
    #: The ``writes`` listed by each commit/abort invoke: (index, set).
    listed: list[tuple[int, set[tuple[str, int, str]]]] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        ends = {(op, kind) for op, kind, _ in self.ends}
        if ("commit", "ok") in ends:
            return COMMITTED
        if ("abort", "ok") in ends:
            return ABORTED
        if ("commit", "info") in ends:
            # A failed (or unknown) abort after an unknown commit does not
            # settle it: the commit may have gone through.
            return UNKNOWN
        return ABORTED if ends else OPEN

    @property
    def end_index(self) -> int | None:
        return self.ends[-1][2] if self.ends else None


def _violation(**fields: Any) -> Violation:
    return {key: value for key, value in fields.items() if value is not None}


class History:
    """A parsed history: transactions, reads, the final read, and what is malformed."""

    def __init__(self, lines: Iterable[str]) -> None:
        self.malformed: list[Violation] = []
        self.run: Event = {}
        self.final: Event | None = None
        self.txns: dict[str, Txn] = {}
        self.txn_of: dict[str, Txn] = {}  # value -> the transaction that sent it
        self.polls: list[Read] = []
        self.final_reads: list[Read] = []
        #: The final read's ``committed`` and ``end_offsets``.
        self.committed: dict[TP, int] = {}
        self.end_offsets: dict[TP, int] = {}
        #: (process, index, partitions) of every poll invoke, in order.
        self.assignments: list[tuple[str, int, set[TP]]] = []
        self._outstanding: dict[str, Event] = {}
        self._faults: dict[str, list[int]] = defaultdict(list)
        for event in self._events(lines):
            self._add(event)
        self._finish()

    def _bad(self, index: int | None, problem: str) -> None:
        self.malformed.append(_violation(index=index, problem=problem))

    def _events(self, lines: Iterable[str]) -> Iterator[Event]:
        expected = 0
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError as error:
                self._bad(None, f"line {number} is not JSON: {error}")
                continue
            if not isinstance(event, dict):
                self._bad(None, f"line {number} is not a JSON object")
                continue
            problem = _shape_problem(event)
            if problem:
                self._bad(event.get("index"), f"line {number}: {problem}")
                continue
            if event["index"] != expected:
                self._bad(
                    event["index"], f"line {number}: index {event['index']}, {expected} expected"
                )
            expected = event["index"] + 1
            yield event

    def _add(self, event: Event) -> None:
        process, kind, op, index = event["process"], event["type"], event["op"], event["index"]
        if kind == "invoke":
            pending = self._outstanding.get(process)
            if pending is not None:
                self._bad(
                    index,
                    f"{process} invokes {op} while its {pending['op']} "
                    f"(index {pending['index']}) is not complete",
                )
            self._outstanding[process] = event
            self._invoke(event)
            return
        invoke = self._outstanding.pop(process, None)
        if invoke is None:
            if op in STANDALONE_OPS:
                self._standalone(event)
            else:
                self._bad(index, f"{process} completes {op} that it never invoked")
        elif invoke["op"] != op:
            self._bad(
                index,
                f"{process} completes {op} but invoked {invoke['op']} (index {invoke['index']})",
            )
        else:
            self._complete(invoke, event)

    def _txn(self, event: Event) -> Txn | None:
        name = event.get("txn")
        if not isinstance(name, str):
            self._bad(event["index"], f"{event['op']} without a txn")
            return None
        txn = self.txns.get(name)
        if txn is None:
            txn = self.txns[name] = Txn(name, event["process"], event["index"])
        elif txn.ends and event["op"] in ("send", "offsets"):
            self._bad(
                event["index"], f"{event['op']} in {name}, which ended at index {txn.end_index}"
            )
        return txn

    def _invoke(self, event: Event) -> None:
        op, index = event["op"], event["index"]
        if op not in TXN_OPS:
            if op == "poll":
                partitions = self._tuples(event, "partitions", (str, int))
                self.assignments.append((event["process"], index, set(partitions)))
            return
        txn = self._txn(event)
        if txn is None:
            return
        if op == "send":
            if not _shaped(
                [event.get(k) for k in ("topic", "partition", "value")], (str, int, str)
            ):
                self._bad(index, "send without a str topic and value and an int partition")
                return
            value, topic, partition = event["value"], event["topic"], event["partition"]
            if value in self.txn_of:
                self._bad(index, f"value {value!r} sent again (first in {self.txn_of[value].name})")
            self.txn_of[value] = txn
            txn.writes[value] = (topic, partition)
            if event.get("source") is not None:
                if _shaped(event["source"], (str, int, int, str)):
                    txn.sources[value] = event["source"]
                else:
                    self._bad(
                        index, f"source is not [topic, partition, offset, value]: {event['source']}"
                    )
        elif op in ("commit", "abort"):
            txn.listed.append((index, set(self._tuples(event, "writes", (str, int, str)))))

    def _tuples(self, event: Event, key: str, kinds: tuple[type, ...]) -> list[tuple[Any, ...]]:
        """``event[key]``, a list of lists shaped like ``kinds``, as tuples (bad ones reported)."""
        items = event.get(key, [])
        if not isinstance(items, list):
            self._bad(event["index"], f"{key} is not a list")
            return []
        good = [tuple(item) for item in items if _shaped(item, kinds)]
        if len(good) != len(items):
            names = ", ".join(kind.__name__ for kind in kinds)
            self._bad(event["index"], f"an item of {key} is not [{names}]")
        return good

    def _complete(self, invoke: Event, event: Event) -> None:
        op, index = event["op"], event["index"]
        if op in ("commit", "abort"):
            name = invoke.get("txn")
            txn = self.txns.get(name) if isinstance(name, str) else None
            if txn is not None:
                txn.ends.append((op, event["type"], index))
        elif op == "poll" and event["type"] == "ok":
            read_committed = invoke.get("isolation") == "read_committed"
            self.polls += self._reads(event, read_committed)

    def _standalone(self, event: Event) -> None:
        op, index = event["op"], event["index"]
        if op == "run" and not self.run:
            self.run = event
        elif op == "fault":
            fault = str(event.get("fault"))
            if event.get("phase") == "start":
                self._faults[fault].append(index)
            elif self._faults[fault]:
                self._faults[fault].pop()
            else:
                self._bad(index, f"fault {fault} ends but never started")
        elif op == "final":
            if self.final is not None:
                self._bad(index, f"a second final read (the first is index {self.final['index']})")
                return
            self.final = event
            self.final_reads = self._reads(event, read_committed=True)
            self.committed = self._offsets(event, "committed")
            self.end_offsets = self._offsets(event, "end_offsets")

    def _reads(self, event: Event, read_committed: bool) -> list[Read]:
        return [
            Read(topic, partition, offset, value, event["index"], event["process"], read_committed)
            for topic, partition, offset, value in self._tuples(
                event, "reads", (str, int, int, str)
            )
        ]

    def _offsets(self, event: Event, key: str) -> dict[TP, int]:
        """``{"topic/partition": n}`` -> ``{(topic, partition): n}``."""
        offsets = event.get(key, {})
        if not isinstance(offsets, dict):
            self._bad(event["index"], f"{key} is not an object")
            return {}
        parsed = {}
        for name, offset in offsets.items():
            topic, _, partition = name.rpartition("/")
            if topic and partition.isdigit() and isinstance(offset, int):
                parsed[(topic, int(partition))] = offset
            else:
                self._bad(event["index"], f"{key} has {name!r}: {offset!r}")
        return parsed

    def _finish(self) -> None:
        for process, invoke in self._outstanding.items():
            self._bad(invoke["index"], f"{process}'s {invoke['op']} never completes")
        for fault, starts in self._faults.items():
            for index in starts:
                self._bad(index, f"fault {fault} never ends")
        if not self.run:
            self._bad(None, "no run event")
        if self.final is None:
            self._bad(None, "no final read")
        for txn in self.txns.values():
            sent = {(t, p, v) for v, (t, p) in txn.writes.items()}
            for index, listed in txn.listed:
                if listed != sent:
                    self._bad(
                        index,
                        f"{txn.name}'s writes {sorted(listed)} are not its sends {sorted(sent)}",
                    )
            outcomes = {(op, kind) for op, kind, _ in txn.ends}
            if {("commit", "ok"), ("abort", "ok")} <= outcomes:
                self._bad(txn.end_index, f"{txn.name} both committed and aborted")


def _shaped(item: Any, kinds: tuple[type, ...]) -> bool:
    """Whether ``item`` is a list of values of exactly the types ``kinds`` (a bool is no int)."""
    return isinstance(item, list) and tuple(map(type, item)) == kinds


def _shape_problem(event: Event) -> str | None:
    for key, kind in (("index", int), ("process", str), ("type", str), ("op", str)):
        if not isinstance(event.get(key), kind):
            return f"no {kind.__name__} {key!r}"
    if event["type"] != "invoke" and event["type"] not in COMPLETIONS:
        return f"unknown type {event['type']!r}"
    return None


class Checker:
    """Decides the invariants on a parsed history."""

    def __init__(self, history: History) -> None:
        self.h = history
        final = history.final_reads
        #: value -> the final read's records of it.
        self.final_of: dict[str, list[Read]] = defaultdict(list)
        #: (topic, partition) -> offset -> record, for the final read.
        self.final_at: dict[TP, dict[int, Read]] = defaultdict(dict)
        for read in final:
            self.final_of[read.value].append(read)
            self.final_at[read.tp][read.offset] = read
        #: (topic, partition) -> sorted offsets of the visible records.
        self.visible = {tp: sorted(records) for tp, records in self.final_at.items()}
        self.polled_by_pollers = {r.value for r in history.polls if _is_poller(r.process)}

    def results(self) -> dict[str, list[Violation]]:
        results: dict[str, list[Violation]] = {name: [] for name in INVARIANTS}
        results["nonmonotonic-poll"], results["skipped-poll"] = self.poll_order()
        results["aborted-read"] = self.aborted_reads()
        results["liveness"] = self.liveness()
        results["duplicate"] = self.duplicates()
        if self.h.final is not None:
            results["lost-write"] = self.lost_writes()
            results["torn-transaction"] = self.torn()
            results["unseen"] = self.unseen()
            results["exactly-once-pipeline"], results["order"] = self.pipeline()
        results[MALFORMED] = self.h.malformed
        return results

    def visible_at(self, value: str, tp: TP) -> Read | None:
        return next((r for r in self.final_of.get(value, []) if r.tp == tp), None)

    def lost_writes(self) -> list[Violation]:
        lost: list[Violation] = []
        reported: set[str] = set()
        for txn in self.h.txns.values():
            if txn.outcome != COMMITTED:
                continue
            for value, (topic, partition) in txn.writes.items():
                if self.visible_at(value, (topic, partition)) is None:
                    reported.add(value)
                    lost.append(
                        _violation(
                            txn=txn.name,
                            value=value,
                            topic=topic,
                            partition=partition,
                            index=txn.end_index,
                            found_at=[r.where for r in self.final_of.get(value, [])] or None,
                        )
                    )
        for read in self.h.polls:
            writer = self.h.txn_of.get(read.value)
            if (
                not read.read_committed
                or read.value in self.final_of
                or read.value in reported
                or (writer and writer.outcome == ABORTED)
            ):
                continue
            reported.add(read.value)
            lost.append(
                _violation(
                    txn=self._txn_name(read.value),
                    value=read.value,
                    topic=read.topic,
                    partition=read.partition,
                    offset=read.offset,
                    index=read.index,
                    read_by=read.process,
                )
            )
        return lost

    def duplicates(self) -> list[Violation]:
        places: dict[str, dict[tuple[str, int, int], list[int]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for read in [*self.h.final_reads, *self.h.polls]:
            places[read.value][(read.topic, read.partition, read.offset)].append(read.index)
        found = [
            _violation(
                value=value,
                txn=self._txn_name(value),
                offsets=[list(at) for at in sorted(where)],
                indexes=sorted({i for indexes in where.values() for i in indexes}),
            )
            for value, where in places.items()
            if len(where) > 1
        ]
        for _, outputs in sorted(self.outputs_by_source().items()):
            if len(outputs) > 1:
                found.append(
                    _violation(
                        source=outputs[0][1],
                        values=[r.value for r, _ in outputs],
                        txns=[self._txn_name(r.value) for r, _ in outputs],
                        offsets=[r.where for r, _ in outputs],
                    )
                )
        return found

    def _txn_name(self, value: str) -> str | None:
        txn = self.h.txn_of.get(value)
        return txn.name if txn else None

    def aborted_reads(self) -> list[Violation]:
        found = []
        for read in [*self.h.final_reads, *self.h.polls]:
            txn = self.h.txn_of.get(read.value)
            if read.read_committed and txn is not None and txn.outcome == ABORTED:
                found.append(
                    _violation(
                        txn=txn.name,
                        value=read.value,
                        topic=read.topic,
                        partition=read.partition,
                        offset=read.offset,
                        index=read.index,
                        read_by=read.process,
                        ended_at=txn.end_index,
                    )
                )
        return found

    def torn(self) -> list[Violation]:
        found = []
        for txn in self.h.txns.values():
            if txn.outcome not in (UNKNOWN, OPEN):
                continue
            visible: list[list[Any]] = []
            missing: list[list[Any]] = []
            for value, (topic, partition) in txn.writes.items():
                seen = self.visible_at(value, (topic, partition)) is not None
                (visible if seen else missing).append([topic, partition, value])
            if visible and missing:
                found.append(
                    _violation(
                        txn=txn.name,
                        outcome=txn.outcome,
                        index=txn.end_index,
                        visible=visible,
                        missing=missing,
                    )
                )
        return found

    def poll_order(self) -> tuple[list[Violation], list[Violation]]:
        """(nonmonotonic-poll, skipped-poll) over every poller's successive reads."""
        nonmonotonic: list[Violation] = []
        skipped: list[Violation] = []
        # (process, topic, partition) -> (offset, index) of its last read.
        last: dict[tuple[str, str, int], tuple[int, int | None]] = {}
        assignments = iter(self.h.assignments)
        assignment = next(assignments, None)
        for read in self.h.polls:
            if not _is_poller(read.process):
                continue
            # A poll completes after its invoke: apply every assignment before it.
            while assignment is not None and assignment[1] < read.index:
                process, _, partitions = assignment
                for key in [k for k in last if k[0] == process and k[1:] not in partitions]:
                    del last[key]
                assignment = next(assignments, None)
            key = (read.process, read.topic, read.partition)
            previous, previous_index = last.get(key, (-1, None))
            last[key] = (read.offset, read.index)
            where = _violation(
                process=read.process,
                topic=read.topic,
                partition=read.partition,
                offset=read.offset,
                value=read.value,
                index=read.index,
                previous_offset=previous,
                previous_index=previous_index,
            )
            if read.offset <= previous:
                nonmonotonic.append(where)
                continue
            offsets = self.visible.get(read.tp, [])
            jumped = offsets[
                bisect.bisect_right(offsets, previous) : bisect.bisect_left(offsets, read.offset)
            ]
            if jumped:
                skipped.append(
                    {**where, "skipped": jumped[:SKIPPED_SHOWN], "skipped_count": len(jumped)}
                )
        return nonmonotonic, skipped

    def outputs_by_source(self) -> Outputs:
        """Each input record (topic, partition, offset) -> its visible outputs, in log order,
        each with the ``source`` its send named."""
        outputs: Outputs = defaultdict(list)
        for read in self.h.final_reads:
            txn = self.h.txn_of.get(read.value)
            source = txn.sources.get(read.value) if txn else None
            if source is not None:
                outputs[(source[0], source[1], source[2])].append((read, source))
        return outputs

    def pipeline(self) -> tuple[list[Violation], list[Violation]]:
        """(exactly-once-pipeline, order) for the workers' input -> output."""
        input_topic = self.h.run.get("input_topic")
        if not isinstance(input_topic, str):
            return [], []
        committed, ends = self.h.committed, self.h.end_offsets
        outputs = self.outputs_by_source()
        broken: list[Violation] = []
        partitions = {p for t, p in [*committed, *ends, *self.final_at] if t == input_topic}
        for partition in sorted(partitions):
            tp = (input_topic, partition)
            position = committed.get(tp, 0)
            inputs = self.visible.get(tp, [])
            if inputs and position <= inputs[-1]:
                broken.append(
                    _violation(
                        problem="committed offset short of the input's last record",
                        topic=input_topic,
                        partition=partition,
                        committed=position,
                        last_offset=inputs[-1],
                    )
                )
            if tp in ends and position > ends[tp]:
                broken.append(
                    _violation(
                        problem="committed offset past the input's end",
                        topic=input_topic,
                        partition=partition,
                        committed=position,
                        end_offset=ends[tp],
                    )
                )
            for offset in inputs[: bisect.bisect_left(inputs, position)]:
                if (input_topic, partition, offset) not in outputs:
                    record = self.final_at[tp][offset]
                    broken.append(
                        _violation(
                            problem="consumed input without a visible output",
                            topic=input_topic,
                            partition=partition,
                            offset=offset,
                            value=record.value,
                        )
                    )
        for (topic, partition, offset), made in sorted(outputs.items()):
            held = self.final_at.get((topic, partition), {}).get(offset)
            past = offset >= committed.get((topic, partition), 0)
            for read, source in made:
                if held is None or held.value != source[3]:
                    problem = "output of a record the input does not hold"
                elif past:
                    problem = "output of an input past the committed offset"
                else:
                    continue
                broken.append(
                    _violation(
                        problem=problem,
                        source=source,
                        value=read.value,
                        txn=self._txn_name(read.value),
                        output=read.where,
                        held=held.value if held else None,
                    )
                )
        return broken, self.order(outputs)

    def order(self, outputs: Outputs) -> list[Violation]:
        wrong: list[Violation] = []
        by_input: dict[TP, list[tuple[Read, int]]] = defaultdict(list)
        for (topic, partition, offset), made in outputs.items():
            for read, _ in made:
                if read.partition != partition:
                    wrong.append(
                        _violation(
                            problem="output not in the input's partition number",
                            value=read.value,
                            output=read.where,
                            source=[topic, partition, offset],
                        )
                    )
                else:
                    by_input[(topic, partition)].append((read, offset))
        for (topic, partition), pairs in sorted(by_input.items()):
            pairs.sort(key=lambda pair: pair[0].offset)
            for (before, before_source), (after, after_source) in itertools.pairwise(pairs):
                if after_source < before_source:
                    wrong.append(
                        _violation(
                            problem="outputs out of input order",
                            input=[topic, partition],
                            output=[after.topic, after.partition],
                            offsets=[before.offset, after.offset],
                            source_offsets=[before_source, after_source],
                            values=[before.value, after.value],
                        )
                    )
        return wrong

    def unseen(self) -> list[Violation]:
        found = []
        for txn in self.h.txns.values():
            if txn.outcome == ABORTED:
                continue
            for value, tp in txn.writes.items():
                read = self.visible_at(value, tp)
                if read is not None and value not in self.polled_by_pollers:
                    found.append(
                        _violation(
                            txn=txn.name,
                            value=value,
                            topic=read.topic,
                            partition=read.partition,
                            offset=read.offset,
                            index=read.index,
                        )
                    )
        return found

    def liveness(self) -> list[Violation]:
        return [
            _violation(
                txn=txn.name, process=txn.process, index=txn.first_index, writes=len(txn.writes)
            )
            for txn in self.h.txns.values()
            if txn.outcome == OPEN
        ]


def _is_poller(process: str) -> bool:
    return process.startswith("poller")


def check(path: str | Path) -> dict[str, list[Violation]]:
    """Every invariant name (and ``malformed``) -> its violations; empty lists mean clean."""
    with open(path, encoding="utf-8") as lines:
        history = History(lines)
    return Checker(history).results()


def render(results: dict[str, list[Violation]], shown: int = 20) -> str:
    """The table of counts, then up to ``shown`` violations of each broken invariant."""
    width = max(len(name) for name in results)
    lines = [f"{'invariant':<{width}}  violations", f"{'-' * width}  ----------"]
    lines += [f"{name:<{width}}  {len(found):>10}" for name, found in results.items()]
    for name, found in results.items():
        if found:
            lines += ["", f"{name}:"]
            lines += [f"  {json.dumps(v, sort_keys=True)}" for v in found[:shown]]
            if len(found) > shown:
                lines.append(f"  ... and {len(found) - shown} more")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.history_checker",
        description="Check a workload history (docs/history.md) against its invariants.",
    )
    parser.add_argument("history", type=Path, help="the history.jsonl file")
    parser.add_argument("--show", type=int, default=20, help="violations shown per invariant")
    args = parser.parse_args(argv)
    try:
        results = check(args.history)
    except OSError as error:
        parser.error(f"cannot read {args.history}: {error.strerror or error}")
    print(render(results, args.show))
    return 1 if any(results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
