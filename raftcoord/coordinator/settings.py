"""What the coordinator builds from the cluster's settings."""

from __future__ import annotations

from fsm import FsmConfig
from raftcoord.protocol.config import Settings


def fsm_config(settings: Settings) -> FsmConfig:
    """The state machine's config: every replica of a shard builds the same."""
    return FsmConfig(
        max_producer_epoch=settings.max_producer_epoch,
        transaction_max_timeout_ms=settings.transaction_max_timeout_ms,
        transactional_id_expiration_ms=settings.transactional_id_expiration_ms,
        group_min_session_timeout_ms=settings.group_min_session_timeout_ms,
        group_max_session_timeout_ms=settings.group_max_session_timeout_ms,
        group_initial_rebalance_delay_ms=settings.group_initial_rebalance_delay_ms,
    )
