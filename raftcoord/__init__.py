"""raftcoord: a Raft-replicated coordinator for Kafka-style exactly-once transactions."""

__version__ = "0.1.0"
