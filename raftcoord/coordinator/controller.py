"""The controller's duties of shard 0's leader toward the partition-log nodes:
their leases (KRaft's broker heartbeats and fencing) and the partitions'
preferred leaders (docs/replication.md).

A node holds a lease while it heartbeats (NodeHeartbeat, every
``broker.heartbeat.interval.ms``). The leases live in the leader's memory
only: a heartbeat writes nothing to the Raft log. When a node has not been
heard from for ``broker.session.timeout.ms``, the leader proposes
:class:`fsm.FenceNode`: the node leaves every ISR and leads nothing (the
rules are :mod:`fsm.partitions`). Its next heartbeat proposes
:class:`fsm.UnfenceNode`. A new leader of shard 0 gives every node a full
lease from the moment it became leader, since it has heard nothing yet.

Every ``leader.imbalance.check.interval.seconds`` (the first check one
interval after it became leader), the leader looks for partition-log nodes
that lead too few of the partitions that prefer them (their first replica;
above ``leader.imbalance.per.broker.percentage``) and could lead them again
(in sync, not fenced), and proposes :class:`fsm.ElectPreferredLeaders` for
them (:class:`PreferredLeaders`), as Kafka's controller does with
``auto.leader.rebalance.enable``: a node back after a failure takes its
partitions back after a while, not at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from fsm import ElectPreferredLeaders, FenceNode
from fsm.partitions import imbalanced_nodes
from raftcoord.coordinator.leader import Unstamped
from raftcoord.coordinator.shard import Shard

log = logging.getLogger("raftcoord.coordinator")

#: How often the controller looks for expired leases.
CHECK_INTERVAL_S = 0.1


class NodeLeases:
    """The partition-log nodes' leases as shard 0's leader counts them."""

    def __init__(
        self,
        shard: Shard,
        node_ids: Sequence[int],
        session_timeout_ms: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._shard = shard
        self._nodes = tuple(node_ids)
        self._timeout_s = session_timeout_ms / 1000.0
        self._clock = clock
        self._lock = threading.Lock()
        #: Node id -> when it was last heard from, in the leadership of
        #: ``_term`` (None: not leading).
        self._heard: dict[int, float] = {}
        self._term: int | None = None
        #: Nodes whose FenceNode is in flight: no second one until it is answered.
        self._fencing: set[int] = set()

    def heard(self, node_id: int) -> None:
        """``node_id`` heartbeated now."""
        with self._lock:
            self._heard[node_id] = self._clock()

    def expired(self) -> list[int]:
        """The nodes whose lease ran out in this leadership of shard 0 (none
        when this node does not lead it)."""
        shard = self._shard
        now = self._clock()
        with self._lock:
            if not (shard.is_leader and shard.ready):
                self._term = None
                return []
            if shard.leader_term != self._term:  # a new leadership: every lease starts now
                self._term = shard.leader_term
                self._heard = dict.fromkeys(self._nodes, now)
            return [n for n in self._nodes if now - self._heard.get(n, now) > self._timeout_s]

    def check(self) -> None:
        """Propose FenceNode for every node whose lease expired and that is
        not fenced already."""
        expired = self.expired()
        if not expired:
            return
        fenced = self._shard.replica.query(lambda machine: machine.state.fenced_nodes)
        for node_id in expired:
            with self._lock:
                heard = self._heard.get(node_id)
                lapsed = heard is not None and self._clock() - heard > self._timeout_s
                if not lapsed or node_id in fenced or node_id in self._fencing:
                    continue  # heard from since, fenced, or being fenced
                self._fencing.add(node_id)
            log.warning(
                "node=%d event=partition_node_fenced partition_node=%d: no heartbeat for "
                "%.1f s; it leaves every ISR and leads nothing until it heartbeats again",
                self._shard.node_id,
                node_id,
                self._timeout_s,
            )
            future = self._shard.submit(fence_node(node_id), parkable=False)
            future.add_done_callback(self._answered(node_id))

    def _answered(self, node_id: int) -> Callable[[Future[Any]], None]:
        """What runs once the FenceNode of ``node_id`` is answered."""

        def answered(_future: Future[Any]) -> None:
            with self._lock:
                self._fencing.discard(node_id)

        return answered


class PreferredLeaders:
    """Shard 0's leader's preferred-leader balancing of the partitions."""

    def __init__(
        self,
        shard: Shard,
        interval_s: float,
        percentage: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._shard = shard
        self._interval_s = interval_s
        self._percentage = percentage
        self._clock = clock
        #: When the next check is due (None: not leading shard 0).
        self._due: float | None = None

    def check(self) -> list[int]:
        """When a check is due, propose ElectPreferredLeaders for the nodes
        that are imbalanced; returns them."""
        shard = self._shard
        if not (shard.is_leader and shard.ready):
            self._due = None
            return []
        now = self._clock()
        if self._due is None:
            self._due = now + self._interval_s
        if now < self._due:
            return []
        self._due = now + self._interval_s
        percentage = self._percentage
        nodes = shard.replica.query(
            lambda machine: imbalanced_nodes(
                machine.state.topics.values(), machine.state.fenced_nodes, percentage
            )
        )
        if nodes:
            log.info(
                "node=%d event=preferred_leaders_elected partition_nodes=%s: they led too few "
                "of the partitions that prefer them",
                shard.node_id,
                ",".join(map(str, nodes)),
            )
            chosen = tuple(nodes)
            shard.submit(lambda stamp: ElectPreferredLeaders(chosen, stamp.now_ms), parkable=False)
        return nodes


def run_controller(
    duties: Sequence[Callable[[], object]], node_id: int, stopping: threading.Event
) -> None:
    """Run every duty each :data:`CHECK_INTERVAL_S` until ``stopping`` is set."""
    while not stopping.wait(CHECK_INTERVAL_S):
        for duty in duties:
            try:
                duty()
            except Exception:  # the next round tries again; the thread must live
                log.exception("node=%d event=controller_check_failed", node_id)


def fence_node(node_id: int) -> Unstamped:
    """The FenceNode of ``node_id``, as the leader stamps it."""
    return lambda stamp: FenceNode(node_id, stamp.now_ms)
