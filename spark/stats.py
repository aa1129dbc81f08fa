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
    out["summary"] = _summary(hist)
    out["timeline"] = zero_filled(
        [r.asDict() for r in timeline.orderBy("second").collect()],
        out["summary"]["start_ms"],
        out["summary"]["end_ms"],
    )
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
        .select("index", "time_ms", "phase", "fault", "targets", "detail", "hold_s")
        .orderBy("index")
    )
    out["faults"] = _fault_windows([r.asDict() for r in faults.collect()])
    runs = hist.where(F.col("op") == "run").select("index", "type", "info").orderBy("index")
    out["run"] = run_header([r.asDict() for r in runs.collect()])
    return out


#: The outcomes of a transaction's end, as the timeline counts them.
OUTCOMES = ("commit", "abort", "failed or unknown")
#: A run longer than this (or a clock gone wrong) is not filled second by
#: second: only the seconds around each gap get their zeros.
MAX_FILLED_SECONDS = 7 * 24 * 3600


def zero_filled(
    rows: list[dict[str, Any]], start_ms: float | None, end_ms: float | None
) -> list[dict[str, Any]]:
    """The timeline's rows (``second``, ``outcome``, ``count``) with a row of
    count 0 for every outcome in every second from the run's start to its end
    that has none, so that a plot does not join its lines across a quiet
    gap; sorted by second, then outcome. Over more than
    :data:`MAX_FILLED_SECONDS`, the zeros are the seconds just before and
    after each second that has counts."""
    counts = {(r["second"], r["outcome"]): r["count"] for r in rows}
    seconds = {r["second"] for r in rows}
    if (
        start_ms is not None
        and end_ms is not None
        and 0 <= end_ms - start_ms <= MAX_FILLED_SECONDS * 1000
    ):
        seconds.update(range(int(start_ms // 1000), int(end_ms // 1000) + 1))
    else:
        seconds.update([s + step for s in seconds for step in (-1, 1)])
    outcomes = list(OUTCOMES) + sorted({r["outcome"] for r in rows} - set(OUTCOMES))
    return [
        {"second": s, "outcome": o, "count": counts.get((s, o), 0)}
        for s in sorted(seconds)
        for o in outcomes
    ]


def run_header(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What the run's ``run`` events say about it (docs/history.md): from
    the first, ``seed`` and ``args``; from the last (type ``ok``), its
    ``summary``. Missing pieces are left out."""
    out: dict[str, Any] = {}
    parsed = []
    for e in events:
        try:
            info = json.loads(e["info"]) if e.get("info") else {}
        except ValueError:
            continue
        if isinstance(info, dict):
            parsed.append((e.get("type"), info))
    if parsed and parsed[0][0] == "info":
        first = parsed[0][1]
        out.update({k: first[k] for k in ("seed", "args") if first.get(k) is not None})
    last = [info for type_, info in parsed if type_ == "ok"]
    if last and isinstance(last[-1].get("summary"), dict):
        out["summary"] = last[-1]["summary"]
    return out


def _fill(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (0 if v is None else v) for k, v in row.items()}


def _fault_windows(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pair each fault's start with its end (the next end of that fault and
    targets); ``hold_s`` is the planned hold its start recorded (None in a
    history from before it was recorded)."""
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
                "hold_s": e.get("hold_s"),
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
