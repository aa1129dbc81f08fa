from raftcoord.protocol.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OffsetSpec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OFFSET_SPEC_EARLIEST: _ClassVar[OffsetSpec]
    OFFSET_SPEC_LATEST: _ClassVar[OffsetSpec]
    OFFSET_SPEC_LAST_STABLE: _ClassVar[OffsetSpec]
OFFSET_SPEC_EARLIEST: OffsetSpec
OFFSET_SPEC_LATEST: OffsetSpec
OFFSET_SPEC_LAST_STABLE: OffsetSpec

class RecordHeader(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class Record(_message.Message):
    __slots__ = ("key", "value", "headers", "timestamp_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    headers: _containers.RepeatedCompositeFieldContainer[RecordHeader]
    timestamp_ms: int
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Iterable[_Union[RecordHeader, _Mapping]]] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class RecordBatch(_message.Message):
    __slots__ = ("producer_id", "producer_epoch", "base_sequence", "is_transactional", "records")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    BASE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    IS_TRANSACTIONAL_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_transactional: bool
    records: _containers.RepeatedCompositeFieldContainer[Record]
    def __init__(self, producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., base_sequence: _Optional[int] = ..., is_transactional: _Optional[bool] = ..., records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ...) -> None: ...

class PartitionProduceData(_message.Message):
    __slots__ = ("topic", "partition", "batch", "raw_batch", "current_leader_epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    RAW_BATCH_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    batch: RecordBatch
    raw_batch: bytes
    current_leader_epoch: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., batch: _Optional[_Union[RecordBatch, _Mapping]] = ..., raw_batch: _Optional[bytes] = ..., current_leader_epoch: _Optional[int] = ...) -> None: ...

class ProduceRequest(_message.Message):
    __slots__ = ("transactional_id", "partitions", "transaction_partitions", "acks")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionProduceData]
    transaction_partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartitions]
    acks: int
    def __init__(self, transactional_id: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionProduceData, _Mapping]]] = ..., transaction_partitions: _Optional[_Iterable[_Union[_common_pb2.TopicPartitions, _Mapping]]] = ..., acks: _Optional[int] = ...) -> None: ...

class PartitionProduceResponse(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message", "base_offset", "log_start_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    base_offset: int
    log_start_offset: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., base_offset: _Optional[int] = ..., log_start_offset: _Optional[int] = ...) -> None: ...

class ProduceResponse(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionProduceResponse]
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionProduceResponse, _Mapping]]] = ...) -> None: ...

class FetchPartition(_message.Message):
    __slots__ = ("topic", "partition", "fetch_offset", "partition_max_bytes", "current_leader_epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    FETCH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PARTITION_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., fetch_offset: _Optional[int] = ..., partition_max_bytes: _Optional[int] = ..., current_leader_epoch: _Optional[int] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("isolation_level", "max_bytes", "partitions", "max_wait_ms", "min_bytes", "raw")
    ISOLATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    isolation_level: _common_pb2.IsolationLevel
    max_bytes: int
    partitions: _containers.RepeatedCompositeFieldContainer[FetchPartition]
    max_wait_ms: int
    min_bytes: int
    raw: bool
    def __init__(self, isolation_level: _Optional[_Union[_common_pb2.IsolationLevel, str]] = ..., max_bytes: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[FetchPartition, _Mapping]]] = ..., max_wait_ms: _Optional[int] = ..., min_bytes: _Optional[int] = ..., raw: _Optional[bool] = ...) -> None: ...

class AbortedTransaction(_message.Message):
    __slots__ = ("producer_id", "first_offset")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    first_offset: int
    def __init__(self, producer_id: _Optional[int] = ..., first_offset: _Optional[int] = ...) -> None: ...

class FetchedRecord(_message.Message):
    __slots__ = ("offset", "timestamp_ms", "key", "value", "headers", "producer_id", "producer_epoch", "is_transactional")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    IS_TRANSACTIONAL_FIELD_NUMBER: _ClassVar[int]
    offset: int
    timestamp_ms: int
    key: bytes
    value: bytes
    headers: _containers.RepeatedCompositeFieldContainer[RecordHeader]
    producer_id: int
    producer_epoch: int
    is_transactional: bool
    def __init__(self, offset: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Iterable[_Union[RecordHeader, _Mapping]]] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., is_transactional: _Optional[bool] = ...) -> None: ...

