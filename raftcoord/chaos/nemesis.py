"""The nemesis: faults on a schedule against a local cluster, each recorded
in the history as a ``fault`` event with phase ``start`` and ``end``.

It uses only the cluster launcher (:class:`~raftcoord.cluster.launcher.LocalCluster`:
kill, start, leaders) and, for network partitions, :mod:`raftcoord.cluster.netns`. Faults run one at
a time: a quiet ``interval``, then a fault held for its planned time, then
its end (restart, SIGCONT or heal), and so on. Which faults run, in which
order, and their random choices (shard, node, hold time) come from the seed;
the nodes they hit are resolved against the cluster when they start (the
leader of shard 2 is whoever leads it then).
"""

from __future__ import annotations

import contextlib
import random
import shutil
import threading
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from raftcoord.chaos.history import SLOW_S, History
from raftcoord.client import Admin
from raftcoord.client.records import TopicPartitionDescription
from raftcoord.cluster import netns
from raftcoord.cluster.launcher import ClusterError, LocalCluster

__all__ = ["Fault", "FaultPlan", "Nemesis", "client_failures", "effect", "plans"]

#: The node restarts and waits of one fault end are retried this long by the final heal.
HEAL_TIMEOUT_S = 60.0
#: A fault that cannot start (e.g. its shard has no leader yet) is tried this
#: many times, a second apart, before the schedule moves on.
START_ATTEMPTS = 5
#: How long a fault waits for a shard to elect another leader before ending.
NEW_LEADER_TIMEOUT_S = 10.0
#: How long a disk fault's end waits for its node to stop on a failed fsync.
DISK_STOP_TIMEOUT_S = 10.0
#: How long a plog-leader-kill waits, beyond the lease (broker.session.timeout.ms),
#: for its partition to have another leader.
PLOG_LEADER_TIMEOUT_S = 10.0
#: How long a plog-wipe's end waits for the node to be back in every ISR.
CATCH_UP_TIMEOUT_S = 60.0
#: The ``fault`` of the events around a restart by the final heal of a node
#: that was down outside any fault (docs/history.md).
HEAL_RESTART = "heal-restart"
#: The faults that cut the network (they need namespaces, and a heal).
NETWORK_FAULTS = ("partition", "plog-partition", "gateway-partition")
#: History ops that are not client operations (a fault's failed requests
#: are the client operations that failed or ended unknown while it lasted).
NOT_CLIENT_OPS = ("run", "fault", "final")


@dataclass(frozen=True)
class FaultPlan:
    """One scheduled fault: its kind, a random ``choice`` that picks the
    shard, nodes or groups when it starts, and how long it is held."""

    number: int
    kind: str
    choice: int
    hold_s: float


def plans(seed: int, kinds: Sequence[str], election_timeout_s: float) -> Iterator[FaultPlan]:
    """The fault schedule for ``seed``: rounds in which every kind runs once,
    in a shuffled order. A pause lasts 2-4 election timeouts; a killed node
    stays down 1-3 s; a partition lasts 2-5 s."""
    if not kinds:
        return
    rng = random.Random(f"nemesis:{seed}")
    number = 0
    while True:
        round_ = list(kinds)
        rng.shuffle(round_)
        for kind in round_:
            if kind == "pause":
                hold = election_timeout_s * rng.uniform(2.0, 4.0)
            elif kind in NETWORK_FAULTS:
                hold = rng.uniform(2.0, 5.0)
            else:
                hold = rng.uniform(1.0, 3.0)
            yield FaultPlan(number, kind, rng.randrange(1 << 30), round(hold, 3))
            number += 1


@dataclass
class Fault:
    """A fault that has started: what ending it takes."""

    plan: FaultPlan
    targets: list[Any]
    detail: str
    #: Ends the fault; returns the end's detail and fields to record with it.
    end: Callable[[], tuple[str, dict[str, Any]]]
    #: Recorded with the start and the end (e.g. the shard whose leader is hit).
    fields: dict[str, Any] = field(default_factory=dict)
    #: The shards' leaders, the client operations that had failed and those
    #: that had been slow (History.slow), at its start.
    leaders: dict[str, int] = field(default_factory=dict)
    failures: int = 0
    slow: int = 0


