"""ACLs on a cluster with TLS: two client identities, each with rights on
its own prefix (PREFIXED bindings), and what the other may not do.

``alice`` holds every operation on the topics, transactional ids and groups
named ``alice-*``; ``bob`` the same on ``bob-*``. While alice's transaction
is open, bob tries to take over her transactional id, end or abort her
transaction, write to and read her topic, commit her group's offsets and
see her transactions; each attempt answers Kafka's AUTHORIZATION_FAILED
code within a second and changes nothing; alice is never fenced and her
transaction commits as she decided. bob works within his prefix, and only
there. Removing a binding takes his rights away on every node.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from raftcoord.cli.main import main
from raftcoord.client import Admin, Consumer, TopicPartition, TransactionalProducer
from raftcoord.client.errors import (
    ClusterAuthorizationFailedError,
    KafkaError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)
from raftcoord.cluster.launcher import LocalCluster
from raftcoord.protocol.acl import (
    CLUSTER_NAME,
    Acl,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.v1 import (
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    partition_log_pb2,
    partition_log_pb2_grpc,
)
from tests.local_cluster import running_cluster

pytestmark = pytest.mark.slow

#: A refusal is answered at once: far below any retry loop's deadline.
QUICK_S = 2.0


def owns_prefix(user: str) -> list[Acl]:
    return [
        Acl(
            kind,
            PatternType.PREFIXED,
            f"{user}-",
            f"User:{user}",
            "*",
            Operation.ALL,
            Permission.ALLOW,
        )
        for kind in (ResourceType.TOPIC, ResourceType.TRANSACTIONAL_ID, ResourceType.GROUP)
    ]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("acls")
    with running_cluster(
        root / "cluster",
        shards=2,
        partition_nodes=2,
        tls=True,
        settings={"transaction.two.phase.commit.enable": True},
    ) as running:
        with Admin(running.bootstrap(), **running.client_tls("admin")) as admin:
            admin.create_topics({"alice-orders": 2, "bob-data": 1})
            admin.create_acls(owns_prefix("alice") + owns_prefix("bob"))
        yield running


def coordinator_stub(cluster: LocalCluster, user: str, address: str) -> tuple[grpc.Channel, Any]:
    channel = cluster.channel(address, user)
    return channel, coordinator_pb2_grpc.TransactionCoordinatorStub(channel)


def quickly(call: Any, request: Any) -> Any:
    """``call``'s answer to ``request``, which must come within QUICK_S."""
    started = time.monotonic()
    result = call(request, timeout=10)
    assert time.monotonic() - started < QUICK_S
    return result


def produce_request(topic: str, partition: int, transactional_id: str | None) -> Any:
    batch = partition_log_pb2.RecordBatch(
        producer_id=-1, records=[partition_log_pb2.Record(value=b"forged")]
    )
    request = partition_log_pb2.ProduceRequest(
        partitions=[
            partition_log_pb2.PartitionProduceData(topic=topic, partition=partition, batch=batch)
        ]
    )
    if transactional_id is not None:
        request.transactional_id = transactional_id
    return request


def owner_of(cluster: LocalCluster, tp: TopicPartition) -> str:
    """The gRPC address of the partition node that owns ``tp``."""
    with cluster.channel(cluster.coordinators()[0].grpc) as channel:
        metadata = coordinator_pb2_grpc.TransactionCoordinatorStub(channel).Metadata(
            coordinator_pb2.MetadataRequest(topics=[tp.topic]), timeout=10
        )
    node = metadata.topics[0].partitions[tp.partition].node_id
    return {n.node_id: n.address for n in metadata.partition_nodes}[node]


def read_committed(cluster: LocalCluster, user: str, tp: TopicPartition) -> list[bytes | None]:
    with Consumer(
        cluster.bootstrap(), isolation_level="read_committed", **cluster.client_tls(user)
    ) as consumer:
        consumer.assign([tp])
        consumer.seek_to_beginning()
        values: list[bytes | None] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=500)
            values += [r.value for r in batch]
            if not batch and values:
                break
        return values


