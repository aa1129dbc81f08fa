"""A cluster with TLS (``cluster up --tls``): mutual TLS on every gRPC
connection, and what only the cluster sends refused to anyone else.

The nodes present the certificates of ``node-<id>``; the test's clients
present ``client`` (an ordinary principal, ``User:client``) or ``admin`` (a
super user). A client may run transactions; it may not write markers, record
a partition node's directory or read a coordinator's NodeStatus: those answer
CLUSTER_AUTHORIZATION_FAILED (or PERMISSION_DENIED for NodeStatus) and change
nothing. A connection without a certificate of the cluster's CA gets no
answer at all.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftcoord.client import (
    AbortTransactionSpec,
    Admin,
    Consumer,
    TopicPartition,
    TransactionalProducer,
)
from raftcoord.client.errors import ClusterAuthorizationFailedError
from raftcoord.cluster import certs
from raftcoord.cluster.launcher import ClusterError, LocalCluster
from raftcoord.protocol.cluster_link import (
    ADD_PARTITIONS_TO_TXN,
    WRITE_TXN_MARKERS,
    ClusterLink,
    LinkError,
)
from raftcoord.protocol.config import load_config
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    data_files_pb2,
    data_files_pb2_grpc,
    partition_log_pb2,
    partition_log_pb2_grpc,
)
from tests.local_cluster import running_cluster

pytestmark = pytest.mark.slow

TP = TopicPartition("secured", 0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("tls")
    with running_cluster(root / "cluster", shards=1, partition_nodes=1, tls=True) as running:
        with Admin(running.bootstrap(), **running.client_tls()) as admin:
            admin.create_topics({TP.topic: 1})
        yield running


def read_committed(cluster: LocalCluster) -> list[bytes | None]:
    with Consumer(
        cluster.bootstrap(), isolation_level="read_committed", **cluster.client_tls()
    ) as consumer:
        consumer.assign([TP])
        return [r.value for r in consumer.poll(timeout_ms=2_000)]


def forged_commit(producer_id: int, epoch: int) -> partition_log_pb2.WriteTxnMarkersRequest:
    return partition_log_pb2.WriteTxnMarkersRequest(
        markers=[
            partition_log_pb2.TxnMarker(
                producer_id=producer_id,
                producer_epoch=epoch,
                coordinator_epoch=2**31 - 1,
                result=common_pb2.COMMIT,
                topics=[common_pb2.TopicPartitions(topic=TP.topic, partitions=[TP.partition])],
                groups=["victims"],
            )
        ]
    )


def forged_add(state: Any) -> coordinator_pb2.AddPartitionsToTxnRequest:
    """A partition node's batched add, for the victim's transaction."""
    return coordinator_pb2.AddPartitionsToTxnRequest(
        transactions=[
            coordinator_pb2.AddPartitionsToTxnRequest(
                transactional_id="victim",
                producer_id=state.producer_id,
                producer_epoch=state.producer_epoch,
                topics=[common_pb2.TopicPartitions(topic=TP.topic, partitions=[TP.partition])],
            )
        ]
    )


def test_a_client_cannot_forge_markers_and_the_owner_decides(cluster: LocalCluster) -> None:
    (node,) = cluster.partition_nodes()
    (leader,) = [r for r in cluster.coordinators() if r.node_id == cluster.leaders()[0]]
    with TransactionalProducer(cluster.bootstrap(), "victim", **cluster.client_tls()) as victim:
        victim.init_transactions()
        victim.begin_transaction()
        victim.send(TP.topic, b"aborted-by-its-owner", partition=TP.partition)
        victim.flush()
        with Admin(cluster.bootstrap(), **cluster.client_tls()) as admin:
            (state,) = admin.describe_producers([TP])[TP]
            spec = AbortTransactionSpec(TP, state.producer_id, state.producer_epoch, 0)
            with pytest.raises(ClusterAuthorizationFailedError):
                admin.abort_transaction(spec)
        forged = forged_commit(state.producer_id, state.producer_epoch + 1)
        with cluster.channel(node.grpc, "client") as channel:
            answer = partition_log_pb2_grpc.PartitionLogStub(channel).WriteTxnMarkers(
                forged, timeout=10
            )
        result = answer.markers[0].partitions[0]
        assert result.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        assert "User:client" in result.error_message
        with cluster.channel(leader.grpc, "client") as channel:
            answer = coordinator_pb2_grpc.TransactionCoordinatorStub(channel).WriteTxnMarkers(
                forged, timeout=10
            )
        assert answer.markers[0].groups[0].error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        # The replication address, where coordinators write markers, refuses too.
        files = cluster.client_tls()
        context = ssl.create_default_context(cafile=files["ssl_cafile"])
        context.load_cert_chain(files["ssl_certfile"], files["ssl_keyfile"])
        assert cluster.state is not None
        address = load_config(cluster.state.config).partition_node(node.node_id).replication
        assert address is not None
        link = ClusterLink(address, context)
        try:
            answer = link.call(WRITE_TXN_MARKERS, forged, 10)
            result = answer.markers[0].partitions[0]
            assert result.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            assert "User:client" in result.error_message
            with pytest.raises(LinkError):  # and the connection is closed
                link.call(WRITE_TXN_MARKERS, forged, 10)
        finally:
            link.close()
        # A coordinator's link address, where partition-log nodes add
        # partitions to transactions, refuses the client's add the same way.
        link_address = load_config(cluster.state.config).coordinator(leader.node_id).link
        assert link_address is not None
        link = ClusterLink(link_address, context)
        try:
            added = link.call(ADD_PARTITIONS_TO_TXN, forged_add(state), 10)
            assert added.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            assert "User:client" in added.error_message
            with pytest.raises(LinkError):
                link.call(ADD_PARTITIONS_TO_TXN, forged_add(state), 10)
        finally:
            link.close()
        assert read_committed(cluster) == []  # the forged COMMIT changed nothing
        victim.abort_transaction()
    assert read_committed(cluster) == []
    with TransactionalProducer(cluster.bootstrap(), "owner", **cluster.client_tls()) as owner:
        owner.init_transactions()
        owner.begin_transaction()
        owner.send(TP.topic, b"committed-by-its-owner", partition=TP.partition)
        owner.commit_transaction()
    assert read_committed(cluster) == [b"committed-by-its-owner"]


def test_only_the_cluster_records_directories_and_reads_node_status(
    cluster: LocalCluster,
) -> None:
    (node,) = cluster.partition_nodes()
    leader = cluster.coordinators()[0]
    request = coordinator_pb2.RegisterDirectoryRequest(
        node_id=node.node_id, directory_id="f" * 32, replace=True
    )
    with cluster.channel(leader.grpc, "client") as channel:
        answer = coordinator_pb2_grpc.TransactionCoordinatorStub(channel).RegisterDirectory(
            request, timeout=10
        )
        assert answer.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        with pytest.raises(grpc.RpcError) as refused:
            admin_pb2_grpc.CoordinatorAdminStub(channel).NodeStatus(
                admin_pb2.NodeStatusRequest(), timeout=10
            )
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "REFUSING" not in cluster.status_table()  # the node's directory is still its own
    with cluster.channel(leader.grpc, "admin") as channel:
        status = admin_pb2_grpc.CoordinatorAdminStub(channel).NodeStatus(
            admin_pb2.NodeStatusRequest(), timeout=10
        )
    assert status.node_id == leader.node_id


def test_a_connection_without_a_certificate_of_the_cluster_gets_no_answer(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    (node,) = cluster.partition_nodes()
    ca = Path(cluster.client_tls()["ssl_cafile"]).read_bytes()
    stranger_ca = certs.make_ca(tmp_path / "stranger")
    certs.issue(stranger_ca, tmp_path / "stranger", "mallory", "admin", [])
    stranger = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=(tmp_path / "stranger" / "mallory.key").read_bytes(),
        certificate_chain=(tmp_path / "stranger" / "mallory.pem").read_bytes(),
    )
    attempts = {
        "plaintext": grpc.insecure_channel(node.grpc),
        "TLS without a client certificate": grpc.secure_channel(
            node.grpc, grpc.ssl_channel_credentials(root_certificates=ca)
        ),
        "a certificate from another CA": grpc.secure_channel(node.grpc, stranger),
    }
    for what, channel in attempts.items():
        with channel, pytest.raises(grpc.RpcError) as refused:
            partition_log_pb2_grpc.PartitionLogStub(channel).ListOffsets(
                partition_log_pb2.ListOffsetsRequest(), timeout=5
            )
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE, what


def test_a_client_is_never_handed_a_nodes_certificate(cluster: LocalCluster) -> None:
    """The nodes' certificates are in the same directory as the clients':
    asked for one by a node's name, the launcher refuses instead of handing
    a client the node's own certificate."""
    node = cluster.coordinators()[0]
    name = f"node-{node.node_id}"
    assert Path(cluster.client_tls()["ssl_cafile"]).with_name(f"{name}.pem").is_file()
    with pytest.raises(ClusterError, match="is a node's name"):
        cluster.client_tls(name)


