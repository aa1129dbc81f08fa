"""The Kafka gateway's pure parts: message framing (kio).
Messages are made or read back with kafka-python, an independent
implementation of the same formats (produced batches:
tests/test_produced_batches.py)."""

from __future__ import annotations

import io
import os
import re
import struct
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.schema.request_header.v2.header import RequestHeader
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from raftcoord.kafka import messages as m

ROOT = Path(__file__).resolve().parents[1]

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.metadata import ApiVersionsResponse
    from kafka.protocol.producer import ProduceRequest


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


# A request header: api key, version, correlation id, client id "c"; then,
# for flexible versions, no tagged fields.
def _header(key: int, version: int, flexible: bool) -> bytes:
    return struct.pack(">hhih", key, version, 7, 1) + b"c" + (b"\x00" if flexible else b"")


@pytest.mark.parametrize(
    ("what", "frame"),
    [
        # DescribeGroups v5: a compact array of 2**32 - 2 group ids.
        ("compact", _header(15, 5, True) + b"\xff\xff\xff\xff\x0f"),
        # Metadata v1: a legacy array of 2**31 - 1 topics.
        ("legacy", _header(3, 1, False) + struct.pack(">i", 2**31 - 1)),
        # Produce v9: one topic whose partitions array counts 2**31 - 2.
        (
            "nested",
            _header(0, 9, True)
            + b"\x00"
            + struct.pack(">hi", -1, 1000)
            + b"\x02\x02t"
            + b"\xff\xff\xff\xff\x07",
        ),
    ],
    ids=["compact", "legacy", "nested"],
)
def test_an_array_count_over_the_bytes_left_is_refused_before_kio_reads_it(
    what: str, frame: bytes
) -> None:
    """kio's native reader reserves room for an array's count before it reads
    any element: such a count from a frame of a few bytes would end the
    process (an allocation failure aborts). Decoded in a child process, so
    that a regression fails this test instead of ending the run."""
    code = (
        "import sys; from raftcoord.kafka import messages as m\n"
        "try:\n    m.decode_request(bytes.fromhex(sys.argv[1]))\n"
        "except m.MalformedRequest as exc:\n    print('refused:', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, frame.hex()],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, (what, done.returncode, done.stderr[-500:])
    assert "refused: a count of" in done.stdout, (what, done.stdout)


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


def test_the_docs_list_exactly_the_advertised_versions() -> None:
    """docs/kafka.md's API table names each advertised API with its range."""
    table = (Path(__file__).parent.parent / "docs" / "kafka.md").read_text()
    rows = re.findall(r"^\| [A-Za-z]+ \((\d+)\) \| (\d+)(?:\u2013(\d+))? \|", table, re.MULTILINE)
    listed = {int(key): (int(low), int(high or low)) for key, low, high in rows}
    assert listed == m.SUPPORTED
