"""The Kafka gateway on a cluster with TLS: its clients are User:ANONYMOUS
(a plaintext listener), and they get exactly what ACLs grant that
principal. confluent-kafka's AdminClient creates, describes and deletes
ACLs through the gateway once ANONYMOUS may ALTER and DESCRIBE the cluster;
a producer writes to the topics the ACLs let it and no other."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
)
from confluent_kafka.admin import ResourceType as KafkaResourceType  # type: ignore[attr-defined]

from raftcoord.client import Admin
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.acl import (
    CLUSTER_NAME,
    Acl,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from tests.local_cluster import running_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    path = tmp_path_factory.mktemp("kafka-acls")
    with running_cluster(path, shards=2, partition_nodes=1, kafka_listeners=1, tls=True) as running:
        with Admin(running.bootstrap(), **running.client_tls("admin")) as admin:
            admin.create_topics({"open": 1, "closed": 1})
        yield running


def test_an_anonymous_kafka_client_gets_what_the_acls_grant(cluster: LocalCluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap()})
    binding = AclBinding(
        KafkaResourceType.TOPIC,
        "open",
        ResourcePatternType.LITERAL,
        "User:ANONYMOUS",
        "*",
        AclOperation.WRITE,
        AclPermissionType.ALLOW,
    )
    # Without rights on the cluster, creating ACLs is refused.
    with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED"):
        admin.create_acls([binding], request_timeout=TIMEOUT_S)[binding].result(timeout=TIMEOUT_S)

    with Admin(cluster.bootstrap(), **cluster.client_tls("admin")) as raft_admin:
        raft_admin.create_acls(
            [
                Acl(
                    ResourceType.CLUSTER,
                    PatternType.LITERAL,
                    CLUSTER_NAME,
                    "User:ANONYMOUS",
                    "*",
                    operation,
                    Permission.ALLOW,
                )
                for operation in (Operation.ALTER, Operation.IDEMPOTENT_WRITE)
            ]
        )
    admin.create_acls([binding], request_timeout=TIMEOUT_S)[binding].result(timeout=TIMEOUT_S)
    anonymous = AclBindingFilter(
        KafkaResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        "User:ANONYMOUS",
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    described = admin.describe_acls(anonymous, request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S)
    assert binding in described  # ALTER implies DESCRIBE on the cluster

    producer = Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap(), "enable.idempotence": True}
    )
    delivered: dict[str, str | None] = {}

    def report(topic: str) -> object:
        def on_delivery(error: object, _message: object) -> None:
            delivered[topic] = None if error is None else str(error)

        return on_delivery

    for topic in ("open", "closed"):
        producer.produce(topic, b"value", partition=0, on_delivery=report(topic))
    producer.flush(TIMEOUT_S)
    assert delivered["open"] is None
    assert delivered["closed"] is not None and "TOPIC_AUTHORIZATION_FAILED" in delivered["closed"]

    topic_acls = AclBindingFilter(
        KafkaResourceType.TOPIC,
        "open",
        ResourcePatternType.LITERAL,
        None,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    (deleted,) = admin.delete_acls([topic_acls], request_timeout=TIMEOUT_S).values()
    assert deleted.result(timeout=TIMEOUT_S) == [binding]
