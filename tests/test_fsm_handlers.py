"""Scenario tests of the transaction handlers (Kafka semantics, KIP-360, KIP-890)."""

from __future__ import annotations

import pytest

from fsm import (
    AddPartitions,
    CreateTopic,
    EndTxn,
    FsmConfig,
    GroupMarker,
    InitProducerId,
    MarkersWritten,
    OffsetCommit,
    OffsetEntry,
    ProducerFenced,
    TxnState,
    WriteMarkers,
)
from fsm.errors import ErrorCode
from fsm.partitions import single_replica_topic
from fsm.transactions import verify_group
from tests.fsm_driver import Leader


def markers_of(outcome_effects: tuple[object, ...]) -> WriteMarkers:
    (markers,) = [e for e in outcome_effects if isinstance(e, WriteMarkers)]
    return markers


def test_commit_across_partitions_and_group_offsets() -> None:
    leader = Leader.new()
    init = leader.init("tx")
    assert init.ok and init.producer_epoch == 0
    pid = init.producer_id
    assert leader.add("tx", pid, 0, ("a", 0), ("b", 1)).ok
    assert leader.add("tx", pid, 0, ("a", 0)).ok  # idempotent
    assert leader.add_offsets("tx", pid, 0, "g").ok
    assert leader.offsets("g", "tx", pid, 0, ("in", 0, 42)).ok
    [unstable] = leader.machine.offset_fetch("g", [("in", 0)])
    assert unstable.error is ErrorCode.UNSTABLE_OFFSET_COMMIT
    [plain] = leader.machine.offset_fetch("g", [("in", 0)], require_stable=False)
    assert (plain.error, plain.offset) == (ErrorCode.NONE, -1)

    end = leader.end("tx", pid, 0, commit=True)
    assert end.ok and (end.producer_id, end.producer_epoch) == (pid, 1)
    markers = markers_of(end.effects)
    assert markers.commit and markers.producer_epoch == 1  # strictly above the data epoch 0
    assert markers.partitions == (("a", 0), ("b", 1)) and markers.groups == ("g",)
    assert leader.machine.pending_markers() == [markers]
    assert leader.machine.describe("tx").state is TxnState.PREPARE_COMMIT  # type: ignore[union-attr]

    for outcome in leader.deliver(markers):
        assert outcome.ok
    meta = leader.machine.describe("tx")
    assert meta is not None and meta.state is TxnState.COMPLETE_COMMIT and not meta.has_participants
    [stable] = leader.machine.offset_fetch("g", [("in", 0)])
    assert (stable.error, stable.offset) == (ErrorCode.NONE, 42)
    assert leader.machine.pending_markers() == []
    # The next transaction uses the bumped epoch.
    assert leader.add("tx", pid, 1, ("a", 0)).ok
    assert leader.add("tx", pid, 0, ("a", 0)).error is ErrorCode.PRODUCER_FENCED


def test_markers_acknowledged_in_parts() -> None:
    leader = Leader.new()
    pid = leader.init("tx").producer_id
    leader.add("tx", pid, 0, ("a", 0), ("b", 0))
    markers = markers_of(leader.end("tx", pid, 0, commit=False).effects)
    assert not markers.commit
    half = leader.apply(MarkersWritten("tx", pid, 1, (("a", 0),), (), leader.now_ms))
    assert half.ok and leader.machine.describe("tx").state is TxnState.PREPARE_ABORT  # type: ignore[union-attr]
    # A repeated acknowledgement is a no-op; a stale identity is refused.
    assert leader.apply(MarkersWritten("tx", pid, 1, (("a", 0),), (), leader.now_ms)).ok
    stale = leader.apply(MarkersWritten("tx", pid, 0, (("b", 0),), (), leader.now_ms))
    assert stale.error is ErrorCode.INVALID_TXN_STATE
    done = leader.apply(MarkersWritten("tx", pid, 1, (("b", 0),), (), leader.now_ms))
    assert done.ok and leader.machine.describe("tx").state is TxnState.COMPLETE_ABORT  # type: ignore[union-attr]


