"""Two-phase commit for external transaction managers (KIP-939) in the pure
state machine: transactions that never time out, and a transaction kept
open by the next producer's InitProducerId for it to commit or abort."""

from __future__ import annotations

from fsm import (
    EndTxn,
    FsmConfig,
    InitProducerId,
    ProducerFenced,
    TransactionMetadata,
    TxnState,
    WriteMarkers,
)
from fsm.errors import ErrorCode
from fsm.transactions import KEPT_REFUSAL, verify_group, verify_ongoing
from tests.fsm_driver import Leader


def markers_of(effects: tuple[object, ...]) -> WriteMarkers:
    (markers,) = [e for e in effects if isinstance(e, WriteMarkers)]
    return markers


def meta_of(leader: Leader, tid: str) -> TransactionMetadata:
    meta = leader.machine.describe(tid)
    assert meta is not None
    return meta


def prepared(leader: Leader, tid: str = "tx") -> tuple[int, int]:
    """A two-phase producer with an open transaction on a-0 and group g."""
    init = leader.init(tid, timeout_ms=5_000, two_phase=True)
    assert init.ok and (init.ongoing_producer_id, init.ongoing_producer_epoch) == (-1, -1)
    pid, epoch = init.producer_id, init.producer_epoch
    assert leader.add(tid, pid, epoch, ("a", 0)).ok
    assert leader.add_offsets(tid, pid, epoch, "g").ok
    assert leader.offsets("g", tid, pid, epoch, ("in", 0, 7)).ok
    return pid, epoch


def test_a_two_phase_transaction_never_times_out() -> None:
    leader = Leader.new()
    prepared(leader)
    leader.tick(10 * 60_000)
    assert leader.sweep_timeouts() == []
    assert meta_of(leader, "tx").state is TxnState.ONGOING
    # Its timeout is not bounded by transaction.max.timeout.ms (KIP-939) ...
    config = FsmConfig(transaction_max_timeout_ms=10_000)
    bounded = Leader.new(config)
    assert bounded.init("t2", timeout_ms=2**31 - 1, two_phase=True).ok
    assert bounded.init("t3", timeout_ms=2**31 - 1).error is ErrorCode.INVALID_TRANSACTION_TIMEOUT
    # ... but it must still be positive.
    refused = bounded.init("t4", timeout_ms=0, two_phase=True)
    assert refused.error is ErrorCode.INVALID_TRANSACTION_TIMEOUT


def test_keep_fences_the_old_producer_and_the_new_one_commits() -> None:
    leader = Leader.new()
    pid, epoch = prepared(leader)
    before = meta_of(leader, "tx")

    kept = leader.init("tx", timeout_ms=5_000, two_phase=True, keep=True)
    assert kept.ok
    assert (kept.producer_id, kept.producer_epoch) == (pid, epoch + 1)
    assert (kept.ongoing_producer_id, kept.ongoing_producer_epoch) == (pid, epoch)
    [fenced] = [e for e in kept.effects if isinstance(e, ProducerFenced)]
    assert (fenced.old_epoch, fenced.new_epoch) == (epoch, epoch + 1)
    meta = meta_of(leader, "tx")
    assert meta.state is TxnState.ONGOING and meta.kept
    assert meta.partitions == before.partitions and meta.groups == before.groups
    assert meta.txn_start_ms == before.txn_start_ms

    # The old producer is fenced everywhere it asks the coordinator.
    assert leader.end("tx", pid, epoch, commit=True).error is ErrorCode.PRODUCER_FENCED
    assert leader.add("tx", pid, epoch, ("b", 0)).error is ErrorCode.PRODUCER_FENCED
    assert verify_ongoing(meta, pid, epoch)[0] is ErrorCode.PRODUCER_FENCED
    # The kept transaction takes nothing more, from the new producer either.
    assert leader.add("tx", pid, epoch + 1, ("b", 0)).error is ErrorCode.INVALID_TXN_STATE
    assert leader.add("tx", pid, epoch + 1, ("a", 0)).error is ErrorCode.INVALID_TXN_STATE
    assert leader.add_offsets("tx", pid, epoch + 1, "h").error is ErrorCode.INVALID_TXN_STATE
    assert verify_ongoing(meta, pid, epoch + 1) == (ErrorCode.INVALID_TXN_STATE, KEPT_REFUSAL)
    assert verify_group(meta, pid, epoch + 1, "g")[0] is ErrorCode.INVALID_TXN_STATE
    assert meta_of(leader, "tx") == meta

    # The new producer commits; the markers' epoch is above the records' epoch.
    end = leader.end("tx", pid, epoch + 1, commit=True)
    assert end.ok and (end.producer_id, end.producer_epoch) == (pid, epoch + 2)
    markers = markers_of(end.effects)
    assert markers.commit and markers.producer_epoch == epoch + 2
    assert markers.partitions == (("a", 0),) and markers.groups == ("g",)
    leader.deliver_all()
    done = meta_of(leader, "tx")
    assert done.state is TxnState.COMPLETE_COMMIT
    # The completed kept transaction still names its records' identity ...
    assert (done.ongoing_producer_id, done.ongoing_producer_epoch) == (pid, epoch)
    [offset] = leader.machine.offset_fetch("g", [("in", 0)])
    assert offset.offset == 7
    # ... until the next transaction begins.
    assert leader.add("tx", pid, epoch + 2, ("b", 0)).ok
    assert meta_of(leader, "tx").ongoing_producer_id == -1


