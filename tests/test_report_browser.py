"""The audit's HTML report in a real browser: the real audit (one local
SparkSession, the session's ``spark`` fixture) of a synthetic clean run
(``spark/synthetic.py``) with what a workload's history and a cluster
directory add (a planned hold on one fault kind and none on the other, as in
a history from before holds were recorded; the options and the fault report
of the ``run`` events; ``cluster.toml`` with one shard more than have
transitions), opened from its file in headless Chromium (the system's,
/usr/bin/chromium, driven by Playwright; never a downloaded one). The page
is static: every wait is bounded, none is a sleep."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from spark import audit, synthetic
from spark.synthetic import Run
from tests.browser import chromium_page

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

#: The page is one file with nothing to fetch: it is complete at once.
SHOWN_MS = 10_000
SEED = 11
LEADER_KILL_HOLD_S = 0.02
CLUSTER_TOML = """shard_count = {shards}

[settings]
"raft.tick.ms" = 10
"raft.election.timeout.ms" = [300, 600]

[[coordinators]]
id = 1
grpc = "127.0.0.1:7101"

[[coordinators]]
id = 2
grpc = "127.0.0.1:7102"

[[coordinators]]
id = 3
grpc = "127.0.0.1:7103"

[[partition_nodes]]
id = 101
grpc = "127.0.0.1:7301"
"""


@dataclass
class Audited:
    run: Run
    html: Path
    master: str
    #: every shard of the cluster, and those without transitions
    shards: list[int]
    quiet_shards: list[int]


def _as_a_workload_wrote_it(run: Run) -> None:
    """Give the synthetic history what a workload's has: the first ``run``
    event's options, the last one's fault report, the leader-kill's planned
    hold (shorter than it lasts, so it overruns); the pause keeps none."""
    kinds = sorted({e["fault"] for e in run.events if e["op"] == "fault"})
    run.events[0]["args"] = {"seed": SEED, "duration_s": 1.0, "nemesis": kinds}
    run.events[-1]["summary"] = {
        "seed": SEED,
        "elapsed_s": 1.2,
        "fault_report": [
            {"fault": kind, "happened": 1, "changed": 1, "not_run": ""} for kind in kinds
        ],
    }
    for e in run.events:
        if e["op"] == "fault" and e["phase"] == "start" and e["fault"] == "leader-kill":
            e["hold_s"] = LEADER_KILL_HOLD_S


@pytest.fixture(scope="module")
def audited(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Audited:
    run = synthetic.generate(400, partitions=4, seed=SEED)
    _as_a_workload_wrote_it(run)
    shards = list(range(run.shards + 1))  # the config's last shard has no transitions

    def cluster_files(cluster: Path) -> None:
        (cluster / "cluster.toml").write_text(CLUSTER_TOML.format(shards=len(shards)))
        (cluster / "node-1" / f"shard-{shards[-1]}").mkdir(parents=True)

    run.file_edits.append(cluster_files)
    root = tmp_path_factory.mktemp("report")
    cluster, history = run.write(root)
    outcome = audit.run_audit(spark, cluster, history, root / "report")
    assert outcome.verdict == "PASS", outcome.document["checks"]
    quiet = [s for s in shards if not run.transitions.get(s)]
    return Audited(run, outcome.html_path, str(spark.sparkContext.master), shards, quiet)


@pytest.fixture
def page() -> Iterator[Page]:
    with chromium_page(1300) as opened:
        yield opened


def test_the_report_shows_the_verdict_the_run_the_lanes_and_every_shard(
    audited: Audited, page: Page
) -> None:
    fetched: list[str] = []
    page.on("request", lambda request: fetched.append(request.url))
    page.goto(audited.html.as_uri(), wait_until="load", timeout=SHOWN_MS)

    # The verdict first, then the run.
    expect(page.locator("#verdict")).to_have_text("PASS", timeout=SHOWN_MS)
    header = page.locator("#run")
    expect(header.locator("tr[data-row='seed'] > td")).to_have_text(str(SEED))
    expect(header.locator("tr[data-row='duration'] > td")).to_contain_text("1.0 s asked for")
    expect(header.locator("tr[data-row='duration'] > td")).to_contain_text("the history spans")
    expect(header.locator("tr[data-row='nodes'] > td")).to_contain_text(
        f"coordinators: 1, 2, 3; partition-log nodes: 101; {len(audited.shards)} shards"
    )
    expect(header.locator("tr[data-row='settings'] > td")).to_contain_text(
        "raft.election.timeout.ms"
    )
    expect(header.locator("tr[data-row='asked'] > td")).to_have_text("leader-kill, pause")
    expect(header.locator("tr[data-row='happened'] tr[data-fault]")).to_have_count(2)
    expect(header.locator("tr[data-row='audit'] > td")).to_contain_text(f"master {audited.master}")
    verdict_box, header_box = page.locator("#verdict").bounding_box(), header.bounding_box()
    assert verdict_box is not None and header_box is not None
    assert verdict_box["y"] < header_box["y"]

    # Every image decoded (the plots are embedded: nothing was fetched to show them).
    images = page.locator("img")
    expect(images).to_have_count(4)
    page.wait_for_function("() => [...document.images].every(i => i.complete)", timeout=SHOWN_MS)
    sizes = images.evaluate_all("imgs => imgs.map(i => [i.naturalWidth, i.naturalHeight])")
    assert all(width > 0 and height > 0 for width, height in sizes), sizes

    # A lane per fault kind of the history, under both time plots, each in the key.
    kinds = list(dict.fromkeys(e["fault"] for e in audited.run.events if e["op"] == "fault"))
    for figure in ("#timeline", "#terms"):
        expect(page.locator(figure)).to_have_attribute("data-lanes", " ".join(kinds))
        expect(page.locator(figure).locator("img")).to_have_attribute(
            "alt", re.compile(f"fault lanes: {', '.join(kinds)}")
        )
    for kind in kinds:
        expect(page.locator(f"ul.lanes li[data-fault='{kind}']")).to_have_count(2)
    # The planned hold and what it came to; the pause's start recorded none.
    expect(page.locator("#faults tr[data-fault='leader-kill'] td.held")).to_have_text(
        re.compile(
            rf"^planned {LEADER_KILL_HOLD_S:.2f} s, lasted \d+\.\d+ s \(\d+\.\d+ s past the plan\)$"
        )
    )
    expect(page.locator("#faults tr[data-fault='pause'] td.held")).to_have_text(
        re.compile(r"^lasted \d+\.\d+ s$")
    )

    # Every shard of the cluster in Leader changes, those without transitions said so.
    rows = page.locator("#leader-changes tr[data-shard]")
    expect(rows).to_have_count(len(audited.shards))
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.shard)") == [
        str(s) for s in audited.shards
    ]
    assert audited.quiet_shards  # the config's extra shard at least
    for shard in audited.shards:
        row = page.locator(f"#leader-changes tr[data-shard='{shard}']")
        if shard in audited.quiet_shards:
            expect(row).to_contain_text("no transitions")
        else:
            expect(row).not_to_contain_text("no transitions")

    # The totals in words.
    expect(page.locator("#totals")).to_contain_text("transactions committed (commit ok)")
    expect(page.locator("#totals")).to_contain_text("records read from the partition logs")

    assert all(url.startswith(("file:", "data:")) for url in fetched), fetched