def test_zombie_is_fenced_and_its_open_transaction_aborted() -> None:
    leader = Leader.new()
    old = leader.init("tx")
    pid = old.producer_id
    leader.add("tx", pid, 0, ("a", 0))
    leader.tick()
    second = leader.init("tx")  # a new instance with the same transactional.id
    assert second.error is ErrorCode.CONCURRENT_TRANSACTIONS
    fenced = [e for e in second.effects if isinstance(e, ProducerFenced)]
    assert fenced and (fenced[0].old_epoch, fenced[0].new_epoch) == (0, 1)
    markers = markers_of(second.effects)
    assert not markers.commit and markers.producer_epoch == 1
    # The zombie can neither commit nor add.
    assert leader.end("tx", pid, 0, commit=True).error is ErrorCode.PRODUCER_FENCED
    assert leader.add("tx", pid, 0, ("b", 0)).error is ErrorCode.PRODUCER_FENCED
    leader.deliver_all()
    assert leader.add("tx", pid, 0, ("b", 0)).error is ErrorCode.PRODUCER_FENCED
    assert leader.end("tx", pid, 0, commit=True).error is ErrorCode.PRODUCER_FENCED
    retry = leader.init("tx")
    assert retry.ok and (retry.producer_id, retry.producer_epoch) == (pid, 2)


def test_kip360_recovery_with_expected_id_and_epoch() -> None:
    leader = Leader.new()
    first = leader.init("tx")
    pid = first.producer_id
    bumped = leader.init("tx", expected=(pid, 0))
    assert bumped.ok and bumped.producer_epoch == 1
    # A retry of that same request (response lost) gets the same answer, no second bump.
    again = leader.init("tx", expected=(pid, 0))
    assert again.ok and again.producer_epoch == 1
    assert leader.machine.describe("tx").producer_epoch == 1  # type: ignore[union-attr]
    assert leader.init("tx", expected=(pid, 5)).error is ErrorCode.PRODUCER_FENCED
    assert leader.init("tx", expected=(pid + 77, 1)).error is ErrorCode.PRODUCER_FENCED
    before = leader.machine.snapshot()
    half = leader.apply(InitProducerId("tx", 1000, leader.now_ms, 1, -1, pid, -1))
    assert half.error is ErrorCode.INVALID_REQUEST and leader.machine.snapshot() == before


def test_epoch_exhaustion_rotates_on_init() -> None:
    leader = Leader.new(FsmConfig(max_producer_epoch=4))
    pid = leader.init("tx").producer_id
    epochs = [leader.init("tx").producer_epoch for _ in range(2)]
    assert epochs == [1, 2]  # 3 = max - 1 is exhausted: never handed out
    rotated = leader.init("tx")
    assert rotated.ok and rotated.producer_id != pid and rotated.producer_epoch == 0
    meta = leader.machine.describe("tx")
    assert meta is not None and (meta.last_producer_id, meta.last_producer_epoch) == (pid, 2)
    # KIP-360: the old producer retrying with its last epoch gets the new id.
    retry = leader.init("tx", expected=(pid, 2))
    assert retry.ok and (retry.producer_id, retry.producer_epoch) == (rotated.producer_id, 0)


def test_epoch_exhaustion_rotates_on_end_txn() -> None:
    leader = Leader.new(FsmConfig(max_producer_epoch=4))
    pid = leader.init("tx").producer_id
    leader.init("tx")  # epoch 1
    leader.add("tx", pid, 1, ("a", 0))
    end = leader.end("tx", pid, 1, commit=True)  # marker epoch 2 = max - 2: no rotation
    assert end.ok and (end.producer_id, end.producer_epoch) == (pid, 2)
    leader.deliver_all()
    leader.add("tx", pid, 2, ("a", 0))
    end = leader.end("tx", pid, 2, commit=True)  # next epoch 3 is exhausted: rotate
    new_pid = end.producer_id
    assert end.ok and new_pid != pid and end.producer_epoch == 0
    markers = markers_of(end.effects)
    assert (markers.producer_id, markers.producer_epoch) == (pid, 3)
    # While the markers are written, the new identity is told to wait.
    assert leader.add("tx", new_pid, 0, ("a", 0)).error is ErrorCode.CONCURRENT_TRANSACTIONS
    leader.deliver_all()
    retry = leader.end("tx", pid, 2, commit=True)
    assert retry.ok and (retry.producer_id, retry.producer_epoch) == (new_pid, 0)
    assert leader.add("tx", new_pid, 0, ("a", 0)).ok


