"""The Kafka gateway's pure parts: message framing (kio), record batch
conversion, and the epoch book. Messages and batches are made or read back
with kafka-python, an independent implementation of the same formats."""

from __future__ import annotations

import gzip
import io
import re
import warnings
from pathlib import Path
from typing import Any

import lz4.frame
import pytest
import zstandard
from kio.index import load_response_schema
from kio.schema.request_header.v2.header import RequestHeader
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from raftcoord.kafka import messages as m
from raftcoord.kafka.epochs import EpochBook
from raftcoord.kafka.records import (
    BadBatch,
    BatchTooLarge,
    decompressed_size,
    fetched_batches,
    produced_batch,
)
from raftcoord.protocol.v1 import partition_log_pb2

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.metadata import ApiVersionsResponse
    from kafka.protocol.producer import ProduceRequest
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafka.record.memory_records import MemoryRecords


MIB = 1 << 20


def batch_bytes(
    values: list[bytes], producer_id: int = 7, epoch: int = 2, sequence: int = 0
) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, True, producer_id, epoch, sequence, 2**31 - 1)
    for i, value in enumerate(values):
        builder.append(i, 1_000 + i, b"k" if i == 0 else None, value, [("h", b"v")])
    return bytes(builder.build())


# --- messages -----------------------------------------------------------------------


def test_every_advertised_version_has_both_schemas_and_encodes_an_empty_answer() -> None:
    for key, (low, high) in m.SUPPORTED.items():
        for version in range(low, high + 1):
            frame = m.encode_response(key, version, 1, {})
            assert int.from_bytes(frame[:4], "big") == len(frame) - 4


def test_a_request_encoded_by_kafka_python_decodes() -> None:
    topic = ProduceRequest.TopicProduceData
    body = ProduceRequest(
        transactional_id="tx",
        acks=-1,
        timeout_ms=1500,
        topic_data=[
            topic(name="t", partition_data=[topic.PartitionProduceData(index=2, records=b"xyz")])
        ],
        version=9,
    ).encode()
    header = io.BytesIO()
    entity_writer(RequestHeader)(
        header,
        RequestHeader(
            request_api_key=i16(0),
            request_api_version=i16(9),
            correlation_id=i32(42),
            client_id="c",
        ),
    )
    request = m.decode_request(header.getvalue() + bytes(body))
    assert (request.api_key, request.api_version, request.correlation_id) == (0, 9, 42)
    assert request.body.transactional_id == "tx"
    assert request.body.acks == -1
    assert m.milliseconds(request.body.timeout) == 1500
    partition = request.body.topic_data[0].partition_data[0]
    assert (partition.index, bytes(partition.records)) == (2, b"xyz")


def test_api_versions_answer_lists_exactly_the_supported_versions() -> None:
    frame = m.encode_response(m.API_VERSIONS, 3, 9, {"api_keys": []})
    assert frame[4:8] == (9).to_bytes(4, "big")
    listed = {(k, lo, hi) for k, (lo, hi) in m.SUPPORTED.items()}
    data = {
        "api_keys": [
            {"api_key": k, "min_version": lo, "max_version": hi} for k, lo, hi in sorted(listed)
        ]
    }
    # The response header of ApiVersions is v0 (no tagged fields): the body starts at 8.
    decoded = ApiVersionsResponse.decode(
        m.encode_response(m.API_VERSIONS, 3, 9, data)[8:], version=3
    )
    assert {(a.api_key, a.min_version, a.max_version) for a in decoded.api_keys} == listed


def test_unsupported_and_truncated_requests_are_refused() -> None:
    with pytest.raises(m.MalformedRequest, match="not supported"):
        m.decode_request(b"\x00\x00\x00\x00" + b"\x00" * 20)  # Produce v0
    with pytest.raises(m.MalformedRequest):
        m.decode_request(b"\x00\x12\x00\x03\x00\x00")  # ApiVersions v3, cut short
    with pytest.raises(m.MalformedRequest):
        m.api_of(b"\x00")


def test_build_drops_fields_of_other_versions_and_fills_defaults() -> None:
    schema = load_response_schema(m.FIND_COORDINATOR, 0)
    built = m.build(schema, {"error_code": 15, "error_message": "later", "node_id": 3})
    assert int(built.error_code) == 15
    assert built.node_id == 3
    assert built.host == ""
    assert not hasattr(built, "error_message")  # only from version 1 on


