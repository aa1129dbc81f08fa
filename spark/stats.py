"""The report's figures, aggregated by Spark: only small series reach the driver."""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import functions as F

from spark.checks import Audit

#: commit latency histogram: bins per decade, on a log scale
_BINS_PER_DECADE = 10


def collect(audit: Audit) -> dict[str, Any]:
    """Everything the report plots, and the totals it prints."""
    batches = audit.batches
    per_partition = (
        batches.groupBy("topic", "partition")
        .agg(
            F.sum(F.when(~F.col("control"), F.col("record_count"))).alias("records"),
            F.sum(F.when(F.col("control_type") == "COMMIT", 1)).alias("commit_markers"),
            F.sum(F.when(F.col("control_type") == "ABORT", 1)).alias("abort_markers"),
            F.count("*").alias("batches"),
            (F.max("last_offset") + 1).alias("end_offset"),
        )
        .join(
            audit.records.groupBy("topic", "partition").agg(
                F.sum(F.col("visible").cast("int")).alias("visible"),
                F.sum((F.col("status") == "ABORTED").cast("int")).alias("aborted"),
            ),
            ["topic", "partition"],
            "left",
        )
        .orderBy("topic", "partition")
    )
    terms = (
        audit.unique_transitions.groupBy("shard", "term")
        .agg(F.min("time_ms").alias("time_ms"))
        .orderBy("shard", "term")
    )
    out: dict[str, Any] = {
        "partitions": [_fill(r.asDict()) for r in per_partition.collect()],
        "terms": [r.asDict() for r in terms.collect()],
        "totals": {**audit.rows, "batches": batches.count()},
    }
    if audit.history is None:
        return out
    hist = audit.history
    out["totals"]["values sent"] = audit.writes.count()
    ends = audit.completions.where(F.col("op").isin("commit", "abort"))
    second = F.floor(F.col("time_ms") / 1000).cast("long")
    outcome = (
        F.when((F.col("op") == "commit") & (F.col("type") == "ok"), "commit")
        .when((F.col("op") == "abort") & (F.col("type") == "ok"), "abort")
        .otherwise("failed or unknown")
    )
    timeline = ends.groupBy(second.alias("second"), outcome.alias("outcome")).count()
    out["timeline"] = [r.asDict() for r in timeline.orderBy("second").collect()]
    latency = (
        ends.where(
            (F.col("op") == "commit") & (F.col("type") == "ok") & (F.col("inv_type") == "invoke")
        )
        .select((F.col("time_ms") - F.col("inv_time")).alias("ms"))
        .where(F.col("ms") >= 0)
    )
    quantiles = latency.agg(
        F.percentile_approx("ms", [0.5, 0.9, 0.99], 10000).alias("q"),
        F.max("ms").alias("max"),
        F.count("*").alias("n"),
    ).first()
    binned = latency.groupBy(
        F.floor(F.log10(F.greatest(F.col("ms"), F.lit(0.01))) * _BINS_PER_DECADE).alias("bin")
    ).count()
    out["latency"] = {
        "n": quantiles["n"] if quantiles else 0,
        "p50_p90_p99": list(quantiles["q"] or []) if quantiles else [],
        "max": quantiles["max"] if quantiles else None,
        "bins": [
            (r["bin"] / _BINS_PER_DECADE, r["count"]) for r in binned.orderBy("bin").collect()
        ],
    }
    faults = (
        hist.where(F.col("op") == "fault")
        .select("index", "time_ms", "phase", "fault", "targets", "detail")
        .orderBy("index")
    )
    out["faults"] = _fault_windows([r.asDict() for r in faults.collect()])
    out["summary"] = _summary(hist)
    return out


def _fill(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (0 if v is None else v) for k, v in row.items()}


def _fault_windows(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pair each fault's start with its end (the next end of that fault and targets)."""
    windows: list[dict[str, Any]] = []
    open_: dict[tuple[str, str], dict[str, Any]] = {}
    for e in events:
        key = (e["fault"] or "", e["targets"] or "")
        if e["phase"] == "start":
            window = {
                "fault": e["fault"],
                "targets": json.loads(e["targets"]) if e["targets"] else None,
                "detail": e["detail"],
                "start_ms": e["time_ms"],
                "end_ms": None,
            }
            windows.append(window)
            open_[key] = window
        elif e["phase"] == "end":
            started = open_.pop(key, None)
            if started is None:  # an end with no start, e.g. the final heal's
                continue
            started["end_ms"] = e["time_ms"]
            if e["detail"]:
                started["detail"] = f"{started['detail'] or ''} / {e['detail']}".strip(" /")
    return windows


def _summary(hist: Any) -> dict[str, Any]:
    counts = (
        hist.where(F.col("type") != "invoke")
        .groupBy("op", "type")
        .count()
        .orderBy("op", "type")
        .collect()
    )
    span = hist.agg(F.min("time_ms").alias("a"), F.max("time_ms").alias("b")).first()
    return {
        "ops": {f"{r['op']} {r['type']}": r["count"] for r in counts},
        "start_ms": span["a"] if span else None,
        "end_ms": span["b"] if span else None,
    }
