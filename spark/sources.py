"""The audit's inputs as Spark DataFrames, through PySpark's Python Data Source API.

Three sources, each read by the executors (the driver only lists files):

* ``raftcoord_segments``: every record of every partition-log segment under a
  cluster directory (``partition-node-N/<topic>-<partition>/<base>.log``), one
  input partition per log partition. Batches are decoded with kafka-python's
  ``DefaultRecordBatch`` alone, so that a bug in the storage code cannot hide
  itself: each row carries the batch header, the record, and for control
  records the marker (COMMIT/ABORT, coordinator epoch). A batch whose header
  does not check out field by field is not decoded.
* ``raftcoord_transitions``: every line of every coordinator replica's
  applied-transitions log (``node-N/shard-S/transitions.jsonl``), one input
  partition per file.
* ``raftcoord_history``: the workload history (JSON lines, docs/history.md),
  split into byte ranges that end at line boundaries.

The segments and transitions are read from a cluster directory (``load(DIR)``)
or, with the option ``cluster_config`` (:meth:`spark.nodes.Cluster.options`),
from the nodes the config lists, over their DataFiles RPC: one input partition
per (node, log partition) or (node, transitions file), the raw bytes decoded
here all the same.

A row that cannot be decoded is still returned, with ``problem`` saying why; the
audit counts every such row as ``unreadable-data`` except a torn tail that a crash
explains (docs/audit.md).
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import struct
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO, cast

import crc32c
import msgpack
import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema

from raftcoord.protocol.data_files import COORDINATOR, PARTITION_LOG
from spark import nodes

#: Rows per Arrow record batch a reader hands to Spark.
ARROW_BATCH_ROWS = 4096

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
    "txn_number long, problem string"
)

TRANSITIONS_SCHEMA = (
    "node int, shard int, line long, file_shard int, `index` long, term long, "
    "transactional_id string, producer_id long, producer_epoch int, from_state string, "
    "to_state string, partitions array<struct<topic:string,partition:int>>, "
    "groups array<string>, time_ms long, text string, problem string, snapshot boolean"
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
    "phase string, fault string, targets string, detail string, hold_s double, "
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
_MAGIC_AT = 16
_TIMESTAMPS = struct.Struct(">qq")  # first timestamp, max timestamp
_TIMESTAMPS_AT = 27
_TIMESTAMPS_END = _TIMESTAMPS_AT + _TIMESTAMPS.size
#: attributes bits 0-2 compression, 3 timestamp type, 4 transactional, 5 control,
#: 6 delete horizon; bits 7-15 are unused and must be 0
_DEFINED_ATTRIBUTES = 0x7F
#: none, gzip, snappy, lz4, zstd
_COMPRESSION_TYPES = range(5)
_CONTROL_KEY = struct.Struct(">hh")  # version, type (0 ABORT, 1 COMMIT)
_TXN_NUMBER = struct.Struct(">q")
_MARKER_VALUE = struct.Struct(">hi")  # version, coordinator epoch
_HISTORY_SPLIT_BYTES = 32 * 1024 * 1024


class FilePartition(InputPartition):
    """One input partition: a file or directory, and a byte range of it. Read
    from a node (``address``): its ``files`` (name, size), or the ``problem``
    that kept the driver from listing them."""

    def __init__(
        self,
        path: str,
        node: int = -1,
        shard: int = -1,
        start: int = 0,
        end: int = -1,
        address: str = "",
        files: tuple[tuple[str, int], ...] = (),
        problem: str | None = None,
    ):
        super().__init__(path)
        self.path = path
        self.node = node
        self.shard = shard
        self.start = start
        self.end = end
        self.address = address
        self.files = files
        self.problem = problem


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
        if "cluster_config" in self.options:
            return NodeSegmentsReader(nodes.cluster_of(dict(self.options)), schema)
        return SegmentsReader(self.options["path"], schema)


class ArrowReader(DataSourceReader):
    """A reader whose :meth:`rows` are handed to Spark as Arrow record batches
    of :data:`ARROW_BATCH_ROWS` rows (columns built here, in the executor's
    Python, instead of each row pickled across to the JVM and converted
    there). ``schema``: the source's schema as Spark gave it to ``reader()``;
    None (a reader made outside Spark, in the tests) reads rows only."""

    def __init__(self, schema: Any = None) -> None:
        self.arrow_schema = None if schema is None else to_arrow_schema(schema)

    def rows(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        raise NotImplementedError

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if self.arrow_schema is None:
            yield from self.rows(partition)
            return
        chunk: list[tuple[Any, ...]] = []
        for row in self.rows(partition):
            chunk.append(row)
            if len(chunk) == ARROW_BATCH_ROWS:
                yield arrow_batch(chunk, self.arrow_schema)
                chunk = []
        if chunk:
            yield arrow_batch(chunk, self.arrow_schema)


def arrow_batch(rows: list[tuple[Any, ...]], schema: pa.Schema) -> pa.RecordBatch:
    """``rows`` (tuples in the schema's column order) as one record batch."""
    columns = zip(*rows, strict=True)
    return pa.RecordBatch.from_arrays(
        [pa.array(column, type=f.type) for column, f in zip(columns, schema, strict=True)],
        schema=schema,
    )


class SegmentsReader(ArrowReader):
    def __init__(self, cluster_dir: str, schema: Any = None) -> None:
        super().__init__(schema)
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

    def rows(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        partition = _file_partition(partition)
        if partition.path:
            yield from read_partition_dir(Path(partition.path), partition.node)


class NodeReader(ArrowReader):
    """A reader of the files of every node of one kind the cluster config
    lists, over the network (:mod:`spark.nodes`): one input partition per
    (node, directory of files), and one for each node that could not list
    its files (its row says why)."""

    kind = ""  # raftcoord.protocol.data_files.COORDINATOR or PARTITION_LOG

    def __init__(self, cluster: nodes.Cluster, schema: Any = None) -> None:
        super().__init__(schema)
        self.cluster = cluster

    def partitions(self) -> list[FilePartition]:
        found = []
        for node in nodes.list_nodes(self.cluster, self.kind):
            if node.problem is not None:
                found.append(FilePartition("", node.node_id, problem=node.problem))
                continue
            for directory, files in node.by_directory().items():
                found.append(
                    FilePartition(
                        directory,
                        node.node_id,
                        self.shard_of(directory),
                        address=node.address,
                        files=tuple(files),
                    )
                )
        return found or [FilePartition("")]

    def shard_of(self, directory: str) -> int:
        """The shard a directory of files holds (-1: none)."""
        return -1


class NodeSegmentsReader(NodeReader):
    """The segments of every partition-log node the cluster config lists."""

    kind = PARTITION_LOG

    def rows(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        partition = _file_partition(partition)
        if partition.problem is not None:
            yield _problem_row(None, None, partition.node, -1, 0, partition.problem)
        if not partition.path:
            return
        match = _PARTITION_DIR.fullmatch(partition.path)
        assert match is not None
        fetcher = nodes.Fetcher(self.cluster, partition.address)
        try:
            files = {
                name.rpartition("/")[2]: functools.partial(fetcher.fetch, name, size)
                for name, size in partition.files
            }
            topic, index = match["topic"], int(match["partition"])
            yield from read_partition(topic, index, partition.node, files)
        finally:
            fetcher.close()


#: The partition log's record of offsets never handed out: msgpack [[from, to], ...]
#: then the CRC-32C of those bytes (u32, little-endian).
OFFSET_GAPS_FILE = "offset-gaps"


def read_offset_gaps(load: Callable[[], bytes] | None) -> tuple[set[tuple[int, int]], str | None]:
    """The (from, to) offset gaps a partition recorded when it continued its
    log at a reserved offset after a possible loss (a new segment at ``to``
    may follow offset ``from``), and why the file could not be read (None:
    it could, or there is none). ``load`` reads the file; None: there is none."""
    if load is None:
        return set(), None
    try:
        data = load()
    except FileNotFoundError:
        return set(), None
    except OSError as exc:
        return set(), f"{OFFSET_GAPS_FILE}: {exc}"
    body, tail = data[:-4], data[-4:]
    if len(data) < 4 or crc32c.crc32c(body) != int.from_bytes(tail, "little"):
        return set(), f"{OFFSET_GAPS_FILE}: CRC-32C mismatch"
    try:
        return {(int(a), int(b)) for a, b in msgpack.unpackb(body)}, None
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        return set(), f"{OFFSET_GAPS_FILE}: {exc}"


def read_partition_dir(directory: Path, node: int) -> Iterator[tuple[Any, ...]]:
    """Every record of one partition's segments, in offset order (schema SEGMENTS_SCHEMA).

    Each batch's header is checked field by field, as RecordBatch v2 defines it, before
    anything of it is decoded: the length against the bytes that follow, the magic byte,
    the attributes' undefined bits, the last offset delta against the record count, and
    the base offset against the segment's base and the batch before it. A batch that
    fails any of these, or its CRC-32C, is one row whose ``problem`` says why, with the
    header fields read and no records. The (base offset, length) framing is the same in
    every message format, so the next batch is read where the length says, unless the
    length itself is impossible: then the rest of the segment is one row.
    """
    match = _PARTITION_DIR.fullmatch(directory.name)
    assert match is not None
    files = {p.name: p.read_bytes for p in directory.iterdir()}
    yield from read_partition(match["topic"], int(match["partition"]), node, files)


def read_partition(
    topic: str, index: int, node: int, files: Mapping[str, Callable[[], bytes]]
) -> Iterator[tuple[Any, ...]]:
    """Every record of one partition (:func:`read_partition_dir`), given the
    files of its directory by name, each as a function that reads its bytes:
    the segments (``<base offset>.log``) and the offset-gaps file; any other
    name is not the partition's data."""
    gaps, damaged = read_offset_gaps(files.get(OFFSET_GAPS_FILE))
    if damaged is not None:
        yield _problem_row(topic, index, node, -1, 0, damaged)
    # The offset the next batch must start at (None after an untrusted batch: unknown),
    # and the last offset of the last trusted batch (offsets only go up).
    expected: int | None = None
    floor = -1
    segments = sorted(
        (
            (int(name.removesuffix(".log")), load)
            for name, load in files.items()
            if _SEGMENT_NAME.fullmatch(name)
        ),
        key=lambda segment: segment[0],
    )
    for n, (base, load) in enumerate(segments):
        where = (topic, index, node, base)
        try:
            data = load()
        except OSError as exc:
            yield _problem_row(*where, 0, f"segment {base} could not be read: {exc}")
            expected = None
            continue
        last_segment = n == len(segments) - 1
        if expected is not None and base != expected and (expected, base) not in gaps:
            yield _problem_row(*where, 0, f"segment {base} follows offset {expected}")
        elif base <= floor:
            yield _problem_row(*where, 0, f"segment {base} does not follow offset {floor}")
        expected = base
        pos = 0
        while pos < len(data):
            left = len(data) - pos
            if left < _LOG_OVERHEAD.size:
                yield _problem_row(*where, pos, _tail(data, pos, last_segment))
                break
            base_offset, length = _LOG_OVERHEAD.unpack_from(data, pos)
            size = _LOG_OVERHEAD.size + length
            if length < _HEADER_SIZE - _LOG_OVERHEAD.size:
                yield _problem_row(
                    *where,
                    pos,
                    f"batch length {length}, shorter than a v2 header: "
                    f"the segment's last {left} bytes not read",
                    base_offset=base_offset,
                )
                expected = None
                break
            if size > left:
                yield _problem_row(*where, pos, _tail(data, pos, last_segment), **_torn(data, pos))
                break
            batch_bytes = data[pos : pos + size]
            pos += size
            magic = batch_bytes[_MAGIC_AT]
            if magic != 2:
                yield _problem_row(
                    *where, pos - size, f"magic {magic}, not 2", base_offset=base_offset, size=size
                )
                expected = None
                continue
            rows, problem = _decode(where, pos - size, batch_bytes, expected, floor)
            if problem is not None:
                yield (*rows[0][:-1], problem)
                expected = None
                continue
            yield from rows
            last_offset = rows[0][7]
            expected, floor = last_offset + 1, last_offset


def _decode(
    where: tuple[str, int, int, int],
    pos: int,
    data: bytes,
    expected: int | None,
    floor: int,
) -> tuple[list[tuple[Any, ...]], str | None]:
    """The rows of one whole batch of magic 2, or a row of its header and the problem
    that makes it untrusted."""
    from kafka.record.default_records import DefaultRecordBatch

    batch = DefaultRecordBatch(data)
    header = (
        *where,
        pos,
        len(data),
        batch.base_offset,
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
    problems = _header_problems(batch, where[3], expected, floor)
    if not problems and not header[10]:
        problems.append("CRC-32C mismatch")
    rows: list[tuple[Any, ...]] = []
    if not problems:
        try:
            for i, record in enumerate(batch):
                if record.offset != batch.base_offset + i:
                    raise ValueError(
                        f"record {i} at offset delta {record.offset - batch.base_offset}"
                    )
                control_type: str | None = None
                coordinator_epoch: int | None = None
                txn_number: int | None = None
                if batch.is_control_batch:
                    control_type, coordinator_epoch, txn_number = _marker(record.key, record.value)
                rows.append(
                    (
                        *header,
                        i,
                        record.offset,
                        record.timestamp,
                        _text(record.key),
                        _text(record.value),
                        control_type,
                        coordinator_epoch,
                        txn_number,
                        None,
                    )
                )
        except Exception as exc:  # a corrupt record: the whole batch is untrusted
            problems.append(f"undecodable records: {exc}")
    if problems:
        return [(*header, *[None] * 9)], "; ".join(problems)
    return rows, None


def _header_problems(batch: Any, segment: int, expected: int | None, floor: int) -> list[str]:
    """What is wrong with a v2 batch's header (magic and length already checked)."""
    problems = []
    attributes = batch.attributes
    if attributes & ~_DEFINED_ATTRIBUTES:
        problems.append(
            f"attributes {attributes:#06x}: undefined bits "
            f"{attributes & ~_DEFINED_ATTRIBUTES & 0xFFFF:#06x} set"
        )
    if batch.compression_type not in _COMPRESSION_TYPES:
        problems.append(f"compression type {batch.compression_type} undefined")
    count, delta = batch.records_count, batch.last_offset_delta
    if count < 1 or delta != count - 1:
        problems.append(f"last offset delta {delta} with {count} records")
    base_offset = batch.base_offset
    if base_offset < segment:
        problems.append(f"base offset {base_offset} below the segment's base {segment}")
    elif base_offset <= floor:
        problems.append(
            f"base offset {base_offset} not above the previous batch's last offset {floor}"
        )
    elif expected is not None and base_offset != expected:
        problems.append(f"base offset {base_offset}, expected {expected}")
    return problems


def _tail(data: bytes, pos: int, last_segment: bool) -> str:
    """The problem of the bytes at the end of a segment that are less than a batch.

    Only the newest (active) segment can end in a write that a crash cut short, never
    acknowledged: the start of a v2 batch (its magic 2, when that byte is there). Such
    a torn tail may still be a violation when the node was restarted after it was
    written (the audit's ``unreadable-data`` decides, with the history)."""
    size = len(data) - pos
    magic = data[pos + _MAGIC_AT] if size > _MAGIC_AT else 2
    if magic != 2:
        return f"incomplete batch: {size} bytes, magic {magic}, not 2"
    return f"torn tail: {size} bytes" if last_segment else f"incomplete batch: {size} bytes"


def _torn(data: bytes, pos: int) -> dict[str, Any]:
    """The header fields of a torn batch that its bytes hold: base offset, magic and,
    with the timestamps there, its first and max timestamps."""
    fields: dict[str, Any] = {"base_offset": _LOG_OVERHEAD.unpack_from(data, pos)[0]}
    if len(data) - pos > _MAGIC_AT:
        fields["magic"] = data[pos + _MAGIC_AT]
    if len(data) - pos >= _TIMESTAMPS_END:
        fields["timestamps"] = _TIMESTAMPS.unpack_from(data, pos + _TIMESTAMPS_AT)
    return fields


def _marker(key: bytes | None, value: bytes | None) -> tuple[str, int | None, int | None]:
    """A control record's type, coordinator epoch and transaction number (the
    int64 a partition-log node writes after Kafka's marker value; None when
    absent); ValueError when its key is not a control record key (version, type)."""
    if key is None or len(key) != _CONTROL_KEY.size:
        raise ValueError(f"control record key {key!r}")
    _, kind = _CONTROL_KEY.unpack(key)
    name = {0: "ABORT", 1: "COMMIT"}.get(kind, f"TYPE-{kind}")
    epoch = number = None
    if value is not None and len(value) >= _MARKER_VALUE.size:
        epoch = _MARKER_VALUE.unpack_from(value)[1]
    if value is not None and len(value) >= _MARKER_VALUE.size + _TXN_NUMBER.size:
        number = _TXN_NUMBER.unpack_from(value, _MARKER_VALUE.size)[0]
    return name, epoch, number


def _problem_row(
    topic: str | None,
    index: int | None,
    node: int,
    segment: int,
    pos: int,
    problem: str,
    base_offset: int | None = None,
    size: int | None = None,
    magic: int | None = None,
    timestamps: tuple[int, int] | None = None,
) -> tuple[Any, ...]:
    """A row of no record: what could be read of a batch, and why it was not decoded."""
    first_ts, max_ts = timestamps or (None, None)
    return (
        topic,
        index,
        node,
        segment,
        pos,
        size,
        base_offset,
        None,
        None,
        magic,
        *[None] * 6,
        first_ts,
        max_ts,
        *[None] * 12,
        problem,
    )


# --- applied transitions ---------------------------------------------------------------------


class TransitionsSource(DataSource):
    """``spark.read.format("raftcoord_transitions").load(CLUSTER_DIR)``."""

    @classmethod
    def name(cls) -> str:
        return TRANSITIONS

    def schema(self) -> str:
        return TRANSITIONS_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        if "cluster_config" in self.options:
            return NodeTransitionsReader(nodes.cluster_of(dict(self.options)), schema)
        return TransitionsReader(self.options["path"], schema)


class TransitionsReader(ArrowReader):
    def __init__(self, cluster_dir: str, schema: Any = None) -> None:
        super().__init__(schema)
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

    def rows(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        partition = _file_partition(partition)
        if partition.path:
            yield from read_transitions_file(Path(partition.path), partition.node, partition.shard)


class NodeTransitionsReader(NodeReader):
    """The transitions logs of every coordinator the cluster config lists."""

    kind = COORDINATOR

    def shard_of(self, directory: str) -> int:
        shard = _SHARD_DIR.fullmatch(directory)
        assert shard is not None  # the node lists only shard-S/transitions.jsonl
        return int(shard["shard"])

    def rows(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        partition = _file_partition(partition)
        if partition.problem is not None:
            yield _unreadable_line(partition.node, None, 0, "", partition.problem)
        if not partition.path:
            return
        fetcher = nodes.Fetcher(self.cluster, partition.address)
        try:
            for name, size in partition.files:
                try:
                    data = fetcher.fetch(name, size)
                except OSError as exc:
                    problem = f"could not be read: {exc}"
                    yield _unreadable_line(partition.node, partition.shard, 0, "", problem)
                    continue
                text = io.StringIO(data.decode("utf-8", "backslashreplace"), newline=None)
                yield from read_transitions(text, partition.node, partition.shard)
        finally:
            fetcher.close()


def read_transitions_file(path: Path, node: int, shard: int) -> Iterator[tuple[Any, ...]]:
    """Every line of one replica's transitions log file (:func:`read_transitions`)."""
    with open(path, encoding="utf-8", errors="backslashreplace") as f:
        yield from read_transitions(f, node, shard)


def read_transitions(f: TextIO, node: int, shard: int) -> Iterator[tuple[Any, ...]]:
    """Every line of one replica's transitions log (schema TRANSITIONS_SCHEMA).

    A replica writes each Raft entry's lines, each ending in a newline, with one write:
    a crash can tear only the last line of the file, which then has no newline. Such a
    torn tail is a row with ``problem`` "torn tail" (a crash, not a violation). Any other
    line that does not parse is unreadable, except that a torn line continued by the
    restarted replica (which appends after the torn bytes) is two rows: the torn bytes,
    unreadable, and the whole object written after them.
    """
    line = f.readline()
    line_no = 0
    while line:
        following = f.readline()
        yield from _transition_rows(node, shard, line_no, line, last=not following)
        line, line_no = following, line_no + 1


def _transition_rows(
    node: int, shard: int, line_no: int, line: str, last: bool
) -> Iterator[tuple[Any, ...]]:
    text = line.strip()
    try:
        yield _transition_row(node, shard, line_no, text, json.loads(text))
        return
    except ValueError:
        pass
    # The restarted replica appended the entry again after the torn bytes: keep the last
    # whole object on the line.
    start = text.rfind('{"index"')
    if start > 0:
        try:
            obj = json.loads(text[start:])
        except ValueError:
            pass
        else:
            yield _unreadable_line(
                node,
                shard,
                line_no,
                text[:start],
                f"torn line continued by a later write at column {start}",
            )
            yield _transition_row(node, shard, line_no, text[start:], obj)
            return
    if last and not line.endswith("\n"):
        problem = f"torn tail: {len(line.encode())} bytes, the last line cut by a crash"
    else:
        problem = f"unreadable line: {text[:80]!r}"
    yield _unreadable_line(node, shard, line_no, text, problem)


def _unreadable_line(
    node: int, shard: int | None, line_no: int, text: str, problem: str
) -> tuple[Any, ...]:
    return (node, shard, line_no, *([None] * 11), text[:200], problem, None)


def _transition_row(node: int, shard: int, line_no: int, text: str, obj: Any) -> tuple[Any, ...]:
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
            None,
            obj.get("snapshot") is True,
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        return _unreadable_line(node, shard, line_no, text, f"bad transition: {exc!r}")


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
            self.options["path"],
            int(self.options.get("split_bytes", _HISTORY_SPLIT_BYTES)),
            schema,
        )


class HistoryReader(ArrowReader):
    def __init__(self, path: str, split_bytes: int, schema: Any = None) -> None:
        super().__init__(schema)
        self.path = path
        self.split_bytes = split_bytes

    def partitions(self) -> list[FilePartition]:
        size = os.path.getsize(self.path)
        starts = range(0, max(size, 1), self.split_bytes)
        return [
            FilePartition(self.path, start=s, end=min(s + self.split_bytes, size)) for s in starts
        ]

    def rows(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
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
                yield _history_row(line, pos)
                pos += len(line)


def _history_row(line: bytes, pos: int) -> tuple[Any, ...]:
    if not line.strip():
        return (*([None] * _HISTORY_FIELDS), pos, f"empty line at byte {pos}")
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
            None if e.get("hold_s") is None else float(e["hold_s"]),
            _map(e.get("end_offsets")),
            _map(e.get("committed"), nullable=True),
            _map(e.get("topics")),
            e.get("input_topic"),
            e.get("output_topic"),
            json.dumps(info) if info else None,
            pos,
            None,
        )
    except (AttributeError, ValueError, TypeError, IndexError, KeyError) as exc:
        return (*([None] * _HISTORY_FIELDS), pos, f"unreadable event at byte {pos}: {exc!r}")


_HISTORY_KEYS = frozenset(
    "index time_ms mono_ns process type op txn producer_id producer_epoch error message topic "
    "partition value offset source group offsets writes isolation partitions reads phase fault "
    "targets detail hold_s end_offsets committed topics input_topic output_topic".split()
)
#: The history's columns before ``position`` and ``problem``.
_HISTORY_FIELDS = 33


def _tuples(items: Any, types: tuple[type, ...]) -> list[tuple[Any, ...]] | None:
    if items is None:
        return None
    return [tuple(t(v) for t, v in zip(types, item, strict=True)) for item in items]


def _map(obj: Any, nullable: bool = False) -> dict[str, int | None] | None:
    """A JSON object of ints; with ``nullable``, a value may be null (the workers'
    committed offset of an input partition where the group committed none)."""
    if obj is None:
        return None
    return {str(k): None if v is None and nullable else int(v) for k, v in obj.items()}


def register(spark: SparkSession) -> None:
    """Make the three formats known to ``spark.read.format``."""
    for source in (SegmentsSource, TransitionsSource, HistorySource):
        spark.dataSource.register(source)