def test_keep_then_abort_and_keep_twice() -> None:
    leader = Leader.new()
    pid, epoch = prepared(leader)
    assert leader.init("tx", two_phase=True, keep=True).ok
    # A second crash: kept again, the records' identity stays the first.
    again = leader.init("tx", two_phase=True, keep=True)
    assert (again.producer_id, again.producer_epoch) == (pid, epoch + 2)
    assert (again.ongoing_producer_id, again.ongoing_producer_epoch) == (pid, epoch)
    end = leader.end("tx", pid, epoch + 2, commit=False)
    assert end.ok and not markers_of(end.effects).commit
    leader.deliver_all()
    assert meta_of(leader, "tx").state is TxnState.COMPLETE_ABORT
    [offset] = leader.machine.offset_fetch("g", [("in", 0)])
    assert offset.offset == -1


def test_init_without_keep_aborts_a_two_phase_transaction() -> None:
    leader = Leader.new()
    prepared(leader)
    fenced = leader.init("tx", two_phase=True)
    assert fenced.error is ErrorCode.CONCURRENT_TRANSACTIONS
    assert not markers_of(fenced.effects).commit
    leader.deliver_all()
    assert meta_of(leader, "tx").state is TxnState.COMPLETE_ABORT


def test_keep_with_nothing_open_is_a_plain_init() -> None:
    leader = Leader.new()
    pid = leader.init("tx", two_phase=True).producer_id
    assert leader.add("tx", pid, 0, ("a", 0)).ok
    assert leader.end("tx", pid, 0, commit=True).ok
    leader.deliver_all()
    init = leader.init("tx", two_phase=True, keep=True)
    assert init.ok and (init.ongoing_producer_id, init.ongoing_producer_epoch) == (-1, -1)
    assert meta_of(leader, "tx").state is TxnState.EMPTY


def test_a_kept_transaction_of_a_producer_without_two_phase_times_out() -> None:
    leader = Leader.new()
    pid = leader.init("tx", timeout_ms=5_000).producer_id
    assert leader.add("tx", pid, 0, ("a", 0)).ok
    assert leader.init("tx", timeout_ms=5_000, keep=True).ok  # KIP-939 allows it
    leader.tick(5_001)
    [aborted] = leader.sweep_timeouts()
    assert aborted.ok and not markers_of(aborted.effects).commit
    assert markers_of(aborted.effects).producer_epoch == 2  # above the kept epoch 1


