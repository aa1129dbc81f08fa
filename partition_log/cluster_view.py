"""What a partition-log node learns from the coordinators.

* :class:`ClusterView`: topic placement from the coordinators' Metadata RPC
  (which partitions this node owns), refreshed periodically and on a miss;
  and the node's data directory and offset reservations on record there
  (RegisterDirectory, ReserveOffsets); and what the coordinators decided
  about producers' transactions (:meth:`ClusterView.coordinator_transactions`,
  :func:`owed_marker`).
* :class:`TxnPartitionAdder`: KIP-890 part 2. Before a partition
  accepts the first transactional batch of a (producer id, epoch), it asks
  the coordinator of the transactional id to add the partition to the
  producer's transaction (AddPartitionsToTxn, not verify-only), which
  starts the transaction if it is not open yet; the producer does not call
  AddPartitionsToTxn itself. The partitions of one Produce request are one
  transaction of the question; the questions of many Produce requests to
  one coordinator go together in one batched AddPartitionsToTxn while one
  is being taken (:class:`partition_log.coalescing.CoalescingSender`);
  over a cluster link each transaction of it is answered on its own. A
  refusal of the transaction's state is TRANSACTION_ABORTABLE, as Kafka's
  brokers answer producers since KIP-890: the producer aborts the
  transaction and goes on.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import grpc

from partition_log.coalescing import CoalescingSender, Deliver
from raftcoord.protocol.acl import Acl
from raftcoord.protocol.channels import ChannelCache
from raftcoord.protocol.cluster_link import ADD_PARTITIONS_TO_TXN, ConcurrentLink, LinkError
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.routing import shard_for
from raftcoord.protocol.types import TopicPartition
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2
from raftcoord.protocol.wire import acl_from_proto

log = logging.getLogger("raftcoord.partition_log")

#: Deadline of every call to a coordinator.
CALL_TIMEOUT_S = 3.0
#: The most partitions of a producer's flush (a Produce request's
#: ``transaction_partitions``) added with a node's own.
MAX_FLUSH_PARTITIONS = 1000
#: A coordinator answers a request it holds (parks) this long before the
#: request's deadline (its PARK_MARGIN_MS).
PARK_MARGIN_S = 0.1
#: How long a coordinator without a link address (gRPC calls, answered
#: whole) may hold a node's add that goes out alone (one transaction in the
#: call) for its previous transaction's completion, which takes a few
#: milliseconds: the producer begins its next transaction as soon as EndTxn
#: answers, so its next first batch usually meets it. Bounded, since the
#: call holds up the node's next adds to that coordinator.
SOLE_ADD_WAIT_S = 0.05
#: A miss of one topic refreshes the metadata at most this often.
MIN_REFRESH_INTERVAL_S = 0.1


class Leadership(NamedTuple):
    """A partition's leader (-1: none), leader epoch, replicas and in-sync
    replicas, as the coordinators record them."""

    leader: int
    leader_epoch: int
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    partition_epoch: int = 0


class Followed(NamedTuple):
    """A partition this node holds a follower replica of."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int


@dataclass(frozen=True)
class Placement:
    """Where a topic-partition lives, as this node knows it."""

    #: NONE (led here), NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION,
    #: FENCED_LEADER_EPOCH or UNKNOWN_LEADER_EPOCH.
    error: ErrorCode
    message: str = ""
    #: The leader epoch this node leads at (when ``error`` is NONE).
    leader_epoch: int = -1
    #: The other in-sync replicas (when ``error`` is NONE).
    in_sync_followers: frozenset[int] = frozenset()
    #: The topic's min.insync.replicas.
    min_insync_replicas: int = 1
    #: Every replica, the preferred leader first (when ``error`` is NONE).
    replicas: tuple[int, ...] = ()
    #: The registration's partition epoch (when ``error`` is NONE).
    partition_epoch: int = 0


