"""The snapshot file of a shard replica, written off the tick thread.

pysyncobj compacts its log by asking its serializer to write a snapshot and
then, once the serializer reports success, dropping the journal's entries up
to the snapshot. With ``useFork=False`` (gRPC's threads make fork unsafe)
its own serializer calls the writer on the tick thread, so the whole state
was encoded, written and fsynced while the shard neither ticked nor
answered: with some 30K open transactions per shard that outlasted the
election timeout, and since every replica compacts at about the same entry,
followers campaigned and leaders stepped down all at once.

:class:`SnapshotFile` keeps pysyncobj's serializer interface (the methods
below are the ones ``SyncObj`` calls) and splits the work:

* on the tick thread, :meth:`serialize` only calls ``capture``, which takes
  an immutable view of the state (pointer copies, see
  :meth:`fsm.TransactionStateMachine.frozen_state`) and returns the function
  that encodes it;
* a background thread encodes the view (one shard of the process at a
  time, handing the GIL back between pieces of the encoding so that the
  shard threads are not kept waiting), writes ``<snapshot>.tmp``, fsyncs
  it, renames it over ``<snapshot>`` and fsyncs the directory;
* :meth:`checkSerializing` reports SERIALIZING until then, so pysyncobj keeps
  every journal entry until the new snapshot is durable, and SUCCESS (once)
  after, when pysyncobj drops the journal prefix. A failed write is logged,
  reported FAILED and leaves the previous snapshot in place.

A crash during the write leaves the previous snapshot and the whole journal;
the partial ``.tmp`` file is removed on the next start. A crash between the
rename and the journal compaction leaves a snapshot newer than the journal's
first entry: see :meth:`raftcoord.coordinator.replica.ShardReplica` for how
the journal is trimmed to it on start instead of being cleared.

Snapshot transfer to a lagging follower is pysyncobj's, over the file:
chunks of ``chunk_bytes`` read from an open file, as many per tick as fit in
the append-entries period, none while a new snapshot is being written (a
transfer in progress then starts again from the new file, as pysyncobj's own
serializer does).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from pysyncobj.config import SERIALIZER_STATE

log = logging.getLogger("raftcoord.coordinator.snapshots")

#: (last entry, previous entry) -> the function that encodes the captured state
#: and those two entries as the file's bytes. Called on the tick thread.
Capture = Callable[[Any, Any], Callable[[], bytes]]

#: path -> (last entry, previous entry, cluster) as pysyncobj's deserializer returns.
Load = Callable[[str], tuple[Any, Any, Any]]

#: One chunk of a transfer: (data, is first, is last).
Chunk = tuple[bytes, bool, bool]

#: Every replica of a node compacts at about the same time; encoding is
#: Python work that holds the GIL, so the node's shards encode one at a time.
_ONE_AT_A_TIME = threading.Lock()


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SnapshotFile:
    """pysyncobj's serializer for one snapshot file, writing in the background."""

    def __init__(
        self, path: str, chunk_bytes: int, capture: Capture, load: Load, *, where: str
    ) -> None:
        """``where`` starts every log line (the replica's ``node=N shard=S``)."""
        self.path = path
        self._where = where
        self._writing_path = path + ".tmp"
        self._receiving_path = path + ".1.tmp"
        self._chunk_bytes = chunk_bytes
        self._capture = capture
        self._load = load
        self._writer: threading.Thread | None = None
        self._written_id: Any = None  # the id of the snapshot being written
        self._result: int | None = None  # SERIALIZER_STATE once the write ended
        self._sending: dict[Any, IO[bytes]] = {}  # node -> the file being sent
        self._receiving: IO[bytes] | None = None
        for leftover in (self._writing_path, self._receiving_path):
            if os.path.exists(leftover):
                os.remove(leftover)

    # --- log compaction ---------------------------------------------------------------

    def serialize(self, data: Any, snapshot_id: Any) -> None:
        """Start writing a snapshot of the state as it is now; ``data`` is
        pysyncobj's ``(None, last entry, previous entry, cluster)``."""
        if self._writer is not None:
            return
        encode = self._capture(data[1], data[2])
        self._written_id, self._result = snapshot_id, None
        self._writer = threading.Thread(
            target=self._write, args=(encode,), name="snapshot-writer", daemon=True
        )
        self._writer.start()

    def _write(self, encode: Callable[[], bytes]) -> None:
        result = SERIALIZER_STATE.FAILED
        start = time.monotonic()
        try:
            with _ONE_AT_A_TIME:
                content = encode()
            encoded = time.monotonic()
            with open(self._writing_path, "wb") as f:
                f.write(content)
                f.flush()
                os.fsync(f.fileno())
            os.replace(self._writing_path, self.path)
            _fsync_dir(self.path)
            result = SERIALIZER_STATE.SUCCESS
            log.info(
                "%s event=snapshot_written path=%s index=%s bytes=%d encode_ms=%.0f write_ms=%.0f",
                self._where,
                self.path,
                self._written_id,
                len(content),
                (encoded - start) * 1e3,
                (time.monotonic() - encoded) * 1e3,
            )
        except Exception:
            log.exception("%s event=snapshot_write_failed path=%s", self._where, self.path)
            if os.path.exists(self._writing_path):
                os.remove(self._writing_path)
        finally:
            self._result = result

    def checkSerializing(self) -> tuple[int, Any]:  # pysyncobj's name
        """(SERIALIZING, id) while a snapshot is written; (SUCCESS or FAILED,
        id) once when it is done; (NOT_SERIALIZING, None) otherwise."""
        writer, result = self._writer, self._result
        if writer is None:
            return SERIALIZER_STATE.NOT_SERIALIZING, None
        if result is None:
            return SERIALIZER_STATE.SERIALIZING, self._written_id
        writer.join()
        self._writer = None
        if result == SERIALIZER_STATE.SUCCESS:
            for node in list(self._sending):
                self.cancelTransmisstion(node)
        return result, self._written_id

    def wait(self) -> None:
        """Return once no snapshot is being written."""
        writer = self._writer
        if writer is not None:
            writer.join()

    def deserialize(self) -> tuple[Any, ...]:
        """pysyncobj's ``(None, last entry, previous entry, cluster)`` of the file."""
        return (None, *self._load(self.path))

    # --- transfer to a lagging follower -------------------------------------------------

    def getTransmissionData(self, node: Any) -> Chunk | None:  # pysyncobj's name
        """The next chunk of the snapshot for ``node``, None while a snapshot
        is being written (or the file cannot be opened)."""
        if self._writer is not None:
            return None
        f = self._sending.get(node)
        first = f is None
        if f is None:
            try:
                f = self._sending[node] = open(self.path, "rb")  # kept open across ticks
            except OSError:
                log.exception("%s event=snapshot_send_failed path=%s", self._where, self.path)
                return None
        try:
            data = f.read(self._chunk_bytes)
        except OSError:
            log.exception("%s event=snapshot_send_failed path=%s", self._where, self.path)
            self.cancelTransmisstion(node)
            return None
        last = not data
        if last:
            self.cancelTransmisstion(node)
        return data, first, last

    def cancelTransmisstion(self, node: Any) -> None:  # pysyncobj's name (sic)
        f = self._sending.pop(node, None)
        if f is not None:
            f.close()

    def setTransmissionData(self, chunk: Chunk | None) -> bool:  # pysyncobj's name
        """Take one chunk from the leader; True once the whole snapshot is in
        place of the file (pysyncobj then loads it)."""
        if chunk is None:
            return False
        data, first, last = chunk
        try:
            if first:
                if self._receiving is not None:
                    self._receiving.close()
                self._receiving = open(self._receiving_path, "wb")  # kept open across ticks
            elif self._receiving is None:
                return False  # a transfer this replica did not see start
            self._receiving.write(data)
            if not last:
                return False
            self._receiving.close()
            self._receiving = None
            os.replace(self._receiving_path, self.path)
        except OSError:
            # The leader sends the snapshot again from its start.
            log.exception("%s event=snapshot_receive_failed path=%s", self._where, self.path)
            self._receiving = None
            return False
        return True

    def close(self) -> None:
        """Wait for a write in progress and close the files of transfers."""
        self.wait()
        for node in list(self._sending):
            self.cancelTransmisstion(node)
        if self._receiving is not None:
            self._receiving.close()
            self._receiving = None
