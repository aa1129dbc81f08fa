"""The Spark exactly-once audit of a run (``raftcoord audit``, docs/audit.md): data
sources over the partition-log segments, the coordinators' applied-transitions logs and
the workload history, the checks over them, and the report."""
