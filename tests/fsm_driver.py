"""A test-side "leader" for the pure state machine: stamps time, producer ids
and the coordinator epoch into commands with the coordinator node's own
leader core, and applies them at once (no Raft)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fsm import (
    AddOffsets,
    AddPartitions,
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
from raftcoord.coordinator.leader import LeaderCore, Stamp, Unstamped, timed_out_abort


@dataclass
class _Queued:
    build: Unstamped
    parkable: bool = True


def _never_waits(command: Command) -> bool:
    """The driver applies at once: it never parks a command."""
    return False


@dataclass
class Leader:
    """Drives one shard's machine; keeps the log of every applied command.

    Stamping, producer-id blocks and the coordinator epoch come from the
    node's :class:`raftcoord.coordinator.leader.LeaderCore`, on a clock that moves only
    with :meth:`tick`. A block is proposed when a command needs an id and
    none is left (a node asks earlier, at 90% use, so as not to wait).
    """

    machine: TransactionStateMachine
    now_ms: int = 1_000_000
    log: list[bytes] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    core: LeaderCore = field(init=False)

    def __post_init__(self) -> None:
        # Each command is proposed alone, at once: no completion is held back.
        self.core = LeaderCore(
            self.machine.state.pids.layout, lambda: self.now_ms, completion_linger_ms=0
        )
        self.core.elected(1)

    @classmethod
    def new(
        cls,
        config: FsmConfig | None = None,
        shard: int = 0,
        shard_count: int = 1,
        block_size: int = 1000,
    ) -> Leader:
        return cls(TransactionStateMachine(shard, shard_count, config, block_size))

    @property
    def coordinator_epoch(self) -> int:
        return self.core.epoch

    def apply(self, command: Command) -> Outcome:
        self.log.append(encode_command(command))
        outcome = self.machine.apply(command)
        self.outcomes.append(outcome)
        return outcome

    def propose(self, build: Unstamped) -> Outcome:
        """Stamp the command of ``build`` as the leader does now, and apply it."""
        stamp = self.core.stamp()
        command = self._stamped(build, stamp)
        if command is None:  # no producer id left: a block comes first
            command, token = self.core.request_block()
            granted = self.apply(command)
            assert self.core.block_granted(token, granted), granted
            command = self._stamped(build, stamp)
            assert command is not None
        return self.apply(command)

    def _stamped(self, build: Unstamped, stamp: Stamp) -> Command | None:
        """The command of ``build`` as the leader's next entry carries it,
        or None while it waits for a producer-id block."""
        batch = self.core.batch(
            [_Queued(build)], stamp, self.machine.needs_new_producer_id, _never_waits
        )
        assert batch is not None
        if not batch.requests:
            return None
        self.core.entry_done(stamp.coordinator_epoch)
        return batch.commands[0]

    def tick(self, ms: int = 1) -> None:
        self.now_ms += ms

    def new_leader(self) -> None:
        """Leadership moved: the epoch grows and the cursor's ids are skipped."""
        self.core.elected(self.core.epoch + 1)

    # --- commands, stamped -----------------------------------------------------------

    def init(
        self,
        tid: str,
        timeout_ms: int = 60_000,
        expected: tuple[int, int] | None = None,
        *,
        two_phase: bool = False,
        keep: bool = False,
    ) -> Outcome:
        exp_pid, exp_epoch = expected if expected is not None else (-1, -1)
        return self.propose(
            lambda s: InitProducerId(
                tid,
                timeout_ms,
                s.now_ms,
                s.coordinator_epoch,
                s.new_producer_id,
                exp_pid,
                exp_epoch,
                enable_two_phase_commit=two_phase,
                keep_prepared_txn=keep,
            )
        )

    def add(self, tid: str, pid: int, epoch: int, *partitions: tuple[str, int]) -> Outcome:
        return self.propose(
            lambda s: AddPartitions(
                tid, pid, epoch, tuple(partitions), s.now_ms, s.coordinator_epoch
            )
        )

    def add_offsets(self, tid: str, pid: int, epoch: int, group: str) -> Outcome:
        return self.propose(
            lambda s: AddOffsets(tid, pid, epoch, group, s.now_ms, s.coordinator_epoch)
        )

    def end(self, tid: str, pid: int, epoch: int, commit: bool) -> Outcome:
        return self.propose(
            lambda s: EndTxn(
                tid, pid, epoch, commit, s.now_ms, s.coordinator_epoch, s.new_producer_id
            )
        )

    def offsets(
        self, group: str, tid: str, pid: int, epoch: int, *entries: tuple[str, int, int]
    ) -> Outcome:
        offsets = tuple(OffsetEntry(t, p, o, "") for t, p, o in entries)
        return self.propose(lambda s: TxnOffsetCommit(group, tid, pid, epoch, offsets, s.now_ms))

    def deliver(self, markers: WriteMarkers) -> list[Outcome]:
        """Deliver markers: group markers first, then the acknowledgement."""
        results = [
            self.propose(
                lambda s, g=g: GroupMarker(
                    g, markers.producer_id, markers.producer_epoch, markers.commit, s.now_ms
                )
            )
            for g in markers.groups
        ]
        results.append(
            self.propose(
                lambda s: MarkersWritten(
                    markers.transactional_id,
                    markers.producer_id,
                    markers.producer_epoch,
                    markers.partitions,
                    markers.groups,
                    s.now_ms,
                )
            )
        )
        return results

    def deliver_all(self) -> None:
        for markers in self.machine.pending_markers():
            for outcome in self.deliver(markers):
                assert outcome.error is ErrorCode.NONE, outcome

    def sweep_timeouts(self) -> list[Outcome]:
        return [self.propose(timed_out_abort(c)) for c in self.machine.timed_out(self.now_ms)]

    def expire(self) -> Outcome:
        ids = tuple(self.machine.expirable_ids(self.now_ms))
        return self.propose(lambda s: ExpireTransactionalIds(ids, s.now_ms))
