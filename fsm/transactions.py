"""Handlers for the transaction commands: pure functions of (metadata, command).

Each handler returns a :class:`Step`: the metadata after the command (the
same object when nothing changed, None when the id does not exist or was
removed) and the :class:`Outcome`. Error checks come before any change, in
the order Kafka's TransactionCoordinator makes them, so a refused command
changes nothing.

Epochs (KIP-890 "transactions v2"): ending a transaction bumps the epoch, so
a (producer id, epoch) pair names exactly one transaction and the markers of
a transaction carry an epoch strictly greater than its data. A participant
closes an open transaction only with a marker whose epoch is greater than
the transaction's data epoch; a late duplicate marker therefore never closes
the next transaction.

Transactions v1 (KIP-890's transaction.version 1, what Kafka clients with
EndTxn below version 5 speak): EndTxn keeps the epoch, so the producer's
epoch lasts its life, its sequences go on across transactions, and the
markers carry the data's own epoch. A participant then tells one
transaction's markers from the next's by the transaction's number
(``txn_number``), which every marker carries. v1 and v2 are chosen per
EndTxn, by the version the client speaks.

Two-phase commit for an external transaction manager (KIP-939): a producer
that initializes with ``enable_two_phase_commit`` opens transactions that
never time out, and one that initializes with ``keep_prepared_txn`` while
a transaction is Ongoing keeps it open instead of aborting it: the epoch is
bumped past it (fencing the producer that wrote it), the transaction takes
no more records or participants, and the new producer commits or aborts it
with EndTxn at the bumped epoch. Its markers then carry an epoch two above
the records', still strictly greater.

One file on purpose (about 560 lines): the handlers share their checks and
their order (producer id and epoch first, then the state table), and reading
them side by side is how one sees that every request is checked alike.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fsm.commands import (
    AbortTimedOut,
    AddOffsets,
    AddPartitions,
    EndTxn,
    InitProducerId,
    MarkersWritten,
)
from fsm.config import FsmConfig
from fsm.effects import Effect, Outcome, ProducerFenced, Transition, WriteMarkers, fail
from fsm.errors import ErrorCode, InvariantViolation
from fsm.metadata import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_TIMESTAMP,
    TopicPartition,
    TransactionMetadata,
    transition,
)
from fsm.rules import NOT_TIMED_OUT, STALE_MARKERS, Request, Rule, rule
from fsm.states import COMPLETION_OF, PREPARE_STATES, TRANSIENT_STATES, TxnState

INT32_MAX = 2**31 - 1
#: Why a kept transaction (KIP-939) refuses records and participants.
KEPT_REFUSAL = (
    "the transaction was kept by InitProducerId (keep_prepared_txn): it takes no more "
    "records or participants; commit or abort it"
)


@dataclass(frozen=True)
class Step:
    """Metadata after a handler ran, and what to answer."""

    meta: TransactionMetadata | None
    outcome: Outcome


def refuse(meta: TransactionMetadata | None, error: ErrorCode, message: str = "") -> Step:
    """A step that changes nothing."""
    return Step(meta, fail(error, message))


def refusal(meta: TransactionMetadata, request: Request) -> Step | None:
    """The refusal the rules table gives ``request`` in ``meta``'s state, or None."""
    found = rule(request, meta.state)
    return refuse_by(meta, found) if found.refused else None


def refuse_by(meta: TransactionMetadata | None, refused: Rule) -> Step:
    """A step that changes nothing, answered as the refusal rule ``refused`` says."""
    state = TxnState.EMPTY if meta is None else meta.state
    return refuse(meta, refused.error, refused.message(state))


def moved(old: TransactionMetadata | None, new: TransactionMetadata, now_ms: int) -> Transition:
    """The applied-transitions record of ``old`` becoming ``new``."""
    return Transition(
        transactional_id=new.transactional_id,
        producer_id=new.producer_id,
        producer_epoch=new.producer_epoch,
        from_state=None if old is None else old.state,
        to_state=new.state,
        partitions=tuple(sorted(new.partitions)),
        groups=tuple(sorted(new.groups)),
        now_ms=now_ms,
        txn_number=new.txn_number,
    )