def test_an_exhausted_epoch_is_never_handed_out_nor_accepted() -> None:
    """A timeout fence can leave an id at an exhausted epoch (max - 1): a raw
    request with that epoch must not open a transaction there, because the
    next fence would need an epoch beyond the largest."""
    config = FsmConfig(max_producer_epoch=6)
    leader = Leader.new(config)
    pid = leader.init("tx", timeout_ms=1_000).producer_id
    handed_out = [leader.init("tx", timeout_ms=1_000) for _ in range(5)]
    assert all(not config.epoch_exhausted(o.producer_epoch) for o in handed_out)
    assert [o.producer_epoch for o in handed_out] == [1, 2, 3, 4, 0]  # 5 would be exhausted
    pid = handed_out[-1].producer_id
    for _ in range(4):
        leader.init("tx", timeout_ms=1_000)
    assert leader.machine.describe("tx").producer_epoch == 4  # type: ignore[union-attr]
    assert leader.add("tx", pid, 4, ("a", 0)).ok
    leader.tick(1_001)
    [aborted] = leader.sweep_timeouts()
    assert aborted.ok and markers_of(aborted.effects).producer_epoch == 5
    leader.deliver_all()
    meta = leader.machine.describe("tx")
    assert meta is not None and (meta.state, meta.producer_epoch) == (TxnState.COMPLETE_ABORT, 5)
    before = leader.machine.snapshot()
    for refused in (
        leader.add("tx", pid, 5, ("a", 0)),
        leader.add_offsets("tx", pid, 5, "g"),
        leader.end("tx", pid, 5, commit=True),
        leader.end("tx", pid, 5, commit=False),
    ):
        assert refused.error is ErrorCode.PRODUCER_FENCED and "exhausted" in refused.message
    assert leader.machine.snapshot() == before
    # The fenced producer cannot recover its epoch; a new instance can, on a new id.
    assert leader.init("tx", timeout_ms=1_000, expected=(pid, 4)).error is ErrorCode.PRODUCER_FENCED
    fresh = leader.init("tx", timeout_ms=1_000)
    assert fresh.ok and fresh.producer_id != pid and fresh.producer_epoch == 0
    assert leader.add("tx", fresh.producer_id, 0, ("a", 0)).ok
    assert leader.end("tx", fresh.producer_id, 0, commit=True).ok


def test_next_transaction_waits_while_the_previous_markers_are_written() -> None:
    """EndTxn with the identity the last EndTxn answered belongs to the next
    transaction: while the previous one is in PrepareCommit it must wait
    (CONCURRENT_TRANSACTIONS), not be judged against the previous decision."""
    leader = Leader.new()
    pid = leader.init("tx").producer_id
    leader.add("tx", pid, 0, ("a", 0))
    assert leader.end("tx", pid, 0, commit=True).producer_epoch == 1  # N: PrepareCommit
    before = leader.machine.snapshot()
    assert leader.add("tx", pid, 1, ("b", 0)).error is ErrorCode.CONCURRENT_TRANSACTIONS  # N + 1
    assert leader.end("tx", pid, 1, commit=False).error is ErrorCode.CONCURRENT_TRANSACTIONS
    assert leader.end("tx", pid, 1, commit=True).error is ErrorCode.CONCURRENT_TRANSACTIONS
    # A retry of N's own EndTxn with the other decision is a real conflict.
    assert leader.end("tx", pid, 0, commit=False).error is ErrorCode.INVALID_TXN_STATE
    assert leader.machine.snapshot() == before
    leader.deliver_all()
    meta = leader.machine.describe("tx")
    assert meta is not None and meta.state is TxnState.COMPLETE_COMMIT  # N stayed committed
    abort = leader.end("tx", pid, 1, commit=False)  # N + 1, empty, aborts
    assert abort.ok and (abort.producer_id, abort.producer_epoch) == (pid, 2)


def test_end_txn_without_a_stamped_id_when_rotation_is_due() -> None:
    leader = Leader.new(FsmConfig(max_producer_epoch=2))
    pid = leader.init("tx").producer_id
    leader.add("tx", pid, 0, ("a", 0))
    assert leader.machine.needs_new_producer_id(EndTxn("tx", pid, 0, True, 0, 1))
    before = leader.machine.snapshot()
    outcome = leader.apply(EndTxn("tx", pid, 0, True, leader.now_ms, 1))
    assert (
        outcome.error is ErrorCode.CONCURRENT_TRANSACTIONS and leader.machine.snapshot() == before
    )


