"""The audit's outputs: a table in the terminal, ``audit.json`` and ``audit.html``.

The HTML report is one file with its plots embedded (base64 PNG): it opens
without a network. It shows the verdict and the checks first, then the
commits, aborts and failures over time with the fault windows shaded, the
commit latency distribution, leader changes (Raft terms) over time, and
the records and markers of every partition.
"""

from __future__ import annotations

import base64
import html
import io
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from spark.checks import CheckResult

_COLOURS = {"PASS": "green", "FAIL": "bold red", "SKIP": "yellow", "INCOMPLETE": "bold yellow"}


def verdict(results: list[CheckResult]) -> str:
    """FAIL when a check found a violation; else INCOMPLETE when a check did
    not run (a run that nobody fully checked proves nothing); else PASS."""
    if any(r.status == "FAIL" for r in results):
        return "FAIL"
    if not results or any(r.status != "PASS" for r in results):
        return "INCOMPLETE"
    return "PASS"


def incomplete_reasons(results: list[CheckResult]) -> list[str]:
    """``check: why it did not run`` for every check that did not run."""
    return [f"{r.name}: {r.skipped or 'did not run'}" for r in results if r.status == "SKIP"]


def print_table(results: list[CheckResult], console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title="raftcoord audit")
    table.add_column("check")
    table.add_column("result")
    table.add_column("count", justify="right")
    table.add_column("first example / why skipped", overflow="fold", max_width=70)
    for r in results:
        note = r.skipped or (json.dumps(r.examples[0], default=str)[:200] if r.examples else "")
        table.add_row(r.name, f"[{_COLOURS[r.status]}]{r.status}[/]", str(r.count), note)
    console.print(table)
    v = verdict(results)
    console.print(f"verdict: [{_COLOURS[v]}]{v}[/]")
    if v == "INCOMPLETE":
        console.print(f"{len(incomplete_reasons(results))} of {len(results)} checks did not run:")
        for reason in incomplete_reasons(results):
            console.print(f"  {reason}")


