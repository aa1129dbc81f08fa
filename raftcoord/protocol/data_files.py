"""The DataFiles service: a node's data files as raw bytes, for the Spark audit
of a cluster whose disks are on several hosts (docs/audit.md, "Across hosts").

Every coordinator serves its shards' applied-transitions logs
(``shard-<S>/transitions.jsonl``), every partition-log node its partitions'
segments and offset-gaps files (``<topic>-<partition>/<base>.log``,
``<topic>-<partition>/offset-gaps``). Nothing else under the data directory
can be named: a name must match the node kind's pattern (no ``/`` inside a
component, no NUL, no ``..``), each of its two components must be a real
directory and a regular file (symbolic links are not followed), and only
then is the file opened. With ``[tls]`` only the cluster's nodes and its
super users may call (:func:`raftcoord.protocol.tls.cluster_refusal`).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from raftcoord.protocol.v1 import data_files_pb2, data_files_pb2_grpc

#: The largest chunk of a ReadDataFile stream (gRPC's default message limit is 4 MiB).
CHUNK_BYTES = 1024 * 1024

COORDINATOR = "coordinator"
PARTITION_LOG = "partition-log"
#: The names each kind of node serves, relative to its data directory.
PATTERNS = {
    COORDINATOR: re.compile(r"(shard-\d+)/(transitions\.jsonl)"),
    PARTITION_LOG: re.compile(r"([^/\x00]+-\d+)/(\d{20}\.log|offset-gaps)"),
}


class DataFilesService(data_files_pb2_grpc.DataFilesServicer):
    """The DataFiles service of one node. ``refusal`` says why a call's
    caller may not read the node's files (None: it may)."""

    def __init__(
        self,
        data_dir: Path,
        node_id: int,
        kind: str,
        refusal: Callable[[Any], str | None],
    ) -> None:
        self.data_dir = data_dir
        self.node_id = node_id
        self.kind = kind
        self.pattern = PATTERNS[kind]
        self.refusal = refusal

    def ListDataFiles(self, request: Any, context: Any) -> Any:
        self._authorize(context)
        return data_files_pb2.ListDataFilesResponse(
            node_id=self.node_id,
            kind=self.kind,
            files=[data_files_pb2.DataFile(name=n, size=s) for n, s in list_files(self)],
        )

    def ReadDataFile(self, request: Any, context: Any) -> Iterator[Any]:
        self._authorize(context)
        if request.offset < 0 or request.length < 0:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"offset {request.offset} and length {request.length} must not be negative",
            )
        fd = open_data_file(self, request.name)
        if fd is None:
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"{request.name!r} is not a data file of {self.kind} node {self.node_id}",
            )
            raise AssertionError("abort raises")
        with os.fdopen(fd, "rb") as f:
            position = request.offset
            end = None if request.length == 0 else request.offset + request.length
            while context.is_active():
                want = CHUNK_BYTES if end is None else min(CHUNK_BYTES, end - position)
                if want <= 0:
                    return
                data = os.pread(f.fileno(), want, position)
                if not data:
                    return
                position += len(data)
                yield data_files_pb2.DataFileChunk(data=data)

    def _authorize(self, context: Any) -> None:
        refused = self.refusal(context)
        if refused is not None:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, refused)


def list_files(service: DataFilesService) -> list[tuple[str, int]]:
    """(name, size) of every file the node serves, by name."""
    found = []
    try:
        directories = sorted(os.scandir(service.data_dir), key=lambda e: e.name)
    except OSError:
        return []
    for directory in directories:
        if not directory.is_dir(follow_symlinks=False):
            continue
        try:
            entries = sorted(os.scandir(directory.path), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            name = f"{directory.name}/{entry.name}"
            if service.pattern.fullmatch(name) and entry.is_file(follow_symlinks=False):
                try:
                    found.append((name, entry.stat(follow_symlinks=False).st_size))
                except OSError:  # removed meanwhile (retention)
                    continue
    return found


def open_data_file(service: DataFilesService, name: str) -> int | None:
    """A read-only descriptor of data file ``name``, or None when ``name`` is
    not one: it does not match the node's pattern, a component is a link or
    of the wrong type, or it does not exist."""
    match = service.pattern.fullmatch(name)
    if match is None:
        return None
    directory, file = match.groups()
    try:
        dir_fd = os.open(service.data_dir / directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        # Not blocked by a FIFO planted under the name; a regular file reads as usual.
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd
