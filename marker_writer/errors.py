"""What the writer does with each answer: every error code falls in one class.

For a participant's marker (Kafka's TransactionMarkerRequestCompletionHandler
makes the same split):

* DONE: written (or already written); the participant is off the list.
* RETRY: expected and transient (node down, leader moving, metadata lagging);
  sent again after a backoff.
* FENCED: a newer coordinator (TRANSACTION_COORDINATOR_FENCED) or a newer
  producer epoch (the transaction is over) owns the transaction; this writer
  drops every marker of it and never completes it.
* UNEXPECTED: a code this exchange should not produce, or one this version
  does not know: logged at WARNING and retried, never silently dropped.

For a completion (the MarkersWritten proposal): DONE, RETRY (the outcome is
not known yet), LEADERSHIP_LOST (stop: the next leader resends from its own
state), STALE (the transaction is no longer in this Prepare* state: forget
it) and UNEXPECTED (WARNING, retried).
"""

from __future__ import annotations

from enum import Enum

from raftcoord.protocol.errors import ErrorCode


class MarkerDisposition(Enum):
    DONE = "done"
    RETRY = "retry"
    FENCED = "fenced"
    UNEXPECTED = "unexpected"


class CompletionDisposition(Enum):
    DONE = "done"
    RETRY = "retry"
    LEADERSHIP_LOST = "leadership_lost"
    STALE = "stale"
    UNEXPECTED = "unexpected"


RETRIABLE_MARKER_ERRORS = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.REQUEST_TIMED_OUT,
        # The destination's metadata may lag behind the topic's creation.
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        # The partition's node could not write (it stops and recovers, or the
        # partition is damaged and waits for an operator): the marker is owed.
        ErrorCode.KAFKA_STORAGE_ERROR,
    }
)

FENCING_MARKER_ERRORS = frozenset(
    {
        ErrorCode.TRANSACTION_COORDINATOR_FENCED,
        ErrorCode.INVALID_PRODUCER_EPOCH,
        ErrorCode.PRODUCER_FENCED,
    }
)

_COMPLETION: dict[int, CompletionDisposition] = {
    ErrorCode.NONE: CompletionDisposition.DONE,
    ErrorCode.REQUEST_TIMED_OUT: CompletionDisposition.RETRY,
    ErrorCode.NOT_COORDINATOR: CompletionDisposition.LEADERSHIP_LOST,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS: CompletionDisposition.LEADERSHIP_LOST,
    ErrorCode.COORDINATOR_NOT_AVAILABLE: CompletionDisposition.LEADERSHIP_LOST,
    ErrorCode.INVALID_TXN_STATE: CompletionDisposition.STALE,
}


def classify_marker_error(code: int) -> MarkerDisposition:
    """The class of one participant's answer (unknown numbers included)."""
    if code == ErrorCode.NONE:
        return MarkerDisposition.DONE
    if code in RETRIABLE_MARKER_ERRORS:
        return MarkerDisposition.RETRY
    if code in FENCING_MARKER_ERRORS:
        return MarkerDisposition.FENCED
    return MarkerDisposition.UNEXPECTED


def classify_completion(code: int) -> CompletionDisposition:
    """The class of one MarkersWritten proposal's answer."""
    return _COMPLETION.get(code, CompletionDisposition.UNEXPECTED)


def code_name(code: int) -> str:
    """``NAME(number)`` for logs; unknown numbers show as ``UNKNOWN(number)``."""
    try:
        return f"{ErrorCode(code).name}({code})"
    except ValueError:
        return f"UNKNOWN({code})"
