"""Setting a coordinator's damaged shard replica aside (``raftcoord repair-shard``).

A replica whose journal or snapshot fails its checksum stops its node
(docs/coordinator.md, "Durability"). With the shard's other replicas
serving, the operator moves that replica's journal and snapshot aside; the
node then starts with an empty log for that shard and the leader sends it
a snapshot and the entries after it, as to a new member. The node's
directory gets a new directory id first: every shard then takes the node
for a learner (its votes and acknowledgements do not count) until it has
caught up and the shard's leader records the new id
(:mod:`raftcoord.coordinator.voters`), so the empty replica cannot help
elect a replica that lacks what it had acknowledged. The term and vote file
stays when it reads back intact; the files are renamed, never deleted, so
that the damage can be examined.
"""

from __future__ import annotations

import os
from pathlib import Path

from raftcoord.coordinator.raft_journal import JournalCorruptError, decode_meta
from raftcoord.protocol.data_dir import DirectoryRefused, renew

#: What a replica's directory holds that the repair moves aside.
REPLICA_FILES = ("journal", "snapshot")


class RepairRefused(Exception):
    """The repair would not be safe; the message says why."""


def node_running(data_dir: Path) -> int | None:
    """The pid of the node process running on ``data_dir``, or None."""
    try:
        pid = int((data_dir / "pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def set_replica_aside(data_dir: Path, shard: int, stamp: str) -> list[tuple[Path, Path]]:
    """Give ``data_dir`` a new directory id, then rename shard ``shard``'s
    journal and snapshot under it (and its term/vote file if that one is
    damaged) to ``NAME.damaged-STAMP``; the (from, to) pairs, in order.

    Raises:
        RepairRefused: the node runs, the shard has no replica here, or the
            directory's identity file is damaged.
    """
    pid = node_running(data_dir)
    if pid is not None:
        raise RepairRefused(f"the node runs on {data_dir} (pid {pid}); stop it first")
    shard_dir = data_dir / f"shard-{shard}"
    if not shard_dir.is_dir():
        raise RepairRefused(f"{shard_dir} does not exist: no replica of shard {shard} here")
    names = list(REPLICA_FILES)
    meta = shard_dir / "journal.meta"
    if meta.exists():
        try:
            decode_meta(meta.read_bytes())
        except (OSError, ValueError, JournalCorruptError):
            names.append("journal.meta")
    try:
        renew(data_dir)  # before the log goes: never an empty replica that counts
    except DirectoryRefused as exc:
        raise RepairRefused(str(exc)) from None
    moved = []
    for name in names:
        path = shard_dir / name
        if path.exists():
            target = path.with_name(f"{name}.damaged-{stamp}")
            path.rename(target)
            moved.append((path, target))
    return moved
