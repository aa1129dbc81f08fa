"""The audit's inputs as Spark DataFrames, through PySpark's Python Data Source API.

Three sources, each read by the executors (the driver only lists files):

* ``raftcoord_segments``: every record of every partition-log segment under a
  cluster directory (``partition-node-N/<topic>-<partition>/<base>.log``), one
  input partition per log partition. Batches are decoded with kafka-python's
  ``DefaultRecordBatch`` alone, so that a bug in the storage code cannot hide
  itself: each row carries the batch header, the record, and for control
  records the marker (COMMIT/ABORT, coordinator epoch).
* ``raftcoord_transitions``: every line of every coordinator replica's
  applied-transitions log (``node-N/shard-S/transitions.jsonl``), one input
  partition per file.
* ``raftcoord_history``: the workload history (JSON lines, docs/history.md),
  split into byte ranges that end at line boundaries.

A row that cannot be decoded is still returned, with ``problem`` saying why.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

SEGMENTS = "raftcoord_segments"
TRANSITIONS = "raftcoord_transitions"
HISTORY = "raftcoord_history"

SEGMENTS_SCHEMA = (
    "topic string, partition int, node int, segment long, position long, batch_size int, "
    "base_offset long, last_offset long, leader_epoch int, magic int, crc_ok boolean, "
    "attributes int, transactional boolean, control boolean, timestamp_type int, "
    "compression int, first_timestamp long, max_timestamp long, producer_id long, "
    "producer_epoch int, base_sequence int, record_count int, record_index int, offset long, "
    "timestamp long, key string, value string, control_type string, coordinator_epoch int, "
    "problem string"
)

TRANSITIONS_SCHEMA = (
    "node int, shard int, line long, file_shard int, `index` long, term long, "
    "transactional_id string, producer_id long, producer_epoch int, from_state string, "
    "to_state string, partitions array<struct<topic:string,partition:int>>, "
    "groups array<string>, time_ms long, text string, problem string"
)

_TP = "struct<topic:string,partition:int>"
HISTORY_SCHEMA = (
    "`index` long, time_ms double, mono_ns long, process string, type string, op string, "
    "txn string, producer_id long, producer_epoch int, error string, message string, "
    "topic string, partition int, value string, offset long, "
    "source struct<topic:string,partition:int,offset:long,value:string>, `group` string, "
    "offsets array<struct<topic:string,partition:int,offset:long>>, "
    "writes array<struct<topic:string,partition:int,value:string>>, isolation string, "
    f"partitions array<{_TP}>, "
    "reads array<struct<topic:string,partition:int,offset:long,value:string>>, "
    "phase string, fault string, targets string, detail string, "
    "end_offsets map<string,long>, `committed` map<string,long>, topics map<string,int>, "
    "input_topic string, output_topic string, info string, position long, problem string"
)

#: Kafka's partition directory name; topic names never contain '/'.
_PARTITION_DIR = re.compile(r"(?P<topic>.+)-(?P<partition>\d+)")
_NODE_DIR = re.compile(r"partition-node-(?P<node>\d+)")
_COORDINATOR_DIR = re.compile(r"node-(?P<node>\d+)")
_SHARD_DIR = re.compile(r"shard-(?P<shard>\d+)")
_SEGMENT_NAME = re.compile(r"\d{20}\.log")
_LOG_OVERHEAD = struct.Struct(">qi")  # base offset, length (the bytes after this field)
_HEADER_SIZE = 61
_CONTROL_KEY = struct.Struct(">hh")  # version, type (0 ABORT, 1 COMMIT)
_MARKER_VALUE = struct.Struct(">hi")  # version, coordinator epoch
_HISTORY_SPLIT_BYTES = 32 * 1024 * 1024


class FilePartition(InputPartition):
    """One input partition: a file or directory, and a byte range of it."""

    def __init__(self, path: str, node: int = -1, shard: int = -1, start: int = 0, end: int = -1):
        super().__init__(path)
        self.path = path
        self.node = node
        self.shard = shard
        self.start = start
        self.end = end


def _file_partition(partition: InputPartition) -> FilePartition:
    """A partition Spark hands back to ``read``: one of the reader's own
    ``partitions()``, so a :class:`FilePartition`."""
    return cast(FilePartition, partition)


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "backslashreplace")


# --- segments --------------------------------------------------------------------------------


class SegmentsSource(DataSource):
    """``spark.read.format("raftcoord_segments").load(CLUSTER_DIR)``."""

    @classmethod
    def name(cls) -> str:
        return SEGMENTS

    def schema(self) -> str:
        return SEGMENTS_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return SegmentsReader(self.options["path"])


class SegmentsReader(DataSourceReader):
    def __init__(self, cluster_dir: str) -> None:
        self.cluster_dir = cluster_dir

    def partitions(self) -> list[FilePartition]:
        found = []
        for node_dir in sorted(Path(self.cluster_dir).iterdir()):
            node = _NODE_DIR.fullmatch(node_dir.name)
            if node is None or not node_dir.is_dir():
                continue
            for part_dir in sorted(node_dir.iterdir()):
                if part_dir.is_dir() and _PARTITION_DIR.fullmatch(part_dir.name):
                    found.append(FilePartition(str(part_dir), node=int(node["node"])))
        return found or [FilePartition("")]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        partition = _file_partition(partition)
        if partition.path:
            yield from read_partition_dir(Path(partition.path), partition.node)


def read_partition_dir(directory: Path, node: int) -> Iterator[tuple[Any, ...]]:
    """Every record of one partition's segments, in offset order (schema SEGMENTS_SCHEMA)."""
    from kafka.record.default_records import DefaultRecordBatch

    match = _PARTITION_DIR.fullmatch(directory.name)
    assert match is not None
    topic, index = match["topic"], int(match["partition"])
    segments = sorted(p for p in directory.iterdir() if _SEGMENT_NAME.fullmatch(p.name))
    expected: int | None = None
    for n, path in enumerate(segments):
        base = int(path.stem)
        data = path.read_bytes()
        last_segment = n == len(segments) - 1
        if expected is not None and base != expected:
            yield _problem_row(
                topic, index, node, base, 0, f"segment {base} follows offset {expected}"
            )
        expected = base
        pos = 0
        while pos < len(data):
            if len(data) - pos < _HEADER_SIZE:
                yield _problem_row(
                    topic, index, node, base, pos, _tail(len(data) - pos, last_segment)
                )
                break
            base_offset, length = _LOG_OVERHEAD.unpack_from(data, pos)
            size = _LOG_OVERHEAD.size + length
            if length < _HEADER_SIZE - _LOG_OVERHEAD.size or pos + size > len(data):
                yield _problem_row(
                    topic, index, node, base, pos, _tail(len(data) - pos, last_segment)
                )
                break
            batch = DefaultRecordBatch(data[pos : pos + size])
            problem = (
                None
                if base_offset == expected
                else f"base offset {base_offset}, expected {expected}"
            )
            header = (
                topic,
                index,
                node,
                base,
                pos,
                size,
                base_offset,
                batch.last_offset,
                batch.leader_epoch,
                batch.magic,
                batch.validate_crc(),
                batch.attributes,
                batch.is_transactional,
                batch.is_control_batch,
                batch.timestamp_type,
                batch.compression_type,
                batch.first_timestamp,
                batch.max_timestamp,
                batch.producer_id,
                batch.producer_epoch,
                batch.base_sequence,
                batch.records_count,
            )
            if problem is None and not header[10]:
                problem = "CRC-32C mismatch"
            rows = 0
            try:
                for i, record in enumerate(batch):
                    control_type, coordinator_epoch = None, None
                    if batch.is_control_batch:
                        control_type, coordinator_epoch = _marker(record.key, record.value)
                    yield (
                        *header,
                        i,
                        record.offset,
                        record.timestamp,
                        _text(record.key),
                        _text(record.value),
                        control_type,
                        coordinator_epoch,
                        problem,
                    )
                    rows += 1
            except Exception as exc:  # a corrupt record: reported, the log goes on
                yield (*header, rows, None, None, None, None, None, None, f"undecodable: {exc}")
                rows += 1
            if rows == 0:
                yield (*header, 0, None, None, None, None, None, None, problem or "empty batch")
            expected = batch.next_offset
            pos += size


