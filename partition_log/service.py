"""The PartitionLog gRPC service: Produce, Fetch, ListOffsets, WriteTxnMarkers,
DescribeProducers.

Every request is validated before anything is appended; a bad partition
entry gets an error code and changes nothing, and never fails the other
entries of the request.

A Fetch asking for ``min_bytes`` with a ``max_wait_ms`` is parked (Kafka's
long poll) until enough records are readable, an error shows up, or the wait
is over. A parked Fetch holds its gRPC worker thread, so at most
``max_parked_fetches`` are parked at once; beyond that a Fetch is answered
at once with what there is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import grpc

from partition_log import codec, produced
from partition_log.cluster_view import MAX_FLUSH_PARTITIONS, TxnPartitionAdder
from partition_log.partition import BatchSpec, Partition, ReplicaRead
from partition_log.producer_state import AppendCheck, Verdict
from raftcoord.protocol.acl import Operation, ResourceType
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.limits import KAFKA_MAX_PRODUCER_EPOCH, MAX_FETCH_WAIT_MS, MAX_SEQUENCE
from raftcoord.protocol.tls import Authorizer
from raftcoord.protocol.types import TopicPartition
from raftcoord.protocol.v1 import common_pb2, partition_log_pb2, partition_log_pb2_grpc
from raftcoord.protocol.wire import marker_identity, wire_error

log = logging.getLogger("raftcoord.partition_log")

#: Fetch limits when the request leaves them 0.
DEFAULT_FETCH_MAX_BYTES = 1 << 20
#: The most a Fetch answers, whatever its ``max_bytes`` (Kafka's broker
#: ``fetch.max.bytes``, 55 MiB; as there, a first batch over it still goes).
#: Partitions named twice draw on it twice.
FETCH_MAX_BYTES = 55 << 20


#: A partition lookup: the partition this node leads, or the error code and
#: message; with a leader epoch (not None), refused unless it is the current one.
Lookup = Callable[[str, int, "int | None"], "Partition | tuple[ErrorCode, str]"]
#: A lookup for a follower's fetch: (topic, partition, follower's node id,
#: leader epoch it names) -> the partition this node leads and the follower
#: holds a replica of, or the error code and message.
ReplicaLookup = Callable[[str, int, int, int], "Partition | tuple[ErrorCode, str]"]
#: Kafka's acks: every in-sync replica, or the leader alone (0 is answered as 1).
ACKS_ALL = -1
_ACKS = frozenset({ACKS_ALL, 0, 1})
#: The longest an acks=all write waits for its replication (Kafka's
#: request.timeout.ms), within the call's own deadline.
REPLICATION_TIMEOUT_S = 30.0
#: Left of a call's deadline for the answer to travel back.
_ANSWER_MARGIN_S = 0.2


@dataclass
class _Pending:
    """A Produce entry that passed validation."""

    index: int
    tp: TopicPartition
    partition: Partition
    spec: BatchSpec
    batch: bytearray


@dataclass
class _Written:
    """A partition that markers of one WriteTxnMarkers went to: the leader
    epoch before the first, the log end after the last, and the answers of
    those appended (or found applied already), to give once it is stored and
    replicated."""

    partition: Partition
    leader_epoch: int
    end: int = 0
    results: list[Any] = field(default_factory=list)


class LogChanges:
    """Counters the partitions of a node move, which parked fetches wait on:
    :attr:`generation` on every change a consumer's Fetch may see (a leader's
    append, marker or high watermark, retention, truncation), and
    :attr:`appended` when a leader's log grows or is cut, the only changes a
    follower's ReplicaFetch answers. A follower's own appends move neither:
    nothing fetches from a follower. Each kind has its own condition, so a
    high watermark that moves wakes no parked ReplicaFetch."""

    def __init__(self) -> None:
        lock = threading.Lock()
        self._consumers = threading.Condition(lock)
        self._replicas = threading.Condition(lock)
        self.generation = 0
        self.appended = 0
        self.closed = False
        """Set when the node stops: parked fetches answer at once."""

    def changed(self, appended: bool = True) -> None:
        """A change consumers may see; ``appended``: the log grew or was cut
        (followers may have something to fetch)."""
        with self._consumers:
            self.generation += 1
            self._consumers.notify_all()
            if appended:
                self.appended += 1
                self._replicas.notify_all()

    def close(self) -> None:
        with self._consumers:
            self.closed = True
            self._consumers.notify_all()
            self._replicas.notify_all()

    def wait_past(self, generation: int, timeout_s: float) -> None:
        """Return once :attr:`generation` differs from ``generation``, or after ``timeout_s``."""
        with self._consumers:
            self._consumers.wait_for(
                lambda: self.closed or self.generation != generation, timeout_s
            )

    def wait_appended_past(self, appended: int, timeout_s: float) -> None:
        """Return once :attr:`appended` differs from ``appended``, or after ``timeout_s``."""
        with self._replicas:
            self._replicas.wait_for(lambda: self.closed or self.appended != appended, timeout_s)


class PartitionLogService(partition_log_pb2_grpc.PartitionLogServicer):
    def __init__(
        self,
        lookup: Lookup,
        adder: TxnPartitionAdder,
        message_max_bytes: int,
        changes: LogChanges | None = None,
        max_parked_fetches: int = 8,
        *,
        verify_transactions: bool = True,
        status: Callable[[], Any] | None = None,
        cluster_refusal: Callable[..., str | None] = lambda context, *kinds: None,
        authorizer: Authorizer | None = None,
        refresh_acls: Callable[[], bool] = lambda: False,
        confirm_epoch: Callable[[str, int], bool] = lambda transactional_id, epoch: True,
        replica_lookup: ReplicaLookup | None = None,
    ) -> None:
        #: Serves followers' fetches (None: ReplicaFetch answers nothing).
        self.replica_lookup = replica_lookup
        #: Whether a marker's coordinator epoch was a real leader's (of the
        #: shard of its transactional id): a higher one is refused, so that
        #: no marker can fence the real coordinator out of a producer.
        self.confirm_epoch = confirm_epoch
        self.lookup = lookup
        #: The ACL decisions on clients' requests (None: none checked), and
        #: how to fetch the ACLs again when they refuse (a grant may be on
        #: its way; True when they changed).
        self.authorizer = authorizer
        self.refresh_acls = refresh_acls
        #: Why a call's caller may not send what only the cluster's nodes (of
        #: the kinds named: coordinators' markers, partition nodes' fetches)
        #: send, or None (:func:`raftcoord.protocol.tls.cluster_refusal`).
        self.cluster_refusal = cluster_refusal
        #: The node's PartitionNodeStatus answer (None: not served).
        self.status = status
        self.adder = adder
        self.message_max_bytes = message_max_bytes
        #: transaction.partition.verification.enable: off, transactional
        #: batches are appended without asking the coordinator.
        self.verify_transactions = verify_transactions
        self.changes = changes or LogChanges()
        self.max_parked_fetches = max_parked_fetches
        self._parked_lock = threading.Lock()
        #: Fetches parked now (at most ``max_parked_fetches``).
        self.parked_fetches = 0

    # --- Produce -------------------------------------------------------------------

    def Produce(self, request: Any, context: Any) -> Any:
        transactional_id = (
            request.transactional_id if request.HasField("transactional_id") else None
        )
        lookup = self._authorized(context, Operation.WRITE)
        acks = request.acks if request.HasField("acks") else ACKS_ALL
        if acks not in _ACKS:
            return _refuse_all(
                request, ErrorCode.INVALID_REQUEST, f"acks must be -1, 0 or 1, got {acks}"
            )
        if transactional_id is not None:
            refused = self._refusal(
                context, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id
            )
            if refused is not None:
                return _refuse_all(
                    request, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, refused
                )
        results: list[Any] = [None] * len(request.partitions)
        pending: list[_Pending] = []
        seen: set[TopicPartition] = set()
        for i, entry in enumerate(request.partitions):
            tp = TopicPartition(entry.topic, entry.partition)
            prepared = self._prepare(i, entry, transactional_id, tp in seen, lookup, acks)
            seen.add(tp)
            if isinstance(prepared, tuple):
                results[i] = _produce_result(tp, *prepared)
            else:
                pending.append(prepared)

        to_verify: list[_Pending] = []
        for p in pending:
            check = p.partition.append(p.spec, p.batch, verified=not self.verify_transactions)
            if check.verdict is Verdict.VERIFY:
                to_verify.append(p)
            else:
                results[p.index] = _appended(p.tp, check)
        if to_verify:
            assert transactional_id is not None  # _prepare refused transactional batches without
            groups: dict[tuple[int, int], list[_Pending]] = {}
            for p in to_verify:
                groups.setdefault((p.spec.producer_id, p.spec.producer_epoch), []).append(p)
            # The producer's other partitions are added only where it may write.
            flush = [
                tp
                for tp in islice(_flush_partitions(request), MAX_FLUSH_PARTITIONS)
                if lookup.refusal(tp.topic) is None
            ]
            for (producer_id, epoch), group in groups.items():
                answers = self.adder.add_partitions(
                    transactional_id, producer_id, epoch, [p.tp for p in group], flush
                )
                for p in group:
                    code, message = answers[p.tp]
                    if code is not ErrorCode.NONE:
                        results[p.index] = _produce_result(p.tp, code, message)
                        continue
                    check = p.partition.append(p.spec, p.batch, verified=True)
                    results[p.index] = _appended(p.tp, check)
        if acks == ACKS_ALL:
            deadline = _replication_deadline(_time_remaining(context))
            for p in pending:
                result = results[p.index]
                if result.error_code != ErrorCode.NONE:
                    continue
                code, message = p.partition.wait_replicated(
                    result.base_offset + p.spec.record_count, deadline - time.monotonic()
                )
                if code is not ErrorCode.NONE:
                    results[p.index] = _produce_result(p.tp, code, message)
        return partition_log_pb2.ProduceResponse(partitions=results)

    def _prepare(
        self,
        index: int,
        entry: Any,
        transactional_id: str | None,
        duplicate: bool,
        lookup: Lookup,
        acks: int,
    ) -> _Pending | tuple[ErrorCode, str]:
        if duplicate:
            return ErrorCode.INVALID_REQUEST, "the partition appears twice in the request"
        found = lookup(entry.topic, entry.partition, _leader_epoch(entry))
        if isinstance(found, tuple):
            return found
        if acks == ACKS_ALL and (problem := found.replication_problem()) is not None:
            return problem
        built = self._raw_batch(entry) if entry.raw_batch else self._record_batch(entry.batch)
        if isinstance(built[0], ErrorCode):
            return built
        encoded, spec = built
        if spec.transactional and not transactional_id:
            return (
                ErrorCode.INVALID_REQUEST,
                "a transactional batch needs the request's transactional_id",
            )
        if len(encoded) > self.message_max_bytes:
            return (
                ErrorCode.MESSAGE_TOO_LARGE,
                f"batch of {len(encoded)} bytes exceeds message.max.bytes={self.message_max_bytes}",
            )
        return _Pending(index, TopicPartition(entry.topic, entry.partition), found, spec, encoded)

    def _raw_batch(self, entry: Any) -> tuple[bytearray, BatchSpec] | tuple[ErrorCode, str]:
        """The batch of a Produce entry's ``raw_batch``, checked once (see
        :mod:`partition_log.produced`)."""
        if entry.HasField("batch"):
            return ErrorCode.INVALID_REQUEST, "a partition carries a batch or raw_batch, not both"
        try:
            encoded = produced.accept_produced(
                entry.raw_batch, MAX_SEQUENCE, self.message_max_bytes
            )
        except codec.InvalidBatch as exc:
            return exc.code, str(exc)
        header = codec.parse_header(encoded)
        pid, epoch, sequence = header.producer_id, header.producer_epoch, header.base_sequence
        if pid < -1:
            return ErrorCode.INVALID_REQUEST, f"producer_id must be >= -1, got {pid}"
        if pid >= 0 and epoch < 0:
            return (
                ErrorCode.INVALID_REQUEST,
                f"producer_epoch must be in 0..{KAFKA_MAX_PRODUCER_EPOCH}, got {epoch}",
            )
        if pid == -1:
            epoch, sequence = -1, -1
        spec = BatchSpec(pid, epoch, sequence, header.record_count, header.is_transactional)
        return encoded, spec

    def _record_batch(self, batch: Any) -> tuple[bytearray, BatchSpec] | tuple[ErrorCode, str]:
        """The batch of a Produce entry's records, encoded and checked."""
        records = batch.records
        if not records:
            return ErrorCode.INVALID_REQUEST, "a batch needs at least one record"
        pid, epoch, sequence = batch.producer_id, batch.producer_epoch, batch.base_sequence
        if pid < -1:
            return ErrorCode.INVALID_REQUEST, f"producer_id must be >= -1, got {pid}"
        if pid == -1:
            if batch.is_transactional:
                return ErrorCode.INVALID_REQUEST, "a transactional batch needs a producer id"
            epoch, sequence = -1, -1
        else:
            if not 0 <= epoch <= KAFKA_MAX_PRODUCER_EPOCH:
                return (
                    ErrorCode.INVALID_REQUEST,
                    f"producer_epoch must be in 0..{KAFKA_MAX_PRODUCER_EPOCH}, got {epoch}",
                )
            if not 0 <= sequence <= MAX_SEQUENCE:
                return ErrorCode.INVALID_REQUEST, f"base_sequence must be in 0..{MAX_SEQUENCE}"
            if len(records) > MAX_SEQUENCE:
                return ErrorCode.INVALID_REQUEST, "too many records in one batch"
        data = [
            codec.RecordData(
                key=record.key if record.HasField("key") else None,
                value=record.value if record.HasField("value") else None,
                headers=tuple((h.key, h.value) for h in record.headers),
                timestamp_ms=record.timestamp_ms,
            )
            for record in records
        ]
        try:
            encoded = codec.encode_batch(
                data,
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=sequence,
                transactional=batch.is_transactional,
            )
        except (TypeError, ValueError, OverflowError) as exc:
            return ErrorCode.CORRUPT_MESSAGE, f"cannot encode the batch: {exc}"
        if len(encoded) <= self.message_max_bytes:
            try:
                codec.read_batch(encoded)  # what is appended must be readable back
            except codec.InvalidBatch as exc:
                return exc.code, str(exc)
        spec = BatchSpec(pid, epoch, sequence, len(records), batch.is_transactional)
        return encoded, spec

    # --- Fetch ---------------------------------------------------------------------

    def Fetch(self, request: Any, context: Any) -> Any:
        problem = _fetch_problem(request)
        if problem is not None:
            return partition_log_pb2.FetchResponse(
                partitions=[
                    partition_log_pb2.FetchPartitionResponse(
                        topic=entry.topic,
                        partition=entry.partition,
                        error_code=wire_error(ErrorCode.INVALID_REQUEST),
                        error_message=problem,
                        next_fetch_offset=entry.fetch_offset,
                        high_watermark=-1,
                        last_stable_offset=-1,
                        log_start_offset=-1,
                    )
                    for entry in request.partitions
                ]
            )
        deadline = time.monotonic() + request.max_wait_ms / 1000
        parked = False
        lookup = self._authorized(context, Operation.READ)
        try:
            while True:
                generation = self.changes.generation
                answers, size, failed = self._read(request, lookup)
                remaining = deadline - time.monotonic()
                if size >= request.min_bytes or failed or remaining <= 0:
                    break
                if not parked:
                    parked = self._park()
                    if not parked:
                        break
                if self.changes.closed or (context is not None and not context.is_active()):
                    break
                self.changes.wait_past(generation, remaining)
        finally:
            if parked:
                with self._parked_lock:
                    self.parked_fetches -= 1
        return partition_log_pb2.FetchResponse(partitions=answers)

    def _park(self) -> bool:
        """Take one of the ``max_parked_fetches`` slots; False when all are taken."""
        with self._parked_lock:
            if self.parked_fetches >= self.max_parked_fetches:
                return False
            self.parked_fetches += 1
            return True

    def _read(self, request: Any, lookup: Lookup) -> tuple[list[Any], int, bool]:
        """One pass over the partitions of a Fetch: (answers, bytes of keys and values
        returned (at least 1 per record; with ``raw``, the batches' bytes), whether
        some partition answered an error)."""
        read_committed = request.isolation_level == common_pb2.READ_COMMITTED
        asked = request.max_bytes if request.max_bytes > 0 else DEFAULT_FETCH_MAX_BYTES
        budget = min(asked, FETCH_MAX_BYTES)
        size = 0
        failed = False
        answers = []
        for entry in request.partitions:
            answer = partition_log_pb2.FetchPartitionResponse(
                topic=entry.topic,
                partition=entry.partition,
                next_fetch_offset=entry.fetch_offset,
                high_watermark=-1,
                last_stable_offset=-1,
                log_start_offset=-1,
            )
            answers.append(answer)
            found = lookup(entry.topic, entry.partition, _leader_epoch(entry))
            if isinstance(found, tuple):
                answer.error_code, answer.error_message = wire_error(found[0]), found[1]
                failed = True
                continue
            if budget <= 0:  # the response is full: tell the offsets, read nothing
                start, lso, end = found.offsets()
                answer.log_start_offset, answer.last_stable_offset = start, lso
                answer.high_watermark = end
                continue
            limit = entry.partition_max_bytes or DEFAULT_FETCH_MAX_BYTES
            fetch = found.fetch_raw if request.raw else found.fetch
            result = fetch(entry.fetch_offset, min(limit, budget), read_committed)
            answer.error_code = wire_error(result.error)
            answer.error_message = result.message
            failed = failed or result.error is not ErrorCode.NONE
            answer.high_watermark = result.high_watermark
            answer.last_stable_offset = result.last_stable_offset
            answer.log_start_offset = result.log_start_offset
            answer.next_fetch_offset = result.next_fetch_offset
            if result.raw:
                answer.raw_batches = result.raw
                answer.aborted_transactions.extend(
                    partition_log_pb2.AbortedTransaction(
                        producer_id=t.producer_id, first_offset=t.first_offset
                    )
                    for t in result.aborted
                )
                budget -= len(result.raw)
                size += len(result.raw)
            for batch in result.batches:
                for r in batch.records:
                    record = answer.records.add(
                        offset=r.offset,
                        timestamp_ms=r.timestamp_ms,
                        headers=[
                            partition_log_pb2.RecordHeader(key=k, value=v) for k, v in r.headers
                        ],
                        producer_id=batch.producer_id,
                        producer_epoch=batch.producer_epoch,
                        is_transactional=batch.transactional,
                    )
                    if r.key is not None:
                        record.key = r.key
                    if r.value is not None:
                        record.value = r.value
                    n = len(r.key or b"") + len(r.value or b"")
                    budget -= n
                    size += max(n, 1)  # a record with neither key nor value still counts
        return answers, size, failed

    # --- ListOffsets ---------------------------------------------------------------

    def ListOffsets(self, request: Any, context: Any) -> Any:
        read_committed = request.isolation_level == common_pb2.READ_COMMITTED
        answers = []
        lookup = self._authorized(context, Operation.DESCRIBE)
        for entry in request.partitions:
            answer = partition_log_pb2.ListOffsetsPartitionResponse(
                topic=entry.topic, partition=entry.partition, offset=-1
            )
            answers.append(answer)
            found = lookup(entry.topic, entry.partition, _leader_epoch(entry))
            if isinstance(found, tuple):
                answer.error_code, answer.error_message = wire_error(found[0]), found[1]
                continue
            start, lso, end = found.offsets()
            if entry.spec == partition_log_pb2.OFFSET_SPEC_EARLIEST:
                answer.offset = start
            elif entry.spec == partition_log_pb2.OFFSET_SPEC_LAST_STABLE or read_committed:
                answer.offset = lso
            else:
                answer.offset = end
        return partition_log_pb2.ListOffsetsResponse(partitions=answers)

    # --- PartitionNodeStatus --------------------------------------------------------

    def PartitionNodeStatus(self, request: Any, context: Any) -> Any:
        refused = self.cluster_refusal(context)
        if refused is not None:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, refused)
        status = self.status
        if status is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "no node status here")
            raise AssertionError("abort raises")
        return status()

    # --- WriteTxnMarkers -----------------------------------------------------------

    def WriteTxnMarkers(self, request: Any, context: Any) -> Any:
        """A coordinator's markers over gRPC: :meth:`write_txn_markers`, for
        the cluster only."""
        return self.write_txn_markers(
            request, self.cluster_refusal(context, "coordinators"), _time_remaining(context)
        )

    def write_txn_markers(self, request: Any, refused: str | None, timeout_s: float | None) -> Any:
        """Each marker is answered once every in-sync replica has it, or
        when the caller's ``timeout_s`` is about to end; a caller that is
        not the cluster (``refused``: why) has each refused. Every marker
        is appended first; then each partition they went to is fsynced once
        and waited for once, and its markers get that outcome."""
        now_ms = int(time.time() * 1000)
        deadline = _replication_deadline(timeout_s)
        answers = []
        written: dict[Partition, _Written] = {}
        for marker in request.markers:
            if refused is not None:
                answers.append(_not_from_cluster(marker, refused))
                continue
            answer = partition_log_pb2.TxnMarkerResult(
                producer_id=marker.producer_id, producer_epoch=marker.producer_epoch
            )
            answers.append(answer)
            problem = _marker_problem(marker)
            unconfirmed = problem is None and not self.confirm_epoch(
                marker.transactional_id, marker.coordinator_epoch
            )
            for group in marker.groups:
                answer.groups.add(group_id=group, error_code=ErrorCode.INVALID_REQUEST)
            for topic in marker.topics:
                for index in topic.partitions:
                    result = answer.partitions.add(topic=topic.topic, partition=index)
                    if problem is not None:
                        result.error_code = wire_error(ErrorCode.INVALID_REQUEST)
                        result.error_message = problem
                        continue
                    if unconfirmed:  # retriable: a new leader's term may not be known yet
                        result.error_code = wire_error(ErrorCode.COORDINATOR_NOT_AVAILABLE)
                        result.error_message = (
                            f"no coordinator confirms coordinator epoch "
                            f"{marker.coordinator_epoch}: it is above the shard's leader epoch"
                        )
                        continue
                    found = self.lookup(topic.topic, index, None)
                    if isinstance(found, tuple):
                        result.error_code, result.error_message = wire_error(found[0]), found[1]
                        continue
                    # The epoch before the append: a newer one by the time it
                    # is synced fails the marker (retriable), never the reverse.
                    target = written.get(found)
                    if target is None:
                        target = written[found] = _Written(found, found.leader_epoch)
                    code, message = found.write_marker(
                        marker.producer_id,
                        marker.producer_epoch,
                        marker.coordinator_epoch,
                        marker.result == common_pb2.COMMIT,
                        now_ms,
                        marker.admin_abort,
                        *marker_identity(marker),
                        sync=False,
                    )
                    result.error_code, result.error_message = wire_error(code), message
                    if code is ErrorCode.NONE:
                        target.end = max(target.end, found.log_end())
                        target.results.append(result)
        for target in written.values():
            if not target.results:
                continue
            code, message = target.partition.sync_through(target.end, target.leader_epoch)
            if code is ErrorCode.NONE:
                code, message = target.partition.wait_replicated(
                    target.end, deadline - time.monotonic()
                )
            for result in target.results:
                result.error_code, result.error_message = wire_error(code), message
        return partition_log_pb2.WriteTxnMarkersResponse(markers=answers)

    # --- ReplicaFetch ---------------------------------------------------------------

    def ReplicaFetch(self, request: Any, context: Any) -> Any:
        """A follower's fetch over gRPC (a config without replication
        addresses): :meth:`replica_fetch`, for the cluster only."""
        return self.replica_fetch(request, self.cluster_refusal(context, "partition_nodes"))

    def replica_fetch(self, request: Any, refused: str | None, timeout_s: float = 0.0) -> Any:
        """A follower's fetch: answered at once when a partition has batches,
        an error or a divergence for it, else parked until one does or
        ``max_wait_ms`` is over (``timeout_s``, the caller's, plays no part);
        a caller that is not the cluster (``refused``: why) is refused."""
        if refused is not None:
            return partition_log_pb2.ReplicaFetchResponse(
                error_code=wire_error(ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
                error_message=refused,
            )
        if not 0 <= request.max_wait_ms <= MAX_FETCH_WAIT_MS or request.partition_max_bytes < 0:
            return partition_log_pb2.ReplicaFetchResponse(
                error_code=wire_error(ErrorCode.INVALID_REQUEST),
                error_message=f"max_wait_ms must be in 0..{MAX_FETCH_WAIT_MS} and "
                "partition_max_bytes >= 0",
            )
        max_bytes = request.partition_max_bytes or DEFAULT_FETCH_MAX_BYTES
        deadline = time.monotonic() + request.max_wait_ms / 1000
        while True:
            appended = self.changes.appended
            reads = [
                self._replica_read(request.replica_id, entry, max_bytes)
                for entry in request.partitions
            ]
            left = deadline - time.monotonic()
            done = any(
                r.records or r.error is not ErrorCode.NONE or r.diverging is not None for r in reads
            )
            if done or left <= 0 or self.changes.closed:
                return partition_log_pb2.ReplicaFetchResponse(
                    partitions=[
                        _replica_answer(entry, read)
                        for entry, read in zip(request.partitions, reads, strict=True)
                    ]
                )
            self.changes.wait_appended_past(appended, left)

    def _replica_read(self, replica: int, entry: Any, max_bytes: int) -> ReplicaRead:
        if entry.fetch_offset < 0 or entry.last_fetched_epoch < -1:
            return ReplicaRead(
                ErrorCode.INVALID_REQUEST,
                "fetch_offset must be >= 0 and last_fetched_epoch >= -1",
                -1,
                -1,
            )
        found: Partition | tuple[ErrorCode, str] = (
            (ErrorCode.NOT_LEADER_OR_FOLLOWER, "this node serves no replicas")
            if self.replica_lookup is None
            else self.replica_lookup(
                entry.topic, entry.partition, replica, entry.current_leader_epoch
            )
        )
        if isinstance(found, tuple):
            return ReplicaRead(found[0], found[1], -1, -1)
        return found.replica_read(replica, entry.fetch_offset, entry.last_fetched_epoch, max_bytes)

    # --- DescribeProducers ---------------------------------------------------------

    def DescribeProducers(self, request: Any, context: Any) -> Any:
        answers = []
        lookup = self._authorized(context, Operation.READ)
        for topic in request.topics:
            for index in topic.partitions:
                answer = partition_log_pb2.DescribeProducersPartitionResponse(
                    topic=topic.topic, partition=index
                )
                answers.append(answer)
                found = lookup(topic.topic, index)
                if isinstance(found, tuple):
                    answer.error_code, answer.error_message = wire_error(found[0]), found[1]
                    continue
                for producer in found.active_producers():
                    answer.active_producers.add(
                        producer_id=producer.producer_id,
                        producer_epoch=producer.producer_epoch,
                        last_sequence=producer.last_sequence,
                        last_timestamp_ms=producer.last_timestamp_ms,
                        coordinator_epoch=producer.coordinator_epoch,
                        current_txn_start_offset=producer.current_txn_start_offset,
                    )
        return partition_log_pb2.DescribeProducersResponse(partitions=answers)

    # --- authorization ---------------------------------------------------------------

    def _refusal(
        self, context: Any, operation: Operation, resource_type: ResourceType, name: str
    ) -> str | None:
        """Why the caller may not ``operation`` the resource, or None. A
        refusal is checked again against freshly fetched ACLs (a grant may
        not have reached this node yet)."""
        authorizer = self.authorizer
        if authorizer is None or not authorizer.enabled:
            return None
        who = authorizer.caller(context)
        if authorizer.allows(who, operation, resource_type, name, log_denial=False):
            return None
        if self.refresh_acls() and authorizer.allows(who, operation, resource_type, name, False):
            return None
        authorizer.allows(who, operation, resource_type, name)  # logs the denial
        return f"{who.name} may not {operation.name} {resource_type.name} {name[:200]!r}"

    def _authorized(self, context: Any, operation: Operation) -> _AuthorizedLookup:
        """The node's lookup for one request, with the caller's rights to
        ``operation`` the topics."""
        return _AuthorizedLookup(self, context, operation)


class _AuthorizedLookup:
    """A partition lookup for one request: a topic the caller may not
    ``operation`` is TOPIC_AUTHORIZATION_FAILED (decided once per topic)."""

    def __init__(self, service: PartitionLogService, context: Any, operation: Operation) -> None:
        self._service = service
        self._context = context
        self._operation = operation
        self._decided: dict[str, str | None] = {}

    def refusal(self, topic: str) -> str | None:
        """Why the caller may not ``operation`` ``topic``, or None."""
        if topic not in self._decided:
            self._decided[topic] = self._service._refusal(
                self._context, self._operation, ResourceType.TOPIC, topic
            )
        return self._decided[topic]

    def __call__(
        self, topic: str, partition: int, leader_epoch: int | None = None
    ) -> Partition | tuple[ErrorCode, str]:
        refused = self.refusal(topic)
        if refused is not None:
            return ErrorCode.TOPIC_AUTHORIZATION_FAILED, refused
        return self._service.lookup(topic, partition, leader_epoch)


def _time_remaining(context: Any) -> float | None:
    """Seconds left of a gRPC call's deadline (None: none, or no call)."""
    return None if context is None else context.time_remaining()


def _replication_deadline(timeout_s: float | None) -> float:
    """When (monotonic) a call's acks=all waits give up: the call's own
    deadline (``timeout_s`` from now; None: none) less the time for the
    answer to travel, at most :data:`REPLICATION_TIMEOUT_S`."""
    wait = REPLICATION_TIMEOUT_S
    if timeout_s is not None:
        wait = min(wait, timeout_s - _ANSWER_MARGIN_S)
    return time.monotonic() + wait


def _leader_epoch(entry: Any) -> int | None:
    """The leader epoch a request's partition entry names, None when unset."""
    return entry.current_leader_epoch if entry.HasField("current_leader_epoch") else None


def _fetch_problem(request: Any) -> str | None:
    if not 0 <= request.max_wait_ms <= MAX_FETCH_WAIT_MS:
        return f"max_wait_ms must be in 0..{MAX_FETCH_WAIT_MS}, got {request.max_wait_ms}"
    if request.min_bytes < 0:
        return f"min_bytes must be >= 0, got {request.min_bytes}"
    return None


def _marker_problem(marker: Any) -> str | None:
    if marker.producer_id < 0:
        return f"producer_id must be >= 0, got {marker.producer_id}"
    if not 0 <= marker.producer_epoch <= KAFKA_MAX_PRODUCER_EPOCH:
        return (
            f"producer_epoch must be in 0..{KAFKA_MAX_PRODUCER_EPOCH}, got {marker.producer_epoch}"
        )
    if marker.coordinator_epoch < 0:
        return f"coordinator_epoch must be >= 0, got {marker.coordinator_epoch}"
    if marker.groups:
        return "markers for consumer groups go to the group's coordinator"
    if marker.admin_abort and marker.result != common_pb2.ABORT:
        return "an administrator's marker can only abort"
    return None


def _flush_partitions(request: Any) -> Iterator[TopicPartition]:
    """The partitions a Produce request says its producer's flush adds to
    the transaction (``transaction_partitions``), in the request's order."""
    for topics in request.transaction_partitions:
        for partition in topics.partitions:
            yield TopicPartition(topics.topic, partition)


def _refuse_all(request: Any, code: ErrorCode, message: str) -> Any:
    """A Produce answer refusing every partition of ``request`` alike."""
    return partition_log_pb2.ProduceResponse(
        partitions=[
            _produce_result(TopicPartition(e.topic, e.partition), code, message)
            for e in request.partitions
        ]
    )


def _replica_answer(entry: Any, read: ReplicaRead) -> Any:
    """One partition's part of a ReplicaFetch answer (made only once the
    fetch is answered: a parked fetch reads its partitions again and again)."""
    answer = partition_log_pb2.ReplicaFetchPartitionResponse(
        topic=entry.topic,
        partition=entry.partition,
        error_code=wire_error(read.error),
        error_message=read.message,
        high_watermark=read.high_watermark,
        log_start_offset=read.log_start_offset,
        records=read.records,
    )
    if read.diverging is not None:
        answer.diverging_epoch.epoch = read.diverging.epoch
        answer.diverging_epoch.end_offset = read.diverging.end_offset
    return answer


def _produce_result(
    tp: TopicPartition, code: ErrorCode, message: str, base_offset: int = -1
) -> Any:
    return partition_log_pb2.PartitionProduceResponse(
        topic=tp[0],
        partition=tp[1],
        error_code=wire_error(code),
        error_message=message,
        base_offset=base_offset,
        log_start_offset=-1,
    )


def _appended(tp: TopicPartition, check: AppendCheck) -> Any:
    if not check.ok:
        return _produce_result(tp, check.error, check.message)
    if check.verdict is Verdict.VERIFY:  # only when verification raced a marker
        return _produce_result(tp, ErrorCode.REQUEST_TIMED_OUT, "the transaction changed; retry")
    return _produce_result(tp, ErrorCode.NONE, "", check.base_offset)


def _not_from_cluster(marker: Any, message: str) -> Any:
    """The answer to a marker from a caller that is not the cluster:
    CLUSTER_AUTHORIZATION_FAILED for each of its partitions and groups."""
    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    answer = partition_log_pb2.TxnMarkerResult(
        producer_id=marker.producer_id, producer_epoch=marker.producer_epoch
    )
    for group in marker.groups:
        answer.groups.add(group_id=group, error_code=wire_error(code))
    for topic in marker.topics:
        for index in topic.partitions:
            answer.partitions.add(
                topic=topic.topic,
                partition=index,
                error_code=wire_error(code),
                error_message=message,
            )
    return answer