def test_producer_fenced_reaches_older_versions_as_invalid_producer_epoch() -> None:
    def end_txn_error(version: int) -> int:
        frame = m.encode_response(m.END_TXN, version, 1, {"error_code": 90})
        schema = load_response_schema(m.END_TXN, version)
        _, used = entity_reader(schema.__header_schema__)(frame, 4)
        answer: Any = entity_reader(schema)(frame, 4 + used)[0]
        return int(answer.error_code)

    assert [end_txn_error(v) for v in range(4)] == [47, 47, 90, 90]
    topics = [{"name": "t", "results_by_partition": [{"partition_error_code": 90}]}]
    frame = m.encode_response(
        m.ADD_PARTITIONS_TO_TXN, 1, 1, {"results_by_topic_v3_and_below": topics}
    )
    assert frame.endswith((47).to_bytes(2, "big"))


# --- record batches ---------------------------------------------------------------------


def test_a_produced_batch_keeps_its_producer_fields_and_records() -> None:
    batch = produced_batch(
        batch_bytes([b"a", b"b"], producer_id=7, epoch=2, sequence=5), 10, 1 << 20
    )
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 2, 5)
    assert batch.is_transactional
    assert [r.value for r in batch.records] == [b"a", b"b"]
    assert batch.records[0].key == b"k"
    assert not batch.records[1].HasField("key")
    assert [(h.key, h.value) for h in batch.records[0].headers] == [("h", b"v")]
    assert [r.timestamp_ms for r in batch.records] == [1_000, 1_001]


def test_produced_bytes_that_are_not_one_v2_batch_are_refused() -> None:
    one = batch_bytes([b"a"])
    with pytest.raises(BadBatch, match="more than one"):
        produced_batch(one + one, 10, 1 << 20)
    with pytest.raises(BadBatch):
        produced_batch(b"", 10, 1 << 20)
    corrupt = bytearray(one)
    corrupt[-1] ^= 0xFF
    with pytest.raises(BadBatch, match="CRC"):
        produced_batch(bytes(corrupt), 10, 1 << 20)


def fetched(offset: int, value: bytes, producer_id: int = 7) -> partition_log_pb2.FetchedRecord:
    return partition_log_pb2.FetchedRecord(
        offset=offset,
        timestamp_ms=5,
        value=value,
        producer_id=producer_id,
        producer_epoch=1,
        is_transactional=True,
    )


def read_back(data: bytes) -> list[tuple[int, int, list[tuple[int, bytes]]]]:
    """(base offset, next offset, [(offset, value)]) per batch."""
    records = MemoryRecords(data)
    out = []
    while (batch := records.next_batch()) is not None:
        assert batch.validate_crc()
        out.append((batch.base_offset, batch.next_offset, [(r.offset, r.value) for r in batch]))
    return out


def test_fetched_records_keep_their_offsets_and_the_last_batch_covers_skipped_ones() -> None:
    records = [fetched(10, b"a"), fetched(12, b"b"), fetched(13, b"c", producer_id=8)]
    assert read_back(fetched_batches(records, 10, 16)) == [
        (10, 13, [(10, b"a"), (12, b"b")]),
        (13, 16, [(13, b"c")]),
    ]


def test_an_answer_without_records_still_moves_the_client_past_skipped_offsets() -> None:
    assert read_back(fetched_batches([], 4, 7)) == [(4, 7, [])]
    assert fetched_batches([], 4, 4) == b""


# --- epochs -------------------------------------------------------------------------------


def test_the_epoch_book_follows_end_txn_bumps_and_rebases_sequences() -> None:
    book = EpochBook()
    assert book.server(7, 3) == (7, 3)  # InitProducerId's identity is its own
    assert book.sequence((7, 3), "t", 0, 12) == 12  # the first epoch is not rebased
    book.ended((7, 3), (7, 4))
    assert book.server(7, 3) == (7, 4)
    assert book.sequence((7, 3), "t", 0, 12) == 0  # first batch of the new epoch
    assert book.sequence((7, 3), "t", 0, 15) == 3
    assert book.sequence((7, 3), "t", 0, 12) == 0  # a retry of the first batch
    assert book.sequence((7, 3), "t", 1, 40) == 0  # each partition on its own
    assert book.sequence((7, 3), "t", 0, -1) == -1
    book.ended((7, 3), (7, 5))
    assert book.server(7, 3) == (7, 5)
    assert book.sequence((7, 3), "t", 0, 20) == 0  # the ended epoch's bases are gone
    assert book.server(7, 2) == (7, 2)  # a zombie's older identity is not translated
    assert len(book) == 1