def markers_for(meta: TransactionMetadata) -> WriteMarkers:
    """The markers a Prepare* transaction still owes its participants."""
    return WriteMarkers(
        transactional_id=meta.transactional_id,
        producer_id=meta.producer_id,
        producer_epoch=meta.producer_epoch,
        coordinator_epoch=meta.coordinator_epoch,
        commit=meta.state is TxnState.PREPARE_COMMIT,
        partitions=tuple(sorted(meta.partitions)),
        groups=tuple(sorted(meta.groups)),
        transaction_version=meta.transaction_version,
        txn_number=meta.txn_number,
    )


# --- InitProducerId -----------------------------------------------------------------


def init_producer_id(
    meta: TransactionMetadata | None, cmd: InitProducerId, config: FsmConfig
) -> Step:
    """InitProducerId: create the id, bump the epoch, or fence and abort.

    An open transaction is fenced (epoch bump) and aborted first; the answer
    is then CONCURRENT_TRANSACTIONS and the producer retries once the abort
    completes. An exhausted epoch rotates to ``cmd.new_producer_id``.
    """
    if not cmd.transactional_id:
        return refuse(meta, ErrorCode.INVALID_REQUEST, "transactional.id must not be empty")
    if cmd.enable_two_phase_commit:
        # A transaction in a two-phase commit never times out, so its
        # timeout is not bounded by transaction.max.timeout.ms (KIP-939).
        if cmd.timeout_ms <= 0:
            return refuse(
                meta,
                ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                f"transaction timeout {cmd.timeout_ms} ms must be positive",
            )
    elif not 0 < cmd.timeout_ms <= config.transaction_max_timeout_ms:
        return refuse(
            meta,
            ErrorCode.INVALID_TRANSACTION_TIMEOUT,
            f"transaction timeout {cmd.timeout_ms} ms is not in "
            f"(0, {config.transaction_max_timeout_ms}] (transaction.max.timeout.ms)",
        )
    expected = cmd.expected_producer_id != NO_PRODUCER_ID
    if expected != (cmd.expected_producer_epoch != NO_PRODUCER_EPOCH):
        return refuse(meta, ErrorCode.INVALID_REQUEST, "expected producer id and epoch go together")
    if meta is None:
        if cmd.new_producer_id == NO_PRODUCER_ID:
            return refuse(meta, ErrorCode.CONCURRENT_TRANSACTIONS, "no producer id was stamped")
        created = TransactionMetadata(
            transactional_id=cmd.transactional_id,
            producer_id=cmd.new_producer_id,
            producer_epoch=0,
            state=TxnState.EMPTY,
            timeout_ms=cmd.timeout_ms,
            last_update_ms=cmd.now_ms,
            coordinator_epoch=cmd.coordinator_epoch,
            two_phase=cmd.enable_two_phase_commit,
        )
        return Step(created, _answer(created, (moved(None, created, cmd.now_ms),)))
    refused = refusal(
        meta, Request.INIT_KEEP if cmd.keep_prepared_txn else Request.INIT_PRODUCER_ID
    )
    if refused is not None:
        return refused
    if expected and not _expected_id_valid(meta, cmd, config):
        return refuse(meta, ErrorCode.PRODUCER_FENCED, "expected producer id does not match")
    if meta.state is TxnState.ONGOING and cmd.keep_prepared_txn:
        return _keep_ongoing(meta, cmd, config)
    if meta.state is TxnState.ONGOING:
        fenced = fence_and_abort(
            meta, cmd.now_ms, cmd.coordinator_epoch, "init_producer_id", config
        )
        return Step(
            fenced.meta,
            replace(
                fenced.outcome,
                error=ErrorCode.CONCURRENT_TRANSACTIONS,
                message="an open transaction was fenced and is being aborted; retry",
            ),
        )
    return _bump_idle(meta, cmd, config)


def _expected_id_valid(meta: TransactionMetadata, cmd: InitProducerId, config: FsmConfig) -> bool:
    # KIP-360: the caller proves it is the current producer, or a retry of
    # the producer whose exhausted epoch made the id rotate.
    return cmd.expected_producer_id == meta.producer_id or (
        cmd.expected_producer_id == meta.last_producer_id
        and config.bump_exhausts(cmd.expected_producer_epoch)
    )


