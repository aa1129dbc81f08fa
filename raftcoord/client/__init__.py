"""raftcoord's client library, shaped like Kafka's clients.

* :class:`TransactionalProducer`: exactly-once writes to many partitions,
  plus consumer offsets, committed or aborted together.
* :class:`Producer`: an idempotent producer (no duplicates on retry).
* :class:`Consumer`: reads assigned partitions (read_committed or
  read_uncommitted) and commits group offsets.
* :class:`Admin`: topics, listing/describing transactions, the producers of
  partitions and aborting hanging transactions (:mod:`raftcoord.client.hanging`
  finds them), consumer groups and their offsets, the nodes' state.

``bootstrap`` lists coordinator gRPC addresses; the client learns the
partition-log nodes and topic placement from the coordinators. Errors are
:class:`KafkaError` subclasses (see :mod:`raftcoord.client.errors`).

Example::

    from raftcoord.client import TransactionalProducer

    with TransactionalProducer(["127.0.0.1:7101"], transactional_id="tx-1") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("orders", key=b"k", value=b"v")
        producer.commit_transaction()
"""

from __future__ import annotations

from raftcoord.client._transactions import PreparedTxnState
from raftcoord.client.admin import Admin
from raftcoord.client.consumer import Consumer
from raftcoord.client.errors import (
    FatalError,
    IllegalStateError,
    InvalidTxnStateError,
    KafkaConnectionError,
    KafkaError,
    KafkaStorageError,
    KafkaTimeoutError,
    NotACoordinatorNodeError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    RetriableError,
    TopicAlreadyExistsError,
    TransactionAbortableError,
    TransactionAbortedError,
    UnknownTopicOrPartitionError,
    error_for,
)
from raftcoord.client.partitioner import DefaultPartitioner, murmur2
from raftcoord.client.producer import Producer, TransactionalProducer
from raftcoord.client.records import (
    AbortTransactionSpec,
    ConsumerGroupDescription,
    ConsumerRecord,
    CoordinatorDescription,
    MemberDescription,
    PartitionNodeDescription,
    PendingMarker,
    ProducerState,
    RecordMetadata,
    ShardReplicaDescription,
    TopicDescription,
    TopicPartition,
    TopicPartitionDescription,
    TransactionDescription,
    TransactionListing,
)

__all__ = [
    "AbortTransactionSpec",
    "Admin",
    "Consumer",
    "ConsumerGroupDescription",
    "ConsumerRecord",
    "CoordinatorDescription",
    "DefaultPartitioner",
    "FatalError",
    "IllegalStateError",
    "InvalidTxnStateError",
    "KafkaConnectionError",
    "KafkaError",
    "KafkaStorageError",
    "KafkaTimeoutError",
    "MemberDescription",
    "NotACoordinatorNodeError",
    "OutOfOrderSequenceError",
    "PartitionNodeDescription",
    "PendingMarker",
    "PreparedTxnState",
    "Producer",
    "ProducerFencedError",
    "ProducerState",
    "RecordMetadata",
    "RetriableError",
    "ShardReplicaDescription",
    "TopicAlreadyExistsError",
    "TopicDescription",
    "TopicPartition",
    "TopicPartitionDescription",
    "TransactionAbortableError",
    "TransactionAbortedError",
    "TransactionDescription",
    "TransactionListing",
    "TransactionalProducer",
    "UnknownTopicOrPartitionError",
    "error_for",
    "murmur2",
]
