"""Follower replicas: fetch from each partition's leader and keep the same log.

A node holds follower replicas of the partitions the coordinators place on
it and another node leads (:meth:`partition_log.cluster_view.ClusterView.followed`).
For each leader node one :class:`LeaderFetcher` thread asks, in one
ReplicaFetch long poll, for every partition followed there, from the
replica's log end and naming the leader epoch of its last batch (KIP-320).
The leader answers the stored batches, which the follower appends as they
are (:meth:`partition_log.partition.Partition.append_replicated`), or where
the two logs diverge, at which the follower cuts its log
(:func:`truncation_offset`, KIP-101: by leader epoch, never by high
watermark alone) and fetches again. Each fetch also tells the leader the
follower's log end, which moves the leader's high watermark.

:class:`ReplicaFetchers` starts a thread for each leader node followed and
lets it end when nothing is followed there any more. A fetcher asks through
a :class:`Link`: a connection to the leader's replication address
(:class:`ConnectionLink`, :mod:`raftcoord.protocol.cluster_link`), or, in a
config without one, a ReplicaFetch call to the leader's gRPC address
(:class:`GrpcLink`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from partition_log import codec
from partition_log.cluster_view import CALL_TIMEOUT_S, ClusterView, Followed
from partition_log.epochs import UNDEFINED_EPOCH, EpochEnd
from partition_log.log import StoreFailed
from partition_log.partition import Partition
from raftcoord.protocol.cluster_link import REPLICA_FETCH, ClusterLink, LinkError
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.v1 import partition_log_pb2

log = logging.getLogger("raftcoord.partition_log")

#: How long a leader holds a follower's fetch that finds nothing new
#: (Kafka's replica.fetch.wait.max.ms).
FETCH_WAIT_MS = 500
#: Bytes of batches per partition per fetch (Kafka's replica.fetch.max.bytes).
FETCH_MAX_BYTES = 1 << 20
#: Pause after a failed fetch before the next one (replica.fetch.backoff.ms).
BACKOFF_S = 0.5


def split_batches(data: bytes) -> list[bytes]:
    """The whole batches that ``data`` holds back to back.

    Raises:
        ValueError: ``data`` ends inside a batch, or a header is unreadable.
    """
    batches = []
    pos = 0
    while pos < len(data):
        try:
            header = codec.parse_header(data, pos)
        except codec.CorruptBatch as exc:
            raise ValueError(f"an unreadable batch header at byte {pos}: {exc}") from None
        if header.size <= 0 or pos + header.size > len(data):
            raise ValueError(f"the batch at byte {pos} runs past the answer's end")
        batches.append(data[pos : pos + header.size])
        pos += header.size
    return batches


def truncation_offset(partition: Partition, diverging: EpochEnd) -> int:
    """Where a follower cuts its log when its leader answers ``diverging``
    (the largest epoch of the leader's log at or below the follower's last,
    and where it ends there), as Kafka's fetcher decides: at the end of that
    epoch in both logs, whichever comes first; when the follower does not
    have that epoch, at the end of its own largest epoch below it (another
    round may follow); when the leader knows none of the follower's
    epochs, at the follower's high watermark."""
    end, _ = partition.follower_state()
    if diverging.end_offset < 0:
        return min(partition.high_watermark, end)
    mine = partition.epoch_end(diverging.epoch)
    if mine.epoch == UNDEFINED_EPOCH:
        return min(diverging.end_offset, end)
    if mine.epoch != diverging.epoch:
        return min(mine.end_offset, end)
    return min(diverging.end_offset, mine.end_offset, end)


class Link(Protocol):
    """How a fetcher reaches one leader node."""

    def fetch(self, request: Any, timeout_s: float) -> Any:
        """The leader's ReplicaFetchResponse to ``request``.

        Raises:
            LinkError: no answer.
        """

    def close(self) -> None: ...


class ConnectionLink:
    """Fetches over a connection of their own to the leader's replication address."""

    def __init__(self, link: ClusterLink) -> None:
        self._link = link

    def fetch(self, request: Any, timeout_s: float) -> Any:
        return self._link.call(REPLICA_FETCH, request, timeout_s)

    def close(self) -> None:
        self._link.close()