def test_a_node_cannot_forge_a_coordinator_epoch_no_leader_had(cluster: LocalCluster) -> None:
    """Even a coordinator's certificate cannot wedge a producer with a
    coordinator epoch above its shard's term: the partition and the group's
    coordinator refuse it (retriably: a new leader's term may not be known
    yet), and the owner's commit stands."""
    (node,) = cluster.partition_nodes()
    leader = cluster.coordinators()[0]
    with TransactionalProducer(cluster.bootstrap(), "wedged", **cluster.client_tls()) as victim:
        victim.init_transactions()
        victim.begin_transaction()
        victim.send(TP.topic, b"committed-despite-a-forged-epoch", partition=TP.partition)
        victim.flush()
        forged = forged_commit(victim.producer_id, victim.producer_epoch + 1)
        forged.markers[0].result = common_pb2.ABORT
        forged.markers[0].transactional_id = "wedged"
        del forged.markers[0].groups[:]
        as_node = f"node-{cluster.coordinators()[-1].node_id}"
        with cluster.channel(node.grpc, as_node) as channel:
            answer = partition_log_pb2_grpc.PartitionLogStub(channel).WriteTxnMarkers(
                forged, timeout=10
            )
        result = answer.markers[0].partitions[0]
        assert result.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert "above the shard's leader epoch" in result.error_message
        forged.markers[0].groups.append("victims")
        del forged.markers[0].topics[:]
        with cluster.channel(leader.grpc, as_node) as channel:
            answer = coordinator_pb2_grpc.TransactionCoordinatorStub(channel).WriteTxnMarkers(
                forged, timeout=10
            )
        assert answer.markers[0].groups[0].error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        victim.commit_transaction()
    assert b"committed-despite-a-forged-epoch" in read_committed(cluster)


