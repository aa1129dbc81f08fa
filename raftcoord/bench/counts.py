"""What a committed transaction costs, counted from the nodes' own counters.

Before and after a load step the bench reads every node's Prometheus
endpoint and each node process's context switches (every thread's
``/proc/PID/task/*/status``); :func:`per_transaction` divides the
differences by the step's committed transactions: calls by node kind and
method (gRPC and cluster links alike, ``raftcoord_rpc_requests_total``; a
gateway's Kafka requests by API), Raft entries (the shards' applied
indexes), fsyncs by node kind, context switches by node kind, and how deep
the batches were (partition-log batches per fsync, transactions per call
of each method). Counting, not timing: the figures hold on a noisy machine.
"""

from __future__ import annotations

import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from raftcoord.cluster.launcher import LocalCluster

__all__ = ["Reading", "per_transaction", "read", "rows"]

#: How the counts name each kind of node.
KINDS = {"coordinator": "coordinator", "partition-log": "partition log", "kafka-gateway": "gateway"}


@dataclass
class Reading:
    """The counters of every node at one moment, summed per node kind."""

    #: (kind, method) -> calls answered.
    calls: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    #: kind -> fsyncs.
    fsyncs: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    #: kind -> context switches (voluntary and not) of its processes.
    switches: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    #: shard -> the highest applied index among its replicas.
    applied: dict[str, float] = field(default_factory=dict)
    #: Partition-log batches appended by group fsyncs, and those fsyncs.
    batches_synced: float = 0.0
    group_fsyncs: float = 0.0


def read(cluster: LocalCluster) -> Reading:
    """Every node's counters now (a node that does not answer counts nothing)."""
    assert cluster.state is not None
    reading = Reading()
    for node in cluster.state.nodes:
        kind = KINDS.get(node.kind, node.kind)
        reading.switches[kind] += _context_switches(node.pid)
        if not node.metrics:
            continue
        try:
            with urllib.request.urlopen(f"http://{node.metrics}/metrics", timeout=5) as answer:
                text = answer.read().decode()
        except OSError:
            continue
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                _note(reading, kind, sample.name, sample.labels, sample.value)
    return reading


def _note(reading: Reading, kind: str, name: str, labels: dict[str, str], value: float) -> None:
    if name == "raftcoord_rpc_requests_total":
        reading.calls[(kind, labels["method"].rsplit("/", 1)[-1])] += value
    elif name == "raftcoord_kafka_requests_total":  # a gateway's Kafka requests
        reading.calls[(kind, labels["api"])] += value
    elif name == "raftcoord_fsync_duration_seconds_count":
        reading.fsyncs[kind] += value
    elif name == "raftcoord_shard_applied_index":
        shard = labels.get("shard", "")
        reading.applied[shard] = max(reading.applied.get(shard, 0.0), value)
    elif name == "raftcoord_partition_log_batches_per_fsync_sum":
        reading.batches_synced += value
    elif name == "raftcoord_partition_log_batches_per_fsync_count":
        reading.group_fsyncs += value


def _context_switches(pid: int) -> float:
    """The context switches of every thread of process ``pid`` (0 when gone)."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:
            continue  # a thread that ended meanwhile
        total += sum(
            int(line.split()[1])
            for line in lines
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
        )
    return float(total)


def per_transaction(before: Reading, after: Reading, committed: int) -> dict[str, Any]:
    """What one committed transaction cost between ``before`` and ``after``
    (empty when nothing committed)."""
    if committed <= 0:
        return {}
    calls = {}
    for (kind, method), value in sorted(after.calls.items()):
        made = value - before.calls.get((kind, method), 0.0)
        if made > 0:
            calls[f"{kind} {method}"] = made / committed
    fsyncs = {
        kind: (after.fsyncs[kind] - before.fsyncs.get(kind, 0.0)) / committed
        for kind in sorted(after.fsyncs)
    }
    switches = {
        kind: (after.switches[kind] - before.switches.get(kind, 0.0)) / committed
        for kind in sorted(after.switches)
    }
    entries = sum(value - before.applied.get(shard, 0.0) for shard, value in after.applied.items())
    group_fsyncs = after.group_fsyncs - before.group_fsyncs
    return {
        "calls": calls,
        "raft_entries": entries / committed,
        "fsyncs": fsyncs,
        "context_switches": switches,
        "batches_per_fsync": (
            (after.batches_synced - before.batches_synced) / group_fsyncs if group_fsyncs else 0.0
        ),
    }


def rows(steps: list[tuple[str, dict[str, Any]]]) -> tuple[list[str], list[list[str]]]:
    """The header and rows of a table of ``steps`` (a label and its
    :func:`per_transaction`), one column per step: each row one figure per
    committed transaction (calls by node kind and method; a call's
    transactions, its batch depth, is the inverse)."""
    header = ["per committed transaction", *(label for label, _ in steps)]
    names: list[tuple[str, str, str]] = [("Raft entries", "raft_entries", "")]
    for section, key in (("fsyncs", "fsyncs"), ("context switches", "context_switches")):
        kinds = sorted({k for _, counts in steps for k in counts.get(key, {})})
        names += [(f"{section}, {kind}", key, kind) for kind in kinds]
    methods = sorted({m for _, counts in steps for m in counts.get("calls", {})})
    names += [(f"calls, {method}", "calls", method) for method in methods]
    names.append(("partition-log batches per fsync", "batches_per_fsync", ""))
    table = []
    for label, key, sub in names:
        cells = []
        for _, counts in steps:
            value = counts.get(key)
            if isinstance(value, dict):
                value = value.get(sub)
            cells.append("" if value is None else f"{value:.2f}")
        table.append([label, *cells])
    return header, table