def _tail(size: int, last_segment: int | bool) -> str:
    # Only the active segment can end in a write cut short by a crash (never acknowledged).
    return f"torn tail: {size} bytes" if last_segment else f"incomplete batch: {size} bytes"


def _marker(key: bytes | None, value: bytes | None) -> tuple[str | None, int | None]:
    if key is None or len(key) != _CONTROL_KEY.size:
        return None, None
    _, kind = _CONTROL_KEY.unpack(key)
    name = {0: "ABORT", 1: "COMMIT"}.get(kind, f"TYPE-{kind}")
    epoch = None
    if value is not None and len(value) >= _MARKER_VALUE.size:
        epoch = _MARKER_VALUE.unpack_from(value)[1]
    return name, epoch


def _problem_row(
    topic: str, index: int, node: int, segment: int, pos: int, problem: str
) -> tuple[Any, ...]:
    return (topic, index, node, segment, pos, *([None] * 24), problem)


# --- applied transitions ---------------------------------------------------------------------


class TransitionsSource(DataSource):
    """``spark.read.format("raftcoord_transitions").load(CLUSTER_DIR)``."""

    @classmethod
    def name(cls) -> str:
        return TRANSITIONS

    def schema(self) -> str:
        return TRANSITIONS_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return TransitionsReader(self.options["path"])


