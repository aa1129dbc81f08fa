"""The contract every component may import: the cluster config, the serve
helpers and the generated gRPC code of the ``raftcoord.protocol.v1`` protocol
(:mod:`.v1`)."""
