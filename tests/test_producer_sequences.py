"""The idempotent producer's sequence numbers under uncertain outcomes.

A property test over an in-memory transport: every partition lives on its
own fake partition-log node whose appends are decided by the real
:class:`partition_log.producer_state.ProducerStates` (deduplication, epoch
and sequence checks). Each step sends one record and injects faults into the
attempts of the batch that carries it: "lost" (appended, answer lost),
"down" (not appended), an outage (every attempt fails until the batch
expires) or a hold (after the scripted faults, refused until the producer
uses a newer producer id or epoch anywhere). Whatever the schedule, no
record is written twice and every acknowledged record is in the log exactly
once, at its acknowledged offset.

Hypothesis runs derandomized (tests/conftest.py); a failure prints the
schedule and a @reproduce_failure blob that replays it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from partition_log.producer_state import ProducerStates, Verdict
from raftcoord.client import Producer
from raftcoord.client._net import CHANNEL_OPTIONS, client_closed
from raftcoord.client.records import RecordMetadata
from raftcoord.protocol.channels import ChannelCache
from raftcoord.protocol.v1 import coordinator_pb2, partition_log_pb2
from tests.test_client_unit import Done, InjectedTransportError

PARTITIONS = 3
DELIVERY_TIMEOUT_MS = 400
#: Attempts an outage batch gets before the next step is sent (so later
#: batches are created, and expire, later).
OUTAGE_ATTEMPTS = 20
WAIT_S = 10.0


@dataclass
class Plan:
    mode: str  # "faults", "outage" or "hold"
    faults: list[str]


@dataclass
class FlakyLogs:
    """One partition-log node per partition, in memory, with injected faults."""

    plans: dict[bytes, Plan]
    cond: threading.Condition = field(default_factory=threading.Condition)
    states: dict[int, ProducerStates] = field(
        default_factory=lambda: {p: ProducerStates() for p in range(PARTITIONS)}
    )
    logs: dict[int, list[bytes]] = field(default_factory=lambda: {p: [] for p in range(PARTITIONS)})
    attempts: Counter[bytes] = field(default_factory=Counter)
    identities: set[tuple[int, int]] = field(default_factory=set)
    next_pid: int = 1000

    def metadata(self) -> Any:
        return coordinator_pb2.MetadataResponse(
            coordinators=[coordinator_pb2.NodeInfo(node_id=1, address="coordinator")],
            partition_nodes=[
                coordinator_pb2.NodeInfo(node_id=10 + p, address=f"log-{p}")
                for p in range(PARTITIONS)
            ],
            topics=[
                coordinator_pb2.TopicMetadata(
                    name="t",
                    partitions=[
                        coordinator_pb2.PartitionMetadata(partition=p, node_id=10 + p)
                        for p in range(PARTITIONS)
                    ],
                )
            ],
        )

    def init_producer_id(self) -> Any:
        with self.cond:
            self.next_pid += 1
            return coordinator_pb2.InitProducerIdResponse(producer_id=self.next_pid)

    def produce(self, request: Any) -> Done:
        [entry] = request.partitions  # one partition per node
        batch = entry.batch
        first = batch.records[0].value
        identity = (batch.producer_id, batch.producer_epoch)
        with self.cond:
            self.identities.add(identity)
            plan = self.plans[first]
            attempt = self.attempts[first]
            self.attempts[first] += 1
            self.cond.notify_all()
            outcome = self._outcome(plan, attempt, identity)
            if outcome == "down":
                return Done(error=InjectedTransportError())
            answer = self._append(entry)
        if outcome == "lost":
            return Done(error=InjectedTransportError())
        return Done(partition_log_pb2.ProduceResponse(partitions=[answer]))

    def _outcome(self, plan: Plan, attempt: int, identity: tuple[int, int]) -> str:
        if plan.mode == "outage":
            return plan.faults[attempt % len(plan.faults)]
        if attempt < len(plan.faults):
            return plan.faults[attempt]
        if plan.mode == "hold" and not any(i > identity for i in self.identities):
            return "down"
        return "ok"

    def _append(self, entry: Any) -> Any:
        batch, p = entry.batch, entry.partition
        state, log = self.states[p], self.logs[p]
        count = len(batch.records)
        check = state.check_append(
            batch.producer_id, batch.producer_epoch, batch.base_sequence, count, False
        )
        answer = partition_log_pb2.PartitionProduceResponse(
            topic=entry.topic, partition=p, error_code=check.error, base_offset=-1
        )
        if check.verdict is Verdict.DUPLICATE:
            answer.base_offset = check.base_offset
        elif check.verdict is Verdict.APPEND:
            answer.base_offset = base = len(log)
            log.extend(r.value for r in batch.records)
            state.on_append(
                batch.producer_id,
                batch.producer_epoch,
                batch.base_sequence,
                base,
                base + count - 1,
                False,
            )
        return answer

    def _notify(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def wait_for_attempts(self, value: bytes, count: int, future: Future[Any]) -> None:
        """Wait until the batch of ``value`` was tried ``count`` times, or settled."""
        future.add_done_callback(lambda _: self._notify())
        with self.cond:
            tried = self.cond.wait_for(
                lambda: self.attempts[value] >= count or future.done(), WAIT_S
            )
        assert tried, f"record {value!r}: fewer than {count} attempts in {WAIT_S} s"


class FlakyChannels(ChannelCache):
    def __init__(self, logs: FlakyLogs) -> None:
        super().__init__(CHANNEL_OPTIONS, closed_error=client_closed)
        self.logs = logs

    def coordinator(self, address: str) -> Any:
        logs = self.logs

        class Stub:
            def Metadata(self, request: Any, timeout: float) -> Any:
                return logs.metadata()

            def InitProducerId(self, request: Any, timeout: float) -> Any:
                return logs.init_producer_id()

        return Stub()

    def partition_log(self, address: str) -> Any:
        logs = self.logs

        class Produce:
            def future(self, request: Any, timeout: float) -> Done:
                return logs.produce(request)

            def __call__(self, request: Any, timeout: float) -> Any:
                return self.future(request, timeout).result()

        class Stub:
            pass

        stub = Stub()
        stub.Produce = Produce()  # type: ignore[attr-defined]
        return stub


FAULTS = st.lists(st.sampled_from(["lost", "down"]), max_size=3)
STEP = st.tuples(
    st.integers(0, PARTITIONS - 1), st.sampled_from(["faults", "outage", "hold"]), FAULTS
)


@settings(max_examples=25, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=8))
# An outage expires a batch while another partition's batch, written but
# unacknowledged, waits for its retry: the retry must keep its numbers.
@example([(0, "outage", ["down"]), (1, "hold", ["lost"])])
def test_no_record_is_written_twice_and_acknowledged_ones_exactly_once(
    steps: list[tuple[int, str, list[str]]],
) -> None:
    plans = {}
    for i, (_, mode, faults) in enumerate(steps):
        plans[str(i).encode()] = Plan(mode, faults or (["lost"] if mode == "outage" else []))
    logs = FlakyLogs(plans)
    sent: list[tuple[int, bytes, Future[RecordMetadata]]] = []
    with Producer(
        ["coordinator:9092"],
        channels=FlakyChannels(logs),
        linger_ms=0,
        retry_backoff_ms=1,
        retry_backoff_max_ms=5,
        request_timeout_ms=DELIVERY_TIMEOUT_MS // 2,
        delivery_timeout_ms=DELIVERY_TIMEOUT_MS,
    ) as producer:
        for i, (partition, mode, _) in enumerate(steps):
            value = str(i).encode()
            free = all(f.done() for p, _, f in sent if p == partition)
            future = producer.send("t", value, partition=partition)
            sent.append((partition, value, future))
            if free:  # the batch goes at once: let it meet its faults first
                logs.wait_for_attempts(value, OUTAGE_ATTEMPTS if mode == "outage" else 1, future)
        deadline = time.monotonic() + WAIT_S + DELIVERY_TIMEOUT_MS / 1000 * len(steps)
        for _, _, future in sent:
            future.exception(max(0.0, deadline - time.monotonic()))
    for partition, log in logs.logs.items():
        twice = [v for v, n in Counter(log).items() if n > 1]
        assert not twice, f"partition {partition} holds {twice} twice: {log}"
    for partition, value, future in sent:
        if future.exception() is None:
            offset = future.result().offset
            assert logs.logs[partition][offset : offset + 1] == [value]
