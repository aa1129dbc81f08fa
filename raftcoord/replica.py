"""One shard's Raft replica: pysyncobj as log and transport, fsm/ as the state.

pysyncobj carries opaque msgpack entries; :meth:`ShardReplica.apply_entry`
is the single replicated entry point and hands each entry to
:meth:`fsm.TransactionStateMachine.apply_entry`. Snapshots (pysyncobj's log
compaction and the transfer to a lagging follower) are the state machine's
msgpack snapshot plus the two boundary log entries, written by our own
serializer, never a pickle of Python objects.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
from pysyncobj import SyncObj, SyncObjConf, replicated

from fsm import Outcome, TransactionStateMachine

SNAPSHOT_FILE_VERSION = 1

log = logging.getLogger("raftcoord.replica")

#: Called on every replica after an entry is applied: (index, term, outcomes).
AppliedListener = Callable[[int, int, list[Outcome]], None]


class EntryNotApplied(Exception):
    """A committed entry could not be applied (or its effects not recorded).

    The state machine's ``apply_entry`` is total, so this is a bug or a
    broken host (a full disk under the applied-transitions log). pysyncobj
    would apply the same entry again on the next tick, forever, and a
    partly recorded entry twice; the replica must stop instead.
    """

    def __init__(self, index: int) -> None:
        super().__init__(f"committed entry {index} could not be applied")
        self.index = index


class ShardReplica(SyncObj):  # type: ignore[misc]
    """A pysyncobj object whose whole state is one :class:`TransactionStateMachine`.

    ``lock`` guards ``machine``: the tick thread applies entries under it and
    readers on other threads take it too.
    """

    def __init__(
        self,
        self_address: str,
        partner_addresses: list[str],
        conf: SyncObjConf,
        machine: TransactionStateMachine,
        on_applied: AppliedListener,
    ) -> None:
        # Attributes set before SyncObj.__init__ are treated by pysyncobj as
        # its own and never serialized; our serializer writes the machine.
        self.machine = machine
        self._address = self_address
        self.lock = threading.RLock()
        self._on_applied = on_applied
        conf.serializer = self._write_snapshot
        conf.deserializer = self._read_snapshot
        super().__init__(self_address, partner_addresses, conf)

    def propose(self, term: int, entry: bytes, callback: Callable[[Any, Any], None]) -> None:
        """Propose ``entry``; ``callback(outcomes, FAIL_REASON)`` runs once it
        is applied (or dropped). pysyncobj calls it before it counts the entry
        as applied, so an exception escaping it would make the entry apply
        again: it is logged and swallowed here."""

        def guarded(result: Any, error: Any) -> None:
            try:
                callback(result, error)
            except Exception:
                log.exception("replica=%s event=apply_callback_failed term=%d", self._address, term)

        self.apply_entry(term, entry, callback=guarded)

    @replicated  # type: ignore[misc]
    def apply_entry(self, term: int, entry: bytes) -> list[Outcome]:
        """The replicated entry point: apply one msgpack entry of commands.

        ``term`` is the proposing leader's term, recorded with the entry's
        transitions. Runs on the tick thread of every replica.
        """
        index = self.raftLastApplied + 1
        try:
            with self.lock:
                outcomes = self.machine.apply_entry(entry)
            self._on_applied(index, term, outcomes)
        except Exception as exc:
            raise EntryNotApplied(index) from exc
        return outcomes

    def _write_snapshot(self, path: str, raft_data: Any) -> None:
        last, previous, _cluster = raft_data
        with self.lock:
            state = self.machine.snapshot()
        payload = {
            "v": SNAPSHOT_FILE_VERSION,
            "fsm": state,
            "last": [bytes(last[0]), last[1], last[2]],
            "previous": [bytes(previous[0]), previous[1], previous[2]],
        }
        with open(path, "wb") as f:
            f.write(msgpack.packb(payload, use_bin_type=True))
            f.flush()
            os.fsync(f.fileno())

    def _read_snapshot(self, path: str) -> tuple[Any, Any, list[Any]]:
        payload = msgpack.unpackb(Path(path).read_bytes(), raw=False)
        if payload.get("v") != SNAPSHOT_FILE_VERSION:
            raise ValueError(f"{path}: unknown snapshot file version {payload.get('v')!r}")
        restored = TransactionStateMachine.restore(payload["fsm"], self.machine.config)
        with self.lock:
            self.machine = restored
        last, previous = payload["last"], payload["previous"]
        return (last[0], last[1], last[2]), (previous[0], previous[1], previous[2]), []