def test_a_partition_nodes_certificate_writes_no_marker(cluster: LocalCluster) -> None:
    """Markers come from coordinators only: a partition node's certificate
    sending a COMMIT with the shard's real term and a transaction number far
    ahead, for an open transaction, is refused (CLUSTER_AUTHORIZATION_FAILED),
    over gRPC and over the partition node's cluster link alike; the
    transaction's data stays invisible, and the owner's abort stands."""
    (node,) = cluster.partition_nodes()
    status = cluster.node_status(cluster.coordinators()[0].node_id)
    assert status is not None
    term = max(shard.term for shard in status.shards)
    with TransactionalProducer(cluster.bootstrap(), "kept-out", **cluster.client_tls()) as victim:
        victim.init_transactions()
        victim.begin_transaction()
        victim.send(TP.topic, b"aborted-despite-a-forged-commit", partition=TP.partition)
        victim.flush()
        forged = forged_commit(victim.producer_id, victim.producer_epoch)
        forged.markers[0].coordinator_epoch = term
        forged.markers[0].txn_number = 2**62
        forged.markers[0].transactional_id = "kept-out"
        del forged.markers[0].groups[:]
        as_node = f"node-{node.node_id}"
        with cluster.channel(node.grpc, as_node) as channel:
            answer = partition_log_pb2_grpc.PartitionLogStub(channel).WriteTxnMarkers(
                forged, timeout=10
            )
        result = answer.markers[0].partitions[0]
        assert result.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED, result
        assert cluster.state is not None and cluster.state.tls is not None
        files = Path(cluster.state.tls)
        context = ssl.create_default_context(cafile=str(files / certs.CA_CERT))
        context.load_cert_chain(files / f"{as_node}.pem", files / f"{as_node}.key")
        replication = load_config(cluster.state.config).partition_node(node.node_id).replication
        assert replication is not None
        link = ClusterLink(replication, context)
        try:
            answer = link.call(WRITE_TXN_MARKERS, forged, 10)
        finally:
            link.close()
        assert answer.markers[0].partitions[0].error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        victim.abort_transaction()
    assert b"aborted-despite-a-forged-commit" not in read_committed(cluster)


