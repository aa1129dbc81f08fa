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


S = TxnState

#: For each state, the states it may be entered from.
VALID_PREVIOUS: Mapping[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset(
        {S.ONGOING, S.PREPARE_EPOCH_FENCE, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
    ),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}

#: States in which a two-phase transition waits for its second half.
PREPARE_STATES = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})
#: States with no transaction in progress; the transactional.id may expire.
IDLE_STATES = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
#: States that never outlive one command; found in a snapshot they mean "busy".
TRANSIENT_STATES = frozenset({S.DEAD, S.PREPARE_EPOCH_FENCE})
#: The Complete* state that ends each Prepare* state.
COMPLETION_OF: Mapping[TxnState, TxnState] = {
    S.PREPARE_COMMIT: S.COMPLETE_COMMIT,
    S.PREPARE_ABORT: S.COMPLETE_ABORT,
}


def is_legal(source: TxnState, target: TxnState) -> bool:
    """Whether the table allows moving from ``source`` to ``target``."""
    return source in VALID_PREVIOUS[target]
