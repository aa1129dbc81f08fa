"""The transactional producer's own state (no I/O), modelled on the Kafka
producer's TransactionManager: the legal transitions are a table, checked
by one function; an illegal move raises and changes nothing.
"""

from __future__ import annotations

from enum import Enum

from raftcoord.client.errors import IllegalStateError

__all__ = ["TRANSITIONS", "TxnState", "check_transition"]


class TxnState(Enum):
    UNINITIALIZED = "uninitialized"
    INITIALIZING = "initializing"
    READY = "ready"
    IN_TRANSACTION = "in-transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE_ERROR = "abortable-error"
    FATAL_ERROR = "fatal-error"
    CLOSED = "closed"


#: state -> the states it may move to. Every state may also move to
#: FATAL_ERROR and CLOSED (see :func:`check_transition`).
TRANSITIONS: dict[TxnState, frozenset[TxnState]] = {
    # init_transactions; a timed-out init may be called again.
    TxnState.UNINITIALIZED: frozenset({TxnState.INITIALIZING}),
    TxnState.INITIALIZING: frozenset({TxnState.INITIALIZING, TxnState.READY}),
    TxnState.READY: frozenset({TxnState.IN_TRANSACTION}),
    TxnState.IN_TRANSACTION: frozenset(
        {TxnState.COMMITTING, TxnState.ABORTING, TxnState.ABORTABLE_ERROR}
    ),
    # A commit that timed out may be called again (EndTxn is retried), or a
    # send failed during its flush (abortable).
    TxnState.COMMITTING: frozenset({TxnState.COMMITTING, TxnState.READY, TxnState.ABORTABLE_ERROR}),
    TxnState.ABORTING: frozenset({TxnState.ABORTING, TxnState.READY}),
    TxnState.ABORTABLE_ERROR: frozenset({TxnState.ABORTABLE_ERROR, TxnState.ABORTING}),
    TxnState.FATAL_ERROR: frozenset(),
    TxnState.CLOSED: frozenset(),
}


def check_transition(current: TxnState, target: TxnState, operation: str) -> None:
    """Raise unless ``current`` may move to ``target``.

    Raises:
        IllegalStateError: the move is not in the table.
    """
    if current is TxnState.CLOSED:
        raise IllegalStateError(f"cannot {operation}: the producer is closed")
    if target in (TxnState.FATAL_ERROR, TxnState.CLOSED) or target in TRANSITIONS[current]:
        return
    raise IllegalStateError(f"cannot {operation} in state {current.value}")
