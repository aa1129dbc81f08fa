"""The Kafka gateway's pure parts of authentication and admission: the SASL
exchange against stored SCRAM credentials (PLAIN and SCRAM, with scramp's
client on the other side), the relay mechanism, and the per-address
connection creation rate."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from scramp import ScramClient

from raftcoord.kafka.auth import SaslExchange
from raftcoord.kafka.connections import CreationRate
from raftcoord.protocol.config import ClusterConfig, KafkaListener, NodeAddress, TlsConfig
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.scram import ScramCredential, credential, salted_password

SALT = os.urandom(32)
STORED = {
    ("alice", "SCRAM-SHA-256"): credential(
        "SCRAM-SHA-256", salted_password("SCRAM-SHA-256", "secret", SALT, 4096), SALT, 4096
    )
}
LISTENER = KafkaListener(201, "127.0.0.1:9092", "SASL_SSL")
CONFIG = ClusterConfig(
    1,
    (NodeAddress(1, "127.0.0.1:1", ("127.0.0.1:2",)),),
    kafka_listeners=(LISTENER,),
    tls=TlsConfig(Path("ca.pem"), Path("certs")),
)


async def lookup(user: str, mechanism: str) -> ScramCredential | None:
    return STORED.get((user, mechanism))


def exchange() -> SaslExchange:
    return SaslExchange(CONFIG, LISTENER, lookup)


def test_scram_with_the_right_password_names_the_user() -> None:
    sasl = exchange()
    assert sasl.handshake("SCRAM-SHA-256") is ErrorCode.NONE
    client = ScramClient(["SCRAM-SHA-256"], "alice", "secret")
    code, _, server_first = asyncio.run(sasl.authenticate(client.get_client_first().encode()))
    assert code is ErrorCode.NONE and sasl.principal is None
    client.set_server_first(server_first.decode())
    code, _, server_final = asyncio.run(sasl.authenticate(client.get_client_final().encode()))
    assert code is ErrorCode.NONE and sasl.principal == "User:alice"
    client.set_server_final(server_final.decode())  # the server proved it knows the key


@pytest.mark.parametrize(("user", "password"), [("alice", "guess"), ("mallory", "secret")])
def test_scram_with_a_wrong_password_or_user_fails(user: str, password: str) -> None:
    sasl = exchange()
    sasl.handshake("SCRAM-SHA-256")
    client = ScramClient(["SCRAM-SHA-256"], user, password)
    code, _, server_first = asyncio.run(sasl.authenticate(client.get_client_first().encode()))
    if code is ErrorCode.NONE:
        client.set_server_first(server_first.decode())
        code, _, _ = asyncio.run(sasl.authenticate(client.get_client_final().encode()))
    assert code is ErrorCode.SASL_AUTHENTICATION_FAILED and sasl.principal is None


def test_plain_checks_the_password_against_the_scram_credential() -> None:
    for password, principal in (("secret", "User:alice"), ("guess", None)):
        sasl = exchange()
        assert sasl.handshake("PLAIN") is ErrorCode.NONE
        asyncio.run(sasl.authenticate(f"\0alice\0{password}".encode()))
        assert sasl.principal == principal


def test_handshakes_are_in_order_and_no_unknown_mechanism_is_taken() -> None:
    assert exchange().handshake("RAFTCOORD-RELAY") is ErrorCode.UNSUPPORTED_SASL_MECHANISM
    sasl = exchange()
    assert sasl.handshake("PLAIN") is ErrorCode.NONE
    assert sasl.handshake("SCRAM-SHA-256") is ErrorCode.ILLEGAL_SASL_STATE
    asyncio.run(sasl.authenticate(b"\0alice\0secret"))
    assert sasl.principal == "User:alice"
    code, _, _ = asyncio.run(sasl.authenticate(b"again"))
    assert code is ErrorCode.ILLEGAL_SASL_STATE


def test_connection_creation_rate_per_address() -> None:
    rate = CreationRate(3)
    assert [rate.allow("a", now=10.0) for _ in range(4)] == [True, True, True, False]
    assert rate.allow("b", now=10.0)  # another address has its own bucket
    assert not rate.allow("a", now=10.2)
    assert rate.allow("a", now=10.4)  # a third of a second refills one
    assert all(CreationRate(-1).allow("a", now=0.0) for _ in range(1000))