class FetchPartitionResponse(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message", "high_watermark", "last_stable_offset", "log_start_offset", "next_fetch_offset", "records", "raw_batches", "aborted_transactions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LAST_STABLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_FETCH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    RAW_BATCHES_FIELD_NUMBER: _ClassVar[int]
    ABORTED_TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    next_fetch_offset: int
    records: _containers.RepeatedCompositeFieldContainer[FetchedRecord]
    raw_batches: bytes
    aborted_transactions: _containers.RepeatedCompositeFieldContainer[AbortedTransaction]
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., high_watermark: _Optional[int] = ..., last_stable_offset: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., next_fetch_offset: _Optional[int] = ..., records: _Optional[_Iterable[_Union[FetchedRecord, _Mapping]]] = ..., raw_batches: _Optional[bytes] = ..., aborted_transactions: _Optional[_Iterable[_Union[AbortedTransaction, _Mapping]]] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[FetchPartitionResponse]
    def __init__(self, partitions: _Optional[_Iterable[_Union[FetchPartitionResponse, _Mapping]]] = ...) -> None: ...

class ListOffsetsPartition(_message.Message):
    __slots__ = ("topic", "partition", "spec", "current_leader_epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    spec: OffsetSpec
    current_leader_epoch: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., spec: _Optional[_Union[OffsetSpec, str]] = ..., current_leader_epoch: _Optional[int] = ...) -> None: ...

class ListOffsetsRequest(_message.Message):
    __slots__ = ("isolation_level", "partitions")
    ISOLATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    isolation_level: _common_pb2.IsolationLevel
    partitions: _containers.RepeatedCompositeFieldContainer[ListOffsetsPartition]
    def __init__(self, isolation_level: _Optional[_Union[_common_pb2.IsolationLevel, str]] = ..., partitions: _Optional[_Iterable[_Union[ListOffsetsPartition, _Mapping]]] = ...) -> None: ...

class ListOffsetsPartitionResponse(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message", "offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    offset: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class ListOffsetsResponse(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[ListOffsetsPartitionResponse]
    def __init__(self, partitions: _Optional[_Iterable[_Union[ListOffsetsPartitionResponse, _Mapping]]] = ...) -> None: ...

class TxnMarker(_message.Message):
    __slots__ = ("producer_id", "producer_epoch", "coordinator_epoch", "result", "topics", "transactional_id", "groups", "admin_abort", "transaction_version", "txn_number")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_EPOCH_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    ADMIN_ABORT_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_VERSION_FIELD_NUMBER: _ClassVar[int]
    TXN_NUMBER_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    result: _common_pb2.TransactionResult
    topics: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartitions]
    transactional_id: str
    groups: _containers.RepeatedScalarFieldContainer[str]
    admin_abort: bool
    transaction_version: int
    txn_number: int
    def __init__(self, producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., coordinator_epoch: _Optional[int] = ..., result: _Optional[_Union[_common_pb2.TransactionResult, str]] = ..., topics: _Optional[_Iterable[_Union[_common_pb2.TopicPartitions, _Mapping]]] = ..., transactional_id: _Optional[str] = ..., groups: _Optional[_Iterable[str]] = ..., admin_abort: _Optional[bool] = ..., transaction_version: _Optional[int] = ..., txn_number: _Optional[int] = ...) -> None: ...

class WriteTxnMarkersRequest(_message.Message):
    __slots__ = ("markers",)
    MARKERS_FIELD_NUMBER: _ClassVar[int]
    markers: _containers.RepeatedCompositeFieldContainer[TxnMarker]
    def __init__(self, markers: _Optional[_Iterable[_Union[TxnMarker, _Mapping]]] = ...) -> None: ...

class TxnMarkerResult(_message.Message):
    __slots__ = ("producer_id", "producer_epoch", "partitions", "groups")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    producer_epoch: int
    partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.PartitionResult]
    groups: _containers.RepeatedCompositeFieldContainer[GroupResult]
    def __init__(self, producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[_common_pb2.PartitionResult, _Mapping]]] = ..., groups: _Optional[_Iterable[_Union[GroupResult, _Mapping]]] = ...) -> None: ...