def client_failures(counts: Mapping[tuple[str, str], int]) -> int:
    """Client operations of a history tally (History.counts) that failed or
    ended unknown."""
    return sum(
        n
        for (op, type_), n in counts.items()
        if type_ in ("fail", "info") and op not in NOT_CLIENT_OPS
    )


def effect(
    fault: Fault, leaders: dict[str, int], failures: int, outcome: dict[str, Any], slow: int
) -> str:
    """What ``fault`` changed, as the cluster and the clients saw it by its
    end: a shard's or a partition's leader moved, a wiped node caught up,
    requests failed, requests were held up (took over
    :data:`raftcoord.chaos.history.SLOW_S`), a node stopped on its disk; ""
    when none of these was seen."""
    seen = []
    moved = sorted(
        s for s in set(fault.leaders) | set(leaders) if fault.leaders.get(s) != leaders.get(s)
    )
    if "topic" in fault.fields and outcome.get("new_leader") is not None:
        seen.append(f"partition leader moved ({fault.fields['topic']}-{fault.fields['partition']})")
    elif moved or outcome.get("new_leader") is not None:
        seen.append(f"leader moved (shards {', '.join(moved) or fault.fields.get('shard')})")
    if outcome.get("in_sync"):
        seen.append("the wiped node caught up")
    if outcome.get("stopped"):
        seen.append("node stopped on a failed fsync")
    if failures > fault.failures:
        seen.append(f"{failures - fault.failures} client operations failed or ended unknown")
    if slow > fault.slow:
        seen.append(f"{slow - fault.slow} client operations took over {SLOW_S:g} s")
    return "; ".join(seen)


def _why_no_partitions(cluster: LocalCluster) -> str | None:
    """Why the network of ``cluster`` cannot be partitioned, or None."""
    reason = netns.unavailable()
    if reason is not None:
        return f"network namespaces cannot be created here: {reason}"
    if not netns.enabled(cluster):
        return (
            "the cluster does not run in network namespaces "
            "(start it with `raftcoord cluster up --netns`)"
        )
    return None


