"""Producer and transaction state of a partition (partition_log.producer_state)."""

from __future__ import annotations

import pytest

from fsm.errors import ErrorCode
from partition_log.producer_state import (
    DEDUP_WINDOW,
    MarkerAction,
    ProducerStates,
    Verdict,
    next_sequence,
)
from raftcoord.protocol.limits import MAX_SEQUENCE

PID = 7


def append(
    states: ProducerStates,
    base_offset: int,
    seq: int,
    count: int = 1,
    epoch: int = 0,
    transactional: bool = False,
    pid: int = PID,
) -> None:
    check = states.check_append(pid, epoch, seq, count, transactional, verified=True)
    assert check.ok and check.verdict is Verdict.APPEND, check
    states.on_append(pid, epoch, seq, base_offset, base_offset + count - 1, transactional)


def test_sequence_wraps_like_kafka() -> None:
    assert next_sequence(5) == 6
    assert next_sequence(MAX_SEQUENCE) == 0
    assert next_sequence(MAX_SEQUENCE - 1, 3) == 1


def test_first_batch_of_a_new_producer_must_start_at_zero() -> None:
    states = ProducerStates()
    check = states.check_append(PID, 0, 5, 1, False)
    assert check.error is ErrorCode.UNKNOWN_PRODUCER_ID
    assert states.check_append(PID, 0, 0, 1, False).verdict is Verdict.APPEND


def test_duplicates_within_the_window_return_the_original_offsets() -> None:
    states = ProducerStates()
    offset = 0
    for batch in range(DEDUP_WINDOW + 1):
        append(states, offset, batch * 3, count=3)
        offset += 3
    # The oldest batch left the window; the five newest are recognised.
    assert states.check_append(PID, 0, 0, 3, False).error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    for batch in range(1, DEDUP_WINDOW + 1):
        check = states.check_append(PID, 0, batch * 3, 3, False)
        assert check.verdict is Verdict.DUPLICATE
        assert check.base_offset == batch * 3


def test_gap_is_out_of_order_and_an_older_epoch_is_refused() -> None:
    states = ProducerStates()
    append(states, 0, 0, epoch=3)
    assert states.check_append(PID, 3, 2, 1, False).error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert states.check_append(PID, 2, 1, 1, False).error is ErrorCode.INVALID_PRODUCER_EPOCH
    # A new epoch restarts at sequence 0, and only at 0.
    assert states.check_append(PID, 4, 1, 1, False).error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert states.check_append(PID, 4, 0, 1, False).verdict is Verdict.APPEND


def test_first_transactional_batch_needs_verification_later_ones_do_not() -> None:
    states = ProducerStates()
    assert states.check_append(PID, 0, 0, 1, True).verdict is Verdict.VERIFY
    append(states, 10, 0, transactional=True)
    assert states.check_append(PID, 0, 1, 1, True).verdict is Verdict.APPEND
    assert states.open_txns == {PID: 10}
    assert states.last_stable_offset(20) == 10


def test_the_next_transaction_racing_the_previous_marker_asks_the_coordinator() -> None:
    """EndTxn answers before its markers are written, so the next
    transaction's first batch (epoch + 1) may come while the previous one is
    still open here: the coordinator decides (it adds the partition only once
    the previous transaction is complete, its marker here); unverified, the
    batch is retried."""
    states = ProducerStates()
    append(states, 0, 0, transactional=True)
    assert states.check_append(PID, 1, 0, 1, True).verdict is Verdict.VERIFY
    raced = states.check_append(PID, 1, 0, 1, True, verified=True)
    assert raced.error is ErrorCode.CONCURRENT_TRANSACTIONS
    states.on_marker(PID, 1, 0, True, 1)
    assert states.check_append(PID, 1, 0, 1, True, verified=True).verdict is Verdict.APPEND


def test_non_transactional_write_with_an_open_transaction_is_refused() -> None:
    states = ProducerStates()
    append(states, 0, 0, transactional=True)
    assert states.check_append(PID, 0, 1, 1, False).error is ErrorCode.INVALID_TXN_STATE


