"""Transactions v1 (KIP-890's transaction.version 1, what Kafka clients
with EndTxn below version 5 speak) beside v2, in the pure parts: the state
machine keeps the epoch across transactions and numbers them; a partition
closes a v1 transaction with a marker of the data's own epoch and continues
its sequences, and never writes a transaction's marker twice (the number,
kept in the control record); a group's pending offsets alike."""

from __future__ import annotations

from fsm import GroupMarker, MarkersWritten, Outcome, TxnOffsetCommit, TxnState, WriteMarkers
from fsm.commands import EndTxn, OffsetEntry
from fsm.config import FsmConfig
from fsm.errors import ErrorCode
from fsm.offsets import GroupOffsets, group_marker, txn_offset_commit
from partition_log.producer_state import MarkerAction, ProducerStates, Verdict
from tests.fsm_driver import Leader


def markers_of(effects: tuple[object, ...]) -> WriteMarkers:
    (markers,) = [e for e in effects if isinstance(e, WriteMarkers)]
    return markers


def end_v1(leader: Leader, pid: int, epoch: int, commit: bool) -> object:
    return leader.propose(
        lambda s: EndTxn(
            "tx", pid, epoch, commit, s.now_ms, s.coordinator_epoch, transaction_version=1
        )
    )


def test_v1_keeps_the_epoch_numbers_transactions_and_retries_with_the_same_identity() -> None:
    leader = Leader.new()
    pid = leader.init("tx").producer_id
    assert leader.add("tx", pid, 0, ("a", 0)).ok
    first = leader.machine.describe("tx")
    assert first is not None and first.txn_number == 1

    end = end_v1(leader, pid, 0, commit=True)
    assert end.ok and (end.producer_id, end.producer_epoch) == (pid, 0)  # no bump
    markers = markers_of(end.effects)
    assert (markers.producer_epoch, markers.transaction_version, markers.txn_number) == (0, 1, 1)
    assert end_v1(leader, pid, 0, commit=True).error is ErrorCode.CONCURRENT_TRANSACTIONS
    # An abort meanwhile (the client's next transaction, whose add timed out)
    # waits for the commit, and then has nothing open to abort.
    assert end_v1(leader, pid, 0, commit=False).error is ErrorCode.CONCURRENT_TRANSACTIONS
    leader.deliver_all()
    assert end_v1(leader, pid, 0, commit=False).ok
    assert leader.machine.describe("tx").state is TxnState.COMPLETE_COMMIT  # type: ignore[union-attr]
    retried = end_v1(leader, pid, 0, commit=True)  # its answer was lost: the same answer
    assert retried.ok and retried.producer_epoch == 0

    # The next transaction: the same identity, the next number.
    assert leader.add("tx", pid, 0, ("a", 0)).ok
    assert leader.machine.describe("tx").txn_number == 2  # type: ignore[union-attr]
    # A late acknowledgement of the first transaction's markers is stale.
    stale = leader.apply(MarkersWritten("tx", pid, 0, (("a", 0),), (), leader.now_ms, 1))
    assert stale.error is ErrorCode.INVALID_TXN_STATE
    aborted = end_v1(leader, pid, 0, commit=False)
    assert markers_of(aborted.effects).txn_number == 2
    leader.deliver_all()
    assert leader.machine.describe("tx").state is TxnState.COMPLETE_ABORT  # type: ignore[union-attr]
    # With nothing open a commit is refused; an abort (of a transaction whose
    # add never reached the coordinator) succeeds and changes nothing.
    empty = Leader.new()
    empty_pid = empty.init("tx").producer_id

    def end(commit: bool) -> Outcome:
        return empty.propose(
            lambda s: EndTxn("tx", empty_pid, 0, commit, s.now_ms, 1, transaction_version=1)
        )

    assert end(commit=True).error is ErrorCode.INVALID_TXN_STATE
    before = empty.machine.snapshot()
    assert end(commit=False).ok and empty.machine.snapshot() == before


