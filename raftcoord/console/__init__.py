"""``raftcoord console``: a read-only web console of a cluster, as Kafka's
operators know from Kafka UI or AKHQ, much smaller.

One process asks the cluster through the client library (:mod:`raftcoord.client`,
never a node's internals) in rounds (:mod:`raftcoord.console.collect`), turns
the answers into the pages' figures (:mod:`raftcoord.console.model`, pure) and
serves them as HTML rendered on the server (:mod:`raftcoord.console.app`,
Starlette and Jinja2, under uvicorn: :mod:`raftcoord.console.server`).
"""
