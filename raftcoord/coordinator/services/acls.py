"""ACL RPCs of TransactionCoordinator: CreateAcls, DescribeAcls and
DeleteAcls (Kafka's, with its rights: ALTER on the cluster to change the
bindings, DESCRIBE to list them). The bindings live in shard 0; its leader
answers, another node forwards to it. Every node authorizes from its own
replica of shard 0, so a change applies on a node once it has replicated
there (at once on the leader, within a heartbeat on the others), and on the
partition-log nodes with their next metadata refresh (about a second).
"""

from __future__ import annotations

from typing import Any

from fsm import CreateAcls, DeleteAcls, ErrorCode, Outcome
from raftcoord.coordinator.markers import METADATA_SHARD
from raftcoord.coordinator.services.common import Refused, ShardRouter
from raftcoord.protocol.acl import Acl, Operation, binding_error
from raftcoord.protocol.v1 import coordinator_pb2
from raftcoord.protocol.wire import (
    acl_from_proto,
    acl_to_proto,
    filter_from_proto,
    wire_error,
)


class AclRPCs:
    def __init__(self, router: ShardRouter) -> None:
        self.router = router

    def CreateAcls(self, request: Any, context: Any) -> Any:
        refused = self.router.security_refusal(context, Operation.ALTER)
        if refused is None:
            forwarded = self.router.leader_answer(METADATA_SHARD, context, "CreateAcls", request)
            if forwarded is not None:
                return forwarded
        results: list[tuple[ErrorCode, str]] = []
        valid: list[Acl] = []
        for binding in request.creations:
            if refused is not None:
                results.append((refused.error, refused.message))
                continue
            try:
                acl = acl_from_proto(binding)
            except ValueError as exc:
                results.append((ErrorCode.INVALID_REQUEST, f"unknown number: {exc}"))
                continue
            problem = binding_error(acl)
            if problem is not None:  # this binding alone is refused, as Kafka does
                results.append((ErrorCode.INVALID_REQUEST, problem))
                continue
            results.append((ErrorCode.NONE, ""))
            valid.append(acl)
        if valid:
            command = tuple(valid)
            outcome = self.router.run(
                METADATA_SHARD, lambda stamp: CreateAcls(command, stamp.now_ms)
            )
            results = [
                (outcome.error, outcome.message) if error is ErrorCode.NONE else (error, message)
                for error, message in results
            ]
        return coordinator_pb2.CreateAclsResponse(
            results=[
                coordinator_pb2.AclCreationResult(
                    error_code=wire_error(error), error_message=message
                )
                for error, message in results
            ]
        )

    def DescribeAcls(self, request: Any, context: Any) -> Any:
        refused = self.router.security_refusal(context, Operation.DESCRIBE)
        if refused is not None:
            return coordinator_pb2.DescribeAclsResponse(
                error_code=wire_error(refused.error), error_message=refused.message
            )
        forwarded = self.router.leader_answer(METADATA_SHARD, context, "DescribeAcls", request)
        if forwarded is not None:
            return forwarded
        try:
            wanted = filter_from_proto(request.filter)
        except ValueError as exc:
            return coordinator_pb2.DescribeAclsResponse(
                error_code=wire_error(ErrorCode.INVALID_REQUEST),
                error_message=f"unknown number: {exc}",
            )
        try:
            acls: list[Acl] = self.router.read(
                METADATA_SHARD,
                lambda machine: sorted(
                    (a for a in machine.state.acls if wanted.matches(a)), key=Acl.to_wire
                ),
            )
        except Refused as not_read:
            return coordinator_pb2.DescribeAclsResponse(
                error_code=wire_error(not_read.error), error_message=not_read.message
            )
        return coordinator_pb2.DescribeAclsResponse(acls=[acl_to_proto(a) for a in acls])

    def DeleteAcls(self, request: Any, context: Any) -> Any:
        refused = self.router.security_refusal(context, Operation.ALTER)
        if refused is None:
            forwarded = self.router.leader_answer(METADATA_SHARD, context, "DeleteAcls", request)
            if forwarded is not None:
                return forwarded
            try:
                filters = tuple(filter_from_proto(f) for f in request.filters)
            except ValueError as exc:
                refused = Outcome(error=ErrorCode.INVALID_REQUEST, message=f"unknown number: {exc}")
        if refused is not None:
            return coordinator_pb2.DeleteAclsResponse(
                results=[
                    coordinator_pb2.AclDeletionResult(
                        error_code=wire_error(refused.error), error_message=refused.message
                    )
                    for _ in request.filters
                ]
            )
        outcome = self.router.run(METADATA_SHARD, lambda stamp: DeleteAcls(filters, stamp.now_ms))
        if not outcome.ok:
            return coordinator_pb2.DeleteAclsResponse(
                results=[
                    coordinator_pb2.AclDeletionResult(
                        error_code=wire_error(outcome.error), error_message=outcome.message
                    )
                    for _ in request.filters
                ]
            )
        return coordinator_pb2.DeleteAclsResponse(
            results=[
                coordinator_pb2.AclDeletionResult(deleted=[acl_to_proto(a) for a in deleted])
                for deleted in outcome.deleted
            ]
        )
