"""The arrows between components, read from the imports of every module.

A component is a top-level package (fsm, pid_allocator, marker_writer,
partition_log, spark) or a subpackage of raftcoord (protocol, coordinator,
client, cluster, chaos, cli, bench, kafka, console). Every import counts, also
one inside a function
or under ``TYPE_CHECKING``: a hidden arrow is still an arrow.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.test_purity import FORBIDDEN

REPO_ROOT = Path(__file__).resolve().parents[1]

TOP_LEVEL = ("fsm", "pid_allocator", "marker_writer", "partition_log", "spark")
RAFTCOORD = (
    "protocol",
    "coordinator",
    "client",
    "cluster",
    "chaos",
    "cli",
    "bench",
    "kafka",
    "console",
)

#: The protocol's modules without I/O, the only part of raftcoord the pure core may import.
PURE_PROTOCOL = frozenset(
    f"raftcoord.protocol.{name}"
    for name in ("acl", "errors", "limits", "routing", "scram", "types")
)
#: pid_allocator is part of the pure core (fsm.machine allocates producer ids
#: with it; tests/test_purity.py keeps it pure too).
#: Components that talk to the coordinators only through the protocol.
PROTOCOL_ONLY = ("partition_log", "marker_writer", "raftcoord.client", "spark", "raftcoord.kafka")


def component(module: str) -> str | None:
    """The component ``module`` belongs to, or None (stdlib, third party, tests)."""
    parts = module.split(".")
    if parts[0] in TOP_LEVEL:
        return parts[0]
    if parts[0] == "raftcoord" and len(parts) > 1 and parts[1] in RAFTCOORD:
        return f"raftcoord.{parts[1]}"
    return None


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, module) of every import in ``source`` in line order, relative ones resolved.

    ``from X import Y`` yields ``X.Y`` (Y may be a submodule) as well as ``X``.
    """
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            found.extend((node.lineno, f"{target}.{alias.name}") for alias in node.names)
    return sorted(found)


def violations(module: str, imports: Iterable[tuple[int, str]]) -> list[str]:
    """``module:line: imported (rule)`` for every import the layout forbids."""
    owner = component(module)
    problems: list[str] = []
    for line, target in imports:
        other = component(target)

        def refuse(rule: str, line: int = line, target: str = target) -> None:
            problems.append(f"{module}:{line}: {target} ({rule})")

        if owner == "fsm":
            if target.split(".")[0] in FORBIDDEN:
                refuse("fsm does no I/O")
            elif other == "raftcoord.protocol":
                if target != other and ".".join(target.split(".")[:3]) not in PURE_PROTOCOL:
                    refuse("fsm imports only the protocol's pure modules")
            elif other not in (None, "fsm", "pid_allocator"):
                refuse("fsm imports no component but the protocol's pure modules")
        if owner in PROTOCOL_ONLY and other in ("fsm", "raftcoord.coordinator"):
            refuse(f"{owner} talks to the coordinators only through the protocol")
        if owner == "raftcoord.protocol" and other not in (None, "raftcoord.protocol"):
            refuse("the protocol imports no other component")
        if other == "raftcoord.bench" and owner not in ("raftcoord.bench", "raftcoord.cli"):
            refuse("only the command line imports the benchmarks")
        if owner == "raftcoord.console" and other not in (
            None,
            "raftcoord.console",
            "raftcoord.client",
        ):
            refuse("the console reads the cluster only through the client library")
    return problems