def to_json(
    results: list[CheckResult], stats: dict[str, Any], inputs: dict[str, Any]
) -> dict[str, Any]:
    return {
        "verdict": verdict(results),
        "incomplete": incomplete_reasons(results),
        "inputs": inputs,
        "checks": [
            {
                "name": r.name,
                "description": r.description,
                "status": r.status,
                "count": r.count,
                "examples": r.examples,
                "skipped": r.skipped,
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


# --- HTML ------------------------------------------------------------------------------------

_STYLE = """
body { font-family: sans-serif; margin: 2em; max-width: 75em; color: #222; }
.verdict { font-size: 2.2em; font-weight: bold; padding: .3em .6em; display: inline-block; }
.PASS { background: #d9f2d9; color: #155715; } .FAIL { background: #f8d7d7; color: #8a1212; }
.SKIP, .INCOMPLETE { background: #fff3cd; color: #7a5b00; }
table { border-collapse: collapse; margin: 1em 0; }
td, th { border: 1px solid #ccc; padding: .25em .6em; text-align: left; vertical-align: top; }
td.n { text-align: right; } code { font-size: .85em; white-space: pre-wrap; }
img { max-width: 100%; }
"""


def _html(doc: dict[str, Any]) -> str:
    stats = doc["stats"]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>raftcoord audit</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>raftcoord exactly-once audit</h1>",
        f"<div class='verdict {doc['verdict']}'>{doc['verdict']}</div>",
        *(
            [
                "<p>Not every check ran, so this run is not proven exactly-once:</p><ul>",
                *(f"<li>{html.escape(r)}</li>" for r in doc.get("incomplete", ())),
                "</ul>",
            ]
            if doc["verdict"] == "INCOMPLETE"
            else []
        ),
        f"<p>{html.escape(_inputs_line(doc['inputs']))}</p>",
        "<h2>Checks</h2><table><tr><th>check</th><th>result</th><th>count</th>"
        "<th>meaning</th><th>examples</th></tr>",
    ]
    for c in doc["checks"]:
        examples = c["skipped"] or "\n".join(json.dumps(e, default=str) for e in c["examples"])
        parts.append(
            f"<tr><td>{c['name']}</td><td class='{c['status']}'>{c['status']}</td>"
            f"<td class='n'>{c['count']}</td><td>{html.escape(c['description'])}</td>"
            f"<td><code>{html.escape(examples)}</code></td></tr>"
        )
    parts.append("</table>")
    if "timeline" in stats:
        parts.append("<h2>Transactions over time</h2>")
        parts.append(_img(_timeline_plot(stats)))
        parts.append(_faults_table(stats.get("faults", [])))
        parts.append("<h2>Commit latency</h2>")
        parts.append(_latency_text(stats["latency"]))
        parts.append(_img(_latency_plot(stats["latency"])))
    parts.append("<h2>Leader changes</h2>")
    parts.append(_img(_terms_plot(stats)))
    parts.append("<h2>Partitions</h2>")
    parts.append(_img(_partitions_plot(stats["partitions"])))
    parts.append(_partitions_table(stats["partitions"]))
    parts.append("<h2>Totals</h2><table>")
    totals = dict(stats["totals"])
    totals.update(stats.get("summary", {}).get("ops", {}))
    parts.extend(
        f"<tr><td>{html.escape(k)}</td><td class='n'>{v}</td></tr>" for k, v in totals.items()
    )
    parts.append("</table></body></html>")
    return "\n".join(parts)


def _inputs_line(inputs: dict[str, Any]) -> str:
    return " · ".join(f"{k}: {v}" for k, v in inputs.items())


def _img(png: bytes) -> str:
    return f"<img src='data:image/png;base64,{base64.b64encode(png).decode()}'>"


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(11, 3.6), dpi=90)


def _png(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _start_ms(stats: dict[str, Any]) -> float:
    start = stats.get("summary", {}).get("start_ms")
    if start is not None:
        return float(start)
    times = [t["time_ms"] for t in stats["terms"] if t["time_ms"] is not None]
    return float(min(times)) if times else 0.0


def _shade_faults(ax: Any, stats: dict[str, Any], t0: float) -> None:
    end = stats.get("summary", {}).get("end_ms") or t0
    palette = ["#f4a582", "#92c5de", "#b2abd2", "#fddbc7", "#a6dba0", "#dfc27d"]
    colours: dict[str, str] = {}
    for w in stats.get("faults", []):
        first = w["fault"] not in colours
        colour = colours.setdefault(w["fault"], palette[len(colours) % len(palette)])
        stop = w["end_ms"] if w["end_ms"] is not None else end
        ax.axvspan(
            (w["start_ms"] - t0) / 1000,
            (stop - t0) / 1000,
            color=colour,
            alpha=0.35,
            label=w["fault"] if first else None,
        )


def _timeline_plot(stats: dict[str, Any]) -> bytes:
    fig, ax = _figure()
    t0 = _start_ms(stats)
    series: dict[str, dict[int, int]] = {}
    for row in stats["timeline"]:
        series.setdefault(row["outcome"], {})[row["second"]] = row["count"]
    colours = {"commit": "tab:green", "abort": "tab:orange", "failed or unknown": "tab:red"}
    for name, points in sorted(series.items()):
        xs = sorted(points)
        ax.plot(
            [(x * 1000 - t0) / 1000 for x in xs],
            [points[x] for x in xs],
            label=name,
            color=colours.get(name),
            marker=".",
            linewidth=1,
        )
    _shade_faults(ax, stats, t0)
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("transactions ended per second")
    ax.legend(loc="upper right", fontsize="small")
    return _png(fig)


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


def _terms_plot(stats: dict[str, Any]) -> bytes:
    fig, ax = _figure()
    t0 = _start_ms(stats)
    shards: dict[int, list[tuple[float, int]]] = {}
    for row in stats["terms"]:
        if row["time_ms"] is not None:
            shards.setdefault(row["shard"], []).append(((row["time_ms"] - t0) / 1000, row["term"]))
    for shard, points in sorted(shards.items()):
        ax.step(
            [p[0] for p in points],
            [p[1] for p in points],
            where="post",
            marker="o",
            label=f"shard {shard}",
        )
    _shade_faults(ax, stats, t0)
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("Raft term of the applied entries")
    ax.legend(loc="upper left", fontsize="small")
    return _png(fig)


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


def _faults_table(faults: list[dict[str, Any]]) -> str:
    if not faults:
        return "<p>No faults in the history.</p>"
    rows = ["<table><tr><th>fault</th><th>targets</th><th>from</th><th>to</th><th>detail</th></tr>"]
    for w in faults:
        rows.append(
            f"<tr><td>{html.escape(str(w['fault']))}</td><td>{html.escape(json.dumps(w['targets']))}</td>"
            f"<td>{_clock(w['start_ms'])}</td><td>{_clock(w['end_ms'])}</td>"
            f"<td>{html.escape(str(w['detail'] or ''))}</td></tr>"
        )
    rows.append("</table>")
    return "".join(rows)


def _clock(ms: float | None) -> str:
    if ms is None:
        return "(not ended)"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]
