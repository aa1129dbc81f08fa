"""A partition-log node's Prometheus metrics (docs/metrics.md), read from
its partitions when scraped. Produce and fetch rates, bytes and latencies
are the node's ``raftcoord_rpc_*`` (by method); fsyncs are
``raftcoord_fsync_duration_seconds``."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from partition_log.partition import Partition
from raftcoord.protocol.metrics import Metrics

#: Of ``raftcoord_partition_log_batches_per_fsync``.
BATCHES_PER_FSYNC_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)


def batches_per_fsync(metrics: Metrics) -> Callable[[int], None]:
    """What a node's partitions call with the batches each group fsync covered
    (``partition_log.partition.group_commit_observer``)."""
    return metrics.histogram(
        "raftcoord_partition_log_batches_per_fsync",
        "Batches (appends and markers) each group fsync of a leader's log covered",
        buckets=BATCHES_PER_FSYNC_BUCKETS,
    ).observe


class PartitionCollector(Collector):
    """Reads the offsets and open transactions of every partition that
    ``partitions`` returns, and how many are refused (``refused``)."""

    def __init__(
        self, partitions: Callable[[], list[Partition]], refused: Callable[[], int]
    ) -> None:
        self._partitions = partitions
        self._refused = refused

    def collect(self) -> Iterator[Metric]:
        labels = ["topic", "partition"]
        start = GaugeMetricFamily(
            "raftcoord_partition_log_start_offset", "First offset kept", labels=labels
        )
        end = GaugeMetricFamily(
            "raftcoord_partition_log_end_offset", "Offset of the next record", labels=labels
        )
        high = GaugeMetricFamily(
            "raftcoord_partition_high_watermark",
            "Offset below which records are readable (the log end: one replica)",
            labels=labels,
        )
        stable = GaugeMetricFamily(
            "raftcoord_partition_last_stable_offset",
            "Offset below which no transaction is open (read_committed reads up to it)",
            labels=labels,
        )
        lag = GaugeMetricFamily(
            "raftcoord_partition_lso_lag",
            "High watermark minus last stable offset (records read_committed cannot see yet)",
            labels=labels,
        )
        open_txns = GaugeMetricFamily(
            "raftcoord_partition_open_transactions",
            "Producers with a transaction open on the partition",
            labels=labels,
        )
        count = GaugeMetricFamily("raftcoord_partitions", "Partitions this node serves")
        refused = GaugeMetricFamily(
            "raftcoord_partitions_refused", "Partitions whose log failed recovery (not served)"
        )
        partitions = self._partitions()
        for partition in partitions:
            name = [partition.topic, str(partition.index)]
            first, lso, hw = partition.offsets()
            start.add_metric(name, float(first))
            end.add_metric(name, float(partition.log_end()))
            high.add_metric(name, float(hw))
            stable.add_metric(name, float(lso))
            lag.add_metric(name, float(hw - lso))
            open_txns.add_metric(name, float(len(partition.open_transactions())))
        count.add_metric([], float(len(partitions)))
        refused.add_metric([], float(self._refused()))
        yield from (start, end, high, stable, lag, open_txns, count, refused)
