"""A test-side "leader" for the pure state machine: stamps time, producer ids
and the coordinator epoch into commands the way the coordinator node will."""

from __future__ import annotations

from dataclasses import dataclass, field

from fsm import (
    AbortTimedOut,
    AddOffsets,
    AddPartitions,
    AllocatePidBlock,
    Command,
    EndTxn,
    ExpireTransactionalIds,
    FsmConfig,
    GroupMarker,
    InitProducerId,
    MarkersWritten,
    OffsetEntry,
    Outcome,
    TransactionStateMachine,
    TxnOffsetCommit,
    WriteMarkers,
    encode_command,
)
from fsm.errors import ErrorCode
from pid_allocator import PidBlock, PidCursor


@dataclass
class Leader:
    """Drives one shard's machine; keeps the log of every applied command."""

    machine: TransactionStateMachine
    now_ms: int = 1_000_000
    coordinator_epoch: int = 1
    cursor: PidCursor = field(default_factory=PidCursor)
    log: list[bytes] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)

    @classmethod
    def new(
        cls,
        config: FsmConfig | None = None,
        shard: int = 0,
        shard_count: int = 1,
        block_size: int = 1000,
    ) -> Leader:
        return cls(TransactionStateMachine(shard, shard_count, config, block_size))

    def apply(self, command: Command) -> Outcome:
        self.log.append(encode_command(command))
        outcome = self.machine.apply(command)
        self.outcomes.append(outcome)
        return outcome

    def tick(self, ms: int = 1) -> None:
        self.now_ms += ms

    def fresh_pid(self) -> int:
        """The next id of the cursor, asking for a block at 90% use or when dry."""
        if self.cursor.needs_block():
            self._request_block()
        pid = self.cursor.take()
        if pid is None:
            self._request_block()
            pid = self.cursor.take()
        assert pid is not None
        return pid

    def _request_block(self) -> None:
        token = self.cursor.mark_requested()
        layout = self.machine.state.pids.layout
        granted = self.apply(AllocatePidBlock(layout.shard, layout.shard_count, layout.block_size))
        assert granted.ok, granted
        self.cursor.add_block(PidBlock(granted.block_first, granted.block_end), token)

    def new_leader(self) -> None:
        """Leadership moved: the term grows and the cursor's ids are skipped."""
        self.coordinator_epoch += 1
        self.cursor.reset()

    # --- commands, stamped -----------------------------------------------------------

    def init(
        self, tid: str, timeout_ms: int = 60_000, expected: tuple[int, int] | None = None
    ) -> Outcome:
        probe = InitProducerId(tid, timeout_ms, self.now_ms, self.coordinator_epoch)
        pid = self.fresh_pid() if self.machine.needs_new_producer_id(probe) else -1
        exp_pid, exp_epoch = expected if expected is not None else (-1, -1)
        return self.apply(
            InitProducerId(
                tid, timeout_ms, self.now_ms, self.coordinator_epoch, pid, exp_pid, exp_epoch
            )
        )

    def add(self, tid: str, pid: int, epoch: int, *partitions: tuple[str, int]) -> Outcome:
        return self.apply(
            AddPartitions(tid, pid, epoch, tuple(partitions), self.now_ms, self.coordinator_epoch)
        )

    def add_offsets(self, tid: str, pid: int, epoch: int, group: str) -> Outcome:
        return self.apply(AddOffsets(tid, pid, epoch, group, self.now_ms, self.coordinator_epoch))

    def end(self, tid: str, pid: int, epoch: int, commit: bool) -> Outcome:
        probe = EndTxn(tid, pid, epoch, commit, self.now_ms, self.coordinator_epoch)
        new_pid = self.fresh_pid() if self.machine.needs_new_producer_id(probe) else -1
        return self.apply(
            EndTxn(tid, pid, epoch, commit, self.now_ms, self.coordinator_epoch, new_pid)
        )

    def offsets(
        self, group: str, tid: str, pid: int, epoch: int, *entries: tuple[str, int, int]
    ) -> Outcome:
        return self.apply(
            TxnOffsetCommit(
                group,
                tid,
                pid,
                epoch,
                tuple(OffsetEntry(t, p, o, "") for t, p, o in entries),
                self.now_ms,
            )
        )

    def deliver(self, markers: WriteMarkers) -> list[Outcome]:
        """Deliver markers: group markers first, then the acknowledgement."""
        results = [
            self.apply(
                GroupMarker(
                    g, markers.producer_id, markers.producer_epoch, markers.commit, self.now_ms
                )
            )
            for g in markers.groups
        ]
        results.append(
            self.apply(
                MarkersWritten(
                    markers.transactional_id,
                    markers.producer_id,
                    markers.producer_epoch,
                    markers.partitions,
                    markers.groups,
                    self.now_ms,
                )
            )
        )
        return results

    def deliver_all(self) -> None:
        for markers in self.machine.pending_markers():
            for outcome in self.deliver(markers):
                assert outcome.error is ErrorCode.NONE, outcome

    def sweep_timeouts(self) -> list[Outcome]:
        return [
            self.apply(
                AbortTimedOut(
                    c.transactional_id,
                    c.producer_id,
                    c.producer_epoch,
                    c.now_ms,
                    self.coordinator_epoch,
                )
            )
            for c in self.machine.timed_out(self.now_ms)
        ]

    def expire(self) -> Outcome:
        return self.apply(
            ExpireTransactionalIds(tuple(self.machine.expirable_ids(self.now_ms)), self.now_ms)
        )
