"""Client certificates never take a node's name: a client holding
``node-<id>`` would act as that node, with the cluster's rights
(``raftcoord certs client``, ``LocalCluster.client_tls``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from raftcoord.cluster import certs
from raftcoord.cluster.launcher import ClusterError, LocalCluster

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["node-1", "node-3", "node-101", "node-007"])
def test_a_nodes_name_is_refused_for_a_client(name: str) -> None:
    refused = certs.client_name_refusal(name)
    assert refused is not None and "a node's name" in refused
    with pytest.raises(ClusterError, match=f"no client certificate '{name}'"):
        LocalCluster(REPO_ROOT / "no-such-cluster").client_tls(name)


@pytest.mark.parametrize("name", ["", ".hidden", "../elsewhere", "a/b"])
def test_a_name_that_is_not_a_file_name_is_refused(name: str) -> None:
    assert "not a plain file name" in (certs.client_name_refusal(name) or "")


@pytest.mark.parametrize("name", ["admin", "client", "orders-app", "node", "node-1x", "my-node-1"])
def test_other_names_are_clients(name: str) -> None:
    assert certs.client_name_refusal(name) is None


def test_certs_client_refuses_a_nodes_name_and_writes_nothing(tmp_path: Path) -> None:
    certs.make_ca(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = subprocess.run(
        [sys.executable, "-m", "raftcoord.cli", "certs", "client", "--dir", str(tmp_path),
         "--name", "node-3"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("raftcoord certs client: --name 'node-3' is a node's name")
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
