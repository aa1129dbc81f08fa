"""The pure transaction state machine of one coordinator shard.

No I/O, no clock, no randomness, no threads: commands (with the time and any
new producer id stamped in by the leader) go in; the new state, a result and
effects (markers to write, transitions to log) come out.
"""

from fsm.commands import (
    NO_GENERATION,
    AbortTimedOut,
    AddOffsets,
    AddPartitions,
    AllocatePidBlock,
    Command,
    CreateTopic,
    EndTxn,
    ExpireTransactionalIds,
    GroupMarker,
    GroupProtocol,
    GroupTimeouts,
    Heartbeat,
    InitProducerId,
    JoinGroup,
    LeaveGroup,
    MarkersWritten,
    MemberAssignment,
    OffsetCommit,
    OffsetEntry,
    OffsetReservation,
    RegisterDirectory,
    ReserveOffsets,
    SyncGroup,
    TxnOffsetCommit,
    decode_command,
    decode_entry,
    encode_command,
    encode_entry,
)
from fsm.config import FsmConfig
from fsm.effects import Effect, Outcome, ProducerFenced, Transition, WriteMarkers
from fsm.errors import CommandError, ErrorCode, IllegalTransition, InvariantViolation
from fsm.machine import (
    ShardState,
    TransactionListing,
    TransactionStateMachine,
    encode_snapshot,
    snapshot_pieces,
)
from fsm.membership import GroupMembership, GroupState, Member
from fsm.metadata import TransactionMetadata, transition
from fsm.offsets import FetchedOffset, GroupOffsets
from fsm.states import VALID_PREVIOUS, TxnState

__all__ = [
    "NO_GENERATION",
    "VALID_PREVIOUS",
    "AbortTimedOut",
    "AddOffsets",
    "AddPartitions",
    "AllocatePidBlock",
    "Command",
    "CommandError",
    "CreateTopic",
    "Effect",
    "EndTxn",
    "ErrorCode",
    "ExpireTransactionalIds",
    "FetchedOffset",
    "FsmConfig",
    "GroupMarker",
    "GroupMembership",
    "GroupOffsets",
    "GroupProtocol",
    "GroupState",
    "GroupTimeouts",
    "Heartbeat",
    "IllegalTransition",
    "InitProducerId",
    "InvariantViolation",
    "JoinGroup",
    "LeaveGroup",
    "MarkersWritten",
    "Member",
    "MemberAssignment",
    "OffsetCommit",
    "OffsetEntry",
    "OffsetReservation",
    "Outcome",
    "ProducerFenced",
    "RegisterDirectory",
    "ReserveOffsets",
    "ShardState",
    "SyncGroup",
    "TransactionListing",
    "TransactionMetadata",
    "TransactionStateMachine",
    "Transition",
    "TxnOffsetCommit",
    "TxnState",
    "WriteMarkers",
    "decode_command",
    "decode_entry",
    "encode_command",
    "encode_entry",
    "encode_snapshot",
    "snapshot_pieces",
    "transition",
]
