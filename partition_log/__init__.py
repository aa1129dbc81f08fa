"""Partition-log node: durable topic-partition logs, their producer state, and the gRPC service."""
