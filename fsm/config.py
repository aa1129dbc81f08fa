"""Settings the state machine checks. Every replica of a shard must use the same."""

from __future__ import annotations

from dataclasses import dataclass

from raftcoord.protocol.limits import KAFKA_MAX_PRODUCER_EPOCH


@dataclass(frozen=True)
class FsmConfig:
    """Coordinator settings the pure core needs (Kafka names in the field docs).

    ``max_producer_epoch``: the largest epoch; an epoch at ``max - 1`` or above
    is exhausted: it is never handed out to a producer nor accepted from one,
    and the producer id rotates before a bump would reach it (tests lower it
    to reach exhaustion quickly). ``transaction_max_timeout_ms``:
    transaction.max.timeout.ms. ``transactional_id_expiration_ms``:
    transactional.id.expiration.ms. ``max_partitions_per_request``: bound on
    the partitions (or offsets) one request may carry.
    ``group_min_session_timeout_ms`` / ``group_max_session_timeout_ms``:
    group.min.session.timeout.ms / group.max.session.timeout.ms.
    ``group_initial_rebalance_delay_ms``: group.initial.rebalance.delay.ms.
    """

    max_producer_epoch: int = KAFKA_MAX_PRODUCER_EPOCH
    transaction_max_timeout_ms: int = 900_000
    transactional_id_expiration_ms: int = 604_800_000
    max_partitions_per_request: int = 10_000
    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 1_800_000
    group_initial_rebalance_delay_ms: int = 3_000

    def __post_init__(self) -> None:
        if self.max_producer_epoch < 2:
            raise ValueError("max_producer_epoch must be at least 2")
        if self.transaction_max_timeout_ms < 1 or self.transactional_id_expiration_ms < 1:
            raise ValueError("timeouts must be positive")
        if not 1 <= self.group_min_session_timeout_ms <= self.group_max_session_timeout_ms:
            raise ValueError("group session timeouts need 1 <= min <= max")
        if self.group_initial_rebalance_delay_ms < 0:
            raise ValueError("group.initial.rebalance.delay.ms must not be negative")
        if self.max_partitions_per_request < 1:
            raise ValueError("max_partitions_per_request must be positive")

    def epoch_exhausted(self, epoch: int) -> bool:
        """Whether a producer at ``epoch`` can no longer start a transaction
        and still have a larger epoch left for its markers."""
        return epoch >= self.max_producer_epoch - 1

    def bump_exhausts(self, epoch: int) -> bool:
        """Whether bumping ``epoch`` reaches an exhausted epoch, so that the
        producer must move to a new producer id (epoch 0) instead."""
        return self.epoch_exhausted(epoch + 1)
