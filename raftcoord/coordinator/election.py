"""Pre-vote and check-quorum (section 9.6 of the Raft thesis): the decisions, pure.

:class:`raftcoord.coordinator.raft.RaftGroup` keeps the clocks and the
messages; this module says what they mean, with times in seconds of one
monotonic clock.

* **Pre-vote.** A member whose election timeout passes does not raise its
  term at once: it asks the others whether they would vote for it at its
  term + 1 (:class:`PreVoteRound`), and campaigns only once a majority of
  the members (itself included) said yes. A member says yes
  (:func:`grants_pre_vote`) only if that term is above its own, the
  candidate's log is at least as up to date as its own, and it has not heard
  from a live leader within the minimum election timeout. A pre-vote changes
  nobody's term: a member cut off from the others asks in vain, again and
  again, and comes back with the term it left with, so it does not depose
  the leader that went on without it.
* **Check-quorum.** A leader that has not heard from a majority (itself
  included) within an election timeout steps down (:func:`quorum_heard`):
  cut off from the others it stops acting as leader, as they elect another.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["PreVoteRound", "grants_pre_vote", "log_up_to_date", "majority", "quorum_heard"]


def majority(count: int, members: int) -> bool:
    """Whether ``count`` of a group of ``members`` is a majority."""
    return 2 * count > members


def log_up_to_date(last_term: int, last_index: int, own_term: int, own_index: int) -> bool:
    """Raft's vote rule: whether a log ending at (``last_term``,
    ``last_index``) is at least as up to date as one ending at (``own_term``,
    ``own_index``): a later last term, or the same one and at least as long."""
    return (last_term, last_index) >= (own_term, own_index)


def grants_pre_vote(
    *,
    proposed_term: int,
    current_term: int,
    candidate_log: tuple[int, int],
    own_log: tuple[int, int],
    leader_heard_s: float | None,
    min_timeout_s: float,
) -> bool:
    """Whether a member at ``current_term`` would vote for a candidate at
    ``proposed_term`` whose log ends at ``candidate_log`` (last term, last
    index), its own ending at ``own_log``. ``leader_heard_s`` is how long
    ago it last heard from the leader it follows (0 on the leader itself),
    None when it knows no leader."""
    if proposed_term <= current_term:
        return False  # it would not vote in that term again (the answer tells the term)
    if leader_heard_s is not None and leader_heard_s < min_timeout_s:
        return False  # the leader is alive
    return log_up_to_date(*candidate_log, *own_log)


@dataclass
class PreVoteRound:
    """One member's pre-vote for ``term`` (its own term + 1) among ``members``."""

    term: int
    members: int
    granted: set[str] = field(default_factory=set)

    def grant(self, address: str) -> None:
        """The member at ``address`` (the candidate's own included) said yes."""
        self.granted.add(address)

    @property
    def won(self) -> bool:
        return majority(len(self.granted), self.members)


def quorum_heard(
    now: float,
    heard_at: Mapping[str, float],
    counted: Iterable[str],
    members: int,
    since: float,
    timeout_s: float,
) -> bool:
    """Whether a leader has heard from a majority of its ``members`` (itself
    included) within ``timeout_s`` of ``now``: ``heard_at`` holds when each
    other member last answered, ``counted`` the other members whose answers
    count (learners' do not), and a member not heard from since the
    leadership began (``since``) counts from then."""
    fresh = 1 + sum(1 for address in counted if now - heard_at.get(address, since) <= timeout_s)
    return majority(fresh, members)