def _keep_ongoing(meta: TransactionMetadata, cmd: InitProducerId, config: FsmConfig) -> Step:
    """KIP-939's InitProducerId with ``keep_prepared_txn`` on an Ongoing
    transaction: bump the epoch (fencing the producer that wrote it) and
    keep the transaction open, remembering the identity of its records."""
    expected = (cmd.expected_producer_id, cmd.expected_producer_epoch)
    if expected[0] != NO_PRODUCER_ID:
        if meta.kept and expected == (meta.last_producer_id, meta.last_producer_epoch):
            return Step(meta, _answer(meta))  # a retry of the keep that bumped
        if expected != (meta.producer_id, meta.producer_epoch):
            return refuse(meta, ErrorCode.PRODUCER_FENCED, "expected epoch is not the current one")
    kept = {
        "ongoing_producer_id": meta.ongoing_producer_id if meta.kept else meta.producer_id,
        "ongoing_producer_epoch": meta.ongoing_producer_epoch if meta.kept else meta.producer_epoch,
        "two_phase": cmd.enable_two_phase_commit,
        "timeout_ms": cmd.timeout_ms,
        "last_update_ms": cmd.now_ms,
        "coordinator_epoch": cmd.coordinator_epoch,
    }
    if config.epoch_exhausted(meta.producer_epoch + 1):
        # The markers need an epoch above the kept one under the records'
        # own producer id, and the bump would leave none: the transaction
        # is kept without one (the old producer is not fenced, as Kafka's
        # keep never fences), so that a decided commit can always be made.
        new = transition(meta, TxnState.ONGOING, **kept)
        return Step(new, _answer(new, (moved(meta, new, cmd.now_ms),)))
    return _bumped(meta, cmd, TxnState.ONGOING, **kept)


def _bumped(
    meta: TransactionMetadata, cmd: InitProducerId, target: TxnState, **changes: Any
) -> Step:
    """InitProducerId's bump on the producer's behalf, to ``target``: the
    epoch + 1, fencing the producer at the old one. The old identity is the
    retry identity (``last_producer_*``) only when the caller named it
    (KIP-360's expected id and epoch)."""
    new = transition(
        meta,
        target,
        producer_epoch=meta.producer_epoch + 1,
        last_producer_id=meta.producer_id,
        last_producer_epoch=(
            NO_PRODUCER_EPOCH
            if cmd.expected_producer_epoch == NO_PRODUCER_EPOCH
            else meta.producer_epoch
        ),
        **changes,
    )
    return _fencing(meta, new, cmd.now_ms)


def _fencing(meta: TransactionMetadata, new: TransactionMetadata, now_ms: int) -> Step:
    """``meta`` becomes ``new``, fencing the producer at ``meta``'s identity."""
    fenced = ProducerFenced(
        meta.transactional_id,
        meta.producer_id,
        meta.producer_epoch,
        new.producer_epoch,
        "init_producer_id",
    )
    return Step(new, _answer(new, (fenced, moved(meta, new, now_ms))))


def _bump_idle(meta: TransactionMetadata, cmd: InitProducerId, config: FsmConfig) -> Step:
    common = {
        "timeout_ms": cmd.timeout_ms,
        "last_update_ms": cmd.now_ms,
        "txn_start_ms": NO_TIMESTAMP,
        "coordinator_epoch": cmd.coordinator_epoch,
        "two_phase": cmd.enable_two_phase_commit,
    }
    is_retry = (
        cmd.expected_producer_epoch != NO_PRODUCER_EPOCH
        and meta.last_producer_epoch != NO_PRODUCER_EPOCH
        and (cmd.expected_producer_id, cmd.expected_producer_epoch)
        == (meta.last_producer_id, meta.last_producer_epoch)
    )
    if is_retry:
        # The previous InitProducerId (or EndTxn) already bumped on this
        # producer's behalf; answer what it answered.
        return Step(meta, _answer(meta))
    if cmd.expected_producer_epoch not in (NO_PRODUCER_EPOCH, meta.producer_epoch) or (
        cmd.expected_producer_id not in (NO_PRODUCER_ID, meta.producer_id)
    ):
        return refuse(meta, ErrorCode.PRODUCER_FENCED, "expected epoch is not the current one")
    if config.bump_exhausts(meta.producer_epoch):
        # An exhausted epoch is never handed out: rotate to a new producer id.
        if cmd.new_producer_id == NO_PRODUCER_ID:
            return refuse(
                meta, ErrorCode.CONCURRENT_TRANSACTIONS, "epoch exhausted; no producer id stamped"
            )
        new = transition(
            meta,
            TxnState.EMPTY,
            producer_id=cmd.new_producer_id,
            producer_epoch=0,
            last_producer_id=meta.producer_id,
            last_producer_epoch=meta.producer_epoch,
            **common,
        )
        return _fencing(meta, new, cmd.now_ms)
    return _bumped(meta, cmd, TxnState.EMPTY, **common)


