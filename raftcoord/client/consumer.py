"""The consumer: reads assigned partitions from their partition-log nodes and
commits offsets to its group's coordinator.

There is no group membership protocol: partitions are assigned by the
application (``assign``), as with Kafka's ``assign()``. A partition's
first position is the group's committed offset when there is one, else
``auto_offset_reset`` (earliest, latest, or none: raise). Under ``read_committed`` the
partition-log node filters out aborted and still-open transactional
records; the consumer continues from ``next_fetch_offset``, which may skip
control and aborted records.

Not thread-safe (as Kafka's consumer): use it from one thread.

This file is over 500 lines because it is one class, Kafka's consumer API;
the protocol messages it shares with the producer are in :mod:`._wire`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc

from raftcoord.client._net import (
    ATTEMPT_TIMEOUT_S,
    JITTER,
    CallThreads,
    CoordinatorClient,
    Deadline,
    MetadataCache,
    client_channels,
    transport_error,
)
from raftcoord.client._wire import first_error, offset_topics, topic_partitions
from raftcoord.client.errors import (
    IllegalStateError,
    KafkaError,
    KafkaTimeoutError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    error_for,
)
from raftcoord.client.records import ConsumerRecord, TopicPartition
from raftcoord.protocol.backoff import Backoff
from raftcoord.protocol.channels import ChannelCache
from raftcoord.protocol.errors import STALE_METADATA, ErrorCode
from raftcoord.protocol.limits import MAX_FETCH_WAIT_MS, id_error
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2, partition_log_pb2

__all__ = ["Consumer"]

log = logging.getLogger("raftcoord.client.consumer")

_ISOLATION = {
    "read_committed": common_pb2.READ_COMMITTED,
    "read_uncommitted": common_pb2.READ_UNCOMMITTED,
}
_RESET = {
    "earliest": partition_log_pb2.OFFSET_SPEC_EARLIEST,
    "latest": partition_log_pb2.OFFSET_SPEC_LATEST,
}
#: A Fetch or ListOffsets attempt gets at least this long, even in poll(0).
_MIN_ATTEMPT_S = 1.0
#: Threads a consumer makes a poll's Fetch calls on (one per node at once,
#: typically); more calls at once than that go out as futures.
FETCH_CALL_THREADS = 8


class Consumer:
    """Reads records from assigned partitions.

    Args:
        bootstrap: coordinator gRPC addresses: a list of "host:port", or one
            comma-separated string.
        group_id: the consumer group whose offsets ``committed``/``commit`` use
            and from which positions start; None for none. At most
            ``raftcoord.protocol.limits.MAX_ID_BYTES`` bytes of UTF-8.
        isolation_level: "read_committed" (only committed transactional
            records) or "read_uncommitted" (Kafka's default).
        auto_offset_reset: where a partition without a committed offset, or whose
            position fell out of the log (retention deleted it), starts:
            "earliest", "latest" (under read_committed: the last stable offset),
            or "none": raise NoOffsetForPartitionError / OffsetOutOfRangeError.
        request_timeout_ms: deadline of one operation (all its retries).
        max_partition_fetch_bytes, fetch_max_bytes: soft limits of one Fetch.
        fetch_max_wait_ms, fetch_min_bytes: a Fetch waits on the node (a long
            poll, not a loop of requests) until ``fetch_min_bytes`` of records
            are there or ``fetch_max_wait_ms`` passed (never longer than what
            is left of the poll's timeout), as Kafka's fetch.max.wait.ms
            (0..30000) and fetch.min.bytes.
        retry_backoff_ms, retry_backoff_max_ms: backoff between retries.
        channels: where gRPC stubs come from (one channel per address by
            default); tests pass one whose stubs inject faults.
        ssl_cafile, ssl_certfile, ssl_keyfile: a cluster with TLS (its
            config's ``[tls]``): the cluster CA's certificate, and this
            client's certificate and key (PEM files; the principal is the
            certificate's ``User:<CN>``). Without them the client speaks
            plaintext.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        group_id: str | None = None,
        isolation_level: str = "read_uncommitted",
        auto_offset_reset: str = "earliest",
        request_timeout_ms: int = 30_000,
        max_partition_fetch_bytes: int = 1 << 20,
        fetch_max_bytes: int = 50 << 20,
        fetch_max_wait_ms: int = 500,
        fetch_min_bytes: int = 1,
        retry_backoff_ms: int = 20,
        retry_backoff_max_ms: int = 1_000,
        channels: ChannelCache | None = None,
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
    ) -> None:
        if isolation_level not in _ISOLATION:
            raise ValueError(f"isolation_level must be one of {sorted(_ISOLATION)}")
        if auto_offset_reset not in (*_RESET, "none"):
            raise ValueError(f"auto_offset_reset must be one of {sorted(_RESET)} or 'none'")
        if group_id is not None and (problem := id_error("group_id", group_id)) is not None:
            raise ValueError(problem)
        if not 0 <= fetch_max_wait_ms <= MAX_FETCH_WAIT_MS:
            raise ValueError(f"fetch_max_wait_ms must be in 0..{MAX_FETCH_WAIT_MS}")
        if fetch_min_bytes < 0:
            raise ValueError("fetch_min_bytes must be >= 0")
        self.group_id = group_id
        self.isolation_level = isolation_level
        self.auto_offset_reset = auto_offset_reset
        self._isolation = _ISOLATION[isolation_level]
        self._request_timeout_s = request_timeout_ms / 1000
        self._partition_max_bytes = max_partition_fetch_bytes
        self._fetch_max_bytes = fetch_max_bytes
        self._fetch_max_wait_s = fetch_max_wait_ms / 1000
        self._fetch_min_bytes = fetch_min_bytes
        backoff = (retry_backoff_ms / 1000, max(retry_backoff_ms, retry_backoff_max_ms) / 1000)
        self._channels = channels or client_channels(ssl_cafile, ssl_certfile, ssl_keyfile)
        self._coordinators = CoordinatorClient(bootstrap, self._channels, *backoff)
        self._metadata = MetadataCache(self._coordinators)
        #: Where the Fetch calls of a poll are made (one per node at once).
        self._calls = CallThreads(FETCH_CALL_THREADS, f"raftcoord-consumer-io-{id(self):x}")
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        #: Partitions to start from ``auto_offset_reset`` without asking the group.
        self._reset_by_policy: set[TopicPartition] = set()
        #: A partition's error held back because other partitions returned
        #: records in the same poll: (partition, its position, the error).
        self._held_error: tuple[TopicPartition, int, KafkaError] | None = None
        #: Since when (monotonic s) polls failed to learn starting positions.
        self._unresolved_since: float | None = None
        self._closed = False

    # --- context manager -----------------------------------------------------------

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections. Closing twice is a no-op."""
        if not self._closed:
            self._closed = True
            self._calls.close()
            self._channels.close()

    # --- assignment and positions --------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly ``partitions`` from now on (replacing the previous
        assignment; positions of partitions still assigned are kept)."""
        self._check_open()
        assignment = list(dict.fromkeys(TopicPartition(*tp) for tp in partitions))
        self._assignment = assignment
        kept = set(assignment)
        self._positions = {tp: p for tp, p in self._positions.items() if tp in kept}
        self._reset_by_policy &= kept

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Read ``partition`` from ``offset`` on the next poll.

        Raises:
            IllegalStateError: the partition is not assigned.
        """
        tp = self._assigned(partition)
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        self._positions[tp] = offset
        self._reset_by_policy.discard(tp)

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] = ()) -> None:
        """Read from the earliest offset (all assigned partitions when none given)."""
        self._seek_to(partitions, partition_log_pb2.OFFSET_SPEC_EARLIEST)

    def seek_to_end(self, partitions: Iterable[TopicPartition] = ()) -> None:
        """Read from the end (the last stable offset under read_committed)."""
        self._seek_to(partitions, partition_log_pb2.OFFSET_SPEC_LATEST)

    def _seek_to(self, partitions: Iterable[TopicPartition], spec: int) -> None:
        tps = [self._assigned(tp) for tp in partitions] or list(self._assignment)
        offsets = self._list_offsets(tps, spec, Deadline(self._request_timeout_s, "seek"))
        for tp, offset in offsets.items():
            self._positions[tp] = offset
            self._reset_by_policy.discard(tp)

    def position(self, partition: TopicPartition, timeout_ms: int | None = None) -> int:
        """The offset the next poll reads ``partition`` from (resolving it from
        the committed offset or ``auto_offset_reset`` when not known yet).

        Raises:
            IllegalStateError: the partition is not assigned.
            KafkaTimeoutError: the position could not be resolved in time.
        """
        tp = self._assigned(partition)
        if tp not in self._positions:
            deadline = Deadline(self._timeout_s(timeout_ms), "position")
            self._resolve_positions([tp], deadline)
        return self._positions[tp]

    def _assigned(self, partition: TopicPartition) -> TopicPartition:
        self._check_open()
        tp = TopicPartition(*partition)
        if tp not in self._assignment:
            raise IllegalStateError(f"partition {tp} is not assigned to this consumer")
        return tp

    def _resolve_positions(self, tps: list[TopicPartition], deadline: Deadline) -> None:
        missing = [tp for tp in tps if tp not in self._positions]
        if not missing:
            return
        from_group = [tp for tp in missing if tp not in self._reset_by_policy]
        if self.group_id is not None and from_group:
            committed = self._fetch_committed(from_group, deadline)
            for tp, offset in committed.items():
                if offset is not None:
                    self._positions[tp] = offset
        rest = [tp for tp in missing if tp not in self._positions]
        if rest and self.auto_offset_reset == "none":
            raise NoOffsetForPartitionError(
                f"no committed offset for {', '.join(map(str, rest))} and auto_offset_reset "
                "is 'none': seek first"
            )
        if rest:
            offsets = self._list_offsets(rest, _RESET[self.auto_offset_reset], deadline)
            for tp, offset in offsets.items():
                self._positions[tp] = offset
                self._reset_by_policy.discard(tp)

    # --- reading -------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0) -> list[ConsumerRecord]:
        """Records from the assigned partitions, waiting up to ``timeout_ms`` for
        some to arrive. Records of one partition come in offset order; each
        partition's position moves past what was returned.

        Raises:
            KafkaError: a partition answered an error that is not retriable
                (as Kafka's consumer: when other partitions returned records
                in the same fetch, those are returned first and the error is
                raised by the next poll, unless the partition was sought
                elsewhere meanwhile).
            UnknownTopicOrPartitionError: the metadata says an assigned
                partition does not exist (the message names it).
            KafkaTimeoutError: the assigned partitions' starting positions
                could not be learned (no coordinator or partition-log node
                answered) for ``request_timeout_ms``, over one or more polls.
        """
        self._check_open()
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms must be >= 0, got {timeout_ms}")
        held, self._held_error = self._held_error, None
        if held is not None and self._positions.get(held[0]) == held[1]:
            raise held[2]
        deadline = Deadline(timeout_ms / 1000, "poll")
        backoff = Backoff(0.01, 0.1, jitter=JITTER)
        while True:
            # Metadata a node said is stale (a partition moved, its leader
            # epoch changed) is refreshed before the next fetch, not only
            # after one: with partitions on several nodes, a fetch that parks
            # on one of them takes the whole poll.
            self._metadata.maybe_refresh(deadline)
            # Even poll(0) gets a real chance to learn where to start.
            resolving = Deadline(max(_MIN_ATTEMPT_S, deadline.remaining()), "positions")
            try:
                self._resolve_positions(list(self._assignment), resolving)
            except KafkaTimeoutError as exc:
                self._positions_failing(exc)
            else:
                self._unresolved_since = None
            records = self._fetch_once(deadline)
            if records or deadline.expired():
                return records
            backoff.sleep(deadline)

    def _positions_failing(self, error: KafkaTimeoutError) -> None:
        """Starting positions could not be learned in this poll: raise once that
        has lasted ``request_timeout_ms``, rather than return nothing forever."""
        now = time.monotonic()
        if self._unresolved_since is None:
            self._unresolved_since = now
        log.debug("positions not resolved yet: %s", error)
        if now - self._unresolved_since >= self._request_timeout_s:
            self._unresolved_since = None
            raise KafkaTimeoutError(
                f"the starting positions of the assigned partitions were not learned in "
                f"request_timeout_ms={self._request_timeout_s * 1000:.0f}: {error}"
            ) from error

    def _fetch_once(self, deadline: Deadline) -> list[ConsumerRecord]:
        by_node: dict[str, list[TopicPartition]] = {}
        for tp in self._assignment:
            if tp not in self._positions:
                continue
            address = self._metadata.leader(tp)
            if address is None:
                continue
            by_node.setdefault(address, []).append(tp)
        if not by_node:
            self._metadata.maybe_refresh(deadline)
            return []
        calls = []
        # The node may hold the Fetch for up to max_wait_ms: the gRPC deadline
        # leaves the read itself its usual time on top of that.
        wait_s = min(self._fetch_max_wait_s, deadline.remaining())
        timeout = wait_s + max(_MIN_ATTEMPT_S, min(self._request_timeout_s, deadline.remaining()))
        for address, tps in by_node.items():
            request = partition_log_pb2.FetchRequest(
                isolation_level=self._isolation,
                max_bytes=self._fetch_max_bytes,
                max_wait_ms=int(wait_s * 1000),
                min_bytes=self._fetch_min_bytes,
                partitions=[
                    partition_log_pb2.FetchPartition(
                        topic=tp.topic,
                        partition=tp.partition,
                        fetch_offset=self._positions[tp],
                        partition_max_bytes=self._partition_max_bytes,
                        current_leader_epoch=self._metadata.leader_epoch(tp),
                    )
                    for tp in tps
                ],
            )
            stub = self._channels.partition_log(address)
            calls.append((address, self._calls.start(stub.Fetch, request, timeout)))
        records: list[ConsumerRecord] = []
        failed: tuple[TopicPartition, KafkaError] | None = None
        for address, call in calls:
            try:
                response = call.result()
            except grpc.RpcError as exc:
                log.debug("fetch failed: %s", transport_error(exc, address))
                self._metadata.request_update()
                continue
            for answer in response.partitions:
                try:
                    records.extend(self._fetched(answer))
                except KafkaError as exc:  # the other partitions' records still count
                    failed = failed or (TopicPartition(answer.topic, answer.partition), exc)
        if failed is not None:
            tp, error = failed
            if not records:
                raise error
            self._held_error = (tp, self._positions[tp], error)
        return records

    def _fetched(self, answer: Any) -> list[ConsumerRecord]:
        tp = TopicPartition(answer.topic, answer.partition)
        position = self._positions.get(tp)
        if position is None:
            return []
        if answer.error_code in STALE_METADATA:
            self._metadata.request_update()
            return []
        if answer.error_code == ErrorCode.OFFSET_OUT_OF_RANGE and self.auto_offset_reset == "none":
            raise OffsetOutOfRangeError(
                f"{tp}: offset {position} is outside the log "
                f"[{answer.log_start_offset}, {answer.high_watermark}]"
            )
        if answer.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
            log.info(
                "%s: offset %d out of range, reset to %s", tp, position, self.auto_offset_reset
            )
            del self._positions[tp]
            self._reset_by_policy.add(tp)
            return []
        if answer.error_code != ErrorCode.NONE:
            error = error_for(answer.error_code, answer.error_message)
            if error.retriable:
                return []
            raise error
        records = [
            ConsumerRecord(
                topic=tp.topic,
                partition=tp.partition,
                offset=r.offset,
                key=r.key if r.HasField("key") else None,
                value=r.value if r.HasField("value") else None,
                headers=[(h.key, h.value) for h in r.headers],
                timestamp_ms=r.timestamp_ms,
            )
            for r in answer.records
            if r.offset >= position
        ]
        records.sort(key=lambda r: r.offset)
        next_offset = int(answer.next_fetch_offset)
        if records:
            next_offset = max(next_offset, records[-1].offset + 1)
        if next_offset > position:
            self._positions[tp] = next_offset
        return records

    # --- offsets -------------------------------------------------------------------

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        """The first offset still in each partition's log."""
        tps = [TopicPartition(*tp) for tp in partitions]
        deadline = Deadline(self._timeout_s(timeout_ms), "beginning_offsets")
        return self._list_offsets(tps, partition_log_pb2.OFFSET_SPEC_EARLIEST, deadline)

    def end_offsets(
        self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        """The end of each partition: the high watermark, or under read_committed
        the last stable offset (as Kafka's consumer)."""
        tps = [TopicPartition(*tp) for tp in partitions]
        deadline = Deadline(self._timeout_s(timeout_ms), "end_offsets")
        return self._list_offsets(tps, partition_log_pb2.OFFSET_SPEC_LATEST, deadline)

    def _list_offsets(
        self, tps: list[TopicPartition], spec: int, deadline: Deadline
    ) -> dict[TopicPartition, int]:
        self._check_open()
        found: dict[TopicPartition, int] = {}
        pending = list(dict.fromkeys(tps))
        backoff = Backoff(*self._coordinators_backoff(), jitter=JITTER)
        last: KafkaError | None = None
        while pending:
            by_node: dict[str, list[TopicPartition]] = {}
            for tp in pending:
                address = self._metadata.leader(tp)
                if address is None:
                    self._metadata.check_exists(tp, deadline)
                    address = self._metadata.leader(tp)
                if address is not None:
                    by_node.setdefault(address, []).append(tp)
            for address, node_tps in by_node.items():
                request = partition_log_pb2.ListOffsetsRequest(
                    isolation_level=self._isolation,
                    partitions=[
                        partition_log_pb2.ListOffsetsPartition(
                            topic=tp.topic,
                            partition=tp.partition,
                            spec=spec,  # type: ignore[arg-type]
                            current_leader_epoch=self._metadata.leader_epoch(tp),
                        )
                        for tp in node_tps
                    ],
                )
                try:
                    response = self._channels.partition_log(address).ListOffsets(
                        request, timeout=deadline.attempt(ATTEMPT_TIMEOUT_S)
                    )
                except grpc.RpcError as exc:
                    last = transport_error(exc, address)
                    self._metadata.request_update()
                    continue
                for answer in response.partitions:
                    tp = TopicPartition(answer.topic, answer.partition)
                    if answer.error_code == ErrorCode.NONE:
                        found[tp] = int(answer.offset)
                        continue
                    error = error_for(answer.error_code, answer.error_message)
                    if not error.retriable:
                        raise error
                    last = error
                    if answer.error_code in STALE_METADATA:
                        self._metadata.request_update()
            pending = [tp for tp in pending if tp not in found]
            if pending:
                deadline.back_off(backoff, last)
                self._metadata.maybe_refresh(deadline)
        return {tp: found[tp] for tp in dict.fromkeys(tps)}

    def committed(self, partition: TopicPartition, timeout_ms: int | None = None) -> int | None:
        """The group's committed offset of ``partition`` (the next offset to
        consume), or None when none is committed. A transactional commit still
        pending for the partition is waited out.

        Raises:
            IllegalStateError: the consumer has no group_id.
            KafkaTimeoutError: no stable answer in time.
        """
        tp = TopicPartition(*partition)
        deadline = Deadline(self._timeout_s(timeout_ms), "committed")
        return self._fetch_committed([tp], deadline)[tp]

    def _fetch_committed(
        self, tps: list[TopicPartition], deadline: Deadline
    ) -> dict[TopicPartition, int | None]:
        group_id = self._group()
        request = coordinator_pb2.OffsetFetchRequest(
            group_id=group_id, topics=topic_partitions(tps), require_stable=True
        )
        backoff = Backoff(*self._coordinators_backoff(), jitter=JITTER)
        while True:
            answer = self._coordinators.call(
                coordinator_pb2.GROUP, group_id, "OffsetFetch", request, deadline
            )
            if answer.error_code != ErrorCode.NONE:
                raise error_for(answer.error_code, answer.error_message)
            result: dict[TopicPartition, int | None] = {tp: None for tp in tps}
            unstable: KafkaError | None = None
            for p in answer.partitions:
                tp = TopicPartition(p.topic, p.partition)
                if p.error_code == ErrorCode.UNSTABLE_OFFSET_COMMIT:
                    unstable = error_for(p.error_code, f"{tp}: a transactional commit is pending")
                elif p.error_code != ErrorCode.NONE:
                    raise error_for(p.error_code, f"{tp}")
                elif tp in result:
                    result[tp] = int(p.offset) if p.offset >= 0 else None
            if unstable is None:
                return result
            deadline.back_off(backoff, unstable)

    def commit(
        self, offsets: Mapping[TopicPartition, int] | None = None, timeout_ms: int | None = None
    ) -> None:
        """Commit offsets for the group (outside any transaction), visible at once.

        Args:
            offsets: partition -> next offset to consume; None commits the
                current position of every assigned partition that has one.

        Raises:
            IllegalStateError: the consumer has no group_id.
            KafkaTimeoutError: not committed in time.
            KafkaError: the coordinator refused.
        """
        group_id = self._group()
        if offsets is None:
            offsets = {tp: self._positions[tp] for tp in self._assignment if tp in self._positions}
        topics = offset_topics(offsets)
        if not topics:
            return
        request = coordinator_pb2.OffsetCommitRequest(
            group_id=group_id, generation_id=-1, member_id="", topics=topics
        )
        answer = self._coordinators.call(
            coordinator_pb2.GROUP,
            group_id,
            "OffsetCommit",
            request,
            Deadline(self._timeout_s(timeout_ms), "commit"),
        )
        code, message = first_error(answer)
        if code != ErrorCode.NONE:
            raise error_for(code, message)

    # --- helpers -------------------------------------------------------------------

    def _group(self) -> str:
        self._check_open()
        if self.group_id is None:
            raise IllegalStateError("the consumer has no group_id")
        return self.group_id

    def _timeout_s(self, timeout_ms: int | None) -> float:
        return self._request_timeout_s if timeout_ms is None else timeout_ms / 1000

    def _coordinators_backoff(self) -> tuple[float, float]:
        return self._coordinators.backoff_initial_s, self._coordinators.backoff_max_s

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("the consumer is closed")