def test_bob_cannot_touch_alices_transaction_topics_or_groups(cluster: LocalCluster) -> None:
    alice_tp = TopicPartition("alice-orders", 0)
    with TransactionalProducer(
        cluster.bootstrap(), "alice-tx", **cluster.client_tls("alice")
    ) as alice:
        alice.init_transactions()
        alice.begin_transaction()
        alice.send(alice_tp.topic, b"alice-1", partition=alice_tp.partition)
        alice.flush()
        pid, epoch = alice.producer_id, alice.producer_epoch

        # bob takes over alice's transactional id: refused before any fencing.
        with TransactionalProducer(
            cluster.bootstrap(), "alice-tx", **cluster.client_tls("bob")
        ) as thief:
            started = time.monotonic()
            with pytest.raises(TransactionalIdAuthorizationFailedError):
                thief.init_transactions()
            assert time.monotonic() - started < QUICK_S

        for coordinator in cluster.coordinators():  # the leader, and the others that forward
            channel, stub = coordinator_stub(cluster, "bob", coordinator.grpc)
            with channel:
                init = quickly(
                    stub.InitProducerId,
                    coordinator_pb2.InitProducerIdRequest(
                        transactional_id="alice-tx", transaction_timeout_ms=60_000
                    ),
                )
                assert init.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                end = quickly(
                    stub.EndTxn,
                    coordinator_pb2.EndTxnRequest(
                        transactional_id="alice-tx",
                        producer_id=pid,
                        producer_epoch=epoch,
                        committed=False,
                    ),
                )
                assert end.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                add = stub.AddPartitionsToTxn(
                    coordinator_pb2.AddPartitionsToTxnRequest(
                        transactional_id="bob-tx",
                        producer_id=pid,
                        producer_epoch=epoch,
                        topics=[common_pb2.TopicPartitions(topic="alice-orders", partitions=[1])],
                    ),
                    timeout=10,
                )
                assert add.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
                commit = stub.OffsetCommit(
                    coordinator_pb2.OffsetCommitRequest(
                        group_id="alice-group",
                        topics=[
                            coordinator_pb2.OffsetCommitTopic(
                                topic="bob-data",
                                partitions=[
                                    coordinator_pb2.OffsetCommitPartition(partition=0, offset=7)
                                ],
                            )
                        ],
                    ),
                    timeout=10,
                )
                assert commit.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
                described = stub.DescribeTransactions(
                    coordinator_pb2.DescribeTransactionsRequest(transactional_ids=["alice-tx"]),
                    timeout=10,
                )
                assert (
                    described.transactions[0].error_code
                    == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                )
                listed = stub.ListTransactions(
                    coordinator_pb2.ListTransactionsRequest(duration_filter_ms=-1), timeout=10
                )
                assert all(t.transactional_id.startswith("bob-") for t in listed.transactions)

        # bob writes and reads alice's topic on its partition node directly.
        owner = owner_of(cluster, alice_tp)
        with cluster.channel(owner, "bob") as channel:
            plog = partition_log_pb2_grpc.PartitionLogStub(channel)
            for transactional_id in (None, "bob-tx"):
                produced = plog.Produce(
                    produce_request(alice_tp.topic, alice_tp.partition, transactional_id),
                    timeout=10,
                )
                assert produced.partitions[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
            produced = plog.Produce(
                produce_request(alice_tp.topic, alice_tp.partition, "alice-tx"), timeout=10
            )
            assert (
                produced.partitions[0].error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            )
            fetched = plog.Fetch(
                partition_log_pb2.FetchRequest(
                    partitions=[
                        partition_log_pb2.FetchPartition(
                            topic=alice_tp.topic, partition=alice_tp.partition, fetch_offset=0
                        )
                    ],
                    max_wait_ms=0,
                ),
                timeout=10,
            )
            assert fetched.partitions[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
            assert not fetched.partitions[0].records

        with Admin(cluster.bootstrap(), **cluster.client_tls("bob")) as admin:
            assert admin.list_topics() == {"bob-data": 1}
            with pytest.raises(ClusterAuthorizationFailedError):
                admin.create_acls(owns_prefix("mallory"))
            with pytest.raises(TopicAuthorizationFailedError):
                admin.create_topics({"alice-more": 1})

        alice.send_offsets_to_transaction({alice_tp: 1}, "alice-group")
        alice.commit_transaction()  # never fenced: her own decision stands
    assert read_committed(cluster, "alice", alice_tp) == [b"alice-1"]
    # Groups are listed to those who may describe them (Kafka's ListGroups).
    with Admin(cluster.bootstrap(), **cluster.client_tls("alice")) as admin:
        assert admin.list_consumer_groups().get("alice-group") == "Empty"
    with Admin(cluster.bootstrap(), **cluster.client_tls("bob")) as admin:
        assert "alice-group" not in admin.list_consumer_groups()
    with pytest.raises(KafkaError):
        read_committed(cluster, "bob", alice_tp)


def test_bob_gets_exactly_his_prefix_and_loses_it_when_the_binding_goes(
    cluster: LocalCluster,
) -> None:
    bob_tp = TopicPartition("bob-data", 0)
    with TransactionalProducer(cluster.bootstrap(), "bob-tx", **cluster.client_tls("bob")) as bob:
        bob.init_transactions()
        bob.begin_transaction()
        bob.send(bob_tp.topic, b"bob-1", partition=0)
        bob.commit_transaction()
    assert read_committed(cluster, "bob", bob_tp) == [b"bob-1"]
    with TransactionalProducer(
        cluster.bootstrap(), "bobby-tx", **cluster.client_tls("bob")
    ) as other:
        with pytest.raises(TransactionalIdAuthorizationFailedError):
            other.init_transactions()

    with Admin(cluster.bootstrap(), **cluster.client_tls("admin")) as admin:
        (removed,) = admin.delete_acls(
            [AclFilter(ResourceType.TOPIC, PatternType.PREFIXED, "bob-", "User:bob")]
        )
        assert [a.resource_name for a in removed] == ["bob-"]
        left = admin.describe_acls(AclFilter(principal="User:bob"))
        assert {a.resource_type for a in left} == {
            ResourceType.GROUP,
            ResourceType.TRANSACTIONAL_ID,
        }
    owner = owner_of(cluster, bob_tp)
    with cluster.channel(owner, "bob") as channel:
        plog = partition_log_pb2_grpc.PartitionLogStub(channel)
        deadline = time.monotonic() + 10
        while True:  # the partition node learns the change with its next refresh (~1 s)
            produced = plog.Produce(produce_request(bob_tp.topic, 0, None), timeout=10)
            code = produced.partitions[0].error_code
            if code == ErrorCode.TOPIC_AUTHORIZATION_FAILED or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert code == ErrorCode.TOPIC_AUTHORIZATION_FAILED


def test_two_phase_commit_needs_its_own_operation(cluster: LocalCluster) -> None:
    """KIP-939: a producer that asks for two-phase commit needs TWO_PHASE_COMMIT
    on its transactional id (ALL includes it); WRITE alone does not do."""
    tls = cluster.client_tls("bob")
    with TransactionalProducer(
        cluster.bootstrap(), "bob-2pc", enable_two_phase_commit=True, **tls
    ) as allowed:
        allowed.init_transactions()  # bob holds ALL on bob-*
    deny = Acl(
        ResourceType.TRANSACTIONAL_ID,
        PatternType.LITERAL,
        "bob-2pc-denied",
        "User:bob",
        "*",
        Operation.TWO_PHASE_COMMIT,
        Permission.DENY,
    )
    with Admin(cluster.bootstrap(), **cluster.client_tls("admin")) as admin:
        admin.create_acls([deny])
    refused = TransactionalProducer(
        cluster.bootstrap(), "bob-2pc-denied", enable_two_phase_commit=True, **tls
    )
    with refused, pytest.raises(TransactionalIdAuthorizationFailedError, match="TWO_PHASE_COMMIT"):
        refused.init_transactions()
    with TransactionalProducer(cluster.bootstrap(), "bob-2pc-denied", **tls) as plain:
        plain.init_transactions()  # without two-phase commit WRITE is enough


def test_the_acl_command_adds_lists_and_removes(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--cluster-dir", str(cluster.data_dir)]
    add = ["acl", "add", "--allow-principal", "User:carol", "--operation", "Read"]
    add += ["--operation", "Describe", "--group", "carol-", "--resource-pattern-type", "prefixed"]
    assert main([*add, *where]) == 0
    capsys.readouterr()
    assert main(["acl", "list", "--principal", "User:carol", "--json", *where]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(row["operation"] for row in listed) == ["DESCRIBE", "READ"]
    assert {row["pattern_type"] for row in listed} == {"PREFIXED"}
    # As carol (no rights on the cluster): refused, one line, status 1.
    carol = cluster.client_tls("carol")
    as_carol = ["--bootstrap-server", ",".join(cluster.bootstrap())]
    as_carol += ["--ssl-cafile", carol["ssl_cafile"], "--ssl-certfile", carol["ssl_certfile"]]
    as_carol += ["--ssl-keyfile", carol["ssl_keyfile"]]
    assert main(["acl", "list", *as_carol]) == 1
    assert "User:carol may not DESCRIBE CLUSTER" in capsys.readouterr().err
    remove = ["acl", "remove", "--group", "carol-", "--resource-pattern-type", "prefixed"]
    assert main([*remove, "--operation", "Read", "--json", *where]) == 0
    removed = json.loads(capsys.readouterr().out)
    assert [row["operation"] for row in removed] == ["READ"]
    assert main(["acl", "list", "--principal", "User:carol", "--json", *where]) == 0
    assert [row["operation"] for row in json.loads(capsys.readouterr().out)] == ["DESCRIBE"]


def test_no_client_gets_scram_keys_or_the_acls_through_a_forwarding_node(
    cluster: LocalCluster,
) -> None:
    """A certificate allowed to DESCRIBE the cluster sees users and their
    mechanisms, never their keys or the whole ACL list, even when a
    coordinator that does not lead shard 0 forwards its request (with the
    node's own certificate); a node's certificate gets both."""
    with Admin(cluster.bootstrap(), **cluster.client_tls("admin")) as admin:
        admin.upsert_scram_credential("erin", "SCRAM-SHA-256", "erin-secret")
        admin.create_acls(
            [
                Acl(
                    ResourceType.CLUSTER,
                    PatternType.LITERAL,
                    CLUSTER_NAME,
                    "User:dora",
                    "*",
                    Operation.DESCRIBE,
                    Permission.ALLOW,
                )
            ]
        )
    keys = coordinator_pb2.DescribeUserScramCredentialsRequest(users=["erin"], include_keys=True)
    acls = coordinator_pb2.MetadataRequest(include_acls=True, read_barrier=True)
    for coordinator in cluster.coordinators():
        for who, trusted in (("dora", False), ("node-1", True)):
            channel, stub = coordinator_stub(cluster, who, coordinator.grpc)
            with channel:
                (user,) = stub.DescribeUserScramCredentials(keys, timeout=10).results
                assert [c.mechanism for c in user.credentials] == ["SCRAM-SHA-256"]
                assert bool(user.credentials[0].stored_key) is trusted, (who, coordinator)
                answer = stub.Metadata(acls, timeout=10)
                assert answer.acls_included is trusted and bool(answer.acls) is trusted