def fence_and_abort(
    meta: TransactionMetadata,
    now_ms: int,
    coordinator_epoch: int,
    reason: str,
    config: FsmConfig,
) -> Step:
    """Ongoing → PrepareEpochFence → PrepareAbort: bump the epoch, abort.

    The bumped epoch fences the producer and is the epoch of the abort
    markers. ``last_producer_epoch`` is cleared so the fenced epoch is never
    mistaken for a retry.
    """
    # An Ongoing epoch is never exhausted (check_producer refuses exhausted
    # epochs and InitProducerId never hands one out), so the bump fits.
    if meta.producer_epoch >= config.max_producer_epoch:
        raise InvariantViolation(f"{meta.transactional_id!r}: Ongoing at the largest epoch")
    fence = transition(
        meta,
        TxnState.PREPARE_EPOCH_FENCE,
        producer_epoch=meta.producer_epoch + 1,
        transaction_version=2,
        last_producer_epoch=NO_PRODUCER_EPOCH,
        last_update_ms=now_ms,
        coordinator_epoch=coordinator_epoch,
    )
    aborting = transition(fence, TxnState.PREPARE_ABORT, last_update_ms=now_ms)
    effects: tuple[Effect, ...] = (
        ProducerFenced(
            meta.transactional_id,
            meta.producer_id,
            meta.producer_epoch,
            fence.producer_epoch,
            reason,
        ),
        moved(meta, fence, now_ms),
        moved(fence, aborting, now_ms),
        markers_for(aborting),
    )
    return Step(aborting, _answer(aborting, effects))


def _answer(meta: TransactionMetadata, effects: tuple[Effect, ...] = ()) -> Outcome:
    """Success, answering with the producer id/epoch the producer must use
    next, and the identity of the kept transaction it may end (KIP-939)."""
    if meta.next_producer_id != NO_PRODUCER_ID:
        return Outcome(producer_id=meta.next_producer_id, producer_epoch=0, effects=effects)
    return Outcome(
        producer_id=meta.producer_id,
        producer_epoch=meta.producer_epoch,
        ongoing_producer_id=meta.ongoing_producer_id if meta.kept else NO_PRODUCER_ID,
        ongoing_producer_epoch=meta.ongoing_producer_epoch if meta.kept else NO_PRODUCER_EPOCH,
        effects=effects,
    )


# --- AddPartitionsToTxn / AddOffsetsToTxn --------------------------------------------


def check_producer(
    meta: TransactionMetadata | None, producer_id: int, producer_epoch: int, config: FsmConfig
) -> tuple[ErrorCode, str]:
    """Kafka's checks of a producer's id and epoch against the metadata, in
    order; the error and why. An exhausted epoch is refused even when it is
    the current one (a coordinator fence can leave the id there): it has no
    larger epoch left for a transaction's markers, and the next
    InitProducerId rotates the producer id."""
    if meta is None:
        return ErrorCode.INVALID_PRODUCER_ID_MAPPING, ""
    if meta.state in TRANSIENT_STATES:
        return ErrorCode.CONCURRENT_TRANSACTIONS, f"transaction is {meta.state.name}"
    if producer_id != meta.producer_id:
        if meta.pending_state is not None and producer_id == meta.next_producer_id:
            return ErrorCode.CONCURRENT_TRANSACTIONS, "the producer id is rotating; retry"
        return ErrorCode.INVALID_PRODUCER_ID_MAPPING, ""
    if producer_epoch != meta.producer_epoch:
        return ErrorCode.PRODUCER_FENCED, ""
    if config.epoch_exhausted(producer_epoch):
        return (
            ErrorCode.PRODUCER_FENCED,
            f"epoch {producer_epoch} is exhausted; InitProducerId rotates",
        )
    if meta.pending_state is not None:
        return ErrorCode.CONCURRENT_TRANSACTIONS, f"transaction is {meta.state.name}"
    return ErrorCode.NONE, ""


