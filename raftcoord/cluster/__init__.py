"""Local cluster tooling: the launcher (:mod:`.launcher`) and network
namespaces for partitions and delays (:mod:`.netns`)."""
