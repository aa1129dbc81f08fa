"""The admin client: topics, transactions and the producers of partitions
(as Kafka's Admin, which kafka-transactions.sh drives)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc

from raftcoord.client._net import (
    ATTEMPT_TIMEOUT_S,
    BACK_OFF,
    LOOKUP_TIMEOUT_S,
    CoordinatorClient,
    Deadline,
    MetadataCache,
    client_channels,
    transport_error,
)
from raftcoord.client._wire import topic_partitions
from raftcoord.client.errors import (
    IllegalStateError,
    InvalidTxnStateError,
    KafkaConnectionError,
    KafkaError,
    RetriableError,
    UnknownTopicOrPartitionError,
    error_for,
)
from raftcoord.client.records import (
    AbortTransactionSpec,
    ConsumerGroupDescription,
    CoordinatorDescription,
    MemberDescription,
    PartitionNodeDescription,
    PendingMarker,
    ProducerState,
    ShardReplicaDescription,
    TopicDescription,
    TopicPartition,
    TopicPartitionDescription,
    TransactionDescription,
    TransactionListing,
)
from raftcoord.protocol import scram
from raftcoord.protocol.acl import Acl, AclFilter
from raftcoord.protocol.channels import ChannelCache
from raftcoord.protocol.errors import REDISCOVER, ErrorCode
from raftcoord.protocol.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    coordinator_pb2,
    partition_log_pb2,
)
from raftcoord.protocol.wire import acl_from_proto, acl_to_proto, filter_to_proto

__all__ = ["TRANSACTION_STATES", "Admin"]

log = logging.getLogger("raftcoord.client.admin")

#: Kafka's names of the transaction states, by protocol value.
TRANSACTION_STATES: dict[int, str] = {
    common_pb2.TRANSACTION_STATE_EMPTY: "Empty",
    common_pb2.TRANSACTION_STATE_ONGOING: "Ongoing",
    common_pb2.TRANSACTION_STATE_PREPARE_COMMIT: "PrepareCommit",
    common_pb2.TRANSACTION_STATE_PREPARE_ABORT: "PrepareAbort",
    common_pb2.TRANSACTION_STATE_COMPLETE_COMMIT: "CompleteCommit",
    common_pb2.TRANSACTION_STATE_COMPLETE_ABORT: "CompleteAbort",
    common_pb2.TRANSACTION_STATE_DEAD: "Dead",
    common_pb2.TRANSACTION_STATE_PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
_STATE_VALUES = {name: value for value, name in TRANSACTION_STATES.items()}


#: Iterations of a new SCRAM credential (Kafka's admin tools use 4096..8192).
DEFAULT_SCRAM_ITERATIONS = 8192
SCRAM_SALT_BYTES = 32


def _state_name(value: int) -> str:
    return TRANSACTION_STATES.get(value, f"Unknown({value})")


class Admin:
    """Creates and lists topics; lists and describes transactions; describes
    the producers of partitions and aborts hanging transactions.

    Args:
        bootstrap: coordinator gRPC addresses: a list of "host:port", or one
            comma-separated string.
        request_timeout_ms: deadline of one operation (all its retries).
        channels: where gRPC stubs come from (one channel per address by
            default); tests pass one whose stubs inject faults.
        ssl_cafile, ssl_certfile, ssl_keyfile: a cluster with TLS (its
            config's ``[tls]``): the cluster CA's certificate, and this
            client's certificate and key (PEM files; the principal is the
            certificate's ``User:<CN>``). Without them the client speaks
            plaintext.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 20,
        retry_backoff_max_ms: int = 1_000,
        channels: ChannelCache | None = None,
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
    ) -> None:
        self._request_timeout_s = request_timeout_ms / 1000
        backoff = (retry_backoff_ms / 1000, max(retry_backoff_ms, retry_backoff_max_ms) / 1000)
        self._channels = channels or client_channels(ssl_cafile, ssl_certfile, ssl_keyfile)
        self._coordinators = CoordinatorClient(bootstrap, self._channels, *backoff)
        self._metadata = MetadataCache(self._coordinators)
        #: The node that last created topics (it leads the shard holding topics).
        self._topic_leader: str | None = None
        self._closed = False

    def __enter__(self) -> Admin:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections. Closing twice is a no-op."""
        if not self._closed:
            self._closed = True
            self._channels.close()

    def _deadline(self, what: str, timeout_ms: int | None) -> Deadline:
        if self._closed:
            raise IllegalStateError("the admin client is closed")
        timeout_s = self._request_timeout_s if timeout_ms is None else timeout_ms / 1000
        return Deadline(timeout_s, what)

    # --- topics --------------------------------------------------------------------

    def create_topics(
        self,
        topics: Mapping[str, int],
        *,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
        exist_ok: bool = False,
        validate_only: bool = False,
        timeout_ms: int | None = None,
    ) -> None:
        """Create topics with the given partition counts (their replicas
        placed on the partition-log nodes by the coordinators), each with
        ``replication_factor`` replicas per partition and
        ``min_insync_replicas`` (None: the cluster's defaults).

        Raises:
            TopicAlreadyExistsError: a topic exists (unless ``exist_ok``).
            InvalidPartitionsError, InvalidTopicError, InvalidRequestError,
            InvalidReplicationFactorError, InvalidConfigurationError:
                a refused topic (the first one; the others were still tried).
            KafkaTimeoutError: not done in time.
        """
        deadline = self._deadline("create_topics", timeout_ms)
        pending = dict(topics)
        failures: list[KafkaError] = []
        backoff = self._coordinators.backoff()
        tried: set[str] = set()
        last: KafkaError | None = None
        while pending:
            address = self._topic_leader or self._untried(tried)
            request = coordinator_pb2.CreateTopicsRequest(
                topics=[
                    coordinator_pb2.CreatableTopic(
                        name=name,
                        num_partitions=count,
                        replication_factor=replication_factor or 0,
                        min_insync_replicas=min_insync_replicas or 0,
                    )
                    for name, count in pending.items()
                ],
                validate_only=validate_only,
            )
            try:
                answer = self._coordinators.channels.coordinator(address).CreateTopics(
                    request, timeout=deadline.attempt(ATTEMPT_TIMEOUT_S)
                )
            except grpc.RpcError as exc:
                last = transport_error(exc, address)
                answer = None
            moved = answer is None
            for result in answer.results if answer is not None else ():
                code = result.error_code
                if code in REDISCOVER or code in BACK_OFF:
                    moved = moved or code in REDISCOVER
                    last = error_for(code, result.error_message)
                    continue
                pending.pop(result.name, None)
                if code == ErrorCode.NONE or (code == ErrorCode.TOPIC_ALREADY_EXISTS and exist_ok):
                    self._topic_leader = address
                    continue
                failures.append(error_for(code, f"{result.name}: {result.error_message}"))
            if not pending:
                break
            if moved:
                # Topics live in one shard: try the next node for its leader.
                self._topic_leader = None
                tried.add(address)
                if len(tried) < len(self._coordinators.addresses()):
                    continue
                tried.clear()
            deadline.back_off(backoff, last)
        if failures:
            raise failures[0]
        self._metadata.request_update()

    def _untried(self, tried: set[str]) -> str:
        for address in self._coordinators.addresses():
            if address not in tried:
                return address
        return self._coordinators.addresses()[0]

    def list_topics(self, timeout_ms: int | None = None) -> dict[str, int]:
        """Every topic with its partition count.

        Raises:
            KafkaTimeoutError: no coordinator answered in time.
        """
        deadline = self._deadline("list_topics", timeout_ms)
        answer = self._coordinators.call_any(
            "Metadata", coordinator_pb2.MetadataRequest(), deadline
        )
        self._coordinators.learn(n.address for n in answer.coordinators)
        return {
            t.name: len(t.partitions)
            for t in sorted(answer.topics, key=lambda t: t.name)
            if t.error_code == ErrorCode.NONE
        }

    def describe_topics(
        self, topics: Sequence[str] = (), timeout_ms: int | None = None
    ) -> dict[str, TopicDescription]:
        """``topics`` (empty: every topic) with each partition's leader,
        leader epoch, replicas and in-sync replicas, as shard 0's leader
        records them.

        Raises:
            UnknownTopicOrPartitionError: a named topic does not exist.
            KafkaTimeoutError: no coordinator answered in time.
        """
        deadline = self._deadline("describe_topics", timeout_ms)
        answer = self._coordinators.call_any(
            "Metadata", coordinator_pb2.MetadataRequest(topics=list(topics)), deadline
        )
        described = {}
        for t in sorted(answer.topics, key=lambda t: t.name):
            if t.error_code != ErrorCode.NONE:
                raise error_for(t.error_code, f"topic {t.name!r}")
            described[t.name] = TopicDescription(
                t.name,
                t.min_insync_replicas,
                tuple(
                    TopicPartitionDescription(
                        p.partition, p.node_id, p.leader_epoch, tuple(p.replicas), tuple(p.isr)
                    )
                    for p in sorted(t.partitions, key=lambda p: p.partition)
                ),
            )
        return described

    def describe_cluster(self, timeout_ms: int | None = None) -> dict[str, dict[int, str]]:
        """Node addresses: {"coordinators": {id: address}, "partition_nodes": {...}}."""
        deadline = self._deadline("describe_cluster", timeout_ms)
        answer = self._coordinators.call_any(
            "Metadata", coordinator_pb2.MetadataRequest(), deadline
        )
        return {
            "coordinators": {n.node_id: n.address for n in answer.coordinators},
            "partition_nodes": {n.node_id: n.address for n in answer.partition_nodes},
        }

    def describe_coordinators(self, timeout_ms: int | None = None) -> list[CoordinatorDescription]:
        """Every coordinator node and its replica of each shard (role, Raft
        term, the leader it knows, commit and applied indexes), by node id, as
        each node tells it (NodeStatus). A node that does not answer, or does
        not let this client ask (with TLS, only the cluster's nodes and super
        users may), is described with the reason in ``error``.

        Raises:
            KafkaConnectionError, KafkaTimeoutError: no coordinator answered
                the cluster's metadata.
        """
        deadline = self._deadline("describe_coordinators", timeout_ms)
        nodes = self.describe_cluster(timeout_ms)["coordinators"]
        described = []
        for node_id, address in sorted(nodes.items()):
            stub = admin_pb2_grpc.CoordinatorAdminStub(self._channels.channel(address))
            try:
                answer = stub.NodeStatus(
                    admin_pb2.NodeStatusRequest(), timeout=deadline.attempt(LOOKUP_TIMEOUT_S)
                )
            except grpc.RpcError as exc:
                described.append(
                    CoordinatorDescription(node_id, address, str(transport_error(exc, address)))
                )
                continue
            replicas = tuple(
                ShardReplicaDescription(
                    shard=int(r.shard),
                    is_leader=bool(r.is_leader),
                    term=int(r.term),
                    leader_node_id=int(r.leader_node_id),
                    leader_address=r.leader_address,
                    commit_index=int(r.commit_index),
                    applied_index=int(r.applied_index),
                    transactional_ids=int(r.transactional_ids),
                    parked_requests=int(r.parked_requests),
                )
                for r in answer.shards
            )
            described.append(CoordinatorDescription(node_id, address, None, replicas))
        return described

    def describe_partition_nodes(
        self, timeout_ms: int | None = None
    ) -> list[PartitionNodeDescription]:
        """Every partition-log node's data directory and the partitions it
        refuses to serve, by node id (PartitionNodeStatus). A node that does
        not answer, or does not let this client ask (with TLS, only the
        cluster's nodes and super users may), is described with the reason in
        ``error``.

        Raises:
            KafkaConnectionError, KafkaTimeoutError: no coordinator answered
                the cluster's metadata.
        """
        deadline = self._deadline("describe_partition_nodes", timeout_ms)
        nodes = self.describe_cluster(timeout_ms)["partition_nodes"]
        described = []
        for node_id, address in sorted(nodes.items()):
            try:
                answer = self._channels.partition_log(address).PartitionNodeStatus(
                    partition_log_pb2.PartitionNodeStatusRequest(),
                    timeout=deadline.attempt(LOOKUP_TIMEOUT_S),
                )
            except grpc.RpcError as exc:
                described.append(
                    PartitionNodeDescription(node_id, address, str(transport_error(exc, address)))
                )
                continue
            described.append(
                PartitionNodeDescription(
                    node_id,
                    address,
                    None,
                    directory_id=answer.directory_id,
                    directory_state=answer.directory_state,
                    refused=tuple(
                        (TopicPartition(r.topic, r.partition), r.reason) for r in answer.refused
                    ),
                )
            )
        return described

    # --- access control ------------------------------------------------------------

    def create_acls(self, acls: Sequence[Acl], timeout_ms: int | None = None) -> None:
        """Add ACL bindings (all of them, or none on a refusal).

        Raises:
            ClusterAuthorizationFailedError: the caller may not ALTER the cluster.
            InvalidRequestError: a binding cannot be stored (the first one's why).
            SecurityDisabledError: the cluster has no authorizer.
            KafkaTimeoutError: not done in time.
        """
        request = coordinator_pb2.CreateAclsRequest(creations=[acl_to_proto(a) for a in acls])
        answer = self._security_call("create_acls", "CreateAcls", request, timeout_ms)
        _raise_first_failure(answer.results)

    def describe_acls(
        self, acl_filter: AclFilter | None = None, timeout_ms: int | None = None
    ) -> list[Acl]:
        """The ACL bindings ``acl_filter`` selects (all by default).

        Raises:
            ClusterAuthorizationFailedError: the caller may not DESCRIBE the cluster.
            SecurityDisabledError: the cluster has no authorizer.
            KafkaTimeoutError: not done in time.
        """
        request = coordinator_pb2.DescribeAclsRequest(
            filter=filter_to_proto(acl_filter or AclFilter())
        )
        answer = self._security_call("describe_acls", "DescribeAcls", request, timeout_ms)
        if answer.error_code != ErrorCode.NONE:
            raise error_for(answer.error_code, answer.error_message)
        return [acl_from_proto(a) for a in answer.acls]

    def delete_acls(
        self, filters: Sequence[AclFilter], timeout_ms: int | None = None
    ) -> list[list[Acl]]:
        """Remove the bindings the filters select; what each filter removed.

        Raises:
            ClusterAuthorizationFailedError: the caller may not ALTER the cluster.
            SecurityDisabledError: the cluster has no authorizer.
            KafkaTimeoutError: not done in time.
        """
        request = coordinator_pb2.DeleteAclsRequest(filters=[filter_to_proto(f) for f in filters])
        answer = self._security_call("delete_acls", "DeleteAcls", request, timeout_ms)
        _raise_first_failure(answer.results)
        return [[acl_from_proto(a) for a in r.deleted] for r in answer.results]

    # --- SASL users ------------------------------------------------------------------

    def upsert_scram_credential(
        self,
        user: str,
        mechanism: str,
        password: str,
        iterations: int = DEFAULT_SCRAM_ITERATIONS,
        timeout_ms: int | None = None,
    ) -> None:
        """Set ``user``'s password for ``mechanism`` (SCRAM-SHA-256 or
        SCRAM-SHA-512), for the Kafka gateways' SASL_SSL listeners (SCRAM,
        and PLAIN against the same credential). Only the salted password
        leaves this process, as Kafka's admin client sends it.

        Raises:
            ClusterAuthorizationFailedError: the caller may not ALTER the cluster.
            InvalidRequestError: an unknown mechanism, a bad user name or iterations.
            SecurityDisabledError: the cluster has no authorizer.
            KafkaTimeoutError: not done in time.
        """
        if mechanism not in scram.MECHANISMS:
            raise error_for(ErrorCode.INVALID_REQUEST, f"unknown mechanism {mechanism!r}")
        salt = os.urandom(SCRAM_SALT_BYTES)
        upsertion = coordinator_pb2.ScramCredentialUpsertion(
            name=user,
            mechanism=mechanism,
            iterations=iterations,
            salt=salt,
            salted_password=scram.salted_password(mechanism, password, salt, iterations),
        )
        self._alter_users(
            coordinator_pb2.AlterUserScramCredentialsRequest(upsertions=[upsertion]), timeout_ms
        )

    def delete_scram_credential(
        self, user: str, mechanism: str, timeout_ms: int | None = None
    ) -> None:
        """Remove ``user``'s credential for ``mechanism``.

        Raises:
            ResourceNotFoundError: there is none.
            ClusterAuthorizationFailedError, SecurityDisabledError, KafkaTimeoutError:
                as :meth:`upsert_scram_credential`.
        """
        deletion = coordinator_pb2.ScramCredentialDeletion(name=user, mechanism=mechanism)
        self._alter_users(
            coordinator_pb2.AlterUserScramCredentialsRequest(deletions=[deletion]), timeout_ms
        )

    def describe_scram_credentials(
        self, users: Sequence[str] = (), timeout_ms: int | None = None
    ) -> dict[str, dict[str, int]]:
        """Each user's mechanisms and their iterations (all users by default;
        a user asked for without any credential maps to an empty dict).

        Raises:
            ClusterAuthorizationFailedError: the caller may not DESCRIBE the cluster.
            SecurityDisabledError: the cluster has no authorizer.
            KafkaTimeoutError: not done in time.
        """
        request = coordinator_pb2.DescribeUserScramCredentialsRequest(users=list(users))
        answer = self._security_call(
            "describe_scram_credentials", "DescribeUserScramCredentials", request, timeout_ms
        )
        if answer.error_code != ErrorCode.NONE:
            raise error_for(answer.error_code, answer.error_message)
        return {r.user: {c.mechanism: c.iterations for c in r.credentials} for r in answer.results}

    def _alter_users(self, request: Any, timeout_ms: int | None) -> None:
        answer = self._security_call(
            "alter_scram_credentials", "AlterUserScramCredentials", request, timeout_ms
        )
        _raise_first_failure(answer.results, lambda r: f"{r.user}: {r.error_message}")

    def _security_call(self, what: str, method: str, request: Any, timeout_ms: int | None) -> Any:
        """``method``'s answer from shard 0's leader (any coordinator forwards
        to it), asked again while the shard cannot answer (an election): the
        ACL and SASL-user requests."""
        deadline = self._deadline(what, timeout_ms)
        backoff = self._coordinators.backoff()
        while True:
            answer = self._coordinators.call_any(method, request, deadline)
            codes = [answer.error_code] if hasattr(answer, "error_code") else []
            codes += [r.error_code for r in getattr(answer, "results", ())]
            retry = next((c for c in codes if c in REDISCOVER or c in BACK_OFF), None)
            if retry is None:
                return answer
            deadline.back_off(backoff, error_for(retry, f"{method}: {ErrorCode(retry).name}"))

    # --- transactions --------------------------------------------------------------

    def list_transactions(
        self,
        states: Iterable[str] = (),
        producer_ids: Iterable[int] = (),
        min_duration_ms: int = -1,
        timeout_ms: int | None = None,
    ) -> list[TransactionListing]:
        """Transactional ids known to the coordinators, sorted by id.

        Every coordinator node is asked (each answers for the shards it
        leads) and the answers are merged. A node that cannot be reached is
        skipped: the shards it led have other leaders once it is gone; when
        none can, KafkaConnectionError.

        Args:
            states: only these states (Kafka's names, e.g. "Ongoing"); empty: any.
            producer_ids: only these producer ids; empty: any.
            min_duration_ms: only transactions open longer than this; -1: any.

        Raises:
            ValueError: an unknown state name.
            KafkaConnectionError: no coordinator answered.
        """
        deadline = self._deadline("list_transactions", timeout_ms)
        try:
            filters = [_STATE_VALUES[s] for s in states]
        except KeyError as exc:
            known = sorted(_STATE_VALUES)
            raise ValueError(f"unknown transaction state {exc}; use {known}") from None
        request = coordinator_pb2.ListTransactionsRequest(
            state_filters=filters,  # type: ignore[arg-type]
            producer_id_filters=list(producer_ids),
            duration_filter_ms=min_duration_ms,
        )
        found: dict[str, TransactionListing] = {}
        for answer in self._ask_every_coordinator("ListTransactions", request, deadline):
            for t in answer.transactions:
                found.setdefault(
                    t.transactional_id,
                    TransactionListing(
                        transactional_id=t.transactional_id,
                        producer_id=int(t.producer_id),
                        state=_state_name(t.state),
                        duration_ms=int(t.duration_ms),
                    ),
                )
        return [found[tid] for tid in sorted(found)]

    def _ask_every_coordinator(self, method: str, request: Any, deadline: Deadline) -> list[Any]:
        """The answers of every coordinator node to ``method`` (each answers
        for the shards it leads) that answered without an error. A node that
        cannot be reached is skipped: the shards it led have other leaders
        once it is gone; when none can, KafkaConnectionError."""
        try:
            self._metadata.refresh(deadline)  # learn every coordinator node
        except KafkaError as exc:
            log.debug("metadata not refreshed: %s", exc)
        answers = []
        failures: list[KafkaError] = []
        addresses = self._coordinators.addresses()
        for address in addresses:
            stub = self._coordinators.channels.coordinator(address)
            try:
                answer = getattr(stub, method)(request, timeout=deadline.attempt(ATTEMPT_TIMEOUT_S))
            except grpc.RpcError as exc:
                failures.append(transport_error(exc, address))
                log.info("%s skips %s", method, failures[-1])
                continue
            if answer.error_code != ErrorCode.NONE:
                log.info("%s: %s answered %s", method, address, answer.error_code)
                continue
            answers.append(answer)
        if len(failures) == len(addresses):  # no node answered: nothing is known
            raise KafkaConnectionError(
                f"no coordinator answered: {'; '.join(str(f) for f in failures)}"
            )
        return answers

    def describe_transactions(
        self, transactional_ids: Iterable[str], timeout_ms: int | None = None
    ) -> dict[str, TransactionDescription]:
        """The coordinator's state of each transactional id (asked of the
        id's coordinator).

        Raises:
            TransactionalIdNotFoundError: an id is unknown (the first such).
            KafkaTimeoutError: not done in time.
        """
        deadline = self._deadline("describe_transactions", timeout_ms)
        described: dict[str, TransactionDescription] = {}
        failures: list[KafkaError] = []
        for tid in dict.fromkeys(transactional_ids):
            answer = self._coordinators.call(
                coordinator_pb2.TRANSACTION,
                tid,
                "DescribeTransactions",
                coordinator_pb2.DescribeTransactionsRequest(transactional_ids=[tid]),
                deadline,
                error_of=_first_description_error,
            )
            description = answer.transactions[0]
            if description.error_code != ErrorCode.NONE:
                code = ErrorCode(description.error_code)
                why = "not found" if code is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND else code.name
                failures.append(error_for(code, f"transactional id {tid!r} {why}"))
                continue
            described[tid] = _description(description)
        if failures:
            raise failures[0]
        return described

    def describe_consumer_groups(
        self, group_ids: Iterable[str], timeout_ms: int | None = None
    ) -> dict[str, ConsumerGroupDescription]:
        """The membership of each consumer group (asked of the group's
        coordinator). A group with offsets and no members is Empty; one
        that neither joined nor has offsets is Dead.

        Raises:
            KafkaTimeoutError: not done in time.
        """
        deadline = self._deadline("describe_consumer_groups", timeout_ms)
        described: dict[str, ConsumerGroupDescription] = {}
        for group_id in dict.fromkeys(group_ids):
            answer = self._coordinators.call(
                coordinator_pb2.GROUP,
                group_id,
                "DescribeGroups",
                coordinator_pb2.DescribeGroupsRequest(group_ids=[group_id]),
                deadline,
                error_of=_first_group_error,
            )
            described[group_id] = _group_description(answer.groups[0])
        return described

    def list_consumer_groups(self, timeout_ms: int | None = None) -> dict[str, str]:
        """Every consumer group the coordinators know (it joined, or it has
        offsets) and that this client may describe, with Kafka's state name
        (Empty for a group with offsets and no members), by group id
        (Kafka's listConsumerGroups). Every coordinator node is asked, as by
        :meth:`list_transactions`.

        Raises:
            KafkaConnectionError: no coordinator answered.
        """
        deadline = self._deadline("list_consumer_groups", timeout_ms)
        request = coordinator_pb2.ListGroupsRequest()
        found: dict[str, str] = {}
        for answer in self._ask_every_coordinator("ListGroups", request, deadline):
            for g in answer.groups:
                found.setdefault(g.group_id, g.state)
        return dict(sorted(found.items()))

    def list_consumer_group_offsets(
        self, group_id: str, timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        """The group's committed offsets (the next offset to consume), by
        partition, of every partition it has one for (Kafka's
        listConsumerGroupOffsets; a transactional commit still pending is not
        waited for: the last committed offset is answered).

        Raises:
            KafkaError: the group's coordinator refused (e.g. not authorized).
            KafkaTimeoutError: not done in time.
        """
        deadline = self._deadline("list_consumer_group_offsets", timeout_ms)
        answer = self._coordinators.call(
            coordinator_pb2.GROUP,
            group_id,
            "OffsetFetch",
            coordinator_pb2.OffsetFetchRequest(group_id=group_id, require_stable=False),
            deadline,
        )
        if answer.error_code != ErrorCode.NONE:
            raise error_for(answer.error_code, f"group {group_id!r}: {answer.error_message}")
        return {
            TopicPartition(p.topic, p.partition): int(p.offset)
            for p in answer.partitions
            if p.error_code == ErrorCode.NONE and p.offset >= 0
        }

    def find_coordinator(self, transactional_id: str, timeout_ms: int | None = None) -> str:
        """The address of the coordinator node of ``transactional_id`` (the
        leader of its shard).

        Raises:
            KafkaTimeoutError: no node named a leader in time.
        """
        deadline = self._deadline("find_coordinator", timeout_ms)
        return self._coordinators.find_coordinator(
            coordinator_pb2.TRANSACTION, transactional_id, deadline
        )

    # --- producers of partitions (KIP-664) -----------------------------------------

    def describe_producers(
        self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
    ) -> dict[TopicPartition, list[ProducerState]]:
        """The producers each partition keeps state for, by producer id (asked
        of the partition-log nodes owning the partitions).

        Raises:
            UnknownTopicOrPartitionError: a topic or partition does not exist.
            KafkaTimeoutError: not done in time.
        """
        deadline = self._deadline("describe_producers", timeout_ms)
        answers = self._on_partition_nodes(
            partitions,
            "DescribeProducers",
            lambda tps: partition_log_pb2.DescribeProducersRequest(topics=topic_partitions(tps)),
            lambda answer: answer.partitions,
            deadline,
        )
        return {
            tp: [
                ProducerState(
                    producer_id=int(p.producer_id),
                    producer_epoch=int(p.producer_epoch),
                    last_sequence=int(p.last_sequence),
                    last_timestamp_ms=int(p.last_timestamp_ms),
                    coordinator_epoch=int(p.coordinator_epoch),
                    current_transaction_start_offset=int(p.current_txn_start_offset),
                )
                for p in answer.active_producers
            ]
            for tp, answer in answers.items()
        }

    def force_terminate_transaction(
        self, transactional_id: str, timeout_ms: int | None = None
    ) -> TransactionDescription:
        """Abort a transactional id's open transaction from outside and fence
        its producer (Kafka's Admin.forceTerminateTransaction, KIP-939): what
        ends a prepared two-phase commit transaction whose transaction
        manager is gone, since such a transaction never times out. It is an
        InitProducerId without keep_prepared_txn, with the id's own timeout
        and two-phase setting (so the same rights: WRITE on the id, and
        TWO_PHASE_COMMIT for a two-phase one); the call returns once the
        abort is complete, with the id's description then (CompleteAbort,
        or Empty when the coordinator already ran the InitProducerId it held
        while the abort completed). A transaction that was already
        committing completes its commit: the description says so.

        Raises:
            TransactionalIdNotFoundError: the coordinators do not know the id
                (nothing is created).
            TransactionalIdAuthorizationFailedError: the rights above are missing.
            KafkaTimeoutError: not done in time.
        """
        deadline = self._deadline("force_terminate_transaction", timeout_ms)
        before = self.describe_transactions([transactional_id], timeout_ms)[transactional_id]
        request = coordinator_pb2.InitProducerIdRequest(
            transactional_id=transactional_id,
            transaction_timeout_ms=before.transaction_timeout_ms,
            enable_two_phase_commit=before.two_phase_commit,
        )
        answer = self._coordinators.call(
            coordinator_pb2.TRANSACTION,
            transactional_id,
            "InitProducerId",
            request,
            deadline,
            # The answer to a fenced open transaction: it is being aborted.
            retry=BACK_OFF - {ErrorCode.CONCURRENT_TRANSACTIONS},
        )
        code = ErrorCode(answer.error_code)
        if code not in (ErrorCode.NONE, ErrorCode.CONCURRENT_TRANSACTIONS):
            raise error_for(code, answer.error_message)
        backoff = self._coordinators.backoff()
        while True:
            after = self.describe_transactions([transactional_id], timeout_ms)[transactional_id]
            if after.state not in _UNFINISHED:
                return after
            deadline.back_off(backoff)

    def abort_transaction(self, spec: AbortTransactionSpec, timeout_ms: int | None = None) -> None:
        """Abort a hanging transaction: write an ABORT marker straight to the
        partition (Kafka's Admin.abortTransaction). The partition refuses it,
        changing nothing, unless the producer has an open transaction there
        with ``spec.producer_epoch``, and fences it if ``spec.coordinator_epoch``
        is older than the last it has seen for the producer.

        First the coordinators are asked: when the producer's transaction of
        ``spec.producer_epoch`` was committed there (PrepareCommit or
        CompleteCommit, one epoch above it, or a transaction kept for a
        two-phase commit whose records carry it), the abort is refused, since on a
        partition whose COMMIT marker is late or was lost it would turn
        committed data into aborted data.

        Raises:
            InvalidTxnStateError: the producer has no open transaction there,
                or the coordinator committed it.
            InvalidProducerEpochError: its open transaction has another epoch.
            TransactionCoordinatorFencedError: ``spec.coordinator_epoch`` is too old.
            InvalidRequestError: an id or epoch out of range.
            UnknownTopicOrPartitionError: the topic or partition does not exist.
            KafkaTimeoutError: not done in time.
        """
        deadline = self._deadline("abort_transaction", timeout_ms)
        tp = TopicPartition(*spec.topic_partition)
        committing = self.list_transactions(
            states=("PrepareCommit", "CompleteCommit"), producer_ids=[spec.producer_id]
        )
        if committing:
            described = self.describe_transactions([t.transactional_id for t in committing])
            for found in described.values():
                records = (spec.producer_id, spec.producer_epoch)
                kept = (found.ongoing_txn_producer_id, found.ongoing_txn_producer_epoch)
                if (found.producer_id, found.producer_epoch - 1) == records or kept == records:
                    raise InvalidTxnStateError(
                        f"the coordinator committed this transaction (transactional id "
                        f"{found.transactional_id!r}, {found.state}); aborting it on "
                        f"{tp.topic}-{tp.partition} would lose committed data. Its COMMIT "
                        "marker is owed there: see `raftcoord txn describe`"
                    )
        marker = partition_log_pb2.TxnMarker(
            producer_id=spec.producer_id,
            # A marker's epoch is one above its transaction's data epoch.
            producer_epoch=spec.producer_epoch + 1,
            coordinator_epoch=spec.coordinator_epoch,
            result=common_pb2.ABORT,
            topics=topic_partitions([tp]),
            admin_abort=True,
        )
        self._on_partition_nodes(
            [tp],
            "WriteTxnMarkers",
            lambda tps: partition_log_pb2.WriteTxnMarkersRequest(markers=[marker]),
            lambda answer: [p for m in answer.markers for p in m.partitions],
            deadline,
        )

    def _on_partition_nodes(
        self,
        partitions: Iterable[TopicPartition],
        method: str,
        request_of: Callable[[list[TopicPartition]], Any],
        results_of: Callable[[Any], Iterable[Any]],
        deadline: Deadline,
    ) -> dict[TopicPartition, Any]:
        """Call ``method`` on the nodes owning ``partitions`` (one request per
        node) until every partition has answered NONE; the per-partition
        results (with topic, partition, error_code, error_message) by partition.
        Stale placement and retriable errors are retried within ``deadline``;
        other errors are raised."""
        pending = list(dict.fromkeys(TopicPartition(*tp) for tp in partitions))
        done: dict[TopicPartition, Any] = {}
        backoff = self._coordinators.backoff()
        last: KafkaError | None = None
        while pending:
            if any(self._metadata.leader(tp) is None for tp in pending):
                self._metadata.refresh(deadline, {tp.topic for tp in pending})
            by_node: dict[str, list[TopicPartition]] = {}
            for tp in pending:
                count = self._metadata.partition_count(tp.topic)
                if count is None or not 0 <= tp.partition < count:
                    raise UnknownTopicOrPartitionError(f"no partition {tp.topic}-{tp.partition}")
                address = self._metadata.leader(tp)
                if address is not None:
                    by_node.setdefault(address, []).append(tp)
            for address, tps in by_node.items():
                stub = self._channels.partition_log(address)
                try:
                    answer = getattr(stub, method)(
                        request_of(tps), timeout=deadline.attempt(ATTEMPT_TIMEOUT_S)
                    )
                except grpc.RpcError as exc:
                    last = transport_error(exc, address)
                    self._metadata.request_update()
                    continue
                for result in results_of(answer):
                    tp = TopicPartition(result.topic, result.partition)
                    if result.error_code == ErrorCode.NONE:
                        done[tp] = result
                        continue
                    error = error_for(
                        result.error_code,
                        f"{tp.topic}-{tp.partition}: {result.error_message or 'refused'}",
                    )
                    if not isinstance(error, RetriableError):
                        raise error
                    last = error
                    self._metadata.request_update()
            pending = [tp for tp in pending if tp not in done]
            if pending:
                deadline.back_off(backoff, last)
        return done


def _raise_first_failure(
    results: Iterable[Any], message: Callable[[Any], str] = lambda r: str(r.error_message)
) -> None:
    """Raise the error of the first of ``results`` (each with an
    ``error_code``) that failed, with ``message`` of it."""
    failed = next((r for r in results if r.error_code != ErrorCode.NONE), None)
    if failed is not None:
        raise error_for(failed.error_code, message(failed))


#: States a terminated transaction passes through before it is complete.
_UNFINISHED = frozenset({"Ongoing", "PrepareAbort", "PrepareCommit", "PrepareEpochFence"})


def _first_description_error(answer: Any) -> int:
    if not answer.transactions:
        return int(ErrorCode.UNKNOWN_SERVER_ERROR)
    return int(answer.transactions[0].error_code)


def _first_group_error(answer: Any) -> int:
    if not answer.groups:
        return int(ErrorCode.UNKNOWN_SERVER_ERROR)
    return int(answer.groups[0].error_code)


def _group_description(g: Any) -> ConsumerGroupDescription:
    return ConsumerGroupDescription(
        group_id=g.group_id,
        state=g.state,
        protocol_type=g.protocol_type,
        partition_assignor=g.protocol_name,
        generation_id=int(g.generation_id),
        leader=g.leader,
        members=tuple(
            MemberDescription(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id or None,
                client_id=m.client_id,
                assignment=bytes(m.assignment),
            )
            for m in g.members
        ),
    )


def _description(d: Any) -> TransactionDescription:
    return TransactionDescription(
        transactional_id=d.transactional_id,
        state=_state_name(d.state),
        producer_id=int(d.producer_id),
        producer_epoch=int(d.producer_epoch),
        transaction_timeout_ms=int(d.transaction_timeout_ms),
        transaction_start_time_ms=int(d.transaction_start_time_ms),
        last_update_time_ms=int(d.last_update_time_ms),
        partitions=frozenset(TopicPartition(t.topic, p) for t in d.topics for p in t.partitions),
        groups=frozenset(d.groups),
        coordinator_epoch=int(d.coordinator_epoch),
        pending_markers=tuple(_pending_marker(m) for m in d.pending_markers),
        two_phase_commit=bool(d.two_phase_commit),
        ongoing_txn_producer_id=(
            int(d.ongoing_txn_producer_id) if d.HasField("ongoing_txn_producer_id") else -1
        ),
        ongoing_txn_producer_epoch=(
            int(d.ongoing_txn_producer_epoch) if d.HasField("ongoing_txn_producer_epoch") else -1
        ),
    )


def _pending_marker(m: Any) -> PendingMarker:
    return PendingMarker(
        partition=None if m.group_id else TopicPartition(m.topic, m.partition),
        group_id=m.group_id or None,
        last_error=_error_name(int(m.last_error_code)),
        last_error_message=m.last_error_message,
    )


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)
