"""NodeLeases (raftcoord/coordinator/controller.py) with a fake shard and
clock: leases count only in a leadership of shard 0, from its start; an
expired node is fenced once at a time; a heartbeat in between saves it."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from fsm import AlterPartition, CreateTopic, FenceNode, TransactionStateMachine, UnfenceNode
from raftcoord.coordinator.controller import NodeLeases, PreferredLeaders


@dataclass
class FakeReplica:
    fenced: frozenset[int] = frozenset()

    def query(self, reader: Any) -> Any:
        @dataclass
        class State:
            fenced_nodes: frozenset[int]

        @dataclass
        class Machine:
            state: State

        return reader(Machine(State(self.fenced)))


@dataclass
class FakeShard:
    is_leader: bool = False
    ready: bool = False
    leader_term: int = 0
    node_id: int = 1
    replica: FakeReplica = field(default_factory=FakeReplica)
    submitted: list[tuple[int, Future[Any]]] = field(default_factory=list)

    def submit(self, build: Any, parkable: bool = True) -> Future[Any]:
        assert not parkable

        @dataclass
        class Stamp:
            now_ms: int = 0

        command = build(Stamp())
        assert isinstance(command, FenceNode)
        future: Future[Any] = Future()
        self.submitted.append((command.node_id, future))
        return future


def leases() -> tuple[NodeLeases, FakeShard, list[float]]:
    shard = FakeShard()
    now = [0.0]
    return NodeLeases(shard, [101, 102, 103], 9_000, clock=lambda: now[0]), shard, now  # type: ignore[arg-type]


def test_leases_count_only_while_leading_and_from_the_leaderships_start() -> None:
    made, shard, now = leases()
    now[0] = 100.0
    assert made.expired() == []  # not leading: nothing expires
    shard.is_leader = shard.ready = True
    shard.leader_term = 5
    assert made.expired() == []  # a new leadership: every lease starts now
    now[0] = 105.0
    made.heard(101)
    now[0] = 110.0
    assert made.expired() == [102, 103]
    shard.leader_term = 6  # another leadership (this node again): full leases again
    assert made.expired() == []


def test_an_expired_node_is_fenced_once_at_a_time_unless_heard_or_fenced() -> None:
    made, shard, now = leases()
    shard.is_leader = shard.ready = True
    made.expired()
    now[0] = 10.0
    shard.replica.fenced = frozenset({103})
    made.check()
    assert [n for n, _ in shard.submitted] == [101, 102]  # 103 is fenced already
    made.check()
    assert len(shard.submitted) == 2  # in flight: no second one
    shard.submitted[0][1].set_result(None)  # 101's answered (refused: say a lost leadership)
    made.heard(102)
    made.check()
    assert [n for n, _ in shard.submitted] == [101, 102, 101]
    shard.submitted[1][1].set_result(None)
    made.check()  # 102 was heard from since its fence was proposed: not again
    assert [n for n, _ in shard.submitted] == [101, 102, 101]


# --- preferred-leader balancing -------------------------------------------------------------


@dataclass
class MachineShard:
    """Shard 0 as the balancer sees it: a real state machine it queries and
    proposes to (a proposal applies at once)."""

    machine: TransactionStateMachine
    is_leader: bool = True
    ready: bool = True
    node_id: int = 1
    proposed: list[Any] = field(default_factory=list)

    @property
    def replica(self) -> MachineShard:
        return self

    def query(self, reader: Any) -> Any:
        return reader(self.machine)

    def submit(self, build: Any, parkable: bool = True) -> Future[Any]:
        assert not parkable
        command = build(type("Stamp", (), {"now_ms": 0})())
        self.proposed.append(command)
        future: Future[Any] = Future()
        future.set_result(self.machine.apply(command))
        return future


def test_a_node_back_in_sync_leads_its_preferred_partitions_again_at_the_next_check() -> None:
    m = TransactionStateMachine(0, 3)
    assignment = ((101, 102, 103), (102, 103, 101), (103, 101, 102), (101, 103, 102))
    assert m.apply(CreateTopic("t", (101, 102, 103, 101), 1, assignment, 2)).ok
    assert m.apply(FenceNode(101, 2)).ok  # 101's partitions move to the next ISR member
    assert [p.leader for p in m.state.topics["t"].partitions] == [102, 102, 103, 103]
    shard = MachineShard(m)
    now = [0.0]
    balancer = PreferredLeaders(shard, 300, 10, clock=lambda: now[0])  # type: ignore[arg-type]
    assert balancer.check() == []  # the first check is an interval away
    now[0] = 301.0
    assert balancer.check() == [] and shard.proposed == []  # 101 is fenced and out of the ISRs
    assert m.apply(UnfenceNode(101, 3)).ok
    assert m.apply(AlterPartition("t", 0, 102, 1, 1, (101, 102, 103), 4)).ok  # caught up
    now[0] = 400.0
    assert balancer.check() == []  # not due before 601
    now[0] = 602.0
    assert balancer.check() == [101]
    partitions = m.state.topics["t"].partitions
    assert [p.leader for p in partitions] == [101, 102, 103, 103]  # 3: 101 not in its ISR
    assert partitions[0].leader_epoch == 2
    shard.is_leader = False
    assert balancer.check() == []
