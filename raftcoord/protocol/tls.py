"""TLS on every gRPC connection, and who is calling.

A cluster whose config has a ``[tls]`` table (:class:`raftcoord.protocol.config.TlsConfig`)
serves gRPC only over mutual TLS: every server asks for a client
certificate signed by the cluster's CA, and every channel presents one and
checks the server's against the CA and the address dialled. The caller's
*principal* is its certificate's subject common name, as Kafka's default
``ssl.principal.mapping.rules`` make it: ``User:<CN>``.

Node processes present the certificate of ``node-<id>`` (principal
``User:node-<id>``, for every node id in the config); the principals in
``super_users`` may act as the cluster too (an operator's admin
certificate). The RPCs only the cluster itself sends (markers, the
partition nodes' batched adds, their directory and offset records) answer
anyone else CLUSTER_AUTHORIZATION_FAILED (:func:`cluster_refusal`).
Without ``[tls]`` every caller is ``User:ANONYMOUS`` and nothing is checked:
a cluster for a lab only.

With ``[tls]`` the authorizer is on (:class:`Authorizer`): every client
request is checked against the cluster's ACLs (:mod:`raftcoord.protocol.acl`,
kept in shard 0). A node acts as the cluster unless it names the principal
it acts for in the :data:`PRINCIPAL_HEADER` of a call (the Kafka gateway for
its clients, a coordinator forwarding a client's request); only a node's or
a super user's call may name one, anyone else's header is ignored.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict
from urllib.parse import quote, unquote

import grpc

from raftcoord.protocol.acl import (
    EMPTY_INDEX,
    Acl,
    AclIndex,
    Operation,
    Principal,
    ResourceType,
    allowed_on_some,
    authorized,
)
from raftcoord.protocol.config import ClusterConfig
from raftcoord.protocol.process import LogLimiter

ANONYMOUS = "User:ANONYMOUS"
#: The operator's certificate (a super user) beside the nodes' in a ``[tls]``
#: cert_dir: what ``cluster up --tls`` makes and deploy/ names.
ADMIN_CERT_NAME = "admin"
#: The principal a node's call acts for (and the client's address).
PRINCIPAL_HEADER = "x-raftcoord-principal"
CLIENT_HOST_HEADER = "x-raftcoord-client-host"
#: Authorization failures logged per second, at most.
DENIALS_LOGGED_PER_S = 10.0

log = logging.getLogger("raftcoord.authorizer")


class SslFiles(TypedDict, total=False):
    """A client's TLS files as the client library takes them (Kafka's names)."""

    ssl_cafile: str
    ssl_certfile: str
    ssl_keyfile: str


def node_principal(node_id: int) -> str:
    """The principal of node ``node_id``'s certificate (common name ``node-<id>``)."""
    return f"User:{node_common_name(node_id)}"


def node_common_name(node_id: int) -> str:
    return f"node-{node_id}"


@dataclass(frozen=True)
class Identity:
    """What one process presents and trusts: the CA's certificate, its own
    certificate and key (PEM bytes)."""

    ca: bytes
    cert: bytes
    key: bytes

    @classmethod
    def load(cls, ca_file: Path, cert_file: Path, key_file: Path) -> Identity:
        """Read the three PEM files.

        Raises:
            OSError: one cannot be read.
        """
        return cls(ca_file.read_bytes(), cert_file.read_bytes(), key_file.read_bytes())

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True
        )


def add_port(server: grpc.Server, address: str, identity: Identity | None) -> int:
    """Listen on ``address``: mutual TLS with ``identity``, else plaintext
    (a config without ``[tls]``). Returns the port, 0 when it cannot listen."""
    if identity is None:
        return int(server.add_insecure_port(address))
    return int(server.add_secure_port(address, identity.server_credentials()))


def node_identity(config: ClusterConfig, node_id: int) -> Identity | None:
    """The identity node ``node_id`` presents, or None without ``[tls]``.

    Raises:
        OSError: a file of its identity cannot be read.
    """
    tls = config.tls
    if tls is None:
        return None
    cert, key = tls.node_files(node_id)
    return Identity.load(tls.ca_file, cert, key)


def node_files_error(config: ClusterConfig, node_id: int) -> str | None:
    """Why node ``node_id`` cannot read the files of its identity, naming the
    ``[tls]`` key that points at the one it cannot read; None when it can
    (or without ``[tls]``)."""
    tls = config.tls
    if tls is None:
        return None
    cert, key = tls.node_files(node_id)
    for where, path in (("ca_file", tls.ca_file), ("cert_dir", cert), ("cert_dir", key)):
        try:
            path.open("rb").close()
        except OSError as exc:
            return f"[tls] {where}: cannot read {path} ({exc.strerror or exc})"
    return None


