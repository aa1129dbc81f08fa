"""Chaos testing: the workload that records a history (:mod:`.workload`,
:mod:`.history`) and the nemesis that breaks the cluster (:mod:`.nemesis`);
``raftcoord workload`` and ``raftcoord chaos`` (:mod:`.commands`)."""
