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
    assert owed_marker(5, 3, [described(COMMIT, 5, 4, 5, 3)]) == (True, 7)
    assert owed_marker(5, 3, [described(ABORT, 5, 4, 5, 3)]) == (False, 7)


def test_a_fencing_abort_owes_an_abort_at_the_next_epoch() -> None:
    assert owed_marker(5, 3, [described(ABORT, 5, 4, 5, -1)]) == (False, 7)
    assert owed_marker(5, 3, [described(ABORT, 5, 5, 5, -1)]) is None  # bumped again since


def test_nothing_is_owed_for_another_transaction_or_one_not_completed() -> None:
    assert owed_marker(5, 2, [described(COMMIT, 5, 4, 5, 3)]) is None  # an older one
    assert owed_marker(6, 3, [described(COMMIT, 5, 4, 5, 3)]) is None
    for state in (
        common_pb2.TRANSACTION_STATE_ONGOING,
        common_pb2.TRANSACTION_STATE_PREPARE_COMMIT,
        common_pb2.TRANSACTION_STATE_PREPARE_ABORT,
        common_pb2.TRANSACTION_STATE_EMPTY,
    ):
        assert owed_marker(5, 3, [described(state, 5, 4, 5, 3)]) is None
    assert owed_marker(5, 3, []) is None
