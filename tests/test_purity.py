"""The pure core stays pure, and speaks the same vocabulary as the protocol."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import fsm
from fsm import TxnState
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.routing import preferred_leader, shard_for
from raftcoord.protocol.v1 import common_pb2

REPO_ROOT = Path(__file__).resolve().parents[1]

#: Top-level modules the pure core must never import (I/O, clock, randomness,
#: threads, the network, Raft and gRPC).
FORBIDDEN = frozenset(
    {
        "grpc",
        "pysyncobj",
        "time",
        "random",
        "threading",
        "socket",
        "os",
        "asyncio",
        "subprocess",
        "datetime",
        "uuid",
    }
)


def forbidden_imports(source: str, filename: str) -> list[str]:
    """``file:line: module`` for every import of a forbidden module (or a submodule)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        for module in modules:
            if module.split(".")[0] in FORBIDDEN:
                found.append(f"{filename}:{node.lineno}: {module}")
    return found


def test_the_import_checker_finds_what_it_looks_for() -> None:
    source = "\n".join(
        [
            "import json",
            "import grpc.aio",
            "from os import path",
            "import time as clock",
            "from threading import Lock",
            "import collections, random",
            "from . import time",  # a sibling module named time is not the stdlib one
            "from fsm.time import x",
            "def f():",
            "    import uuid",
            "    from datetime import datetime",
            "try:",
            "    import pysyncobj.batteries",
            "except ImportError:",
            "    pass",
        ]
    )
    assert forbidden_imports(source, "m.py") == [
        "m.py:2: grpc.aio",
        "m.py:3: os",
        "m.py:4: time",
        "m.py:5: threading",
        "m.py:6: random",
        "m.py:10: uuid",
        "m.py:11: datetime",
        "m.py:13: pysyncobj.batteries",
    ]


@pytest.mark.parametrize("package", ["fsm", "pid_allocator"])
def test_pure_core_imports_no_io_clock_randomness_or_threads(package: str) -> None:
    # pid_allocator is checked too: fsm.machine imports it, so it is part of the core.
    files = sorted((REPO_ROOT / package).rglob("*.py"))
    assert files, f"no modules found in {package}/"
    found = [
        problem
        for path in files
        for problem in forbidden_imports(
            path.read_text(encoding="utf-8"), str(path.relative_to(REPO_ROOT))
        )
    ]
    assert not found, "forbidden imports in the pure core:\n" + "\n".join(found)


#: The modules of raftcoord the pure core may load: the protocol's pure modules.
PURE_PROTOCOL = [
    "raftcoord",
    "raftcoord.protocol",
    "raftcoord.protocol.acl",
    "raftcoord.protocol.errors",
    "raftcoord.protocol.limits",
    "raftcoord.protocol.routing",
    "raftcoord.protocol.scram",
    "raftcoord.protocol.types",
]


def test_the_leader_core_imports_no_io_clock_randomness_or_threads() -> None:
    path = REPO_ROOT / "raftcoord" / "coordinator" / "leader.py"
    found = forbidden_imports(path.read_text(encoding="utf-8"), str(path.relative_to(REPO_ROOT)))
    assert not found, "forbidden imports in the leader core:\n" + "\n".join(found)


