"""Random command sequences against one shard, checking the invariants.

Hypothesis drives init / add / end / marker delivery (partial, duplicated,
late) / timeouts / expiration / leader changes / restart-from-snapshot across
several transactional ids, including zombies that keep using old epochs. After
every step it checks fencing (a stale epoch changes nothing), one decision
per transaction and unique producer ids, that epochs never decrease, that at most one
transition is pending, and at the end that replaying the command log from
scratch, or from any snapshot taken on the way, reproduces the same state and
the same answers. Runs are derandomized (see tests/conftest.py); a failure
prints the steps and a @reproduce_failure blob.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fsm import (
    FsmConfig,
    GroupMarker,
    MarkersWritten,
    Outcome,
    TransactionStateMachine,
    TxnState,
    WriteMarkers,
    decode_command,
)
from fsm.errors import ErrorCode
from fsm.machine import HANDLER_BUG
from fsm.states import COMPLETION_OF, PREPARE_STATES
from tests.fsm_driver import Leader

IDS = ["t0", "t1", "t2"]
GROUPS = ["g0", "g1"]
PARTITIONS = [("a", 0), ("a", 1), ("b", 0)]
CONFIG = FsmConfig(max_producer_epoch=6, transactional_id_expiration_ms=40_000)
SHARD, SHARD_COUNT, BLOCK_SIZE = 1, 2, 4


class ShardMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.leader = Leader.new(CONFIG, SHARD, SHARD_COUNT, BLOCK_SIZE)
        self.snapshots: list[tuple[int, bytes]] = [(0, self.leader.machine.snapshot())]
        # Every identity a client was ever given, per transactional.id (zombies reuse them).
        self.identities: dict[str, list[tuple[int, int]]] = {t: [] for t in IDS}
        self.pid_owner: dict[int, str] = {}
        self.max_epoch: dict[tuple[str, int], int] = {}
        self.decisions: dict[tuple[int, int], bool] = {}
        self.checked = 0
        self.delivered: list[WriteMarkers] = []
        self.group_epochs: dict[tuple[str, int], int] = {}

    # --- plumbing ------------------------------------------------------------------

    @contextmanager
    def fencing_checked(self, tid: str, pid: int, epoch: int) -> Iterator[None]:
        """Invariant 6: a request with an epoch older than the shard's current
        epoch for that producer changes nothing."""
        meta = self.leader.machine.describe(tid)
        stale = meta is not None and pid == meta.producer_id and epoch < meta.producer_epoch
        before = self.leader.machine.snapshot()
        yield
        if stale:
            assert self.leader.machine.snapshot() == before, self.leader.outcomes[-1]

    def _identity(
        self, tid: str, zombie: bool, pick: Callable[[list[tuple[int, int]]], tuple[int, int]]
    ) -> tuple[int, int]:
        known = self.identities[tid]
        if not known:
            return (0, 0)
        return pick(known) if zombie else known[-1]

    def _remember(self, tid: str, outcome: Outcome) -> None:
        event(f"answer {outcome.error.name}")
        if (
            outcome.ok
            and self.identities[tid]
            and outcome.producer_id != self.identities[tid][-1][0]
        ):
            event("producer id rotated")
        if outcome.ok and outcome.producer_id >= 0:
            self.identities[tid].append((outcome.producer_id, outcome.producer_epoch))

    # --- client requests -----------------------------------------------------------

    @rule(
        tid=st.sampled_from(IDS),
        timeout=st.sampled_from([1_000, 5_000, 60_000]),
        kip360=st.booleans(),
    )
    def init(self, tid: str, timeout: int, kip360: bool) -> None:
        known = self.identities[tid]
        expected = known[-1] if kip360 and known else None
        self._remember(tid, self.leader.init(tid, timeout, expected))

    @rule(
        tid=st.sampled_from(IDS),
        zombie=st.booleans(),
        data=st.data(),
        parts=st.lists(st.sampled_from(PARTITIONS), min_size=1, max_size=3, unique=True),
    )
    def add_partitions(
        self, tid: str, zombie: bool, data: st.DataObject, parts: list[tuple[str, int]]
    ) -> None:
        pid, epoch = self._identity(tid, zombie, lambda k: data.draw(st.sampled_from(k)))
        with self.fencing_checked(tid, pid, epoch):
            self.leader.add(tid, pid, epoch, *parts)

    @rule(
        tid=st.sampled_from(IDS),
        group=st.sampled_from(GROUPS),
        zombie=st.booleans(),
        data=st.data(),
    )
    def add_offsets(self, tid: str, group: str, zombie: bool, data: st.DataObject) -> None:
        pid, epoch = self._identity(tid, zombie, lambda k: data.draw(st.sampled_from(k)))
        with self.fencing_checked(tid, pid, epoch):
            self.leader.add_offsets(tid, pid, epoch, group)

    @rule(
        tid=st.sampled_from(IDS),
        group=st.sampled_from(GROUPS),
        zombie=st.booleans(),
        offset=st.integers(0, 1000),
        data=st.data(),
    )
    def txn_offset_commit(
        self, tid: str, group: str, zombie: bool, offset: int, data: st.DataObject
    ) -> None:
        pid, epoch = self._identity(tid, zombie, lambda k: data.draw(st.sampled_from(k)))
        before = self.leader.machine.snapshot()
        outcome = self.leader.offsets(group, tid, pid, epoch, ("in", 0, offset))
        if epoch < self.group_epochs.get((group, pid), -1):  # a newer marker reached the group
            assert outcome.error is ErrorCode.PRODUCER_FENCED
            assert self.leader.machine.snapshot() == before

    @rule(tid=st.sampled_from(IDS), commit=st.booleans(), zombie=st.booleans(), data=st.data())
    def end_txn(self, tid: str, commit: bool, zombie: bool, data: st.DataObject) -> None:
        pid, epoch = self._identity(tid, zombie, lambda k: data.draw(st.sampled_from(k)))
        with self.fencing_checked(tid, pid, epoch):
            self._remember(tid, self.leader.end(tid, pid, epoch, commit))

    # --- the coordinator's own work ------------------------------------------------

    @precondition(lambda self: bool(self.leader.machine.pending_markers()))
    @rule(data=st.data())
    def deliver_markers(self, data: st.DataObject) -> None:
        """Some participants of one Prepare* transaction acknowledge."""
        markers = data.draw(st.sampled_from(self.leader.machine.pending_markers()))
        parts = data.draw(
            st.lists(st.sampled_from(markers.partitions), unique=True)
            if markers.partitions
            else st.just([])
        )
        groups = data.draw(
            st.lists(st.sampled_from(markers.groups), unique=True)
            if markers.groups
            else st.just([])
        )
        self._deliver(markers, tuple(parts), tuple(groups))
        self.delivered.append(markers)

    @precondition(lambda self: bool(self.delivered))
    @rule(data=st.data())
    def late_duplicate_marker(self, data: st.DataObject) -> None:
        """A copy of an old marker arrives late (a timed-out send that landed)."""
        markers = data.draw(st.sampled_from(self.delivered))
        self._deliver(markers, markers.partitions, markers.groups)

    def _deliver(
        self, markers: WriteMarkers, parts: tuple[tuple[str, int], ...], groups: tuple[str, ...]
    ) -> None:
        now = self.leader.now_ms
        for group in groups:
            self.leader.apply(
                GroupMarker(group, markers.producer_id, markers.producer_epoch, markers.commit, now)
            )
            key = (group, markers.producer_id)
            self.group_epochs[key] = max(self.group_epochs.get(key, -1), markers.producer_epoch)
        self.leader.apply(
            MarkersWritten(
                markers.transactional_id,
                markers.producer_id,
                markers.producer_epoch,
                parts,
                groups,
                now,
            )
        )

    @rule(ms=st.sampled_from([1, 100, 2_000, 30_000]))
    def advance_time(self, ms: int) -> None:
        self.leader.tick(ms)

    @rule()
    def sweep_timeouts(self) -> None:
        for outcome in self.leader.sweep_timeouts():
            assert outcome.ok, outcome

    @rule()
    def expire(self) -> None:
        expected = tuple(self.leader.machine.expirable_ids(self.leader.now_ms))
        assert self.leader.expire().expired == expected

    @rule()
    def leader_change(self) -> None:
        self.leader.new_leader()

    @rule()
    def restart_from_snapshot(self) -> None:
        data = self.leader.machine.snapshot()
        restored = TransactionStateMachine.restore(data, CONFIG)
        assert restored.state == self.leader.machine.state
        self.leader.machine = restored
        self.leader.new_leader()
        self.snapshots.append((len(self.leader.log), data))

    # --- invariants ----------------------------------------------------------------

    @invariant()
    def one_decision_per_transaction_and_no_handler_bug(self) -> None:
        for outcome in self.leader.outcomes[self.checked :]:
            assert HANDLER_BUG not in outcome.message, outcome
            for effect in outcome.effects:
                if isinstance(effect, WriteMarkers):
                    event("COMMIT decided" if effect.commit else "ABORT decided")
                    key = (effect.producer_id, effect.producer_epoch)
                    first = self.decisions.setdefault(key, effect.commit)
                    assert first == effect.commit, f"COMMIT and ABORT both decided for {key}"
        self.checked = len(self.leader.outcomes)

    @invariant()
    def at_most_one_pending_transition(self) -> None:
        for meta in self.leader.machine.state.transactions.values():
            assert meta.state not in (TxnState.DEAD, TxnState.PREPARE_EPOCH_FENCE)
            assert meta.pending_state == COMPLETION_OF.get(meta.state)
            if meta.state in PREPARE_STATES:
                assert meta.has_participants, "a Prepare* transaction with nothing to mark"

    @invariant()
    def epochs_never_decrease_and_producer_ids_are_unique(self) -> None:
        for tid, meta in self.leader.machine.state.transactions.items():
            for pid in (meta.producer_id, meta.next_producer_id):
                if pid >= 0:
                    owner = self.pid_owner.setdefault(pid, tid)
                    assert owner == tid, f"producer id {pid} given to {owner} and {tid}"
            key = (tid, meta.producer_id)
            assert meta.producer_epoch >= self.max_epoch.get(key, -1), key
            self.max_epoch[key] = meta.producer_epoch
            assert 0 <= meta.producer_epoch <= CONFIG.max_producer_epoch

    @invariant()
    def pending_offsets_never_older_than_an_applied_marker(self) -> None:
        for gid, group in self.leader.machine.state.groups.items():
            for pid, pending in group.pending.items():
                assert pending.producer_epoch >= self.group_epochs.get((gid, pid), -1)

    def teardown(self) -> None:
        """Replaying the log from scratch, and from each snapshot, gives the same state."""
        final = self.leader.machine.snapshot()
        log = self.leader.log
        fresh = TransactionStateMachine(SHARD, SHARD_COUNT, CONFIG, BLOCK_SIZE)
        assert [fresh.apply(decode_command(entry)) for entry in log] == self.leader.outcomes
        assert fresh.snapshot() == final
        for index, data in self.snapshots:
            machine = TransactionStateMachine.restore(data, CONFIG)
            for entry in log[index:]:
                machine.apply(decode_command(entry))
            assert machine.snapshot() == final


ShardMachine.TestCase.settings = settings(
    max_examples=400,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_shard_state_machine = ShardMachine.TestCase
