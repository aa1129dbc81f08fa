"""The audit's outputs: a table in the terminal, ``audit.json`` and ``audit.html``.

The HTML report is one file with its plots embedded (base64 PNG): it opens
without a network. It shows the verdict first, then the run (seed, duration,
nodes, settings, the faults asked for and what they did, the audit's own
time), the checks, the commits, aborts and failures per second with the
faults drawn in lanes under the plot (one lane per fault kind: the planned
hold solid, any time past it hatched), the commit latency distribution,
leader changes (Raft terms) of every shard, the records and markers of
every partition, and the totals in words.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from raftcoord.chaos.tables import print_unwrapped
from raftcoord.chaos.verdict import run_problems, verdict
from spark.checks import CheckResult

_COLOURS = {"PASS": "green", "FAIL": "bold red", "SKIP": "yellow", "INCOMPLETE": "bold yellow"}


def judge(
    results: list[CheckResult], summary: dict[str, Any] | None = None
) -> tuple[str, list[str], list[str]]:
    """The verdict of the checks and of the run's summary (the last ``run``
    event's, when the history has one), by the rule of
    :mod:`raftcoord.chaos.verdict`: (verdict, what failed, what is incomplete).
    A check failed when it found a violation; incomplete when it did not run or
    had nothing to judge (a run that nobody fully checked proves nothing), and
    with no check at all."""
    run_failures, shortfalls = run_problems(summary or {})
    failed = [f"{r.name}: {r.count} violations" for r in results if r.status == "FAIL"]
    incomplete = [f"{r.name}: {r.incomplete}" for r in results if r.incomplete and not r.count]
    if not results:
        incomplete.append("no check ran")
    failed += run_failures
    incomplete += shortfalls
    return verdict(failed, incomplete), failed, incomplete


def print_table(results: list[CheckResult], console: Console | None = None) -> None:
    """The checks' results; on a terminal the example column is folded at 70
    columns, into a file or a pipe each check stays on one line."""
    console = console or Console()
    table = Table(title="raftcoord audit")
    table.add_column("check")
    table.add_column("result")
    table.add_column("count", justify="right")
    table.add_column(
        "first example / why not judged",
        overflow="fold",
        max_width=70 if console.is_terminal else None,
    )
    for r in results:
        note = r.incomplete or (json.dumps(r.examples[0], default=str)[:200] if r.examples else "")
        table.add_row(r.name, f"[{_COLOURS[r.status]}]{r.status}[/]", str(r.count), note)
    print_unwrapped(console, table)


def print_verdict(document: dict[str, Any], console: Console | None = None) -> None:
    """The verdict of a report's document, with what failed and what is incomplete."""
    console = console or Console()
    v = document["verdict"]
    console.print(f"verdict: [{_COLOURS[v]}]{v}[/]")
    for what, reasons in (("failed", document["failed"]), ("incomplete", document["incomplete"])):
        if reasons:
            console.print(f"{what}:")
            for reason in reasons:
                console.print(f"  {reason}")


