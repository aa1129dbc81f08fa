"""The console's web application (Starlette, pages rendered on the server
with Jinja2): one page per section, each showing the latest snapshot of the
cluster and refreshing itself, and the audit reports found in the cluster
directory. Read-only: no page changes anything in the cluster; the commands
that would (``raftcoord txn abort``) are shown for an operator to run."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route

from raftcoord.console import model
from raftcoord.console.collect import ConsoleOptions
from raftcoord.console.model import Snapshot

__all__ = ["PAGES", "create_app", "render"]

#: (path, name, title) of every page, in the order of the navigation bar.
PAGES = (
    ("/", "cluster", "Cluster"),
    ("/topics", "topics", "Topics"),
    ("/transactions", "transactions", "Transactions"),
    ("/producers", "producers", "Producers"),
    ("/groups", "groups", "Consumer groups"),
    ("/reports", "reports", "Audit reports"),
)

_ENVIRONMENT = jinja2.Environment(
    loader=jinja2.PackageLoader("raftcoord.console", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENVIRONMENT.filters["duration"] = model.format_duration
_ENVIRONMENT.filters["time"] = model.format_time
_ENVIRONMENT.filters["dash"] = lambda value: "-" if value is None else value


def _view(name: str, snapshot: Snapshot, options: ConsoleOptions) -> dict[str, Any]:
    """The page's own figures."""
    if name == "cluster":
        return {
            "cluster": model.cluster_view(snapshot),
            "overview": model.overview(snapshot),
        }
    if name == "topics":
        return {"topics": model.topics_view(snapshot)}
    if name == "transactions":
        return {"transactions": model.transactions_view(snapshot, options.connection)}
    if name == "producers":
        return {"producers": model.producers_view(snapshot)}
    if name == "groups":
        return {"groups": model.groups_view(snapshot)}
    return {}


def render(name: str, snapshot: Snapshot | None, options: ConsoleOptions, now_ms: int) -> str:
    """The HTML of page ``name`` for ``snapshot`` (None: no answers yet)."""
    context: dict[str, Any] = {
        "page": name,
        "pages": PAGES,
        "snapshot": snapshot,
        "options": options,
        "bootstrap": ",".join(options.bootstrap),
        "refresh_ms": int(options.refresh_s * 1000),
        "now_ms": now_ms,
        "reports": [] if snapshot is None else snapshot.reports,
    }
    if snapshot is not None:
        context |= _view(name, snapshot, options)
        context["age_ms"] = max(0, now_ms - snapshot.taken_ms)
    return _ENVIRONMENT.get_template(f"{name}.html").render(context)


def create_app(latest: Callable[[], Snapshot | None], options: ConsoleOptions) -> Starlette:
    """The application: ``latest`` gives the snapshot each page shows."""

    def page(name: str) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            html = render(name, latest(), options, int(time.time() * 1000))
            return HTMLResponse(html, headers={"Cache-Control": "no-store"})

        return endpoint

    def report(request: Request) -> Response:
        """A report the last round found (nothing else under the directory is served)."""
        wanted = request.path_params["path"]
        snapshot = latest()
        found = {r.path for r in snapshot.reports} if snapshot is not None else set()
        if options.cluster_dir is None or wanted not in found:
            return PlainTextResponse("no such report", status_code=404)
        path = Path(options.cluster_dir) / wanted
        if not path.is_file():
            return PlainTextResponse("the report is gone", status_code=404)
        return FileResponse(path, media_type="text/html")

    def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    routes = [Route(path, page(name), name=name) for path, name, _ in PAGES]
    routes += [
        Route("/reports/{path:path}", report, name="report"),
        Route("/healthz", health, name="health"),
    ]
    return Starlette(routes=routes)