def arrows(sources: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Component -> the components it imports, from {module: (source, is_package)}."""
    graph: dict[str, set[str]] = {}
    for module, (source, is_package) in sources.items():
        owner = component(module)
        if owner is None:
            continue
        targets = graph.setdefault(owner, set())
        for _line, target in imported_modules(source, module, is_package):
            other = component(target)
            if other is not None and other != owner:
                targets.add(other)
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path back to its start) per component that lies on one."""
    found: list[list[str]] = []
    seen_on_cycle: set[str] = set()
    for start in sorted(graph):
        if start in seen_on_cycle:
            continue
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        visited: set[str] = set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    found.append([*path, start])
                    seen_on_cycle.update(path)
                    stack.clear()
                    break
                if nxt not in visited:
                    visited.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    return found


def module_cycles(sources: Mapping[str, tuple[str, bool]]) -> list[list[str]]:
    """The modules of ``sources`` that import each other, directly or round a
    longer loop: each strongly connected group of two modules or more, sorted.
    A module's import of a package it lies in (its ``__init__``) is left out:
    importing the module imports that package first anyway."""
    graph: dict[str, set[str]] = {}
    for module, (source, is_package) in sources.items():
        graph[module] = {
            target
            for _line, target in imported_modules(source, module, is_package)
            if target in sources and target != module and not module.startswith(f"{target}.")
        }
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iteratively
        work = [(start, iter(sorted(graph[start])))]
        order[start] = low[start] = len(order)
        stack.append(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in order:
                    order[target] = low[target] = len(order)
                    stack.append(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in stack:
                    low[node] = min(low[node], order[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == order[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return sorted(found)


def repository_sources() -> dict[str, tuple[str, bool]]:
    sources: dict[str, tuple[str, bool]] = {}
    roots = [REPO_ROOT / name for name in TOP_LEVEL] + [REPO_ROOT / "raftcoord"]
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            relative = path.relative_to(REPO_ROOT).with_suffix("")
            if relative.parts[:3] == ("raftcoord", "protocol", "v1"):
                continue  # generated code
            is_package = relative.name == "__init__"
            parts = relative.parts[:-1] if is_package else relative.parts
            sources[".".join(parts)] = (path.read_text(encoding="utf-8"), is_package)
    return sources


def test_every_component_keeps_to_its_arrows() -> None:
    sources = repository_sources()
    assert {component(m) for m in sources} >= {*TOP_LEVEL, *(f"raftcoord.{n}" for n in RAFTCOORD)}
    found = [
        problem
        for module, (source, is_package) in sources.items()
        for problem in violations(module, imported_modules(source, module, is_package))
    ]
    assert not found, "imports the layout forbids:\n" + "\n".join(found)


def test_no_component_depends_on_itself_in_a_circle() -> None:
    found = cycles(arrows(repository_sources()))
    assert not found, "import cycles between components:\n" + "\n".join(
        " -> ".join(cycle) for cycle in found
    )


def test_no_two_modules_import_each_other() -> None:
    """Two modules that need each other are one module, or each needs a
    narrower interface of the other (a Protocol, as the producer's sender
    takes its transaction manager, the network namespaces a cluster and a
    coordinator's metrics collector the node it scrapes)."""
    found = module_cycles(repository_sources())
    assert found == [], "modules that import each other:\n" + "\n".join(
        " <-> ".join(cycle) for cycle in found
    )


# --- the checker finds what it looks for ---------------------------------------------


def test_the_checker_refuses_forbidden_arrows() -> None:
    def check(module: str, source: str, is_package: bool = False) -> list[str]:
        return violations(module, imported_modules(source, module, is_package))

    fsm_source = "\n".join(
        [
            "from raftcoord.protocol.errors import ErrorCode",
            "from raftcoord.protocol import types",
            "from pid_allocator import PidLayout",
            "import time",
            "from raftcoord.protocol.config import Settings",
            "def f():",
            "    from raftcoord.coordinator import node",
            "from marker_writer import MarkerWriter",
        ]
    )
    assert check("fsm.machine", fsm_source) == [
        "fsm.machine:4: time (fsm does no I/O)",
        "fsm.machine:5: raftcoord.protocol.config (fsm imports only the protocol's pure modules)",
        "fsm.machine:5: raftcoord.protocol.config.Settings"
        " (fsm imports only the protocol's pure modules)",
        "fsm.machine:7: raftcoord.coordinator"
        " (fsm imports no component but the protocol's pure modules)",
        "fsm.machine:7: raftcoord.coordinator.node"
        " (fsm imports no component but the protocol's pure modules)",
        "fsm.machine:8: marker_writer (fsm imports no component but the protocol's pure modules)",
        "fsm.machine:8: marker_writer.MarkerWriter"
        " (fsm imports no component but the protocol's pure modules)",
    ]
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import fsm.effects\n"
    assert check("marker_writer.book", guarded) == [
        "marker_writer.book:3: fsm.effects"
        " (marker_writer talks to the coordinators only through the protocol)"
    ]
    assert check("raftcoord.client.consumer", "from ..coordinator.shard import now_ms") == [
        "raftcoord.client.consumer:1: raftcoord.coordinator.shard"
        " (raftcoord.client talks to the coordinators only through the protocol)",
        "raftcoord.client.consumer:1: raftcoord.coordinator.shard.now_ms"
        " (raftcoord.client talks to the coordinators only through the protocol)",
    ]
    assert check("raftcoord.protocol", "from . import errors", is_package=True) == []
    assert check("raftcoord.protocol.config", "from partition_log import codec") == [
        "raftcoord.protocol.config:1: partition_log (the protocol imports no other component)",
        "raftcoord.protocol.config:1: partition_log.codec"
        " (the protocol imports no other component)",
    ]
    assert check("partition_log.node", "from raftcoord.protocol.config import load_config") == []
    assert check("raftcoord.chaos.workload", "from raftcoord.bench import stats") == [
        "raftcoord.chaos.workload:1: raftcoord.bench"
        " (only the command line imports the benchmarks)",
        "raftcoord.chaos.workload:1: raftcoord.bench.stats"
        " (only the command line imports the benchmarks)",
    ]
    assert check("raftcoord.cli.bench", "from raftcoord.bench import targets") == []
    assert check("raftcoord.console.collect", "from raftcoord.client import Admin") == []
    assert check("raftcoord.console.app", "from partition_log import service") == [
        "raftcoord.console.app:1: partition_log"
        " (the console reads the cluster only through the client library)",
        "raftcoord.console.app:1: partition_log.service"
        " (the console reads the cluster only through the client library)",
    ]
    assert check("raftcoord.console.model", "import raftcoord.protocol.v1.admin_pb2") == [
        "raftcoord.console.model:1: raftcoord.protocol.v1.admin_pb2"
        " (the console reads the cluster only through the client library)",
    ]


def test_the_checker_finds_a_cycle() -> None:
    sources = {
        "partition_log.node": ("from raftcoord.cli.main import main\n", False),
        "raftcoord.cli.main": ("import partition_log.node\n", False),
        "raftcoord.chaos.workload": ("from raftcoord.client import Producer\n", False),
    }
    graph = arrows(sources)
    assert graph == {
        "partition_log": {"raftcoord.cli"},
        "raftcoord.cli": {"partition_log"},
        "raftcoord.chaos": {"raftcoord.client"},
    }
    assert cycles(graph) == [["partition_log", "raftcoord.cli", "partition_log"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_checker_finds_modules_that_import_each_other() -> None:
    sources = {
        "raftcoord.client._sender": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from raftcoord.client._transactions import TransactionManager\n",
            False,
        ),
        "raftcoord.client._transactions": ("from raftcoord.client._sender import Sender\n", False),
        "raftcoord.cluster.launcher": ("from raftcoord.cluster import netns\n", False),
        "raftcoord.cluster.netns": ("import raftcoord.cluster.x\n", False),
        "raftcoord.cluster.x": ("from . import launcher\n", False),
        "raftcoord.cluster": ("from raftcoord.cluster.launcher import LocalCluster\n", True),
        "fsm": ("from fsm.machine import Machine\n", True),
        "fsm.machine": ("from fsm import effects\n", False),
        "fsm.effects": ("", False),
    }
    assert module_cycles(sources) == [
        ["raftcoord.client._sender", "raftcoord.client._transactions"],
        ["raftcoord.cluster.launcher", "raftcoord.cluster.netns", "raftcoord.cluster.x"],
    ]