class ClusterView:
    """Topic placement, from any coordinator's Metadata answer."""

    def __init__(self, channels: ChannelCache, coordinators: Sequence[str], node_id: int) -> None:
        self._channels = channels
        self._addresses = list(coordinators)
        self.node_id = node_id
        self._lock = threading.Lock()
        self._topics: dict[str, tuple[Leadership, ...]] = {}
        self._min_insync: dict[str, int] = {}
        self.shard_count = 0
        self._missed: dict[str, float] = {}  # topic -> when a miss last refreshed
        self._next = 0
        #: The coordinator (index) that last answered a request about shard
        #: 0's records: asked first next time.
        self._answered_at = 0
        self._acls: frozenset[Acl] | None = None  # None until an answer brought them
        #: The highest Raft term of each shard any coordinator told (terms only grow).
        self._epochs: tuple[int, ...] = ()
        self._acls_refreshed = 0.0  # monotonic time of the last refresh asked by a denial
        self._acls_refreshing = threading.Lock()

    def refresh(self, wanted: str | None = None, confirmed: bool = False) -> bool:
        """Ask the coordinators (in turn until one answers); True on success.

        Coordinators answer from shard 0's leader's applied state, which
        writes nothing to the Raft log (the periodic refresh of an idle
        cluster costs no entries). With ``wanted`` (a topic this node
        missed) the answer comes through a read barrier on shard 0's
        leader, so a topic created before the miss is found; ``confirmed``
        asks the same for the ACLs (shard 0's leader's, through its log).
        """
        addresses = self._addresses
        request = coordinator_pb2.MetadataRequest(
            read_barrier=wanted is not None or confirmed, include_acls=True
        )
        answer: Any = None
        for i in range(len(addresses)):
            address = addresses[(self._next + i) % len(addresses)]
            try:
                answer = self._channels.coordinator(address).Metadata(
                    request, timeout=CALL_TIMEOUT_S
                )
            except grpc.RpcError:
                continue
            self._next = (self._next + i) % len(addresses)
            break
        else:
            self._next += 1
            return False
        topics = {
            t.name: tuple(
                Leadership(
                    p.node_id, p.leader_epoch, tuple(p.replicas), tuple(p.isr), p.partition_epoch
                )
                for p in sorted(t.partitions, key=lambda p: p.partition)
            )
            for t in answer.topics
            if t.error_code == ErrorCode.NONE
        }
        acls = None
        if answer.acls_included:
            try:
                acls = frozenset(acl_from_proto(a) for a in answer.acls)
            except ValueError as exc:
                log.warning("event=acls_not_understood error=%r", str(exc))
        self._learn_epochs(answer.shard_epochs, answer.shard_count)
        with self._lock:
            # Topics are only ever added and leader epochs only grow: a stale
            # answer (a coordinator whose replica of shard 0 lags) never hides
            # a known topic nor brings back an older leader.
            self._topics = {
                **self._topics,
                **{name: _newer(self._topics.get(name), found) for name, found in topics.items()},
            }
            self._min_insync.update(
                (t.name, max(t.min_insync_replicas, 1))
                for t in answer.topics
                if t.error_code == ErrorCode.NONE
            )
            self.shard_count = answer.shard_count
            if acls is not None and acls != self._acls:
                self._acls = acls
        return True

    def _learn_epochs(self, epochs: Sequence[int], shard_count: int) -> None:
        if len(epochs) != shard_count:  # an answer without the terms of every shard
            return
        with self._lock:
            known = self._epochs if len(self._epochs) == shard_count else (0,) * shard_count
            self._epochs = tuple(max(k, e) for k, e in zip(known, epochs, strict=True))

    def confirm_coordinator_epoch(self, transactional_id: str, epoch: int) -> bool:
        """Whether a coordinator confirms that ``epoch`` is no higher than the
        Raft term of the shard of ``transactional_id`` (of any shard when it
        is empty: an administrator's abort names no id): a marker's
        coordinator epoch must have been a leader's. Asks the coordinators in
        turn, until one confirms, when the terms known here are lower."""
        if self._confirmed(transactional_id, epoch):
            return True
        request = coordinator_pb2.MetadataRequest()
        for address in self._addresses:
            try:
                answer = self._channels.coordinator(address).Metadata(
                    request, timeout=CALL_TIMEOUT_S
                )
            except grpc.RpcError:
                continue
            self._learn_epochs(answer.shard_epochs, answer.shard_count)
            if self._confirmed(transactional_id, epoch):
                return True
        return False

    def _confirmed(self, transactional_id: str, epoch: int) -> bool:
        with self._lock:
            epochs, count = self._epochs, self.shard_count
        if not epochs or count != len(epochs):
            return False
        if not transactional_id:
            return epoch <= max(epochs)
        return epoch <= epochs[shard_for(transactional_id, count)]

    def acls(self) -> frozenset[Acl] | None:
        """The cluster's ACLs as the last refresh brought them (the same
        object until they change); None before any did."""
        return self._acls

    def refresh_acls(self) -> bool:
        """Refresh the ACLs from shard 0's leader now, for a request the ACLs
        this node has refuse (a grant may not have reached it yet); one
        refresh at a time, whose answer the requests waiting for it share,
        and at most every :data:`MIN_REFRESH_INTERVAL_S`. Whether the ACLs
        changed."""
        before = self._acls
        with self._acls_refreshing:
            if self._acls is not before:  # refreshed while this request waited
                return True
            now = time.monotonic()
            if now - self._acls_refreshed < MIN_REFRESH_INTERVAL_S:
                return False
            self._acls_refreshed = now
            self.refresh(confirmed=True)
            return self._acls is not before

    def register_directory(self, directory_id: str, replace: bool = False) -> Any | None:
        """Shard 0's answer to RegisterDirectory, or None when no coordinator
        could give one (none answered, or shard 0 has no leader)."""
        request = coordinator_pb2.RegisterDirectoryRequest(
            node_id=self.node_id, directory_id=directory_id, replace=replace
        )
        return self._ask_metadata_leader("RegisterDirectory", request)

    def reserve_offsets(
        self, directory_id: str, reservations: Sequence[tuple[str, int, int]]
    ) -> Any | None:
        """Shard 0's answer to ReserveOffsets of (topic, partition, ceiling),
        or None when no coordinator could give one."""
        request = coordinator_pb2.ReserveOffsetsRequest(
            node_id=self.node_id,
            directory_id=directory_id,
            reservations=[
                coordinator_pb2.PartitionCeiling(topic=t, partition=p, ceiling=c)
                for t, p, c in reservations
            ],
        )
        return self._ask_metadata_leader(method="ReserveOffsets", request=request)

    def heartbeat(self, directory_id: str, timeout_s: float, lost_data: bool = False) -> Any | None:
        """Shard 0's leader's answer to NodeHeartbeat (this node's lease), or
        None when no coordinator could give one; each coordinator is given
        ``timeout_s`` (well below the lease, so that one that does not
        answer leaves time to ask the others). ``lost_data``: fence the node
        first (it may lack acknowledged records)."""
        request = coordinator_pb2.NodeHeartbeatRequest(
            node_id=self.node_id, directory_id=directory_id, lost_data=lost_data
        )
        return self._ask_metadata_leader("NodeHeartbeat", request, timeout_s)

    def coordinator_transactions(self, producer_ids: Sequence[int]) -> list[Any] | None:
        """The coordinators' TransactionDescriptions of the transactional ids
        whose current producer id is one of ``producer_ids`` (ListTransactions
        of every coordinator, then DescribeTransactions of each id's
        leader); None unless every coordinator answered its listing and every
        id was described (a shard that is electing is missed: ask again)."""
        listing = coordinator_pb2.ListTransactionsRequest(
            producer_id_filters=producer_ids, duration_filter_ms=-1
        )
        ids: set[str] = set()
        for address in self._addresses:
            try:
                answer = self._channels.coordinator(address).ListTransactions(
                    listing, timeout=CALL_TIMEOUT_S
                )
            except grpc.RpcError:
                return None
            ids.update(t.transactional_id for t in answer.transactions)
        described = []
        for tid in sorted(ids):
            request = coordinator_pb2.DescribeTransactionsRequest(transactional_ids=[tid])
            for address in self._addresses:
                try:
                    answer = self._channels.coordinator(address).DescribeTransactions(
                        request, timeout=CALL_TIMEOUT_S
                    )
                except grpc.RpcError:
                    continue
                if answer.transactions and answer.transactions[0].error_code == ErrorCode.NONE:
                    described.append(answer.transactions[0])
                    break
            else:
                return None
        return described

    def _ask_metadata_leader(
        self, method: str, request: Any, timeout_s: float = CALL_TIMEOUT_S
    ) -> Any | None:
        """The first answer that is not "ask another node" (any coordinator
        forwards to shard 0's leader), asking first the coordinator that gave
        the last such answer, each for at most ``timeout_s``."""
        count = len(self._addresses)
        for i in range(count):
            at = (self._answered_at + i) % count
            try:
                answer = getattr(self._channels.coordinator(self._addresses[at]), method)(
                    request, timeout=timeout_s
                )
            except grpc.RpcError:
                continue
            if answer.error_code not in _ASK_ANOTHER:
                self._answered_at = at
                return answer
        return None

    def placement(self, topic: str, partition: int) -> Placement:
        """Whether this node leads ``topic``/``partition`` as far as it knows (no refresh)."""
        return self._locate(topic, partition)

    def owns(self, topic: str, partition: int) -> bool:
        """Whether this node leads ``topic``/``partition`` as far as it knows (no refresh)."""
        return self.placement(topic, partition).error is ErrorCode.NONE

    def owned(self) -> list[TopicPartition]:
        """The topic-partitions this node leads."""
        with self._lock:
            return [
                TopicPartition(topic, i)
                for topic, partitions in self._topics.items()
                for i, p in enumerate(partitions)
                if p.leader == self.node_id
            ]

    def followed(self) -> list[Followed]:
        """The partitions this node is a replica of and another node leads."""
        with self._lock:
            return [
                Followed(topic, i, p.leader, p.leader_epoch)
                for topic, partitions in self._topics.items()
                for i, p in enumerate(partitions)
                if self.node_id in p.replicas and p.leader not in (self.node_id, -1)
            ]

    def held(self) -> list[tuple[str, int, tuple[int, ...]]]:
        """(topic, partition, replicas) of every partition this node holds a replica of."""
        with self._lock:
            return [
                (topic, i, p.replicas)
                for topic, partitions in self._topics.items()
                for i, p in enumerate(partitions)
                if self.node_id in p.replicas
            ]

    def leadership(self, topic: str, partition: int) -> Leadership | None:
        """The registration of ``topic``/``partition`` as last refreshed, or
        None when this node does not know it (no refresh)."""
        with self._lock:
            partitions = self._topics.get(topic, ())
            return partitions[partition] if 0 <= partition < len(partitions) else None

    def replica_of(self, topic: str, partition: int, replica: int) -> bool:
        """Whether ``replica`` holds a replica of ``topic``/``partition`` (no refresh)."""
        with self._lock:
            partitions = self._topics.get(topic, ())
            return 0 <= partition < len(partitions) and replica in partitions[partition].replicas

    def locate(self, topic: str, partition: int, leader_epoch: int | None = None) -> Placement:
        """Whether this node leads ``topic``/``partition``, for a request that
        names ``leader_epoch`` (None: any); refreshes once on a miss, or when
        the request names a newer leader epoch than this node knows."""
        placement = self._locate(topic, partition, leader_epoch)
        if placement.error not in _REFRESH_ON:
            return placement
        now = time.monotonic()
        with self._lock:
            stale = now - self._missed.get(topic, 0.0) >= MIN_REFRESH_INTERVAL_S
            if stale:
                if len(self._missed) > 1000:
                    self._missed.clear()
                self._missed[topic] = now
        if stale and self.refresh(wanted=topic):
            placement = self._locate(topic, partition, leader_epoch)
        return placement

    def _locate(self, topic: str, partition: int, leader_epoch: int | None = None) -> Placement:
        with self._lock:
            partitions = self._topics.get(topic)
        if partitions is None:
            return Placement(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {topic!r}")
        if not 0 <= partition < len(partitions):
            return Placement(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {topic!r} has partitions 0..{len(partitions) - 1}, not {partition}",
            )
        leader, epoch, replicas, isr, partition_epoch = partitions[partition]
        if leader != self.node_id:
            led = f"led by partition-log node {leader}" if leader >= 0 else "without a leader"
            return Placement(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"{topic}-{partition} is {led} (leader epoch {epoch})",
            )
        if leader_epoch is not None and leader_epoch < epoch:
            return Placement(
                ErrorCode.FENCED_LEADER_EPOCH,
                f"{topic}-{partition} is at leader epoch {epoch}, not {leader_epoch}",
            )
        if leader_epoch is not None and leader_epoch > epoch:
            return Placement(
                ErrorCode.UNKNOWN_LEADER_EPOCH,
                f"partition-log node {self.node_id} knows {topic}-{partition} at leader "
                f"epoch {epoch}, not yet {leader_epoch}; retry",
            )
        return Placement(
            ErrorCode.NONE,
            leader_epoch=epoch,
            in_sync_followers=frozenset(isr) - {self.node_id},
            min_insync_replicas=self._min_insync.get(topic, 1),
            replicas=replicas,
            partition_epoch=partition_epoch,
        )

    def alter_partition(
        self,
        directory_id: str,
        topic: str,
        partition: int,
        leader_epoch: int,
        partition_epoch: int,
        isr: Sequence[int],
    ) -> Any | None:
        """Ask shard 0's leader for a new ISR of a partition this node leads
        (AlterPartition); the answer, or None when no coordinator answered.
        An accepted change is learnt here at once."""
        request = coordinator_pb2.AlterPartitionRequest(
            node_id=self.node_id,
            directory_id=directory_id,
            topic=topic,
            partition=partition,
            leader_epoch=leader_epoch,
            partition_epoch=partition_epoch,
            isr=isr,
        )
        answer = self._ask_metadata_leader("AlterPartition", request)
        if answer is not None and answer.error_code == ErrorCode.NONE:
            with self._lock:
                known = self._topics.get(topic)
                if known is not None and 0 <= partition < len(known):
                    now = known[partition]._replace(
                        isr=tuple(answer.isr),
                        leader_epoch=answer.leader_epoch,
                        partition_epoch=answer.partition_epoch,
                    )
                    found = (*known[:partition], now, *known[partition + 1 :])
                    self._topics[topic] = _newer(known, found)
        return answer


def _newer(
    known: tuple[Leadership, ...] | None, found: tuple[Leadership, ...]
) -> tuple[Leadership, ...]:
    """Each partition's registration of the higher (leader epoch, partition
    epoch) of the two."""
    if known is None or len(known) != len(found):
        return found
    return tuple(
        f if (f.leader_epoch, f.partition_epoch) >= (k.leader_epoch, k.partition_epoch) else k
        for k, f in zip(known, found, strict=True)
    )


class OwedMarker(NamedTuple):
    """The marker a partition's open transaction is owed: COMMIT or ABORT,
    the coordinator epoch it was decided in, the marker's epoch, how its
    transaction ended (transaction.version) and its number (-1: unknown)."""

    commit: bool
    coordinator_epoch: int
    epoch: int
    transaction_version: int
    txn_number: int


def owed_marker(
    producer_id: int, data_epoch: int, marker_txn: int, descriptions: Sequence[Any]
) -> OwedMarker | None:
    """The marker a partition's open transaction of ``producer_id`` (its
    records at ``data_epoch``; the producer's last marker here of transaction
    number ``marker_txn``, -1 when none is known) is owed when the
    coordinator has completed it; None when no description says so.

    A transaction is completed (CompleteCommit/CompleteAbort) only once every
    partition acknowledged its marker, so a partition that still has it open
    lost the marker (a flush policy other than ``always``). The completed
    transaction must be this one: its records' producer id and epoch
    (``last_producer_*``) are the open transaction's, or, after a fencing
    abort (no ``last_producer_epoch``), the abort's epoch is the next one,
    or it was a transaction kept for a two-phase commit whose records carry
    ``ongoing_txn_producer_*``; the marker then goes at the records' epoch +
    1. A transaction of transactions v1 keeps its epoch, so its identity
    names many; it is this one only when it is the next after the
    partition's last marker of the producer (its number is ``marker_txn`` +
    1), and the marker carries the records' own epoch.
    """
    for d in descriptions:
        if d.state not in _COMPLETED:
            continue
        commit = d.state == common_pb2.TRANSACTION_STATE_COMPLETE_COMMIT
        number = int(d.txn_number) if d.txn_number > 0 else -1
        if d.transaction_version == 1:
            if (
                (d.producer_id, d.producer_epoch) == (producer_id, data_epoch)
                and marker_txn >= 0
                and number == marker_txn + 1
            ):
                return OwedMarker(commit, d.coordinator_epoch, data_epoch, 1, number)
            continue
        kept = d.HasField("ongoing_txn_producer_id") and (
            d.ongoing_txn_producer_id,
            d.ongoing_txn_producer_epoch,
        ) == (producer_id, data_epoch)
        if kept or (d.last_producer_id, d.last_producer_epoch) == (producer_id, data_epoch):
            return OwedMarker(commit, d.coordinator_epoch, data_epoch + 1, 2, number)
        fenced = d.last_producer_epoch == -1 and not commit
        if fenced and (d.producer_id, d.producer_epoch) == (producer_id, data_epoch + 1):
            return OwedMarker(False, d.coordinator_epoch, data_epoch + 1, 2, number)
    return None


_COMPLETED = (
    common_pb2.TRANSACTION_STATE_COMPLETE_COMMIT,
    common_pb2.TRANSACTION_STATE_COMPLETE_ABORT,
)

#: Placements that a refresh of the metadata may change.
_REFRESH_ON = frozenset(
    {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
    }
)

#: Answers that send a request about shard 0's records to another coordinator.
_ASK_ANOTHER = {
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.REQUEST_TIMED_OUT,
}

#: Answers of the coordinator that reject the batch as they are: final
#: refusals, and CONCURRENT_TRANSACTIONS (the previous transaction is still
#: completing), which the producer retries soon.
_FINAL = {
    ErrorCode.INVALID_TXN_STATE,
    ErrorCode.PRODUCER_FENCED,
    ErrorCode.INVALID_PRODUCER_ID_MAPPING,
    ErrorCode.INVALID_PRODUCER_EPOCH,
    ErrorCode.TRANSACTION_ABORTABLE,
    ErrorCode.CONCURRENT_TRANSACTIONS,
    ErrorCode.INVALID_REQUEST,
}


class TxnPartitionAdder:
    """Asks transaction coordinators to add partitions to transactions."""

    def __init__(
        self,
        channels: ChannelCache,
        coordinators: Sequence[str],
        view: ClusterView,
        *,
        links: Mapping[str, str] | None = None,
        link_tls: ssl.SSLContext | None = None,
        retry_max_s: float = 0.1,
    ) -> None:
        """``links``: coordinator gRPC address -> its link address; the adds
        to a coordinator with one go over a cluster link (TLS ``link_tls``),
        each transaction answered on its own, to the others as gRPC calls."""
        self._channels = channels
        self._addresses = list(coordinators)
        self._view = view
        self._link_addresses = dict(links or {})
        self._link_tls = link_tls
        self._links: dict[str, ConcurrentLink] = {}
        self._closed = False
        self._leaders: dict[int, str] = {}
        self._lock = threading.Lock()
        self._sender: CoalescingSender[Any, Any] = CoalescingSender(self._send)
        #: add.partitions.to.txn.retry.backoff.max.ms: how long an add whose
        #: previous transaction is completing waits for the completion in all
        #: before CONCURRENT_TRANSACTIONS goes to the producer.
        self._retry_max_s = retry_max_s

    @property
    def calls(self) -> int:
        """AddPartitionsToTxn calls made so far (each may carry many transactions)."""
        return self._sender.calls

    def _send(self, address: str, requests: Sequence[Any], deliver: Deliver[Any]) -> None:
        """One batched AddPartitionsToTxn to ``address``, each request's answer
        handed to ``deliver``. Over a cluster link every transaction may wait
        ``retry_max_s`` (from the coordinator's first finding it completing)
        for its previous transaction's completion, parked by the
        coordinator, and is answered on its own (this returns once each is
        answered or parked). As a gRPC call, answered whole, a request
        that goes alone may wait :data:`SOLE_ADD_WAIT_S` (of many, none
        waits: one completing transaction would hold up the others)."""
        link = self._link(address)
        if link is None:
            wait_ms = round(min(SOLE_ADD_WAIT_S, self._retry_max_s) * 1000)
            waits = len(requests) == 1 and wait_ms > 0
        else:
            wait_ms = round(self._retry_max_s * 1000)
            waits = wait_ms > 0
        request = coordinator_pb2.AddPartitionsToTxnRequest(
            transactions=requests,
            wait_for_completion=waits,
            wait_for_completion_ms=wait_ms if waits else 0,
        )
        if link is None:
            answer = self._channels.coordinator(address).AddPartitionsToTxn(
                request, timeout=CALL_TIMEOUT_S
            )
        else:
            answer = link.call_items(
                ADD_PARTITIONS_TO_TXN, request, CALL_TIMEOUT_S + wait_ms / 1000, deliver
            )
            if answer is None:  # answered (or being answered) transaction by transaction
                return
        if answer.error_code != ErrorCode.NONE:  # the whole request was refused
            refused = coordinator_pb2.AddPartitionsToTxnResponse(
                error_code=answer.error_code, error_message=answer.error_message
            )
            answers = [refused] * len(requests)
        else:
            answers = list(answer.transactions)
        if len(answers) != len(requests):
            raise RuntimeError(f"{address} answered {len(answers)} of {len(requests)} requests")
        for index, each in enumerate(answers):
            deliver(index, each)

    def _wait_for_completion(self, address: str, request: Any, until: float) -> Any:
        """``request`` alone as a gRPC call, held by the coordinator while
        its previous transaction completes, answered by ``until`` (the
        coordinator answers :data:`PARK_MARGIN_S` before the call's
        deadline)."""
        answer = self._channels.coordinator(address).AddPartitionsToTxn(
            coordinator_pb2.AddPartitionsToTxnRequest(
                transactions=[request], wait_for_completion=True
            ),
            timeout=max(until - time.monotonic(), 0.0) + PARK_MARGIN_S,
        )
        if answer.error_code != ErrorCode.NONE:
            return answer
        if len(answer.transactions) != 1:
            raise RuntimeError(f"{len(answer.transactions)} answers to one transaction")
        return answer.transactions[0]

    def _link(self, address: str) -> ConcurrentLink | None:
        """The cluster link to the coordinator at ``address`` (its gRPC
        address), None when it has no link address.

        Raises:
            LinkError: the node is stopping.
        """
        link_address = self._link_addresses.get(address)
        if link_address is None:
            return None
        with self._lock:
            if self._closed:
                raise LinkError("the node is stopping")
            link = self._links.get(address)
            if link is None:
                link = self._links[address] = ConcurrentLink(link_address, self._link_tls)
            return link

    def close(self) -> None:
        """Close the links (the node is stopping): calls in flight end at once."""
        with self._lock:
            self._closed = True
            links, self._links = list(self._links.values()), {}
        for link in links:
            link.close()

    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[TopicPartition],
        flush_partitions: Sequence[TopicPartition] = (),
    ) -> dict[TopicPartition, tuple[ErrorCode, str]]:
        """Add ``partitions`` to the producer's transaction (starting it if
        needed); per partition: NONE (in the ongoing transaction now) or why not.
        ``flush_partitions`` (the producer's ``transaction_partitions``, at
        most :data:`MAX_FLUSH_PARTITIONS` of them) are asked for in the
        same add, so that the nodes of one flush send the coordinator the
        same request; the answers are ``partitions``' only.

        Coordinator trouble (no leader, timeouts) answers REQUEST_TIMED_OUT,
        which the producer retries. An add whose producer's previous
        transaction is completing waits for the completion up to
        ``retry_max_s`` in all (Kafka's server-side retry) before
        CONCURRENT_TRANSACTIONS goes to the producer: over a cluster link
        the coordinator parks it that long in the batched call itself. A
        coordinator without a link address answers an add batched with
        others so at once, and one that went alone after
        :data:`SOLE_ADD_WAIT_S`: it is asked again here in a gRPC call of
        its own that waits for the completion (``wait_for_completion``), so
        that it holds up no other transaction and goes on the moment the
        completion applies.
        """
        by_topic: dict[str, list[int]] = {}
        asked = dict.fromkeys([*partitions, *flush_partitions])
        for topic, partition in sorted(asked):
            by_topic.setdefault(topic, []).append(partition)
        request = coordinator_pb2.AddPartitionsToTxnRequest(
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            topics=[common_pb2.TopicPartitions(topic=t, partitions=p) for t, p in by_topic.items()],
        )
        problem = "no coordinator answered"
        retry_until: float | None = None  # set by the first CONCURRENT_TRANSACTIONS
        attempts = 0
        while attempts < 3:
            attempts += 1
            address = self._leader(transactional_id)
            if address is None:
                problem = "no coordinator known for the transactional id"
                break
            try:
                if retry_until is None:
                    answer = self._sender.call(address, request)
                else:
                    answer = self._wait_for_completion(address, request, retry_until)
            except grpc.RpcError as exc:
                self._forget(transactional_id)
                problem = f"coordinator {address}: {exc.code().name}"
                continue
            except LinkError as exc:
                self._forget(transactional_id)
                problem = f"coordinator {address}: {exc}"
                continue
            except RuntimeError as exc:  # an answer that does not match the request
                problem = f"coordinator {address}: {exc}"
                continue
            if answer.error_code in (
                ErrorCode.NOT_COORDINATOR,
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
            ):
                self._forget(transactional_id)
                problem = f"coordinator {address}: {ErrorCode(answer.error_code).name}"
                continue
            if (
                answer.error_code == ErrorCode.CONCURRENT_TRANSACTIONS
                and retry_until is None
                and address not in self._link_addresses
            ):
                retry_until = time.monotonic() + self._retry_max_s
                attempts -= 1  # not a failure of the coordinator
                continue
            if answer.error_code != ErrorCode.NONE:
                code = _produce_code(ErrorCode(answer.error_code))
                final = code if code in _FINAL else ErrorCode.REQUEST_TIMED_OUT
                return {
                    tp: (final, f"adding the partition to the transaction: {answer.error_message}")
                    for tp in partitions
                }
            results: dict[TopicPartition, tuple[ErrorCode, str]] = {}
            for r in answer.results:
                code = ErrorCode(r.error_code)
                message = (
                    "" if code is ErrorCode.NONE else _not_in_transaction(transactional_id, code)
                )
                code = _produce_code(code)
                results[TopicPartition(r.topic, r.partition)] = (
                    code
                    if code in _FINAL or code is ErrorCode.NONE
                    else ErrorCode.REQUEST_TIMED_OUT,
                    message,
                )
            missing = "the coordinator did not answer for this partition"
            return {
                tp: results.get(tp, (ErrorCode.REQUEST_TIMED_OUT, missing)) for tp in partitions
            }
        message = f"cannot add the partition to the transaction: {problem}"
        return {tp: (ErrorCode.REQUEST_TIMED_OUT, message) for tp in partitions}

    def _leader(self, transactional_id: str) -> str | None:
        if self._view.shard_count == 0:
            self._view.refresh()
        if self._view.shard_count == 0:
            return None
        shard = shard_for(transactional_id, self._view.shard_count)
        with self._lock:
            known = self._leaders.get(shard)
        if known is not None:
            return known
        for address in self._addresses:
            try:
                answer = self._channels.coordinator(address).FindCoordinator(
                    coordinator_pb2.FindCoordinatorRequest(
                        key=transactional_id, key_type=coordinator_pb2.TRANSACTION
                    ),
                    timeout=CALL_TIMEOUT_S,
                )
            except grpc.RpcError:
                continue
            if answer.error_code == ErrorCode.NONE and answer.address:
                with self._lock:
                    self._leaders[shard] = answer.address
                return str(answer.address)
        return None

    def _forget(self, transactional_id: str) -> None:
        if self._view.shard_count:
            with self._lock:
                self._leaders.pop(shard_for(transactional_id, self._view.shard_count), None)


def _produce_code(code: ErrorCode) -> ErrorCode:
    """The Produce answer for the coordinator's answer to an add: INVALID_TXN_STATE (the
    partition is not in an ongoing transaction) becomes TRANSACTION_ABORTABLE."""
    return ErrorCode.TRANSACTION_ABORTABLE if code is ErrorCode.INVALID_TXN_STATE else code


def _not_in_transaction(transactional_id: str, code: ErrorCode) -> str:
    if code is ErrorCode.INVALID_TXN_STATE:
        return f"the partition is not in the ongoing transaction of {transactional_id!r}"
    return f"the coordinator of {transactional_id!r} did not add the partition: {code.name}"
