"""What applying a command produces: a result for the caller, and effects.

The core never performs an effect; the shell (the Raft/gRPC node) does:
markers go to the marker writer, transitions to the applied-transitions log,
fencing events to the structured log.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsm.errors import ErrorCode
from fsm.metadata import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TopicPartition
from fsm.states import TxnState
from raftcoord.protocol.acl import Acl
from raftcoord.protocol.types import WriteMarkers as WriteMarkers


@dataclass(frozen=True)
class Transition:
    """A state change that was applied (one line of the applied-transitions log).

    ``from_state`` is None when the transactional.id was created.
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    from_state: TxnState | None
    to_state: TxnState
    partitions: tuple[TopicPartition, ...]
    groups: tuple[str, ...]
    now_ms: int
    #: The number of the id's latest transaction (fsm.metadata).
    txn_number: int = 0


@dataclass(frozen=True)
class ProducerFenced:
    """An epoch bump fenced every producer holding an older epoch."""

    transactional_id: str
    producer_id: int
    old_epoch: int
    new_epoch: int
    reason: str


Effect = WriteMarkers | Transition | ProducerFenced


@dataclass(frozen=True)
class Outcome:
    """The result of applying one command.

    ``error`` NONE means success. ``producer_id``/``producer_epoch`` answer
    InitProducerId and EndTxn. ``block_first``/``block_end`` answer
    AllocatePidBlock. ``expired`` lists ids removed by ExpireTransactionalIds.
    ``generation`` answers the group commands (see :mod:`fsm.membership`).
    ``deleted`` answers DeleteAcls: the bindings each filter removed.
    ``ongoing_producer_id``/``ongoing_producer_epoch`` answer InitProducerId:
    the identity of the transaction it kept open (KIP-939), -1 when none.
    An error outcome may still carry effects (InitProducerId on an open
    transaction fences and aborts it, then answers CONCURRENT_TRANSACTIONS).
    """

    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    block_first: int = -1
    block_end: int = -1
    expired: tuple[str, ...] = ()
    generation: int = -1
    deleted: tuple[tuple[Acl, ...], ...] = ()
    ongoing_producer_id: int = NO_PRODUCER_ID
    ongoing_producer_epoch: int = NO_PRODUCER_EPOCH
    effects: tuple[Effect, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is ErrorCode.NONE


def fail(error: ErrorCode, message: str = "") -> Outcome:
    """An error outcome with no effects."""
    return Outcome(error=error, message=message or error.name)
