"""The audit's inputs read from the cluster's nodes instead of a directory
(docs/audit.md, "Across hosts"): every node the cluster config lists is asked
for its data files over the DataFiles RPC, and each file's bytes are streamed
as they are on the node's disk. The decoding stays the audit's own
(:mod:`spark.sources`): nothing of a node's code reads the bytes.

The driver lists the files (:func:`list_nodes`); the executors fetch them
(:class:`Fetcher`), so every worker must reach every node and, with ``[tls]``,
find the TLS files at the paths given (a node's or a super user's
certificate: the RPC serves no one else).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc

from raftcoord.protocol.channels import open_channel
from raftcoord.protocol.config import load_config
from raftcoord.protocol.data_files import COORDINATOR, PARTITION_LOG
from raftcoord.protocol.tls import Identity
from raftcoord.protocol.v1 import data_files_pb2, data_files_pb2_grpc

#: Seconds to list one node's files, and to stream one file.
LIST_TIMEOUT_S = 30.0
FETCH_TIMEOUT_S = 600.0

#: Seconds a node that cannot be reached (UNAVAILABLE) is tried again before
#: its files count as unreadable: a connection attempt that fails once (a
#: busy machine, a handshake cut short) is not a lost file. Reads change
#: nothing on the node, so trying one again is safe.
UNAVAILABLE_WINDOW_S = 30.0
#: Seconds between two tries of a read the node answered UNAVAILABLE.
UNAVAILABLE_PAUSE_S = 0.2

T = TypeVar("T")

#: The data sources' options that name the TLS files, in :attr:`Cluster.tls`'s order.
TLS_OPTIONS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")


@dataclass(frozen=True)
class NodeFiles:
    """One node's data files as it listed them, or why it could not."""

    node_id: int
    kind: str  # COORDINATOR or PARTITION_LOG
    address: str
    files: tuple[tuple[str, int], ...] = ()  # (name, size)
    problem: str | None = None

    def by_directory(self) -> dict[str, list[tuple[str, int]]]:
        """The files grouped by their directory (a partition, a shard), in name order."""
        grouped: dict[str, list[tuple[str, int]]] = {}
        for name, size in self.files:
            directory, _, _ = name.partition("/")
            grouped.setdefault(directory, []).append((name, size))
        return grouped


@dataclass(frozen=True)
class Cluster:
    """What the audit reads of a cluster over the network: its config's path
    and the TLS files to call its nodes with (CA, certificate, key; None
    without ``[tls]``)."""

    config: Path
    tls: tuple[str, str, str] | None = None

    def options(self) -> dict[str, str]:
        """The data sources' options naming this cluster."""
        found = {"cluster_config": str(self.config)}
        if self.tls is not None:
            found.update(zip(TLS_OPTIONS, self.tls, strict=True))
        return found


def cluster_of(options: dict[str, str]) -> Cluster:
    """The cluster a data source's ``options`` name (:meth:`Cluster.options`)."""
    ca, cert, key = (options.get(key) for key in TLS_OPTIONS)
    tls = (ca, cert, key) if ca is not None and cert is not None and key is not None else None
    return Cluster(Path(options["cluster_config"]), tls)


def list_nodes(cluster: Cluster, kind: str) -> list[NodeFiles]:
    """Every node of ``kind`` in the config, with its files (or the reason it
    could not list them)."""
    assert kind in (COORDINATOR, PARTITION_LOG)
    config = load_config(cluster.config)
    nodes = config.coordinators if kind == COORDINATOR else config.partition_nodes
    listed = []
    for node in nodes:
        try:
            with _channel(cluster, node.grpc) as channel:
                stub = data_files_pb2_grpc.DataFilesStub(channel)
                request = data_files_pb2.ListDataFilesRequest()
                answer = _read(
                    functools.partial(stub.ListDataFiles, request, timeout=LIST_TIMEOUT_S)
                )
        except grpc.RpcError as exc:
            listed.append(
                NodeFiles(node.node_id, kind, node.grpc, problem=_unreachable(node.grpc, exc))
            )
            continue
        if answer.node_id != node.node_id or answer.kind != kind:
            problem = (
                f"{node.grpc} is {answer.kind} node {answer.node_id}, "
                f"not {kind} node {node.node_id} as the config says"
            )
            listed.append(NodeFiles(node.node_id, kind, node.grpc, problem=problem))
            continue
        files = tuple((f.name, f.size) for f in answer.files)
        listed.append(NodeFiles(node.node_id, kind, node.grpc, files))
    return listed


class Fetcher:
    """Fetches files of one node over one channel (an executor's)."""

    def __init__(self, cluster: Cluster, address: str) -> None:
        self.address = address
        self.channel = _channel(cluster, address)
        self.stub = data_files_pb2_grpc.DataFilesStub(self.channel)

    def fetch(self, name: str, size: int) -> bytes:
        """The first ``size`` bytes of file ``name`` (as listed).

        Raises:
            OSError: the node did not serve them all.
        """
        if size == 0:
            return b""
        request = data_files_pb2.ReadDataFileRequest(name=name, offset=0, length=size)
        try:
            data = _read(
                lambda: b"".join(
                    c.data for c in self.stub.ReadDataFile(request, timeout=FETCH_TIMEOUT_S)
                ),
            )
        except grpc.RpcError as exc:
            raise OSError(f"{name}: {_unreachable(self.address, exc)}") from None
        if len(data) != size:
            raise OSError(f"{name}: {len(data)} of the {size} bytes listed were served")
        return data

    def close(self) -> None:
        self.channel.close()


def _read(call: Callable[[], T]) -> T:
    """``call()``, tried again every :data:`UNAVAILABLE_PAUSE_S` while it
    fails with UNAVAILABLE, for up to :data:`UNAVAILABLE_WINDOW_S`; then its
    last error is raised. (The channel reconnects by itself meanwhile, within
    a second: ``CHANNEL_POLICY``.)"""
    deadline = time.monotonic() + UNAVAILABLE_WINDOW_S
    while True:
        try:
            return call()
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if code is not grpc.StatusCode.UNAVAILABLE or time.monotonic() >= deadline:
                raise
        time.sleep(UNAVAILABLE_PAUSE_S)


def _channel(cluster: Cluster, address: str) -> grpc.Channel:
    credentials = None
    if cluster.tls is not None:
        ca, cert, key = (Path(f) for f in cluster.tls)
        credentials = Identity.load(ca, cert, key).channel_credentials()
    return open_channel(address, credentials)


def _unreachable(address: str, exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{address} answered {getattr(code, 'name', code)}: {details}"
