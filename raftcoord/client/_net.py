"""Networking shared by the producers, the consumer and the admin client:
gRPC channels, deadlines and backoff, coordinator discovery with retries,
and the cluster metadata cache (topic placement and node addresses).

Every gRPC call made here has a deadline. Retries happen inside a
:class:`Deadline`; when it passes, :class:`KafkaTimeoutError` is raised with
the last failure as its cause.
"""

from __future__ import annotations

import itertools
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc

from raftcoord.client.errors import (
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    NotACoordinatorNodeError,
    UnknownTopicOrPartitionError,
    error_for,
)
from raftcoord.client.records import TopicPartition
from raftcoord.protocol.backoff import Backoff
from raftcoord.protocol.channels import CHANNEL_POLICY, ChannelCache
from raftcoord.protocol.errors import REDISCOVER, ErrorCode
from raftcoord.protocol.v1 import (
    coordinator_pb2,
)

#: Longest single attempt of a coordinator call (the server gives up on a
#: Raft commit after 10 s and answers REQUEST_TIMED_OUT).
ATTEMPT_TIMEOUT_S = 12.0
#: Longest single FindCoordinator / Metadata attempt against one node.
LOOKUP_TIMEOUT_S = 2.0

#: How much shorter than the nominal one a retry's delay may be, so clients spread out.
JITTER = 0.2
#: Backoff (first, longest) between retries of CONCURRENT_TRANSACTIONS answers.
CONCURRENT_BACKOFF_S = (0.005, 0.05)


class CallThreads:
    """Unary gRPC calls made in parallel on threads that stay.

    A call's ``future()`` makes gRPC start a thread for its channel whenever
    the channel had no call in flight, and that thread ends with the channel's
    last call: a producer flushing to a few nodes, or a consumer polling them,
    started a thread per node per round trip (a third of the client's CPU per
    flush). Here a blocking call runs on one of up to ``limit`` daemon threads,
    started as needed and kept; when all are busy the call is a ``future()``
    as before, so a slow call never holds up another. :meth:`start` returns
    a future whose ``result()`` is the answer or raises what the call raised
    (a ``grpc.RpcError``; a ``ValueError`` once the channel is closed)."""

    def __init__(self, limit: int, name: str) -> None:
        self._limit = limit
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Any, Any, float] | None] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._closed = False

    def start(self, method: Any, request: Any, timeout: float) -> Any:
        """Begin ``method(request, timeout=timeout)``; returns its future."""
        with self._lock:
            if self._closed or (self._idle == 0 and self._threads >= self._limit):
                return method.future(request, timeout=timeout)
            if self._idle:
                self._idle -= 1
            else:
                self._threads += 1
                threading.Thread(
                    target=self._run, name=f"{self._name}-{self._threads}", daemon=True
                ).start()
        future: Future[Any] = Future()
        self._jobs.put((future, method, request, timeout))
        return future

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, method, request, timeout = job
            if not future.set_running_or_notify_cancel():
                self._free()
                continue
            try:
                answer = method(request, timeout=timeout)
            except BaseException as exc:  # handed to whoever waits on the future
                self._free()
                future.set_exception(exc)
            else:
                self._free()
                future.set_result(answer)

    def _free(self) -> None:
        """This thread takes the next call (counted before the future's
        callbacks run, so that a call they or its waiter start reuses it)."""
        with self._lock:
            self._idle += 1

    def close(self) -> None:
        """Let the threads end once their calls are over (closing the channels
        ends those at once); later calls are futures."""
        with self._lock:
            self._closed = True
            threads = self._threads
        for _ in range(threads):
            self._jobs.put(None)


def concurrent_backoff(initial_s: float, max_s: float) -> Backoff:
    """The backoff after CONCURRENT_TRANSACTIONS: the previous transaction's
    markers are being written (milliseconds), so look again soon; never
    longer than the caller's own backoff (``initial_s``, ``max_s``)."""
    return Backoff(
        min(initial_s, CONCURRENT_BACKOFF_S[0]), min(max_s, CONCURRENT_BACKOFF_S[1]), jitter=JITTER
    )


#: Answers that mean "same coordinator, retry after a backoff".
BACK_OFF = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.CONCURRENT_TRANSACTIONS})