def to_json(
    results: list[CheckResult],
    stats: dict[str, Any],
    inputs: dict[str, Any],
    cluster: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report's document; ``cluster`` is what the cluster directory says
    of the cluster (``shards``, ``nodes``, ``shard_count``, ``settings``;
    each may be missing)."""
    verdict_, failed, incomplete = judge(results, stats.get("run", {}).get("summary"))
    return {
        "verdict": verdict_,
        "failed": failed,
        "incomplete": incomplete,
        "inputs": inputs,
        "cluster": cluster or {},
        "checks": [
            {
                "name": r.name,
                "description": r.description,
                "status": r.status,
                "count": r.count,
                "examples": r.examples,
                "skipped": r.skipped,
                "lacked": r.lacked,
                "incomplete": r.incomplete,
            }
            for r in results
        ],
        "stats": stats,
    }


def write(report_dir: Path, document: dict[str, Any]) -> tuple[Path, Path]:
    """Write ``audit.json`` and ``audit.html`` into ``report_dir``; returns their paths."""
    report_dir.mkdir(parents=True, exist_ok=True)
    json_path = report_dir / "audit.json"
    json_path.write_text(json.dumps(document, indent=1, default=str))
    html_path = report_dir / "audit.html"
    html_path.write_text(_html(document))
    return json_path, html_path


# --- the pure pieces: faults' lanes and timing, totals' words ---------------------------------

#: A fault kind's colour in the lanes (kinds not listed take the fallback colours in turn).
FAULT_COLOURS = {
    "leader-kill": "#d6604d",
    "minority-kill": "#8c510a",
    "pause": "#4393c3",
    "plog-restart": "#762a83",
    "plog-leader-kill": "#9970ab",
    "plog-wipe": "#5aae61",
    "plog-partition": "#01665e",
    "partition": "#1b7837",
    "disk": "#e08214",
}
_FALLBACK_COLOURS = ("#636363", "#c51b7d", "#35978f", "#bf812d")


@dataclass(frozen=True)
class Span:
    """A piece of a fault's window in its lane, in seconds since the run started.

    ``part``: ``planned`` (within the planned hold), ``overrun`` (past the
    planned hold, until the fault's end event), ``unplanned`` (the whole
    window of a fault whose start recorded no planned hold) or ``open`` (a
    fault that never ended, from where its planned hold ends, or its start,
    to the end of the history)."""

    start_s: float
    end_s: float
    part: str


@dataclass(frozen=True)
class Lane:
    """One fault kind's row under a time plot."""

    fault: str
    colour: str
    spans: tuple[Span, ...]
    #: how many faults of this kind it shows
    count: int


def ran(window: dict[str, Any]) -> bool:
    """Whether a fault window is a fault that ran (not the record of a kind
    that cannot run here: empty targets, a detail beginning ``not run``)."""
    return not (not window.get("targets") and str(window.get("detail") or "").startswith("not run"))


def lasted_s(window: dict[str, Any]) -> float | None:
    """How long the fault lasted, from its start to its end event (None: it never ended)."""
    if window.get("end_ms") is None:
        return None
    return (float(window["end_ms"]) - float(window["start_ms"])) / 1000


def overrun_s(window: dict[str, Any]) -> float | None:
    """How long the fault went on past its planned hold, until its end event
    (0 when it ended within it); None when the hold was not recorded or the
    fault never ended."""
    lasted, hold = lasted_s(window), window.get("hold_s")
    if lasted is None or hold is None:
        return None
    return max(0.0, lasted - float(hold))


def hold_label(window: dict[str, Any]) -> str:
    """The faults table's words for how long a fault was held:
    ``planned 2.1 s, lasted 9.8 s (7.7 s past the plan)``."""
    hold, lasted = window.get("hold_s"), lasted_s(window)
    said = [] if hold is None else [f"planned {_seconds(float(hold))} s"]
    if lasted is None:
        said.append("never ended")
    else:
        said.append(f"lasted {_seconds(lasted)} s")
        over = overrun_s(window)
        if over is not None and float(_seconds(over)) > 0:
            said[-1] += f" ({_seconds(over)} s past the plan)"
    return ", ".join(said)


def _seconds(s: float) -> str:
    """Seconds to a tenth, or to a hundredth below one."""
    return f"{s:.2f}" if abs(s) < 0.95 else f"{s:.1f}"


def lane_colours(kinds: Iterable[str]) -> dict[str, str]:
    """A colour for each fault kind, the same in every plot and key."""
    colours: dict[str, str] = {}
    spare = 0
    for kind in kinds:
        if kind in colours:
            continue
        if kind in FAULT_COLOURS:
            colours[kind] = FAULT_COLOURS[kind]
        else:
            colours[kind] = _FALLBACK_COLOURS[spare % len(_FALLBACK_COLOURS)]
            spare += 1
    return colours


def fault_lanes(faults: list[dict[str, Any]], t0_ms: float, end_ms: float) -> list[Lane]:
    """One lane per fault kind that ran, in the order the kinds first
    started: each fault's planned hold, then any overrun up to its end event
    (or, for a fault that never ended, up to ``end_ms``, the history's end)."""
    windows = [w for w in faults if ran(w)]
    colours = lane_colours(str(w["fault"]) for w in windows)
    spans: dict[str, list[Span]] = {kind: [] for kind in colours}
    for w in windows:
        start = (float(w["start_ms"]) - t0_ms) / 1000
        ended = w.get("end_ms") is not None
        stop = (float(w["end_ms"] if ended else max(end_ms, w["start_ms"])) - t0_ms) / 1000
        lane = spans[str(w["fault"])]
        hold = w.get("hold_s")
        if hold is None:
            lane.append(Span(start, stop, "unplanned" if ended else "open"))
            continue
        planned_end = start + float(hold)
        lane.append(Span(start, min(planned_end, stop) if ended else planned_end, "planned"))
        if stop > planned_end:
            lane.append(Span(planned_end, stop, "overrun" if ended else "open"))
    counts = {kind: sum(1 for w in windows if w["fault"] == kind) for kind in colours}
    return [Lane(kind, colours[kind], tuple(spans[kind]), counts[kind]) for kind in colours]


#: The totals' words; a key not listed here is ``<op> <type>`` of the
#: history's operations (see :func:`total_words`) or shown as it is.
TOTAL_WORDS = {
    "segment rows": "records read from the partition logs (every replica)",
    "batches": "batches in the partition logs (data and markers)",
    "transitions (all replicas)": "coordinator transitions read (every replica's)",
    "history events": "events in the history",
    "values sent": "values sent (send invoked)",
    "commit ok": "transactions committed (commit ok)",
    "commit fail": "commits that failed, not committed (commit fail)",
    "commit info": "commits of unknown outcome (commit info)",
    "abort ok": "transactions aborted (abort ok)",
    "abort fail": "aborts that failed (abort fail)",
    "abort info": "aborts of unknown outcome (abort info)",
    "send ok": "sends acknowledged (send ok)",
    "send fail": "sends that failed, not written (send fail)",
    "send info": "sends of unknown outcome (send info)",
    "poll ok": "polls answered (poll ok)",
    "init ok": "producers initialised (init ok)",
    "offsets ok": "consumed offsets added to transactions (offsets ok)",
    "fault info": "nemesis fault events, starts and ends (fault info)",
    "run info": "run start events (run info)",
    "run ok": "run end events (run ok)",
    "final ok": "final reads (final ok)",
}
_OUTCOME_WORDS = {"ok": "succeeded", "fail": "failed", "info": "ended with an unknown outcome"}


def total_words(key: str) -> str:
    """A total's name in words: :data:`TOTAL_WORDS`, else for a history
    operation's count (``<op> <type>``) what it counts, else the key."""
    if key in TOTAL_WORDS:
        return TOTAL_WORDS[key]
    op, _, type_ = key.rpartition(" ")
    if op and type_ in _OUTCOME_WORDS:
        return f"{op} operations that {_OUTCOME_WORDS[type_]} ({key})"
    return key


# --- HTML ------------------------------------------------------------------------------------

_STYLE = """
body { font-family: sans-serif; margin: 2em; max-width: 75em; color: #222; }
.verdict { font-size: 2.2em; font-weight: bold; padding: .3em .6em; display: inline-block; }
.PASS { background: #d9f2d9; color: #155715; } .FAIL { background: #f8d7d7; color: #8a1212; }
.SKIP, .INCOMPLETE { background: #fff3cd; color: #7a5b00; }
table { border-collapse: collapse; margin: 1em 0; }
td, th { border: 1px solid #ccc; padding: .25em .6em; text-align: left; vertical-align: top; }
td.n { text-align: right; } code { font-size: .85em; white-space: pre-wrap; }
table.run > tbody > tr > th { background: #f3f3f3; white-space: nowrap; }
table.run table { margin: 0; } table.run table td, table.run table th { font-size: .9em; }
img { max-width: 100%; } figure { margin: 1em 0; }
ul.lanes { list-style: none; padding: 0; margin: .3em 0; }
ul.lanes li { display: inline-block; margin-right: 1.5em; }
.swatch { display: inline-block; width: 1.4em; height: .9em; vertical-align: middle;
  margin-right: .3em; border: 1px solid #888; }
.note { color: #555; font-size: .9em; }
td.none { color: #7a5b00; font-style: italic; }
td.held, #faults td:first-child { white-space: nowrap; }
"""


def _verdict_reasons(doc: dict[str, Any]) -> str:
    """Under the verdict: what failed and what was not judged."""
    parts = []
    for key, heading in (
        ("failed", "What failed:"),
        ("incomplete", "Not everything was judged, so this run is not proven exactly-once:"),
    ):
        reasons = doc.get(key) or []
        if reasons:
            items = "".join(f"<li>{html.escape(r)}</li>" for r in reasons)
            parts.append(f"<p>{heading}</p><ul id='{key}'>{items}</ul>")
    return "".join(parts)


def _html(doc: dict[str, Any]) -> str:
    stats = doc["stats"]
    t0, end = _span(stats)
    lanes = fault_lanes(stats.get("faults", []), t0, end)
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>raftcoord audit</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>raftcoord exactly-once audit</h1>",
        f"<div id='verdict' class='verdict {doc['verdict']}'>{doc['verdict']}</div>",
        _verdict_reasons(doc),
        _run_section(doc),
        "<h2>Checks</h2><table id='checks'><tr><th>check</th><th>result</th><th>count</th>"
        "<th>meaning</th><th>examples</th></tr>",
    ]
    for c in doc["checks"]:
        examples = c.get("incomplete") or "\n".join(
            json.dumps(e, default=str) for e in c["examples"]
        )
        parts.append(
            f"<tr><td>{c['name']}</td><td class='{c['status']}'>{c['status']}</td>"
            f"<td class='n'>{c['count']}</td><td>{html.escape(c['description'])}</td>"
            f"<td><code>{html.escape(examples)}</code></td></tr>"
        )
    parts.append("</table>")
    if "timeline" in stats:
        parts.append("<h2>Transactions over time</h2>")
        parts.append(
            _figure_html(
                "timeline",
                _timeline_plot(stats, lanes, t0),
                "transactions ended per second, with the fault lanes under it",
                lanes,
            )
        )
        parts.append(_lane_key(lanes, stats.get("faults", [])))
        parts.append(_faults_table(stats.get("faults", []), t0))
        parts.append("<h2>Commit latency</h2>")
        parts.append(_latency_text(stats["latency"]))
        parts.append(_figure_html("latency", _latency_plot(stats["latency"]), "commit latency", []))
    shards = _shards(doc)
    parts.append("<h2>Leader changes</h2>")
    parts.append(
        _figure_html(
            "terms",
            _terms_plot(stats, shards, lanes, t0, end),
            "the Raft term of every shard over time, with the fault lanes under it",
            lanes,
        )
    )
    if lanes:
        parts.append(_lane_key(lanes, [], explain=False))
    parts.append(_leader_table(stats, shards, t0))
    parts.append("<h2>Partitions</h2>")
    parts.append(
        _figure_html(
            "partitions",
            _partitions_plot(stats["partitions"]),
            "records and markers per partition",
            [],
        )
    )
    parts.append(_partitions_table(stats["partitions"]))
    parts.append("<h2>Totals</h2><table id='totals'>")
    totals = dict(stats["totals"])
    totals.update(stats.get("summary", {}).get("ops", {}))
    parts.extend(
        f"<tr><td>{html.escape(total_words(k))}</td><td class='n'>{v}</td></tr>"
        for k, v in totals.items()
    )
    parts.append("</table></body></html>")
    return "\n".join(parts)


