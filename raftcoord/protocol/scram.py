"""SCRAM credentials (RFC 5802/7677) as Kafka stores them: per user and
mechanism a salt, an iteration count and the stored and server keys; never
the password. Pure: no I/O.

The Kafka gateways run the SCRAM exchange with the ``scramp`` library from
these; a SASL PLAIN password is checked against the same credential
(:func:`password_matches`), so one store serves both mechanisms.

The keys are derived here, and only here: AlterUserScramCredentials carries
the salted password, not the password (Kafka's admin client salts it), and
``scramp.ScramMechanism.make_auth_info`` starts from the password; the pure
core checks credentials too, and importing ``scramp`` would bring ``ssl``
and ``asn1crypto`` into it. A test holds the keys to scramp's for the same
password, salt and iterations.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final, NamedTuple

#: Mechanism -> its hash (Kafka's ScramMechanism).
MECHANISMS: Final = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
#: Kafka's bounds on a credential's iterations.
MIN_ITERATIONS: Final = 4096
MAX_ITERATIONS: Final = 16384
#: The longest SCRAM user name, in characters.
MAX_USER_CHARS: Final = 256


class ScramCredential(NamedTuple):
    """What a cluster keeps of one user's password for one mechanism."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """SCRAM's SaltedPassword (PBKDF2 with the mechanism's hash)."""
    return hashlib.pbkdf2_hmac(MECHANISMS[mechanism], password.encode(), salt, iterations)


def credential(mechanism: str, salted: bytes, salt: bytes, iterations: int) -> ScramCredential:
    """The credential of a salted password (what AlterUserScramCredentials carries)."""
    digest = MECHANISMS[mechanism]
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    stored_key = hashlib.new(digest, client_key).digest()
    server_key = hmac.new(salted, b"Server Key", digest).digest()
    return ScramCredential(salt, iterations, stored_key, server_key)


def password_matches(mechanism: str, password: str, stored: ScramCredential) -> bool:
    """Whether ``password`` is the one ``stored`` was made from (constant time)."""
    salted = salted_password(mechanism, password, stored.salt, stored.iterations)
    made = credential(mechanism, salted, stored.salt, stored.iterations)
    return hmac.compare_digest(made.stored_key, stored.stored_key)


def credential_error(user: str, mechanism: str, iterations: int, salt: bytes) -> str | None:
    """Why a credential cannot be stored (Kafka's checks), or None."""
    if not user or len(user) > MAX_USER_CHARS:
        return f"a user name is 1..{MAX_USER_CHARS} characters"
    if mechanism not in MECHANISMS:
        return f"unknown mechanism {mechanism[:40]!r} (known: {sorted(MECHANISMS)})"
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        return f"iterations must be in {MIN_ITERATIONS}..{MAX_ITERATIONS}, got {iterations}"
    if not 16 <= len(salt) <= 128:
        return "the salt must be 16..128 bytes"
    return None