class TransitionsReader(DataSourceReader):
    def __init__(self, cluster_dir: str) -> None:
        self.cluster_dir = cluster_dir

    def partitions(self) -> list[FilePartition]:
        found = []
        for node_dir in sorted(Path(self.cluster_dir).iterdir()):
            node = _COORDINATOR_DIR.fullmatch(node_dir.name)
            if node is None or not node_dir.is_dir():
                continue
            for shard_dir in sorted(node_dir.iterdir()):
                shard = _SHARD_DIR.fullmatch(shard_dir.name)
                path = shard_dir / "transitions.jsonl"
                if shard is not None and path.is_file():
                    found.append(
                        FilePartition(str(path), node=int(node["node"]), shard=int(shard["shard"]))
                    )
        return found or [FilePartition("")]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        partition = _file_partition(partition)
        if not partition.path:
            return
        with open(partition.path, encoding="utf-8", errors="backslashreplace") as f:
            for line_no, line in enumerate(f):
                yield _transition_row(partition.node, partition.shard, line_no, line)


def _transition_row(node: int, shard: int, line_no: int, line: str) -> tuple[Any, ...]:
    text = line.strip()
    problem = None
    try:
        obj = json.loads(text)
    except ValueError:
        # A line torn by kill -9 and then continued by the restarted node: keep the
        # last whole object on it.
        start = text.rfind('{"index"')
        try:
            obj = json.loads(text[start:]) if start > 0 else None
            problem = f"torn line, kept the object at column {start}"
        except ValueError:
            obj = None
        if obj is None:
            return (
                node,
                shard,
                line_no,
                *([None] * 11),
                text[:200],
                f"unreadable line: {text[:80]!r}",
            )
    try:
        canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"))
        return (
            node,
            shard,
            line_no,
            _int(obj.get("shard")),
            _int(obj["index"]),
            _int(obj.get("term")),
            obj.get("transactional_id"),
            _int(obj.get("producer_id")),
            _int(obj.get("producer_epoch")),
            obj.get("from"),
            obj.get("to"),
            [(str(t), int(p)) for t, p in obj.get("partitions") or []],
            [str(g) for g in obj.get("groups") or []],
            _int(obj.get("time_ms")),
            canonical,
            problem,
        )
    except (KeyError, TypeError, ValueError) as exc:
        return (node, shard, line_no, *([None] * 11), text[:200], f"bad transition: {exc!r}")


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