CHANNEL_OPTIONS = [
    *CHANNEL_POLICY,
    # No gRPC size limits on the client's side: a producer bounds its own
    # requests (max_request_size, checked before a record is queued) and a
    # consumer its fetches (fetch_max_bytes), so a transport limit could only
    # turn a legal request or answer into a retried RESOURCE_EXHAUSTED.
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]


def parse_bootstrap(bootstrap: str | Sequence[str]) -> list[str]:
    """The coordinator addresses of ``bootstrap``: a list of "host:port"
    strings or, as Kafka's ``bootstrap.servers``, one comma-separated string
    (duplicates and blanks dropped).

    Raises:
        TypeError: ``bootstrap`` is neither a str nor a sequence of str.
        ValueError: it names no address, or an address is not "host:port"
            with a port in 1..65535 (the message names the address).
    """
    items = [bootstrap] if isinstance(bootstrap, str) else bootstrap
    if not isinstance(items, Sequence) or not all(isinstance(i, str) for i in items):
        raise TypeError(
            "bootstrap must be a str ('host:port,host:port') or a list of str, not "
            f"{type(bootstrap).__name__}"
        )
    addresses = [a.strip() for item in items for a in item.split(",") if a.strip()]
    if not addresses:
        raise ValueError("bootstrap must name at least one coordinator address ('host:port')")
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(
                f"bootstrap address {address!r} is not 'host:port' with a port in 1..65535"
            )
    return list(dict.fromkeys(addresses))


class Deadline:
    """A point in (monotonic) time by which an operation must be done."""

    def __init__(self, timeout_s: float, what: str, clock: Callable[[], float] = time.monotonic):
        self.what = what
        self.timeout_s = timeout_s
        self._clock = clock
        self.at = clock() + timeout_s

    def remaining(self) -> float:
        return max(0.0, self.at - self._clock())

    def expired(self) -> bool:
        return self._clock() >= self.at

    def attempt(self, cap_s: float) -> float:
        """The timeout for one attempt: what is left, at most ``cap_s``, at least 1 ms."""
        return max(0.001, min(cap_s, self.remaining()))

    def timeout_error(self, last: BaseException | None = None) -> KafkaTimeoutError:
        detail = f": last error: {last}" if last is not None else ""
        error = KafkaTimeoutError(f"{self.what} did not complete in {self.timeout_s:.3g} s{detail}")
        error.__cause__ = last
        return error

    def back_off(self, backoff: Backoff, last: BaseException | None = None) -> None:
        """Sleep ``backoff``'s next delay, but never past this deadline.

        Raises:
            KafkaTimeoutError: the deadline has passed (``last`` is its cause).
        """
        if self.expired():
            raise self.timeout_error(last)
        backoff.sleep(self)
        if self.expired():
            raise self.timeout_error(last)


def transport_error(exc: grpc.RpcError, address: str) -> KafkaConnectionError:
    """A gRPC failure as a :class:`KafkaConnectionError` naming the node."""
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    name = code.name if code is not None else "ERROR"
    return KafkaConnectionError(f"{address}: {name}: {details}")


def client_closed() -> KafkaConnectionError:
    """What a closed client's channels raise."""
    return KafkaConnectionError("the client is closed")


def client_channels(
    ssl_cafile: str | None = None,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
) -> ChannelCache:
    """The channels of one client (or of several sharing them): over mutual
    TLS when ``ssl_cafile`` is given (the cluster CA's certificate; the
    client's certificate and key, Kafka's config names), else plaintext.

    Raises:
        ValueError: a certificate or key without the CA, or one without the other.
        OSError: a file cannot be read.
    """
    credentials = None
    if ssl_cafile is None:
        if ssl_certfile is not None or ssl_keyfile is not None:
            raise ValueError("ssl_certfile and ssl_keyfile need ssl_cafile (the cluster's CA)")
    else:
        if (ssl_certfile is None) != (ssl_keyfile is None):
            raise ValueError("give both ssl_certfile and ssl_keyfile, or neither")
        credentials = grpc.ssl_channel_credentials(
            root_certificates=Path(ssl_cafile).read_bytes(),
            private_key=None if ssl_keyfile is None else Path(ssl_keyfile).read_bytes(),
            certificate_chain=None if ssl_certfile is None else Path(ssl_certfile).read_bytes(),
        )
    return ChannelCache(CHANNEL_OPTIONS, closed_error=client_closed, credentials=credentials)


def _top_level_error(response: Any) -> int:
    return int(response.error_code)


