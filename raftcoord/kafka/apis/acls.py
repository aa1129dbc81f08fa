"""Kafka's ACL APIs: CreateAcls, DescribeAcls and DeleteAcls, each to a
coordinator that accepts it (the bindings live in shard 0)."""

from __future__ import annotations

from typing import Any

from raftcoord.kafka import messages as m
from raftcoord.kafka.apis.common import Data, Handler
from raftcoord.kafka.backend import Backend
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.v1 import common_pb2, coordinator_pb2


class AclAPIs:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def handlers(self) -> dict[int, Handler]:
        return {
            m.CREATE_ACLS: self.create_acls,
            m.DESCRIBE_ACLS: self.describe_acls,
            m.DELETE_ACLS: self.delete_acls,
        }

    async def create_acls(self, request: m.Request) -> Data:
        answer = await self.backend.accepting_coordinator(
            "CreateAcls",
            coordinator_pb2.CreateAclsRequest(
                creations=[
                    common_pb2.AclBinding(
                        resource_type=c.resource_type,
                        resource_name=c.resource_name,
                        pattern_type=c.resource_pattern_type,
                        principal=c.principal,
                        host=c.host,
                        operation=c.operation,
                        permission_type=c.permission_type,
                    )
                    for c in request.body.creations
                ]
            ),
        )
        results = list(answer.results)
        if len(results) != len(request.body.creations):  # no coordinator accepted
            failed = {"error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE, "error_message": None}
            return {"results": [failed for _ in request.body.creations]}
        return {
            "results": [
                {"error_code": r.error_code, "error_message": r.error_message or None}
                for r in results
            ]
        }

    async def describe_acls(self, request: m.Request) -> Data:
        answer = await self.backend.accepting_coordinator(
            "DescribeAcls",
            coordinator_pb2.DescribeAclsRequest(filter=_acl_filter(request.body)),
        )
        resources: dict[tuple[int, str, int], list[Data]] = {}
        for a in answer.acls:
            resources.setdefault((a.resource_type, a.resource_name, a.pattern_type), []).append(
                {
                    "principal": a.principal,
                    "host": a.host,
                    "operation": a.operation,
                    "permission_type": a.permission_type,
                }
            )
        return {
            "error_code": answer.error_code,
            "error_message": answer.error_message or None,
            "resources": [
                {"resource_type": t, "resource_name": n, "pattern_type": p, "acls": acls}
                for (t, n, p), acls in resources.items()
            ],
        }

    async def delete_acls(self, request: m.Request) -> Data:
        filters = request.body.filters
        answer = await self.backend.accepting_coordinator(
            "DeleteAcls",
            coordinator_pb2.DeleteAclsRequest(filters=[_acl_filter(f) for f in filters]),
        )
        results = list(answer.results)
        if len(results) != len(filters):  # no coordinator accepted
            failed: Data = {
                "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
                "error_message": None,
                "matching_acls": [],
            }
            return {"filter_results": [failed for _ in filters]}
        return {
            "filter_results": [
                {
                    "error_code": r.error_code,
                    "error_message": r.error_message or None,
                    "matching_acls": [
                        {
                            "error_code": ErrorCode.NONE,
                            "error_message": None,
                            "resource_type": a.resource_type,
                            "resource_name": a.resource_name,
                            "pattern_type": a.pattern_type,
                            "principal": a.principal,
                            "host": a.host,
                            "operation": a.operation,
                            "permission_type": a.permission_type,
                        }
                        for a in r.deleted
                    ],
                }
                for r in results
            ]
        }


def _acl_filter(body: Any) -> common_pb2.AclBindingFilter:
    """A Kafka ACL filter (DescribeAcls' body, one of DeleteAcls' filters) as
    the coordinators' message."""
    acl_filter = common_pb2.AclBindingFilter(
        resource_type=body.resource_type_filter,
        pattern_type=body.pattern_type_filter,
        operation=body.operation,
        permission_type=body.permission_type,
    )
    if body.resource_name_filter is not None:
        acl_filter.resource_name = body.resource_name_filter
    if body.principal_filter is not None:
        acl_filter.principal = body.principal_filter
    if body.host_filter is not None:
        acl_filter.host = body.host_filter
    return acl_filter
