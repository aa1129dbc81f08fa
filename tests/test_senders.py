"""Who a call is for and who may send what only some of the cluster's nodes
send: a node speaks only for itself (only a coordinator, forwarding, names
another node), markers come from coordinators, fetches and batched adds
from partition nodes. Pure: calls are stand-ins for gRPC's context."""

from __future__ import annotations

import pytest

from raftcoord.protocol.acl import Principal
from raftcoord.protocol.config import parse_config
from raftcoord.protocol.tls import (
    Authorizer,
    acting_for,
    cluster_refusal,
    node_refusal,
    senders,
)

CONFIG = parse_config(
    {
        "shard_count": 1,
        "coordinators": [
            {"id": i, "grpc": f"127.0.0.1:70{i}0", "raft": [f"127.0.0.1:71{i}0"]} for i in (1, 2)
        ],
        "partition_nodes": [{"id": i, "grpc": f"127.0.0.1:7{i}"} for i in (101, 102)],
        "kafka_listeners": [{"id": 201, "address": "127.0.0.1:9092"}],
        "tls": {"ca_file": "ca.pem", "cert_dir": "tls", "super_users": ["User:admin"]},
    }
)


class Call:
    """A gRPC call of ``who``'s certificate, naming ``acting`` if given."""

    def __init__(self, who: str, acting: str | None = None) -> None:
        self.who = who
        self.metadata = acting_for(Principal(acting, "10.0.0.9")) if acting else []

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_common_name": [self.who.encode()]}

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.metadata

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"


def test_markers_come_from_coordinators_and_fetches_from_partition_nodes() -> None:
    assert cluster_refusal(CONFIG, Call("node-1"), "coordinators") is None
    assert cluster_refusal(CONFIG, Call("admin"), "coordinators") is None
    for who in ("node-101", "node-201", "client"):
        refused = cluster_refusal(CONFIG, Call(who), "coordinators")
        assert refused is not None and f"User:{who} may not call this" in refused
    assert cluster_refusal(CONFIG, Call("node-102"), "partition_nodes") is None
    assert cluster_refusal(CONFIG, Call("node-1"), "partition_nodes") is not None
    assert cluster_refusal(CONFIG, Call("node-201")) is None  # any node of the cluster
    assert senders(CONFIG, "kafka_listeners") == {"User:node-201", "User:admin"}


@pytest.mark.parametrize(
    ("caller", "named", "for_whom"),
    [
        ("node-1", "User:node-101", "User:node-101"),  # a coordinator forwarding a node's call
        ("node-1", "User:client", "User:client"),
        ("node-201", "User:client", "User:client"),  # a gateway acting for its client
        ("node-201", "User:admin", "User:admin"),
        ("node-201", "User:node-101", "User:node-201"),  # a gateway never speaks for a node
        ("node-102", "User:node-101", "User:node-102"),  # nor another partition node
        ("node-101", "User:node-101", "User:node-101"),
        ("client", "User:node-101", "User:client"),  # a client names nobody
    ],
)
def test_a_node_speaks_only_for_itself(caller: str, named: str, for_whom: str) -> None:
    call = Call(caller, named)
    assert Authorizer(CONFIG, lambda: frozenset()).caller(call).name == for_whom
    refused = cluster_refusal(CONFIG, call, "partition_nodes")
    assert (refused is None) == (for_whom in senders(CONFIG, "partition_nodes"))


def test_another_nodes_directory_cannot_be_recorded_by_naming_it() -> None:
    """Node 102's certificate naming node 101 in the principal header: the
    call is node 102's, which may not act for node 101."""
    who = Authorizer(CONFIG, lambda: frozenset()).caller(Call("node-102", "User:node-101"))
    assert node_refusal(CONFIG, who.name, 101) is not None
    assert node_refusal(CONFIG, who.name, 102) is None
