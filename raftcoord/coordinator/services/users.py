"""SASL/SCRAM user RPCs of TransactionCoordinator: AlterUserScramCredentials
and DescribeUserScramCredentials (Kafka's, with its rights: ALTER on the
cluster to change credentials, DESCRIBE to list them). Credentials live in
shard 0; its leader answers, another node forwards to it. The Kafka
gateways read the salts and keys (``include_keys``, their node principals
only) to authenticate their SASL_SSL clients (docs/security.md)."""

from __future__ import annotations

from typing import Any

from fsm import DeleteScramCredential, ErrorCode, UpsertScramCredential
from raftcoord.coordinator.leader import Unstamped
from raftcoord.coordinator.markers import METADATA_SHARD
from raftcoord.coordinator.services.common import Refused, ShardRouter
from raftcoord.protocol.acl import Operation
from raftcoord.protocol.scram import MECHANISMS, ScramCredential, credential, credential_error
from raftcoord.protocol.tls import cluster_principals
from raftcoord.protocol.v1 import coordinator_pb2
from raftcoord.protocol.wire import wire_error


class UserRPCs:
    def __init__(self, router: ShardRouter) -> None:
        self.router = router

    def AlterUserScramCredentials(self, request: Any, context: Any) -> Any:
        refused = self.router.security_refusal(context, Operation.ALTER)
        names = [d.name for d in request.deletions] + [u.name for u in request.upsertions]
        if refused is None:
            forwarded = self.router.leader_answer(
                METADATA_SHARD, context, "AlterUserScramCredentials", request
            )
            if forwarded is not None:
                return forwarded
        if refused is not None:
            return _results([(n, refused.error, refused.message) for n in names])
        results = []
        for deletion in request.deletions:
            user, mechanism = deletion.name, deletion.mechanism
            if mechanism not in MECHANISMS:
                unknown = f"unknown mechanism {mechanism[:40]!r}"
                results.append((user, ErrorCode.UNSUPPORTED_SASL_MECHANISM, unknown))
                continue
            outcome = self.router.run(METADATA_SHARD, _delete(user, mechanism))
            results.append((user, outcome.error, outcome.message))
        cluster = cluster_principals(self.router.config)
        for upsertion in request.upsertions:
            problem = credential_error(
                upsertion.name, upsertion.mechanism, upsertion.iterations, upsertion.salt
            )
            if problem is None and f"User:{upsertion.name}" in cluster:
                problem = f"{upsertion.name!r} is a node's or a super user's name"
            if problem is not None:
                code = (
                    ErrorCode.UNSUPPORTED_SASL_MECHANISM
                    if upsertion.mechanism not in MECHANISMS
                    else ErrorCode.INVALID_REQUEST
                )
                results.append((upsertion.name, code, problem))
                continue
            made = credential(
                upsertion.mechanism,
                upsertion.salted_password,
                upsertion.salt,
                upsertion.iterations,
            )
            outcome = self.router.run(
                METADATA_SHARD, _upsert(upsertion.name, upsertion.mechanism, made)
            )
            results.append((upsertion.name, outcome.error, outcome.message))
        return _results(results)

    def DescribeUserScramCredentials(self, request: Any, context: Any) -> Any:
        refused = self.router.security_refusal(context, Operation.DESCRIBE)
        if refused is not None:
            return coordinator_pb2.DescribeUserScramCredentialsResponse(
                error_code=wire_error(refused.error), error_message=refused.message
            )
        forwarded = self.router.leader_answer(
            METADATA_SHARD, context, "DescribeUserScramCredentials", request
        )
        if forwarded is not None:
            return forwarded
        authorizer = self.router.authorizer
        keys = request.include_keys and authorizer.acts_as_cluster(self.router.caller(context))
        wanted = set(request.users)
        try:
            stored: dict[tuple[str, str], ScramCredential] = self.router.read(
                METADATA_SHARD,
                lambda machine: {
                    k: v for k, v in machine.state.scram.items() if not wanted or k[0] in wanted
                },
            )
        except Refused as not_read:
            return coordinator_pb2.DescribeUserScramCredentialsResponse(
                error_code=wire_error(not_read.error), error_message=not_read.message
            )
        users: dict[str, list[Any]] = {u: [] for u in sorted(wanted)}
        for (user, mechanism), found in sorted(stored.items()):
            info = coordinator_pb2.ScramCredentialInfo(
                mechanism=mechanism, iterations=found.iterations
            )
            if keys:
                info.salt, info.stored_key = found.salt, found.stored_key
                info.server_key = found.server_key
            users.setdefault(user, []).append(info)
        return coordinator_pb2.DescribeUserScramCredentialsResponse(
            results=[
                coordinator_pb2.DescribedScramUser(
                    user=user,
                    error_code=wire_error(
                        ErrorCode.NONE if infos else ErrorCode.RESOURCE_NOT_FOUND
                    ),
                    credentials=infos,
                )
                for user, infos in users.items()
            ]
        )


def _delete(user: str, mechanism: str) -> Unstamped:
    return lambda stamp: DeleteScramCredential(user, mechanism, stamp.now_ms)


def _upsert(user: str, mechanism: str, made: ScramCredential) -> Unstamped:
    return lambda stamp: UpsertScramCredential(
        user, mechanism, made.salt, made.iterations, made.stored_key, made.server_key, stamp.now_ms
    )


def _results(results: list[tuple[str, ErrorCode, str]]) -> Any:
    return coordinator_pb2.AlterUserScramCredentialsResponse(
        results=[
            coordinator_pb2.ScramCredentialResult(
                user=user, error_code=wire_error(error), error_message=message
            )
            for user, error, message in results
        ]
    )
