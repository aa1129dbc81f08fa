"""Group-offset markers are fenced by coordinator epoch, as a partition fences them."""

from __future__ import annotations

import msgpack

from fsm import ErrorCode, GroupMarker, OffsetEntry, TransactionStateMachine, TxnOffsetCommit
from fsm.commands import decode_command
from fsm.offsets import GroupOffsets


def pending(m: TransactionStateMachine, epoch: int) -> None:
    entry = (OffsetEntry("in", 0, 7, ""),)
    assert m.apply(TxnOffsetCommit("g", "tx", 5, epoch, entry, 1)).ok


def test_a_marker_from_an_older_coordinator_epoch_is_fenced_and_changes_nothing() -> None:
    m = TransactionStateMachine(0, 1)
    pending(m, 0)
    assert m.apply(GroupMarker("g", 5, 1, False, 2, coordinator_epoch=7)).ok  # aborts
    pending(m, 1)
    before = m.snapshot()
    forged = m.apply(GroupMarker("g", 5, 2, True, 3, coordinator_epoch=6))
    assert forged.error is ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert m.snapshot() == before
    assert m.apply(GroupMarker("g", 5, 2, True, 4, coordinator_epoch=7)).ok
    assert m.offset_fetch("g", None, False)[0].offset == 7


def test_group_offsets_written_before_the_coordinator_epochs_still_decode() -> None:
    m = TransactionStateMachine(0, 1)
    pending(m, 0)
    m.apply(GroupMarker("g", 5, 1, True, 2, coordinator_epoch=3))
    group = m.state.groups["g"]
    wire = group.to_wire()
    assert GroupOffsets.from_wire(wire) == group
    assert GroupOffsets.from_wire(wire[:3]).coordinator_epochs == {}
    old_entry = {
        "v": 1,
        "t": GroupMarker.TYPE,
        "group_id": "g",
        "producer_id": 5,
        "producer_epoch": 1,
        "commit": True,
        "now_ms": 2,
    }
    decoded = decode_command(msgpack.packb(old_entry))
    assert isinstance(decoded, GroupMarker) and decoded.coordinator_epoch == -1