def test_a_fresh_producer_id_is_stamped_only_where_the_handler_takes_it() -> None:
    leader = Leader.new(FsmConfig(max_producer_epoch=3))  # epochs 0 and 1 start transactions
    needs = leader.machine.needs_new_producer_id
    assert needs(InitProducerId("tx", 60_000, 0, 1))  # a new id
    pid = leader.init("tx").producer_id
    assert not needs(InitProducerId("tx", 60_000, 0, 1))  # epoch 0 -> 1
    assert leader.init("tx").producer_epoch == 1
    assert not needs(EndTxn("tx", pid, 1, True, 0, 1))  # nothing to commit: refused
    assert not needs(EndTxn("tx", pid + 1, 1, False, 0, 1))  # another producer: fenced
    leader.add("tx", pid, 1, ("a", 0))
    assert needs(EndTxn("tx", pid, 1, False, 0, 1))  # its markers take epoch 2: rotates
    # Ongoing: InitProducerId fences and aborts with an epoch bump, no new id.
    assert not needs(InitProducerId("tx", 60_000, 0, 1))
    assert not needs(InitProducerId("tx", -1, 0, 1))  # a bad timeout is refused


def test_timeout_abort_fences_the_producer() -> None:
    leader = Leader.new()
    pid = leader.init("tx", timeout_ms=5_000).producer_id
    leader.add("tx", pid, 0, ("a", 0))
    leader.tick(5_000)
    assert leader.sweep_timeouts() == []  # exactly at the timeout: not yet
    leader.tick(1)
    [aborted] = leader.sweep_timeouts()
    assert aborted.ok
    assert [e.reason for e in aborted.effects if isinstance(e, ProducerFenced)] == ["timeout"]
    assert markers_of(aborted.effects).producer_epoch == 1
    leader.deliver_all()
    assert leader.machine.describe("tx").state is TxnState.COMPLETE_ABORT  # type: ignore[union-attr]
    # The zombie learns it was fenced, not that its retry succeeded.
    assert leader.end("tx", pid, 0, commit=True).error is ErrorCode.PRODUCER_FENCED
    assert leader.end("tx", pid, 0, commit=False).error is ErrorCode.PRODUCER_FENCED
    assert leader.add("tx", pid, 0, ("a", 0)).error is ErrorCode.PRODUCER_FENCED


def test_stale_timeout_abort_changes_nothing() -> None:
    leader = Leader.new()
    pid = leader.init("tx", timeout_ms=5_000).producer_id
    leader.add("tx", pid, 0, ("a", 0))
    leader.tick(10_000)
    [candidate] = leader.machine.timed_out(leader.now_ms)
    leader.end("tx", pid, 0, commit=True)  # the producer won the race
    before = leader.machine.snapshot()
    late = leader.apply(candidate)
    assert late.error is ErrorCode.PRODUCER_FENCED and leader.machine.snapshot() == before


def test_transactional_id_expiration() -> None:
    leader = Leader.new(FsmConfig(transactional_id_expiration_ms=1_000))
    idle_pid = leader.init("idle").producer_id
    busy_pid = leader.init("busy").producer_id
    leader.add("busy", busy_pid, 0, ("a", 0))
    leader.tick(999)
    assert leader.machine.expirable_ids(leader.now_ms) == []
    leader.tick(1)
    assert leader.machine.expirable_ids(leader.now_ms) == ["idle"]
    outcome = leader.expire()
    assert outcome.expired == ("idle",)
    assert [(e.from_state, e.to_state) for e in outcome.effects] == [
        (TxnState.EMPTY, TxnState.DEAD)
    ]
    assert leader.machine.describe("idle") is None and leader.machine.describe("busy")
    # The id starts over with a fresh producer id; the old one is never reused.
    again = leader.init("idle")
    assert again.ok and again.producer_id > busy_pid > idle_pid