def verify_ongoing(
    meta: TransactionMetadata | None, producer_id: int, producer_epoch: int
) -> tuple[ErrorCode, str]:
    """KIP-890 verification, asked by a participant before it accepts a
    producer's write: is (``producer_id``, ``producer_epoch``) the producer of
    an ongoing transaction? NONE, or the error and why."""
    if meta is None or producer_id != meta.producer_id:
        return (
            ErrorCode.INVALID_PRODUCER_ID_MAPPING,
            "not the transactional id's current producer id",
        )
    if producer_epoch != meta.producer_epoch:
        return ErrorCode.PRODUCER_FENCED, f"epoch {producer_epoch} is not the current one"
    if meta.state is not TxnState.ONGOING:
        return ErrorCode.INVALID_TXN_STATE, f"no ongoing transaction (state {meta.state.name})"
    if meta.kept:
        return ErrorCode.INVALID_TXN_STATE, KEPT_REFUSAL
    return ErrorCode.NONE, ""


def verify_group(
    meta: TransactionMetadata | None, producer_id: int, producer_epoch: int, group_id: str
) -> tuple[ErrorCode, str]:
    """TxnOffsetCommit's verification: is ``group_id`` in this producer's
    ongoing transaction (added with AddOffsetsToTxn)?"""
    error, why = verify_ongoing(meta, producer_id, producer_epoch)
    if error is ErrorCode.NONE and meta is not None and group_id not in meta.groups:
        why = f"group {group_id!r} is not in the transaction (AddOffsetsToTxn first)"
        return ErrorCode.INVALID_TXN_STATE, why
    return error, why


def validate_partitions(partitions: tuple[TopicPartition, ...], config: FsmConfig) -> str | None:
    """Why a partition list is malformed, or None."""
    if not partitions:
        return "no partitions given"
    if len(partitions) > config.max_partitions_per_request:
        return (
            f"{len(partitions)} partitions exceed the limit of {config.max_partitions_per_request}"
        )
    for topic, partition in partitions:
        if not topic or not 0 <= partition <= INT32_MAX:
            return f"invalid topic-partition {topic!r}-{partition}"
    return None


def add_partitions(meta: TransactionMetadata | None, cmd: AddPartitions, config: FsmConfig) -> Step:
    """AddPartitionsToTxn: start or extend the transaction; idempotent."""
    problem = validate_partitions(cmd.partitions, config)
    if problem is not None:
        return refuse(meta, ErrorCode.INVALID_REQUEST, problem)
    return _add_participants(
        meta,
        cmd.producer_id,
        cmd.producer_epoch,
        frozenset(cmd.partitions),
        frozenset(),
        cmd.now_ms,
        cmd.coordinator_epoch,
        config,
    )


def add_offsets(meta: TransactionMetadata | None, cmd: AddOffsets, config: FsmConfig) -> Step:
    """AddOffsetsToTxn: the group's offsets shard joins the transaction."""
    if not cmd.group_id:
        return refuse(meta, ErrorCode.INVALID_REQUEST, "group id must not be empty")
    return _add_participants(
        meta,
        cmd.producer_id,
        cmd.producer_epoch,
        frozenset(),
        frozenset({cmd.group_id}),
        cmd.now_ms,
        cmd.coordinator_epoch,
        config,
    )


def _add_participants(
    meta: TransactionMetadata | None,
    producer_id: int,
    producer_epoch: int,
    partitions: frozenset[TopicPartition],
    groups: frozenset[str],
    now_ms: int,
    coordinator_epoch: int,
    config: FsmConfig,
) -> Step:
    error, why = check_producer(meta, producer_id, producer_epoch, config)
    if error is not ErrorCode.NONE or meta is None:
        return refuse(meta, error, why)
    refused = refusal(meta, Request.ADD_TO_TXN)
    if refused is not None:
        return refused
    if meta.kept:
        return refuse(meta, ErrorCode.INVALID_TXN_STATE, KEPT_REFUSAL)
    ongoing = meta.state is TxnState.ONGOING
    if ongoing and partitions <= meta.partitions and groups <= meta.groups:
        return Step(meta, _answer(meta))
    new = transition(
        meta,
        TxnState.ONGOING,
        partitions=(meta.partitions | partitions) if ongoing else partitions,
        groups=(meta.groups | groups) if ongoing else groups,
        txn_start_ms=meta.txn_start_ms if ongoing else now_ms,
        last_update_ms=now_ms,
        coordinator_epoch=coordinator_epoch,
        # A new transaction begins: the kept one before it, if any, is over.
        ongoing_producer_id=meta.ongoing_producer_id if ongoing else NO_PRODUCER_ID,
        ongoing_producer_epoch=meta.ongoing_producer_epoch if ongoing else NO_PRODUCER_EPOCH,
        txn_number=meta.txn_number if ongoing else meta.txn_number + 1,
    )
    return Step(new, _answer(new, (moved(meta, new, now_ms),)))