def _span(stats: dict[str, Any]) -> tuple[float, float]:
    """The run's start and end (ms): the history's first and last events,
    else the first and last leader change."""
    summary = stats.get("summary", {})
    times = [t["time_ms"] for t in stats["terms"] if t["time_ms"] is not None]
    start = summary.get("start_ms")
    if start is None:
        start = min(times) if times else 0.0
    end = summary.get("end_ms")
    if end is None:
        end = max(times) if times else start
    return float(start), float(end)


def _shards(doc: dict[str, Any]) -> list[int]:
    """Every shard of the cluster: those its directory shows, and those with transitions."""
    shards = {int(s) for s in doc.get("cluster", {}).get("shards", [])}
    shards.update(int(t["shard"]) for t in doc["stats"]["terms"] if t["shard"] is not None)
    return sorted(shards)


# --- the run ---------------------------------------------------------------------------------


def _run_section(doc: dict[str, Any]) -> str:
    """The run header: what ran, how it was set up, what the nemesis did, and the audit."""
    stats, cluster, inputs = doc["stats"], doc.get("cluster", {}), doc["inputs"]
    run = stats.get("run", {})
    summary = run.get("summary", {})
    args = run.get("args")
    rows: list[tuple[str, str, str]] = []
    if run.get("seed") is not None:
        rows.append(("seed", "seed", html.escape(str(run["seed"]))))
    rows.append(("duration", "duration", _duration(args, summary, stats.get("summary", {}))))
    if args:
        rows.append(("options", "workload options", _options(args)))
    nodes = cluster.get("nodes") or {}
    if nodes or cluster.get("shard_count") is not None:
        said = [
            f"{html.escape(str(kind))}: {', '.join(str(n) for n in ids)}"
            for kind, ids in nodes.items()
        ]
        if cluster.get("shard_count") is not None:
            said.append(f"{cluster['shard_count']} shards")
        rows.append(("nodes", "nodes", "; ".join(said)))
    if cluster.get("settings"):
        rows.append(("settings", "cluster settings", _key_values(cluster["settings"])))
    asked = args.get("nemesis") if isinstance(args, dict) else None
    if asked is not None:
        listed = ", ".join(map(str, asked)) if isinstance(asked, list) else str(asked)
        rows.append(("asked", "faults asked for", html.escape(listed or "none")))
    happened = _fault_report(summary)
    if happened:
        rows.append(("happened", "faults, per kind", happened))
    if "faults" in stats and not stats["faults"]:
        rows.append(("no-faults", "faults", "none: the history records no fault"))
    for key, label in (("crashed", "client processes crashed"), ("unfinished", "unfinished")):
        if summary.get(key):
            rows.append((key, label, html.escape(", ".join(map(str, summary[key])))))
    audit_time = inputs.get("audit time (s)")
    said = [f"took {audit_time} s" if audit_time is not None else ""]
    if inputs.get("master"):
        said.append(f"master {html.escape(str(inputs['master']))}")
    rows.append(("audit", "the audit", ", ".join(s for s in said if s)))
    for key in ("cluster dir", "cluster config", "history"):
        if key in inputs:
            rows.append(
                (key.replace(" ", "-"), key, f"<code>{html.escape(str(inputs[key]))}</code>")
            )
    cells = "".join(
        f"<tr data-row='{key}'><th>{label}</th><td>{value}</td></tr>" for key, label, value in rows
    )
    return f"<section id='run'><h2>The run</h2><table class='run'>{cells}</table></section>"