def test_commit_marker_closes_and_moves_the_lso() -> None:
    states = ProducerStates()
    append(states, 5, 0, count=2, transactional=True)
    assert states.check_marker(PID, 1, 3) is MarkerAction.WRITE
    states.on_marker(PID, 1, 3, True, 7)
    assert states.open_txns == {}
    assert states.last_stable_offset(8) == 8
    assert states.aborted == []
    # The retried marker is acknowledged without a second record.
    assert states.check_marker(PID, 1, 3) is MarkerAction.NOOP
    # The next transaction uses the bumped epoch from sequence 0.
    assert states.check_append(PID, 1, 0, 1, True).verdict is Verdict.VERIFY
    assert states.check_append(PID, 0, 2, 1, True).error is ErrorCode.INVALID_PRODUCER_EPOCH


def test_abort_marker_records_the_aborted_range() -> None:
    states = ProducerStates()
    append(states, 0, 0, count=3, transactional=True)
    append(states, 3, 0, pid=8)  # another producer's plain record
    states.on_marker(PID, 1, 0, False, 4)
    assert [(t.producer_id, t.first_offset, t.last_offset) for t in states.aborted] == [(PID, 0, 4)]
    assert states.aborted_between(0, 5) == states.aborted
    assert states.aborted_between(5, 9) == []


def test_a_late_marker_never_closes_the_next_transaction() -> None:
    states = ProducerStates()
    append(states, 0, 0, transactional=True)
    states.on_marker(PID, 1, 0, True, 1)
    append(states, 2, 0, epoch=1, transactional=True)  # the next transaction, epoch 1
    # A delayed duplicate of the first transaction's marker (epoch 1) arrives.
    assert states.check_marker(PID, 1, 0) is MarkerAction.NOOP
    assert states.open_txns == {PID: 2}


def test_stale_coordinator_epoch_is_fenced() -> None:
    states = ProducerStates()
    append(states, 0, 0, transactional=True)
    states.on_marker(PID, 1, 5, False, 1)
    assert states.check_marker(PID, 2, 4) is MarkerAction.FENCED
    assert states.check_marker(PID, 2, 5) is MarkerAction.WRITE


def test_marker_for_an_unknown_producer_is_written_and_fences_its_old_epoch() -> None:
    states = ProducerStates()
    assert states.check_marker(PID, 4, 0) is MarkerAction.WRITE
    states.on_marker(PID, 4, 0, False, 0)
    assert states.aborted == []  # nothing was open here
    assert states.check_append(PID, 3, 0, 1, True).error is ErrorCode.INVALID_PRODUCER_EPOCH


def test_a_producer_with_only_markers_here_may_go_on_at_any_sequence_of_its_epoch() -> None:
    """A transaction whose only batch here was refused (too large: never
    appended, its sequence spent) is aborted; the ABORT marker is all the
    partition holds of the producer. Its next transaction, same epoch
    (transactions v1), goes on at the next sequence, as Kafka's brokers let
    it; another epoch starts at 0 as always."""
    states = ProducerStates()
    states.on_marker(PID, 0, 0, False, 0)
    check = states.check_append(PID, 0, 1, 1, True, verified=True)
    assert check.ok and check.verdict is Verdict.APPEND, check
    states.on_append(PID, 0, 1, 1, 1, True)
    assert states.check_append(PID, 0, 1, 1, True).verdict is Verdict.DUPLICATE
    assert states.check_append(PID, 0, 3, 1, True).error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert states.check_append(PID, 1, 5, 1, True).error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


@pytest.mark.parametrize("transactional", [False, True])
def test_batches_without_producer_id_are_always_appended(transactional: bool) -> None:
    states = ProducerStates()
    assert states.check_append(-1, -1, -1, 4, transactional).verdict is Verdict.APPEND
    states.on_append(-1, -1, -1, 0, 3, False)
    assert states.producers == {}
