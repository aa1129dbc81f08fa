"""gRPC services of a coordinator node: TransactionCoordinator and CoordinatorAdmin.

gRPC takes one servicer per service of the proto: :class:`CoordinatorService`
is TransactionCoordinator's, and hands each RPC to the family that serves it:

=================  =====================================================
``common``         routing to the shard's leader, replicating, reading,
                   forwarding (:class:`~.common.ShardRouter`)
``transactions``   FindCoordinator, InitProducerId, AddPartitionsToTxn,
                   AddOffsetsToTxn, EndTxn
``groups``         TxnOffsetCommit, OffsetCommit, OffsetFetch,
                   WriteTxnMarkers (group markers); JoinGroup,
                   SyncGroup, Heartbeat, LeaveGroup, DescribeGroups,
                   ListGroups
``topics``         Metadata, CreateTopics, RegisterDirectory, ReserveOffsets,
                   NodeHeartbeat, AlterPartition
``admin``          DescribeTransactions, ListTransactions; CoordinatorAdmin
``acls``           CreateAcls, DescribeAcls, DeleteAcls
``users``          AlterUserScramCredentials, DescribeUserScramCredentials
=================  =====================================================
"""

from __future__ import annotations

from typing import Any

import grpc

from raftcoord.coordinator.controller import NodeLeases
from raftcoord.coordinator.markers import MarkerWriters
from raftcoord.coordinator.services.acls import AclRPCs
from raftcoord.coordinator.services.admin import AdminService, TransactionQueries
from raftcoord.coordinator.services.common import ShardRouter
from raftcoord.coordinator.services.groups import GroupRPCs
from raftcoord.coordinator.services.topics import TopicRPCs
from raftcoord.coordinator.services.transactions import TransactionRPCs
from raftcoord.coordinator.services.users import UserRPCs
from raftcoord.coordinator.shard import Shards
from raftcoord.protocol.config import ClusterConfig
from raftcoord.protocol.v1 import coordinator_pb2_grpc

__all__ = ["AdminService", "CoordinatorService"]


class CoordinatorService(coordinator_pb2_grpc.TransactionCoordinatorServicer):
    """The TransactionCoordinator servicer: every RPC is its family's."""

    def __init__(
        self,
        shards: Shards,
        config: ClusterConfig,
        node_id: int,
        markers: MarkerWriters,
        leases: NodeLeases,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.router = router = ShardRouter(shards, config, node_id, credentials)
        self.topics = TopicRPCs(router, leases)
        self.transactions = TransactionRPCs(router, self.topics)
        self.groups = GroupRPCs(router)
        self.queries = TransactionQueries(router, markers)
        self.acls = AclRPCs(router)
        self.users = UserRPCs(router)

    def close(self) -> None:
        """Release what the RPCs hold (the channels they forward on)."""
        self.router.close()

    # --- transactions ----------------------------------------------------------

    def FindCoordinator(self, request: Any, context: Any) -> Any:
        return self.transactions.FindCoordinator(request, context)

    def InitProducerId(self, request: Any, context: Any) -> Any:
        return self.transactions.InitProducerId(request, context)

    def AddPartitionsToTxn(self, request: Any, context: Any) -> Any:
        return self.transactions.AddPartitionsToTxn(request, context)

    def AddOffsetsToTxn(self, request: Any, context: Any) -> Any:
        return self.transactions.AddOffsetsToTxn(request, context)

    def EndTxn(self, request: Any, context: Any) -> Any:
        return self.transactions.EndTxn(request, context)

    # --- group offsets ---------------------------------------------------------

    def TxnOffsetCommit(self, request: Any, context: Any) -> Any:
        return self.groups.TxnOffsetCommit(request, context)

    def OffsetCommit(self, request: Any, context: Any) -> Any:
        return self.groups.OffsetCommit(request, context)

    def OffsetFetch(self, request: Any, context: Any) -> Any:
        return self.groups.OffsetFetch(request, context)

    def WriteTxnMarkers(self, request: Any, context: Any) -> Any:
        return self.groups.WriteTxnMarkers(request, context)

    # --- group membership ------------------------------------------------------

    def JoinGroup(self, request: Any, context: Any) -> Any:
        return self.groups.JoinGroup(request, context)

    def SyncGroup(self, request: Any, context: Any) -> Any:
        return self.groups.SyncGroup(request, context)

    def Heartbeat(self, request: Any, context: Any) -> Any:
        return self.groups.Heartbeat(request, context)

    def LeaveGroup(self, request: Any, context: Any) -> Any:
        return self.groups.LeaveGroup(request, context)

    def DescribeGroups(self, request: Any, context: Any) -> Any:
        return self.groups.DescribeGroups(request, context)

    def ListGroups(self, request: Any, context: Any) -> Any:
        return self.groups.ListGroups(request, context)

    # --- operator queries ------------------------------------------------------

    def DescribeTransactions(self, request: Any, context: Any) -> Any:
        return self.queries.DescribeTransactions(request, context)

    def ListTransactions(self, request: Any, context: Any) -> Any:
        return self.queries.ListTransactions(request, context)

    # --- cluster metadata ------------------------------------------------------

    def Metadata(self, request: Any, context: Any) -> Any:
        return self.topics.Metadata(request, context)

    def RegisterDirectory(self, request: Any, context: Any) -> Any:
        return self.topics.RegisterDirectory(request, context)

    def ReserveOffsets(self, request: Any, context: Any) -> Any:
        return self.topics.ReserveOffsets(request, context)

    def NodeHeartbeat(self, request: Any, context: Any) -> Any:
        return self.topics.NodeHeartbeat(request, context)

    def AlterPartition(self, request: Any, context: Any) -> Any:
        return self.topics.AlterPartition(request, context)

    def CreateTopics(self, request: Any, context: Any) -> Any:
        return self.topics.CreateTopics(request, context)

    # --- access control --------------------------------------------------------

    def CreateAcls(self, request: Any, context: Any) -> Any:
        return self.acls.CreateAcls(request, context)

    def DescribeAcls(self, request: Any, context: Any) -> Any:
        return self.acls.DescribeAcls(request, context)

    def DeleteAcls(self, request: Any, context: Any) -> Any:
        return self.acls.DeleteAcls(request, context)

    def AlterUserScramCredentials(self, request: Any, context: Any) -> Any:
        return self.users.AlterUserScramCredentials(request, context)

    def DescribeUserScramCredentials(self, request: Any, context: Any) -> Any:
        return self.users.DescribeUserScramCredentials(request, context)
