"""Shared test configuration.

Hypothesis runs derandomized by default so the suite is deterministic; set
HYPOTHESIS_PROFILE=explore to draw fresh random examples (a failure prints the
steps and a @reproduce_failure blob to replay it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

pytest_plugins = ["tests.session_guard"]

settings.register_profile("deterministic", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for the whole run, started by the first test that asks."""
    from spark.audit import session

    spark = session("local[2]", shuffle_partitions=1)
    yield spark
    spark.stop()


@pytest.fixture
def pysyncobj_restored() -> Iterator[None]:
    """Leaves pysyncobj as the test found it: a test that builds replicas
    installs the durable journal, and the journal's own tests check that
    uninstalling restores pysyncobj's."""
    yield
    from raftcoord.coordinator import raft_journal

    raft_journal.uninstall()
