"""partition_log.cluster_view.TxnPartitionAdder against a scripted
coordinator stub on a fake clock: CONCURRENT_TRANSACTIONS is asked again
once, alone and waiting for the completion, for ``retry_max_s`` counted
from that answer, however long the call that brought it took; a call of
one transaction waits for the completion a little, one of many does not;
the adds go over the coordinator's link when it has a link address, each
transaction there asking to wait ``retry_max_s`` for a completion."""

from __future__ import annotations

from typing import Any

import pytest

from partition_log import cluster_view
from partition_log.cluster_view import TxnPartitionAdder
from raftcoord.protocol.cluster_link import ADD_PARTITIONS_TO_TXN, ClusterListener, Replies
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.types import TopicPartition
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2

TP = TopicPartition("t", 0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class ScriptedCoordinator:
    """Answers AddPartitionsToTxn with ``answers`` in turn (each after
    ``took_s`` of the fake clock), and FindCoordinator with itself."""

    def __init__(self, clock: FakeClock, answers: list[ErrorCode], took_s: float) -> None:
        self.clock = clock
        self.answers = answers
        self.took_s = took_s
        self.calls = 0
        #: (transactions, wait_for_completion, wait_for_completion_ms,
        #: timeout) of each call.
        self.asked: list[tuple[int, bool, int, float]] = []

    def FindCoordinator(self, request: Any, timeout: float) -> Any:
        return coordinator_pb2.FindCoordinatorResponse(address="coordinator")

    def AddPartitionsToTxn(self, request: Any, timeout: float) -> Any:
        self.asked.append(
            (
                len(request.transactions),
                request.wait_for_completion,
                request.wait_for_completion_ms,
                timeout,
            )
        )
        self.clock.now += self.took_s
        code = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        return coordinator_pb2.AddPartitionsToTxnResponse(
            transactions=[
                coordinator_pb2.AddPartitionsToTxnResponse(
                    error_code=code,
                    results=[
                        common_pb2.PartitionResult(topic=TP[0], partition=TP[1], error_code=code)
                    ],
                )
                for _ in request.transactions
            ]
        )


class Channels:
    def __init__(self, coordinator: ScriptedCoordinator) -> None:
        self.stub = coordinator

    def coordinator(self, address: str) -> ScriptedCoordinator:
        return self.stub


class View:
    shard_count = 1


def adder(
    monkeypatch: pytest.MonkeyPatch,
    answers: list[ErrorCode],
    took_s: float,
    retry_max_s: float = 1.0,
) -> tuple[TxnPartitionAdder, ScriptedCoordinator]:
    clock = FakeClock()
    monkeypatch.setattr(cluster_view, "time", clock)
    coordinator = ScriptedCoordinator(clock, answers, took_s)
    made = TxnPartitionAdder(
        Channels(coordinator),  # type: ignore[arg-type]
        ["coordinator"],
        View(),  # type: ignore[arg-type]
        retry_max_s=retry_max_s,
    )
    return made, coordinator


def test_concurrent_transactions_is_asked_again_from_the_answer_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first answer took longer than the whole retry window.
    made, coordinator = adder(
        monkeypatch, [ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.NONE], took_s=1.0
    )
    assert made.add_partitions("tx", 1, 0, [TP]) == {TP: (ErrorCode.NONE, "")}
    # Went alone, so waited a little (SOLE_ADD_WAIT_S) for the completion;
    # asked again alone, waiting at the coordinator for the whole window
    # (answered PARK_MARGIN_S before the call's deadline).
    sole_wait_ms = round(cluster_view.SOLE_ADD_WAIT_S * 1000)
    assert coordinator.asked == [
        (1, True, sole_wait_ms, cluster_view.CALL_TIMEOUT_S),
        (1, True, 0, 1.0 + cluster_view.PARK_MARGIN_S),
    ]


def test_concurrent_transactions_goes_to_the_producer_after_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made, coordinator = adder(monkeypatch, [ErrorCode.CONCURRENT_TRANSACTIONS], took_s=0.0)
    answer = made.add_partitions("tx", 1, 0, [TP])
    assert answer[TP][0] is ErrorCode.CONCURRENT_TRANSACTIONS
    assert [wait_ms for _, _, wait_ms, _ in coordinator.asked] == [
        round(cluster_view.SOLE_ADD_WAIT_S * 1000),
        0,  # once, then no more
    ]


def test_a_call_of_many_transactions_does_not_wait_for_a_completion(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made, coordinator = adder(monkeypatch, [ErrorCode.NONE], took_s=0.0)
    one = coordinator_pb2.AddPartitionsToTxnRequest(transactional_id="a")
    other = coordinator_pb2.AddPartitionsToTxnRequest(transactional_id="b")
    answered: list[int] = []
    made._send("coordinator", [one, other], lambda index, _answer: answered.append(index))
    assert answered == [0, 1]
    assert coordinator.asked == [(2, False, 0, cluster_view.CALL_TIMEOUT_S)]


def test_without_a_retry_window_a_call_of_one_does_not_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made, coordinator = adder(
        monkeypatch, [ErrorCode.CONCURRENT_TRANSACTIONS], took_s=0.0, retry_max_s=0.0
    )
    answer = made.add_partitions("tx", 1, 0, [TP])
    assert answer[TP][0] is ErrorCode.CONCURRENT_TRANSACTIONS
    assert coordinator.asked[0] == (1, False, 0, cluster_view.CALL_TIMEOUT_S)


class FindOnly(ScriptedCoordinator):
    """A coordinator's gRPC stub that only finds: its adds must go over the link."""

    def AddPartitionsToTxn(self, request: Any, timeout: float) -> Any:
        raise AssertionError("an add over gRPC to a coordinator with a link address")


def test_adds_to_a_coordinator_with_a_link_address_go_over_the_link() -> None:
    """The batched adds go to the coordinator's link listener (a real one on
    loopback); once it is gone, the add fails as any call does (the
    producer's retriable REQUEST_TIMED_OUT naming the coordinator)."""
    answering = ScriptedCoordinator(FakeClock(), [ErrorCode.NONE], took_s=0.0)

    def answer(request: Any, refused: str | None, timeout_s: float, replies: Replies) -> None:
        whole = answering.AddPartitionsToTxn(request, timeout_s)
        for item, each in enumerate(whole.transactions):
            replies.answer(item, lambda each=each: each)

    listener = ClusterListener(
        ("127.0.0.1", 0),
        {ADD_PARTITIONS_TO_TXN: answer},
        tls=None,
        allowed=lambda method, who: True,
        max_connections=4,
        label="coordinator",
    )
    listener.start()
    made = TxnPartitionAdder(
        Channels(FindOnly(FakeClock(), [], took_s=0.0)),  # type: ignore[arg-type]
        ["coordinator"],
        View(),  # type: ignore[arg-type]
        links={"coordinator": f"127.0.0.1:{listener.port}"},
    )
    try:
        assert made.add_partitions("tx", 1, 0, [TP]) == {TP: (ErrorCode.NONE, "")}
        ((count, waits, wait_ms, timeout_s),) = answering.asked
        assert (count, waits, wait_ms) == (1, True, 100)  # retry_max_s, parked at most
        assert cluster_view.CALL_TIMEOUT_S - 0.4 < timeout_s <= cluster_view.CALL_TIMEOUT_S + 0.1
    finally:
        listener.stop()
    code, message = made.add_partitions("tx", 1, 0, [TP])[TP]
    assert code is ErrorCode.REQUEST_TIMED_OUT and "coordinator coordinator" in message
    made.close()
    code, message = made.add_partitions("tx", 1, 0, [TP])[TP]
    assert code is ErrorCode.REQUEST_TIMED_OUT and "stopping" in message
