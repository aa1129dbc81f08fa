"""The contract every component may import: the cluster config, the serve
helpers, the retry backoff (:mod:`.backoff`), the gRPC channel cache
(:mod:`.channels`) and the generated gRPC code of the
``raftcoord.protocol.v1`` protocol (:mod:`.v1`)."""
