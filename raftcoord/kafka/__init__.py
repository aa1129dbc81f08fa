"""The Kafka wire-protocol gateway: unmodified Kafka clients against the
cluster's coordinators and partition-log nodes (docs/kafka.md)."""
