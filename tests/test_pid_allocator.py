"""Producer-id allocation: block layout, the replicated record, the leader's cursor,
uniqueness under leader changes and restarts, and the record inside the state machine.

Long on purpose: the cases of one component, sharing this module's helpers
and fixtures.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from fsm import (
    AddPartitions,
    AllocatePidBlock,
    ErrorCode,
    InitProducerId,
    TransactionStateMachine,
    encode_entry,
)
from pid_allocator import (
    DEFAULT_BLOCK_SIZE,
    MAX_PRODUCER_ID,
    REFILL_RATIO,
    PidBlock,
    PidBlockRecord,
    PidCursor,
    PidExhausted,
    PidLayout,
)
from tests.seeds import chosen_seed

# --- PidLayout ---------------------------------------------------------------------


@pytest.mark.parametrize("shard_count", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("block_size", [1, 7, 1000])
def test_blocks_of_different_shards_never_overlap(shard_count: int, block_size: int) -> None:
    owner: dict[int, tuple[int, int]] = {}
    blocks: list[tuple[PidBlock, int]] = []
    for shard in range(shard_count):
        layout = PidLayout(shard, shard_count, block_size)
        for seq in range(60):
            block = layout.block(seq)
            assert block.size == block_size
            blocks.append((block, shard))
            for pid in (block.first, block.end - 1, (block.first + block.end) // 2):
                assert owner.setdefault(pid, (shard, seq)) == (shard, seq)
    blocks.sort()
    for (a, _), (b, _) in itertools.pairwise(blocks):
        assert a.end <= b.first, (a, b)
    # Together the shards tile the id space from 0 without gaps.
    assert blocks[0][0].first == 0
    assert all(a.end == b.first for (a, _), (b, _) in itertools.pairwise(blocks))
    # Every shard's blocks increase with seq.
    for shard in range(shard_count):
        firsts = [b.first for b, s in blocks if s == shard]
        assert firsts == sorted(firsts) and len(firsts) == 60


@pytest.mark.parametrize("shard_count", [1, 2, 3, 4, 5])
def test_block_seq_inverts_block(shard_count: int) -> None:
    block_size = 10
    layouts = [PidLayout(s, shard_count, block_size) for s in range(shard_count)]
    for layout in layouts:
        for seq in (0, 1, 2, 17, 10**6, 10**12):
            block = layout.block(seq)
            for pid in (block.first, block.first + 1, block.end - 1):
                assert layout.block_seq(pid) == seq
                # ... and no other shard claims it.
                others = [o.block_seq(pid) for o in layouts if o is not layout]
                assert others == [None] * (shard_count - 1)
        assert layout.block_seq(-1) is None
        assert layout.block_seq(-(2**63)) is None


def test_block_numbers_match_the_documented_formula() -> None:
    layout = PidLayout(2, 3, 10)
    # n-th block of shard s is global block n*S + s: [(n*S+s)*B, (n*S+s+1)*B)
    assert [(b.first, b.end) for b in map(layout.block, range(3))] == [(20, 30), (50, 60), (80, 90)]
    assert layout.block_seq(55) == 1 and layout.block_seq(45) is None


def test_block_past_the_largest_producer_id_is_exhausted() -> None:
    block_size = 2**61  # the id space holds exactly 4 such blocks
    shard0, shard1 = PidLayout(0, 3, block_size), PidLayout(1, 3, block_size)
    last = shard0.block(1)  # global block 3: ends exactly at 2**63
    assert last.end == MAX_PRODUCER_ID + 1 and MAX_PRODUCER_ID in last
    with pytest.raises(PidExhausted):
        shard0.block(2)
    with pytest.raises(PidExhausted):
        shard1.block(1)  # global block 4
    with pytest.raises(PidExhausted):
        PidLayout(0, 1, MAX_PRODUCER_ID + 2).block(0)


def test_allocate_does_not_advance_when_exhausted() -> None:
    record = PidBlockRecord(PidLayout(1, 3, 2**61))
    assert record.allocate() == PidBlock(2**61, 2**62)
    assert record.next_seq == 1
    for _ in range(3):
        with pytest.raises(PidExhausted):
            record.allocate()
        assert record.next_seq == 1
    assert record.to_wire() == [1, 3, 2**61, 1]


def test_negative_block_seq_is_refused() -> None:
    with pytest.raises(ValueError):
        PidLayout(0, 3, 10).block(-1)


@pytest.mark.parametrize(
    ("shard", "shard_count", "block_size"),
    [(0, 0, 10), (-1, 3, 10), (3, 3, 10), (5, 3, 10), (0, -1, 10), (0, 3, 0), (0, 3, -5)],
)
def test_invalid_layouts(shard: int, shard_count: int, block_size: int) -> None:
    with pytest.raises(ValueError):
        PidLayout(shard, shard_count, block_size)


def test_default_layout_block_size() -> None:
    assert PidLayout(0, 1).block_size == DEFAULT_BLOCK_SIZE


@pytest.mark.parametrize(("first", "end"), [(-1, 5), (5, 5), (6, 5), (0, MAX_PRODUCER_ID + 2)])
def test_invalid_blocks(first: int, end: int) -> None:
    with pytest.raises(ValueError):
        PidBlock(first, end)


# --- PidBlockRecord ----------------------------------------------------------------


def test_record_grants_consecutive_blocks_and_knows_what_it_granted() -> None:
    record = PidBlockRecord(PidLayout(1, 3, 10))
    assert not any(record.granted(pid) for pid in range(-5, 200))
    assert record.allocate() == PidBlock(10, 20)
    assert record.allocate() == PidBlock(40, 50)
    assert record.next_seq == 2
    granted = {pid for pid in range(-5, 200) if record.granted(pid)}
    assert granted == set(range(10, 20)) | set(range(40, 50))


@pytest.mark.parametrize("next_seq", [0, 1, 5, 2**40])
def test_record_wire_round_trip(next_seq: int) -> None:
    record = PidBlockRecord(PidLayout(2, 5, 77), next_seq)
    wire = record.to_wire()
    assert wire == [2, 5, 77, next_seq]
    restored = PidBlockRecord.from_wire(wire)
    assert restored == record
    assert restored.allocate() == PidLayout(2, 5, 77).block(next_seq)


@pytest.mark.parametrize(
    "wire",
    [
        None,
        "0,3,10,0",
        (0, 3, 10, 0),  # msgpack gives lists; anything else is not a record
        [0, 3, 10],
        [0, 3, 10, 0, 0],
        [0, 3, 10, "0"],
        [0, 3, 10.0, 0],
        [True, 3, 10, 0],
        [0, 3, 10, False],
        [0, 3, 10, -1],
        [3, 3, 10, 0],
        [0, 0, 10, 0],
        [0, 3, 0, 0],
        {"shard": 0},
    ],
)
def test_record_from_malformed_wire(wire: Any) -> None:
    with pytest.raises(ValueError):
        PidBlockRecord.from_wire(wire)


# --- PidCursor ---------------------------------------------------------------------


def _cursor_with(*blocks: PidBlock) -> PidCursor:
    cursor = PidCursor()
    for block in blocks:
        assert cursor.add_block(block, cursor.mark_requested())
    return cursor


def test_cursor_serves_ids_in_increasing_order() -> None:
    cursor = _cursor_with(PidBlock(10, 15), PidBlock(40, 43))
    assert cursor.remaining() == 8
    taken = [cursor.take() for _ in range(8)]
    assert taken == [10, 11, 12, 13, 14, 40, 41, 42]
    assert cursor.remaining() == 0


def test_cursor_take_returns_none_when_dry() -> None:
    cursor = PidCursor()
    assert cursor.take() is None and cursor.remaining() == 0
    cursor = _cursor_with(PidBlock(0, 2))
    assert [cursor.take(), cursor.take(), cursor.take(), cursor.take()] == [0, 1, None, None]
    # A new block continues above the old one.
    assert cursor.add_block(PidBlock(6, 8), cursor.mark_requested())
    assert [cursor.take(), cursor.take(), cursor.take()] == [6, 7, None]


def test_cursor_needs_a_block_when_empty() -> None:
    cursor = PidCursor()
    assert cursor.needs_block()
    cursor.mark_requested()
    assert not cursor.needs_block()


@pytest.mark.parametrize("block_size", [10, 100, 1000])
def test_cursor_does_not_need_a_block_before_90_percent(block_size: int) -> None:
    cursor = _cursor_with(PidBlock(0, block_size))
    for _ in range(block_size * 9 // 10 - 1):  # block of 10: 8 takes
        assert not cursor.needs_block()
        assert cursor.take() is not None
    assert not cursor.needs_block()


@pytest.mark.parametrize("block_size", [10, 100, 1000])
def test_cursor_needs_a_block_at_90_percent(block_size: int) -> None:
    assert REFILL_RATIO == 0.9
    cursor = _cursor_with(PidBlock(0, block_size))
    for _ in range(block_size * 9 // 10):  # block of 10: 9 takes
        cursor.take()
    assert cursor.remaining() == block_size // 10
    assert cursor.needs_block()


def test_cursor_with_full_refill_ratio_asks_only_when_dry() -> None:
    cursor = PidCursor(refill_ratio=1.0)
    assert cursor.add_block(PidBlock(0, 4), cursor.mark_requested())
    for _ in range(3):
        cursor.take()
        assert not cursor.needs_block()
    cursor.take()
    assert cursor.needs_block()


def test_cursor_does_not_need_a_block_while_a_request_is_outstanding() -> None:
    cursor = _cursor_with(PidBlock(0, 10))
    for _ in range(10):
        cursor.take()
    assert cursor.needs_block()
    token = cursor.mark_requested()
    assert not cursor.needs_block()
    assert cursor.take() is None
    assert not cursor.needs_block()
    assert cursor.add_block(PidBlock(30, 40), token)
    assert not cursor.needs_block()
    assert cursor.take() == 30


@pytest.mark.parametrize("refill_ratio", [0.0, -0.5, 1.01, 2.0])
def test_cursor_rejects_bad_refill_ratio(refill_ratio: float) -> None:
    with pytest.raises(ValueError):
        PidCursor(refill_ratio)


def test_reset_discards_remaining_ids() -> None:
    cursor = _cursor_with(PidBlock(10, 20))
    assert [cursor.take(), cursor.take()] == [10, 11]
    cursor.reset()
    assert cursor.remaining() == 0 and cursor.take() is None
    assert cursor.needs_block()
    assert cursor.add_block(PidBlock(40, 50), cursor.mark_requested())
    assert cursor.take() == 40  # 12..19 are skipped, never served


def test_block_granted_to_a_request_made_before_reset_is_refused() -> None:
    cursor = _cursor_with(PidBlock(10, 20))
    stale = cursor.mark_requested()
    cursor.reset()  # leadership changed while the request was in flight
    assert cursor.needs_block()  # the stale request no longer counts as outstanding
    fresh = cursor.mark_requested()
    assert stale != fresh
    assert not cursor.add_block(PidBlock(40, 50), stale)
    assert cursor.remaining() == 0 and cursor.take() is None
    assert not cursor.needs_block()  # the fresh request is still outstanding
    assert cursor.add_block(PidBlock(70, 80), fresh)
    assert cursor.take() == 70


def test_block_not_above_the_held_ones_is_refused() -> None:
    cursor = _cursor_with(PidBlock(40, 50))
    assert cursor.take() == 40
    for block in (PidBlock(10, 20), PidBlock(45, 55), PidBlock(40, 50), PidBlock(0, 41)):
        assert not cursor.add_block(block, cursor.mark_requested())
    assert cursor.remaining() == 9
    assert [cursor.take() for _ in range(10)] == [*range(41, 50), None]


# --- uniqueness under interleaved leaders and restarts --------------------------------

SHARDS, NODES, STEPS = 3, 3, 6000


@dataclass
class _Request:
    """A block request: proposed, then committed (block known), then answered."""

    node: int
    incarnation: int
    shard: int
    token: int
    block: PidBlock | None = None


@dataclass
class _Cluster:
    """S Raft groups (one per shard), each replicated on every node.

    A replica is a real TransactionStateMachine fed with encoded Raft entries, so
    the pid record is the one the state machine replicates.
    """

    rng: random.Random
    block_size: int
    replicas: list[list[TransactionStateMachine]] = field(default_factory=list)
    cursors: list[list[PidCursor]] = field(default_factory=list)
    incarnation: list[int] = field(default_factory=list)
    leader: list[int | None] = field(default_factory=list)
    pending: list[_Request] = field(default_factory=list)
    served: dict[int, tuple[int, int]] = field(default_factory=dict)
    last_served: list[int] = field(default_factory=list)
    txn_count: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.replicas = [
            [TransactionStateMachine(s, SHARDS, block_size=self.block_size) for s in range(SHARDS)]
            for _ in range(NODES)
        ]
        self.cursors = [[PidCursor() for _ in range(SHARDS)] for _ in range(NODES)]
        self.incarnation = [0] * NODES
        self.leader = [None] * SHARDS
        self.last_served = [-1] * SHARDS

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def commit(self, shard: int, command: Any) -> Any:
        """Append one entry to the shard's log and apply it on every replica."""
        entry = encode_entry([command])
        outcomes = [self.replicas[n][shard].apply_entry(entry) for n in range(NODES)]
        assert all(o == outcomes[0] for o in outcomes), outcomes
        assert len(outcomes[0]) == 1
        return outcomes[0][0]

    def become_leader(self, node: int, shard: int) -> None:
        self.leader[shard] = node
        self.cursors[node][shard].reset()
        self.count("leader change")

    def restart(self, node: int) -> None:
        self.incarnation[node] += 1
        self.cursors[node] = [PidCursor() for _ in range(SHARDS)]
        for shard in range(SHARDS):
            if self.leader[shard] == node:
                self.leader[shard] = None
            old = self.replicas[node][shard]
            record_wire = old.state.pids.to_wire()
            restored = TransactionStateMachine.restore(old.snapshot())
            assert PidBlockRecord.from_wire(record_wire) == restored.state.pids == old.state.pids
            self.replicas[node][shard] = restored
        # Requests of the dead process may still commit, but nobody hears the answer.
        for request in [r for r in self.pending if r.node == node]:
            self.pending.remove(request)
            if request.block is None and self.rng.random() < 0.5:
                self.commit_request(request)
                self.count("orphan block committed")
        self.count("restart")

    def commit_request(self, request: _Request) -> None:
        """The AllocatePidBlock entry is committed and applied; the answer is not back yet."""
        outcome = self.commit(
            request.shard, AllocatePidBlock(request.shard, SHARDS, self.block_size)
        )
        assert outcome.ok, outcome
        request.block = PidBlock(outcome.block_first, outcome.block_end)
        assert request.block.size == self.block_size
        layout = self.replicas[0][request.shard].state.pids.layout
        assert layout.block_seq(request.block.first) is not None

    def deliver(self, request: _Request) -> None:
        """The requesting node hears that its block was granted."""
        assert request.block is not None
        self.pending.remove(request)
        cursor = self.cursors[request.node][request.shard]
        accepted = cursor.add_block(request.block, request.token)
        self.count("block accepted" if accepted else "block refused")

    def take(self, shard: int, transactional: bool) -> None:
        node = self.leader[shard]
        if node is None:
            return
        cursor = self.cursors[node][shard]
        for _ in range(self.rng.randint(1, 4)):
            if cursor.needs_block():
                token = cursor.mark_requested()
                self.pending.append(_Request(node, self.incarnation[node], shard, token))
            pid = cursor.take()
            if pid is None:
                self.count("dry")
                return
            assert pid not in self.served, (
                f"id {pid} served twice: first by {self.served[pid]}, now by {(shard, node)}"
            )
            self.served[pid] = (shard, node)
            assert pid > self.last_served[shard], (shard, pid, self.last_served[shard])
            self.last_served[shard] = pid
            if transactional:
                # The leader stamps the id into an InitProducerId; every replica accepts it.
                self.txn_count += 1
                outcome = self.commit(
                    shard, InitProducerId(f"txn-{self.txn_count}", 60_000, 0, 1, pid)
                )
                assert outcome.ok and outcome.producer_id == pid, outcome
                self.count("transactional id")
            else:
                self.count("idempotent id")

    def step(self) -> None:
        rng = self.rng
        action = rng.choices(
            ["lead", "take", "idempotent", "commit", "deliver", "restart"],
            weights=[4, 6, 3, 4, 2, 1],
        )[0]
        shard = rng.randrange(SHARDS)
        proposed = [r for r in self.pending if r.block is None]
        committed = [r for r in self.pending if r.block is not None]
        if action == "lead":
            self.become_leader(rng.randrange(NODES), shard)
        elif action in ("take", "idempotent"):
            self.take(shard, transactional=action == "take")
        elif action == "commit" and proposed:
            self.commit_request(rng.choice(proposed))
        elif action == "deliver" and committed:
            self.deliver(rng.choice(committed))
        elif action == "restart":
            self.restart(rng.randrange(NODES))


