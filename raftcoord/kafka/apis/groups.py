"""Kafka's consumer-group APIs: TxnOffsetCommit, OffsetCommit, OffsetFetch,
JoinGroup, SyncGroup, Heartbeat, LeaveGroup and DescribeGroups, each sent to
the leader of the group's shard. A JoinGroup or SyncGroup waits there until
the group's rebalance completes: only its own request's task waits
(docs/kafka.md, "Consumer groups")."""

from __future__ import annotations

from typing import Any

from raftcoord.kafka import messages as m
from raftcoord.kafka.apis.common import Data, Handler, each_once
from raftcoord.kafka.backend import Backend
from raftcoord.protocol.errors import REDISCOVER, ErrorCode
from raftcoord.protocol.limits import GROUP_MAX_WAIT_S, GROUP_WAIT_GRACE_S
from raftcoord.protocol.v1 import coordinator_pb2

#: Kafka's "authorized operations not asked for" (DescribeGroups v3+).
_NO_AUTHORIZED_OPERATIONS = -(2**31)


class GroupAPIs:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def handlers(self) -> dict[int, Handler]:
        return {
            m.TXN_OFFSET_COMMIT: self.txn_offset_commit,
            m.OFFSET_COMMIT: self.offset_commit,
            m.OFFSET_FETCH: self.offset_fetch,
            m.JOIN_GROUP: self.join_group,
            m.SYNC_GROUP: self.sync_group,
            m.HEARTBEAT: self.heartbeat,
            m.LEAVE_GROUP: self.leave_group,
            m.DESCRIBE_GROUPS: self.describe_groups,
        }

    @staticmethod
    def _offset_topics(topics: Any) -> list[coordinator_pb2.OffsetCommitTopic]:
        return [
            coordinator_pb2.OffsetCommitTopic(
                topic=topic.name,
                partitions=[
                    coordinator_pb2.OffsetCommitPartition(
                        partition=p.partition_index,
                        offset=p.committed_offset,
                        leader_epoch=getattr(p, "committed_leader_epoch", -1),
                        metadata=p.committed_metadata or "",
                    )
                    for p in topic.partitions
                ],
            )
            for topic in topics
        ]

    @staticmethod
    def _partition_errors(topics: Any, answer: Any) -> list[Data]:
        per_partition = {(r.topic, r.partition): r.error_code for r in answer.results}
        return [
            {
                "name": topic.name,
                "partitions": [
                    {
                        "partition_index": p.partition_index,
                        "error_code": per_partition.get(
                            (topic.name, p.partition_index), answer.error_code
                        ),
                    }
                    for p in topic.partitions
                ],
            }
            for topic in topics
        ]

    async def txn_offset_commit(self, request: m.Request) -> Data:
        body = request.body
        answer = await self.backend.to_leader(
            body.group_id,
            coordinator_pb2.GROUP,
            "TxnOffsetCommit",
            coordinator_pb2.TxnOffsetCommitRequest(
                transactional_id=body.transactional_id,
                group_id=body.group_id,
                producer_id=body.producer_id,
                producer_epoch=body.producer_epoch,
                generation_id=getattr(body, "generation_id", -1),
                member_id=getattr(body, "member_id", ""),
                group_instance_id=getattr(body, "group_instance_id", None) or "",
                topics=self._offset_topics(body.topics),
            ),
        )
        return {"topics": self._partition_errors(body.topics, answer)}

    async def offset_commit(self, request: m.Request) -> Data:
        body = request.body
        answer = await self.backend.to_leader(
            body.group_id,
            coordinator_pb2.GROUP,
            "OffsetCommit",
            coordinator_pb2.OffsetCommitRequest(
                group_id=body.group_id,
                generation_id=getattr(body, "generation_id_or_member_epoch", -1),
                member_id=body.member_id,
                group_instance_id=getattr(body, "group_instance_id", None) or "",
                topics=self._offset_topics(body.topics),
            ),
        )
        return {"topics": self._partition_errors(body.topics, answer)}

    async def offset_fetch(self, request: m.Request) -> Data:
        body = request.body
        grpc_request = coordinator_pb2.OffsetFetchRequest(
            group_id=body.group_id, require_stable=getattr(body, "require_stable", False)
        )
        for topic in body.topics or ():
            grpc_request.topics.add(topic=topic.name, partitions=list(topic.partition_indexes))
        answer = await self.backend.to_leader(
            body.group_id, coordinator_pb2.GROUP, "OffsetFetch", grpc_request
        )
        by_topic: dict[str, list[Data]] = {}
        for p in answer.partitions:
            by_topic.setdefault(p.topic, []).append(
                {
                    "partition_index": p.partition,
                    "committed_offset": p.offset,
                    "committed_leader_epoch": -1,
                    "metadata": p.metadata,
                    "error_code": p.error_code,
                }
            )
        if answer.error_code != ErrorCode.NONE:
            for topic in body.topics or ():
                by_topic[topic.name] = [
                    {
                        "partition_index": p,
                        "committed_offset": -1,
                        "committed_leader_epoch": -1,
                        "metadata": "",
                        "error_code": answer.error_code,
                    }
                    for p in topic.partition_indexes
                ]
        return {
            "error_code": answer.error_code,
            "topics": [{"name": name, "partitions": ps} for name, ps in by_topic.items()],
        }

    async def join_group(self, request: m.Request) -> Data:
        """JoinGroup, answered when the coordinator completes the join: only
        this request's task waits (docs/kafka.md, "Consumer groups")."""
        body = request.body
        session_ms = m.milliseconds(body.session_timeout)
        # Version 0 has no rebalance timeout: Kafka uses the session timeout.
        rebalance_ms = m.milliseconds(body.rebalance_timeout) if request.api_version else session_ms
        grpc_request = coordinator_pb2.JoinGroupRequest(
            group_id=body.group_id,
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=rebalance_ms,
            member_id=body.member_id,
            group_instance_id=getattr(body, "group_instance_id", None) or "",
            protocol_type=body.protocol_type,
            protocols=[
                coordinator_pb2.JoinGroupProtocol(name=p.name, metadata=p.metadata)
                for p in body.protocols
            ],
            client_id=request.client_id or "",
        )
        wait_s = min(max(rebalance_ms, 0) / 1000 + GROUP_WAIT_GRACE_S, GROUP_MAX_WAIT_S)
        answer = await self.backend.to_leader(
            body.group_id, coordinator_pb2.GROUP, "JoinGroup", grpc_request, wait_s
        )
        if answer.error_code == ErrorCode.MEMBER_ID_REQUIRED and request.api_version < 4:
            # Versions before KIP-394 do not know MEMBER_ID_REQUIRED: as Kafka's
            # brokers do for them, join again at once with the assigned id.
            grpc_request.member_id = answer.member_id
            answer = await self.backend.to_leader(
                body.group_id, coordinator_pb2.GROUP, "JoinGroup", grpc_request, wait_s
            )
        return {
            "error_code": answer.error_code,
            "generation_id": answer.generation_id if answer.error_code == ErrorCode.NONE else -1,
            "protocol_type": answer.protocol_type or None,
            "protocol_name": answer.protocol_name,
            "leader": answer.leader,
            "member_id": answer.member_id or body.member_id,
            "members": [
                {
                    "member_id": x.member_id,
                    "group_instance_id": x.group_instance_id or None,
                    "metadata": x.metadata,
                }
                for x in answer.members
            ],
        }

    async def sync_group(self, request: m.Request) -> Data:
        """SyncGroup; a follower's waits for the leader's assignment."""
        body = request.body
        answer = await self.backend.to_leader(
            body.group_id,
            coordinator_pb2.GROUP,
            "SyncGroup",
            coordinator_pb2.SyncGroupRequest(
                group_id=body.group_id,
                generation_id=body.generation_id,
                member_id=body.member_id,
                group_instance_id=getattr(body, "group_instance_id", None) or "",
                protocol_type=getattr(body, "protocol_type", None) or "",
                protocol_name=getattr(body, "protocol_name", None) or "",
                assignments=[
                    coordinator_pb2.SyncGroupAssignment(
                        member_id=a.member_id, assignment=a.assignment
                    )
                    for a in body.assignments
                ],
            ),
            GROUP_MAX_WAIT_S,
        )
        return {
            "error_code": answer.error_code,
            "protocol_type": answer.protocol_type or None,
            "protocol_name": answer.protocol_name or None,
            "assignment": answer.assignment,
        }

    async def heartbeat(self, request: m.Request) -> Data:
        body = request.body
        answer = await self.backend.to_leader(
            body.group_id,
            coordinator_pb2.GROUP,
            "Heartbeat",
            coordinator_pb2.HeartbeatRequest(
                group_id=body.group_id,
                generation_id=body.generation_id,
                member_id=body.member_id,
                group_instance_id=getattr(body, "group_instance_id", None) or "",
            ),
        )
        return {"error_code": answer.error_code}

    async def leave_group(self, request: m.Request) -> Data:
        """LeaveGroup: one member before version 3, several from it on."""
        body = request.body
        if request.api_version < 3:
            members = [coordinator_pb2.LeaveGroupMember(member_id=body.member_id)]
        else:
            members = [
                coordinator_pb2.LeaveGroupMember(
                    member_id=x.member_id, group_instance_id=x.group_instance_id or ""
                )
                for x in body.members
            ]
        answer = await self.backend.to_leader(
            body.group_id,
            coordinator_pb2.GROUP,
            "LeaveGroup",
            coordinator_pb2.LeaveGroupRequest(group_id=body.group_id, members=members),
        )
        if request.api_version < 3:
            member_codes = [r.error_code for r in answer.members if r.error_code]
            return {"error_code": answer.error_code or next(iter(member_codes), ErrorCode.NONE)}
        return {
            "error_code": answer.error_code,
            "members": [
                {
                    "member_id": r.member_id,
                    "group_instance_id": r.group_instance_id or None,
                    "error_code": r.error_code,
                }
                for r in answer.members
            ],
        }

    async def describe_groups(self, request: m.Request) -> Data:
        """DescribeGroups, each group asked of its own shard's leader."""

        async def describe(group_id: str) -> Data:
            answer = await self.backend.to_leader(
                group_id,
                coordinator_pb2.GROUP,
                "DescribeGroups",
                coordinator_pb2.DescribeGroupsRequest(group_ids=[group_id]),
            )
            found = next((g for g in answer.groups if g.group_id == group_id), None)
            if found is not None and found.error_code in REDISCOVER:
                self.backend.forget_leader(group_id)
            if found is None:
                return {
                    "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    "group_id": group_id,
                    "authorized_operations": _NO_AUTHORIZED_OPERATIONS,
                }
            return {
                "error_code": found.error_code,
                "group_id": group_id,
                "group_state": found.state,
                "protocol_type": found.protocol_type,
                "protocol_data": found.protocol_name,
                "members": [
                    {
                        "member_id": x.member_id,
                        "group_instance_id": x.group_instance_id or None,
                        "client_id": x.client_id,
                        "client_host": "",
                        "member_metadata": x.metadata,
                        "member_assignment": x.assignment,
                    }
                    for x in found.members
                ],
                "authorized_operations": _NO_AUTHORIZED_OPERATIONS,
            }

        return {"groups": await each_once(list(request.body.groups), describe)}