def node_ssl_context(config: ClusterConfig, node_id: int, server: bool) -> ssl.SSLContext | None:
    """Mutual TLS for the connections that are not gRPC (the cluster links
    to partition-log nodes' replication addresses: followers' fetches,
    coordinators' markers): node ``node_id``'s certificate, the cluster's CA, a peer
    certificate required on both sides (and the server's checked against
    the address dialled). None without ``[tls]``.

    Raises:
        OSError, ssl.SSLError: a file of the identity cannot be read.
    """
    tls = config.tls
    if tls is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    cert, key = tls.node_files(node_id)
    context.load_cert_chain(cert, key)
    context.load_verify_locations(cafile=tls.ca_file)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def certificate_principal(peercert: Any) -> str | None:
    """``User:<CN>`` of a verified peer certificate (``getpeercert()``), or None."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for name, value in rdn:
            if name == "commonName":
                return f"User:{value}"
    return None


def principal(context: Any) -> str:
    """The principal of the caller of a gRPC call (its ``context``)."""
    names = context.auth_context().get("x509_common_name")
    if not names:
        return ANONYMOUS
    return f"User:{names[0].decode('utf-8', 'replace')}"


def node_refusal(config: ClusterConfig, who: str, node_id: int) -> str | None:
    """Why principal ``who`` may not make a request in the name of node
    ``node_id`` (answered CLUSTER_AUTHORIZATION_FAILED), or None: anyone
    without ``[tls]``; else that node's principal or a super user's. ``who``
    is the caller a coordinator acts for (:meth:`Authorizer.caller`): a
    request another coordinator forwards is the original caller's."""
    tls = config.tls
    if tls is None:
        return None
    if who == node_principal(node_id) or who in tls.super_users:
        return None
    return f"{who} may not act for node {node_id} (CLUSTER_AUTHORIZATION_FAILED)"


#: The node lists of a cluster config.
NodeKind = Literal["coordinators", "partition_nodes", "kafka_listeners"]


def cluster_principals(config: ClusterConfig) -> frozenset[str]:
    """The principals that act as the cluster: every node's and the super users'."""
    return senders(config, "coordinators", "partition_nodes", "kafka_listeners")


def senders(config: ClusterConfig, *kinds: NodeKind) -> frozenset[str]:
    """The principals of the nodes of ``kinds`` (the config's lists:
    ``coordinators``, ``partition_nodes``, ``kafka_listeners``) and the super
    users': who may send what only those nodes send."""
    ids = [n.node_id for kind in kinds for n in getattr(config, kind)]
    supers = config.tls.super_users if config.tls is not None else ()
    return frozenset({node_principal(i) for i in ids} | set(supers))


def _for_whom(config: ClusterConfig, own: str, acting: tuple[str, str] | None) -> str:
    """Whom a call of principal ``own`` naming ``acting`` (:func:`acting_for`)
    is for. Only a node of the cluster acts for another principal, and a node
    speaks only for itself: the principal of a node other than the caller is
    named only by a coordinator (forwarding the call of that node); named
    by any other, the call is the caller's own."""
    if acting is None or own not in cluster_principals(config):
        return own
    named = acting[0]
    if named != own and _is_node(config, named) and own not in senders(config, "coordinators"):
        return own
    return named


def _is_node(config: ClusterConfig, who: str) -> bool:
    return who in cluster_principals(config) and who not in senders(config)


def peer_host(context: Any) -> str:
    """The address of a gRPC call's peer (``127.0.0.1``), "" if unknown."""
    peer = str(context.peer() or "")
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return ""


def acting_for(who: Principal) -> list[tuple[str, str]]:
    """The call metadata with which a node acts for ``who`` (percent-encoded:
    gRPC metadata values are printable ASCII, names need not be)."""
    return [(PRINCIPAL_HEADER, quote(who.name, safe="")), (CLIENT_HOST_HEADER, quote(who.host))]


def _acting(context: Any) -> tuple[str, str] | None:
    """The principal and client address a call names (:func:`acting_for`), or None."""
    metadata = dict(context.invocation_metadata())
    name = metadata.get(PRINCIPAL_HEADER)
    if not name:
        return None
    return unquote(str(name)), unquote(str(metadata.get(CLIENT_HOST_HEADER) or ""))


def cluster_refusal(config: ClusterConfig, context: Any, *kinds: NodeKind) -> str | None:
    """Why the caller of a gRPC call may not send what only the cluster's
    nodes of ``kinds`` send (all kinds when none is named), answered
    CLUSTER_AUTHORIZATION_FAILED, or None when it may: anyone without
    ``[tls]``; else a principal of those nodes or a super user, the one the
    call is for when a node acts for another (:data:`PRINCIPAL_HEADER`,
    :func:`_for_whom`)."""
    if config.tls is None:
        return None
    who = _for_whom(config, principal(context), _acting(context))
    if who in (senders(config, *kinds) if kinds else cluster_principals(config)):
        return None
    return sender_refusal(who)