def test_only_the_cluster_reads_a_nodes_data_files_and_only_those(cluster: LocalCluster) -> None:
    """The DataFiles RPC (the audit's network mode) serves a super user the
    bytes on disk of a partition node's segments and a coordinator's
    transitions logs, ranges included; an ordinary client is refused, and no
    name reaches anything else under or outside the data directory."""
    with TransactionalProducer(cluster.bootstrap(), "files", **cluster.client_tls()) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(TP.topic, b"on-disk", partition=TP.partition)
        producer.commit_transaction()
    # The commit is acknowledged before its marker is appended: read the
    # segment once a read_committed consumer sees the record, so that
    # nothing is appended to it while the test compares its bytes.
    cluster.wait_until(
        lambda: b"on-disk" in read_committed(cluster), 30, "the commit marker was not written"
    )
    (node,) = cluster.partition_nodes()
    coordinator = cluster.coordinators()[0]
    segment = f"{TP.topic}-{TP.partition}/{0:020d}.log"
    on_disk = cluster.data_dir / f"partition-node-{node.node_id}" / segment
    with cluster.channel(node.grpc, "admin") as channel:
        files = data_files_pb2_grpc.DataFilesStub(channel)
        listed = files.ListDataFiles(data_files_pb2.ListDataFilesRequest(), timeout=10)
        assert (listed.node_id, listed.kind) == (node.node_id, "partition-log")
        sizes = {f.name: f.size for f in listed.files}
        assert sizes[segment] > 0 and all(n.startswith(f"{TP.topic}-") for n in sizes)

        def read(name: str, offset: int = 0, length: int = 0) -> bytes:
            request = data_files_pb2.ReadDataFileRequest(name=name, offset=offset, length=length)
            return b"".join(c.data for c in files.ReadDataFile(request, timeout=10))

        data = on_disk.read_bytes()
        assert read(segment) == data and b"on-disk" in data
        assert read(segment, 5, 20) == data[5:25]
        assert read(segment, len(data) + 10) == b""
        (cluster.data_dir / "secret").write_text("not a data file")
        link = cluster.data_dir / f"partition-node-{node.node_id}" / "linked-0"
        link.symlink_to(on_disk.parent)
        try:
            names = [
                "../secret",
                f"{TP.topic}-{TP.partition}/../../secret",
                "/etc/passwd",
                "meta.properties",
                f"{segment}\x00",
                f"linked-0/{0:020d}.log",
                f"{TP.topic}-{TP.partition}/{1:020d}.log",
            ]
            for name in names:
                with pytest.raises(grpc.RpcError) as refused:
                    read(name)
                assert refused.value.code() is grpc.StatusCode.NOT_FOUND, name
            listed = files.ListDataFiles(data_files_pb2.ListDataFilesRequest(), timeout=10)
            assert not any(f.name.startswith("linked-") for f in listed.files)
        finally:
            link.unlink()
        with pytest.raises(grpc.RpcError) as refused:
            read(segment, -1)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    with cluster.channel(coordinator.grpc, "admin") as channel:
        listed = data_files_pb2_grpc.DataFilesStub(channel).ListDataFiles(
            data_files_pb2.ListDataFilesRequest(), timeout=10
        )
    assert (listed.node_id, listed.kind) == (coordinator.node_id, "coordinator")
    assert [f.name for f in listed.files] == ["shard-0/transitions.jsonl"]
    for address in (node.grpc, coordinator.grpc):
        with cluster.channel(address, "client") as channel:
            files = data_files_pb2_grpc.DataFilesStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                files.ListDataFiles(data_files_pb2.ListDataFilesRequest(), timeout=10)
            assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
            request = data_files_pb2.ReadDataFileRequest(name=segment)
            with pytest.raises(grpc.RpcError) as refused:
                b"".join(c.data for c in files.ReadDataFile(request, timeout=10))
            assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
