"""The transactional producer's own state (no I/O), modelled on the Kafka
producer's TransactionManager: the legal transitions are a table, checked
by one function; an illegal move raises and changes nothing.
"""

from __future__ import annotations

from enum import Enum

from raftcoord.client.errors import IllegalStateError

__all__ = ["TRANSITIONS", "ProducerTxnState", "check_transition"]


class ProducerTxnState(Enum):
    """Where a transactional producer is, as the producer sees it (Kafka's
    TransactionManager.State). Not the coordinator's state of the transaction
    (fsm's TxnState), which the producer only learns from answers."""

    UNINITIALIZED = "uninitialized"
    INITIALIZING = "initializing"
    READY = "ready"
    IN_TRANSACTION = "in-transaction"
    #: KIP-939: flushed and waiting for the external transaction manager's
    #: decision (prepare_transaction, or init_transactions keeping one).
    PREPARED_TRANSACTION = "prepared-transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE_ERROR = "abortable-error"
    FATAL_ERROR = "fatal-error"
    CLOSED = "closed"


#: state -> the states it may move to. Every state may also move to
#: FATAL_ERROR and CLOSED (see :func:`check_transition`).
TRANSITIONS: dict[ProducerTxnState, frozenset[ProducerTxnState]] = {
    # init_transactions; a timed-out init may be called again.
    ProducerTxnState.UNINITIALIZED: frozenset({ProducerTxnState.INITIALIZING}),
    # A kept transaction (KIP-939) is prepared from the start.
    ProducerTxnState.INITIALIZING: frozenset(
        {
            ProducerTxnState.INITIALIZING,
            ProducerTxnState.READY,
            ProducerTxnState.PREPARED_TRANSACTION,
        }
    ),
    ProducerTxnState.READY: frozenset({ProducerTxnState.IN_TRANSACTION}),
    ProducerTxnState.IN_TRANSACTION: frozenset(
        {
            ProducerTxnState.COMMITTING,
            ProducerTxnState.ABORTING,
            ProducerTxnState.ABORTABLE_ERROR,
            ProducerTxnState.PREPARED_TRANSACTION,
        }
    ),
    ProducerTxnState.PREPARED_TRANSACTION: frozenset(
        {ProducerTxnState.COMMITTING, ProducerTxnState.ABORTING}
    ),
    # A commit that timed out may be called again (EndTxn is retried), or a
    # send failed during its flush (abortable).
    ProducerTxnState.COMMITTING: frozenset(
        {ProducerTxnState.COMMITTING, ProducerTxnState.READY, ProducerTxnState.ABORTABLE_ERROR}
    ),
    ProducerTxnState.ABORTING: frozenset({ProducerTxnState.ABORTING, ProducerTxnState.READY}),
    ProducerTxnState.ABORTABLE_ERROR: frozenset(
        {ProducerTxnState.ABORTABLE_ERROR, ProducerTxnState.ABORTING}
    ),
    ProducerTxnState.FATAL_ERROR: frozenset(),
    ProducerTxnState.CLOSED: frozenset(),
}


def check_transition(current: ProducerTxnState, target: ProducerTxnState, operation: str) -> None:
    """Raise unless ``current`` may move to ``target``.

    Raises:
        IllegalStateError: the move is not in the table.
    """
    if current is ProducerTxnState.CLOSED:
        raise IllegalStateError(f"cannot {operation}: the producer is closed")
    if (
        target in (ProducerTxnState.FATAL_ERROR, ProducerTxnState.CLOSED)
        or target in TRANSITIONS[current]
    ):
        return
    raise IllegalStateError(f"cannot {operation} in state {current.value}")
