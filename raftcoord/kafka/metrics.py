"""A Kafka gateway's Prometheus metrics (docs/metrics.md): connections,
requests by API and error, latency, and request bytes held in memory."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from raftcoord.kafka import messages as m
from raftcoord.protocol.metrics import Metrics, error_name

#: Kafka's name of each API the gateway serves (the ``api`` label).
API_NAMES: dict[int, str] = {
    m.PRODUCE: "Produce",
    m.FETCH: "Fetch",
    m.LIST_OFFSETS: "ListOffsets",
    m.METADATA: "Metadata",
    m.OFFSET_COMMIT: "OffsetCommit",
    m.OFFSET_FETCH: "OffsetFetch",
    m.FIND_COORDINATOR: "FindCoordinator",
    m.JOIN_GROUP: "JoinGroup",
    m.HEARTBEAT: "Heartbeat",
    m.LEAVE_GROUP: "LeaveGroup",
    m.SYNC_GROUP: "SyncGroup",
    m.DESCRIBE_GROUPS: "DescribeGroups",
    m.SASL_HANDSHAKE: "SaslHandshake",
    m.API_VERSIONS: "ApiVersions",
    m.CREATE_TOPICS: "CreateTopics",
    m.INIT_PRODUCER_ID: "InitProducerId",
    m.ADD_PARTITIONS_TO_TXN: "AddPartitionsToTxn",
    m.ADD_OFFSETS_TO_TXN: "AddOffsetsToTxn",
    m.END_TXN: "EndTxn",
    m.TXN_OFFSET_COMMIT: "TxnOffsetCommit",
    m.DESCRIBE_ACLS: "DescribeAcls",
    m.CREATE_ACLS: "CreateAcls",
    m.DELETE_ACLS: "DeleteAcls",
    m.SASL_AUTHENTICATE: "SaslAuthenticate",
    m.DESCRIBE_TRANSACTIONS: "DescribeTransactions",
    m.LIST_TRANSACTIONS: "ListTransactions",
}


def first_error(data: Any, depth: int = 3) -> int:
    """The first non-zero ``error_code`` of a response body: its own, else
    one of its entries' (topics, partitions), up to ``depth`` levels down."""
    if isinstance(data, dict):
        code = data.get("error_code")
        if code:
            return int(code)
        if depth:
            for value in data.values():
                if isinstance(value, list):
                    for entry in value:
                        found = first_error(entry, depth - 1)
                        if found:
                            return found
    return 0


class GatewayMetrics:
    """What a gateway counts as it serves; ``connections`` and ``held_bytes``
    are read when scraped."""

    def __init__(
        self, metrics: Metrics, connections: Callable[[], int], held_bytes: Callable[[], int]
    ) -> None:
        self._requests = metrics.counter(
            "raftcoord_kafka_requests_total",
            "Kafka requests answered, by API and error (the first error in the answer)",
            ["api", "error"],
        )
        self._latency = metrics.histogram(
            "raftcoord_kafka_request_duration_seconds", "Time to answer a Kafka request", ["api"]
        )
        self.opened = metrics.counter(
            "raftcoord_kafka_connections_opened_total", "Client connections accepted"
        )
        self.refused = metrics.counter(
            "raftcoord_kafka_connections_refused_total",
            "Client connections refused, by the limit they hit",
            ["reason"],
        )
        metrics.add(_Gauges(connections, held_bytes))

    def answered(self, api_key: int, data: Any, started: float) -> None:
        """A request of ``api_key`` begun at ``started`` (perf_counter) was
        answered with ``data`` (None: failed, its connection closed)."""
        api = API_NAMES.get(api_key, str(api_key))
        self._latency.labels(api).observe(time.perf_counter() - started)
        error = "CONNECTION_CLOSED" if data is None else error_name(first_error(data))
        self._requests.labels(api, error).inc()


class _Gauges(Collector):
    def __init__(self, connections: Callable[[], int], held_bytes: Callable[[], int]) -> None:
        self._connections = connections
        self._held_bytes = held_bytes

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "raftcoord_kafka_connections", "Open client connections", value=self._connections()
        )
        yield GaugeMetricFamily(
            "raftcoord_kafka_inflight_request_bytes",
            "Bytes of request frames read and not yet answered",
            value=self._held_bytes(),
        )
