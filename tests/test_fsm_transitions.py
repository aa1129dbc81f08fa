"""The state table, pair by pair, and every (state, event) pair of the handlers.

Expected outcomes are written out here from Kafka's TransactionCoordinator
semantics (states, events and fencing), independently of the handler code.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from fsm import (
    VALID_PREVIOUS,
    AbortTimedOut,
    AddOffsets,
    AddPartitions,
    Command,
    EndTxn,
    ExpireTransactionalIds,
    FsmConfig,
    IllegalTransition,
    InitProducerId,
    MarkersWritten,
    TransactionMetadata,
    TransactionStateMachine,
    Transition,
    TxnState,
    transactions,
    transition,
)
from fsm.errors import ErrorCode
from fsm.rules import REQUESTS, Request, Rule, markdown_tables, rule
from fsm.states import COMPLETION_OF

# The legal transitions ("may be entered from"), copied as data.
DESIGN_TABLE = {
    TxnState.EMPTY: {TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT},
    TxnState.ONGOING: {
        TxnState.ONGOING,
        TxnState.EMPTY,
        TxnState.COMPLETE_COMMIT,
        TxnState.COMPLETE_ABORT,
    },
    TxnState.PREPARE_COMMIT: {TxnState.ONGOING},
    TxnState.PREPARE_ABORT: {
        TxnState.ONGOING,
        TxnState.PREPARE_EPOCH_FENCE,
        TxnState.EMPTY,
        TxnState.COMPLETE_COMMIT,
        TxnState.COMPLETE_ABORT,
    },
    TxnState.COMPLETE_COMMIT: {TxnState.PREPARE_COMMIT},
    TxnState.COMPLETE_ABORT: {TxnState.PREPARE_ABORT},
    TxnState.DEAD: {TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT},
    TxnState.PREPARE_EPOCH_FENCE: {TxnState.ONGOING},
}


def test_table_is_the_design_table() -> None:
    assert {k: set(v) for k, v in VALID_PREVIOUS.items()} == DESIGN_TABLE
    assert [int(s) for s in TxnState] == list(range(8))


def meta_in(state: TxnState) -> TransactionMetadata:
    return TransactionMetadata(
        transactional_id="t",
        producer_id=5,
        producer_epoch=3,
        state=state,
        timeout_ms=60_000,
        last_update_ms=1_000,
    )


@pytest.mark.parametrize(("source", "target"), list(itertools.product(TxnState, TxnState)))
def test_transition_pair(source: TxnState, target: TxnState) -> None:
    before = meta_in(source)
    if source in DESIGN_TABLE[target]:
        after = transition(before, target, last_update_ms=2_000)
        assert after.state is target
        assert after.last_update_ms == 2_000
        assert after.pending_state == COMPLETION_OF.get(target)
    else:
        with pytest.raises(IllegalTransition):
            transition(before, target, last_update_ms=2_000)
    assert before == meta_in(source)  # never mutated


# --- every (state, event) pair through the machine ------------------------------------

PID, EPOCH, NOW = 5, 3, 10_000_000
FRESH_PID = 6  # granted and above the last assigned id


def machine_with(state: TxnState) -> TransactionStateMachine:
    """A shard holding transactional.id "t" in ``state`` with producer (5, 3).

    Prepare* and Complete* look as after an EndTxn from epoch 2 (so (5, 2)
    is the retry identity); Ongoing and Prepare* have one partition.
    """
    machine = TransactionStateMachine(0, 1, FsmConfig(transactional_id_expiration_ms=1_000))
    machine.state.pids.allocate()  # ids 0..999 granted
    machine.state.last_assigned_pid = PID
    meta = replace(meta_in(state), txn_start_ms=1_000)
    if state in (
        TxnState.ONGOING,
        TxnState.PREPARE_COMMIT,
        TxnState.PREPARE_ABORT,
        TxnState.PREPARE_EPOCH_FENCE,
    ):
        meta = replace(meta, partitions=frozenset({("a", 0)}))
    if state in (
        TxnState.PREPARE_COMMIT,
        TxnState.PREPARE_ABORT,
        TxnState.COMPLETE_COMMIT,
        TxnState.COMPLETE_ABORT,
    ):
        meta = replace(meta, last_producer_id=PID, last_producer_epoch=EPOCH - 1)
    meta = replace(meta, pending_state=COMPLETION_OF.get(state))
    machine.state.transactions["t"] = meta
    return machine


def events(pid: int = PID, epoch: int = EPOCH) -> dict[str, Command]:
    return {
        "init": InitProducerId("t", 30_000, NOW, 2, FRESH_PID),
        "init_keep": InitProducerId("t", 30_000, NOW, 2, FRESH_PID, keep_prepared_txn=True),
        "add_partitions": AddPartitions("t", pid, epoch, (("b", 1),), NOW, 2),
        "add_offsets": AddOffsets("t", pid, epoch, "g", NOW, 2),
        "end_commit": EndTxn("t", pid, epoch, True, NOW, 2),
        "end_abort": EndTxn("t", pid, epoch, False, NOW, 2),
        "end_commit_v1": EndTxn("t", pid, epoch, True, NOW, 2, transaction_version=1),
        "end_abort_v1": EndTxn("t", pid, epoch, False, NOW, 2, transaction_version=1),
        "markers": MarkersWritten("t", pid, epoch, (("a", 0),), (), NOW),
        "timeout": AbortTimedOut("t", pid, epoch, NOW, 2),
        "expire": ExpireTransactionalIds(("t",), NOW),
    }


OK, UNCHANGED, GONE = ErrorCode.NONE, None, "gone"
C, INV, F = (
    ErrorCode.CONCURRENT_TRANSACTIONS,
    ErrorCode.INVALID_TXN_STATE,
    ErrorCode.PRODUCER_FENCED,
)

# (state, event) -> (error, state afterwards: a TxnState, UNCHANGED or GONE)
EXPECTED: dict[TxnState, dict[str, tuple[ErrorCode, object]]] = {
    TxnState.EMPTY: {
        "init": (OK, TxnState.EMPTY),
        "init_keep": (OK, TxnState.EMPTY),
        "add_partitions": (OK, TxnState.ONGOING),
        "add_offsets": (OK, TxnState.ONGOING),
        "end_commit": (INV, UNCHANGED),
        "end_abort": (OK, TxnState.COMPLETE_ABORT),
        "end_commit_v1": (INV, UNCHANGED),
        "end_abort_v1": (OK, UNCHANGED),  # nothing open: nothing to abort
        "markers": (INV, UNCHANGED),
        "timeout": (INV, UNCHANGED),
        "expire": (OK, GONE),
    },
    TxnState.ONGOING: {
        # InitProducerId fences and aborts the open transaction, then says "retry".
        "init": (C, TxnState.PREPARE_ABORT),
        # KIP-939: kept open at a bumped epoch for the new producer to end.
        "init_keep": (OK, TxnState.ONGOING),
        "add_partitions": (OK, TxnState.ONGOING),
        "add_offsets": (OK, TxnState.ONGOING),
        "end_commit": (OK, TxnState.PREPARE_COMMIT),
        "end_abort": (OK, TxnState.PREPARE_ABORT),
        # Transactions v1: no epoch bump; a retry carries the current identity.
        "end_commit_v1": (OK, TxnState.PREPARE_COMMIT),
        "end_abort_v1": (OK, TxnState.PREPARE_ABORT),
        "markers": (INV, UNCHANGED),
        "timeout": (OK, TxnState.PREPARE_ABORT),
        "expire": (OK, UNCHANGED),
    },
    # The current identity in Prepare* is the next transaction's: it waits,
    # whatever its decision (the retry identity's rows are below).
    TxnState.PREPARE_COMMIT: {
        "init": (C, UNCHANGED),
        "init_keep": (C, UNCHANGED),
        "add_partitions": (C, UNCHANGED),
        "add_offsets": (C, UNCHANGED),
        "end_commit": (C, UNCHANGED),
        "end_abort": (C, UNCHANGED),
        "end_commit_v1": (C, UNCHANGED),
        "end_abort_v1": (C, UNCHANGED),  # waits: then nothing open to abort
        "markers": (OK, TxnState.COMPLETE_COMMIT),
        "timeout": (INV, UNCHANGED),
        "expire": (OK, UNCHANGED),
    },
    TxnState.PREPARE_ABORT: {
        "init": (C, UNCHANGED),
        "init_keep": (C, UNCHANGED),
        "add_partitions": (C, UNCHANGED),
        "add_offsets": (C, UNCHANGED),
        "end_commit": (C, UNCHANGED),
        "end_abort": (C, UNCHANGED),
        "end_commit_v1": (INV, UNCHANGED),
        "end_abort_v1": (C, UNCHANGED),
        "markers": (OK, TxnState.COMPLETE_ABORT),
        "timeout": (INV, UNCHANGED),
        "expire": (OK, UNCHANGED),
    },
    TxnState.COMPLETE_COMMIT: {
        "init": (OK, TxnState.EMPTY),
        "init_keep": (OK, TxnState.EMPTY),
        "add_partitions": (OK, TxnState.ONGOING),
        "add_offsets": (OK, TxnState.ONGOING),
        "end_commit": (INV, UNCHANGED),
        "end_abort": (OK, TxnState.COMPLETE_ABORT),
        "end_commit_v1": (OK, UNCHANGED),
        "end_abort_v1": (OK, UNCHANGED),  # nothing open: nothing to abort
        "markers": (INV, UNCHANGED),
        "timeout": (INV, UNCHANGED),
        "expire": (OK, GONE),
    },
    TxnState.COMPLETE_ABORT: {
        "init": (OK, TxnState.EMPTY),
        "init_keep": (OK, TxnState.EMPTY),
        "add_partitions": (OK, TxnState.ONGOING),
        "add_offsets": (OK, TxnState.ONGOING),
        "end_commit": (INV, UNCHANGED),
        "end_abort": (OK, TxnState.COMPLETE_ABORT),
        "end_commit_v1": (INV, UNCHANGED),
        "end_abort_v1": (OK, UNCHANGED),
        "markers": (INV, UNCHANGED),
        "timeout": (INV, UNCHANGED),
        "expire": (OK, GONE),
    },
    # Dead and PrepareEpochFence never outlive one command; found anyway, they are busy.
    TxnState.DEAD: {
        "init": (C, UNCHANGED),
        "init_keep": (C, UNCHANGED),
        "add_partitions": (C, UNCHANGED),
        "add_offsets": (C, UNCHANGED),
        "end_commit": (C, UNCHANGED),
        "end_abort": (C, UNCHANGED),
        "end_commit_v1": (C, UNCHANGED),
        "end_abort_v1": (C, UNCHANGED),
        "markers": (INV, UNCHANGED),
        "timeout": (INV, UNCHANGED),
        "expire": (OK, UNCHANGED),
    },
    TxnState.PREPARE_EPOCH_FENCE: {
        "init": (C, UNCHANGED),
        "init_keep": (C, UNCHANGED),
        "add_partitions": (C, UNCHANGED),
        "add_offsets": (C, UNCHANGED),
        "end_commit": (C, UNCHANGED),
        "end_abort": (C, UNCHANGED),
        "end_commit_v1": (C, UNCHANGED),
        "end_abort_v1": (C, UNCHANGED),
        "markers": (INV, UNCHANGED),
        "timeout": (INV, UNCHANGED),
        "expire": (OK, UNCHANGED),
    },
}

# The same events carrying the retry identity (5, 2) of the transaction that ended.
EXPECTED_RETRY: dict[TxnState, dict[str, tuple[ErrorCode, object]]] = {
    TxnState.PREPARE_COMMIT: {
        "end_commit": (C, UNCHANGED),
        "end_abort": (INV, UNCHANGED),
        "add_partitions": (F, UNCHANGED),
    },
    TxnState.PREPARE_ABORT: {
        "end_commit": (INV, UNCHANGED),
        "end_abort": (C, UNCHANGED),
        "add_partitions": (F, UNCHANGED),
    },
    TxnState.COMPLETE_COMMIT: {
        "end_commit": (OK, UNCHANGED),
        "end_abort": (INV, UNCHANGED),
        "add_partitions": (F, UNCHANGED),
    },
    TxnState.COMPLETE_ABORT: {
        "end_commit": (INV, UNCHANGED),
        "end_abort": (OK, UNCHANGED),
        "add_partitions": (F, UNCHANGED),
    },
    TxnState.ONGOING: {
        "end_commit": (F, UNCHANGED),
        "add_partitions": (F, UNCHANGED),
        "timeout": (F, UNCHANGED),
        "markers": (INV, UNCHANGED),
    },
    TxnState.EMPTY: {"end_abort": (F, UNCHANGED), "add_offsets": (F, UNCHANGED)},
}

# A producer id the shard never gave to "t".
EXPECTED_WRONG_PID: dict[TxnState, dict[str, tuple[ErrorCode, object]]] = {
    state: {
        "add_partitions": (ErrorCode.INVALID_PRODUCER_ID_MAPPING, UNCHANGED),
        "end_commit": (ErrorCode.INVALID_PRODUCER_ID_MAPPING, UNCHANGED),
    }
    for state in (
        TxnState.EMPTY,
        TxnState.ONGOING,
        TxnState.COMPLETE_COMMIT,
        TxnState.COMPLETE_ABORT,
    )
}


def _cases(
    table: dict[TxnState, dict[str, tuple[ErrorCode, object]]], pid: int, epoch: int
) -> list[tuple[TxnState, str, int, int, ErrorCode, object]]:
    return [
        (state, event, pid, epoch, error, after)
        for state, row in table.items()
        for event, (error, after) in row.items()
    ]


CASES = (
    _cases(EXPECTED, PID, EPOCH)
    + _cases(EXPECTED_RETRY, PID, EPOCH - 1)
    + _cases(EXPECTED_WRONG_PID, 9, EPOCH)
)


def test_every_state_event_pair_is_covered() -> None:
    assert set(EXPECTED) == set(TxnState)
    for row in EXPECTED.values():
        assert set(row) == set(events())


@pytest.mark.parametrize(
    ("state", "event", "pid", "epoch", "error", "after"),
    CASES,
    ids=[f"{s.name}-{e}-{p}.{ep}" for s, e, p, ep, _, _ in CASES],
)
def test_state_event(
    state: TxnState, event: str, pid: int, epoch: int, error: ErrorCode, after: object
) -> None:
    machine = machine_with(state)
    before = machine.snapshot()
    outcome = machine.apply(events(pid, epoch)[event])
    assert outcome.error is error, outcome
    meta = machine.describe("t")
    if after is UNCHANGED:
        assert machine.snapshot() == before, "a refused or idempotent event changed the state"
        assert not [e for e in outcome.effects if isinstance(e, Transition)]
    elif after is GONE:
        assert meta is None
        assert outcome.expired == ("t",)
    else:
        assert meta is not None and meta.state is after
    for effect in outcome.effects:
        if isinstance(effect, Transition) and effect.from_state is not None:
            assert effect.from_state in DESIGN_TABLE[effect.to_state]


# --- the rules table of fsm/rules.py agrees with the matrix above ----------------------

REQUEST_OF_EVENT = {
    "init": Request.INIT_PRODUCER_ID,
    "init_keep": Request.INIT_KEEP,
    "add_partitions": Request.ADD_TO_TXN,
    "add_offsets": Request.ADD_TO_TXN,
    "end_commit": Request.END_COMMIT,
    "end_abort": Request.END_ABORT,
    "end_commit_v1": Request.END_COMMIT_V1,
    "end_abort_v1": Request.END_ABORT_V1,
    "markers": Request.MARKERS_WRITTEN,
    "timeout": Request.TIMEOUT_ABORT,
    "expire": Request.EXPIRE,
}
RETRY_OF_EVENT = {"end_commit": Request.END_COMMIT_RETRY, "end_abort": Request.END_ABORT_RETRY}


def _as_expected(found: Rule) -> tuple[ErrorCode, object]:
    if found.to is TxnState.DEAD:  # an expired id is removed
        return found.error, GONE
    return found.error, found.to


def test_rules_table_is_the_matrix() -> None:
    assert set(REQUEST_OF_EVENT.values()) | set(RETRY_OF_EVENT.values()) == set(Request)
    for state, row in EXPECTED.items():
        for event, expected in row.items():
            assert _as_expected(rule(REQUEST_OF_EVENT[event], state)) == expected, (state, event)
    for state, row in EXPECTED_RETRY.items():
        for event, expected in row.items():
            if event in RETRY_OF_EVENT and state in REQUESTS[RETRY_OF_EVENT[event]]:
                assert _as_expected(rule(RETRY_OF_EVENT[event], state)) == expected, (state, event)
    for request, by_state in REQUESTS.items():
        for state, found in by_state.items():
            if found.to is not None:  # one legal transition, or two (an empty abort)
                assert state in DESIGN_TABLE[found.to] or any(
                    state in DESIGN_TABLE[via] and via in DESIGN_TABLE[found.to] for via in TxnState
                ), (request, state)


def test_the_docs_hold_the_tables() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "state-machine.md").read_text()
    assert markdown_tables() in doc, "paste fsm.rules.markdown_tables() into the doc"


def pure_step(meta: TransactionMetadata, command: Command, config: FsmConfig) -> object:
    """The pure handler for ``command`` (which raises, unlike ``apply``)."""
    if isinstance(command, InitProducerId):
        return transactions.init_producer_id(meta, command, config)
    if isinstance(command, AddPartitions):
        return transactions.add_partitions(meta, command, config)
    if isinstance(command, AddOffsets):
        return transactions.add_offsets(meta, command, config)
    if isinstance(command, EndTxn):
        return transactions.end_txn(meta, command, config)
    if isinstance(command, MarkersWritten):
        return transactions.markers_written(meta, command)
    if isinstance(command, AbortTimedOut):
        return transactions.abort_timed_out(meta, command, config)
    assert isinstance(command, ExpireTransactionalIds)
    return transactions.expire(meta, NOW) if transactions.expirable(meta, NOW, config) else None


@pytest.mark.parametrize(
    ("state", "event", "pid", "epoch", "error", "after"),
    CASES,
    ids=[f"{s.name}-{e}-{p}.{ep}" for s, e, p, ep, _, _ in CASES],
)
def test_no_request_attempts_an_illegal_transition(
    state: TxnState, event: str, pid: int, epoch: int, error: ErrorCode, after: object
) -> None:
    """The pure handlers raise IllegalTransition (``apply`` answers it as a
    bug); no (state, request) pair gets there."""
    machine = machine_with(state)
    meta = machine.describe("t")
    assert meta is not None
    pure_step(meta, events(pid, epoch)[event], machine.config)