def test_an_open_transactions_bases_outlive_any_number_of_other_keys() -> None:
    """A base of 50, then a hundred thousand bases and epochs of other
    producers: the open transaction's next batch still rebases on 50."""
    book = EpochBook()
    book.ended((1, 0), (1, 1))
    assert book.sequence((1, 0), "t", 0, 50) == 0
    for producer_id in range(2, 202):
        for round_ in range(5):
            book.ended((producer_id, 0), (producer_id, round_ + 1))
            for partition in range(100):
                book.sequence((producer_id, 0), "t", partition, round_ * 10)
    assert book.server(1, 0) == (1, 1)
    assert book.sequence((1, 0), "t", 0, 55) == 5
    assert len(book) == 201


def test_the_epoch_book_forgets_the_least_recently_used_identity_whole() -> None:
    book = EpochBook(capacity=2)
    book.ended((1, 0), (1, 1))
    book.ended((2, 0), (2, 1))
    assert book.sequence((1, 0), "t", 0, 8) == 0  # producer 1 is used again
    book.ended((3, 0), (3, 1))  # the book is full: producer 2, unused longest, goes
    assert book.server(2, 0) == (2, 0)  # passed on as it is, so the coordinator fences it
    assert book.sequence((2, 0), "t", 0, 30) == 30
    assert book.server(1, 0) == (1, 1)
    assert book.sequence((1, 0), "t", 0, 9) == 1
    assert book.server(3, 0) == (3, 1)
    assert len(book) == 2


def test_the_docs_list_exactly_the_advertised_versions() -> None:
    """docs/kafka.md's API table names each advertised API with its range."""
    table = (Path(__file__).parent.parent / "docs" / "kafka.md").read_text()
    rows = re.findall(r"^\| [A-Za-z]+ \((\d+)\) \| (\d+)(?:\u2013(\d+))? \|", table, re.MULTILINE)
    listed = {int(key): (int(low), int(high or low)) for key, low, high in rows}
    assert listed == m.SUPPORTED


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_a_batch_that_inflates_past_the_limit_is_refused_before_it_is_inflated(codec: int) -> None:
    """2 MiB of zeros compress to a few kilobytes; with a 1 MiB limit the
    batch is BatchTooLarge, found holding at most 1 MiB + 1 of it."""
    builder = DefaultRecordBatchBuilder(2, codec, True, 7, 2, 0, 2**31 - 1)
    builder.append(0, 1_000, None, bytes(2 << 20), [])
    data = bytes(builder.build())
    if codec:
        assert len(data) < 200_000
    assert decompressed_size(data, 1 << 20) == (1 << 20) + 1
    with pytest.raises(BatchTooLarge):
        produced_batch(data, 10, 1 << 20)
    size = decompressed_size(data, 8 << 20)
    assert (2 << 20) < size < (2 << 20) + 100  # the record's bytes and its framing
    (record,) = produced_batch(data, 10, 8 << 20).records
    assert len(record.value) == 2 << 20


@pytest.mark.parametrize("codec", [1, 3, 4], ids=["gzip", "lz4", "zstd"])
def test_every_member_of_a_compressed_payload_counts(codec: int) -> None:
    """Concatenated gzip members, lz4 or zstd frames are all inflated by the
    reader, so the bound counts them all: three 1 MiB members are 3 MiB."""
    compress = {
        1: gzip.compress,
        3: lz4.frame.compress,
        4: zstandard.ZstdCompressor().compress,
    }[codec]
    header = bytearray(61)
    header[21:23] = codec.to_bytes(2, "big")
    data = bytes(header) + compress(bytes(MIB)) * 3
    assert decompressed_size(data, 2 * MIB) == 2 * MIB + 1
    assert decompressed_size(data, 8 * MIB) == 3 * MIB