def sender_refusal(who: str | None) -> str:
    """The refusal of a call that principal ``who`` may not send."""
    return (
        f"{who or 'an unauthenticated caller'} may not call this: only the cluster's nodes "
        "that send it and super users may (CLUSTER_AUTHORIZATION_FAILED)"
    )


class Authorizer:
    """One node's decisions on its callers' requests: who a call is for
    (:meth:`caller`) and whether the ACLs let it (:meth:`allows`). Off (every
    call allowed, the caller anonymous) without ``[tls]``.

    ``bindings`` gives the ACLs as the node knows them now (a coordinator's
    replica of shard 0, a partition node's copy; None while it has none yet:
    then only the cluster is allowed, also with
    ``allow_everyone_if_no_acl_found``); the index is rebuilt when they
    change. The nodes' own principals and the super users may do anything;
    denials are logged (``event=authorization_failed``, at most
    :data:`DENIALS_LOGGED_PER_S` a second).
    """

    def __init__(
        self, config: ClusterConfig, bindings: Callable[[], frozenset[Acl] | None]
    ) -> None:
        self.config = config
        self.enabled = config.tls is not None
        self._bindings = bindings
        self._source: frozenset[Acl] = frozenset()
        self._index = EMPTY_INDEX
        self._cluster = cluster_principals(config)
        self._allow_if_no_acl = (
            config.tls.allow_everyone_if_no_acl_found if config.tls is not None else True
        )
        self._log_limit = LogLimiter(DENIALS_LOGGED_PER_S)

    def index(self) -> AclIndex | None:
        """The ACLs indexed, None while they are not known."""
        bindings = self._bindings()
        if bindings is None:
            return None
        if bindings is not self._source:
            self._index, self._source = AclIndex(bindings), bindings
        return self._index

    def caller(self, context: Any) -> Principal:
        """Who the call of ``context`` is for: the principal a node's call
        names in its metadata, else the caller's own."""
        if not self.enabled:
            return Principal(ANONYMOUS, "")
        host = peer_host(context)
        own = principal(context)
        if own not in self._cluster:  # a client names nobody: the usual case, kept cheap
            return Principal(own, host)
        acting = _acting(context)
        who = _for_whom(self.config, own, acting)
        if who != own and acting is not None:
            return Principal(who, acting[1] or host)
        return Principal(own, host)

    def acts_as_cluster(self, who: Principal) -> bool:
        """Whether ``who`` (a call's :meth:`caller`) is a node or a super user:
        the caller a request is for, so that a node forwarding a client's
        request does not lend the client its rights."""
        return not self.enabled or who.name in self._cluster

    def allows(
        self,
        who: Principal,
        operation: Operation,
        resource_type: ResourceType,
        name: str,
        log_denial: bool = True,
    ) -> bool:
        """Whether ``who`` may do ``operation`` on the resource."""
        if not self.enabled or who.name in self._cluster:
            return True
        index = self.index()
        allowed = index is not None and authorized(
            index, who, operation, resource_type, name, (), self._allow_if_no_acl
        )
        if not allowed and log_denial:
            self._denied(who, operation, f"{resource_type.name} {name!r}")
        return allowed

    def allows_on_some(
        self, who: Principal, operation: Operation, resource_type: ResourceType
    ) -> bool:
        """Whether ``who`` may do ``operation`` on some resource of the type
        (:func:`raftcoord.protocol.acl.allowed_on_some`)."""
        if not self.enabled or who.name in self._cluster:
            return True
        index = self.index()
        allowed = index is not None and allowed_on_some(index, who, operation, resource_type)
        if not allowed:
            self._denied(who, operation, f"any {resource_type.name}")
        return allowed

    def filter(
        self,
        who: Principal,
        operation: Operation,
        resource_type: ResourceType,
        names: Iterable[str],
    ) -> list[str]:
        """The names of ``names`` that ``who`` may ``operation`` (no log lines:
        a listing leaves out what the caller may not see)."""
        if not self.enabled or who.name in self._cluster:
            return list(names)
        index = self.index()
        if index is None:
            return []
        return [
            n
            for n in names
            if authorized(index, who, operation, resource_type, n, (), self._allow_if_no_acl)
        ]

    def _denied(self, who: Principal, operation: Operation, resource: str) -> None:
        if self._log_limit.allow():
            log.warning(
                "event=authorization_failed principal=%r host=%r operation=%s resource=%s",
                who.name,
                who.host,
                operation.name,
                resource,
            )
