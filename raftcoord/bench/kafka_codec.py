"""Kafka message codecs compared: kio against kafka-python's protocol classes.

    raftcoord bench kafka-codec [--iterations 2000] [--partitions 10]

The gateway decodes every request and encodes every response (docs/kafka.md,
"Codec"). For the two messages that carry the data path, a Produce v9
request (what the gateway decodes) and a Fetch v12 response (what it
encodes), each with ``--partitions`` partitions of one 1 KiB record batch,
both libraries build the same message, encode it and decode it; the table
prints microseconds per message and the ratio. "build + encode" also
builds the message each time from plain values (for kio through the
gateway's ``build``, which picks the version's fields), as the gateway
does for every response. Both encodings are checked to
be byte-identical first. Numbers vary with the machine: compare the ratios.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from rich.console import Console
from rich.table import Table

from raftcoord.kafka.messages import build

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.consumer import FetchResponse
    from kafka.protocol.producer import ProduceRequest

RECORDS = b"\x5a" * 1024


def produce_data(partitions: int) -> dict[str, Any]:
    return {
        "transactional_id": "bench",
        "acks": -1,
        "timeout": 30_000,
        "topic_data": [
            {
                "name": "bench",
                "partition_data": [{"index": i, "records": RECORDS} for i in range(partitions)],
            }
        ],
    }


def fetch_data(partitions: int) -> dict[str, Any]:
    return {
        "error_code": 0,
        "session_id": 0,
        "responses": [
            {
                "topic": "bench",
                "partitions": [
                    {
                        "partition_index": i,
                        "error_code": 0,
                        "high_watermark": 1000,
                        "last_stable_offset": 1000,
                        "log_start_offset": 0,
                        "aborted_transactions": [],
                        "records": RECORDS,
                    }
                    for i in range(partitions)
                ],
            }
        ],
    }


def kio_pair(api_key: int, version: int, request: bool, data: dict[str, Any]) -> Any:
    schema = (load_request_schema if request else load_response_schema)(api_key, version)
    entity = build(schema, data)
    write = entity_writer(schema)
    read = entity_reader(schema)

    def encode() -> bytes:
        out = io.BytesIO()
        write(out, entity)
        return out.getvalue()

    def build_and_encode() -> bytes:
        out = io.BytesIO()
        write(out, build(schema, data))
        return out.getvalue()

    encoded = encode()
    return encode, lambda: read(encoded, 0), build_and_encode, encoded


def kafka_python_produce(partitions: int) -> Any:
    topic = ProduceRequest.TopicProduceData

    def make() -> Any:
        return ProduceRequest(
            transactional_id="bench",
            acks=-1,
            timeout_ms=30_000,
            topic_data=[
                topic(
                    name="bench",
                    partition_data=[
                        topic.PartitionProduceData(index=i, records=RECORDS)
                        for i in range(partitions)
                    ],
                )
            ],
            version=9,
        )

    message = make()
    encoded = bytes(message.encode())
    return (
        lambda: bytes(message.encode()),
        lambda: ProduceRequest.decode(encoded, version=9),
        lambda: bytes(make().encode()),
        encoded,
    )


def kafka_python_fetch(partitions: int) -> Any:
    topic = FetchResponse.FetchableTopicResponse

    def make() -> Any:
        return FetchResponse(
            throttle_time_ms=0,
            error_code=0,
            session_id=0,
            responses=[
                topic(
                    topic="bench",
                    partitions=[
                        topic.PartitionData(
                            partition_index=i,
                            error_code=0,
                            high_watermark=1000,
                            last_stable_offset=1000,
                            log_start_offset=0,
                            aborted_transactions=[],
                            records=RECORDS,
                        )
                        for i in range(partitions)
                    ],
                )
            ],
            version=12,
        )

    message = make()
    encoded = bytes(message.encode())
    return (
        lambda: bytes(message.encode()),
        lambda: FetchResponse.decode(encoded, version=12),
        lambda: bytes(make().encode()),
        encoded,
    )


def per_call_us(call: Callable[[], object], iterations: int) -> float:
    call()
    start = time.perf_counter()
    for _ in range(iterations):
        call()
    return (time.perf_counter() - start) / iterations * 1e6


def run(args: argparse.Namespace) -> int:
    cases = [
        (
            f"Produce v9 request, {args.partitions} partitions",
            kio_pair(0, 9, True, produce_data(args.partitions)),
            kafka_python_produce(args.partitions),
        ),
        (
            f"Fetch v12 response, {args.partitions} partitions",
            kio_pair(1, 12, False, fetch_data(args.partitions)),
            kafka_python_fetch(args.partitions),
        ),
    ]
    table = Table(title=f"Kafka message codecs, µs per message ({args.iterations} iterations)")
    for column in ("message", "operation", "kio", "kafka-python", "kafka-python / kio"):
        table.add_column(column, justify="left" if column in ("message", "operation") else "right")
    for name, kio_case, kp_case in cases:
        if kio_case[3] != kp_case[3]:
            print(f"{name}: the two encodings differ", file=sys.stderr)
            return 1
        for operation, index in (("encode", 0), ("decode", 1), ("build + encode", 2)):
            kio_us = per_call_us(kio_case[index], args.iterations)
            kp_us = per_call_us(kp_case[index], args.iterations)
            table.add_row(name, operation, f"{kio_us:.1f}", f"{kp_us:.1f}", f"{kp_us / kio_us:.2f}")
    Console().print(table)
    return 0
