"""The Spark exactly-once audit of a run: the session, the checks, the reports
(the command line is :mod:`spark.cli`)."""

from __future__ import annotations

import os
import sys
import tempfile
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark import SparkFiles
from pyspark.sql import SparkSession

from spark import checks, report, sources, stats

PACKAGE_DIR = Path(__file__).resolve().parent
LOG_CONFIG = PACKAGE_DIR / "log4j2.properties"
_ZIP_NAME = "raftcoord_audit.zip"
#: The inputs' entry of the audit's own time.
AUDIT_SECONDS = "audit time (s)"


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


def session(master: str = "local[*]", shuffle_partitions: int = 8) -> SparkSession:
    """A SparkSession for the audit: quiet logging, executors on this Python, the audit's
    package shipped to them, and its data sources registered."""
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
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
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


def audit(
    spark: SparkSession, cluster_dir: Path, history: Path | None
) -> tuple[checks.Audit, list[checks.CheckResult]]:
    """Read the inputs through the data sources and run every check."""
    sources.register(spark)
    segments = spark.read.format(sources.SEGMENTS).load(str(cluster_dir))
    transitions = spark.read.format(sources.TRANSITIONS).load(str(cluster_dir))
    events = None if history is None else spark.read.format(sources.HISTORY).load(str(history))
    job = checks.Audit(segments, transitions, events)
    return job, job.run()


def run_audit(
    spark: SparkSession,
    cluster_dir: Path,
    history: Path | None,
    report_dir: Path,
) -> AuditOutcome:
    """Run every check and write the reports."""
    started = time.monotonic()
    try:
        job, results = audit(spark, cluster_dir, history)
        figures = stats.collect(job)
    finally:
        spark.catalog.clearCache()
    inputs = {
        "cluster dir": str(cluster_dir),
        "history": str(history) if history else "none",
        "master": spark.sparkContext.master,
        AUDIT_SECONDS: round(time.monotonic() - started, 1),
    }
    document = report.to_json(results, figures, inputs)
    json_path, html_path = report.write(report_dir, document)
    return AuditOutcome(results, document, json_path, html_path)
