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
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import grpc

from raftcoord.protocol.config import ClusterConfig

ANONYMOUS = "User:ANONYMOUS"


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


def principal(context: Any) -> str:
    """The principal of the caller of a gRPC call (its ``context``)."""
    names = context.auth_context().get("x509_common_name")
    if not names:
        return ANONYMOUS
    return f"User:{names[0].decode('utf-8', 'replace')}"


def node_refusal(config: ClusterConfig, context: Any, node_id: int) -> str | None:
    """Why the caller may not make a request in the name of node ``node_id``
    (answered CLUSTER_AUTHORIZATION_FAILED), or None: anyone without
    ``[tls]``; else that node's principal or a super user's."""
    tls = config.tls
    if tls is None:
        return None
    who = principal(context)
    if who == node_principal(node_id) or who in tls.super_users:
        return None
    return f"{who} may not act for node {node_id} (CLUSTER_AUTHORIZATION_FAILED)"


def cluster_refusal(config: ClusterConfig, context: Any) -> str | None:
    """Why the caller of a gRPC call may not send what only the cluster sends
    (answered CLUSTER_AUTHORIZATION_FAILED), or None when it may: anyone
    without ``[tls]``; else a node's principal or a super user's."""
    tls = config.tls
    if tls is None:
        return None
    who = principal(context)
    if who in tls.super_users:
        return None
    ids = [n.node_id for n in (*config.coordinators, *config.partition_nodes)]
    ids += [k.node_id for k in config.kafka_listeners]
    if who in {node_principal(i) for i in ids}:
        return None
    return (
        f"{who} may not call this: only the cluster's nodes and super users "
        "may (CLUSTER_AUTHORIZATION_FAILED)"
    )
