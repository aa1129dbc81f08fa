"""Partition-log node: durable topic-partition logs (not built yet)."""