# --- EndTxn -------------------------------------------------------------------------


def end_txn(meta: TransactionMetadata | None, cmd: EndTxn, config: FsmConfig) -> Step:
    """EndTxn: Ongoing → PrepareCommit|PrepareAbort with an epoch bump.

    Retries are written out: a retry (the id/epoch of the transaction that
    was ended) of the same decision answers CONCURRENT_TRANSACTIONS while
    the markers are written and success once complete; the other decision
    is INVALID_TXN_STATE. A request with the current identity while markers
    are written belongs to the next transaction, whatever its decision:
    CONCURRENT_TRANSACTIONS, retried once the previous one is complete. An
    abort with the current epoch and no open transaction aborts an empty
    transaction (bumping the epoch).
    """
    if meta is None:
        return refuse(meta, ErrorCode.INVALID_PRODUCER_ID_MAPPING)
    if cmd.transaction_version == 1:
        return _end_v1(meta, cmd)
    is_retry = (
        meta.last_producer_epoch != NO_PRODUCER_EPOCH
        and (cmd.producer_id, cmd.producer_epoch)
        == (meta.last_producer_id, meta.last_producer_epoch)
        and meta.state in PREPARE_STATES | {TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}
    )
    if is_retry:
        refused = refusal(meta, Request.END_COMMIT_RETRY if cmd.commit else Request.END_ABORT_RETRY)
        return Step(meta, _answer(meta)) if refused is None else refused
    error, why = check_producer(meta, cmd.producer_id, cmd.producer_epoch, config)
    if error is not ErrorCode.NONE:
        return refuse(meta, error, why)
    refused = refusal(meta, Request.END_COMMIT if cmd.commit else Request.END_ABORT)
    return _end(meta, cmd, config) if refused is None else refused


def _end_v1(meta: TransactionMetadata, cmd: EndTxn) -> Step:
    """EndTxn of transactions v1: Ongoing → Prepare* keeping the epoch, so
    the markers carry the data's epoch (and the transaction's number); a
    retry carries the same identity and the rules table answers it."""
    if cmd.producer_id != meta.producer_id:
        return refuse(meta, ErrorCode.INVALID_PRODUCER_ID_MAPPING)
    if cmd.producer_epoch != meta.producer_epoch:
        return refuse(meta, ErrorCode.PRODUCER_FENCED)
    found = rule(Request.END_COMMIT_V1 if cmd.commit else Request.END_ABORT_V1, meta.state)
    if found.refused:
        return refuse_by(meta, found)
    if found.to is None:  # a retry of the decision made: answered as it was
        return Step(meta, _answer(meta))
    prepared = transition(
        meta,
        found.to,
        transaction_version=1,
        last_update_ms=cmd.now_ms,
        coordinator_epoch=cmd.coordinator_epoch,
    )
    effects = (moved(meta, prepared, cmd.now_ms), markers_for(prepared))
    return Step(prepared, _answer(prepared, effects))


def _end(meta: TransactionMetadata, cmd: EndTxn, config: FsmConfig) -> Step:
    """Prepare* with an epoch bump; with no participants (an abort of an
    empty transaction) the Complete* state follows at once."""
    rotate = config.epoch_exhausted(meta.producer_epoch + 1)
    if rotate and cmd.new_producer_id == NO_PRODUCER_ID:
        return refuse(
            meta, ErrorCode.CONCURRENT_TRANSACTIONS, "epoch exhausted; no producer id stamped"
        )
    prepared = transition(
        meta,
        TxnState.PREPARE_COMMIT if cmd.commit else TxnState.PREPARE_ABORT,
        producer_epoch=meta.producer_epoch + 1,
        transaction_version=2,
        last_producer_id=meta.producer_id,
        last_producer_epoch=meta.producer_epoch,
        next_producer_id=cmd.new_producer_id if rotate else NO_PRODUCER_ID,
        last_update_ms=cmd.now_ms,
        coordinator_epoch=cmd.coordinator_epoch,
    )
    first = moved(meta, prepared, cmd.now_ms)
    if prepared.has_participants:
        return Step(prepared, _answer(prepared, (first, markers_for(prepared))))
    done = complete(prepared, cmd.now_ms)
    return Step(done, _answer(done, (first, moved(prepared, done, cmd.now_ms))))


