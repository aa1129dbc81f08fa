"""A coordinator node's Prometheus metrics (docs/metrics.md), read from its
shards, their state machines and its marker writers when scraped.

Every replica reports its shards: role, term, indexes and log are its own;
what comes from the replicated state (transactions and groups by state,
open transactions' ages, rebalances) is the same on every replica up to
replication lag, so dashboards take the leader's (``raftcoord_shard_role``
with ``role="leader"``) or the maximum. Timeouts and fenced producers are
counted by the replica that led when they applied, so summing over the
nodes gives the cluster's.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fsm import TransactionStateMachine, TxnState
from fsm.membership import GroupState
from fsm.metadata import NO_TIMESTAMP
from fsm.states import IDLE_STATES
from raftcoord.coordinator.markers import MarkerWriters
from raftcoord.coordinator.shard import Shard

#: The roles of ``raftcoord_shard_role`` (one is 1, the others 0).
ROLES = ("leader", "follower", "no_leader")


def _census(
    machine: TransactionStateMachine, now_ms: int
) -> tuple[Counter[str], list[float], list[float], Counter[str], int]:
    """Transactions by state, the ages (seconds) of the open ones, those of
    the Ongoing transactions of two-phase commit producers apart (they wait
    for an external transaction manager's decision and never time out),
    groups by state, and the sum of the groups' generations (each is one
    rebalance)."""
    states: Counter[str] = Counter()
    ages: list[float] = []
    two_phase: list[float] = []
    for txn in machine.state.transactions.values():
        states[txn.state.name] += 1
        if txn.state not in IDLE_STATES and txn.txn_start_ms != NO_TIMESTAMP:
            age = max(0.0, (now_ms - txn.txn_start_ms) / 1000)
            waiting = txn.two_phase and txn.state is TxnState.ONGOING
            (two_phase if waiting else ages).append(age)
    groups: Counter[str] = Counter()
    generations = 0
    for group in machine.state.memberships.values():
        groups[group.state.value] += 1
        generations += group.generation
    return states, ages, two_phase, groups, generations


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank); 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class ScrapedNode(Protocol):
    """What the collector reads of a coordinator node at each scrape."""

    @property
    def shards(self) -> Sequence[Shard]: ...

    @property
    def data_dir(self) -> Path: ...

    @property
    def markers(self) -> MarkerWriters: ...


class CoordinatorCollector(Collector):
    """Reads ``node``'s shards and marker writers at each scrape."""

    def __init__(self, node: ScrapedNode) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        labels = ["shard"]
        role = GaugeMetricFamily(
            "raftcoord_shard_role",
            "This replica's role in the shard (1 for its role)",
            labels=["shard", "role"],
        )
        term = GaugeMetricFamily(
            "raftcoord_shard_term", "The shard's Raft term here", labels=labels
        )
        changes = CounterMetricFamily(
            "raftcoord_shard_leader_changes",
            "Leaders this replica saw elected (a new term with a known leader)",
            labels=labels,
        )
        applied = GaugeMetricFamily(
            "raftcoord_shard_applied_index", "Index of the last entry applied here", labels=labels
        )
        committed = GaugeMetricFamily(
            "raftcoord_shard_commit_index", "Index of the last entry known committed", labels=labels
        )
        log_entries = GaugeMetricFamily(
            "raftcoord_shard_log_entries",
            "Entries in this replica's Raft log since its latest snapshot",
            labels=labels,
        )
        snapshot_age = GaugeMetricFamily(
            "raftcoord_shard_snapshot_age_seconds",
            "Age of this replica's latest snapshot (absent: none yet)",
            labels=labels,
        )
        parked = GaugeMetricFamily(
            "raftcoord_shard_parked_requests",
            "Requests waiting for their transactional id's transaction to complete",
            labels=labels,
        )
        transactions = GaugeMetricFamily(
            "raftcoord_transactions", "Transactional ids by state", labels=["shard", "state"]
        )
        oldest = GaugeMetricFamily(
            "raftcoord_transaction_open_age_max_seconds",
            "Age of the oldest open transaction (Ongoing or Prepare*; not two-phase ones)",
            labels=labels,
        )
        two_phase_open = GaugeMetricFamily(
            "raftcoord_two_phase_transactions_open",
            "Ongoing transactions of two-phase commit producers (KIP-939)",
            labels=labels,
        )
        two_phase_oldest = GaugeMetricFamily(
            "raftcoord_two_phase_transaction_open_age_max_seconds",
            "Age of the oldest Ongoing transaction of a two-phase commit producer",
            labels=labels,
        )
        p99 = GaugeMetricFamily(
            "raftcoord_transaction_open_age_p99_seconds",
            "99th percentile of the open transactions' ages",
            labels=labels,
        )
        timeouts = CounterMetricFamily(
            "raftcoord_transaction_timeouts",
            "Transactions aborted for their timeout while this replica led",
            labels=labels,
        )
        fenced = CounterMetricFamily(
            "raftcoord_producers_fenced",
            "Producers fenced by an epoch bump while this replica led",
            labels=labels,
        )
        groups = GaugeMetricFamily(
            "raftcoord_groups", "Consumer groups by state", labels=["shard", "state"]
        )
        rebalances = CounterMetricFamily(
            "raftcoord_group_rebalances",
            "Rebalances completed by the shard's groups (the sum of their generations)",
            labels=labels,
        )
        now = time.time()
        for shard in self.node.shards:
            name = str(shard.shard)
            replica = shard.replica
            if replica.is_leader():
                current = "leader"
            elif replica.leader_address() is not None:
                current = "follower"
            else:
                current = "no_leader"
            for r in ROLES:
                role.add_metric([name, r], 1.0 if r == current else 0.0)
            term.add_metric([name], float(replica.raftCurrentTerm))
            changes.add_metric([name], float(shard.leader_changes))
            applied.add_metric([name], float(replica.raftLastApplied))
            committed.add_metric([name], float(replica.raftCommitIndex))
            log_entries.add_metric([name], float(replica.log_entry_count()))
            snapshot = self.node.data_dir / f"shard-{shard.shard}" / "snapshot"
            try:
                snapshot_age.add_metric([name], max(0.0, now - os.stat(snapshot).st_mtime))
            except OSError:
                pass  # no snapshot yet
            parked.add_metric([name], float(shard.parked_count))
            states, ages, two_phase, group_states, generations = replica.query(
                lambda machine: _census(machine, int(now * 1000))
            )
            for state in TxnState:
                transactions.add_metric([name, state.name], float(states[state.name]))
            oldest.add_metric([name], max(ages, default=0.0))
            p99.add_metric([name], quantile(ages, 0.99))
            two_phase_open.add_metric([name], float(len(two_phase)))
            two_phase_oldest.add_metric([name], max(two_phase, default=0.0))
            timeouts.add_metric([name], float(shard.timeouts))
            fenced.add_metric([name], float(shard.fenced))
            for group_state in GroupState:
                groups.add_metric([name, group_state.value], float(group_states[group_state.value]))
            rebalances.add_metric([name], float(generations))
        yield from (role, term, changes, applied, committed, log_entries, snapshot_age, parked)
        yield from (transactions, oldest, p99, two_phase_open, two_phase_oldest)
        yield from (timeouts, fenced, groups, rebalances)
        yield from self._markers()

    def _markers(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "raftcoord_marker_queue_depth",
            "Markers owed to a destination (queued or in flight; 'retrying': waiting to retry)",
            labels=["shard", "destination"],
        )
        age = GaugeMetricFamily(
            "raftcoord_marker_oldest_pending_seconds",
            "Age of the oldest transaction with a marker owed to a destination",
            labels=["shard", "destination"],
        )
        pending = GaugeMetricFamily(
            "raftcoord_marker_pending_transactions",
            "Transactions whose markers this node's writer still owes",
            labels=["shard"],
        )
        writers: list[dict[str, Any]] = self.node.markers.metrics()
        for writer in writers:
            shard = str(writer["shard"])
            pending.add_metric([shard], float(writer["pending_transactions"]))
            for destination, (count, oldest) in writer["backlog"].items():
                depth.add_metric([shard, destination], float(count))
                age.add_metric([shard, destination], oldest)
        yield from (depth, age, pending)