class CoordinatorClient:
    """Calls to coordinator nodes: any node (metadata, idempotent producer
    ids) or the shard leader owning a key (FindCoordinator, then the call).

    Discovered coordinators are cached per (key type, key) and forgotten on
    NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, REQUEST_TIMED_OUT and
    transport failures. Until some node has answered once, a round in which
    every address is unreachable (nothing listens there, or something that
    is not a gRPC server) fails at once, naming the addresses: a wrong
    bootstrap list is told in a second, not after the request timeout.
    Thread-safe.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        channels: ChannelCache,
        backoff_initial_s: float = 0.02,
        backoff_max_s: float = 1.0,
    ) -> None:
        self.bootstrap = parse_bootstrap(bootstrap)
        self.channels = channels
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._lock = threading.Lock()
        self._known: list[str] = list(self.bootstrap)
        self._coordinators: dict[tuple[int, str], str] = {}
        self._rotation = itertools.count(random.randrange(len(self.bootstrap)))
        #: Whether some node has answered a call (then failures are retried).
        self.reached = False

    def backoff(self) -> Backoff:
        return Backoff(self.backoff_initial_s, self.backoff_max_s, jitter=JITTER)

    # --- nodes ---------------------------------------------------------------------

    def addresses(self) -> list[str]:
        """Every coordinator address known: the bootstrap list plus those learned
        from Metadata."""
        with self._lock:
            return list(self._known)

    def learn(self, addresses: Iterable[str]) -> None:
        """Remember coordinator addresses from a Metadata answer."""
        with self._lock:
            for address in addresses:
                if address and address not in self._known:
                    self._known.append(address)

    def _next_address(self) -> str:
        with self._lock:
            return self._known[next(self._rotation) % len(self._known)]

    def call_any(self, method: str, request: Any, deadline: Deadline) -> Any:
        """``method`` on any coordinator node, moving on to the next node after a
        transport failure.

        Raises:
            KafkaTimeoutError: no node answered before the deadline.
            NotACoordinatorNodeError: a node does not serve the coordinator
                API (a partition-log node, say): retrying cannot help.
        """
        backoff = self.backoff()
        failures = 0
        unreachable: list[str] = []
        while True:
            address = self._next_address()
            try:
                answer = getattr(self.channels.coordinator(address), method)(
                    request, timeout=deadline.attempt(LOOKUP_TIMEOUT_S)
                )
                self.reached = True
                return answer
            except grpc.RpcError as exc:
                if isinstance(exc, grpc.Call) and exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                    raise NotACoordinatorNodeError(
                        f"{address} is not a coordinator node (it does not serve {method}: "
                        f"{exc.details()}); bootstrap must list coordinator addresses"
                    ) from None
                last = transport_error(exc, address)
                if isinstance(exc, grpc.Call) and exc.code() is grpc.StatusCode.UNAVAILABLE:
                    unreachable.append(address)
            failures += 1
            if failures % len(self.addresses()) == 0:
                if not self.reached and set(unreachable) >= set(self.addresses()):
                    raise KafkaConnectionError(
                        f"no coordinator answers at {', '.join(self.addresses())}: {last}"
                    )
                unreachable.clear()
                deadline.back_off(backoff, last)  # every node failed once: pause
            elif deadline.expired():
                raise deadline.timeout_error(last)

    # --- coordinators --------------------------------------------------------------

    def forget(self, key_type: int, key: str) -> None:
        with self._lock:
            self._coordinators.pop((key_type, key), None)

    def find_coordinator(self, key_type: int, key: str, deadline: Deadline) -> str:
        """The address of the shard leader owning ``key`` (cached).

        Raises:
            KafkaTimeoutError: no node named a leader before the deadline.
            KafkaError: the lookup was refused (for example an empty key).
        """
        with self._lock:
            cached = self._coordinators.get((key_type, key))
        if cached is not None:
            return cached
        request = coordinator_pb2.FindCoordinatorRequest(key=key, key_type=key_type)  # type: ignore[arg-type]
        backoff = self.backoff()
        while True:
            answer = self.call_any("FindCoordinator", request, deadline)
            if answer.error_code == ErrorCode.NONE and answer.address:
                with self._lock:
                    self._coordinators[(key_type, key)] = answer.address
                    if answer.address not in self._known:
                        self._known.append(answer.address)
                return str(answer.address)
            if answer.error_code not in (ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NONE):
                raise error_for(answer.error_code, answer.error_message)
            deadline.back_off(
                backoff, error_for(ErrorCode.COORDINATOR_NOT_AVAILABLE, answer.error_message)
            )

    def call(
        self,
        key_type: int,
        key: str,
        method: str,
        request: Any,
        deadline: Deadline,
        error_of: Callable[[Any], int] = _top_level_error,
        retry: frozenset[int] = BACK_OFF,
    ) -> Any:
        """``method`` on the coordinator of ``key``, until an answer that is not
        retriable (success or a final error, which the caller interprets).

        Rediscovers the coordinator on REDISCOVER answers and transport
        failures; backs off and retries on ``retry`` answers.

        Raises:
            KafkaTimeoutError: the deadline passed (the last failure is its
                cause; ``outcome_unknown`` False when every attempt was refused).
        """
        backoff = self.backoff()
        # CONCURRENT_TRANSACTIONS usually means "the previous transaction's
        # markers are being written" (milliseconds): look again soon.
        concurrent = concurrent_backoff(self.backoff_initial_s, self.backoff_max_s)
        unanswered = False  # an attempt that may have been applied, its answer lost
        try:
            while True:
                address = self.find_coordinator(key_type, key, deadline)
                last: KafkaError
                try:
                    answer = getattr(self.channels.coordinator(address), method)(
                        request, timeout=deadline.attempt(ATTEMPT_TIMEOUT_S)
                    )
                except grpc.RpcError as exc:
                    unanswered = True
                    last = transport_error(exc, address)
                    self.forget(key_type, key)
                else:
                    code = error_of(answer)
                    if code in REDISCOVER:
                        self.forget(key_type, key)
                    elif code not in retry:
                        return answer
                    # Answers whose error is per entry (DescribeTransactions,
                    # DescribeGroups) have no top-level message.
                    last = error_for(code, getattr(answer, "error_message", "") or method)
                    if code == ErrorCode.CONCURRENT_TRANSACTIONS:
                        deadline.back_off(concurrent, last)
                        continue
                deadline.back_off(backoff, last)
        except KafkaTimeoutError as exc:
            exc.outcome_unknown = unanswered
            raise


class MetadataCache:
    """Topic placement (partition -> partition-log node) and node addresses,
    from the coordinators' Metadata RPC. Thread-safe.

    Only topics the client asked about are fetched; a refresh asks for all of
    them at once. Refreshes are rate-limited to one per ``min_refresh_s``.
    """

    def __init__(self, coordinators: CoordinatorClient, min_refresh_s: float = 0.05) -> None:
        self._coordinators = coordinators
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._topics: dict[str, list[int]] = {}
        #: Topic -> each partition's leader epoch (None: not known).
        self._leader_epochs: dict[str, list[int | None]] = {}
        #: Topics the last answer said do not exist.
        self._missing: set[str] = set()
        self._nodes: dict[int, str] = {}
        self._wanted: set[str] = set()
        self._stale = False
        self._last_refresh = -1e9
        self.min_refresh_s = min_refresh_s

    def refresh(self, deadline: Deadline, topics: Iterable[str] = ()) -> None:
        """Fetch the placement of every wanted topic (plus ``topics``) now.

        Raises:
            KafkaTimeoutError: no coordinator answered in time.
        """
        with self._lock:
            self._wanted.update(topics)
            wanted = sorted(self._wanted)
        with self._refresh_lock:
            # With nothing wanted yet, the empty list asks for every topic.
            request = coordinator_pb2.MetadataRequest(topics=wanted)
            answer = self._coordinators.call_any("Metadata", request, deadline)
            self._apply(answer)

    def _apply(self, answer: Any) -> None:
        self._coordinators.learn(n.address for n in answer.coordinators)
        with self._lock:
            self._nodes = {n.node_id: n.address for n in answer.partition_nodes}
            for topic in answer.topics:
                if topic.error_code == ErrorCode.NONE:
                    placement = [-1] * len(topic.partitions)
                    epochs: list[int | None] = [None] * len(topic.partitions)
                    for p in topic.partitions:
                        if 0 <= p.partition < len(placement):
                            placement[p.partition] = (
                                p.node_id if p.error_code == ErrorCode.NONE else -1
                            )
                            epochs[p.partition] = p.leader_epoch
                    known = self._leader_epochs.get(topic.name)
                    if known is not None and len(known) == len(epochs):
                        # A coordinator whose replica lags may answer an older
                        # leader: keep the newer one (leader epochs only grow).
                        before = self._topics[topic.name]
                        for i, (old, new) in enumerate(zip(known, epochs, strict=True)):
                            if old is not None and new is not None and new < old:
                                placement[i], epochs[i] = before[i], old
                    self._topics[topic.name] = placement
                    self._leader_epochs[topic.name] = epochs
                    self._missing.discard(topic.name)
                else:
                    self._topics.pop(topic.name, None)
                    self._leader_epochs.pop(topic.name, None)
                    if topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                        self._missing.add(topic.name)
            self._stale = False
            self._last_refresh = time.monotonic()

    def request_update(self) -> None:
        """Mark the cache stale (a node said it does not own a partition, or failed)."""
        with self._lock:
            self._stale = True

    def maybe_refresh(self, deadline: Deadline) -> bool:
        """Refresh if stale and the last refresh is older than ``min_refresh_s``.

        Returns:
            Whether a refresh happened (failures are swallowed: a stale cache
            is retried on the next call).
        """
        with self._lock:
            due = self._stale and time.monotonic() - self._last_refresh >= self.min_refresh_s
        if not due:
            return False
        try:
            self.refresh(deadline)
        except KafkaError:
            with self._lock:
                self._last_refresh = time.monotonic()
            return False
        return True

    def partition_count(self, topic: str) -> int | None:
        """The number of partitions of ``topic``, or None when it is not known."""
        with self._lock:
            placement = self._topics.get(topic)
            return None if placement is None else len(placement)

    def wait_for_topic(self, topic: str, deadline: Deadline) -> int:
        """The partition count of ``topic``, fetching metadata until it is known
        (as Kafka's producer, a topic that does not exist yet is waited for).

        Raises:
            KafkaTimeoutError: the topic did not appear before the deadline
                (the message names it), or no coordinator answered at all
                (the message names the last failure).
        """
        with self._lock:
            self._wanted.add(topic)
        count = self.partition_count(topic)
        backoff = Backoff(0.05, 1.0, jitter=JITTER)
        answered = False
        while count is None:
            try:
                self.refresh(deadline)
            except KafkaTimeoutError:
                if not answered:
                    raise
            else:
                answered = True
            count = self.partition_count(topic)
            if count is None:
                if deadline.expired():
                    raise KafkaTimeoutError(
                        f"topic {topic!r} not present in metadata after "
                        f"{deadline.timeout_s * 1000:.0f} ms"
                    )
                backoff.sleep(deadline)
        return count

    def check_exists(self, tp: TopicPartition, deadline: Deadline) -> None:
        """Fetch ``tp``'s topic once unless known, then raise if the metadata
        says the partition does not exist.

        Raises:
            UnknownTopicOrPartitionError: the topic does not exist, or has no
                such partition (the message names it).
            KafkaTimeoutError: no coordinator answered in time.
        """
        if self.partition_count(tp.topic) is None:
            self.refresh(deadline, [tp.topic])
        with self._lock:
            missing = tp.topic in self._missing
            placement = self._topics.get(tp.topic)
        if missing:
            raise UnknownTopicOrPartitionError(f"topic {tp.topic!r} does not exist")
        if placement is not None and not 0 <= tp.partition < len(placement):
            raise UnknownTopicOrPartitionError(
                f"{tp.topic}-{tp.partition} does not exist: topic {tp.topic!r} has "
                f"partitions 0..{len(placement) - 1}"
            )

    def leader(self, tp: TopicPartition) -> str | None:
        """The address of the node owning ``tp``, or None (unknown: refresh)."""
        with self._lock:
            placement = self._topics.get(tp.topic)
            if placement is None:
                self._wanted.add(tp.topic)
                self._stale = True
                return None
            if not 0 <= tp.partition < len(placement):
                self._stale = True
                return None
            address = self._nodes.get(placement[tp.partition])
            if address is None:
                self._stale = True
            return address

    def leader_epoch(self, tp: TopicPartition) -> int | None:
        """The leader epoch ``tp``'s leader leads at, as last refreshed
        (requests name it; a node with another refuses them); None: unknown."""
        with self._lock:
            epochs = self._leader_epochs.get(tp.topic, ())
            return epochs[tp.partition] if 0 <= tp.partition < len(epochs) else None

    def topics(self) -> dict[str, int]:
        """Known topic -> partition count."""
        with self._lock:
            return {name: len(p) for name, p in sorted(self._topics.items())}