def test_keep_retries_and_fencing_by_expected_identity() -> None:
    leader = Leader.new()
    pid, epoch = prepared(leader)
    kept = leader.init("tx", two_phase=True, keep=True, expected=(pid, epoch))
    assert kept.ok and kept.producer_epoch == epoch + 1
    # The same request again (its answer was lost): the same answer, no bump.
    retry = leader.init("tx", two_phase=True, keep=True, expected=(pid, epoch))
    assert (retry.producer_epoch, retry.ongoing_producer_epoch) == (epoch + 1, epoch)
    # An expected identity that is neither current nor that retry is fenced.
    stale = leader.init("tx", two_phase=True, keep=True, expected=(pid, epoch + 5))
    assert stale.error is ErrorCode.PRODUCER_FENCED
    assert meta_of(leader, "tx").producer_epoch == epoch + 1


def test_keep_at_the_last_epoch_keeps_without_a_bump() -> None:
    leader = Leader.new(FsmConfig(max_producer_epoch=4))
    pid = leader.init("tx", two_phase=True).producer_id
    assert leader.add("tx", pid, 0, ("a", 0)).ok
    # Epochs 3 and up are exhausted: a transaction at 2 ends with markers at 3.
    assert leader.init("tx", two_phase=True, keep=True).producer_epoch == 1
    assert leader.init("tx", two_phase=True, keep=True).producer_epoch == 2
    last = leader.init("tx", two_phase=True, keep=True)  # a bump would reach 3
    assert last.ok and (last.producer_epoch, last.ongoing_producer_epoch) == (2, 0)
    assert not [e for e in last.effects if isinstance(e, ProducerFenced)]
    end = leader.end("tx", pid, 2, commit=True)
    assert end.ok and markers_of(end.effects).producer_epoch == 3
    assert end.producer_id != pid and end.producer_epoch == 0  # rotated for the next one
    leader.deliver_all()
    assert meta_of(leader, "tx").state is TxnState.COMPLETE_COMMIT


def test_metadata_without_the_two_phase_fields_still_loads() -> None:
    leader = Leader.new()
    prepared(leader)
    leader.init("tx", two_phase=True, keep=True)
    meta = meta_of(leader, "tx")
    assert TransactionMetadata.from_wire(meta.to_wire()) == meta
    old = TransactionMetadata.from_wire(meta.to_wire()[:14])
    assert not old.two_phase and old.ongoing_producer_id == -1 and not old.kept


def test_commands_written_before_two_phase_commit_decode() -> None:
    from fsm.commands import command_from_wire, command_to_wire

    wire = command_to_wire(InitProducerId("tx", 1000, 5, 1))
    del wire["enable_two_phase_commit"], wire["keep_prepared_txn"]
    decoded = command_from_wire(wire)
    assert isinstance(decoded, InitProducerId) and not decoded.keep_prepared_txn


def test_a_kept_transaction_is_ended_by_a_producer_of_transactions_v1() -> None:
    """A client of transactions v1 (a Kafka client through the gateway, whose
    EndTxn is below v5) keeps a prepared transaction and commits it: its
    epoch stays the bumped one, the markers carry it (above the records'),
    and its next transaction goes on at that epoch."""
    leader = Leader.new()
    pid, epoch = prepared(leader)
    kept = leader.init("tx", timeout_ms=5_000, two_phase=True, keep=True)
    assert kept.ok and (kept.producer_id, kept.producer_epoch) == (pid, epoch + 1)

    end = leader.propose(
        lambda s: EndTxn(
            "tx", pid, epoch + 1, True, s.now_ms, s.coordinator_epoch, transaction_version=1
        )
    )
    assert end.ok and (end.producer_id, end.producer_epoch) == (pid, epoch + 1)
    markers = markers_of(end.effects)
    assert markers.commit and markers.producer_epoch == epoch + 1
    assert markers.partitions == (("a", 0),) and markers.groups == ("g",)
    leader.deliver_all()
    assert meta_of(leader, "tx").state is TxnState.COMPLETE_COMMIT
    [offset] = leader.machine.offset_fetch("g", [("in", 0)])
    assert offset.offset == 7
    assert leader.add("tx", pid, epoch + 1, ("b", 0)).ok
    meta = meta_of(leader, "tx")
    assert meta.state is TxnState.ONGOING and not meta.kept
    assert meta.producer_epoch == epoch + 1
