"""Which data directory each member of a shard's Raft group votes from.

KIP-853's idea, for the coordinators' shards. A member is a coordinator's
Raft address for the shard; the shard's log records, for every member, the
data directory id it votes and acknowledges from (a *voters record*, an
entry of its own kind, :data:`VOTERS_ENTRY`). A vote, a vote request or an
AppendEntries acknowledgement counts only when it comes from the recorded
directory of its member. A coordinator whose data directory was emptied
comes back with a new directory id and none of its old log: it is then a
*learner* of every shard, not a voter. It receives the log like any
follower, but its votes and acknowledgements do not count, it does not vote,
and it does not campaign; so it cannot elect a stale replica (the vote it
gave before it lost its directory is forgotten with it) nor help commit
what it does not hold. Once it has caught up (it acknowledges the leader's
commit index), the leader records the new directory in a new voters record:
it is a voter again.

Which record is in force
------------------------
The latest voters record in the member's log, committed or not (Raft's rule
for configuration entries), else the one of the snapshot the log starts
from, else none: until the first record, every member counts, whatever its
directory (a new cluster's members have not told each other yet). The
leader of a shard proposes the first record once it has heard from every
member (their directory ids come with their messages), and a new one only
when the previous one is committed, one change at a time.

Changing a member's directory in one step is safe because its old
directory no longer exists: only one process runs at a member's address,
and it reports the directory it holds. Quorums of the old record that
include the old directory cannot form any more; every other quorum of the
old record intersects every quorum of the new one (they differ in one
member only).

A record names exactly the members of the cluster config and is applied
whole; an entry that is not one (a damaged or foreign entry) is ignored on
every replica alike, so applying a record never raises.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgpack

from raftcoord.protocol.limits import is_directory_id

__all__ = ["VOTERS_ENTRY", "Record", "counts", "decode_record", "encode_record", "proposal"]

#: The byte after pysyncobj's command type that marks a voters record.
VOTERS_ENTRY: Final = b"V"

#: Raft address -> data directory id.
Record = dict[str, str]


def encode_record(record: Mapping[str, str]) -> bytes:
    """A record's bytes (the entry's data after :data:`VOTERS_ENTRY`)."""
    return bytes(msgpack.packb(sorted(record.items()), use_bin_type=True))


def decode_record(data: bytes, members: Iterable[str]) -> Record | None:
    """The record ``data`` encodes, or None when it is not one naming every
    member of ``members`` (and nothing else) with a directory id."""
    try:
        pairs: Any = msgpack.unpackb(data, raw=False, max_str_len=256, max_array_len=1024)
    except Exception:  # msgpack raises many types on bad input
        return None
    if type(pairs) is not list:
        return None
    record: Record = {}
    for pair in pairs:
        if type(pair) is not list or len(pair) != 2:
            return None
        address, directory = pair
        if type(address) is not str or type(directory) is not str:
            return None
        if not is_directory_id(directory) or address in record:
            return None
        record[address] = directory
    return record if set(record) == set(members) else None


def counts(record: Mapping[str, str] | None, address: str, directory: str) -> bool:
    """Whether a vote or acknowledgement of the member at ``address`` from
    ``directory`` counts under ``record`` (no record: every one counts)."""
    return record is None or record.get(address) == directory


def proposal(
    record: Mapping[str, str] | None,
    members: Iterable[str],
    heard: Mapping[str, str],
    caught_up: Iterable[str],
) -> Record | None:
    """The voters record a leader should propose now, or None.

    ``heard`` is the directory each member (the leader included) last
    reported; ``caught_up`` the members whose log reaches the leader's
    commit index. With no record yet, the first one once every member has
    reported a directory; else the record with the new directory of each
    member that reports one other than recorded and has caught up.
    """
    names = list(members)
    if record is None:
        if all(is_directory_id(heard.get(name, "")) for name in names):
            return {name: heard[name] for name in names}
        return None
    ready = set(caught_up)
    changed = {
        name: heard[name]
        for name in names
        if name in ready
        and is_directory_id(heard.get(name, ""))
        and record.get(name) != heard[name]
    }
    return {**record, **changed} if changed else None
