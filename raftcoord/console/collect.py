"""The console's questions to the cluster, asked in rounds by one thread
(:class:`Collector`); the pages show the latest round's answers
(:class:`~raftcoord.console.model.Snapshot`) without waiting for the cluster.

Everything goes through the client library: the admin client for nodes,
topics, transactions, producers and groups, and two consumers for the
offsets (read_uncommitted: the log end offset; read_committed: the last stable
offset). The groups' committed offsets are read before the log end offsets,
so that a lag (log end offset minus committed offset) is never computed
against a log end read earlier than the offset. A question that fails is
recorded as an error of the round and the others are still asked, so that a
node that is down shows as a banner on the pages, beside everything else
that could be learnt.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

from raftcoord.client import Admin, Consumer, KafkaError, TopicPartition, TransactionDescription
from raftcoord.client.errors import TransactionalIdNotFoundError
from raftcoord.client.hanging import find_hanging
from raftcoord.console.model import OPEN_STATES, Report, Snapshot

__all__ = ["Collector", "ConsoleOptions", "admin", "consumer", "find_reports"]

log = logging.getLogger("raftcoord.console")

T = TypeVar("T")

#: At most this many open transactions are described in one round (the rest
#: are listed only).
MAX_DESCRIBED = 200
#: At most this many consumer groups are described in one round (those
#: given with --group first).
MAX_GROUPS = 100
#: At most this many audit reports are listed, newest first.
MAX_REPORTS = 20


@dataclass(frozen=True)
class ConsoleOptions:
    """How the console reaches the cluster and what it shows."""

    bootstrap: Sequence[str]
    #: A cluster with TLS: the CA's certificate, the client's certificate and
    #: key (PEM files); None: plaintext.
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    #: Seconds between rounds (and between a page's refreshes).
    refresh_s: float = 2.0
    #: Deadline of each question.
    request_timeout_ms: int = 5_000
    #: find-hanging's longest transaction timeout.
    max_transaction_timeout_ms: int = 15 * 60_000
    #: Consumer groups to show first, beside those the coordinators list.
    groups: Sequence[str] = ()
    #: Where to look for audit reports; None: nowhere.
    cluster_dir: Path | None = None
    #: The command-line options that reach the cluster, for the commands shown.
    connection: Sequence[str] = ()


class Collector:
    """Asks the cluster every ``options.refresh_s`` seconds, on a thread of its own."""

    def __init__(
        self, options: ConsoleOptions, cluster_nodes: Mapping[str, Mapping[int, str]]
    ) -> None:
        """``cluster_nodes``: the nodes the cluster's metadata listed at start
        (:meth:`Admin.describe_cluster`); each round that reaches the
        coordinators updates them."""
        self.options = options
        self._admin = admin(options)
        self._log_end = consumer(options, "read_uncommitted")
        self._stable = consumer(options, "read_committed")
        self._cluster_nodes = dict(cluster_nodes)
        self._latest: Snapshot | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console-collector", daemon=True)

    @property
    def latest(self) -> Snapshot | None:
        """The latest round's answers; None before the first round ends."""
        return self._latest

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop asking and close the clients. A round still under way after
        ``timeout_s`` (questions to nodes that do not answer) is left to end
        with the process: its clients stay open for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            return
        self._admin.close()
        self._log_end.close()
        self._stable.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._latest = self.collect()
            except Exception:  # a bug here must not end the console's answers
                log.exception("a round of questions failed")
            self._stop.wait(self.options.refresh_s)

    def collect(self) -> Snapshot:
        """One round: ask every question once."""
        started = time.monotonic()
        errors: list[str] = []

        def ask(what: str, question: Callable[[], T]) -> T | None:
            try:
                return question()
            except (KafkaError, OSError, ValueError) as exc:
                errors.append(f"{what}: {exc}")
                return None

        admin = self._admin
        coordinators = ask("coordinators", admin.describe_coordinators)
        if coordinators is None:  # no coordinator answered: nothing else will
            return Snapshot(
                taken_ms=_now_ms(),
                took_ms=_since_ms(started),
                cluster_nodes=dict(self._cluster_nodes),
                errors=errors,
                reports=self._reports(errors),
            )
        self._cluster_nodes["coordinators"] = {n.node_id: n.address for n in coordinators}
        errors.extend(f"coordinator {n.node_id}: {n.error}" for n in coordinators if n.error)
        partition_nodes = ask("partition-log nodes", admin.describe_partition_nodes)
        for node in partition_nodes or ():
            if node.error:
                errors.append(f"partition-log node {node.node_id}: {node.error}")
        if partition_nodes is not None:
            self._cluster_nodes["partition_nodes"] = {n.node_id: n.address for n in partition_nodes}
        topics = ask("topics", admin.list_topics)
        partitions = [
            TopicPartition(t, p) for t, n in sorted((topics or {}).items()) for p in range(n)
        ]
        listed = ask("list of consumer groups", admin.list_consumer_groups) or {}
        given = list(dict.fromkeys(self.options.groups))
        group_ids = (given + [g for g in listed if g not in given])[:MAX_GROUPS]
        groups = ask("consumer groups", lambda: admin.describe_consumer_groups(group_ids)) or {}
        group_offsets = {}
        for group_id in group_ids:
            offsets = ask(
                f"offsets of group {group_id}", partial(admin.list_consumer_group_offsets, group_id)
            )
            if offsets is not None:
                group_offsets[group_id] = offsets
        log_end = stable = producers = hanging = None
        if partitions:
            log_end = ask("log end offsets", lambda: self._log_end.end_offsets(partitions))
            stable = ask("last stable offsets", lambda: self._stable.end_offsets(partitions))
            producers = ask("producers", lambda: admin.describe_producers(partitions))
        elif topics is not None:
            log_end, stable, producers = {}, {}, {}
        now_ms = _now_ms()
        if producers is not None:
            hanging = ask(
                "hanging transactions",
                lambda: find_hanging(
                    admin, producers, now_ms, self.options.max_transaction_timeout_ms
                ),
            )
        transactions = ask("transactions", admin.list_transactions)
        descriptions = self._describe(
            [t.transactional_id for t in transactions or () if t.state in OPEN_STATES], errors
        )
        return Snapshot(
            taken_ms=now_ms,
            took_ms=_since_ms(started),
            coordinators=coordinators,
            cluster_nodes=dict(self._cluster_nodes),
            partition_nodes=partition_nodes,
            topics=topics,
            log_end_offsets=log_end,
            stable_offsets=stable,
            producers=producers,
            hanging=hanging,
            transactions=transactions,
            descriptions=descriptions,
            groups=groups,
            group_offsets=group_offsets,
            reports=self._reports(errors),
            errors=errors,
        )

    def _describe(
        self, transactional_ids: Sequence[str], errors: list[str]
    ) -> dict[str, TransactionDescription]:
        described: dict[str, TransactionDescription] = {}
        for tid in transactional_ids[:MAX_DESCRIBED]:
            try:
                described.update(self._admin.describe_transactions([tid]))
            except TransactionalIdNotFoundError:
                continue  # expired since it was listed
            except KafkaError as exc:
                errors.append(f"transaction {tid!r}: {exc}")
        return described

    def _reports(self, errors: list[str]) -> list[Report]:
        if self.options.cluster_dir is None:
            return []
        try:
            return find_reports(self.options.cluster_dir)
        except OSError as exc:
            errors.append(f"audit reports: {exc}")
            return []


