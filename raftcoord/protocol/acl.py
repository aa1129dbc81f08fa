"""Kafka's access control lists: the model, the checks of a new binding, and
the authorizer's decision. Pure: no I/O.

A binding allows or denies one principal (``User:<name>``, or ``User:*``
for everyone) one operation on resources of one type whose names match a
pattern: LITERAL (the name itself, or ``*`` for every name) or PREFIXED
(every name starting with it), from one host (``*``: any). The numbers are
Kafka's (``AclOperation``, ``ResourceType``, ``PatternType``,
``AclPermissionType``), so the Kafka gateway passes them through unchanged.

:func:`authorized` decides as Kafka's ``StandardAuthorizer`` does: a super
user may do anything; a DENY binding that matches wins over every ALLOW; an
ALLOW of READ, WRITE, DELETE or ALTER implies DESCRIBE (and ALTER_CONFIGS
implies DESCRIBE_CONFIGS); ALL stands for every operation; a resource no
binding names at all is allowed only with ``allow.everyone.if.no.acl.found``.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum
from typing import Final, NamedTuple

#: The name of the one CLUSTER resource (Kafka's).
CLUSTER_NAME: Final = "kafka-cluster"
#: A LITERAL name, principal or host that matches every one.
WILDCARD: Final = "*"
WILDCARD_PRINCIPAL: Final = "User:*"
#: The most bindings a cluster holds (each authorization reads them all
#: through an index; a bound keeps the replicated state small).
MAX_ACLS: Final = 10_000
#: The longest resource name, principal or host of a binding, in characters.
MAX_ACL_FIELD_CHARS: Final = 1024


class ResourceType(IntEnum):
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(IntEnum):
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    #: KIP-939: take part in a two-phase commit (on a transactional id).
    TWO_PHASE_COMMIT = 15


class Permission(IntEnum):
    ANY = 1
    DENY = 2
    ALLOW = 3


#: What an ALLOW of the key's operation allows besides itself.
_IMPLIES: Final = {
    Operation.READ: frozenset({Operation.DESCRIBE}),
    Operation.WRITE: frozenset({Operation.DESCRIBE}),
    Operation.DELETE: frozenset({Operation.DESCRIBE}),
    Operation.ALTER: frozenset({Operation.DESCRIBE}),
    Operation.ALTER_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS}),
}

#: The operations each resource type has (Kafka's table).
OPERATIONS: Final = {
    ResourceType.TOPIC: frozenset(
        {
            Operation.ALL,
            Operation.READ,
            Operation.WRITE,
            Operation.CREATE,
            Operation.DELETE,
            Operation.ALTER,
            Operation.DESCRIBE,
            Operation.DESCRIBE_CONFIGS,
            Operation.ALTER_CONFIGS,
        }
    ),
    ResourceType.GROUP: frozenset(
        {Operation.ALL, Operation.READ, Operation.DELETE, Operation.DESCRIBE}
    ),
    ResourceType.CLUSTER: frozenset(
        {
            Operation.ALL,
            Operation.CREATE,
            Operation.ALTER,
            Operation.DESCRIBE,
            Operation.CLUSTER_ACTION,
            Operation.DESCRIBE_CONFIGS,
            Operation.ALTER_CONFIGS,
            Operation.IDEMPOTENT_WRITE,
        }
    ),
    ResourceType.TRANSACTIONAL_ID: frozenset(
        {Operation.ALL, Operation.WRITE, Operation.DESCRIBE, Operation.TWO_PHASE_COMMIT}
    ),
}


class Acl(NamedTuple):
    """One binding (Kafka's ``AclBinding``)."""

    resource_type: ResourceType
    pattern_type: PatternType
    resource_name: str
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def to_wire(self) -> list[object]:
        return [
            int(self.resource_type),
            int(self.pattern_type),
            self.resource_name,
            self.principal,
            self.host,
            int(self.operation),
            int(self.permission),
        ]

    def describe(self) -> str:
        return (
            f"{self.permission.name} {self.principal} from {self.host} "
            f"{self.operation.name} on {self.resource_type.name} "
            f"{self.pattern_type.name} {self.resource_name!r}"
        )


class AclFilter(NamedTuple):
    """What DescribeAcls and DeleteAcls select (Kafka's ``AclBindingFilter``):
    ANY or None matches every value of its field; the pattern type MATCH
    selects the bindings that would apply to the named resource."""

    resource_type: ResourceType = ResourceType.ANY
    pattern_type: PatternType = PatternType.ANY
    resource_name: str | None = None
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def matches(self, acl: Acl) -> bool:
        if self.resource_type is not ResourceType.ANY and acl.resource_type != self.resource_type:
            return False
        if not self._matches_pattern(acl):
            return False
        if self.principal is not None and acl.principal != self.principal:
            return False
        if self.host is not None and acl.host != self.host:
            return False
        if self.operation is not Operation.ANY and acl.operation != self.operation:
            return False
        return self.permission is Permission.ANY or acl.permission == self.permission

    def _matches_pattern(self, acl: Acl) -> bool:
        if self.pattern_type is PatternType.MATCH:
            if self.resource_name is None:
                return True
            return _name_matches(acl, self.resource_name)
        if self.pattern_type is not PatternType.ANY and acl.pattern_type != self.pattern_type:
            return False
        return self.resource_name is None or acl.resource_name == self.resource_name


def binding_error(acl: Acl) -> str | None:
    """Why ``acl`` cannot be stored (Kafka's checks of a new binding), or None."""
    if acl.resource_type not in OPERATIONS:
        return f"resource type {acl.resource_type.name} cannot be bound"
    if acl.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return "the pattern type must be LITERAL or PREFIXED"
    if acl.permission not in (Permission.ALLOW, Permission.DENY):
        return "the permission must be ALLOW or DENY"
    if acl.operation not in OPERATIONS[acl.resource_type]:
        return f"{acl.resource_type.name} has no operation {acl.operation.name}"
    for what, value in (
        ("resource name", acl.resource_name),
        ("principal", acl.principal),
        ("host", acl.host),
    ):
        if not value:
            return f"the {what} must not be empty"
        if len(value) > MAX_ACL_FIELD_CHARS:
            return f"the {what} is longer than {MAX_ACL_FIELD_CHARS} characters"
    if not acl.principal.startswith("User:") or acl.principal == "User:":
        return f"principal {acl.principal[:64]!r} is not of the form User:<name>"
    if acl.resource_type is ResourceType.CLUSTER and (
        acl.resource_name != CLUSTER_NAME or acl.pattern_type is not PatternType.LITERAL
    ):
        return f"the CLUSTER resource is named LITERAL {CLUSTER_NAME!r}"
    if acl.pattern_type is PatternType.PREFIXED and acl.resource_name == WILDCARD:
        return "a PREFIXED pattern of '*' is not allowed: use LITERAL '*'"
    return None


def _name_matches(acl: Acl, name: str) -> bool:
    if acl.pattern_type is PatternType.PREFIXED:
        return name.startswith(acl.resource_name)
    return acl.resource_name in (name, WILDCARD)


class AclIndex:
    """A set of bindings indexed for :func:`authorized` (built once per change
    of the set; immutable)."""

    def __init__(self, acls: Iterable[Acl]) -> None:
        self.acls: frozenset[Acl] = frozenset(acls)
        literal: dict[tuple[ResourceType, str], list[Acl]] = {}
        prefixed: dict[ResourceType, list[Acl]] = {}
        for acl in self.acls:
            if acl.pattern_type is PatternType.PREFIXED:
                prefixed.setdefault(acl.resource_type, []).append(acl)
            else:
                literal.setdefault((acl.resource_type, acl.resource_name), []).append(acl)
        self._literal = literal
        self._prefixed = prefixed

    def on(self, resource_type: ResourceType, name: str) -> list[Acl]:
        """The bindings that apply to the resource (any principal)."""
        found = list(self._literal.get((resource_type, name), ()))
        if name != WILDCARD:
            found += self._literal.get((resource_type, WILDCARD), ())
        found += [
            a for a in self._prefixed.get(resource_type, ()) if name.startswith(a.resource_name)
        ]
        return found

    def by_type(self, resource_type: ResourceType) -> list[Acl]:
        return [a for a in self.acls if a.resource_type == resource_type]


EMPTY_INDEX: Final = AclIndex(())


class Principal(NamedTuple):
    """Who is asking, from where."""

    name: str
    host: str


def authorized(
    index: AclIndex,
    who: Principal,
    operation: Operation,
    resource_type: ResourceType,
    name: str,
    super_users: Iterable[str] = (),
    allow_if_no_acl: bool = False,
) -> bool:
    """Whether ``who`` may do ``operation`` on the resource (see the module)."""
    if who.name in super_users:
        return True
    bindings = index.on(resource_type, name)
    if not bindings:
        return allow_if_no_acl
    allowed = False
    for acl in bindings:
        if acl.principal not in (who.name, WILDCARD_PRINCIPAL):
            continue
        if acl.host not in (who.host, WILDCARD):
            continue
        if acl.permission is Permission.DENY:
            if acl.operation in (operation, Operation.ALL):
                return False
        elif acl.operation in (operation, Operation.ALL) or operation in _IMPLIES.get(
            acl.operation, ()
        ):
            allowed = True
    return allowed


def allowed_on_some(
    index: AclIndex, who: Principal, operation: Operation, resource_type: ResourceType
) -> bool:
    """Whether some binding allows ``who`` ``operation`` on some resource of
    ``resource_type`` (Kafka's ``authorizeByResourceType``, as an idempotent
    producer's InitProducerId needs WRITE on some topic). A DENY is counted
    only when it covers every name (LITERAL ``*``)."""
    allowed = False
    for acl in index.by_type(resource_type):
        if acl.principal not in (who.name, WILDCARD_PRINCIPAL):
            continue
        if acl.host not in (who.host, WILDCARD):
            continue
        if acl.operation not in (operation, Operation.ALL):
            continue
        if acl.permission is Permission.DENY:
            if acl.pattern_type is PatternType.LITERAL and acl.resource_name == WILDCARD:
                return False
        else:
            allowed = True
    return allowed


def acl_from_wire(data: object) -> Acl:
    """An :class:`Acl` from :meth:`Acl.to_wire` output.

    Raises:
        ValueError: malformed data or an unknown number.
    """
    if not isinstance(data, list | tuple) or len(data) != 7:
        raise ValueError("an ACL is a list of 7 fields")
    rtype, ptype, name, principal, host, operation, permission = data
    if not all(type(v) is int for v in (rtype, ptype, operation, permission)):
        raise ValueError("an ACL's types are integers")
    if not all(type(v) is str for v in (name, principal, host)):
        raise ValueError("an ACL's names are strings")
    return Acl(
        ResourceType(rtype),
        PatternType(ptype),
        name,
        principal,
        host,
        Operation(operation),
        Permission(permission),
    )