def test_a_v1_producer_is_fenced_and_timed_out_with_an_epoch_bump() -> None:
    leader = Leader.new(FsmConfig())
    pid = leader.init("tx", timeout_ms=1_000).producer_id
    assert leader.add("tx", pid, 0, ("a", 0)).ok
    leader.tick(1_001)
    [aborted] = leader.sweep_timeouts()
    markers = markers_of(aborted.effects)
    assert (markers.producer_epoch, markers.transaction_version) == (1, 2)  # above the data's
    assert end_v1(leader, pid, 0, commit=True).error is ErrorCode.PRODUCER_FENCED


def test_a_partition_closes_v1_transactions_with_the_datas_epoch_and_once() -> None:
    states = ProducerStates()
    assert states.check_append(7, 3, 0, 2, True).verdict is Verdict.VERIFY
    states.on_append(7, 3, 0, 0, 1, True)
    assert states.last_stable_offset(2) == 0
    # Transaction 4's COMMIT, of the data's own epoch, closes it.
    assert states.check_marker(7, 3, 1, 1, 4) is MarkerAction.WRITE
    states.on_marker(7, 3, 1, True, 2, txn_number=4)
    assert states.open_txns == {} and states.last_stable_offset(3) == 3
    # The next transaction, same epoch: its sequences go on from 2.
    assert states.check_append(7, 3, 0, 2, True).verdict is Verdict.DUPLICATE
    assert states.check_append(7, 3, 2, 1, True).verdict is Verdict.VERIFY
    states.on_append(7, 3, 2, 3, 3, True)
    # A late copy of transaction 4's marker does not close transaction 5.
    assert states.check_marker(7, 3, 1, 1, 4) is MarkerAction.NOOP
    assert states.check_marker(7, 3, 1, 1, 3) is MarkerAction.NOOP
    assert states.open_txns == {7: 3}
    assert states.check_marker(7, 3, 1, 1, 5) is MarkerAction.WRITE
    states.on_marker(7, 3, 1, False, 4, txn_number=5)
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in states.aborted] == [(7, 3, 4)]
    # A participant with nothing open still takes its transaction's marker
    # (one per transaction), and a marker of an older epoch is stale.
    assert states.check_marker(7, 3, 1, 1, 6) is MarkerAction.WRITE
    assert states.check_marker(7, 2, 1, 1, 7) is MarkerAction.NOOP
    # The numbers survive a snapshot (and are read back from the control records).
    again = ProducerStates.from_snapshot(states.snapshot())
    assert again.check_marker(7, 3, 1, 1, 5) is MarkerAction.NOOP


def test_v2_markers_keep_their_epoch_rule() -> None:
    states = ProducerStates()
    states.on_append(7, 3, 0, 0, 0, True)
    assert states.check_marker(7, 3, 1, 2, 4) is MarkerAction.NOOP  # not above the data
    assert states.check_marker(7, 4, 1, 2, 4) is MarkerAction.WRITE


def test_a_groups_pending_offsets_close_on_a_v1_marker_once() -> None:
    offsets = (OffsetEntry("in", 0, 10, ""),)
    group, outcome = txn_offset_commit(
        GroupOffsets(), TxnOffsetCommit("g", "tx", 7, 3, offsets, 1), FsmConfig()
    )
    assert outcome.ok and group is not None
    group, _ = group_marker(group, GroupMarker("g", 7, 3, True, 2, 1, 1, 4))
    assert group is not None and group.pending == {} and group.committed
    committed = dict(group.committed)
    # The next transaction's offsets, same epoch; a late copy of the marker
    # leaves them pending.
    group, _ = txn_offset_commit(
        group, TxnOffsetCommit("g", "tx", 7, 3, (OffsetEntry("in", 0, 20, ""),), 3), FsmConfig()
    )
    assert group is not None
    group, _ = group_marker(group, GroupMarker("g", 7, 3, True, 4, 1, 1, 4))
    assert group is not None and 7 in group.pending and dict(group.committed) == committed
    group, _ = group_marker(group, GroupMarker("g", 7, 3, False, 5, 1, 1, 5))
    assert group is not None and group.pending == {} and dict(group.committed) == committed
    assert GroupOffsets.from_wire(group.to_wire()) == group
