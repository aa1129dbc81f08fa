"""Generated protobuf/gRPC code for the raftcoord.v1 protocol (do not edit; run `make proto`)."""