def test_duplicate_marker_never_closes_the_next_transactions_offsets() -> None:
    leader = Leader.new()
    pid = leader.init("tx").producer_id
    leader.add_offsets("tx", pid, 0, "g")
    leader.offsets("g", "tx", pid, 0, ("in", 0, 10))
    first = markers_of(leader.end("tx", pid, 0, commit=True).effects)
    leader.deliver(first)
    # Next transaction (epoch 1) commits offsets, then aborts; a late copy of
    # the first transaction's COMMIT marker (epoch 1) arrives in between.
    leader.add_offsets("tx", pid, 1, "g")
    leader.offsets("g", "tx", pid, 1, ("in", 0, 20))
    assert leader.apply(GroupMarker("g", pid, 1, True, leader.now_ms)).ok
    [pending] = leader.machine.offset_fetch("g", [("in", 0)])
    assert pending.error is ErrorCode.UNSTABLE_OFFSET_COMMIT
    second = markers_of(leader.end("tx", pid, 1, commit=False).effects)
    leader.deliver(second)
    [fetched] = leader.machine.offset_fetch("g", [("in", 0)])
    assert (fetched.error, fetched.offset) == (ErrorCode.NONE, 10)  # the aborted 20 was dropped
    # A zombie offset commit with an old epoch is fenced.
    assert leader.offsets("g", "tx", pid, 1, ("in", 0, 99)).error is ErrorCode.PRODUCER_FENCED


def test_plain_offset_commit_and_fetch_all() -> None:
    leader = Leader.new()
    commit = OffsetCommit("g", (OffsetEntry("in", 0, 5, "m"), OffsetEntry("in", 1, 7, "")), 1)
    assert leader.apply(commit).ok
    fetched = leader.machine.offset_fetch("g")
    assert [(f.topic, f.partition, f.offset, f.metadata) for f in fetched] == [
        ("in", 0, 5, "m"),
        ("in", 1, 7, ""),
    ]
    assert [f.offset for f in leader.machine.offset_fetch("other", [("in", 0)])] == [-1]