def modules_loaded_by(modules: str) -> list[str]:
    """The Raft, gRPC, protobuf, Spark and raftcoord modules that importing
    ``modules`` (comma-separated) loads in a fresh interpreter, transitively
    (stdlib modules are loaded by the interpreter itself, so only these
    stacks are looked at)."""
    code = (
        f"import sys, json, {modules}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('grpc', 'pysyncobj', 'google', 'raftcoord', 'pyspark'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    loaded: list[str] = json.loads(result.stdout)
    return loaded


def test_importing_the_leader_core_loads_no_raft_grpc_or_protobuf() -> None:
    leader = ["raftcoord.coordinator", "raftcoord.coordinator.leader"]
    loaded = modules_loaded_by("raftcoord.coordinator.leader")
    assert [m for m in loaded if m not in PURE_PROTOCOL + leader] == [], loaded


def test_importing_fsm_loads_no_raft_grpc_or_protobuf() -> None:
    loaded = modules_loaded_by("fsm, pid_allocator")
    assert [m for m in loaded if m not in PURE_PROTOCOL] == [], loaded


# --- one vocabulary end to end ------------------------------------------------------


def test_error_codes_match_the_protobuf_enum() -> None:
    ours = {code.name: int(code) for code in ErrorCode}
    proto = dict(common_pb2.ErrorCode.items())
    assert ours == proto, (
        f"only in fsm: {sorted(set(ours.items()) - set(proto.items()))}, "
        f"only in proto: {sorted(set(proto.items()) - set(ours.items()))}"
    )
    assert len(ours) == len(ErrorCode.__members__)  # no aliases hiding a name


def test_transaction_states_match_the_protobuf_enum() -> None:
    proto = common_pb2.TransactionState.items()
    prefix = "TRANSACTION_STATE_"
    assert all(name.startswith(prefix) for name, _ in proto)
    assert [(name.removeprefix(prefix), value) for name, value in proto] == [
        (state.name, int(state)) for state in TxnState
    ]
    assert [int(s) for s in TxnState] == list(range(8))
    assert (
        common_pb2.TransactionState.Value("TRANSACTION_STATE_PREPARE_EPOCH_FENCE")
        == int(TxnState.PREPARE_EPOCH_FENCE)
        == 7
    )
    assert common_pb2.TransactionState.Value("TRANSACTION_STATE_EMPTY") == int(TxnState.EMPTY) == 0


# --- shard routing ------------------------------------------------------------------

KEYS = ["txn-1", "orders-app", "", "group-payments", "ünïcødé-id", "a" * 1000]


#: Pinned routing (CRC-32 of the UTF-8 bytes, modulo 3); changing the routing
#: function would move every existing transactional.id to another shard.
PINNED_S3 = {
    "txn-1": (1464239518, 1),
    "orders-app": (217315632, 0),
    "group-payments": (2998352926, 1),
    "": (0, 0),
    "ünïcødé-id": (2992194641, 2),
}


def test_shard_for_is_crc32_modulo_shard_count() -> None:
    for key, (crc, shard) in PINNED_S3.items():
        assert zlib.crc32(key.encode("utf-8")) == crc  # the pinned values are CRC-32
        assert crc % 3 == shard
        assert shard_for(key, 3) == shard, key
    for key in KEYS:
        for shard_count in (1, 2, 3, 7, 64):
            expected = zlib.crc32(key.encode("utf-8")) % shard_count
            assert shard_for(key, shard_count) == expected, (key, shard_count)


def test_shards_prefer_the_coordinators_in_turn() -> None:
    assert [preferred_leader(s, 3) for s in range(3)] == [0, 1, 2]
    assert [preferred_leader(s, 3) for s in range(5)] == [0, 1, 2, 0, 1]
    assert [preferred_leader(s, 1) for s in range(3)] == [0, 0, 0]


def test_shard_for_is_the_same_in_another_process() -> None:
    code = (
        "import json, sys; from raftcoord.protocol.routing import shard_for; "
        "print(json.dumps([shard_for(k, 3) for k in json.loads(sys.argv[1])]))"
    )
    here = [shard_for(key, 3) for key in KEYS]
    for seed in ("0", "12345", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        result = subprocess.run(
            [sys.executable, "-c", code, json.dumps(KEYS)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == here, seed


@pytest.mark.parametrize("shard_count", [0, -1, -3])
def test_shard_for_rejects_a_non_positive_shard_count(shard_count: int) -> None:
    with pytest.raises(ValueError):
        shard_for("txn-1", shard_count)


def test_fsm_answers_with_the_protocol_error_code() -> None:
    assert fsm.ErrorCode is ErrorCode
