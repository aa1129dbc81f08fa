"""The narrow interface between the marker writer and the node around it.

The writer never touches the network, Raft or cluster metadata itself: the
node hands it a :class:`MarkerTransport` (gRPC and Raft in production, an
in-memory fake in tests) and a clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from marker_writer.model import Completion, Destination, MarkerRequest, MarkerResponse, Participant

#: Seconds on a monotonic clock (``time.monotonic`` in production).
Clock = Callable[[], float]


class TransportError(Exception):
    """A WriteTxnMarkers call failed as a whole (node down, timeout, bad
    answer): every marker in it is retried."""


class MarkerTransport(Protocol):
    """Where markers go, how they get there, and how a transaction completes.

    Methods are called from the writer's threads, never while it holds its
    lock; several ``send`` calls (to different destinations) may run at once.
    """

    def resolve(self, participant: Participant) -> Destination | None:
        """The node that takes ``participant``'s marker now, or None when it is
        unknown at the moment (no leader, metadata not there yet): the writer
        asks again later."""
        ...

    def send(
        self, destination: Destination, markers: Sequence[MarkerRequest]
    ) -> Sequence[MarkerResponse]:
        """One WriteTxnMarkers call carrying ``markers``; one response per
        marker, in order.

        Raises:
            TransportError: the call failed as a whole.
        """
        ...

    def complete(self, completions: Sequence[Completion]) -> Sequence[int]:
        """Propose MarkersWritten for each completion (through Raft) and wait;
        one error code per completion, in order: 0 = applied, NOT_COORDINATOR /
        COORDINATOR_LOAD_IN_PROGRESS = this writer's leadership is over,
        INVALID_TXN_STATE = the transaction moved on, REQUEST_TIMED_OUT = not
        known yet (ask again)."""
        ...
