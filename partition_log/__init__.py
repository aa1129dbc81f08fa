"""Partition-log node: durable topic-partition logs, their producer state, and the gRPC service."""

#: The longest ``max_wait_ms`` a Fetch may ask for (Kafka bounds fetch.max.wait.ms
#: by the request timeout, whose default is 30 s); the consumer checks it too.
MAX_FETCH_WAIT_MS = 30_000