def test_ids_are_unique_under_interleaved_leaders_and_restarts() -> None:
    seed = chosen_seed(20261126)
    rng = random.Random(seed)
    cluster = _Cluster(rng, block_size=rng.randint(5, 10))
    for _ in range(STEPS):
        cluster.step()
    print(cluster.counts)

    # Every id served is in a block its shard granted, and each shard's log agrees.
    for pid, (shard, _) in cluster.served.items():
        assert cluster.replicas[0][shard].state.pids.granted(pid)
        for other in range(SHARDS):
            if other != shard:
                assert not cluster.replicas[0][other].state.pids.granted(pid)
    for shard in range(SHARDS):
        snapshots = {cluster.replicas[n][shard].snapshot() for n in range(NODES)}
        assert len(snapshots) == 1
    # The run really exercised the cursors, stale grants and the state machine.
    assert len(cluster.served) > 150, cluster.counts
    assert cluster.counts.get("transactional id", 0) > 0, cluster.counts
    assert cluster.counts.get("block refused", 0) > 0, cluster.counts
    blocks = sum(cluster.replicas[0][s].state.pids.next_seq for s in range(SHARDS))
    assert blocks > 300, cluster.counts


# --- the record inside the state machine -------------------------------------------


def test_state_machine_grants_consecutive_blocks_of_its_stripe() -> None:
    machine = TransactionStateMachine(1, 3, block_size=10)
    grants = [machine.apply(AllocatePidBlock(1, 3, 10)) for _ in range(4)]
    assert all(o.ok for o in grants)
    assert [(o.block_first, o.block_end) for o in grants] == [
        (10, 20),
        (40, 50),
        (70, 80),
        (100, 110),
    ]
    assert machine.state.pids.next_seq == 4


