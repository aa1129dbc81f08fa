"""The protocol contract: generated code is fresh, and enums, services and
field presence are what docs/design.md and Kafka users expect."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import FileDescriptor

from raftcoord.protocol.v1 import (
    admin_pb2,
    common_pb2,
    coordinator_pb2,
    data_files_pb2,
    partition_log_pb2,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
GENERATED_DIR = REPO_ROOT / "raftcoord" / "protocol" / "v1"
DESIGN_MD = REPO_ROOT / "docs" / "design.md"

# Kafka's error codes, name -> number: those of the transaction, produce and
# fetch paths ...
ERROR_CODES: dict[str, int] = {
    "NONE": 0,
    "UNKNOWN_SERVER_ERROR": -1,
    "CORRUPT_MESSAGE": 2,
    "UNKNOWN_TOPIC_OR_PARTITION": 3,
    "NOT_LEADER_OR_FOLLOWER": 6,
    "REQUEST_TIMED_OUT": 7,
    "COORDINATOR_LOAD_IN_PROGRESS": 14,
    "COORDINATOR_NOT_AVAILABLE": 15,
    "NOT_COORDINATOR": 16,
    "INVALID_REQUEST": 42,
    "OUT_OF_ORDER_SEQUENCE_NUMBER": 45,
    "DUPLICATE_SEQUENCE_NUMBER": 46,
    "INVALID_PRODUCER_EPOCH": 47,
    "INVALID_TXN_STATE": 48,
    "INVALID_PRODUCER_ID_MAPPING": 49,
    "INVALID_TRANSACTION_TIMEOUT": 50,
    "CONCURRENT_TRANSACTIONS": 51,
    "TRANSACTION_COORDINATOR_FENCED": 52,
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": 53,
    "UNKNOWN_PRODUCER_ID": 59,
    "UNSTABLE_OFFSET_COMMIT": 88,
    "PRODUCER_FENCED": 90,
    "TRANSACTIONAL_ID_NOT_FOUND": 105,
    "TRANSACTION_ABORTABLE": 120,
}

# ... and those of topics, record validation, fetch offsets and per-partition refusals.
EXTRA_KAFKA_CODES: dict[str, int] = {
    "INVALID_TOPIC_EXCEPTION": 17,
    "TOPIC_ALREADY_EXISTS": 36,
    "INVALID_PARTITIONS": 37,
    "LEADER_NOT_AVAILABLE": 5,
    "INVALID_REPLICATION_FACTOR": 38,
    "INVALID_REPLICA_ASSIGNMENT": 39,
    "INVALID_CONFIG": 40,
    "FENCED_LEADER_EPOCH": 74,
    "UNKNOWN_LEADER_EPOCH": 76,
    "MESSAGE_TOO_LARGE": 10,
    "NOT_ENOUGH_REPLICAS": 19,
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND": 20,
    "OFFSET_OUT_OF_RANGE": 1,
    "TOPIC_AUTHORIZATION_FAILED": 29,
    "GROUP_AUTHORIZATION_FAILED": 30,
    "CLUSTER_AUTHORIZATION_FAILED": 31,
    "SECURITY_DISABLED": 54,
    "UNSUPPORTED_SASL_MECHANISM": 33,
    "ILLEGAL_SASL_STATE": 34,
    "SASL_AUTHENTICATION_FAILED": 58,
    "RESOURCE_NOT_FOUND": 91,
    "INVALID_UPDATE_VERSION": 95,
    "INELIGIBLE_REPLICA": 107,
    "INVALID_TIMESTAMP": 32,
    "INVALID_RECORD": 87,
    "OPERATION_NOT_ATTEMPTED": 55,
    "KAFKA_STORAGE_ERROR": 56,
}

# ... and those of the consumer-group protocol.
GROUP_CODES: dict[str, int] = {
    "ILLEGAL_GENERATION": 22,
    "INCONSISTENT_GROUP_PROTOCOL": 23,
    "UNKNOWN_MEMBER_ID": 25,
    "INVALID_SESSION_TIMEOUT": 26,
    "REBALANCE_IN_PROGRESS": 27,
    "MEMBER_ID_REQUIRED": 79,
    "GROUP_MAX_SIZE_REACHED": 81,
    "FENCED_INSTANCE_ID": 82,
}

COORDINATOR_RPCS = {
    "FindCoordinator",
    "InitProducerId",
    "AddPartitionsToTxn",
    "AddOffsetsToTxn",
    "EndTxn",
    "TxnOffsetCommit",
    "OffsetCommit",
    "OffsetFetch",
    "DescribeTransactions",
    "ListTransactions",
    "Metadata",
    "CreateTopics",
    "WriteTxnMarkers",
    "JoinGroup",
    "SyncGroup",
    "Heartbeat",
    "LeaveGroup",
    "DescribeGroups",
    "ListGroups",
    "RegisterDirectory",
    "ReserveOffsets",
    "NodeHeartbeat",
    "AlterPartition",
    "CreateAcls",
    "DescribeAcls",
    "DeleteAcls",
    "AlterUserScramCredentials",
    "DescribeUserScramCredentials",
}
PARTITION_LOG_RPCS = {
    "Produce",
    "Fetch",
    "ListOffsets",
    "WriteTxnMarkers",
    "DescribeProducers",
    "PartitionNodeStatus",
    "ReplicaFetch",
}


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "proto" / "generate.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"proto/generate.py failed:\n{result.stdout}{result.stderr}"
    fresh = _files(tmp_path / "raftcoord" / "protocol" / "v1")
    checked_in = _files(GENERATED_DIR)
    hint = "raftcoord/protocol/v1 is stale: run `make proto` and commit the result"
    assert sorted(checked_in) == sorted(fresh), hint
    stale = [name for name in fresh if fresh[name] != checked_in[name]]
    assert not stale, f"{hint} (differs: {', '.join(stale)})"


def test_error_codes_match_kafka() -> None:
    assert dict(common_pb2.ErrorCode.items()) == ERROR_CODES | EXTRA_KAFKA_CODES | GROUP_CODES


def _design_error_codes(text: str) -> dict[str, int]:
    """The (code, name) pairs of the error table, section 4 of docs/design.md."""
    match = re.search(r"^## 4\..*?(?=^## )", text, re.MULTILINE | re.DOTALL)
    assert match, "docs/design.md has no section 4"
    codes: dict[str, int] = {}
    for line in match.group(0).splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        code, name = cells[0], cells[1]
        if re.fullmatch(r"-?\d+", code):
            assert name not in codes, f"{name} listed twice in docs/design.md"
            codes[name] = int(code)
    return codes


def test_the_design_documents_every_error_code() -> None:
    documented = _design_error_codes(DESIGN_MD.read_text(encoding="utf-8"))
    assert documented == dict(common_pb2.ErrorCode.items())


def test_transaction_state_ids() -> None:
    expected = [
        "EMPTY",
        "ONGOING",
        "PREPARE_COMMIT",
        "PREPARE_ABORT",
        "COMPLETE_COMMIT",
        "COMPLETE_ABORT",
        "DEAD",
        "PREPARE_EPOCH_FENCE",
    ]
    assert common_pb2.TransactionState.items() == [
        (f"TRANSACTION_STATE_{name}", number) for number, name in enumerate(expected)
    ]


def test_kafka_enum_numbers() -> None:
    assert dict(coordinator_pb2.KeyType.items()) == {"GROUP": 0, "TRANSACTION": 1}
    assert dict(common_pb2.IsolationLevel.items()) == {"READ_UNCOMMITTED": 0, "READ_COMMITTED": 1}
    assert dict(common_pb2.TransactionResult.items()) == {"ABORT": 0, "COMMIT": 1}


@pytest.mark.parametrize(
    ("file", "service", "rpcs"),
    [
        (coordinator_pb2.DESCRIPTOR, "TransactionCoordinator", COORDINATOR_RPCS),
        (partition_log_pb2.DESCRIPTOR, "PartitionLog", PARTITION_LOG_RPCS),
        (admin_pb2.DESCRIPTOR, "CoordinatorAdmin", {"NodeStatus", "Ping", "ElectLeaders"}),
    ],
)
def test_service_methods(file: FileDescriptor, service: str, rpcs: set[str]) -> None:
    descriptor = file.services_by_name[service]
    assert set(descriptor.methods_by_name) == rpcs
    for name, method in descriptor.methods_by_name.items():
        assert not method.client_streaming and not method.server_streaming, name
        assert method.input_type.name == f"{name}Request"
        assert method.output_type.name == f"{name}Response"


def test_produce_request_preserves_key_presence() -> None:
    request = partition_log_pb2.ProduceRequest(
        partitions=[
            partition_log_pb2.PartitionProduceData(
                topic="t",
                partition=3,
                batch=partition_log_pb2.RecordBatch(
                    producer_id=-1,
                    producer_epoch=-1,
                    base_sequence=-1,
                    records=[
                        partition_log_pb2.Record(value=b"v"),
                        partition_log_pb2.Record(key=b"", value=b""),
                    ],
                ),
            )
        ]
    )
    absent, empty = request.partitions[0].batch.records
    assert absent.SerializeToString() != empty.SerializeToString()

    decoded = partition_log_pb2.ProduceRequest.FromString(request.SerializeToString())
    assert decoded == request
    assert not decoded.HasField("transactional_id")
    batch = decoded.partitions[0].batch
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (-1, -1, -1)
    absent, empty = batch.records
    assert not absent.HasField("key")
    assert absent.HasField("value") and absent.value == b"v"
    assert empty.HasField("key") and empty.key == b""
    assert empty.HasField("value") and empty.value == b""


def test_data_files_service() -> None:
    """DataFiles: a unary listing and a server stream of one file's bytes."""
    service = data_files_pb2.DESCRIPTOR.services_by_name["DataFiles"]
    listing = service.methods_by_name["ListDataFiles"]
    reading = service.methods_by_name["ReadDataFile"]
    assert set(service.methods_by_name) == {"ListDataFiles", "ReadDataFile"}
    assert not listing.client_streaming and not listing.server_streaming
    assert not reading.client_streaming and reading.server_streaming
    assert reading.output_type.name == "DataFileChunk"
