"""Marker writer: delivers COMMIT/ABORT markers to a transaction's participants.

When a transaction reaches PrepareCommit or PrepareAbort, the shard leader's
:class:`MarkerWriter` owes one marker to each participant: every data
partition (written to the partition-log node that owns it) and every
consumer group whose offsets the transaction committed (sent to the
coordinator leading the group's shard). It batches the markers of many
transactions into one WriteTxnMarkers call per destination, sorts every
answer into done / retry / fenced / unexpected (:mod:`marker_writer.errors`),
and once every participant of a transaction has acknowledged, proposes
MarkersWritten, which moves the transaction to CompleteCommit/CompleteAbort.

The package knows nothing of gRPC, Raft or the node: everything it needs
comes through :class:`MarkerTransport` and a clock.

Modules: ``model`` (participants, destinations, requests), ``transport``
(the interface), ``errors`` (answer classes), ``book`` (the
bookkeeping, no threads or clock) and ``writer`` (threads and logs). Its
retries wait :class:`raftcoord.protocol.backoff.Backoff` (re-exported here).
"""

from marker_writer.errors import (
    CompletionDisposition,
    MarkerDisposition,
    classify_completion,
    classify_marker_error,
)
from marker_writer.model import (
    Completion,
    ConsumerGroup,
    DataPartition,
    DeliveryProblem,
    Destination,
    DestinationKind,
    MarkerRequest,
    MarkerResponse,
    Participant,
    TxnKey,
)
from marker_writer.transport import Clock, MarkerTransport, TransportError
from marker_writer.writer import MarkerWriter
from raftcoord.protocol.backoff import Backoff

__all__ = [
    "Backoff",
    "Clock",
    "Completion",
    "CompletionDisposition",
    "ConsumerGroup",
    "DataPartition",
    "DeliveryProblem",
    "Destination",
    "DestinationKind",
    "MarkerDisposition",
    "MarkerRequest",
    "MarkerResponse",
    "MarkerTransport",
    "MarkerWriter",
    "Participant",
    "TransportError",
    "TxnKey",
    "classify_completion",
    "classify_marker_error",
]