def _duration(args: Any, summary: dict[str, Any], span: dict[str, Any]) -> str:
    said = []
    if isinstance(args, dict):
        asked = args.get("duration_s", args.get("duration"))
        if asked is not None:
            said.append(f"{asked} s asked for")
    if summary.get("elapsed_s") is not None:
        said.append(f"the workload ran {summary['elapsed_s']} s")
    if span.get("start_ms") is not None and span.get("end_ms") is not None:
        seconds = (span["end_ms"] - span["start_ms"]) / 1000
        said.append(
            f"the history spans {seconds:.1f} s, from {_clock(span['start_ms'])} "
            f"to {_clock(span['end_ms'])} UTC"
        )
    return html.escape("; ".join(said)) or "<span class='note'>unknown (no history)</span>"


def _options(args: Any) -> str:
    if isinstance(args, dict):
        shown = {k: v for k, v in args.items() if v not in (None, "", [], {}) and k != "tls"}
        return f"<code>{html.escape(' '.join(f'{k}={_plain(v)}' for k, v in shown.items()))}</code>"
    if isinstance(args, list):
        return f"<code>{html.escape(' '.join(map(str, args)))}</code>"
    return f"<code>{html.escape(str(args))}</code>"


def _plain(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return str(value)


def _key_values(settings: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td><code>{html.escape(str(k))}</code></td>"
        f"<td><code>{html.escape(json.dumps(v))}</code></td></tr>"
        for k, v in settings.items()
    )
    return f"<table class='settings'>{rows}</table>"


def _fault_report(summary: dict[str, Any]) -> str:
    """What happened per fault kind asked for (``fault_report``; an older
    summary's ``faults``: per kind, how many ended)."""
    report = summary.get("fault_report")
    if isinstance(report, list) and report:
        rows = "".join(
            f"<tr data-fault='{html.escape(str(r.get('fault')))}'>"
            f"<td>{html.escape(str(r.get('fault')))}</td>"
            f"<td class='n'>{r.get('happened', '')}</td><td class='n'>{r.get('changed', '')}</td>"
            f"<td>{html.escape(str(r.get('not_run') or ''))}</td></tr>"
            for r in report
            if isinstance(r, dict)
        )
        return (
            "<table class='fault-report'><tr><th>fault</th><th>happened</th>"
            f"<th>changed something</th><th>not run</th></tr>{rows}</table>"
        )
    faults = summary.get("faults")
    if isinstance(faults, dict) and faults:
        return html.escape(", ".join(f"{k}: {v} ended" for k, v in faults.items()))
    return ""


# --- plots -----------------------------------------------------------------------------------


def _figure_html(name: str, png: bytes, what: str, lanes: list[Lane]) -> str:
    kinds = " ".join(lane.fault for lane in lanes)
    alt = what + (f" (fault lanes: {', '.join(lane.fault for lane in lanes)})" if lanes else "")
    return (
        f"<figure id='{name}' data-lanes='{html.escape(kinds)}'>"
        f"<img alt='{html.escape(alt)}' src='data:image/png;base64,"
        f"{base64.b64encode(png).decode()}'></figure>"
    )


def _lane_key(lanes: list[Lane], faults: list[dict[str, Any]], explain: bool = True) -> str:
    """The lanes' colours in words, what solid and hatched mean (``explain``),
    and the kinds recorded as not run (which have no lane)."""
    not_run = [w for w in faults if not ran(w)]
    if not lanes and not not_run:
        return "<p class='note'>No faults in the history.</p>" if not faults else ""
    items = []
    for lane in lanes:
        items.append(
            f"<li data-fault='{html.escape(lane.fault)}'><span class='swatch' "
            f"style='background:{lane.colour}'></span>{html.escape(lane.fault)} "
            f"<span class='note'>({lane.count} {'fault' if lane.count == 1 else 'faults'})"
            "</span></li>"
        )
    parts = [f"<ul class='lanes'>{''.join(items)}</ul>"] if items else []
    if lanes and explain:
        parts.append(
            "<p class='note'>Each fault kind has a lane under the plot. Solid: the "
            "planned hold. Hatched and lighter: past the planned hold, until the fault's "
            "end event (the restart, SIGCONT or heal, and the waits it took); dotted: a "
            "fault that never ended, to the end of the history. A fault whose start "
            "recorded no planned hold is drawn paler, whole.</p>"
        )
    for w in not_run:
        parts.append(
            f"<p class='note'>{html.escape(str(w['fault']))}: "
            f"{html.escape(str(w.get('detail') or 'not run'))} (no lane)</p>"
        )
    return "".join(parts)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure() -> tuple[Any, Any]:
    fig, ax = _pyplot().subplots(figsize=(11, 3.6), dpi=90)
    return fig, ax


def _time_figure(lanes: list[Lane]) -> tuple[Any, Any, Any]:
    """A time plot, and under it (sharing its x axis) a row per fault lane, or None."""
    plt = _pyplot()
    if not lanes:
        fig, ax = plt.subplots(figsize=(11, 3.6), dpi=90)
        return fig, ax, None
    lanes_height = 0.35 * len(lanes) + 0.35
    fig, (ax, lanes_ax) = plt.subplots(
        2,
        1,
        sharex=True,
        figsize=(11, 3.6 + lanes_height),
        dpi=90,
        gridspec_kw={"height_ratios": [3.6, lanes_height], "hspace": 0.06},
    )
    return fig, ax, lanes_ax


def _draw_lanes(ax: Any, lanes: list[Lane]) -> None:
    from matplotlib.colors import to_rgba
    from matplotlib.patches import Patch

    parts_seen: set[str] = set()
    for row, lane in enumerate(lanes):
        y = len(lanes) - 1 - row
        for part in ("planned", "unplanned", "overrun", "open"):
            xranges = [(s.start_s, s.end_s - s.start_s) for s in lane.spans if s.part == part]
            if not xranges:
                continue
            parts_seen.add(part)
            if part == "planned":
                ax.broken_barh(xranges, (y - 0.35, 0.7), facecolors=lane.colour)
            elif part == "unplanned":
                ax.broken_barh(
                    xranges,
                    (y - 0.35, 0.7),
                    facecolors=to_rgba(lane.colour, 0.6),
                    edgecolors=lane.colour,
                    linewidth=0.8,
                )
            else:
                ax.broken_barh(
                    xranges,
                    (y - 0.35, 0.7),
                    facecolors=to_rgba(lane.colour, 0.25),
                    edgecolors=lane.colour,
                    hatch="////" if part == "overrun" else "..",
                    linewidth=0.8,
                )
    ax.set_yticks(range(len(lanes)), [lane.fault for lane in reversed(lanes)], fontsize="small")
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    ax.grid(axis="x", color="#ddd", linewidth=0.6)
    words = {
        "planned": "planned hold",
        "unplanned": "fault (no planned hold recorded)",
        "overrun": "past the planned hold, until its end",
        "open": "never ended",
    }
    handles = [
        Patch(facecolor="#777", label=words[p])
        if p == "planned"
        else Patch(facecolor=to_rgba("#777", 0.6), edgecolor="#777", label=words[p])
        if p == "unplanned"
        else Patch(
            facecolor=to_rgba("#777", 0.25),
            edgecolor="#777",
            hatch="////" if p == "overrun" else "..",
            label=words[p],
        )
        for p in ("planned", "unplanned", "overrun", "open")
        if p in parts_seen
    ]
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.005, 1.0),
        fontsize="x-small",
        frameon=False,
    )


