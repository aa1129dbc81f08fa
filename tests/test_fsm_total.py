"""``apply`` is total: random commands from random reachable states never raise,
never make a handler attempt a transition the rules forbid, and replicas that
apply the same log stay identical.

Every entry goes through the wire (``encode_entry`` / ``apply_entry``) as it
does on a replica, so field values are whatever msgpack can carry: 64-bit
extremes, empty and huge strings, epochs at and past the largest, unknown
producer ids, times that jump backwards. About half the commands are
plausible (the current producer id and epoch of an id, fresh producer ids,
the right block layout) so that runs reach deep states: exhausted epochs,
rotations, timeouts, fences, pending markers and offsets. Three replicas
apply each run: two from the start and one restored from a snapshot taken
half-way; after every entry the state must snapshot, restore to the same
bytes, and equal the other replicas'.

The seed is fixed and printed; ``RAFTCOORD_SEED=<seed>`` replays a run
(tests/seeds.py).
"""

from __future__ import annotations

import random
from dataclasses import fields
from typing import Any, get_type_hints

import msgpack
import pytest

from fsm import (
    AbortTimedOut,
    AddPartitions,
    AllocatePidBlock,
    Command,
    EndTxn,
    FsmConfig,
    GroupProtocol,
    InitProducerId,
    MarkersWritten,
    MemberAssignment,
    OffsetEntry,
    OffsetReservation,
    TransactionMetadata,
    TransactionStateMachine,
    TxnState,
    encode_entry,
)
from fsm.commands import COMMAND_TYPES
from fsm.errors import ErrorCode
from fsm.machine import HANDLER_BUG
from fsm.wire import INT64_MAX, INT64_MIN
from raftcoord.protocol.acl import (
    Acl,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from raftcoord.protocol.limits import KAFKA_MAX_PRODUCER_EPOCH
from raftcoord.protocol.types import TopicPartition
from tests.seeds import chosen_seed

SHARD, SHARD_COUNT, BLOCK_SIZE = 1, 3, 5
STEPS = 200
IDS = ["t0", "t1", "t2"]
GROUPS = ["g0", "g1"]
TOPICS = ["a", "b"]
MEMBERS = ["m0", "m1", "m2"]
INSTANCES = ["", "", "i0", "i1"]
PROTOCOLS = ["range", "roundrobin"]
DIRECTORIES = ["a" * 32, "b" * 32]
EXTREME_INTS = [
    INT64_MIN,
    INT64_MIN + 1,
    -(2**31),
    -2,
    -1,
    0,
    1,
    2**31 - 1,
    INT64_MAX - 1,
    INT64_MAX,
]
ODD_STRINGS = ["", "\x00", "é" * 300, "t" * 5000, ".", "..", "a/b", "\U0001f600"]


#: How often each command is drawn: the transaction commands most, so that
#: runs reach high epochs, rotations and fences.
WEIGHTS: dict[type[Command], int] = {
    cls: 6 if cls in (InitProducerId, AddPartitions, EndTxn, MarkersWritten, AbortTimedOut) else 1
    for cls in COMMAND_TYPES.values()
}


class Fuzzer:
    """Draws commands against the state of one machine (all replicas are equal)."""

    def __init__(self, rng: random.Random, config: FsmConfig) -> None:
        self.rng = rng
        self.config = config
        self.now = 1_000_000
        self.term = 1
        self.hints = {cls: get_type_hints(cls) for cls in COMMAND_TYPES.values()}

    def entry(self, machine: TransactionStateMachine) -> bytes:
        """One Raft entry: usually 1-3 commands, sometimes garbage."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.03:
            return rng.randbytes(rng.randrange(0, 40))
        if roll < 0.06:
            junk = rng.choice([{"v": 1, "cmds": [{"v": 1, "t": rng.randrange(0, 20)}]}, [1, 2], {}])
            return bytes(msgpack.packb(junk))
        self.now += rng.choice([0, 1, 7, 500, 3_000, 70_000])
        if rng.random() < 0.05:
            self.term += 1
        commands = [self.command(machine) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
        return encode_entry(commands)

    def command(self, machine: TransactionStateMachine) -> Command:
        rng = self.rng
        [cls] = rng.choices(list(WEIGHTS), list(WEIGHTS.values()))
        if cls is AllocatePidBlock and rng.random() < 0.7:
            return AllocatePidBlock(SHARD, SHARD_COUNT, BLOCK_SIZE)
        plausible = rng.random() < 0.75
        tid = rng.choice(IDS) if plausible or rng.random() < 0.5 else self.string()
        meta = machine.state.transactions.get(tid)
        values: dict[str, Any] = {}
        for f in fields(cls):
            kind = self.hints[cls][f.name]
            values[f.name] = self.value(f.name, kind, tid, meta, machine, plausible)
        if cls is InitProducerId and plausible and rng.random() < 0.7:
            # A producer that agrees with itself: no expectation, or the current one.
            current = (-1, -1) if meta is None else (meta.producer_id, meta.producer_epoch)
            values["expected_producer_id"], values["expected_producer_epoch"] = rng.choice(
                [(-1, -1), current]
            )
        return cls(**values)

    def value(
        self,
        name: str,
        kind: Any,
        tid: str,
        meta: Any,
        machine: TransactionStateMachine,
        plausible: bool,
    ) -> Any:
        rng = self.rng
        if kind is bool:
            return rng.random() < 0.5
        if kind is str:
            if name == "transactional_id":
                return tid
            if name in ("group_id",):
                return rng.choice(GROUPS) if plausible else self.string()
            if name in ("member_id", "new_member_id"):
                return rng.choice([*MEMBERS, ""]) if plausible else self.string()
            if name == "group_instance_id":
                return rng.choice(INSTANCES) if plausible else self.string()
            if name == "protocol_type":
                return "consumer" if plausible else self.string()
            if name == "directory_id":
                return rng.choice(DIRECTORIES) if plausible else self.string()
            return rng.choice(TOPICS) if plausible else self.string()
        if kind is int:
            return self.integer(name, meta, machine, plausible)
        if kind == tuple[str, ...]:
            if plausible and name == "groups" and meta is not None and rng.random() < 0.5:
                return tuple(sorted(meta.groups))
            pool = IDS if name == "transactional_ids" else GROUPS
            return tuple(
                rng.choice(pool) if plausible else self.string() for _ in range(rng.randrange(0, 4))
            )
        if kind == tuple[int, ...]:
            return tuple(
                self.integer("node", meta, machine, plausible) for _ in range(rng.randrange(0, 4))
            )
        if kind == tuple[tuple[int, ...], ...]:  # replica lists
            return tuple(
                tuple(
                    self.integer("node", meta, machine, plausible)
                    for _ in range(rng.randrange(0, 4))
                )
                for _ in range(rng.randrange(0, 4))
            )
        if kind == tuple[TopicPartition, ...]:
            if plausible and meta is not None and meta.partitions and rng.random() < 0.5:
                return tuple(sorted(meta.partitions))
            return tuple(
                TopicPartition(
                    rng.choice(TOPICS) if plausible else self.string(), self.small_or_extreme()
                )
                for _ in range(rng.randrange(0 if not plausible else 1, 4))
            )
        if kind == tuple[OffsetEntry, ...]:
            return tuple(
                OffsetEntry(
                    rng.choice(TOPICS) if plausible else self.string(),
                    self.small_or_extreme(),
                    self.small_or_extreme(),
                    self.string() if rng.random() < 0.2 else "",
                )
                for _ in range(rng.randrange(0, 3))
            )
        if kind == tuple[GroupProtocol, ...]:
            names = rng.sample(PROTOCOLS, rng.randrange(1, 3)) if plausible else [self.string()]
            return tuple(GroupProtocol(n, rng.randbytes(rng.randrange(0, 4))) for n in names)
        if kind == tuple[MemberAssignment, ...]:
            return tuple(
                MemberAssignment(rng.choice(MEMBERS) if plausible else self.string(), b"x")
                for _ in range(rng.randrange(0, 4))
            )
        if kind == tuple[OffsetReservation, ...]:
            return tuple(
                OffsetReservation(
                    rng.choice(TOPICS) if plausible else self.string(),
                    self.small_or_extreme(),
                    rng.choice([0, 1_000, 2**62]) if plausible else self.small_or_extreme(),
                )
                for _ in range(rng.randrange(0, 3))
            )
        if kind is bytes:
            return rng.randbytes(rng.choice([0, 16, 32, 64]))
        if kind == tuple[Acl, ...]:
            return tuple(
                Acl(
                    rng.choice(list(ResourceType)),
                    rng.choice(list(PatternType)),
                    rng.choice(["*", "kafka-cluster", "orders", ""])
                    if plausible
                    else self.string(),
                    rng.choice(["User:a", "User:*", "a"]) if plausible else self.string(),
                    rng.choice(["*", "127.0.0.1", ""]),
                    rng.choice(list(Operation)),
                    rng.choice(list(Permission)),
                )
                for _ in range(rng.randrange(0, 3))
            )
        if kind == tuple[AclFilter, ...]:
            return tuple(
                AclFilter(
                    rng.choice(list(ResourceType)),
                    rng.choice(list(PatternType)),
                    rng.choice([None, "*", "orders"]) if plausible else self.string(),
                    rng.choice([None, "User:a"]),
                    rng.choice([None, "*"]),
                    rng.choice(list(Operation)),
                    rng.choice(list(Permission)),
                )
                for _ in range(rng.randrange(0, 3))
            )
        raise AssertionError(f"no generator for {name}: {kind}")

    def integer(
        self, name: str, meta: Any, machine: TransactionStateMachine, plausible: bool
    ) -> int:
        rng = self.rng
        if not plausible and rng.random() < 0.5:
            return rng.choice(EXTREME_INTS)
        top = self.config.max_producer_epoch
        if name == "now_ms":
            return self.now
        if name == "coordinator_epoch":
            return self.term
        if name == "timeout_ms":
            return rng.choice([1_000, 5_000, 60_000, self.config.transaction_max_timeout_ms])
        if name == "new_producer_id":
            fresh = self.fresh_producer_id(machine)
            return rng.choice([fresh, fresh, -1, machine.state.last_assigned_pid])
        if name in ("producer_id", "expected_producer_id"):
            if meta is None:
                return rng.choice([-1, 0, SHARD * BLOCK_SIZE])
            return rng.choice(
                [meta.producer_id] * 4 + [meta.last_producer_id, meta.next_producer_id, -1]
            )
        if name in ("producer_epoch", "expected_producer_epoch"):
            if meta is None:
                return rng.choice([-1, 0])
            return rng.choice(
                [meta.producer_epoch] * 4
                + [meta.last_producer_epoch, meta.producer_epoch + 1, top - 2, top - 1, top, -1]
            )
        if name == "generation_id":
            group = machine.group(rng.choice(GROUPS))
            return rng.choice([-1, 0, 1, 2] + ([group.generation] * 3 if group else []))
        if name == "session_timeout_ms":
            return rng.choice([self.config.group_min_session_timeout_ms, 10_000, 45_000, 0])
        if name == "rebalance_timeout_ms":
            return rng.choice([1_000, 60_000, 300_000])
        if name in ("shard", "shard_count", "block_size"):
            return rng.choice([SHARD, SHARD_COUNT, BLOCK_SIZE, 0, 1000])
        return self.small_or_extreme()

    @staticmethod
    def fresh_producer_id(machine: TransactionStateMachine) -> int:
        """The id a leader would stamp next (-1 when every granted id is used)."""
        pids, last = machine.state.pids, machine.state.last_assigned_pid
        for seq in range(pids.next_seq):
            block = pids.layout.block(seq)
            if block.end > last + 1:
                return max(block.first, last + 1)
        return -1

    def small_or_extreme(self) -> int:
        return self.rng.choice([0, 1, 2, 3, 100, *EXTREME_INTS])

    def string(self) -> str:
        return self.rng.choice(ODD_STRINGS + IDS + GROUPS + TOPICS)


def replica(config: FsmConfig) -> TransactionStateMachine:
    return TransactionStateMachine(SHARD, SHARD_COUNT, config, BLOCK_SIZE)


def run(seed: int, config: FsmConfig) -> None:
    rng = random.Random(seed)
    fuzzer = Fuzzer(rng, config)
    first, second = replica(config), replica(config)
    late: TransactionStateMachine | None = None
    log: list[bytes] = []
    for step in range(STEPS):
        entry = fuzzer.entry(first)
        log.append(entry)
        where = f"seed {seed}, step {step}, entry {entry!r}"
        outcomes = first.apply_entry(entry)  # raising fails the test with the seed below
        assert not [o for o in outcomes if HANDLER_BUG in o.message], where
        assert second.apply_entry(entry) == outcomes, where
        if late is not None:
            assert late.apply_entry(entry) == outcomes, where
        image = first.snapshot()
        assert second.snapshot() == image, where
        assert TransactionStateMachine.restore(image, config).snapshot() == image, where
        if late is not None:
            assert late.snapshot() == image, where
        if step == STEPS // 2:
            late = TransactionStateMachine.restore(image, config)


@pytest.mark.parametrize(
    ("config", "runs"),
    [
        # Epochs run out within a run: rotations, fences at the largest epoch.
        (FsmConfig(max_producer_epoch=4, transactional_id_expiration_ms=200_000), 60),
        (FsmConfig(max_producer_epoch=KAFKA_MAX_PRODUCER_EPOCH), 15),
    ],
    ids=["small-epochs", "kafka-epochs"],
)
def test_random_commands_apply_on_every_replica_alike(config: FsmConfig, runs: int) -> None:
    base = chosen_seed(20261126)
    for i in range(runs):
        seed = base + i
        try:
            run(seed, config)
        except Exception as exc:
            raise AssertionError(f"replay with RAFTCOORD_SEED={seed}: {exc!r}") from exc


def test_an_entry_that_breaks_an_invariant_is_refused_alike() -> None:
    """Data written before a rule existed can hold a state the rules now
    forbid (here: Ongoing at the largest epoch, which has no epoch left for
    the timeout fence). Applying the entry that meets it is a refusal on
    every replica, never an exception, and changes nothing."""
    config = FsmConfig(max_producer_epoch=4)
    replicas = [replica(config), replica(config)]
    stuck = TransactionMetadata(
        "t0", 7, 4, TxnState.ONGOING, 1_000, 0, txn_start_ms=0, partitions=frozenset({("a", 0)})
    )
    entry = encode_entry([AbortTimedOut("t0", 7, 4, 5_000, 1)])
    for machine in replicas:
        machine.state.transactions["t0"] = stuck
        before = machine.snapshot()
        [outcome] = machine.apply_entry(entry)
        assert outcome.error is ErrorCode.UNKNOWN_SERVER_ERROR
        assert "invariant" in outcome.message and "largest epoch" in outcome.message
        assert machine.snapshot() == before
    assert replicas[0].snapshot() == replicas[1].snapshot()
