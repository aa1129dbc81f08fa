"""Topics created through a cluster's Kafka gateways with confluent-kafka's
AdminClient; for test modules that skip without confluent-kafka (import this
after their ``pytest.importorskip``)."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from raftcoord.cluster.launcher import LocalCluster


def create_kafka_topics(
    cluster: LocalCluster, partitions: int, *topics: str, timeout_s: float = 30.0
) -> None:
    """Create ``topics`` of ``partitions`` partitions each (replication 1)
    through the cluster's Kafka bootstrap; raises the first one's error."""
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap()})
    futures = admin.create_topics(
        [NewTopic(t, partitions, 1) for t in topics], request_timeout=timeout_s
    )
    for future in futures.values():
        future.result(timeout=timeout_s)