@pytest.mark.parametrize("layout", [(0, 3, 10), (2, 3, 10), (1, 4, 10), (1, 3, 11), (1, 3, 1000)])
def test_state_machine_refuses_a_layout_mismatch(layout: tuple[int, int, int]) -> None:
    machine = TransactionStateMachine(1, 3, block_size=10)
    machine.apply(AllocatePidBlock(1, 3, 10))
    before = machine.snapshot()
    outcome = machine.apply(AllocatePidBlock(*layout))
    assert outcome.error is ErrorCode.INVALID_REQUEST
    assert (outcome.block_first, outcome.block_end) == (-1, -1)
    assert machine.snapshot() == before


def test_state_machine_reports_an_exhausted_stripe() -> None:
    machine = TransactionStateMachine(0, 3, block_size=2**61)
    assert machine.apply(AllocatePidBlock(0, 3, 2**61)).ok
    assert machine.apply(AllocatePidBlock(0, 3, 2**61)).ok
    before = machine.snapshot()
    outcome = machine.apply(AllocatePidBlock(0, 3, 2**61))
    assert outcome.error is ErrorCode.UNKNOWN_SERVER_ERROR
    assert machine.snapshot() == before


def _machine_with_one_block() -> TransactionStateMachine:
    machine = TransactionStateMachine(1, 3, block_size=10)
    assert machine.apply(AllocatePidBlock(1, 3, 10)).ok  # grants [10, 20)
    return machine


