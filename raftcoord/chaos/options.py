"""What ``raftcoord workload`` runs: its options (light: the command line
builds the workload's arguments, and answers its ``--help``, without loading
the clients, gRPC or cryptography)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raftcoord.protocol.tls import SslFiles

__all__ = ["CLIENT_KINDS", "Options"]


def _no_tls() -> SslFiles:
    """A plaintext cluster's client files: none."""
    return {}


#: ``--client``: raftcoord's client library, or Kafka's client through the
#: Kafka gateways (:func:`raftcoord.chaos.workload.client_module`).
CLIENT_KINDS = ("raftcoord", "kafka")


@dataclass
class Options:
    """What ``raftcoord workload`` runs (its command line options)."""

    seed: int
    duration_s: float | None = 60.0
    transactions: int | None = None
    producers: int = 4
    #: Producers whose transactions are one side of a two-phase commit
    #: (KIP-939): prepared, then ended, after a crash by the next incarnation
    #: that keeps them. Needs raftcoord's client and the cluster setting
    #: transaction.two.phase.commit.enable.
    two_phase_producers: int = 0
    workers: int = 2
    pollers: int = 2
    abort_ratio: float = 0.2
    input_records: int = 10_000
    input_partitions: int = 4
    partitions: int = 6
    max_writes: int = 4
    records_per_transaction: int = 20
    nemesis: tuple[str, ...] = ()
    fault_interval_s: float = 10.0
    #: With a --duration: go on (up to twice as long) until every fault kind
    #: that can run here has happened at least once.
    every_fault: bool = False
    drain_timeout_s: float = 300.0
    #: The clients' request timeout, and the producers' delivery timeout: short
    #: enough that faults show up as failed operations, long enough to ride
    #: out an election.
    request_timeout_ms: int = 5_000
    #: Whose clients: raftcoord's over gRPC, or Kafka's (confluent-kafka)
    #: through the cluster's Kafka gateways.
    client_kind: str = "raftcoord"
    #: raftcoord's clients against a cluster with TLS: the files of the
    #: cluster's client certificate (``ssl_cafile``, ``ssl_certfile``,
    #: ``ssl_keyfile``); set from the cluster by :class:`Workload`.
    tls: SslFiles = field(default_factory=_no_tls)

    def client(self) -> dict[str, Any]:
        """Settings of every client the workload makes."""
        return {
            "request_timeout_ms": self.request_timeout_ms,
            "retry_backoff_max_ms": 500,
            **self.tls,
        }

    def producer(self) -> dict[str, Any]:
        """Settings of the producers: each send is sent at once."""
        return {**self.client(), "delivery_timeout_ms": self.request_timeout_ms, "linger_ms": 0}

    def check(self) -> None:
        """Raises ValueError naming the first bad option."""
        if (self.duration_s is None) == (self.transactions is None):
            raise ValueError("give exactly one of --duration and --transactions")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("--duration must be > 0")
        if self.transactions is not None and self.transactions < 1:
            raise ValueError("--transactions must be >= 1")
        for name in ("producers", "two_phase_producers", "workers", "pollers"):
            if not 0 <= getattr(self, name) <= 64:
                raise ValueError(f"--{name.replace('_', '-')} must be in 0..64")
        if self.transactions is not None and self.producers + self.two_phase_producers == 0:
            raise ValueError("--transactions needs at least one producer")
        if self.two_phase_producers and self.client_kind != "raftcoord":
            raise ValueError("--two-phase-producers needs raftcoord's client (--client raftcoord)")
        if not 0.0 <= self.abort_ratio <= 1.0:
            raise ValueError("--abort-ratio must be in 0..1")
        if self.workers > self.input_partitions:
            raise ValueError("--workers must be at most --input-partitions")
        if self.input_records < 0 or self.partitions < 1 or self.input_partitions < 1:
            raise ValueError("--input-records must be >= 0 and partition counts >= 1")
        if self.max_writes < 1 or self.records_per_transaction < 1:
            raise ValueError("--max-writes and --records-per-transaction must be >= 1")
        if self.request_timeout_ms < 100:
            raise ValueError("--request-timeout must be >= 100 ms")
        if self.fault_interval_s <= 0 or self.drain_timeout_s <= 0:
            raise ValueError("--fault-interval and --drain-timeout must be > 0")
        if self.client_kind not in CLIENT_KINDS:
            raise ValueError(f"--client must be one of {', '.join(CLIENT_KINDS)}")
