"""SCRAM credentials as the cluster stores them (raftcoord.protocol.scram):
the keys derived from the salted password that AlterUserScramCredentials
carries are the ones scramp derives from the password."""

from __future__ import annotations

import os

import pytest
from scramp import ScramMechanism

from raftcoord.protocol.scram import (
    MECHANISMS,
    ScramCredential,
    credential,
    password_matches,
    salted_password,
)

SALT = os.urandom(32)


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_the_stored_keys_are_scramps_for_the_same_password(mechanism: str) -> None:
    salt, stored_key, server_key, iterations = ScramMechanism(mechanism).make_auth_info(
        "s3cret pass", iteration_count=8192, salt=SALT
    )
    made = credential(mechanism, salted_password(mechanism, "s3cret pass", SALT, 8192), SALT, 8192)
    assert made == ScramCredential(salt, iterations, stored_key, server_key)
    assert password_matches(mechanism, "s3cret pass", made)
    assert not password_matches(mechanism, "s3cret pas", made)
