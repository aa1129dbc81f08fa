"""Two dependencies are reached below their public interface, so
pyproject.toml pins them to the releases tested: the coordinator's Raft
member (``raftcoord/coordinator/raft.py``) uses private members of
pysyncobj's ``SyncObj`` (and its private ``_RAFT_STATE``), and the Kafka
codec (``raftcoord/kafka/messages.py``) imports from kio's private
``kio.serial._introspect`` and ``_parse``. The
members used are read from those files, so that a new use is checked too,
and a missing one fails here by name (each check is shown to catch one
removed: an upgrade fails loudly here instead of misbehaving)."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

REPO_ROOT = Path(__file__).resolve().parents[1]
RAFT = REPO_ROOT / "raftcoord" / "coordinator" / "raft.py"
KAFKA_MESSAGES = REPO_ROOT / "raftcoord" / "kafka" / "messages.py"
#: The members of pysyncobj's SyncObj that raft.py used when this was written.
KNOWN_SYNCOBJ_MEMBERS = {
    "_SyncObj__applyLogEntries",
    "_SyncObj__commandsQueue",
    "_SyncObj__commandsWaitingCommit",
    "_SyncObj__doApplyCommand",
    "_SyncObj__onMessageReceived",
    "_SyncObj__raftElectionDeadline",
    "_SyncObj__raftLeader",
    "_SyncObj__raftLog",
    "_SyncObj__raftMatchIndex",
    "_SyncObj__sendNextNodeIdx",
    "_SyncObj__serializer",
    "_SyncObj__setState",
    "_SyncObj__transferInProgress",
    "_SyncObj__transport",
    "_applyCommand",
    "_getLeader",
    "_isLeader",
    "_poller",
}
#: SyncObj's private methods that RaftGroup overrides by their own name
#: (pysyncobj calls them: doTick calls _onTick).
OVERRIDDEN_SYNCOBJ_METHODS = {"_onTick"}


def syncobj_members_used(source: str) -> set[str]:
    """The private members of ``SyncObj`` that the ``RaftGroup`` subclass in
    ``source`` reaches: every ``self._name`` it reads, assigns or overrides
    that is pysyncobj's (name-mangled ``_SyncObj__*``) or that the class does
    not define itself."""
    (group,) = [
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.ClassDef) and n.name == "RaftGroup"
    ]
    own: set[str] = set()
    used: set[str] = set()
    for node in ast.walk(group):
        if isinstance(node, ast.FunctionDef):
            (used if node.name.startswith("_SyncObj__") else own).add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and node.attr.startswith("_")
        ):
            assigned = isinstance(node.ctx, ast.Store) and not node.attr.startswith("_SyncObj__")
            (own if assigned else used).add(node.attr)
    return {name for name in used - own if not name.startswith("__")}


def missing_syncobj_members(names: set[str]) -> list[str]:
    """The names that pysyncobj's ``SyncObj`` has neither as a class member nor
    as an attribute its ``__init__`` assigns."""
    from pysyncobj import SyncObj

    init = inspect.getsource(SyncObj.__init__)
    assigned = {
        f"_SyncObj{attr}" if attr.startswith("__") else attr
        for attr in re.findall(r"self\.(_\w+)\s*=", init)
    }
    return sorted(n for n in names if not hasattr(SyncObj, n) and n not in assigned)


def private_imports(source: str, package: str) -> set[tuple[str, str]]:
    """(module, name) of every ``from MODULE import NAME`` in ``source`` where
    MODULE is in ``package`` and one of its parts, or NAME, is private (``_x``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[0] != package:
                continue
            private_module = any(p.startswith("_") for p in parts)
            found.update(
                (node.module, alias.name)
                for alias in node.names
                if private_module or alias.name.startswith("_")
            )
    return found


def missing_imports(imports: set[tuple[str, str]]) -> list[str]:
    """``module.name`` of each import that the installed package lacks."""
    missing = []
    for module, name in sorted(imports):
        try:
            found: Any = importlib.import_module(module)
        except ImportError:
            missing.append(module)
            continue
        if not hasattr(found, name):
            missing.append(f"{module}.{name}")
    return missing


def test_every_private_syncobj_member_the_coordinator_uses_exists() -> None:
    used = syncobj_members_used(RAFT.read_text())
    assert used >= KNOWN_SYNCOBJ_MEMBERS, sorted(KNOWN_SYNCOBJ_MEMBERS - used)
    missing = missing_syncobj_members(used)
    assert not missing, f"pysyncobj {version('pysyncobj')} lacks SyncObj's {missing}"


def test_the_private_syncobj_methods_the_coordinator_overrides_exist() -> None:
    """A private method of SyncObj that RaftGroup overrides by its own name is
    listed (and so checked): renamed in pysyncobj, the override would
    silently never run."""
    from pysyncobj import SyncObj

    (group,) = [
        n
        for n in ast.walk(ast.parse(RAFT.read_text()))
        if isinstance(n, ast.ClassDef) and n.name == "RaftGroup"
    ]
    overridden = {
        n.name
        for n in group.body
        if isinstance(n, ast.FunctionDef)
        and n.name.startswith("_")
        and not n.name.startswith(("__", "_SyncObj__"))
        and hasattr(SyncObj, n.name)
    }
    assert overridden == OVERRIDDEN_SYNCOBJ_METHODS
    missing = [n for n in OVERRIDDEN_SYNCOBJ_METHODS if not callable(getattr(SyncObj, n, None))]
    assert not missing, f"pysyncobj {version('pysyncobj')} lacks SyncObj's {missing}"


def test_the_private_pysyncobj_names_the_coordinator_imports_exist() -> None:
    imports = private_imports(RAFT.read_text(), "pysyncobj")
    assert imports == {("pysyncobj.syncobj", "_RAFT_STATE")}
    assert not missing_imports(imports)
    from pysyncobj.syncobj import _RAFT_STATE

    assert _RAFT_STATE.FOLLOWER != _RAFT_STATE.LEADER  # the state _step_down sets


def test_a_removed_syncobj_member_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from pysyncobj import SyncObj

    used = syncobj_members_used(RAFT.read_text())
    monkeypatch.delattr(SyncObj, "_SyncObj__sendNextNodeIdx")  # a method
    assert missing_syncobj_members(used) == ["_SyncObj__sendNextNodeIdx"]
    monkeypatch.undo()

    def init_without_its_raft_log(self: Any) -> None:
        self.__commandsQueue = None
        self.__commandsWaitingCommit = {}
        self.__conf = None
        self.__raftElectionDeadline = 0
        self.__raftLeader = None
        self.__raftMatchIndex = {}
        self.__transferInProgress = False
        self.__transport = None
        self.__serializer = None
        self._poller = None

    # an attribute __init__ no longer assigns
    monkeypatch.setattr(SyncObj, "__init__", init_without_its_raft_log)
    assert missing_syncobj_members(used) == ["_SyncObj__raftLog"]


def test_every_private_kio_name_the_kafka_codec_imports_exists() -> None:
    imports = private_imports(KAFKA_MESSAGES.read_text(), "kio")
    assert {m for m, _ in imports} == {"kio.serial._introspect", "kio.serial._parse"}
    missing = missing_imports(imports)
    assert not missing, f"kio {version('kio')} lacks {missing}"


def test_a_removed_kio_name_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import kio.serial._parse

    imports = private_imports(KAFKA_MESSAGES.read_text(), "kio")
    monkeypatch.delattr(kio.serial._parse, "get_reader")
    assert missing_imports(imports) == ["kio.serial._parse.get_reader"]


@pytest.mark.parametrize("package", ["pysyncobj", "kio"])
def test_the_pinned_range_is_closed_and_holds_the_installed_release(package: str) -> None:
    with (REPO_ROOT / "pyproject.toml").open("rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    (requirement,) = [r for r in map(Requirement, dependencies) if r.name == package]
    assert any(s.operator in ("<", "<=", "==") for s in requirement.specifier), requirement
    assert version(package) in requirement.specifier, (version(package), str(requirement))