@pytest.mark.parametrize(
    ("command", "error"),
    [
        (InitProducerId("", 1000, 1, 1), ErrorCode.INVALID_REQUEST),
        (InitProducerId("tx", 0, 1, 1), ErrorCode.INVALID_TRANSACTION_TIMEOUT),
        (InitProducerId("tx", -5, 1, 1), ErrorCode.INVALID_TRANSACTION_TIMEOUT),
        (InitProducerId("tx", 900_001, 1, 1), ErrorCode.INVALID_TRANSACTION_TIMEOUT),
        (AddPartitions("tx", 0, 0, (), 1, 1), ErrorCode.INVALID_REQUEST),
        (AddPartitions("tx", 0, 0, (("", 0),), 1, 1), ErrorCode.INVALID_REQUEST),
        (AddPartitions("tx", 0, 0, (("a", -1),), 1, 1), ErrorCode.INVALID_REQUEST),
        (
            AddPartitions("tx", 0, 0, tuple(("a", i) for i in range(10_001)), 1, 1),
            ErrorCode.INVALID_REQUEST,
        ),
        (AddPartitions("unknown", 0, 0, (("a", 0),), 1, 1), ErrorCode.INVALID_PRODUCER_ID_MAPPING),
        (EndTxn("unknown", 0, 0, True, 1, 1), ErrorCode.INVALID_PRODUCER_ID_MAPPING),
        (OffsetCommit("g", (OffsetEntry("in", 0, -1, ""),), 1), ErrorCode.INVALID_REQUEST),
        (OffsetCommit("", (OffsetEntry("in", 0, 1, ""),), 1), ErrorCode.INVALID_REQUEST),
        (GroupMarker("g", -1, 0, True, 1), ErrorCode.INVALID_REQUEST),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(command: object, error: ErrorCode) -> None:
    leader = Leader.new()
    pid = leader.init("tx").producer_id
    leader.add("tx", pid, 0, ("a", 0))
    before = leader.machine.snapshot()
    outcome = leader.machine.apply(command)  # type: ignore[arg-type]
    assert outcome.error is error
    assert outcome.message
    assert leader.machine.snapshot() == before


def test_list_and_describe() -> None:
    leader = Leader.new()
    a = leader.init("a").producer_id
    b = leader.init("b").producer_id
    leader.add("a", a, 0, ("t", 0))
    leader.tick(500)
    rows = leader.machine.list_transactions(leader.now_ms)
    assert [(r.transactional_id, r.state, r.duration_ms) for r in rows] == [
        ("a", TxnState.ONGOING, 500),
        ("b", TxnState.EMPTY, -1),
    ]
    assert [
        r.transactional_id
        for r in leader.machine.list_transactions(leader.now_ms, states=[TxnState.EMPTY])
    ] == ["b"]
    assert [
        r.transactional_id
        for r in leader.machine.list_transactions(leader.now_ms, producer_ids=[b])
    ] == ["b"]
    assert [
        r.transactional_id
        for r in leader.machine.list_transactions(leader.now_ms, min_duration_ms=499)
    ] == ["a"]
    assert leader.machine.list_transactions(leader.now_ms, min_duration_ms=500) == []
    assert leader.machine.describe("nope") is None


def test_fenced_epoch_is_never_taken_for_a_retry() -> None:
    leader = Leader.new()
    pid = leader.init("tx", timeout_ms=1_000).producer_id
    leader.add("tx", pid, 0, ("a", 0))
    leader.end("tx", pid, 0, commit=True)  # epoch 0 ended: (pid, 0) is the retry identity
    leader.deliver_all()
    leader.add("tx", pid, 1, ("a", 0))
    leader.tick(2_000)
    [aborted] = leader.sweep_timeouts()
    assert aborted.ok
    leader.deliver_all()
    # A late retry of the first transaction's EndTxn no longer passes for a retry.
    assert leader.end("tx", pid, 0, commit=True).error is ErrorCode.PRODUCER_FENCED
    assert leader.end("tx", pid, 1, commit=True).error is ErrorCode.PRODUCER_FENCED


def test_create_topic() -> None:
    leader = Leader.new()
    assert leader.apply(CreateTopic("orders", (1, 2, 3), leader.now_ms)).ok
    assert leader.machine.state.topics == {"orders": single_replica_topic((1, 2, 3))}
    before = leader.machine.snapshot()
    for command, error in [
        (CreateTopic("orders", (1,), 0), ErrorCode.TOPIC_ALREADY_EXISTS),
        (CreateTopic("", (1,), 0), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (CreateTopic("bad/name", (1,), 0), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (CreateTopic("..", (1,), 0), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (CreateTopic("x" * 250, (1,), 0), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (CreateTopic("empty", (), 0), ErrorCode.INVALID_PARTITIONS),
        (CreateTopic("r", (1, 2), 0, ((1, 2), (2,))), ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        (CreateTopic("r", (1,), 0, ((1, 1),)), ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        (CreateTopic("r", (1,), 0, ((2, 1),)), ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        (CreateTopic("r", (1,), 0, ((1, 2),), 3), ErrorCode.INVALID_CONFIG),
        (CreateTopic("r", (1,), 0, ((1, 2),), 0), ErrorCode.INVALID_CONFIG),
    ]:
        assert leader.apply(command).error is error, command
    assert leader.machine.snapshot() == before


def test_offsets_verification_asks_for_the_group_in_the_ongoing_transaction() -> None:
    leader = Leader.new()
    pid = leader.init("tx").producer_id
    describe = leader.machine.describe

    def verdict(producer_id: int, epoch: int, group: str, tid: str = "tx") -> ErrorCode:
        return verify_group(describe(tid), producer_id, epoch, group)[0]

    assert verdict(pid, 0, "g") is ErrorCode.INVALID_TXN_STATE  # no transaction yet
    assert leader.add_offsets("tx", pid, 0, "g").ok
    assert verdict(pid, 0, "g") is ErrorCode.NONE
    assert verdict(pid, 0, "other") is ErrorCode.INVALID_TXN_STATE  # never added
    assert verdict(pid + 1, 0, "g") is ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert verdict(pid, 0, "g", tid="unknown") is ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert verdict(pid, 1, "g") is ErrorCode.PRODUCER_FENCED  # not the current epoch
    assert leader.end("tx", pid, 0, commit=True).ok
    assert verdict(pid, 0, "g") is ErrorCode.PRODUCER_FENCED  # the epoch moved on
    assert verdict(pid, 1, "g") is ErrorCode.INVALID_TXN_STATE  # PrepareCommit: not ongoing
