"""The coordinator node process: Raft-replicated shards of the transaction
state machine (:mod:`.node`, :mod:`.shard`, :mod:`.replica`,
:mod:`.raft_journal`), its gRPC services (:mod:`.service`) and the marker
writers of the shards it leads (:mod:`.markers`)."""
