"""Which request is legal in which state, and what it answers: the rules as data.

:data:`fsm.states.VALID_PREVIOUS` says which state may follow which;
:data:`REQUESTS` says, for each transaction request and each state, what the
request does there when it carries the producer's current identity (and for
EndTxn, the retry identity of the transaction that ended). The handlers in
:mod:`fsm.transactions` take their state-dependent refusals from it; their
checks of the request itself (malformed fields, a wrong producer id or epoch,
an exhausted epoch) come first and are not state rules. ``docs/state-machine.md``
holds both tables as rendered by :func:`markdown_tables`, and a test keeps
them equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from fsm.errors import ErrorCode
from fsm.states import IDLE_STATES, PREPARE_STATES, TRANSIENT_STATES, VALID_PREVIOUS, TxnState


class Request(Enum):
    """The requests and commands that act on one transactional.id."""

    INIT_PRODUCER_ID = "InitProducerId"
    INIT_KEEP = "InitProducerId(keep_prepared_txn)"
    ADD_TO_TXN = "AddPartitionsToTxn / AddOffsetsToTxn"
    END_COMMIT = "EndTxn(commit)"
    END_ABORT = "EndTxn(abort)"
    END_COMMIT_RETRY = "EndTxn(commit), retry of the ended transaction"
    END_ABORT_RETRY = "EndTxn(abort), retry of the ended transaction"
    END_COMMIT_V1 = "EndTxn(commit), transactions v1"
    END_ABORT_V1 = "EndTxn(abort), transactions v1"
    MARKERS_WRITTEN = "markers written"
    TIMEOUT_ABORT = "timeout abort"
    EXPIRE = "expire transactional.id"


@dataclass(frozen=True)
class Rule:
    """What a request does in one state.

    ``to`` is the state afterwards (None: unchanged); ``error`` the answer's
    code. A rule with no ``to`` and an error is a refusal, answered with
    ``why`` (``{state}`` stands for the state's name).
    """

    error: ErrorCode = ErrorCode.NONE
    to: TxnState | None = None
    why: str = ""

    @property
    def refused(self) -> bool:
        return self.to is None and self.error is not ErrorCode.NONE

    def message(self, state: TxnState) -> str:
        return self.why.format(state=state.name)


def _each(states: frozenset[TxnState], rule_: Rule) -> dict[TxnState, Rule]:
    return dict.fromkeys(states, rule_)


#: Markers are being written (the request belongs to the next transaction and
#: waits), or a state that never outlives one command was found: busy.
_BUSY = _each(
    PREPARE_STATES | TRANSIENT_STATES,
    Rule(ErrorCode.CONCURRENT_TRANSACTIONS, why="transaction is {state}"),
)


def _end_retry(commit: bool) -> dict[TxnState, Rule]:
    """EndTxn retried with the ended transaction's identity (only a Prepare*
    or Complete* state has one): the same decision waits for its markers,
    then succeeds without a change; the other decision is refused."""
    same, other = (
        (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT),
        (TxnState.PREPARE_ABORT, TxnState.COMPLETE_ABORT),
    )
    if not commit:
        same, other = other, same
    wrong = Rule(ErrorCode.INVALID_TXN_STATE, why="transaction is {state}")
    return {
        same[0]: Rule(ErrorCode.CONCURRENT_TRANSACTIONS, why="markers are being written"),
        same[1]: Rule(),
        other[0]: wrong,
        other[1]: wrong,
    }


def _end_v1(commit: bool) -> dict[TxnState, Rule]:
    """EndTxn of transactions v1 (Kafka's TV1): no epoch bump, so a retry
    carries the current identity, as the next transaction's end does. In a
    Prepare* or Complete* state a commit is the ended transaction's retry
    (a commit after an abort, or with nothing open, is refused). An abort
    with nothing open succeeds and changes nothing: a Kafka client aborts a
    transaction whose AddPartitionsToTxn may never have reached the
    coordinator (it timed out), and no partition took a record of it
    without the coordinator's add. Such an abort that comes while the
    previous transaction is still being committed waits for it
    (CONCURRENT_TRANSACTIONS, parked by the leader) instead of being
    refused: Kafka's INVALID_TXN_STATE there is fatal to librdkafka, whose
    next transaction's add times out exactly when the commit's markers wait
    for a partition that is down."""
    idle_abort = (
        {}
        if commit
        else {
            **_each(IDLE_STATES, Rule()),
            TxnState.PREPARE_COMMIT: Rule(
                ErrorCode.CONCURRENT_TRANSACTIONS, why="the previous transaction is {state}"
            ),
        }
    )
    return {
        **_end_retry(commit),
        TxnState.EMPTY: Rule(ErrorCode.INVALID_TXN_STATE, why="no transaction to end ({state})"),
        **idle_abort,
        TxnState.ONGOING: Rule(to=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT),
        **_each(
            TRANSIENT_STATES, Rule(ErrorCode.CONCURRENT_TRANSACTIONS, why="transaction is {state}")
        ),
    }


#: Marker acknowledgements for no Prepare* transaction (or another identity's).
STALE_MARKERS = Rule(ErrorCode.INVALID_TXN_STATE, why="no Prepare* transaction with these markers")
#: A timeout abort of a transaction that is not Ongoing (or not yet past its timeout).
NOT_TIMED_OUT = Rule(ErrorCode.INVALID_TXN_STATE, why="transaction has not timed out")

#: For each request, what it does in each state (see :class:`Rule`).
REQUESTS: Mapping[Request, Mapping[TxnState, Rule]] = {
    Request.INIT_PRODUCER_ID: {
        **_each(IDLE_STATES, Rule(to=TxnState.EMPTY)),
        # The open transaction is fenced and aborted; the producer retries.
        TxnState.ONGOING: Rule(ErrorCode.CONCURRENT_TRANSACTIONS, TxnState.PREPARE_ABORT),
        **_BUSY,
    },
    Request.INIT_KEEP: {
        **_each(IDLE_STATES, Rule(to=TxnState.EMPTY)),
        # KIP-939: the open transaction is kept at a bumped epoch (fencing the
        # producer that wrote it) for the new producer to end.
        TxnState.ONGOING: Rule(to=TxnState.ONGOING),
        **_BUSY,
    },
    Request.ADD_TO_TXN: {
        **_each(IDLE_STATES | {TxnState.ONGOING}, Rule(to=TxnState.ONGOING)),
        **_BUSY,
    },
    Request.END_COMMIT: {
        **_each(
            IDLE_STATES, Rule(ErrorCode.INVALID_TXN_STATE, why="no transaction to commit ({state})")
        ),
        TxnState.ONGOING: Rule(to=TxnState.PREPARE_COMMIT),
        **_BUSY,
    },
    Request.END_ABORT: {
        # With nothing open, an empty transaction is aborted (the epoch bumps).
        **_each(IDLE_STATES, Rule(to=TxnState.COMPLETE_ABORT)),
        TxnState.ONGOING: Rule(to=TxnState.PREPARE_ABORT),
        **_BUSY,
    },
    Request.END_COMMIT_RETRY: _end_retry(commit=True),
    Request.END_ABORT_RETRY: _end_retry(commit=False),
    Request.END_COMMIT_V1: _end_v1(commit=True),
    Request.END_ABORT_V1: _end_v1(commit=False),
    Request.MARKERS_WRITTEN: {
        **{s: STALE_MARKERS for s in TxnState},
        TxnState.PREPARE_COMMIT: Rule(to=TxnState.COMPLETE_COMMIT),
        TxnState.PREPARE_ABORT: Rule(to=TxnState.COMPLETE_ABORT),
    },
    Request.TIMEOUT_ABORT: {
        **{s: NOT_TIMED_OUT for s in TxnState},
        TxnState.ONGOING: Rule(to=TxnState.PREPARE_ABORT),
    },
    Request.EXPIRE: {
        **{s: Rule() for s in TxnState},
        **_each(IDLE_STATES, Rule(to=TxnState.DEAD)),
    },
}


def rule(request: Request, state: TxnState) -> Rule:
    """What ``request`` does in ``state`` (the retry rows hold only the
    Prepare* and Complete* states, the only ones with a retry identity)."""
    return REQUESTS[request][state]


# --- the tables of docs/state-machine.md ----------------------------------------------


def state_title(state: TxnState) -> str:
    """Kafka's name of a state: PREPARE_COMMIT is PrepareCommit."""
    return "".join(word.capitalize() for word in state.name.split("_"))


def _cell(rule_: Rule) -> str:
    if rule_.to is None:
        return "—" if rule_.error is ErrorCode.NONE else rule_.error.name
    moved = f"→ {state_title(rule_.to)}"
    return moved if rule_.error is ErrorCode.NONE else f"{moved}, {rule_.error.name}"


def markdown_tables() -> str:
    """The transition table and the request table, as markdown."""
    lines = ["| state | may be entered from |", "|---|---|"]
    for state in TxnState:
        sources = ", ".join(state_title(s) for s in sorted(VALID_PREVIOUS[state]))
        lines.append(f"| {state_title(state)} | {sources} |")
    lines += [
        "",
        "| request | " + " | ".join(state_title(s) for s in TxnState) + " |",
        "|---" * (len(TxnState) + 1) + "|",
    ]
    for request, row in REQUESTS.items():
        cells = (_cell(row[s]) if s in row else "n/a" for s in TxnState)
        lines.append(f"| {request.value} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