def _png(fig: Any) -> bytes:
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _timeline_plot(stats: dict[str, Any], lanes: list[Lane], t0: float) -> bytes:
    fig, ax, lanes_ax = _time_figure(lanes)
    series: dict[str, dict[int, int]] = {}
    for row in stats["timeline"]:
        series.setdefault(row["outcome"], {})[row["second"]] = row["count"]
    colours = {"commit": "tab:green", "abort": "tab:orange", "failed or unknown": "tab:red"}
    for name, points in series.items():
        xs = sorted(points)
        # Each count is of the second [x, x + 1): drawn as a step over that second.
        edges = [(x * 1000 - t0) / 1000 for x in xs] + [((xs[-1] + 1) * 1000 - t0) / 1000]
        ax.plot(
            edges,
            [points[x] for x in xs] + [points[xs[-1]]],
            label=name,
            color=colours.get(name),
            drawstyle="steps-post",
            linewidth=1.2,
        )
    ax.set_ylabel("transactions ended per second")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize="small", frameon=False)
    _time_axis(ax, lanes_ax, lanes)
    return _png(fig)


def _time_axis(ax: Any, lanes_ax: Any, lanes: list[Lane]) -> None:
    bottom = ax if lanes_ax is None else lanes_ax
    if lanes_ax is not None:
        _draw_lanes(lanes_ax, lanes)
    bottom.set_xlabel("seconds since the run started")


