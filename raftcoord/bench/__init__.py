"""``raftcoord bench``: the benchmarks, one suite each.

* (no suite) :mod:`raftcoord.bench.targets`: a local cluster against the
  machine's ceilings and the performance targets (docs/performance.md);
* ``grpc``: :mod:`raftcoord.bench.grpc_style`, the gRPC server style (thread
  pool or ``grpc.aio``) on an empty call;
* ``coordinator``: :mod:`raftcoord.bench.coordinator`, the coordinator's
  requests through the generated stubs per fsync policy, group commit and
  idle CPU (docs/coordinator.md);
* ``raft``: :mod:`raftcoord.bench.raft_commit`, plain pysyncobj commits per
  fsync policy and tick;
* ``plog-startup``: :mod:`raftcoord.bench.plog_startup`, a partition's
  start-up time against its log size (docs/partition-log.md);
* ``audit``: :mod:`raftcoord.bench.audit`, the Spark audit's time by run size
  (docs/audit.md);
* ``snapshot``: :mod:`raftcoord.bench.snapshot`, a shard's log compaction
  (longest tick, snapshot encoding and restore) against its open
  transactions (docs/performance.md);
* ``kafka-codec``: :mod:`raftcoord.bench.kafka_codec`, Kafka's message
  codecs, kio against kafka-python's classes (docs/kafka.md);
* ``kafka-gateway``: :mod:`raftcoord.bench.kafka_gateway`, confluent-kafka
  through the Kafka gateway against the native client over gRPC
  (docs/kafka.md).

Only the command line imports this package.
"""
