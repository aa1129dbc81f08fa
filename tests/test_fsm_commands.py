"""The msgpack command codec (fsm.commands) and shard snapshots (fsm.machine).

Long on purpose: the cases of one component, sharing this module's helpers
and fixtures.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import pytest

from fsm import (
    AbortTimedOut,
    AddOffsets,
    AddPartitions,
    AllocatePidBlock,
    AlterPartition,
    Command,
    CommandError,
    CreateAcls,
    CreateTopic,
    DeleteAcls,
    DeleteScramCredential,
    ElectPreferredLeaders,
    EndTxn,
    ErrorCode,
    ExpireTransactionalIds,
    FenceNode,
    GroupMarker,
    GroupProtocol,
    GroupTimeouts,
    Heartbeat,
    InitProducerId,
    JoinGroup,
    LeaveGroup,
    MarkersWritten,
    MemberAssignment,
    OffsetCommit,
    OffsetEntry,
    OffsetReservation,
    RegisterDirectory,
    ReserveOffsets,
    SyncGroup,
    TransactionStateMachine,
    TxnOffsetCommit,
    TxnState,
    UnfenceNode,
    UpsertScramCredential,
    decode_command,
    decode_entry,
    encode_command,
    encode_entry,
    encode_snapshot,
    snapshot_pieces,
)
from fsm.commands import COMMAND_TYPES, COMMAND_VERSION, ENTRY_VERSION, command_to_wire
from raftcoord.protocol.acl import (
    Acl,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from raftcoord.protocol.types import TopicPartition

# One sample per command type, with non-default values everywhere and
# several items in every tuple field.
SAMPLES: list[Command] = [
    InitProducerId(
        transactional_id="txn-ünïcode",
        timeout_ms=60_000,
        now_ms=1_700_000_000_000,
        coordinator_epoch=7,
        new_producer_id=2**62,
        expected_producer_id=41,
        expected_producer_epoch=3,
        enable_two_phase_commit=True,
        keep_prepared_txn=True,
    ),
    AddPartitions(
        transactional_id="txn-a",
        producer_id=12,
        producer_epoch=4,
        partitions=(
            TopicPartition("orders", 0),
            TopicPartition("orders", 2),
            TopicPartition("payments", 2**31 - 1),
        ),
        now_ms=5,
        coordinator_epoch=2,
    ),
    AddOffsets(
        transactional_id="txn-a",
        producer_id=12,
        producer_epoch=4,
        group_id="group-1",
        now_ms=6,
        coordinator_epoch=2,
    ),
    EndTxn(
        transactional_id="txn-a",
        producer_id=12,
        producer_epoch=4,
        commit=True,
        now_ms=7,
        coordinator_epoch=2,
        new_producer_id=99,
    ),
    MarkersWritten(
        transactional_id="txn-a",
        producer_id=12,
        producer_epoch=5,
        partitions=(TopicPartition("orders", 0), TopicPartition("payments", 1)),
        groups=("group-1", "group-2"),
        now_ms=8,
    ),
    AbortTimedOut(
        transactional_id="txn-b",
        producer_id=-(2**63),
        producer_epoch=-1,
        now_ms=2**63 - 1,
        coordinator_epoch=0,
    ),
    ExpireTransactionalIds(transactional_ids=("txn-c", "txn-d", ""), now_ms=9),
    TxnOffsetCommit(
        group_id="group-1",
        transactional_id="txn-a",
        producer_id=12,
        producer_epoch=4,
        offsets=(OffsetEntry("orders", 0, 100, "meta"), OffsetEntry("orders", 1, 0, "")),
        now_ms=10,
        generation_id=3,
        member_id="consumer-1-abc",
        group_instance_id="instance-1",
    ),
    GroupMarker(group_id="group-1", producer_id=12, producer_epoch=5, commit=False, now_ms=11),
    OffsetCommit(
        group_id="group-2",
        offsets=(OffsetEntry("clicks", 3, 17, "m"), OffsetEntry("views", 0, 1, "x" * 300)),
        now_ms=12,
        generation_id=2**31 - 1,
        member_id="m",
        group_instance_id="",
    ),
    CreateTopic(
        name="orders",
        partition_nodes=(1, 2, 3, 1),
        now_ms=13,
        replicas=((1, 2, 3), (2, 3, 1), (3, 1, 2), (1, 2, 3)),
        min_insync_replicas=2,
    ),
    RegisterDirectory(node_id=101, directory_id="0" * 32, replace=False, now_ms=14),
    FenceNode(node_id=102, now_ms=14),
    UnfenceNode(node_id=102, now_ms=14),
    AlterPartition("orders", 1, 102, 3, 7, (102, 101), 15),
    ElectPreferredLeaders((101, 103), 16),
    ReserveOffsets(
        node_id=101,
        directory_id="ab" * 16,
        reservations=(OffsetReservation("orders", 0, 2**62), OffsetReservation("t", 3, 0)),
        now_ms=15,
    ),
    CreateAcls(
        acls=(
            Acl(
                ResourceType.TOPIC,
                PatternType.PREFIXED,
                "orders-",
                "User:alice",
                "*",
                Operation.WRITE,
                Permission.ALLOW,
            ),
        ),
        now_ms=16,
    ),
    DeleteAcls(
        filters=(AclFilter(), AclFilter(ResourceType.GROUP, PatternType.MATCH, "g", "User:bob")),
        now_ms=17,
    ),
    UpsertScramCredential(
        user="alice",
        mechanism="SCRAM-SHA-256",
        salt=b"s" * 16,
        iterations=4096,
        stored_key=b"k" * 32,
        server_key=b"v" * 32,
        now_ms=18,
    ),
    DeleteScramCredential(user="alice", mechanism="SCRAM-SHA-512", now_ms=19),
    JoinGroup(
        group_id="group-1",
        member_id="",
        group_instance_id="instance-1",
        client_id="client-1",
        protocol_type="consumer",
        protocols=(GroupProtocol("range", b"\x00\x01"), GroupProtocol("roundrobin", b"")),
        session_timeout_ms=45_000,
        rebalance_timeout_ms=300_000,
        new_member_id="instance-1-uuid",
        now_ms=14,
    ),
    SyncGroup(
        group_id="group-1",
        member_id="m1",
        group_instance_id="",
        generation_id=4,
        assignments=(MemberAssignment("m1", b"\xff"), MemberAssignment("m2", b"")),
        now_ms=15,
    ),
    Heartbeat(
        group_id="group-1", member_id="m1", group_instance_id="i", generation_id=4, now_ms=16
    ),
    LeaveGroup(group_id="group-1", member_id="", group_instance_id="i", now_ms=17),
    GroupTimeouts(group_id="group-2", now_ms=18, leader_since_ms=3),
    AllocatePidBlock(shard=2, shard_count=3, block_size=1000),
]


def _wire(command: Command, **changes: Any) -> dict[str, Any]:
    wire = command_to_wire(command)
    wire.update(changes)
    return wire


def _pack(obj: Any) -> bytes:
    return bytes(msgpack.packb(obj, use_bin_type=True))


def _decode_error(wire: Any) -> str:
    with pytest.raises(CommandError) as info:
        decode_command(_pack(wire))
    return str(info.value)


# --- round trips -------------------------------------------------------------------


def test_samples_cover_every_command_type() -> None:
    sampled = [type(c).TYPE for c in SAMPLES]
    assert len(sampled) == len(set(sampled)), "two samples of the same type"
    assert set(sampled) == set(COMMAND_TYPES), (
        f"command types without a sample: {sorted(set(COMMAND_TYPES) - set(sampled))}"
    )
    for type_id, cls in COMMAND_TYPES.items():
        assert cls.TYPE == type_id


@pytest.mark.parametrize("command", SAMPLES, ids=lambda c: type(c).__name__)
def test_command_round_trips(command: Command) -> None:
    data = encode_command(command)
    assert isinstance(data, bytes)
    decoded = decode_command(data)
    assert type(decoded) is type(command)
    assert decoded == command
    # Field by field too, including the element types of tuple fields.
    for f in dataclasses.fields(command):
        got, want = getattr(decoded, f.name), getattr(command, f.name)
        assert got == want and type(got) is type(want), f.name
        if isinstance(want, tuple):
            assert [type(x) for x in got] == [type(x) for x in want], f.name
    # Encoding is deterministic: the decoded command encodes to the same bytes.
    assert encode_command(decoded) == data


def test_wire_format_is_the_documented_map() -> None:
    command = AllocatePidBlock(shard=1, shard_count=3, block_size=10)
    assert msgpack.unpackb(encode_command(command)) == {
        "v": COMMAND_VERSION,
        "t": 11,
        "shard": 1,
        "shard_count": 3,
        "block_size": 10,
    }


def test_entry_keeps_order_of_several_commands() -> None:
    commands = [*SAMPLES, SAMPLES[0], *reversed(SAMPLES)]
    assert decode_entry(encode_entry(commands)) == commands
    assert decode_entry(encode_entry([])) == []


def test_malformed_command_in_an_entry_is_an_error_in_its_slot() -> None:
    good_1, good_2 = SAMPLES[1], SAMPLES[-1]
    bad = _wire(SAMPLES[3], commit=1)  # int where a bool is expected
    data = _pack(
        {
            "v": ENTRY_VERSION,
            "cmds": [command_to_wire(good_1), bad, "nope", command_to_wire(good_2)],
        }
    )
    decoded = decode_entry(data)
    assert len(decoded) == 4
    assert decoded[0] == good_1
    assert isinstance(decoded[1], CommandError) and "boolean" in str(decoded[1])
    assert isinstance(decoded[2], CommandError) and "map" in str(decoded[2])
    assert decoded[3] == good_2


# --- decode errors -----------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 2, -1, "1", None])
def test_unknown_command_version(version: Any) -> None:
    message = _decode_error(_wire(SAMPLES[0], v=version))
    assert "version" in message and repr(version) in message


def test_missing_command_version() -> None:
    wire = command_to_wire(SAMPLES[0])
    del wire["v"]
    assert "version" in _decode_error(wire)


@pytest.mark.parametrize("version", [True, 1.0])
def test_non_int_command_version_is_rejected(version: Any) -> None:
    _decode_error(_wire(SAMPLES[0], v=version))


@pytest.mark.parametrize("type_id", [0, 28, 999, -1])
def test_unknown_type_id(type_id: int) -> None:
    message = _decode_error(_wire(SAMPLES[0], t=type_id))
    assert "type" in message and str(type_id) in message


@pytest.mark.parametrize("type_id", ["1", 1.0, True, None, [1]])
def test_non_int_type_id(type_id: Any) -> None:
    message = _decode_error(_wire(SAMPLES[0], t=type_id))
    assert "unknown command type" in message and repr(type_id) in message


def test_missing_type_id() -> None:
    wire = command_to_wire(SAMPLES[0])
    del wire["t"]
    assert "unknown command type" in _decode_error(wire)


@pytest.mark.parametrize("field", ["transactional_id", "expected_producer_epoch"])
def test_missing_field(field: str) -> None:
    # expected_producer_epoch has a default in the dataclass; it must still be on the wire.
    wire = command_to_wire(SAMPLES[0])
    del wire[field]
    message = _decode_error(wire)
    assert "InitProducerId" in message and "missing" in message and field in message


def test_extra_field() -> None:
    message = _decode_error(_wire(SAMPLES[-1], surprise=1))
    assert "AllocatePidBlock" in message and "unknown fields" in message
    assert "surprise" in message


def test_field_of_another_command_is_extra() -> None:
    # A GroupMarker map carrying EndTxn's transactional_id is not a guessable command.
    message = _decode_error(_wire(SAMPLES[8], transactional_id="txn-a"))
    assert "transactional_id" in message


@pytest.mark.parametrize(
    ("sample", "field", "value", "expected"),
    [
        (-1, "block_size", True, "64-bit integer"),  # bool where int expected
        (-1, "shard", False, "64-bit integer"),
        (3, "commit", 1, "boolean"),  # int where bool expected
        (3, "commit", 0, "boolean"),
        (3, "commit", "true", "boolean"),
        (-1, "shard", "1", "64-bit integer"),  # str where int expected
        (-1, "shard", 1.0, "64-bit integer"),
        (-1, "shard", None, "64-bit integer"),
        (0, "now_ms", 2**63, "64-bit integer"),  # out of int64 range
        (0, "now_ms", 2**64 - 1, "64-bit integer"),
        (0, "transactional_id", 5, "string"),  # int where str expected
        (0, "transactional_id", b"txn", "string"),
        (1, "partitions", [["orders", 0, 1]], "2-element"),  # wrong arity
        (1, "partitions", [["orders"]], "2-element"),
        (1, "partitions", ["orders"], "2-element"),
        (1, "partitions", [["orders", "0"]], "64-bit integer"),
        (1, "partitions", [[0, 0]], "string"),
        (1, "partitions", "orders", "list"),
        (1, "partitions", {"orders": 0}, "list"),
        (6, "transactional_ids", [1], "string"),
        (6, "transactional_ids", "txn", "list"),
        (7, "offsets", [["orders", 0, 1]], "4-element"),
        (7, "offsets", [["orders", 0, 2**63, ""]], "64-bit integer"),
        (7, "offsets", [["orders", 0, 1, None]], "string"),
    ],
)
def test_wrong_field_type(sample: int, field: str, value: Any, expected: str) -> None:
    command = SAMPLES[sample]
    assert field in {f.name for f in dataclasses.fields(command)}
    message = _decode_error(_wire(command, **{field: value}))
    assert expected in message, message


def test_int64_bounds_are_accepted() -> None:
    for value in (2**63 - 1, -(2**63)):
        decoded = decode_command(_pack(_wire(SAMPLES[0], now_ms=value)))
        assert isinstance(decoded, InitProducerId) and decoded.now_ms == value


@pytest.mark.parametrize("payload", [[1, 11, 0, 3, 10], "AllocatePidBlock", 11, None, b"\x01"])
def test_command_not_a_map(payload: Any) -> None:
    assert "must be a map" in _decode_error(payload)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        b"\x81",
        b"\x82\xa1v\x01",
        b"\xa3ab",
        b"\x01\x02",
        b"\xa2\xff\xfe",
        b"not msgpack at all",
    ],
)
def test_not_msgpack(data: bytes) -> None:
    with pytest.raises(CommandError, match=r"msgpack|map"):
        decode_command(data)
    with pytest.raises(CommandError):
        decode_entry(data)


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_entry_with_unknown_version(version: Any) -> None:
    data = _pack({"v": version, "cmds": [command_to_wire(SAMPLES[0])]})
    with pytest.raises(CommandError, match="unknown entry version"):
        decode_entry(data)


@pytest.mark.parametrize(
    "payload",
    [
        {"cmds": []},
        {"v": ENTRY_VERSION},
        {"v": ENTRY_VERSION, "cmds": [], "extra": 1},
        {"v": ENTRY_VERSION, "cmds": {"0": {}}},
        [ENTRY_VERSION, []],
        command_to_wire(SAMPLES[0]),  # a bare command is not an entry
    ],
)
def test_malformed_entry(payload: Any) -> None:
    with pytest.raises(CommandError):
        decode_entry(_pack(payload))


# --- apply_entry -------------------------------------------------------------------


def test_apply_entry_on_garbage_changes_nothing() -> None:
    machine = TransactionStateMachine(0, 3, block_size=10)
    machine.apply(AllocatePidBlock(0, 3, 10))
    before = machine.snapshot()
    for garbage in (
        b"",
        b"\xc1",
        b"garbage bytes",
        _pack({"v": 9, "cmds": []}),
        encode_command(AllocatePidBlock(0, 3, 10)),
    ):
        outcomes = machine.apply_entry(garbage)
        assert len(outcomes) == 1
        assert outcomes[0].error is ErrorCode.INVALID_REQUEST and outcomes[0].message
        assert machine.snapshot() == before


def test_apply_entry_applies_valid_commands_next_to_an_invalid_one() -> None:
    machine = TransactionStateMachine(1, 3, block_size=10)
    before = machine.snapshot()
    bad = _wire(AllocatePidBlock(1, 3, 10), block_size="10")
    data = _pack(
        {
            "v": ENTRY_VERSION,
            "cmds": [
                command_to_wire(AllocatePidBlock(1, 3, 10)),
                bad,
                command_to_wire(AllocatePidBlock(1, 3, 10)),
            ],
        }
    )
    first, second, third = machine.apply_entry(data)
    assert (first.error, first.block_first, first.block_end) == (ErrorCode.NONE, 10, 20)
    assert second.error is ErrorCode.INVALID_REQUEST and "10" in second.message
    assert (third.error, third.block_first, third.block_end) == (ErrorCode.NONE, 40, 50)
    assert machine.state.pids.next_seq == 2
    assert machine.snapshot() != before

    # An entry holding only an invalid command answers it and changes nothing.
    after = machine.snapshot()
    assert [o.error for o in machine.apply_entry(_pack({"v": 1, "cmds": [bad]}))] == [
        ErrorCode.INVALID_REQUEST
    ]
    assert machine.snapshot() == after


# --- snapshots ---------------------------------------------------------------------

NOW = 1_000


def _busy_machine() -> TransactionStateMachine:
    """A shard after a realistic run: ids, open/preparing/complete transactions, offsets."""
    m = TransactionStateMachine(0, 3, block_size=10)
    steps: list[Command] = [
        AllocatePidBlock(0, 3, 10),
        InitProducerId("txn-a", 60_000, NOW, 1, new_producer_id=0),
        InitProducerId("txn-b", 30_000, NOW, 1, new_producer_id=1),
        InitProducerId("txn-c", 45_000, NOW, 1, new_producer_id=2),
        # txn-a: a committed transaction with partitions and group offsets.
        AddPartitions("txn-a", 0, 0, (("orders", 0), ("orders", 1)), NOW + 1, 1),
        AddOffsets("txn-a", 0, 0, "group-1", NOW + 2, 1),
        TxnOffsetCommit("group-1", "txn-a", 0, 0, (OffsetEntry("orders", 0, 42, "m"),), NOW + 3),
        EndTxn("txn-a", 0, 0, True, NOW + 4, 1),
        MarkersWritten("txn-a", 0, 1, (("orders", 0), ("orders", 1)), ("group-1",), NOW + 5),
        GroupMarker("group-1", 0, 1, True, NOW + 5),
        # txn-b: still open, with pending offsets in another group.
        AddPartitions("txn-b", 1, 0, (("payments", 3),), NOW + 6, 1),
        AddOffsets("txn-b", 1, 0, "group-2", NOW + 6, 1),
        TxnOffsetCommit("group-2", "txn-b", 1, 0, (OffsetEntry("payments", 3, 7, ""),), NOW + 7),
        # txn-c: aborting, markers outstanding.
        AddPartitions("txn-c", 2, 0, (("orders", 2), ("clicks", 0)), NOW + 8, 2),
        EndTxn("txn-c", 2, 0, False, NOW + 9, 2),
        MarkersWritten("txn-c", 2, 1, (("orders", 2),), (), NOW + 10),
        # A plain consumer commit.
        OffsetCommit(
            "group-3", (OffsetEntry("views", 0, 5, "a"), OffsetEntry("views", 1, 6, "b")), NOW + 11
        ),
    ]
    for command in steps:
        outcome = m.apply(command)
        assert outcome.ok, (command, outcome)
    return m


def test_busy_machine_is_what_the_commands_made() -> None:
    m = _busy_machine()
    assert m.state.pids.next_seq == 1
    assert m.state.last_assigned_pid == 2
    assert {meta.producer_id for meta in m.state.transactions.values()} == {0, 1, 2}
    states = {tid: meta.state for tid, meta in m.state.transactions.items()}
    assert states == {
        "txn-a": TxnState.COMPLETE_COMMIT,
        "txn-b": TxnState.ONGOING,
        "txn-c": TxnState.PREPARE_ABORT,
    }
    assert [(f.topic, f.offset) for f in m.offset_fetch("group-1")] == [("orders", 42)]
    assert [f.error for f in m.offset_fetch("group-2", [("payments", 3)])] == [
        ErrorCode.UNSTABLE_OFFSET_COMMIT
    ]


def test_snapshot_restore_round_trip() -> None:
    m = _busy_machine()
    data = m.snapshot()
    restored = TransactionStateMachine.restore(data, m.config)
    assert restored.state == m.state
    assert restored.snapshot() == data
    assert m.snapshot() == data  # taking a snapshot changes nothing

    # The restored machine behaves like the original from here on.
    for command in (
        MarkersWritten("txn-c", 2, 1, (("clicks", 0),), (), NOW + 20),
        EndTxn("txn-b", 1, 0, True, NOW + 21, 3),
        AllocatePidBlock(0, 3, 10),
        InitProducerId("txn-d", 1_000, NOW + 22, 3, new_producer_id=30),
        GroupMarker("group-2", 1, 1, True, NOW + 23),
    ):
        a, b = m.apply(command), restored.apply(command)
        assert a == b and a.ok, (command, a)
    assert restored.snapshot() == m.snapshot()
    txn_c = restored.describe("txn-c")
    assert txn_c is not None and txn_c.state is TxnState.COMPLETE_ABORT


def test_a_frozen_state_encodes_in_pieces_to_the_snapshot_of_its_time() -> None:
    m = _busy_machine()
    frozen = m.frozen_state()
    data = m.snapshot()
    for records_per_piece in (1, 2, 1_000):
        assert b"".join(snapshot_pieces(frozen, records_per_piece)) == data
    assert len(list(snapshot_pieces(frozen, 1))) > 3
    # Packed record by record, the bytes are those of the whole payload at once.
    assert msgpack.packb(msgpack.unpackb(data, raw=False), use_bin_type=True) == data
    for command in (
        AllocatePidBlock(0, 3, 10),
        InitProducerId("txn-d", 1_000, NOW + 22, 3, new_producer_id=30),
        GroupMarker("group-2", 1, 1, True, NOW + 23),
    ):
        assert m.apply(command).ok, command
    assert m.snapshot() != data
    assert encode_snapshot(frozen) == data  # later commands left the copy alone


def test_the_latest_stamp_is_the_newest_transaction_change_or_member_heartbeat() -> None:
    assert TransactionStateMachine(0, 1).latest_stamp_ms() == 0
    m = _busy_machine()
    newest = max(meta.last_update_ms for meta in m.state.transactions.values())
    assert m.latest_stamp_ms() == newest
    protocols = (GroupProtocol("range", b""),)
    for member_id in ("", "m-1"):  # asked to join again with its id, then a member
        join = JoinGroup(
            "g", member_id, "", "c", "consumer", protocols, 10_000, 10_000, "m-1", newest + 500
        )
        m.apply(join)
    assert m.latest_stamp_ms() == newest + 500


def test_empty_machine_snapshot_round_trip() -> None:
    m = TransactionStateMachine(2, 5, block_size=7)
    restored = TransactionStateMachine.restore(m.snapshot())
    assert restored.state == m.state
    assert restored.state.pids.layout == m.state.pids.layout


def _payload() -> dict[str, Any]:
    payload: dict[str, Any] = msgpack.unpackb(_busy_machine().snapshot())
    return payload


def _restore_error(data: bytes) -> CommandError:
    with pytest.raises(CommandError) as info:
        TransactionStateMachine.restore(data)
    assert type(info.value) is CommandError
    return info.value


@pytest.mark.parametrize("version", [0, 6, "5", None, True])
def test_restore_rejects_unknown_snapshot_version(version: Any) -> None:
    payload = _payload()
    payload["v"] = version
    assert "version" in str(_restore_error(_pack(payload)))


def test_restore_rejects_a_snapshot_that_is_not_a_map() -> None:
    _restore_error(_pack([1, 2, 3]))
    _restore_error(b"\xc1")


def test_restore_rejects_truncated_bytes() -> None:
    data = _busy_machine().snapshot()
    for cut in range(len(data)):
        _restore_error(data[:cut])


@pytest.mark.parametrize(
    "key", ["pids", "last_assigned_pid", "transactions", "groups", "topics", "memberships"]
)
def test_restore_rejects_a_missing_key(key: str) -> None:
    payload = _payload()
    del payload[key]
    _restore_error(_pack(payload))


@pytest.mark.parametrize(
    "entry",
    [
        "txn-a",
        None,
        [],
        ["txn-a", 0, 0, 4],  # too short
        ["txn-a", 0, 0, 4, 60_000, 1_000, -1, -1, -1, -1, -1, [], [], 1, 0],  # too long
        ["txn-a", 0, 0, 4, 60_000, 1_000, -1, -1, -1, -1, -1, [["orders"]], [], 1],
    ],
)
def test_restore_rejects_a_malformed_transactions_entry(entry: Any) -> None:
    payload = _payload()
    payload["transactions"][0] = entry
    _restore_error(_pack(payload))


@pytest.mark.parametrize(("index", "state_id"), [(3, 8), (3, 99), (3, -1), (9, 8), (9, 99)])
def test_restore_rejects_an_unknown_state_id(index: int, state_id: int) -> None:
    # index 3 is the state, index 9 the pending state (-1 meaning none).
    payload = _payload()
    payload["transactions"][0][index] = state_id
    _restore_error(_pack(payload))


@pytest.mark.parametrize(
    "pids", [[0, 3, 10], [0, 3, 10, -1], [3, 3, 10, 0], [0, 3, 0, 0], [0, 3, True, 0], "x"]
)
def test_restore_rejects_a_malformed_pid_record(pids: Any) -> None:
    payload = _payload()
    payload["pids"] = pids
    _restore_error(_pack(payload))


def test_restore_rejects_malformed_groups() -> None:
    for groups in (
        [["group-1"]],
        [["group-1", [[], []]]],
        "group-1",
        [["group-1", [[["t"]], [], []]]],
    ):
        payload = _payload()
        payload["groups"] = groups
        _restore_error(_pack(payload))


@pytest.mark.parametrize(("index", "value"), [(0, 7), (2, "0"), (1, None), (12, "group")])
def test_restore_rejects_a_transactions_entry_with_wrong_field_types(
    index: int, value: Any
) -> None:
    payload = _payload()
    payload["transactions"][0][index] = value
    _restore_error(_pack(payload))


# --- data written before consumer-group membership ---------------------------------


def test_offset_commits_logged_before_membership_still_decode() -> None:
    """Raft entries of an older version carry no member fields: they decode
    as simple-consumer commits, so replaying an old log keeps their offsets."""
    offsets = (OffsetEntry("orders", 0, 42, "m"),)
    for command in (
        OffsetCommit("group-1", offsets, NOW),
        TxnOffsetCommit("group-1", "txn-a", 0, 0, offsets, NOW),
    ):
        wire = command_to_wire(command)
        for name in ("generation_id", "member_id", "group_instance_id"):
            del wire[name]
        old = msgpack.packb(wire, use_bin_type=True)
        assert decode_command(old) == command


def test_a_required_field_is_still_required() -> None:
    wire = command_to_wire(OffsetCommit("group-1", (), NOW))
    del wire["now_ms"]
    with pytest.raises(CommandError, match="missing fields \\['now_ms'\\]"):
        decode_command(msgpack.packb(wire, use_bin_type=True))


def test_a_snapshot_from_before_membership_restores() -> None:
    m = _busy_machine()
    payload = msgpack.unpackb(m.snapshot(), raw=False)
    assert payload.pop("memberships") == []
    for added_later in ("directories", "offset_ceilings", "acls", "scram"):
        del payload[added_later]
    payload["v"] = 1
    restored = TransactionStateMachine.restore(msgpack.packb(payload, use_bin_type=True), m.config)
    assert restored.state == m.state
    # A version-1 snapshot that names memberships is not one.
    payload["memberships"] = []
    with pytest.raises(CommandError, match="unknown snapshot version 1"):
        TransactionStateMachine.restore(msgpack.packb(payload, use_bin_type=True), m.config)


def test_a_snapshot_from_before_directories_restores_without_any() -> None:
    m = _busy_machine()
    payload = msgpack.unpackb(m.snapshot(), raw=False)
    assert payload.pop("directories") == [] and payload.pop("offset_ceilings") == []
    assert payload.pop("acls") == [] and payload.pop("scram") == []
    payload["v"] = 2
    restored = TransactionStateMachine.restore(msgpack.packb(payload, use_bin_type=True), m.config)
    assert restored.state == m.state