def complete(meta: TransactionMetadata, now_ms: int) -> TransactionMetadata:
    """Prepare* → Complete*: participants cleared, a pending rotation applied."""
    changes: dict[str, object] = {
        "partitions": frozenset(),
        "groups": frozenset(),
        "last_update_ms": now_ms,
    }
    if meta.next_producer_id != NO_PRODUCER_ID:
        changes.update(
            producer_id=meta.next_producer_id, producer_epoch=0, next_producer_id=NO_PRODUCER_ID
        )
    return transition(meta, COMPLETION_OF[meta.state], **changes)


# --- marker completion and timeouts -------------------------------------------------


def markers_written(meta: TransactionMetadata | None, cmd: MarkersWritten) -> Step:
    """Participants acknowledged their markers; Complete* once none is left.

    Acknowledgements for a transaction that is not (or no longer) in a
    Prepare* state with the markers' identity are stale and refused; an
    acknowledgement repeated for a participant already removed is a no-op.
    """
    if (
        meta is None
        or (cmd.producer_id, cmd.producer_epoch) != (meta.producer_id, meta.producer_epoch)
        or cmd.txn_number not in (-1, meta.txn_number)
    ):
        return refuse_by(meta, STALE_MARKERS)
    refused = refusal(meta, Request.MARKERS_WRITTEN)
    if refused is not None:
        return refused
    partitions = meta.partitions - frozenset(cmd.partitions)
    groups = meta.groups - frozenset(cmd.groups)
    if partitions == meta.partitions and groups == meta.groups:
        return Step(meta, Outcome())
    remaining = replace(meta, partitions=partitions, groups=groups, last_update_ms=cmd.now_ms)
    if remaining.has_participants:
        return Step(remaining, Outcome())
    done = complete(remaining, cmd.now_ms)
    return Step(done, Outcome(effects=(moved(meta, done, cmd.now_ms),)))


def has_timed_out(meta: TransactionMetadata, now_ms: int) -> bool:
    """Whether an Ongoing transaction has outlived its timeout at ``now_ms``
    (never one of a two-phase commit producer: KIP-939)."""
    return (
        meta.state is TxnState.ONGOING
        and not meta.two_phase
        and meta.pending_state is None
        and meta.txn_start_ms + meta.timeout_ms < now_ms
    )


def abort_timed_out(
    meta: TransactionMetadata | None, cmd: AbortTimedOut, config: FsmConfig
) -> Step:
    """The sweeper's abort: fence the epoch, then abort (same as Kafka)."""
    if meta is None:
        return refuse(meta, ErrorCode.INVALID_PRODUCER_ID_MAPPING)
    if (cmd.producer_id, cmd.producer_epoch) != (meta.producer_id, meta.producer_epoch):
        return refuse(meta, ErrorCode.PRODUCER_FENCED, "the transaction moved on since it was seen")
    refused = refusal(meta, Request.TIMEOUT_ABORT)
    if refused is not None:
        return refused
    if not has_timed_out(meta, cmd.now_ms):
        return refuse_by(meta, NOT_TIMED_OUT)
    return fence_and_abort(meta, cmd.now_ms, cmd.coordinator_epoch, "timeout", config)


def expirable(meta: TransactionMetadata, now_ms: int, config: FsmConfig) -> bool:
    """Whether the id has been idle for transactional.id.expiration.ms."""
    return (
        rule(Request.EXPIRE, meta.state).to is TxnState.DEAD
        and meta.pending_state is None
        and meta.last_update_ms + config.transactional_id_expiration_ms <= now_ms
    )


def expire(meta: TransactionMetadata, now_ms: int) -> TransactionMetadata:
    """Move an expirable id to Dead (the caller then removes it)."""
    return transition(meta, TxnState.DEAD, last_update_ms=now_ms)
