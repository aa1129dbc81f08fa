"""The Spark exactly-once audit of a run: the session, the checks, the reports
(the command line is :mod:`spark.cli`)."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
import tomllib
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark import SparkFiles
from pyspark.sql import DataFrame, SparkSession
from rich.console import Console

from spark import checks, nodes, report, sources, stats
from spark.progress import spark_progress

PACKAGE_DIR = Path(__file__).resolve().parent
LOG_CONFIG = PACKAGE_DIR / "log4j2.properties"
_ZIP_NAME = "raftcoord_audit.zip"
#: The inputs' entry of the audit's own time.
AUDIT_SECONDS = "audit time (s)"
#: What the local launcher writes into the cluster directory: what it started, and the config.
STATE_FILE = "cluster.json"
CONFIG_FILE = "cluster.toml"
#: The words for the kinds of node in ``cluster.json``.
_NODE_KINDS = {
    "coordinator": "coordinators",
    "partition-log": "partition-log nodes",
    "kafka-gateway": "Kafka gateways",
}
#: ``cluster.toml``'s node lists, and their words.
_CONFIG_NODES = {
    "coordinators": "coordinators",
    "partition_nodes": "partition-log nodes",
    "kafka_listeners": "Kafka gateways",
}
_NODE_DIR = re.compile(r"node-\d+")
_SHARD_DIR = re.compile(r"shard-(\d+)")


@dataclass
class AuditOutcome:
    results: list[checks.CheckResult]
    document: dict[str, Any]
    json_path: Path
    html_path: Path

    @property
    def verdict(self) -> str:
        return str(self.document["verdict"])

    @property
    def seconds(self) -> float:
        """How long the audit took."""
        return float(self.document["inputs"][AUDIT_SECONDS])

    def failed(self) -> set[str]:
        """Names of the checks that found violations."""
        return {r.name for r in self.results if r.status == "FAIL"}


def session(master: str = "local[*]", shuffle_partitions: int | None = None) -> SparkSession:
    """A SparkSession for the audit: quiet logging, executors on this Python, the audit's
    package shipped to them, and its data sources registered.

    ``shuffle_partitions`` defaults to this machine's cores. In local mode adaptive
    query execution is off: on one machine's data it only splits each of the audit's
    queries into a job per shuffle stage (146 jobs and 384 stages for one audit
    of 10,000 values against 51 and 165 without it; docs/audit.md, "Cost").
    """
    partitions = shuffle_partitions or os.cpu_count() or 2
    # Executors run the data sources' readers: they need kafka-python and pyarrow,
    # which this interpreter has (spark.pyspark.python or PYSPARK_PYTHON overrides).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # pyspark 4.x warns on every run under pandas 3, which the data sources do not use.
    warnings.filterwarnings("ignore", "PySpark does not yet fully support pandas", FutureWarning)
    java_options = f"-Dlog4j2.configurationFile=file:{LOG_CONFIG}"
    spark = (
        SparkSession.builder.master(master)
        .appName("raftcoord-audit")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.sql.adaptive.enabled", str(not master.startswith("local")).lower())
        .config("spark.sql.autoBroadcastJoinThreshold", "32m")
        .config("spark.driver.memory", os.environ.get("RAFTCOORD_AUDIT_DRIVER_MEMORY", "2g"))
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.executor.extraJavaOptions", java_options)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.sparkContext.addPyFile(str(_package_zip(Path(SparkFiles.getRootDirectory()))))
    sources.register(spark)
    return spark


def _package_zip(spark_files: Path) -> Path:
    """This package as a zip, so that executors that do not have it installed import it.

    It is written under the driver's SparkFiles directory, which Spark deletes when the
    session stops: the executors fetch it from the driver until then, and nothing is
    left behind after."""
    target = Path(tempfile.mkdtemp(prefix="raftcoord-audit-", dir=spark_files)) / _ZIP_NAME
    with zipfile.ZipFile(target, "w") as z:
        for path in sorted(PACKAGE_DIR.glob("*.py")):
            z.write(path, f"spark/{path.name}")
    return target


#: Where the audit reads a cluster's data files: its directory (local mode),
#: or its nodes over the network (:mod:`spark.nodes`).
ClusterFiles = Path | nodes.Cluster


def audit(
    spark: SparkSession, cluster: ClusterFiles, history: Path | None
) -> tuple[checks.Audit, list[checks.CheckResult]]:
    """Read the inputs through the data sources and run every check."""
    sources.register(spark)

    def load(source: str) -> DataFrame:
        if isinstance(cluster, nodes.Cluster):
            return spark.read.format(source).options(**cluster.options()).load()
        return spark.read.format(source).load(str(cluster))

    segments = load(sources.SEGMENTS)
    transitions = load(sources.TRANSITIONS)
    events = None if history is None else spark.read.format(sources.HISTORY).load(str(history))
    job = checks.Audit(segments, transitions, events)
    return job, job.run()


def run_audit(
    spark: SparkSession,
    cluster: ClusterFiles,
    history: Path | None,
    report_dir: Path,
    console: Console | None = None,
) -> AuditOutcome:
    """Run every check and write the reports; with ``console``, the stages
    Spark runs meanwhile are shown on it."""
    started = time.monotonic()
    try:
        with spark_progress(spark, console or Console(quiet=True), "checks"):
            job, results = audit(spark, cluster, history)
        with spark_progress(spark, console or Console(quiet=True), "report figures"):
            figures = stats.collect(job)
    finally:
        spark.catalog.clearCache()
    where = (
        {"cluster config": str(cluster.config)}
        if isinstance(cluster, nodes.Cluster)
        else {"cluster dir": str(cluster)}
    )
    inputs = {
        **where,
        "history": str(history) if history else "none",
        "master": spark.sparkContext.master,
        AUDIT_SECONDS: round(time.monotonic() - started, 1),
    }
    document = report.to_json(results, figures, inputs, describe_cluster(cluster))
    json_path, html_path = report.write(report_dir, document)
    return AuditOutcome(results, document, json_path, html_path)


def describe_cluster(cluster: ClusterFiles) -> dict[str, Any]:
    """What the cluster directory says of the cluster, read on the driver
    (small files): ``shards``, every shard that a coordinator's directory
    (``node-N/shard-S/``) or the config's ``shard_count`` names; from
    ``cluster.json`` (the launcher's record) or else ``cluster.toml``, the
    ``nodes`` per kind and ``shard_count``; from ``cluster.toml``, its
    ``settings``. A piece that is missing or cannot be read is left out.
    Audited over the network, the same from the cluster's config alone."""
    shards: set[int] = set()
    if isinstance(cluster, nodes.Cluster):
        state: dict[str, Any] = {}
        config = _read(cluster.config, tomllib.loads)
    else:
        for node_dir in _subdirs(cluster):
            if _NODE_DIR.fullmatch(node_dir.name):
                for shard_dir in _subdirs(node_dir):
                    found = _SHARD_DIR.fullmatch(shard_dir.name)
                    if found:
                        shards.add(int(found[1]))
        state = _read(cluster / STATE_FILE, json.loads)
        config = _read(cluster / CONFIG_FILE, tomllib.loads)
    if not config and isinstance(state.get("config"), str):
        config = _read(Path(state["config"]), tomllib.loads)
    out: dict[str, Any] = {}
    ids_by_kind: dict[str, list[int]] = {}
    if isinstance(state.get("nodes"), list):
        for node in state["nodes"]:
            if isinstance(node, dict) and isinstance(node.get("node_id"), int):
                kind = str(node.get("kind"))
                ids_by_kind.setdefault(_NODE_KINDS.get(kind, kind), []).append(node["node_id"])
    else:
        for key, words in _CONFIG_NODES.items():
            entries = config.get(key)
            ids = [n["id"] for n in entries or [] if isinstance(n, dict) and "id" in n]
            if isinstance(entries, list) and ids:
                ids_by_kind[words] = ids
    if ids_by_kind:
        out["nodes"] = {kind: sorted(ids) for kind, ids in ids_by_kind.items()}
    shard_count = state.get("shard_count", config.get("shard_count"))
    if isinstance(shard_count, int) and shard_count > 0:
        out["shard_count"] = shard_count
        shards.update(range(shard_count))
    if isinstance(config.get("settings"), dict):
        out["settings"] = config["settings"]
    out["shards"] = sorted(shards)
    return out


def _subdirs(path: Path) -> list[Path]:
    try:
        return sorted(p for p in path.iterdir() if p.is_dir())
    except OSError:
        return []


def _read(path: Path, parse: Callable[[str], Any]) -> dict[str, Any]:
    """The object in a small JSON or TOML file; {} when it is missing or unreadable."""
    try:
        found = parse(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return found if isinstance(found, dict) else {}