class GroupResult(_message.Message):
    __slots__ = ("group_id", "error_code")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    error_code: _common_pb2.ErrorCode
    def __init__(self, group_id: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ...) -> None: ...

class WriteTxnMarkersResponse(_message.Message):
    __slots__ = ("markers",)
    MARKERS_FIELD_NUMBER: _ClassVar[int]
    markers: _containers.RepeatedCompositeFieldContainer[TxnMarkerResult]
    def __init__(self, markers: _Optional[_Iterable[_Union[TxnMarkerResult, _Mapping]]] = ...) -> None: ...

class DescribeProducersRequest(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartitions]
    def __init__(self, topics: _Optional[_Iterable[_Union[_common_pb2.TopicPartitions, _Mapping]]] = ...) -> None: ...

class ActiveProducer(_message.Message):
    __slots__ = ("producer_id", "producer_epoch", "last_sequence", "last_timestamp_ms", "coordinator_epoch", "current_txn_start_offset")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    LAST_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TXN_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp_ms: int
    coordinator_epoch: int
    current_txn_start_offset: int
    def __init__(self, producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., last_sequence: _Optional[int] = ..., last_timestamp_ms: _Optional[int] = ..., coordinator_epoch: _Optional[int] = ..., current_txn_start_offset: _Optional[int] = ...) -> None: ...

class DescribeProducersPartitionResponse(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message", "active_producers")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_PRODUCERS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    active_producers: _containers.RepeatedCompositeFieldContainer[ActiveProducer]
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., active_producers: _Optional[_Iterable[_Union[ActiveProducer, _Mapping]]] = ...) -> None: ...

class DescribeProducersResponse(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[DescribeProducersPartitionResponse]
    def __init__(self, partitions: _Optional[_Iterable[_Union[DescribeProducersPartitionResponse, _Mapping]]] = ...) -> None: ...

class PartitionNodeStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RefusedPartition(_message.Message):
    __slots__ = ("topic", "partition", "reason")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    reason: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class PartitionNodeStatusResponse(_message.Message):
    __slots__ = ("node_id", "pid", "directory_id", "directory_state", "refused")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    DIRECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    DIRECTORY_STATE_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    pid: int
    directory_id: str
    directory_state: str
    refused: _containers.RepeatedCompositeFieldContainer[RefusedPartition]
    def __init__(self, node_id: _Optional[int] = ..., pid: _Optional[int] = ..., directory_id: _Optional[str] = ..., directory_state: _Optional[str] = ..., refused: _Optional[_Iterable[_Union[RefusedPartition, _Mapping]]] = ...) -> None: ...

class ReplicaFetchPartition(_message.Message):
    __slots__ = ("topic", "partition", "current_leader_epoch", "fetch_offset", "last_fetched_epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FETCH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_FETCHED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., current_leader_epoch: _Optional[int] = ..., fetch_offset: _Optional[int] = ..., last_fetched_epoch: _Optional[int] = ...) -> None: ...

class ReplicaFetchRequest(_message.Message):
    __slots__ = ("replica_id", "max_wait_ms", "partition_max_bytes", "partitions")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    replica_id: int
    max_wait_ms: int
    partition_max_bytes: int
    partitions: _containers.RepeatedCompositeFieldContainer[ReplicaFetchPartition]
    def __init__(self, replica_id: _Optional[int] = ..., max_wait_ms: _Optional[int] = ..., partition_max_bytes: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[ReplicaFetchPartition, _Mapping]]] = ...) -> None: ...

class EpochEndOffset(_message.Message):
    __slots__ = ("epoch", "end_offset")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    end_offset: int
    def __init__(self, epoch: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class ReplicaFetchPartitionResponse(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message", "high_watermark", "log_start_offset", "records", "diverging_epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    DIVERGING_EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    high_watermark: int
    log_start_offset: int
    records: bytes
    diverging_epoch: EpochEndOffset
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., high_watermark: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., records: _Optional[bytes] = ..., diverging_epoch: _Optional[_Union[EpochEndOffset, _Mapping]] = ...) -> None: ...

class ReplicaFetchResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "partitions")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    partitions: _containers.RepeatedCompositeFieldContainer[ReplicaFetchPartitionResponse]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[ReplicaFetchPartitionResponse, _Mapping]]] = ...) -> None: ...
