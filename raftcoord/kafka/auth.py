"""Who a Kafka client is at a gateway's listener (its ``security_protocol``).

* PLAINTEXT: no one is authenticated; every client is ``User:ANONYMOUS``.
* SSL: TLS with a client certificate of the cluster's CA (required); the
  principal is the certificate's ``User:<CN>``, as on the gRPC ports.
* SASL_SSL: TLS (the server's certificate only), then SASL (Kafka's
  SaslHandshake v1 and SaslAuthenticate): PLAIN or SCRAM-SHA-256/512
  against the SCRAM credentials the coordinators keep (``raftcoord user
  add``); the principal is ``User:<name>``. Until it succeeds only
  ApiVersions and SASL requests are served; a failure is answered
  SASL_AUTHENTICATION_FAILED and the connection closed.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from scramp import ScramException, ScramMechanism

from raftcoord.kafka.backend import Backend
from raftcoord.protocol.config import ClusterConfig, KafkaListener
from raftcoord.protocol.errors import ErrorCode
from raftcoord.protocol.scram import MECHANISMS, ScramCredential, password_matches
from raftcoord.protocol.tls import cluster_principals
from raftcoord.protocol.v1 import coordinator_pb2

#: What a SASL_SSL listener offers its clients.
SASL_MECHANISMS = ("PLAIN", *sorted(MECHANISMS))
#: The longest SASL message accepted (a SCRAM or PLAIN exchange is tiny).
MAX_SASL_BYTES = 4096

#: (user, mechanism) -> the user's SCRAM credential, or None.
CredentialLookup = Callable[[str, str], Awaitable[ScramCredential | None]]


def server_context(config: ClusterConfig, listener: KafkaListener) -> ssl.SSLContext | None:
    """The TLS side of ``listener`` (None for PLAINTEXT): the gateway's node
    certificate; client certificates of the cluster's CA required (SSL), not
    asked for (SASL_SSL: SASL says who the client is).

    Raises:
        OSError: a file of the gateway's identity cannot be read.
    """
    if listener.security_protocol == "PLAINTEXT" or config.tls is None:
        return None
    cert, key = config.tls.node_files(listener.node_id)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(config.tls.ca_file))
    context.load_cert_chain(str(cert), str(key))
    context.verify_mode = (
        ssl.CERT_REQUIRED if listener.security_protocol == "SSL" else ssl.CERT_NONE
    )
    return context


async def stored_credential(backend: Backend, user: str, mechanism: str) -> ScramCredential | None:
    """``user``'s SCRAM credential for ``mechanism`` from the coordinators, or None."""
    answer = await backend.accepting_coordinator(
        "DescribeUserScramCredentials",
        coordinator_pb2.DescribeUserScramCredentialsRequest(users=[user], include_keys=True),
    )
    for described in answer.results:
        for found in described.credentials:
            if described.user == user and found.mechanism == mechanism and found.stored_key:
                return ScramCredential(
                    found.salt, found.iterations, found.stored_key, found.server_key
                )
    return None


class SaslExchange:
    """One connection's SASL authentication."""

    def __init__(
        self,
        config: ClusterConfig,
        listener: KafkaListener,
        lookup: CredentialLookup,
    ) -> None:
        self._lookup = lookup
        self._cluster = cluster_principals(config)
        offered: list[str] = []
        if listener.security_protocol == "SASL_SSL":
            offered += SASL_MECHANISMS
        self.offered = tuple(offered)
        self.mechanism: str | None = None
        #: Set once the exchange succeeded: who the client is.
        self.principal: str | None = None
        self._scram: Any = None
        self._user = ""

    def handshake(self, mechanism: str) -> ErrorCode:
        """SaslHandshake: choose ``mechanism``."""
        if self.mechanism is not None or self.principal is not None:
            return ErrorCode.ILLEGAL_SASL_STATE
        if mechanism not in self.offered:
            return ErrorCode.UNSUPPORTED_SASL_MECHANISM
        self.mechanism = mechanism
        return ErrorCode.NONE

    async def authenticate(self, auth_bytes: bytes) -> tuple[ErrorCode, str, bytes]:
        """SaslAuthenticate: (error, message, the server's bytes). Sets
        :attr:`principal` when the exchange is complete."""
        if self.mechanism is None or self.principal is not None:
            return ErrorCode.ILLEGAL_SASL_STATE, "SaslHandshake first, once", b""
        if len(auth_bytes) > MAX_SASL_BYTES:
            return ErrorCode.SASL_AUTHENTICATION_FAILED, "authentication failed", b""
        try:
            if self.mechanism == "PLAIN":
                return await self._plain(auth_bytes)
            return await self._scram_step(auth_bytes)
        except (ScramException, UnicodeDecodeError, ValueError) as exc:
            return ErrorCode.SASL_AUTHENTICATION_FAILED, f"authentication failed: {exc}", b""

    async def _plain(self, auth_bytes: bytes) -> tuple[ErrorCode, str, bytes]:
        authzid, user, password = auth_bytes.decode().split("\0")
        if authzid not in ("", user):
            raise ValueError("PLAIN: the authorization id must be the user or empty")
        for mechanism in sorted(MECHANISMS):
            stored = await self._lookup(user, mechanism)
            if stored is not None and await _matches(mechanism, password, stored):
                self.principal = self._client(user)
                return ErrorCode.NONE, "", b""
        raise ValueError("PLAIN: wrong user name or password")

    async def _scram_step(self, auth_bytes: bytes) -> tuple[ErrorCode, str, bytes]:
        assert self.mechanism is not None
        message = auth_bytes.decode()
        if self._scram is None:  # client-first: look the user's credential up first
            self._user = _scram_user(message)
            stored = await self._lookup(self._user, self.mechanism)
            if stored is None:
                raise ValueError(f"{self.mechanism}: wrong user name or password")
            self._scram = ScramMechanism(self.mechanism).make_server(
                lambda _user: (stored.salt, stored.stored_key, stored.server_key, stored.iterations)
            )
            self._scram.set_client_first(message)
            return ErrorCode.NONE, "", self._scram.get_server_first().encode()
        self._scram.set_client_final(message)
        final = self._scram.get_server_final().encode()
        self.principal = self._client(self._user)
        return ErrorCode.NONE, "", final

    def _client(self, user: str) -> str:
        """The principal of SASL user ``user``; never one of the cluster's
        (a user named like a node does not act as one)."""
        principal = f"User:{user}"
        if principal in self._cluster:
            raise ValueError(f"SASL user {user!r} is named like a node or super user")
        return principal


async def _matches(mechanism: str, password: str, stored: ScramCredential) -> bool:
    """:func:`password_matches` off the event loop (PBKDF2 takes milliseconds)."""
    return await asyncio.get_running_loop().run_in_executor(
        None, password_matches, mechanism, password, stored
    )


def _scram_user(client_first: str) -> str:
    """The user name of a SCRAM client-first message (``n,,n=<name>,r=...``)."""
    parts = client_first.split(",")
    if len(parts) < 4 or not parts[2].startswith("n="):
        raise ValueError("SCRAM: not a client-first message")
    return parts[2][2:].replace("=2C", ",").replace("=3D", "=")
