"""Which marker a partition that lost one is owed (partition_log.cluster_view.owed_marker)."""

from __future__ import annotations

from typing import Any

from partition_log.cluster_view import owed_marker
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2

COMMIT = common_pb2.TRANSACTION_STATE_COMPLETE_COMMIT
ABORT = common_pb2.TRANSACTION_STATE_COMPLETE_ABORT


def described(state: int, pid: int, epoch: int, last_pid: int, last_epoch: int) -> Any:
    return coordinator_pb2.TransactionDescription(
        state=state,
        producer_id=pid,
        producer_epoch=epoch,
        last_producer_id=last_pid,
        last_producer_epoch=last_epoch,
        coordinator_epoch=7,
    )


def test_the_completed_transaction_of_the_open_records_owes_its_decision() -> None:
    assert owed_marker(5, 3, -1, [described(COMMIT, 5, 4, 5, 3)])[:2] == (True, 7)
    assert owed_marker(5, 3, -1, [described(ABORT, 5, 4, 5, 3)])[:2] == (False, 7)


def test_a_fencing_abort_owes_an_abort_at_the_next_epoch() -> None:
    assert owed_marker(5, 3, -1, [described(ABORT, 5, 4, 5, -1)])[:2] == (False, 7)
    assert owed_marker(5, 3, -1, [described(ABORT, 5, 5, 5, -1)]) is None  # bumped again since


def test_nothing_is_owed_for_another_transaction_or_one_not_completed() -> None:
    assert owed_marker(5, 2, -1, [described(COMMIT, 5, 4, 5, 3)]) is None  # an older one
    assert owed_marker(6, 3, -1, [described(COMMIT, 5, 4, 5, 3)]) is None
    for state in (
        common_pb2.TRANSACTION_STATE_ONGOING,
        common_pb2.TRANSACTION_STATE_PREPARE_COMMIT,
        common_pb2.TRANSACTION_STATE_PREPARE_ABORT,
        common_pb2.TRANSACTION_STATE_EMPTY,
    ):
        assert owed_marker(5, 3, -1, [described(state, 5, 4, 5, 3)]) is None
    assert owed_marker(5, 3, -1, []) is None


def test_a_kept_transaction_owes_its_decision_to_its_records_identity() -> None:
    # KIP-939: records at epoch 3, kept at 4, committed at 5 (last 5/4).
    kept = coordinator_pb2.TransactionDescription(
        state=COMMIT,
        producer_id=5,
        producer_epoch=5,
        last_producer_id=5,
        last_producer_epoch=4,
        ongoing_txn_producer_id=5,
        ongoing_txn_producer_epoch=3,
        coordinator_epoch=7,
    )
    assert owed_marker(5, 3, -1, [kept])[:2] == (True, 7)
    assert owed_marker(5, 2, -1, [kept]) is None
    # A coordinator without the fields: producer 0 at epoch 0 is not matched.
    assert owed_marker(0, 0, -1, [described(COMMIT, 5, 4, 5, 3)]) is None


def test_the_marker_goes_at_an_epoch_that_closes_the_records() -> None:
    owed = owed_marker(5, 3, -1, [described(COMMIT, 5, 4, 5, 3)])
    assert owed is not None and (owed.epoch, owed.transaction_version) == (4, 2)


def test_a_v1_transaction_is_owed_only_as_the_next_after_the_last_marker_here() -> None:
    """Transactions v1 keep the epoch: (producer 5, epoch 3) names many; the
    completed one is this partition's open one only when its number follows
    the partition's last marker of the producer."""

    def v1(number: int, state: int = COMMIT) -> Any:
        d = described(state, 5, 3, -1, -1)
        d.txn_number, d.transaction_version = number, 1
        return d

    owed = owed_marker(5, 3, 6, [v1(7)])
    assert owed == (True, 7, 3, 1, 7)  # the records' own epoch, and the number
    assert owed_marker(5, 3, 6, [v1(7, ABORT)])[:2] == (False, 7)  # type: ignore[index]
    assert owed_marker(5, 3, 5, [v1(7)]) is None  # a transaction between: unknown
    assert owed_marker(5, 3, -1, [v1(7)]) is None  # no marker here to count from
    assert owed_marker(5, 2, 6, [v1(7)]) is None  # another epoch
