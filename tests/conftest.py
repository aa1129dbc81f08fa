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


#: Modules that run one after the other on one worker under ``make test``'s
#: two pytest-xdist workers: the ones that start Spark (one session per
#: run, and two JVMs would share two cores) or network namespaces (a
#: cluster takes the first free 10.201.K.0/24).
SERIAL_MODULES = frozenset(
    {
        "test_audit",
        "test_audit_arrow",
        "test_audit_empty_run",
        "test_audit_network",
        "test_audit_progress",
        "test_chaos",
        "test_chaos_kafka",
        "test_cli",
        "test_coordinator_partition",
        "test_deploy",
        "test_netns",
        "test_report_browser",
    }
)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Every module's tests go to one worker, in order, with its
    module-scoped cluster; the :data:`SERIAL_MODULES` together, as one."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            name = module.rsplit("/", 1)[-1].removesuffix(".py")
            return "serial" if name in SERIAL_MODULES else module

    return ModuleScheduling(config, log)


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
