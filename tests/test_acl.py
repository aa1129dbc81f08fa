"""The authorizer's decisions and the ACLs in shard 0's state (pure)."""

from __future__ import annotations

import msgpack
import pytest

from fsm import CreateAcls, DeleteAcls, ErrorCode, TransactionStateMachine
from fsm.config import FsmConfig
from fsm.limits import request_refusal
from raftcoord.protocol.acl import (
    CLUSTER_NAME,
    Acl,
    AclFilter,
    AclIndex,
    Operation,
    PatternType,
    Permission,
    Principal,
    ResourceType,
    allowed_on_some,
    authorized,
    binding_error,
)

ALICE = Principal("User:alice", "127.0.0.1")
BOB = Principal("User:bob", "127.0.0.2")
T, G, X, C = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.TRANSACTIONAL_ID,
    ResourceType.CLUSTER,
)


def acl(
    rtype: ResourceType,
    name: str,
    principal: str,
    operation: Operation,
    permission: Permission = Permission.ALLOW,
    pattern: PatternType = PatternType.LITERAL,
    host: str = "*",
) -> Acl:
    return Acl(rtype, pattern, name, principal, host, operation, permission)


def test_nothing_is_allowed_without_a_binding_unless_configured() -> None:
    index = AclIndex(())
    assert not authorized(index, ALICE, Operation.READ, T, "orders")
    assert authorized(index, ALICE, Operation.READ, T, "orders", allow_if_no_acl=True)
    assert authorized(index, ALICE, Operation.READ, T, "orders", super_users=["User:alice"])


def test_a_resource_with_bindings_is_closed_to_everyone_else_even_when_open_by_default() -> None:
    index = AclIndex([acl(T, "orders", "User:alice", Operation.WRITE)])
    assert authorized(index, ALICE, Operation.WRITE, T, "orders", allow_if_no_acl=True)
    assert not authorized(index, BOB, Operation.WRITE, T, "orders", allow_if_no_acl=True)
    assert authorized(index, BOB, Operation.WRITE, T, "other", allow_if_no_acl=True)


def test_literal_wildcard_and_prefixed_names() -> None:
    index = AclIndex(
        [
            acl(T, "orders", "User:alice", Operation.READ),
            acl(G, "*", "User:alice", Operation.READ),
            acl(X, "bob-", "User:bob", Operation.WRITE, pattern=PatternType.PREFIXED),
        ]
    )
    assert authorized(index, ALICE, Operation.READ, T, "orders")
    assert not authorized(index, ALICE, Operation.READ, T, "orders2")
    assert authorized(index, ALICE, Operation.READ, G, "any-group")
    assert authorized(index, BOB, Operation.WRITE, X, "bob-1")
    assert authorized(index, BOB, Operation.WRITE, X, "bob-")
    assert not authorized(index, BOB, Operation.WRITE, X, "bo")
    assert not authorized(index, BOB, Operation.WRITE, X, "alice-1")


def test_deny_wins_and_all_stands_for_every_operation() -> None:
    index = AclIndex(
        [
            acl(T, "*", "User:*", Operation.ALL),
            acl(T, "secret", "User:bob", Operation.READ, Permission.DENY),
            acl(T, "locked", "User:*", Operation.ALL, Permission.DENY),
        ]
    )
    assert authorized(index, BOB, Operation.WRITE, T, "secret")
    assert not authorized(index, BOB, Operation.READ, T, "secret")
    assert authorized(index, ALICE, Operation.READ, T, "secret")
    assert not authorized(index, ALICE, Operation.DESCRIBE, T, "locked")


def test_read_write_delete_alter_imply_describe() -> None:
    for operation in (Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER):
        index = AclIndex([acl(T, "t", "User:alice", operation)])
        assert authorized(index, ALICE, Operation.DESCRIBE, T, "t")
        assert not authorized(index, ALICE, Operation.CREATE, T, "t")
    index = AclIndex([acl(T, "t", "User:alice", Operation.DESCRIBE)])
    assert not authorized(index, ALICE, Operation.READ, T, "t")
    # A DENY of DESCRIBE does not deny READ (Kafka's rule: denies are not implied).
    index = AclIndex(
        [
            acl(T, "t", "User:alice", Operation.READ),
            acl(T, "t", "User:alice", Operation.DESCRIBE, Permission.DENY),
        ]
    )
    assert authorized(index, ALICE, Operation.READ, T, "t")
    assert not authorized(index, ALICE, Operation.DESCRIBE, T, "t")