class GrpcLink:
    """A ReplicaFetch call per fetch, to the leader's gRPC address."""

    def __init__(self, stub: Callable[[], Any]) -> None:
        self._stub = stub

    def fetch(self, request: Any, timeout_s: float) -> Any:
        try:
            return self._stub().ReplicaFetch(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            raise LinkError(str(exc)) from None

    def close(self) -> None:
        pass  # the channel is the node's, shared


def _code(value: int) -> ErrorCode:
    try:
        return ErrorCode(value)
    except ValueError:  # a newer node's code
        return ErrorCode.UNKNOWN_SERVER_ERROR


class LeaderFetcher(threading.Thread):
    """Fetches every partition this node follows on one leader node."""

    def __init__(
        self,
        leader: int,
        node_id: int,
        view: ClusterView,
        link: Link,
        follower: Callable[[Followed], Partition | None],
        stopping: threading.Event,
    ) -> None:
        super().__init__(name=f"replica-fetcher-{leader}", daemon=True)
        self.leader = leader
        self.node_id = node_id
        self._view = view
        self._link = link
        self._follower = follower
        self._stopping = stopping
        #: Set when nothing is followed on the leader any more (the thread ends).
        self.done = False

    def run(self) -> None:
        try:
            self._fetch_while_followed()
        finally:
            self._link.close()

    def _fetch_while_followed(self) -> None:
        while not self._stopping.is_set():
            followed = [f for f in self._view.followed() if f.leader == self.leader]
            if not followed:
                self.done = True
                return
            try:
                ok = self.fetch_once(followed)
            except Exception:  # the thread must live: the next round tries again
                log.exception(
                    "node=%d event=replica_fetch_failed leader=%d", self.node_id, self.leader
                )
                ok = False
            if not ok:
                self._stopping.wait(BACKOFF_S)

    def fetch_once(self, followed: list[Followed]) -> bool:
        """One ReplicaFetch for ``followed``; False when the next should wait."""
        replicas: list[tuple[Followed, Partition]] = []
        for f in followed:
            partition = self._follower(f)
            # A placement older than this replica's own epoch is not followed
            # (a newer one comes with the next metadata refresh).
            if partition is not None and partition.follow(f.leader_epoch):
                replicas.append((f, partition))
        if not replicas:
            return False
        request = partition_log_pb2.ReplicaFetchRequest(
            replica_id=self.node_id,
            max_wait_ms=FETCH_WAIT_MS,
            partition_max_bytes=FETCH_MAX_BYTES,
        )
        asked: list[tuple[int, int]] = []
        for f, partition in replicas:
            end, last_epoch = partition.follower_state()
            asked.append((end, last_epoch))
            request.partitions.add(
                topic=f.topic,
                partition=f.partition,
                current_leader_epoch=f.leader_epoch,
                fetch_offset=end,
                last_fetched_epoch=last_epoch,
            )
        try:
            answer = self._link.fetch(request, FETCH_WAIT_MS / 1000 + CALL_TIMEOUT_S)
        except LinkError as exc:
            log.debug(
                "node=%d event=replica_fetch_unanswered leader=%d %s",
                self.node_id,
                self.leader,
                exc,
            )
            return False
        if answer.error_code != ErrorCode.NONE:
            log.warning(
                "node=%d event=replica_fetch_refused leader=%d error=%s %s",
                self.node_id,
                self.leader,
                _code(answer.error_code).name,
                answer.error_message,
            )
            return False
        healthy = True
        for (f, partition), state, result in zip(replicas, asked, answer.partitions, strict=False):
            healthy = self._apply(f, partition, state, result) and healthy
        return healthy

    def _apply(
        self, f: Followed, partition: Partition, asked: tuple[int, int], result: Any
    ) -> bool:
        """Take one partition's answer to a fetch that asked from ``asked``
        (log end, last epoch), unless the replica changed since: another
        fetcher (of a newer leader, or of the old one still answering) may
        have appended, cut or re-led it meanwhile, and an answer for another
        log end would leave a gap or a foreign batch in it (Kafka's fetcher
        checks the same). False when it was an error. The lock is held only
        while the answer is applied; the metadata refresh an error asks for
        comes after."""
        with partition.lock:
            if not partition.follows_from(f.leader_epoch, *asked):
                log.debug(
                    "node=%d event=replica_answer_dropped partition=%s-%d leader=%d: the "
                    "replica changed while the fetch was out",
                    self.node_id,
                    f.topic,
                    f.partition,
                    f.leader,
                )
                return True
            applied = self._apply_current(f, partition, result)
        if applied is not None:
            return applied
        code = _code(result.error_code)
        if code in (
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            ErrorCode.FENCED_LEADER_EPOCH,
            ErrorCode.UNKNOWN_LEADER_EPOCH,
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ):
            self._view.refresh(wanted=f.topic)
        log.info(
            "node=%d event=replica_fetch_error partition=%s-%d leader=%d error=%s %s",
            self.node_id,
            f.topic,
            f.partition,
            f.leader,
            code.name,
            result.error_message,
        )
        return False

    def _apply_current(self, f: Followed, partition: Partition, result: Any) -> bool | None:
        """Apply an answer to the replica (the caller holds its lock): True
        when applied, False when applying failed, None when the answer is an
        error that changes nothing here."""
        code = _code(result.error_code)
        try:
            if code is ErrorCode.NONE and result.HasField("diverging_epoch"):
                diverging = EpochEnd(
                    result.diverging_epoch.epoch, result.diverging_epoch.end_offset
                )
                offset = truncation_offset(partition, diverging)
                before, _ = partition.follower_state()
                partition.truncate_to(offset)
                log.warning(
                    "node=%d event=replica_truncated partition=%s-%d from=%d to=%d "
                    "leader=%d diverging_epoch=%d diverging_end=%d",
                    self.node_id,
                    f.topic,
                    f.partition,
                    before,
                    partition.log_end(),
                    f.leader,
                    diverging.epoch,
                    diverging.end_offset,
                )
                return True
            if code is ErrorCode.NONE:
                if result.records:
                    partition.append_replicated(split_batches(result.records))
                partition.set_follower_high_watermark(result.high_watermark)
                return True
            if code is ErrorCode.OFFSET_OUT_OF_RANGE:
                end, _ = partition.follower_state()
                if end < result.log_start_offset:
                    partition.restart_at(result.log_start_offset)
                    log.warning(
                        "node=%d event=replica_restarted partition=%s-%d from=%d at=%d: the "
                        "leader's log starts past this replica's end",
                        self.node_id,
                        f.topic,
                        f.partition,
                        end,
                        result.log_start_offset,
                    )
                    return True
        except (ValueError, OSError, StoreFailed) as exc:
            log.error(
                "node=%d event=replica_append_failed partition=%s-%d leader=%d error=%r",
                self.node_id,
                f.topic,
                f.partition,
                f.leader,
                exc,
            )
            return False
        return None


class ReplicaFetchers:
    """One :class:`LeaderFetcher` per leader node this node follows partitions on."""

    def __init__(
        self,
        node_id: int,
        view: ClusterView,
        link_for: Callable[[int], Link],
        follower: Callable[[Followed], Partition | None],
    ) -> None:
        self._node_id = node_id
        self._view = view
        self._link_for = link_for
        self._follower = follower
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._fetchers: dict[int, LeaderFetcher] = {}

    def sync(self) -> None:
        """Start a fetcher for each leader followed that has none running."""
        leaders = {f.leader for f in self._view.followed()}
        with self._lock:
            if self._stopping.is_set():
                return
            for leader in leaders:
                running = self._fetchers.get(leader)
                if running is not None and running.is_alive() and not running.done:
                    continue
                fetcher = LeaderFetcher(
                    leader,
                    self._node_id,
                    self._view,
                    self._link_for(leader),
                    self._follower,
                    self._stopping,
                )
                self._fetchers[leader] = fetcher
                fetcher.start()

    def stop(self, timeout_s: float) -> None:
        self._stopping.set()
        with self._lock:
            fetchers = list(self._fetchers.values())
        for fetcher in fetchers:
            fetcher.join(timeout_s)