def _latency_text(latency: dict[str, Any]) -> str:
    q = latency.get("p50_p90_p99") or []
    if not q:
        return "<p>no committed transaction</p>"
    return (
        f"<p>{latency['n']} commits: p50 {q[0]:.1f} ms, p90 {q[1]:.1f} ms, "
        f"p99 {q[2]:.1f} ms, max {latency['max']:.1f} ms</p>"
    )


def _latency_plot(latency: dict[str, Any]) -> bytes:
    fig, ax = _figure()
    bins = latency.get("bins") or []
    if bins:
        lefts = [10**b for b, _ in bins]
        widths = [10 ** (b + 0.1) - 10**b for b, _ in bins]
        ax.bar(lefts, [n for _, n in bins], width=widths, align="edge", color="tab:blue")
        ax.set_xscale("log")
    ax.set_xlabel("commit latency (ms, invoke to ok)")
    ax.set_ylabel("commits")
    return _png(fig)


def _terms(stats: dict[str, Any], t0: float) -> dict[int, list[tuple[float, int]]]:
    """Per shard: (seconds since the start, term) of the first applied entry of each term."""
    shards: dict[int, list[tuple[float, int]]] = {}
    for row in stats["terms"]:
        if row["time_ms"] is not None:
            shards.setdefault(row["shard"], []).append(((row["time_ms"] - t0) / 1000, row["term"]))
    return {s: sorted(points) for s, points in shards.items()}