class Nemesis:
    """Runs faults from :func:`plans` until stopped, then heals the cluster.

    Args:
        cluster: the cluster to break (its launcher state is updated on restarts).
        history: where fault events go.
        kinds: the faults to run (:data:`raftcoord.chaos.arguments.FAULT_KINDS`).
        interval_s: quiet time between the end of one fault and the next start.
        seed: the schedule's seed.
        say: prints a line for the user.
    """

    def __init__(
        self,
        cluster: LocalCluster,
        history: History,
        kinds: Sequence[str],
        interval_s: float,
        seed: int,
        say: Callable[[str], None] = print,
    ) -> None:
        self.cluster = cluster
        self.history = history
        self.interval_s = interval_s
        self.say = say
        self._lock = threading.Lock()
        self._active: list[Fault] = []
        #: Per kind: faults ended, and those of them that changed something.
        self.done: dict[str, int] = {}
        self.effective: dict[str, int] = {}
        #: The kinds asked for, and why those that cannot run here do not.
        self.requested = tuple(kinds)
        self.not_run: dict[str, str] = {}
        self._stop = threading.Event()
        self._partitions = False  # whether partition faults run (and need healing)
        runnable = list(kinds)
        for kind in NETWORK_FAULTS:
            if kind not in runnable:
                continue
            reason = _why_no_partitions(cluster)
            if reason is None and kind == "gateway-partition" and not cluster.kafka_gateways():
                reason = "the cluster has no Kafka gateways (`cluster up --kafka-listeners N`)"
            if reason is None:
                self._partitions = True
            else:
                runnable.remove(kind)
                self._skip(kind, f"not run: {reason}")
        state = cluster.state
        if "disk" in runnable and (state is None or state.faults is None):
            runnable.remove("disk")
            self._skip(
                "disk",
                "not run: the cluster does not run with injected faults "
                "(start it with `raftcoord cluster up --faults`, which needs a C compiler)",
            )
        self.kinds = tuple(runnable)
        self._plans = plans(seed, self.kinds, self._election_timeout_s())

    def _election_timeout_s(self) -> float:
        """The cluster's longest election timeout (``raft.election.timeout.ms``)."""
        timeout = self._setting("raft.election.timeout.ms", [300, 600])
        return float(max(timeout) if isinstance(timeout, list) else timeout) / 1000

    def _setting(self, name: str, default: Any) -> Any:
        """A setting of the cluster's config (``default`` when it sets none)."""
        state = self.cluster.state
        if state is None:
            raise ClusterError(f"no cluster in {self.cluster.data_dir}")
        with open(state.config, "rb") as f:
            return tomllib.load(f).get("settings", {}).get(name, default)

    def _skip(self, kind: str, detail: str) -> None:
        self.not_run[kind] = detail
        self.say(f"nemesis: {kind} {detail}")
        for phase in ("start", "end"):
            self.history.event(
                "nemesis", "info", "fault", phase=phase, fault=kind, targets=[], detail=detail
            )

    # --- running -------------------------------------------------------------------

    def current(self) -> list[str]:
        """Readable names of the faults in progress."""
        with self._lock:
            return [f"{f.plan.kind} {f.targets}" for f in self._active]

    def report(self) -> list[dict[str, Any]]:
        """Per kind asked for: how many of its faults happened (ended), how
        many of them changed something (:func:`effect`), and why it did not
        run here, if so."""
        with self._lock:
            return [
                {
                    "fault": kind,
                    "happened": self.done.get(kind, 0),
                    "changed": self.effective.get(kind, 0),
                    "not_run": self.not_run.get(kind, ""),
                }
                for kind in self.requested
            ]

    def every_kind_happened(self) -> bool:
        """Whether every kind that can run here has happened at least once."""
        with self._lock:
            return all(self.done.get(kind, 0) for kind in self.kinds)

    def run(self) -> None:
        """Run faults until :meth:`stop`, strictly one at a time: the next
        starts only after the previous one ended and the cluster recovered
        (every node up, every shard with a leader). The fault in progress
        is ended when stopped."""
        for plan in self._plans:
            if self._stop.wait(self.interval_s):
                return
            fault = self._start(plan)
            for _ in range(START_ATTEMPTS - 1):
                if fault is not None or self._stop.wait(1.0):
                    break
                fault = self._start(plan)
            if fault is None:
                continue
            self._stop.wait(plan.hold_s)
            self._end(fault)
            self._settle()

    def _settle(self) -> None:
        """Until stopped: end what did not end yet, and wait until every node
        runs and every shard has a leader (what the next fault starts from)."""
        said = False
        while not self._stop.is_set():
            if self._end_active() and self._recovered():
                return
            if not said:
                self.say("nemesis: waiting for the cluster to recover before the next fault")
                said = True
            self._stop.wait(0.5)

    def _end_active(self) -> bool:
        """Try to end every fault in progress; whether none is left."""
        with self._lock:
            active = list(self._active)
        for fault in active:
            self._end(fault)
        with self._lock:
            return not self._active

    def _recovered(self) -> bool:
        state = self.cluster.state
        assert state is not None
        if not all(self.cluster.alive(n.node_id) for n in state.nodes):
            return False
        return len(self.cluster.leaders()) == state.shard_count

    def stop(self) -> None:
        self._stop.set()

    def heal(self) -> None:
        """End every fault still in progress and restart every node that is down
        (SIGCONT to all, heal the network); wait for every shard's leader."""
        self._stop.set()
        deadline = time.monotonic() + HEAL_TIMEOUT_S
        while not self._end_active():
            if time.monotonic() > deadline:
                raise ClusterError(f"could not heal: {self.current()}")
            time.sleep(1.0)
        if self._partitions:
            netns.heal(self.cluster)
        state = self.cluster.state
        assert state is not None
        for record in state.nodes:
            if not self.cluster.alive(record.node_id):
                detail = f"node {record.node_id} was down outside any fault"
                self.say(f"nemesis: {detail}; restarting")
                # Recorded as a fault of its own: a restart the audit must know of.
                for phase in ("start", "end"):
                    if phase == "end":
                        self.cluster.start(record.node_id)
                    self.history.event(
                        "nemesis",
                        "info",
                        "fault",
                        phase=phase,
                        fault=HEAL_RESTART,
                        targets=[record.node_id],
                        detail=detail if phase == "start" else "restarted by the final heal",
                    )
            else:
                self.cluster.kill(record.node_id, "CONT")
        self.cluster.wait_for_leaders(HEAL_TIMEOUT_S)

    # --- faults --------------------------------------------------------------------

    def _start(self, plan: FaultPlan) -> Fault | None:
        starter = {
            "leader-kill": self._leader_kill,
            "minority-kill": self._minority_kill,
            "pause": self._pause,
            "plog-restart": self._plog_restart,
            "plog-leader-kill": self._plog_leader_kill,
            "plog-wipe": self._plog_wipe,
            "plog-partition": self._plog_partition,
            "partition": self._partition,
            "gateway-partition": self._gateway_partition,
            "disk": self._disk,
        }[plan.kind]
        try:
            fault = starter(plan)
        except ClusterError as exc:
            self.say(f"nemesis: {plan.kind} could not start: {exc}")
            return None
        if fault is not None:
            self.say(f"nemesis: {plan.kind} start {fault.targets}: {fault.detail}")
        return fault

    def _begin(
        self,
        plan: FaultPlan,
        targets: list[Any],
        detail: str,
        act: Callable[[], None],
        end: Callable[[], tuple[str, dict[str, Any]]],
        **fields: Any,
    ) -> Fault:
        """Record the start (with the planned hold, ``hold_s``), do ``act``, and
        remember the fault as active."""
        leaders = self._leaders()
        fault = Fault(
            plan,
            targets,
            detail,
            end,
            fields,
            leaders,
            client_failures(self.history.counts()),
            self.history.slow(),
        )
        self.history.event(
            "nemesis",
            "info",
            "fault",
            phase="start",
            fault=plan.kind,
            targets=targets,
            detail=detail,
            hold_s=plan.hold_s,
            leaders=leaders,
            **fields,
        )
        with self._lock:
            self._active.append(fault)
        act()
        return fault

    def _end(self, fault: Fault) -> None:
        """End ``fault`` and record it; a failure leaves it active (the final
        heal tries again)."""
        try:
            detail, outcome = fault.end()
        except ClusterError as exc:
            self.say(f"nemesis: {fault.plan.kind} {fault.targets} did not end yet: {exc}")
            return
        leaders = self._leaders()
        failures, slow = client_failures(self.history.counts()), self.history.slow()
        changed = effect(fault, leaders, failures, outcome, slow)
        kind = fault.plan.kind
        with self._lock:
            self._active.remove(fault)
            self.done[kind] = self.done.get(kind, 0) + 1
            if changed:
                self.effective[kind] = self.effective.get(kind, 0) + 1
        self.history.event(
            "nemesis",
            "info",
            "fault",
            phase="end",
            fault=kind,
            targets=fault.targets,
            detail=detail,
            leaders=leaders,
            changed=changed,
            **fault.fields,
            **outcome,
        )
        self.say(f"nemesis: {kind} end {fault.targets}: {detail} ({changed or 'no change seen'})")

    def _leaders(self) -> dict[str, int]:
        return {str(shard): node for shard, node in sorted(self.cluster.leaders().items())}

    def _shard_and_leader(self, plan: FaultPlan) -> tuple[int, int]:
        state = self.cluster.state
        assert state is not None
        shard = plan.choice % state.shard_count
        leader = self.cluster.leaders().get(shard)
        if leader is None:
            raise ClusterError(f"shard {shard} has no leader right now")
        return shard, leader

    def _await_other_leader(self, shard: int, old: int) -> tuple[str, dict[str, Any]]:
        """Wait (bounded) until another node leads ``shard``: says who does,
        and gives it as ``new_leader`` (None when none did in time)."""
        found: dict[str, Any] = {"new_leader": None}

        def moved() -> bool:
            leader = self.cluster.leaders().get(shard)
            found["new_leader"] = leader if leader != old else None
            return found["new_leader"] is not None

        self.cluster.wait_until(moved, NEW_LEADER_TIMEOUT_S, "", raise_on_timeout=False)
        return f"shard {shard} leader {old} -> {found['new_leader']}", found

    def _restart(self, node_ids: Sequence[int]) -> None:
        """Start those of ``node_ids`` that are down, all at once."""
        self.cluster.start(*(n for n in node_ids if not self.cluster.alive(n)))

    def _leader_kill(self, plan: FaultPlan) -> Fault:
        shard, leader = self._shard_and_leader(plan)

        def end() -> tuple[str, dict[str, Any]]:
            moved, outcome = self._await_other_leader(shard, leader)
            self._restart([leader])
            return f"{moved}; restarted node {leader}", outcome

        return self._begin(
            plan,
            [leader],
            f"kill -9 node {leader}, the leader of shard {shard}, for {plan.hold_s} s",
            lambda: self.cluster.kill(leader, "KILL"),
            end,
            shard=shard,
        )

    def _minority_kill(self, plan: FaultPlan) -> Fault | None:
        nodes = sorted(n.node_id for n in self.cluster.coordinators())
        count = (len(nodes) - 1) // 2
        if count == 0:
            self.say(f"nemesis: minority-kill needs 3+ coordinators, there are {len(nodes)}")
            return None
        victims = sorted(random.Random(plan.choice).sample(nodes, count))

        def act() -> None:
            for node_id in victims:
                self.cluster.kill(node_id, "KILL")

        def end() -> tuple[str, dict[str, Any]]:
            self._restart(victims)
            return f"restarted nodes {victims}", {}

        return self._begin(
            plan,
            victims,
            f"kill -9 {count} of {len(nodes)} coordinators for {plan.hold_s} s",
            act,
            end,
        )

    def _pause(self, plan: FaultPlan) -> Fault:
        shard, leader = self._shard_and_leader(plan)

        def end() -> tuple[str, dict[str, Any]]:
            moved, outcome = self._await_other_leader(shard, leader)
            self.cluster.kill(leader, "CONT")
            return f"{moved}; SIGCONT node {leader}", outcome

        return self._begin(
            plan,
            [leader],
            f"SIGSTOP node {leader}, the leader of shard {shard}, for {plan.hold_s} s",
            lambda: self.cluster.kill(leader, "STOP"),
            end,
            shard=shard,
        )

    def _plog_restart(self, plan: FaultPlan) -> Fault:
        nodes = sorted(n.node_id for n in self.cluster.partition_nodes())
        if not nodes:
            raise ClusterError("the cluster has no partition-log node")
        victim = nodes[plan.choice % len(nodes)]

        def end() -> tuple[str, dict[str, Any]]:
            self._restart([victim])
            return f"restarted partition-log node {victim}", {}

        return self._begin(
            plan,
            [victim],
            f"kill -9 partition-log node {victim} for {plan.hold_s} s",
            lambda: self.cluster.kill(victim, "KILL"),
            end,
        )

    def _topic_partitions(
        self, topics: Sequence[str] | None = None
    ) -> list[tuple[str, TopicPartitionDescription]]:
        """Every partition of ``topics`` (None: every topic), as the coordinators
        record it now."""
        with Admin(self.cluster.bootstrap(), **self.cluster.client_tls()) as admin:
            names = sorted(admin.list_topics()) if topics is None else list(topics)
            described = admin.describe_topics(names)
        return [(name, p) for name, topic in sorted(described.items()) for p in topic.partitions]

    def _registration(self, topic: str, partition: int) -> TopicPartitionDescription | None:
        found = [p for _, p in self._topic_partitions([topic]) if p.partition == partition]
        return found[0] if found else None

    def _replicated_partition(self, plan: FaultPlan) -> tuple[str, TopicPartitionDescription]:
        """A partition with replicas and a leader, picked by the plan's choice."""
        led = [(t, p) for t, p in self._topic_partitions() if len(p.replicas) > 1 and p.leader >= 0]
        if not led:
            raise ClusterError("no partition with replicas has a leader")
        return led[plan.choice % len(led)]

    def _await_partition_leader(self, topic: str, partition: int, old: int) -> dict[str, Any]:
        """Wait (bounded: the lease, then :data:`PLOG_LEADER_TIMEOUT_S`) until a
        node other than ``old`` leads the partition; it is ``new_leader``
        (None when none did in time)."""
        wait_s = int(self._setting("broker.session.timeout.ms", 9_000)) / 1000
        found: dict[str, Any] = {"new_leader": None}

        def moved() -> bool:
            now = self._registration(topic, partition)
            leader = None if now is None else now.leader
            found["new_leader"] = leader if leader not in (None, old, -1) else None
            return found["new_leader"] is not None

        self.cluster.wait_until(moved, wait_s + PLOG_LEADER_TIMEOUT_S, "", raise_on_timeout=False)
        return found

    def _plog_leader_kill(self, plan: FaultPlan) -> Fault:
        """kill -9 the leader of a partition with replicas; the end waits for an
        in-sync follower to lead it (once the lease ran out), then restarts the
        node, which follows."""
        topic, chosen = self._replicated_partition(plan)
        victim, where = chosen.leader, f"{topic}-{chosen.partition}"

        def end() -> tuple[str, dict[str, Any]]:
            found = self._await_partition_leader(topic, chosen.partition, victim)
            self._restart([victim])
            return (
                f"{where} leader {victim} -> {found['new_leader']}; restarted partition-log "
                f"node {victim}",
                found,
            )

        return self._begin(
            plan,
            [victim],
            f"kill -9 partition-log node {victim}, the leader of {where}, until another "
            "replica leads it",
            lambda: self.cluster.kill(victim, "KILL"),
            end,
            topic=topic,
            partition=chosen.partition,
        )

    def _plog_partition(self, plan: FaultPlan) -> Fault:
        """Cut the leader of a partition with replicas off from every other
        node (clients still reach it): it must stop acknowledging once its
        followers move to the leader elected on the other side; the end
        waits for that election, then heals, and the old leader follows."""
        topic, chosen = self._replicated_partition(plan)
        victim, where = chosen.leader, f"{topic}-{chosen.partition}"
        state = self.cluster.state
        assert state is not None
        groups = [[victim], [n.node_id for n in state.nodes if n.node_id != victim]]

        def end() -> tuple[str, dict[str, Any]]:
            found = self._await_partition_leader(topic, chosen.partition, victim)
            netns.heal(self.cluster)
            return f"{where} leader {victim} -> {found['new_leader']}; healed the network", found

        return self._begin(
            plan,
            groups,
            f"isolate partition-log node {victim}, the leader of {where}, from every other "
            "node until another replica leads it",
            lambda: netns.partition(self.cluster, groups),
            end,
            topic=topic,
            partition=chosen.partition,
        )

    def _plog_wipe(self, plan: FaultPlan) -> Fault:
        """kill -9 a partition-log node, empty its data directory (a replaced
        disk), and start it at once: the coordinators accept the new
        directory and fence the node, which fetches every log again from the
        leaders and rejoins their ISR (the end waits for that). Only a node
        none of whose partitions lives on it alone."""
        nodes = sorted(n.node_id for n in self.cluster.partition_nodes())
        if not nodes:
            raise ClusterError("the cluster has no partition-log node")
        victim = nodes[plan.choice % len(nodes)]
        held = [(t, p) for t, p in self._topic_partitions() if victim in p.replicas]
        alone = [f"{t}-{p.partition}" for t, p in held if len(p.replicas) < 2]
        if alone:
            raise ClusterError(
                f"partition-log node {victim} holds the only replica of {alone[0]}: wiping "
                "it would lose data"
            )
        directory = self.cluster.node_dir(victim)

        def act() -> None:
            self.cluster.kill(victim, "KILL")
            shutil.rmtree(directory, ignore_errors=True)

        def end() -> tuple[str, dict[str, Any]]:
            self._restart([victim])

            def in_sync() -> bool:
                now = {(t, p.partition): p for t, p in self._topic_partitions()}
                return all(victim in now[(t, p.partition)].isr for t, p in held)

            caught_up = self.cluster.wait_until(
                in_sync, CATCH_UP_TIMEOUT_S, "", raise_on_timeout=False
            )
            state = "back in every ISR" if caught_up else "not back in every ISR yet"
            return (
                f"restarted partition-log node {victim} with its logs wiped: {state}",
                {"in_sync": bool(caught_up)},
            )

        return self._begin(
            plan,
            [victim],
            f"kill -9 partition-log node {victim} and empty its data directory "
            f"({len(held)} partitions)",
            act,
            end,
        )

    def _disk(self, plan: FaultPlan) -> Fault:
        """fsync fails on one node (a shard leader's coordinator or a
        partition-log node): it stops at its next fsync (exit status 74,
        fail-stop); the end heals the disk and starts it again."""
        fields: dict[str, Any] = {}
        plogs = sorted(n.node_id for n in self.cluster.partition_nodes())
        if plan.choice % 2 == 0 or not plogs:
            shard, victim = self._shard_and_leader(plan)
            fields["shard"] = shard
            what = f"coordinator {victim}, the leader of shard {shard}"
        else:
            victim = plogs[plan.choice // 2 % len(plogs)]
            what = f"partition-log node {victim}"

        def end() -> tuple[str, dict[str, Any]]:
            stopped = self.cluster.wait_until(
                lambda: not self.cluster.alive(victim),
                DISK_STOP_TIMEOUT_S,
                "",
                raise_on_timeout=False,
            )
            self.cluster.fail_disk(victim, failing=False)
            self._restart([victim])
            how = "stopped on a failed fsync" if stopped else "made no fsync while it failed"
            return f"node {victim} {how}; disk healed, node running", {"stopped": stopped}

        return self._begin(
            plan,
            [victim],
            f"fsync fails on {what} for {plan.hold_s} s",
            lambda: self.cluster.fail_disk(victim),
            end,
            **fields,
        )

    def _partition(self, plan: FaultPlan) -> Fault:
        nodes = sorted(n.node_id for n in self.cluster.coordinators())
        fields: dict[str, Any] = {}
        if plan.choice % 2 == 0:
            shard, leader = self._shard_and_leader(plan)
            minority = [leader]
            fields["shard"] = shard
            how = f"isolate node {leader}, the leader of shard {shard}, from the majority"
        else:
            count = max(1, (len(nodes) - 1) // 2)
            minority = sorted(random.Random(plan.choice).sample(nodes, count))
            how = f"split coordinators {minority} from the others"
        groups = [minority, [n for n in nodes if n not in minority]]
        return self._cut(plan, groups, how, **fields)

    def _gateway_partition(self, plan: FaultPlan) -> Fault:
        """Cut one Kafka gateway off from every coordinator (it still
        reaches the partition-log nodes and the other gateways, and clients
        still reach it)."""
        gateways = sorted(n.node_id for n in self.cluster.kafka_gateways())
        gateway = gateways[plan.choice % len(gateways)]
        groups = [[gateway], sorted(n.node_id for n in self.cluster.coordinators())]
        return self._cut(plan, groups, f"cut Kafka gateway {gateway} off from the coordinators")

    def _cut(self, plan: FaultPlan, groups: list[list[int]], how: str, **fields: Any) -> Fault:
        """Cut the network between ``groups`` of nodes; healed at the end."""

        def end() -> tuple[str, dict[str, Any]]:
            netns.heal(self.cluster)
            return "healed the network", {}

        return self._begin(
            plan,
            groups,
            f"{how} for {plan.hold_s} s",
            lambda: netns.partition(self.cluster, groups),
            end,
            **fields,
        )


def run_alone(
    cluster: LocalCluster,
    history: History,
    kinds: Sequence[str],
    interval_s: float,
    seed: int,
    duration_s: float,
    say: Callable[[str], None] = print,
) -> Nemesis:
    """``raftcoord chaos``: the nemesis for ``duration_s``, then the final heal."""
    nemesis = Nemesis(cluster, history, kinds, interval_s, seed, say)
    thread = threading.Thread(target=nemesis.run, name="nemesis", daemon=True)
    thread.start()
    with contextlib.suppress(KeyboardInterrupt):
        thread.join(duration_s)
    nemesis.stop()
    thread.join()
    nemesis.heal()
    return nemesis