def _init(tid: str, pid: int) -> InitProducerId:
    return InitProducerId(tid, 60_000, 1_000, 1, new_producer_id=pid)


@pytest.mark.parametrize("pid", [0, 9, 20, 25, 40, 45, 10**9, MAX_PRODUCER_ID, -2])
def test_init_producer_id_refuses_an_id_never_granted(pid: int) -> None:
    # 0..9 belong to shard 0, 20..29 to shard 2, 40..49 is shard 1's next (ungranted) block.
    machine = _machine_with_one_block()
    before = machine.snapshot()
    outcome = machine.apply(_init("txn-a", pid))
    assert outcome.error is ErrorCode.INVALID_REQUEST
    assert machine.snapshot() == before
    assert machine.describe("txn-a") is None


def test_init_producer_id_accepts_fresh_granted_ids_only_increasing() -> None:
    machine = _machine_with_one_block()
    first = machine.apply(_init("txn-a", 12))
    assert first.ok and (first.producer_id, first.producer_epoch) == (12, 0)
    assert machine.state.last_assigned_pid == 12
    for pid in (12, 11, 10):  # not greater than the last assigned one
        before = machine.snapshot()
        outcome = machine.apply(_init("txn-b", pid))
        assert outcome.error is ErrorCode.INVALID_REQUEST, pid
        assert machine.snapshot() == before
    second = machine.apply(_init("txn-b", 13))
    assert second.ok and second.producer_id == 13
    assert machine.state.last_assigned_pid == 13
    # The next block of the stripe becomes usable once granted.
    assert machine.apply(_init("txn-c", 41)).error is ErrorCode.INVALID_REQUEST
    assert machine.apply(AllocatePidBlock(1, 3, 10)).block_first == 40
    assert machine.apply(_init("txn-c", 41)).producer_id == 41


def test_last_assigned_id_survives_other_commands() -> None:
    machine = _machine_with_one_block()
    assert machine.apply(_init("txn-a", 12)).ok
    assert machine.apply(AddPartitions("txn-a", 12, 0, (("orders", 0),), 1_001, 1)).ok
    assert machine.state.last_assigned_pid == 12
    before = machine.snapshot()
    # The same producer id for a second transactional.id must be refused.
    outcome = machine.apply(_init("txn-b", 12))
    assert outcome.error is ErrorCode.INVALID_REQUEST
    assert machine.snapshot() == before


def test_a_failed_request_allows_a_new_one() -> None:
    cursor = PidCursor()
    stale = cursor.mark_requested()
    assert not cursor.needs_block()
    cursor.reset()
    current = cursor.mark_requested()
    cursor.request_failed(stale)  # an answer from before the reset changes nothing
    assert not cursor.needs_block()
    cursor.request_failed(current)
    assert cursor.needs_block()
