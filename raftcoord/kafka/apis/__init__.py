"""The handlers of the Kafka APIs a gateway serves, one module per family:

================  ======================================================
``common``        what the families share: :data:`~.common.Handler`,
                  which gateway fronts which node (:class:`~.common.Gateways`)
``brokers``       ApiVersions, Metadata, FindCoordinator
``transactions``  InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn
``groups``        TxnOffsetCommit, OffsetCommit, OffsetFetch, JoinGroup,
                  SyncGroup, Heartbeat, LeaveGroup, DescribeGroups
``admin``         CreateTopics, DescribeTransactions, ListTransactions
``acls``          CreateAcls, DescribeAcls, DeleteAcls
``partitions``    Produce, Fetch, ListOffsets
================  ======================================================

SaslHandshake and SaslAuthenticate are the connection's own
(:mod:`raftcoord.kafka.connections`).
"""

from __future__ import annotations

from raftcoord.kafka.apis.acls import AclAPIs
from raftcoord.kafka.apis.admin import AdminAPIs
from raftcoord.kafka.apis.brokers import BrokerAPIs
from raftcoord.kafka.apis.common import Gateways, Handler
from raftcoord.kafka.apis.groups import GroupAPIs
from raftcoord.kafka.apis.partitions import PartitionAPIs
from raftcoord.kafka.apis.transactions import TransactionAPIs
from raftcoord.kafka.backend import Backend
from raftcoord.protocol.config import ClusterConfig, KafkaListener


def handlers(
    config: ClusterConfig, listener: KafkaListener, backend: Backend
) -> dict[int, Handler]:
    """Every API's handler by API key, for the gateway of ``listener``."""
    gateways = Gateways(config, listener)
    families = (
        BrokerAPIs(backend, gateways),
        TransactionAPIs(backend),
        GroupAPIs(backend),
        AdminAPIs(backend, gateways),
        AclAPIs(backend),
        PartitionAPIs(backend),
    )
    return {key: handler for family in families for key, handler in family.handlers().items()}