def admin(options: ConsoleOptions, request_timeout_ms: int | None = None) -> Admin:
    """An admin client of the cluster the options name."""
    return Admin(
        options.bootstrap,
        request_timeout_ms=request_timeout_ms or options.request_timeout_ms,
        ssl_cafile=options.ssl_cafile,
        ssl_certfile=options.ssl_certfile,
        ssl_keyfile=options.ssl_keyfile,
    )


def consumer(options: ConsoleOptions, isolation_level: str) -> Consumer:
    """A consumer (with no group) of the cluster the options name."""
    return Consumer(
        options.bootstrap,
        isolation_level=isolation_level,
        request_timeout_ms=options.request_timeout_ms,
        ssl_cafile=options.ssl_cafile,
        ssl_certfile=options.ssl_certfile,
        ssl_keyfile=options.ssl_keyfile,
    )


def find_reports(directory: Path, limit: int = MAX_REPORTS) -> list[Report]:
    """The HTML reports in ``directory`` and its subdirectories one level
    down (the audit writes DIR/audit/audit.html), newest first, each with the
    verdict of the audit.json beside it."""
    if not directory.is_dir():
        return []
    found = list(directory.glob("*.html")) + list(directory.glob("*/*.html"))
    reports = []
    for path in found:
        try:
            modified_ms = int(path.stat().st_mtime * 1000)
        except OSError:
            continue  # removed meanwhile
        reports.append(
            Report(
                path=path.relative_to(directory).as_posix(),
                modified_ms=modified_ms,
                verdict=_verdict(path.with_name("audit.json"))
                if path.name == "audit.html"
                else None,
            )
        )
    reports.sort(key=lambda r: (-r.modified_ms, r.path))
    return reports[:limit]


def _verdict(path: Path) -> str | None:
    try:
        verdict = json.loads(path.read_text(encoding="utf-8")).get("verdict")
    except (OSError, ValueError, AttributeError):
        return None
    return verdict if isinstance(verdict, str) else None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _since_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
