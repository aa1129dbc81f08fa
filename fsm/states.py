"""Transaction states and the table of legal transitions (Kafka's TransactionState)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum


class TxnState(IntEnum):
    """Transaction states; the values are the persisted ids."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7


#: For each state, the states it may be entered from.
VALID_PREVIOUS: Mapping[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}),
    TxnState.ONGOING: frozenset(
        {TxnState.ONGOING, TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}
    ),
    TxnState.PREPARE_COMMIT: frozenset({TxnState.ONGOING}),
    TxnState.PREPARE_ABORT: frozenset(
        {
            TxnState.ONGOING,
            TxnState.PREPARE_EPOCH_FENCE,
            TxnState.EMPTY,
            TxnState.COMPLETE_COMMIT,
            TxnState.COMPLETE_ABORT,
        }
    ),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.PREPARE_COMMIT}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.PREPARE_ABORT}),
    TxnState.DEAD: frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}),
    TxnState.PREPARE_EPOCH_FENCE: frozenset({TxnState.ONGOING}),
}

#: States in which a two-phase transition waits for its second half.
PREPARE_STATES = frozenset({TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT})
#: States with no transaction in progress; the transactional.id may expire.
IDLE_STATES = frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})
#: States that never outlive one command; found in a snapshot they mean "busy".
TRANSIENT_STATES = frozenset({TxnState.DEAD, TxnState.PREPARE_EPOCH_FENCE})
#: The Complete* state that ends each Prepare* state.
COMPLETION_OF: Mapping[TxnState, TxnState] = {
    TxnState.PREPARE_COMMIT: TxnState.COMPLETE_COMMIT,
    TxnState.PREPARE_ABORT: TxnState.COMPLETE_ABORT,
}


def is_legal(source: TxnState, target: TxnState) -> bool:
    """Whether the table allows moving from ``source`` to ``target``."""
    return source in VALID_PREVIOUS[target]
