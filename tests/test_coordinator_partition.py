"""Coordinators across a real network partition (each node in its own network
namespace, raftcoord.cluster.netns): pre-vote and check-quorum.

* A coordinator cut off from the others asks for pre-votes in vain and, once
  healed, follows the leaders it left: no shard's term rises and no
  leadership moves (without pre-vote it campaigned, raising the term and
  deposing working leaders).
* A leader cut off from the others steps down within a few election
  timeouts (check-quorum) while the others elect a new one; after the heal
  it follows, and the preferred leaders are elected again by leadership
  transfer (TimeoutNow skips the pre-vote).

One cluster of 3 coordinators and 2 shards, so that the third coordinator
leads no shard.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftcoord.cluster import netns
from raftcoord.cluster.launcher import LocalCluster
from tests.local_cluster import commit_offsets, running_cluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        netns.unavailable() is not None,
        reason=f"network namespaces cannot be created here: {netns.unavailable()}",
    ),
]

SHARDS = 2
#: raft.election.timeout.ms of the cluster (the default).
ELECTION_TIMEOUT_S = (0.3, 0.6)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    path: Path = tmp_path_factory.mktemp("partition") / "c"
    with running_cluster(path, shards=SHARDS, partition_nodes=1, netns=True) as running:
        yield running


def shard_views(cluster: LocalCluster) -> dict[int, dict[int, Any]]:
    """node id -> shard -> that replica's status, for the coordinators that answer."""
    views: dict[int, dict[int, Any]] = {}
    for record in cluster.coordinators():
        status = cluster.node_status(record.node_id)
        if status is not None:
            views[record.node_id] = {s.shard: s for s in status.shards}
    return views


def settled(cluster: LocalCluster) -> dict[int, tuple[int, int]]:
    """shard -> (term, leader's node id), once every coordinator agrees on both."""
    found: dict[int, tuple[int, int]] = {}

    def agreed() -> bool:
        views = shard_views(cluster)
        if len(views) != len(cluster.coordinators()):
            return False
        found.clear()
        for shard in range(SHARDS):
            seen = {(v[shard].term, v[shard].leader_node_id) for v in views.values()}
            leaders = [n for n, v in views.items() if v[shard].is_leader]
            if len(seen) != 1 or len(leaders) != 1 or next(iter(seen))[1] != leaders[0]:
                return False
            found[shard] = next(iter(seen))
        return True

    cluster.wait_until(agreed, 60, "the coordinators do not agree on each shard's term and leader")
    return found


def test_a_coordinator_cut_off_and_healed_raises_no_term(cluster: LocalCluster) -> None:
    before = settled(cluster)
    leaders = {leader for _term, leader in before.values()}
    (isolated,) = [r.node_id for r in cluster.coordinators() if r.node_id not in leaders]
    others = [r.node_id for r in cluster.coordinators() if r.node_id != isolated]
    netns.partition(cluster, [[isolated], others])
    try:
        commit_offsets(cluster, "while-cut")  # the majority goes on without it
        views = shard_views(cluster)
        applied = {s: views[before[s][1]][s].applied_index for s in range(SHARDS)}
        # The condition is the time itself: several of the cut-off node's
        # election timeouts pass, each a pre-vote nobody answers.
        time.sleep(8 * ELECTION_TIMEOUT_S[1])
        cut_off = shard_views(cluster)[isolated]
        assert {s: cut_off[s].term for s in range(SHARDS)} == {
            s: term for s, (term, _leader) in before.items()
        }
    finally:
        netns.heal(cluster)

    def caught_up() -> bool:
        view = shard_views(cluster).get(isolated)
        return view is not None and all(view[s].applied_index >= applied[s] for s in applied)

    cluster.wait_until(caught_up, 60, "the healed coordinator did not hear its leaders again")
    assert settled(cluster) == before


def test_a_leader_cut_off_steps_down_and_the_others_elect_one(cluster: LocalCluster) -> None:
    before = settled(cluster)
    term, old = before[0]
    assert before[1][1] != old  # the preferred leaders: one shard each
    others = [r.node_id for r in cluster.coordinators() if r.node_id != old]
    netns.partition(cluster, [[old], others])
    try:
        cut_at = time.monotonic()

        def stepped_down() -> bool:
            view = shard_views(cluster).get(old)
            return view is not None and not view[0].is_leader

        cluster.wait_until(stepped_down, 30, "the cut-off leader still leads shard 0")
        print(f"the cut-off leader stepped down after {time.monotonic() - cut_at:.2f} s")

        def elected() -> bool:
            views = shard_views(cluster)
            return any(n in views and views[n][0].is_leader for n in others)

        cluster.wait_until(elected, 30, "the majority elected no leader of shard 0")
        commit_offsets(cluster, "after-cut")
        time.sleep(4 * ELECTION_TIMEOUT_S[1])  # its pre-votes, unanswered, change nothing
        assert shard_views(cluster)[old][0].term == term
    finally:
        netns.heal(cluster)
    after = settled(cluster)
    assert after[0][0] > term and after[0][1] != old
    assert after[1] == before[1]  # led on the majority's side all along
    # Preferred leaders again, by leadership transfer: the followers have
    # just heard from their leader, and a TimeoutNow skips the pre-vote.
    assert cluster.elect_preferred_leaders(timeout_s=30) == cluster.preferred_leaders()
    assert settled(cluster)[0][1] == old