def _terms_plot(
    stats: dict[str, Any], shards: list[int], lanes: list[Lane], t0: float, end: float
) -> bytes:
    fig, ax, lanes_ax = _time_figure(lanes)
    terms = _terms(stats, t0)
    end_s = (end - t0) / 1000
    for shard in shards:
        points = terms.get(shard)
        if not points:
            ax.plot([], [], " ", label=f"shard {shard}: no transitions")
            continue
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        if end_s > xs[-1]:  # the last term holds until the end
            xs, ys = [*xs, end_s], [*ys, ys[-1]]
        ax.step(xs, ys, where="post", marker="o", markevery=list(range(len(points))))
        ax.lines[-1].set_label(f"shard {shard}")
    ax.set_ylabel("Raft term of the applied entries")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize="small", frameon=False)
    _time_axis(ax, lanes_ax, lanes)
    return _png(fig)


def _leader_table(stats: dict[str, Any], shards: list[int], t0: float) -> str:
    """Every shard's terms: when each began (its first applied entry), or that
    the shard has no transitions."""
    terms = _terms(stats, t0)
    rows = [
        "<table id='leader-changes'><tr><th>shard</th><th>terms</th>"
        "<th>leader changes</th><th>each term's first entry (s since the start)</th></tr>"
    ]
    for shard in shards:
        points = terms.get(shard)
        if not points:
            rows.append(
                f"<tr data-shard='{shard}'><td>{shard}</td>"
                "<td class='none' colspan='3'>no transitions</td></tr>"
            )
            continue
        rows.append(
            f"<tr data-shard='{shard}'><td>{shard}</td>"
            f"<td>{' → '.join(str(term) for _, term in points)}</td>"
            f"<td class='n'>{len(points) - 1}</td>"
            f"<td>{', '.join(f'{s:.1f}' for s, _ in points)}</td></tr>"
        )
    rows.append("</table>")
    return "".join(rows)


