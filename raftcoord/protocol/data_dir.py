"""A node's data directory and who it belongs to: ``meta.properties``.

Kafka's idea (with KIP-858's directory ids): every node writes, the first
time it starts in an empty data directory, a small file naming its kind, its
node id and a random directory id, and checks it at every later start. A
directory of another node (or another kind of node), or one whose file is
damaged, is refused before anything in it is read. The directory id is what
the coordinators record for each partition-log node, so that a node whose
disk was replaced (an empty directory: a new id) does not serve its
partitions from nothing (docs/partition-log.md, "Data directories").

The file is text, one ``key=value`` per line, and ends with the CRC32C of
the lines before it: a flipped bit is found, never believed.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import crc32c

from raftcoord.protocol.limits import is_directory_id

META_FILE = "meta.properties"
VERSION = 1
_HEADER = "# raftcoord data directory identity; do not edit (the last line is a checksum)\n"


@dataclass(frozen=True)
class DirectoryIdentity:
    """What ``meta.properties`` says."""

    kind: str  # "coordinator" or "partition-log"
    node_id: int
    directory_id: str


class DirectoryRefused(Exception):
    """The directory belongs to another node, or its identity file is damaged;
    the message says which and what to do."""


class DirectoryUnusable(Exception):
    """The directory or its identity file could not be made, read or written
    (a failed fsync among them): the disk failed under the node."""


def load_or_create(data_dir: Path, kind: str, node_id: int) -> tuple[DirectoryIdentity, bool]:
    """The directory's identity, written first (with a new directory id) when
    the directory has no ``meta.properties``; and whether it was written now.

    Raises:
        DirectoryRefused: the file names another node or kind, or is damaged.
        DirectoryUnusable: the directory or file cannot be used.
    """
    path = data_dir / META_FILE
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            identity = DirectoryIdentity(kind, node_id, uuid.uuid4().hex)
            write_durably(path, render(identity).encode("utf-8"))
            return identity, True
    except UnicodeDecodeError:
        raise DirectoryRefused(f"{path} is damaged (not UTF-8 text)") from None
    except OSError as exc:
        raise DirectoryUnusable(f"{path}: {exc}") from exc
    return _owned(parse(text, path), data_dir, kind, node_id), False


def inspect(data_dir: Path, kind: str, node_id: int) -> DirectoryIdentity | None:
    """What :func:`load_or_create` would find, writing nothing: the
    directory's identity, or None when it has none yet.

    Raises:
        DirectoryRefused: the file names another node or kind, or is damaged.
        DirectoryUnusable: the file cannot be read.
    """
    path = data_dir / META_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise DirectoryRefused(f"{path} is damaged (not UTF-8 text)") from None
    except OSError as exc:
        raise DirectoryUnusable(f"{path}: {exc}") from exc
    return _owned(parse(text, path), data_dir, kind, node_id)


def _owned(
    identity: DirectoryIdentity, data_dir: Path, kind: str, node_id: int
) -> DirectoryIdentity:
    """``identity``, when it is ``kind`` node ``node_id``'s.

    Raises:
        DirectoryRefused: it is another node's.
    """
    if (identity.kind, identity.node_id) != (kind, node_id):
        raise DirectoryRefused(
            f"{data_dir} belongs to {identity.kind} node {identity.node_id} "
            f"(directory {identity.directory_id}), not to {kind} node {node_id}: "
            "point the node at its own data directory"
        )
    return identity


def renew(data_dir: Path) -> DirectoryIdentity | None:
    """Give the directory a new directory id (its node and kind kept), as if
    it were new; the new identity, or None when it has none yet (its node
    writes one at its next start).

    Raises:
        DirectoryRefused: its identity file is damaged.
        OSError: the file cannot be read or written.
    """
    path = data_dir / META_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise DirectoryRefused(f"{path} is damaged (not UTF-8 text)") from None
    old = parse(text, path)
    identity = DirectoryIdentity(old.kind, old.node_id, uuid.uuid4().hex)
    write_durably(path, render(identity).encode("utf-8"))
    return identity


def parse(text: str, path: Path | str = META_FILE) -> DirectoryIdentity:
    """The identity in ``text`` (a ``meta.properties`` file's contents).

    Raises:
        DirectoryRefused: the text is damaged or incomplete.
    """
    body, _, last = text.rstrip("\n").rpartition("\n")
    body += "\n"
    if not last.startswith("checksum=") or last[len("checksum=") :] != _checksum(body):
        raise DirectoryRefused(f"{path} is damaged (checksum mismatch)")
    fields = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            if not sep:
                raise DirectoryRefused(f"{path}: a line without '=': {line[:80]!r}")
            fields[key] = value
    try:
        if int(fields["version"]) != VERSION:
            raise DirectoryRefused(f"{path}: unknown version {fields['version']}")
        identity = DirectoryIdentity(fields["kind"], int(fields["node.id"]), fields["directory.id"])
    except KeyError as exc:
        raise DirectoryRefused(f"{path}: missing {exc.args[0]}") from None
    except ValueError as exc:
        raise DirectoryRefused(f"{path}: {exc}") from None
    if not is_directory_id(identity.directory_id):
        raise DirectoryRefused(f"{path}: bad directory.id {identity.directory_id!r}")
    return identity


def render(identity: DirectoryIdentity) -> str:
    """The ``meta.properties`` text of ``identity``."""
    body = (
        f"{_HEADER}version={VERSION}\nkind={identity.kind}\nnode.id={identity.node_id}\n"
        f"directory.id={identity.directory_id}\n"
    )
    return f"{body}checksum={_checksum(body)}\n"


def _checksum(body: str) -> str:
    return f"{crc32c.crc32c(body.encode('utf-8')):08x}"


def write_durably(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` by ``data``: a temporary file created with ``mode`` (a
    key is never readable by others, not even for a moment), written whole,
    fsynced, renamed over ``path``, and the directory fsynced, so a crash
    leaves the old file or the new one.

    Raises:
        OSError: a step failed (the old file, if any, is still there).
    """
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # O_CREAT keeps an old file's mode
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with memoryview(data) as view:
            written = 0
            while written < len(data):
                written += os.write(fd, view[written:])
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
