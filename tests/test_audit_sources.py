"""The audit's data sources read what they can trust and report the rest (pure Python, no
Spark): each RecordBatch v2 header field is checked before a batch is decoded, a line of
a transitions log or of the history that cannot be read is a row with its ``problem``,
and only the very last line of a transitions log may be torn."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftcoord.cluster.launcher import free_ports
from raftcoord.protocol.data_files import PARTITION_LOG, DataFilesService
from raftcoord.protocol.v1 import data_files_pb2_grpc
from spark import nodes
from spark.nodes import Cluster, Fetcher
from spark.sources import (
    HISTORY_SCHEMA,
    SEGMENTS_SCHEMA,
    TRANSITIONS_SCHEMA,
    FilePartition,
    HistoryReader,
    NodeSegmentsReader,
    NodeTransitionsReader,
    TransitionsReader,
    read_partition_dir,
)
from spark.synthetic import Batch

TS = 1_790_000_000_000


def _columns(schema: str) -> list[str]:
    return [part.split()[0].strip("`") for part in schema.split(", ") if " " in part]


SEGMENT_COLUMNS = _columns(SEGMENTS_SCHEMA)
TRANSITION_COLUMNS = _columns(TRANSITIONS_SCHEMA)


def _batch(base_offset: int, values: list[str], sequence: int = 0, **kw: Any) -> bytearray:
    data = Batch(7, 0, sequence, values, TS, **kw).encode()
    struct.pack_into(">q", data, 0, base_offset)
    return data


def _segments(tmp_path: Path, *segments: tuple[int, bytes]) -> list[dict[str, Any]]:
    directory = tmp_path / "events-0"
    directory.mkdir(parents=True)
    for base, data in segments:
        (directory / f"{base:020d}.log").write_bytes(data)
    rows = [dict(zip(SEGMENT_COLUMNS, r, strict=True)) for r in read_partition_dir(directory, 101)]
    return rows


def _segments_in(tmp_path: Path, name: str, *segments: tuple[int, bytes]) -> list[dict[str, Any]]:
    return _segments(tmp_path / name, *segments)


def _records(rows: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(r["offset"], r["value"]) for r in rows if r["record_index"] is not None]


def _problems(rows: list[dict[str, Any]]) -> list[str]:
    return [r["problem"] for r in rows if r["problem"] is not None]


def _patched(data: bytearray, fmt: str, at: int, value: int) -> bytearray:
    damaged = bytearray(data)
    struct.pack_into(fmt, damaged, at, value)
    return damaged


def test_a_clean_segment_decodes_every_record(tmp_path: Path) -> None:
    rows = _segments(tmp_path, (0, bytes(_batch(0, ["a", "b"]) + _batch(2, ["c"], sequence=2))))
    assert _records(rows) == [(0, "a"), (1, "b"), (2, "c")]
    assert _problems(rows) == []


def test_a_batch_whose_magic_is_not_2_is_reported_and_not_decoded(tmp_path: Path) -> None:
    bad = _patched(_batch(1, ["x"]), ">b", 16, 1)
    rows = _segments(tmp_path, (0, bytes(_batch(0, ["a"]) + bad + _batch(2, ["c"]))))
    assert _records(rows) == [(0, "a"), (2, "c")]  # framed by its length, not decoded
    assert _problems(rows) == ["magic 1, not 2"]


def test_undefined_attribute_bits_and_compression_types_are_reported(tmp_path: Path) -> None:
    undefined_bit = _patched(_batch(0, ["a"]), ">h", 21, 0x0100)
    rows = _segments(tmp_path, (0, bytes(undefined_bit)))
    assert _records(rows) == []
    assert _problems(rows) == ["attributes 0x0100: undefined bits 0x0100 set"]
    unknown_codec = _patched(_batch(0, ["a"]), ">h", 21, 0x0006)
    assert _problems(_segments_in(tmp_path, "codec", (0, bytes(unknown_codec)))) == [
        "compression type 6 undefined"
    ]


def test_a_batch_length_shorter_than_a_header_stops_the_segment(tmp_path: Path) -> None:
    short = _patched(_batch(1, ["x"]), ">i", 8, 20)
    after = _batch(2, ["c"])
    rows = _segments(tmp_path, (0, bytes(_batch(0, ["a"]) + short + after)))
    assert _records(rows) == [(0, "a")]
    assert _problems(rows) == [
        f"batch length 20, shorter than a v2 header: the segment's last "
        f"{len(short) + len(after)} bytes not read"
    ]


def test_a_batch_longer_than_what_follows(tmp_path: Path) -> None:
    first = _batch(0, ["a"])
    cut = _batch(1, ["b"])[:40]
    # In a closed segment it is damage; in the newest one, a write a crash cut short.
    rows = _segments_in(tmp_path, "closed", (0, bytes(first + cut)), (1, bytes(_batch(1, ["b"]))))
    assert _problems(rows) == ["incomplete batch: 40 bytes"]
    rows = _segments_in(tmp_path, "active", (0, bytes(first + cut)))
    assert _problems(rows) == ["torn tail: 40 bytes"]
    # A tail whose bytes are not the start of a v2 batch is not a torn write.
    not_v2 = _patched(cut, ">b", 16, 0)
    rows = _segments_in(tmp_path, "garbage", (0, bytes(first + not_v2)))
    assert _problems(rows) == ["incomplete batch: 40 bytes, magic 0, not 2"]


def test_a_torn_tail_with_a_whole_header_carries_its_timestamps(tmp_path: Path) -> None:
    rows = _segments(tmp_path, (0, bytes(_batch(0, ["a"]) + _batch(1, ["b"])[:50])))
    torn = rows[-1]
    assert torn["problem"] == "torn tail: 50 bytes"
    assert (torn["base_offset"], torn["magic"], torn["max_timestamp"]) == (1, 2, TS)


def test_last_offset_delta_must_match_the_record_count(tmp_path: Path) -> None:
    wrong_delta = _patched(_batch(0, ["a", "b"]), ">i", 23, 5)
    rows = _segments(tmp_path, (0, bytes(wrong_delta)))
    assert _records(rows) == []
    assert _problems(rows) == ["last offset delta 5 with 2 records"]
    no_records = _patched(_batch(0, ["a"]), ">i", 57, 0)
    assert _problems(_segments_in(tmp_path, "empty", (0, bytes(no_records)))) == [
        "last offset delta 0 with 0 records"
    ]


def test_base_offsets_must_increase_from_the_segments_base(tmp_path: Path) -> None:
    below = _segments_in(tmp_path, "below", (10, bytes(_batch(9, ["a"]))))
    assert _records(below) == []
    assert _problems(below) == ["base offset 9 below the segment's base 10"]
    again = _segments_in(tmp_path, "again", (0, bytes(_batch(0, ["a", "b"]) + _batch(1, ["c"]))))
    assert _records(again) == [(0, "a"), (1, "b")]
    assert _problems(again) == ["base offset 1 not above the previous batch's last offset 1"]
    gap = _segments_in(tmp_path, "gap", (0, bytes(_batch(0, ["a"]) + _batch(5, ["f"]))))
    assert _records(gap) == [(0, "a")]
    assert _problems(gap) == ["base offset 5, expected 1"]


def test_after_an_untrusted_batch_the_next_one_is_read_again(tmp_path: Path) -> None:
    # The batch after an untrusted one is trusted when its offsets go on increasing: one
    # damaged header is one problem, not one per batch after it.
    bad = _patched(_batch(1, ["b"]), ">b", 16, 3)
    rows = _segments(
        tmp_path, (0, bytes(_batch(0, ["a"]) + bad + _batch(2, ["c"]) + _batch(3, ["d"])))
    )
    assert _records(rows) == [(0, "a"), (2, "c"), (3, "d")]
    assert _problems(rows) == ["magic 3, not 2"]


# --- transitions -------------------------------------------------------------------------------


def _transitions(tmp_path: Path, text: str) -> list[dict[str, Any]]:
    path = tmp_path / "transitions.jsonl"
    path.write_text(text)
    reader = TransitionsReader(str(tmp_path))
    rows = reader.read(FilePartition(str(path), node=1, shard=0))
    return [dict(zip(TRANSITION_COLUMNS, r, strict=True)) for r in rows]


def _line(index: int, to: str = "ONGOING") -> str:
    return (
        f'{{"index":{index},"term":1,"shard":0,"transactional_id":"t","producer_id":1,'
        f'"producer_epoch":0,"from":"EMPTY","to":"{to}","partitions":[],"groups":[],'
        f'"time_ms":{TS}}}'
    )


def test_a_torn_last_line_is_a_torn_tail(tmp_path: Path) -> None:
    rows = _transitions(tmp_path, _line(1) + "\n" + _line(2)[:30])
    assert [r["index"] for r in rows] == [1, None]
    assert rows[1]["problem"].startswith("torn tail: 30 bytes")


def test_a_line_that_does_not_parse_elsewhere_is_unreadable(tmp_path: Path) -> None:
    middle = _transitions(tmp_path, _line(1) + "\n" + _line(2)[:30] + "\n" + _line(3) + "\n")
    assert [r["index"] for r in middle] == [1, None, 3]
    assert middle[1]["problem"].startswith("unreadable line")
    # A whole last line (it ends with its newline) that does not parse was not torn.
    (tmp_path / "last").mkdir()
    last = _transitions(tmp_path / "last", _line(1) + "\n" + "{oops}\n")
    assert last[1]["problem"].startswith("unreadable line")


def test_a_torn_line_continued_by_a_later_write_is_unreadable_and_the_object_kept(
    tmp_path: Path,
) -> None:
    text = _line(1) + "\n" + _line(2)[:25] + _line(2) + "\n" + _line(3) + "\n"
    rows = _transitions(tmp_path, text)
    assert [(r["line"], r["index"]) for r in rows] == [(0, 1), (1, None), (1, 2), (2, 3)]
    assert rows[1]["problem"].startswith("torn line continued by a later write")
    assert [r["problem"] for r in rows if r["index"] is not None] == [None, None, None]


def test_a_line_that_is_json_but_not_a_transition_is_a_bad_transition(tmp_path: Path) -> None:
    rows = _transitions(tmp_path, "[1, 2]\n" + '{"term": 1}\n' + _line(3) + "\n")
    assert [r["problem"].split(":")[0] for r in rows[:2]] == ["bad transition"] * 2
    assert rows[2]["index"] == 3


# --- history -----------------------------------------------------------------------------------


def test_every_history_line_that_cannot_be_read_is_a_row_with_its_problem(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    good = '{"index":0,"process":"p","type":"invoke","op":"poll"}\n'
    path.write_text(good + "\n" + '{"index":2,"end_offsets":[1]}\n' + "[]\n" + good)
    reader = HistoryReader(str(path), 1 << 20)
    columns = _columns(HISTORY_SCHEMA)
    rows = [dict(zip(columns, r, strict=True)) for p in reader.partitions() for r in reader.read(p)]
    assert [r["problem"] is None for r in rows] == [True, False, False, False, True]
    assert rows[1]["problem"].startswith("empty line")


def test_a_final_event_with_inputs_the_group_never_committed_is_read(tmp_path: Path) -> None:
    """Workers with nothing to copy commit no offset: the final event's
    ``committed`` holds null for those input partitions (docs/history.md)."""
    path = tmp_path / "history.jsonl"
    path.write_text(
        '{"index":0,"process":"workload","type":"ok","op":"final","reads":[],'
        '"end_offsets":{"in/0":0,"in/1":3},"committed":{"in/0":null,"in/1":3}}\n'
    )
    reader = HistoryReader(str(path), 1 << 20)
    columns = _columns(HISTORY_SCHEMA)
    (row,) = [
        dict(zip(columns, r, strict=True)) for p in reader.partitions() for r in reader.read(p)
    ]
    assert row["problem"] is None
    assert row["committed"] == {"in/0": None, "in/1": 3}
    assert row["end_offsets"] == {"in/0": 0, "in/1": 3}


def test_a_jump_the_partition_log_recorded_as_an_offset_gap_is_no_problem(
    tmp_path: Path,
) -> None:
    """A partition that continued at a reserved offset after a possible loss
    (the partition log's skip_to, which records the gap) reads as one log;
    a jump it did not record, or a damaged record of gaps, is reported."""
    from partition_log.log import FsyncPolicy, PartitionLogStore

    directory = tmp_path / "events-0"
    store = PartitionLogStore(directory, fsync=FsyncPolicy.NEVER)
    store.append(_batch(0, ["a"]))
    store.skip_to(1000)
    store.append(_batch(0, ["b"], sequence=1))
    store.close()
    rows = [dict(zip(SEGMENT_COLUMNS, r, strict=True)) for r in read_partition_dir(directory, 1)]
    assert _records(rows) == [(0, "a"), (1000, "b")]
    assert _problems(rows) == []
    (directory / "offset-gaps").unlink()
    rows = [dict(zip(SEGMENT_COLUMNS, r, strict=True)) for r in read_partition_dir(directory, 1)]
    assert _problems(rows) == ["segment 1000 follows offset 1"]
    (directory / "offset-gaps").write_bytes(b"\x91\x92\x01\xcd\x03\xe8" + b"\0\0\0\0")
    rows = [dict(zip(SEGMENT_COLUMNS, r, strict=True)) for r in read_partition_dir(directory, 1)]
    assert _problems(rows) == ["offset-gaps: CRC-32C mismatch", "segment 1000 follows offset 1"]


def test_a_snapshot_marker_line_is_read_as_one() -> None:
    from spark.sources import _transition_rows

    marker = '{"index":30000,"term":4,"shard":3,"snapshot":true}\n'
    (row,) = _transition_rows(1, 3, 7, marker, last=False)
    values = dict(zip(TRANSITION_COLUMNS, row, strict=True))
    assert values["index"] == 30000 and values["snapshot"] is True and values["problem"] is None
    line = '{"index":5,"term":1,"shard":3,"transactional_id":"t","to":"ONGOING"}\n'
    (row,) = _transition_rows(1, 3, 8, line, last=False)
    assert dict(zip(TRANSITION_COLUMNS, row, strict=True))["snapshot"] is False


def test_a_node_that_cannot_be_listed_is_unreadable_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read over the network, a node that does not answer is a row of its own
    with the reason (so ``unreadable-data`` fails), never a node left out."""
    monkeypatch.setattr(nodes, "UNAVAILABLE_WINDOW_S", 0.5)
    closed = free_ports(3)  # nothing listens there
    config = tmp_path / "cluster.toml"
    config.write_text(
        f'shard_count = 1\n\n[[coordinators]]\nid = 1\ngrpc = "127.0.0.1:{closed[0]}"\n'
        f'raft = ["127.0.0.1:{closed[1]}"]\n\n[[partition_nodes]]\nid = 101\n'
        f'grpc = "127.0.0.1:{closed[2]}"\n'
    )
    cluster = Cluster(config)
    for reader, columns in (
        (NodeSegmentsReader(cluster), SEGMENT_COLUMNS),
        (NodeTransitionsReader(cluster), TRANSITION_COLUMNS),
    ):
        (partition,) = reader.partitions()
        rows = [dict(zip(columns, r, strict=True)) for r in reader.read(partition)]
        assert len(rows) == 1
        port = closed[0] if rows[0]["node"] == 1 else closed[2]
        assert f"127.0.0.1:{port} answered UNAVAILABLE" in rows[0]["problem"]


def test_a_node_that_refuses_a_first_connection_is_read_once_it_accepts(tmp_path: Path) -> None:
    """A fetch whose first call finds no node listening (UNAVAILABLE) tries
    again and reads the file once the node accepts: one failed connection
    attempt is not an unreadable file."""
    (tmp_path / "events-0").mkdir()
    (tmp_path / "events-0" / f"{0:020d}.log").write_bytes(b"segment bytes")
    (port,) = free_ports(1)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    service = DataFilesService(tmp_path, 101, PARTITION_LOG, lambda context: None)
    data_files_pb2_grpc.add_DataFilesServicer_to_server(service, server)
    fetcher = Fetcher(Cluster(tmp_path / "unused.toml"), f"127.0.0.1:{port}")
    read = fetcher.stub.ReadDataFile
    codes: list[grpc.StatusCode | None] = []

    def first_refused(request: Any, timeout: float) -> Iterator[Any]:
        """The real call; once the first has failed, the node starts listening."""
        try:
            yield from read(request, timeout=timeout)
            codes.append(None)
        except grpc.RpcError as exc:
            codes.append(exc.code())
            if len(codes) == 1:
                server.add_insecure_port(f"127.0.0.1:{port}")
                server.start()
            raise

    fetcher.stub.ReadDataFile = first_refused
    try:
        assert fetcher.fetch(f"events-0/{0:020d}.log", 13) == b"segment bytes"
        assert codes[0] is grpc.StatusCode.UNAVAILABLE and codes[-1] is None, codes
    finally:
        fetcher.close()
        server.stop(None)