def _partitions_plot(partitions: list[dict[str, Any]]) -> bytes:
    fig, ax = _figure()
    names = [f"{p['topic']}-{p['partition']}" for p in partitions]
    xs = range(len(names))
    ax.bar([x - 0.3 for x in xs], [p["visible"] for p in partitions], 0.2, label="visible records")
    ax.bar([x - 0.1 for x in xs], [p["aborted"] for p in partitions], 0.2, label="aborted records")
    ax.bar([x + 0.1 for x in xs], [p["commit_markers"] for p in partitions], 0.2, label="COMMIT")
    ax.bar([x + 0.3 for x in xs], [p["abort_markers"] for p in partitions], 0.2, label="ABORT")
    ax.set_xticks(list(xs), names, rotation=30, ha="right", fontsize="small")
    ax.legend(fontsize="small")
    return _png(fig)


def _partitions_table(partitions: list[dict[str, Any]]) -> str:
    cols = [
        "records",
        "visible",
        "aborted",
        "commit_markers",
        "abort_markers",
        "batches",
        "end_offset",
    ]
    rows = ["<table><tr><th>partition</th>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"]
    for p in partitions:
        cells = "".join(f"<td class='n'>{p[c]}</td>" for c in cols)
        rows.append(f"<tr><td>{html.escape(p['topic'])}-{p['partition']}</td>{cells}</tr>")
    rows.append("</table>")
    return "".join(rows)


def _faults_table(faults: list[dict[str, Any]], t0: float) -> str:
    if not faults:
        return ""
    rows = [
        "<table id='faults'><tr><th>fault</th><th>targets</th><th>from</th><th>to</th>"
        "<th>held</th><th>detail</th></tr>"
    ]
    for w in faults:
        held = hold_label(w) if ran(w) else "not run"
        rows.append(
            f"<tr data-fault='{html.escape(str(w['fault']))}'>"
            f"<td>{html.escape(str(w['fault']))}</td>"
            f"<td>{html.escape(json.dumps(w['targets']))}</td>"
            f"<td>{_at(w['start_ms'], t0)}</td><td>{_at(w['end_ms'], t0)}</td>"
            f"<td class='held'>{html.escape(held)}</td>"
            f"<td>{html.escape(str(w['detail'] or ''))}</td></tr>"
        )
    rows.append("</table>")
    return "".join(rows)


def _at(ms: float | None, t0: float) -> str:
    if ms is None:
        return "(not ended)"
    return f"{(ms - t0) / 1000:.1f} s <span class='note'>{_clock(ms)}</span>"


def _clock(ms: float | None) -> str:
    if ms is None:
        return "(not ended)"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]
