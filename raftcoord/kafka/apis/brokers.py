"""The gateway as Kafka's brokers: ApiVersions, Metadata and FindCoordinator.

Every gateway is a broker; a partition's leader is the gateway in front of
the partition-log node that leads it, and the coordinator of any key is the
gateway asked (docs/kafka.md, "Design").
"""

from __future__ import annotations

from raftcoord.kafka import messages as m
from raftcoord.kafka.apis.common import Data, Gateways, Handler
from raftcoord.kafka.backend import Backend, Unreachable
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.v1 import coordinator_pb2

CLUSTER_ID = "raftcoord"


def api_versions_data(error: int) -> Data:
    """ApiVersions' answer: every API and the versions served."""
    return {
        "error_code": error,
        "api_keys": [
            {"api_key": key, "min_version": low, "max_version": high}
            for key, (low, high) in sorted(m.SUPPORTED.items())
        ],
    }


class BrokerAPIs:
    def __init__(self, backend: Backend, gateways: Gateways) -> None:
        self.backend = backend
        self.gateways = gateways

    def handlers(self) -> dict[int, Handler]:
        return {
            m.API_VERSIONS: self.api_versions,
            m.METADATA: self.metadata,
            m.FIND_COORDINATOR: self.find_coordinator,
        }

    async def api_versions(self, request: m.Request) -> Data:
        return api_versions_data(ErrorCode.NONE)

    async def metadata(self, request: m.Request) -> Data:
        asked = request.body.topics
        names = None if asked is None else [t.name for t in asked]
        topics: list[Data] = []
        try:
            # Kafka: null asks for every topic, an empty list for none (brokers only).
            answer = (
                coordinator_pb2.MetadataResponse()
                if names == []
                else await self.backend.metadata(names)
            )
        except Unreachable:
            answer = coordinator_pb2.MetadataResponse()
            for name in names or ():
                topics.append({"name": name, "error_code": ErrorCode.REQUEST_TIMED_OUT})
        for topic in answer.topics:
            partitions = []
            for p in topic.partitions:
                partitions.append(
                    {
                        "error_code": p.error_code,
                        "partition_index": p.partition,
                        "leader_id": (
                            self.gateways.of_partition_node(p.node_id).node_id
                            if p.node_id >= 0
                            else -1
                        ),
                        "leader_epoch": p.leader_epoch,
                        "replica_nodes": self.gateways.of_partition_nodes(p.replicas),
                        "isr_nodes": self.gateways.of_partition_nodes(p.isr),
                    }
                )
            topics.append(
                {"error_code": topic.error_code, "name": topic.name, "partitions": partitions}
            )
        return {
            "brokers": self.gateways.brokers(),
            "cluster_id": CLUSTER_ID,
            "controller_id": self.gateways.config.kafka_listeners[0].node_id,
            "topics": topics,
        }

    async def find_coordinator(self, request: m.Request) -> Data:
        """This gateway, for any key: a gateway keeps nothing of a
        transactional id or a group (it forwards to the shard's leader), so
        the one the client reached serves it, and a gateway that is down is
        never named by another (the client asks again through one that is up).

        Answered here, without asking the coordinators, so that it never
        fails while a shard elects: librdkafka gives up a coordinator lookup
        of a TxnOffsetCommit or an admin request after three
        COORDINATOR_NOT_AVAILABLE answers and waits for a broker's
        connection to change state, which never comes while the gateways
        stay up (docs/kafka.md, "Coordinators").
        """
        key = request.body.key
        if not key:
            return {
                "error_code": ErrorCode.INVALID_REQUEST,
                "error_message": "key must not be empty",
                "node_id": -1,
                "host": "",
                "port": -1,
            }
        host, port = self.gateways.listener.address.rsplit(":", 1)
        return {
            "error_code": 0,
            "node_id": self.gateways.listener.node_id,
            "host": host,
            "port": int(port),
        }