def test_hosts() -> None:
    index = AclIndex([acl(T, "t", "User:alice", Operation.READ, host="127.0.0.1")])
    assert authorized(index, ALICE, Operation.READ, T, "t")
    assert not authorized(index, Principal("User:alice", "10.0.0.1"), Operation.READ, T, "t")


def test_idempotent_write_by_some_topic() -> None:
    index = AclIndex([acl(T, "a-", "User:alice", Operation.WRITE, pattern=PatternType.PREFIXED)])
    assert allowed_on_some(index, ALICE, Operation.WRITE, T)
    assert not allowed_on_some(index, BOB, Operation.WRITE, T)
    index = AclIndex(
        [
            acl(T, "a-", "User:alice", Operation.WRITE, pattern=PatternType.PREFIXED),
            acl(T, "*", "User:alice", Operation.WRITE, Permission.DENY),
        ]
    )
    assert not allowed_on_some(index, ALICE, Operation.WRITE, T)


@pytest.mark.parametrize(
    ("binding", "problem"),
    [
        (acl(ResourceType.ANY, "t", "User:a", Operation.READ), "cannot be bound"),
        (acl(T, "t", "User:a", Operation.READ, pattern=PatternType.MATCH), "LITERAL or PREFIXED"),
        (acl(T, "t", "User:a", Operation.READ, Permission.ANY), "ALLOW or DENY"),
        (acl(G, "g", "User:a", Operation.WRITE), "GROUP has no operation WRITE"),
        (acl(T, "", "User:a", Operation.READ), "must not be empty"),
        (acl(T, "t", "alice", Operation.READ), "User:<name>"),
        (acl(C, "other", "User:a", Operation.ALTER), CLUSTER_NAME),
        (acl(T, "*", "User:a", Operation.READ, pattern=PatternType.PREFIXED), "PREFIXED"),
        (acl(T, "x" * 2000, "User:a", Operation.READ), "longer than"),
    ],
)
def test_bindings_that_cannot_be_stored(binding: Acl, problem: str) -> None:
    message = binding_error(binding)
    assert message is not None and problem in message
    refusal = request_refusal(CreateAcls((binding,), 0), FsmConfig())
    assert refusal is not None and refusal[0] is ErrorCode.INVALID_REQUEST
    machine = TransactionStateMachine(0, 1)
    assert machine.apply(CreateAcls((binding,), 0)).error is ErrorCode.INVALID_REQUEST
    assert machine.state.acls == frozenset()


def test_filters_select_as_kafka_does() -> None:
    a = acl(T, "orders", "User:alice", Operation.READ)
    b = acl(T, "ord", "User:bob", Operation.WRITE, pattern=PatternType.PREFIXED)
    c = acl(G, "*", "User:bob", Operation.READ)
    every = [a, b, c]
    assert [x for x in every if AclFilter().matches(x)] == every
    assert [x for x in every if AclFilter(principal="User:bob").matches(x)] == [b, c]
    match = AclFilter(T, PatternType.MATCH, "orders")
    assert [x for x in every if match.matches(x)] == [a, b]
    literal = AclFilter(T, PatternType.LITERAL, "ord")
    assert [x for x in every if literal.matches(x)] == []
    assert [x for x in every if AclFilter(operation=Operation.WRITE).matches(x)] == [b]


def test_the_machine_adds_and_removes_acls_and_snapshots_them() -> None:
    machine = TransactionStateMachine(0, 1)
    a = acl(T, "orders", "User:alice", Operation.READ)
    b = acl(G, "g", "User:bob", Operation.READ)
    assert machine.apply(CreateAcls((a, b), 0)).ok
    assert machine.apply(CreateAcls((a,), 0)).ok  # again: no change
    assert machine.state.acls == {a, b}
    restored = TransactionStateMachine.restore(machine.snapshot())
    assert restored.state == machine.state
    outcome = machine.apply(DeleteAcls((AclFilter(principal="User:bob"), AclFilter()), 0))
    assert outcome.deleted == ((b,), (a,))
    assert machine.state.acls == frozenset()


def test_a_snapshot_from_before_acls_restores_without_any() -> None:
    machine = TransactionStateMachine(0, 1)
    payload = msgpack.unpackb(machine.snapshot(), raw=False)
    assert payload.pop("acls") == [] and payload.pop("scram") == []
    payload["v"] = 3
    restored = TransactionStateMachine.restore(msgpack.packb(payload, use_bin_type=True))
    assert restored.state == machine.state