# --- history ---------------------------------------------------------------------------------


class HistorySource(DataSource):
    """``spark.read.format("raftcoord_history").load(HISTORY_FILE)``."""

    @classmethod
    def name(cls) -> str:
        return HISTORY

    def schema(self) -> str:
        return HISTORY_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return HistoryReader(
            self.options["path"], int(self.options.get("split_bytes", _HISTORY_SPLIT_BYTES))
        )


class HistoryReader(DataSourceReader):
    def __init__(self, path: str, split_bytes: int) -> None:
        self.path = path
        self.split_bytes = split_bytes

    def partitions(self) -> list[FilePartition]:
        size = os.path.getsize(self.path)
        starts = range(0, max(size, 1), self.split_bytes)
        return [
            FilePartition(self.path, start=s, end=min(s + self.split_bytes, size)) for s in starts
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        partition = _file_partition(partition)
        # A range owns the lines that start inside it.
        with open(partition.path, "rb") as f:
            pos = partition.start
            if pos > 0:
                f.seek(pos - 1)
                pos += len(f.readline()) - 1
            while pos < partition.end:
                line = f.readline()
                if not line:
                    break
                if line.strip():
                    yield _history_row(line, pos)
                pos += len(line)


def _history_row(line: bytes, pos: int) -> tuple[Any, ...]:
    try:
        e = json.loads(line)
        if not isinstance(e, dict):
            raise TypeError("not an object")
        source = e.get("source")
        known = _HISTORY_KEYS
        info = {k: v for k, v in e.items() if k not in known}
        return (
            _int(e.get("index")),
            None if e.get("time_ms") is None else float(e["time_ms"]),
            _int(e.get("mono_ns")),
            e.get("process"),
            e.get("type"),
            e.get("op"),
            e.get("txn"),
            _int(e.get("producer_id")),
            _int(e.get("producer_epoch")),
            e.get("error"),
            e.get("message"),
            e.get("topic"),
            _int(e.get("partition")),
            None if e.get("value") is None else str(e["value"]),
            _int(e.get("offset")),
            None
            if source is None
            else (str(source[0]), int(source[1]), int(source[2]), str(source[3])),
            e.get("group"),
            _tuples(e.get("offsets"), (str, int, int)),
            _tuples(e.get("writes"), (str, int, str)),
            e.get("isolation"),
            _tuples(e.get("partitions"), (str, int)),
            _tuples(e.get("reads"), (str, int, int, str)),
            e.get("phase"),
            e.get("fault"),
            None if e.get("targets") is None else json.dumps(e["targets"]),
            None if e.get("detail") is None else str(e["detail"]),
            _map(e.get("end_offsets")),
            _map(e.get("committed")),
            _map(e.get("topics")),
            e.get("input_topic"),
            e.get("output_topic"),
            json.dumps(info) if info else None,
            pos,
            None,
        )
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        return (*([None] * 32), pos, f"unreadable event at byte {pos}: {exc!r}")


_HISTORY_KEYS = frozenset(
    "index time_ms mono_ns process type op txn producer_id producer_epoch error message topic "
    "partition value offset source group offsets writes isolation partitions reads phase fault "
    "targets detail end_offsets committed topics input_topic output_topic".split()
)


def _tuples(items: Any, types: tuple[type, ...]) -> list[tuple[Any, ...]] | None:
    if items is None:
        return None
    return [tuple(t(v) for t, v in zip(types, item, strict=True)) for item in items]


def _map(obj: Any) -> dict[str, int] | None:
    return None if obj is None else {str(k): int(v) for k, v in obj.items()}


def register(spark: SparkSession) -> None:
    """Make the three formats known to ``spark.read.format``."""
    for source in (SegmentsSource, TransitionsSource, HistorySource):
        spark.dataSource.register(source)
