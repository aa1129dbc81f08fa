"""Per-transactional.id metadata and the one transition function."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from fsm.errors import CommandError, IllegalTransition
from fsm.states import COMPLETION_OF, TxnState, is_legal
from fsm.wire import as_bool, as_int, as_list, as_str
from raftcoord.protocol.types import TopicPartition as TopicPartition

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_TIMESTAMP = -1


@dataclass(frozen=True)
class TransactionMetadata:
    """What a shard knows about one transactional.id.

    ``producer_id``/``producer_epoch`` are what the producer must use now. In a
    Prepare* state they are also the identity the markers carry: the epoch
    was bumped past the transaction's data epoch when the transaction ended,
    so markers are always strictly newer than the data they close.
    ``last_producer_id``/``last_producer_epoch`` are the identity before the
    last bump made on the producer's behalf (EndTxn or InitProducerId); they
    let an idempotent retry be recognised. A fence made by the coordinator
    (timeout, or InitProducerId from another instance) clears
    ``last_producer_epoch`` so a fenced epoch is never taken for a retry.
    ``next_producer_id`` is set while a Prepare* state waits to rotate to a
    new producer id because the epoch is exhausted.
    ``pending_state`` is the state the in-flight two-phase transition will
    end in (the Complete* state of a Prepare* state), None when idle.

    Two-phase commit for an external transaction manager (KIP-939):
    ``two_phase`` says the producer that initialized last asked for it
    (``enable_two_phase_commit``), so its transactions never time out.
    ``ongoing_producer_id``/``ongoing_producer_epoch`` are the identity the
    records of a *kept* transaction carry: InitProducerId with
    ``keep_prepared_txn`` found it Ongoing, bumped the epoch past it (fencing
    the producer that wrote it) and kept it open for the new producer to
    commit or abort. They stay until the next transaction begins (so that a
    completed kept transaction can still be matched with its records), and
    are -1 for a transaction that was never kept.

    ``txn_number`` numbers the id's transactions (the first is 1; each that
    begins takes the next), and ``transaction_version`` is how the latest
    one ended (Kafka's transaction.version, KIP-890): 2 with an epoch bump
    (EndTxn of transactions v2, or a fence), 1 without (EndTxn of a client of
    transactions v1, whose epoch stays for the producer's life). Markers
    carry both: under v1 a (producer id, epoch) names many transactions, and
    the number tells a late duplicate marker from the next transaction's.
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: TxnState
    timeout_ms: int
    last_update_ms: int
    last_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    next_producer_id: int = NO_PRODUCER_ID
    pending_state: TxnState | None = None
    txn_start_ms: int = NO_TIMESTAMP
    partitions: frozenset[TopicPartition] = field(default_factory=frozenset)
    groups: frozenset[str] = field(default_factory=frozenset)
    coordinator_epoch: int = 0
    two_phase: bool = False
    ongoing_producer_id: int = NO_PRODUCER_ID
    ongoing_producer_epoch: int = NO_PRODUCER_EPOCH
    txn_number: int = 0
    transaction_version: int = 2

    @property
    def has_participants(self) -> bool:
        return bool(self.partitions or self.groups)

    @property
    def kept(self) -> bool:
        """Whether the open transaction was kept by a new producer (KIP-939):
        it takes no more records or participants, only its end."""
        return self.state is TxnState.ONGOING and self.ongoing_producer_id != NO_PRODUCER_ID

    def to_wire(self) -> list[Any]:
        return [
            self.transactional_id,
            self.producer_id,
            self.producer_epoch,
            int(self.state),
            self.timeout_ms,
            self.last_update_ms,
            self.last_producer_id,
            self.last_producer_epoch,
            self.next_producer_id,
            -1 if self.pending_state is None else int(self.pending_state),
            self.txn_start_ms,
            sorted([t, p] for t, p in self.partitions),
            sorted(self.groups),
            self.coordinator_epoch,
            self.two_phase,
            self.ongoing_producer_id,
            self.ongoing_producer_epoch,
            self.txn_number,
            self.transaction_version,
        ]

    @classmethod
    def from_wire(cls, data: Any) -> TransactionMetadata:
        """Rebuild metadata from :meth:`to_wire` output.

        Raises:
            CommandError: malformed data or an unknown state id.
        """
        if isinstance(data, list) and len(data) == 14:
            # Written before two-phase commit: no transaction was kept.
            data = [*data, False, NO_PRODUCER_ID, NO_PRODUCER_EPOCH]
        if isinstance(data, list) and len(data) == 17:
            # Written before transactions v1: none numbered, every end bumped.
            data = [*data, 0, 2]
        if not isinstance(data, list) or len(data) != 19:
            raise CommandError(f"malformed transaction metadata: {data!r}")
        (
            txn_id,
            pid,
            epoch,
            state,
            timeout,
            updated,
            last_pid,
            last_epoch,
            next_pid,
            pending,
            start,
            partitions,
            groups,
            coord_epoch,
            two_phase,
            ongoing_pid,
            ongoing_epoch,
            txn_number,
            version,
        ) = data
        try:
            return cls(
                transactional_id=as_str(txn_id),
                producer_id=as_int(pid),
                producer_epoch=as_int(epoch),
                state=TxnState(as_int(state)),
                timeout_ms=as_int(timeout),
                last_update_ms=as_int(updated),
                last_producer_id=as_int(last_pid),
                last_producer_epoch=as_int(last_epoch),
                next_producer_id=as_int(next_pid),
                pending_state=None if as_int(pending) == -1 else TxnState(pending),
                txn_start_ms=as_int(start),
                partitions=frozenset(
                    TopicPartition(as_str(t), as_int(p)) for t, p in as_list(partitions, 2)
                ),
                groups=frozenset(as_str(g) for g in as_list(groups)),
                coordinator_epoch=as_int(coord_epoch),
                two_phase=as_bool(two_phase),
                ongoing_producer_id=as_int(ongoing_pid),
                ongoing_producer_epoch=as_int(ongoing_epoch),
                txn_number=as_int(txn_number),
                transaction_version=as_int(version),
            )
        except ValueError as exc:  # an unknown state id
            raise CommandError(f"malformed transaction metadata {data!r}: {exc}") from exc


def transition(meta: TransactionMetadata, target: TxnState, **changes: Any) -> TransactionMetadata:
    """Move ``meta`` to ``target`` with the given field changes.

    The only way a handler changes a transaction's state. Entering a Prepare*
    state sets ``pending_state`` to its Complete* state; any other target
    clears it.

    Raises:
        IllegalTransition: the state table does not allow the move (nothing
            changes: metadata is immutable).
    """
    if not is_legal(meta.state, target):
        raise IllegalTransition(
            f"{meta.transactional_id!r}: {meta.state.name} -> {target.name} is not legal"
        )
    return replace(meta, state=target, pending_state=COMPLETION_OF.get(target), **changes)
