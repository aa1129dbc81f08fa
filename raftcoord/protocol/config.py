"""Cluster configuration (TOML): coordinator nodes, partition-log nodes, settings.

Example (``raftcoord/cluster/cluster.toml.template`` is what the local launcher writes)::

    shard_count = 3                      # transaction.state.log.num.partitions
    raft_key_file = "raft.key"           # the cluster's Raft key, beside this file

    [settings]                           # Kafka names where Kafka has the setting
    "transaction.max.timeout.ms" = 900000
    "transactional.id.expiration.ms" = 604800000
    "transaction.abort.timed.out.transaction.cleanup.interval.ms" = 1000
    "raft.fsync" = "always"              # always | batch | never
    "log.flush.policy" = "always"        # partition logs: always | interval | never
    "log.retention.ms" = 604800000       # -1: keep forever

    [topic_config.events]                # per-topic overrides on the partition-log nodes
    "retention.bytes" = 1073741824

    [[coordinators]]
    id = 1
    grpc = "127.0.0.1:7101"
    raft = ["127.0.0.1:7201", "127.0.0.1:7202", "127.0.0.1:7203"]   # one per shard

    [[partition_nodes]]
    id = 1
    grpc = "127.0.0.1:7301"
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raftcoord.protocol.limits import KAFKA_MAX_PRODUCER_EPOCH, TOPIC_NAME

FSYNC_POLICIES = ("always", "batch", "never")
LOG_FLUSH_POLICIES = ("always", "interval", "never")
#: node.scheduling: the Linux scheduling policy of a node's threads
#: (:func:`raftcoord.protocol.process.apply_scheduling`).
NODE_SCHEDULING_POLICIES = ("batch", "normal")


class ConfigError(Exception):
    """The configuration is missing or invalid; the message says what and where."""


@dataclass(frozen=True)
class NodeAddress:
    """One node: its id, gRPC address, (coordinators) one Raft address per
    shard, the address of its Prometheus metrics endpoint (None: none),
    (partition-log nodes) the address where it serves its followers'
    fetches and the coordinators' markers and (coordinators) the address
    where it serves the partition-log nodes' adds to transactions (None:
    its gRPC address)."""

    node_id: int
    grpc: str
    raft: tuple[str, ...] = ()
    metrics: str | None = None
    #: Where followers fetch from this node and coordinators write markers
    #: to it, over cluster links (None: its gRPC address, as gRPC calls).
    replication: str | None = None
    #: Where partition-log nodes add partitions to this coordinator's
    #: transactions, over cluster links (None: its gRPC address, as gRPC calls).
    link: str | None = None


@dataclass(frozen=True)
class KafkaListener:
    """One Kafka gateway (docs/kafka.md): its broker id, the address Kafka
    clients connect to, and how they authenticate there (Kafka's
    ``security.protocol``: :data:`KAFKA_SECURITY_PROTOCOLS`), and the
    address of its Prometheus metrics endpoint (None: none)."""

    node_id: int
    address: str
    security_protocol: str = "PLAINTEXT"
    metrics: str | None = None


#: A Kafka listener's ``security_protocol``: PLAINTEXT (no authentication:
#: every client is User:ANONYMOUS), SSL (TLS with a client certificate of
#: the cluster's CA: User:<CN>), SASL_SSL (TLS, then SASL PLAIN or
#: SCRAM-SHA-256/512 with the users the coordinators hold: User:<name>).
KAFKA_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL")


@dataclass(frozen=True)
class Settings:
    """Coordinator settings, Kafka names in comments."""

    transaction_max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    transactional_id_expiration_ms: int = 604_800_000  # transactional.id.expiration.ms
    # transaction.abort.timed.out.transaction.cleanup.interval.ms
    abort_timed_out_cleanup_interval_ms: int = 10_000
    # transactional.id.expiration check interval (Kafka:
    # transaction.remove.expired.transaction.cleanup.interval.ms)
    remove_expired_cleanup_interval_ms: int = 3_600_000
    fsync: str = "always"  # raft.fsync
    pid_block_size: int = 1000  # pid.block.size
    # raft.tick.ms: the longest a shard leader's tick thread sleeps waiting
    # for I/O; new requests and Raft messages wake it at once, so this only
    # paces timers (heartbeats, sweeps, parked requests' bounds) and the idle
    # CPU cost. A follower that hears from its leader sleeps up to a quarter
    # of the lowest election timeout instead (per idle coordinator of 3
    # shards: 3.2 % of a core with every shard at 25 ms, 2.4 % so).
    raft_tick_ms: float = 25.0
    # raft.heartbeat.ms: the leader's empty AppendEntries period. Entries are
    # sent as soon as they are proposed, not on this period.
    raft_heartbeat_ms: float = 50.0
    raft_election_timeout_ms: tuple[float, float] = (300.0, 600.0)  # raft.election.timeout.ms
    # node.scheduling: "batch" runs every thread of a node process under
    # Linux's SCHED_BATCH, so that a thread waking another (a request handed
    # to the shard thread, an answer handed back) is not preempted for it:
    # the woken thread needs the interpreter lock the waker still holds.
    # "normal": SCHED_OTHER (docs/performance.md, "Threads that wake threads").
    node_scheduling: str = "batch"
    # broker.heartbeat.interval.ms: how often a partition-log node heartbeats
    # to shard 0's leader (KRaft's broker heartbeat; docs/replication.md).
    broker_heartbeat_interval_ms: int = 2_000
    # broker.session.timeout.ms: a partition-log node not heard from for this
    # long is fenced: it leaves every ISR and leads nothing until it
    # heartbeats again (Kafka's defaults, both).
    broker_session_timeout_ms: int = 9_000
    # replica.lag.time.max.ms: a follower that has not caught up with its
    # leader's log end for this long leaves the ISR; one that reached the
    # high watermark joins it again (Kafka's default).
    replica_lag_time_max_ms: int = 30_000
    # default.replication.factor: the replicas of a topic created without a
    # replication factor (at most the partition-log nodes holding a lease);
    # min.insync.replicas: a topic's default (at most its replication factor).
    default_replication_factor: int = 3
    min_insync_replicas: int = 2
    # Partition-log nodes (docs/partition-log.md).
    log_segment_bytes: int = 64 << 20  # log.segment.bytes
    log_index_interval_bytes: int = 4096  # log.index.interval.bytes
    log_flush_policy: str = "always"  # log.flush.policy: always | interval | never
    log_flush_interval_ms: int = 1000  # log.flush.interval.ms (policy "interval")
    message_max_bytes: int = 1 << 20  # message.max.bytes: largest accepted batch
    # log.retention.ms / log.retention.bytes: the default retention.ms and
    # retention.bytes of every topic (-1: unlimited); [topic_config.<topic>]
    # overrides them per topic.
    log_retention_ms: int = 604_800_000
    log_retention_bytes: int = -1
    log_retention_check_interval_ms: int = 300_000  # log.retention.check.interval.ms
    # producer.epoch.max: the largest producer epoch (Kafka's is fixed at
    # 32767, a 16-bit field). Lower it only to test epoch exhaustion quickly.
    max_producer_epoch: int = KAFKA_MAX_PRODUCER_EPOCH
    # socket.request.max.bytes: the partition-log node's gRPC receive limit,
    # far above message.max.bytes so that an oversized batch is answered
    # MESSAGE_TOO_LARGE rather than refused by the transport.
    socket_request_max_bytes: int = 100 << 20
    # transaction.partition.verification.enable: a partition-log node asks the
    # coordinator to add the partition to the transaction before it appends
    # the transaction's first batch there (KIP-890 part 2), and producers
    # (told by InitProducerId) do not call AddPartitionsToTxn. Off, the node
    # appends the batch unverified and producers add partitions themselves;
    # a producer writing to a partition its coordinator never heard of then
    # leaves a hanging transaction there (`raftcoord txn find-hanging` finds it).
    transaction_partition_verification_enable: bool = True
    # transaction.two.phase.commit.enable (KIP-939): whether producers may
    # initialize for a two-phase commit run by an external transaction
    # manager (their transactions never time out). Off, such an
    # InitProducerId is TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
    transaction_two_phase_commit_enable: bool = False
    # add.partitions.to.txn.retry.backoff.max.ms (Kafka's, since 4.0): a
    # partition-log node whose add of a partition is answered
    # CONCURRENT_TRANSACTIONS (the producer's previous transaction is still
    # writing its markers) asks again, waiting at the coordinator for the
    # completion, for at most this long before it passes the answer on to
    # the producer. (Kafka's brokers ask again every
    # add.partitions.to.txn.retry.backoff.ms; these nodes need no backoff.)
    add_partitions_to_txn_retry_backoff_max_ms: int = 100
    # Consumer groups (docs/coordinator.md, "Consumer groups").
    group_min_session_timeout_ms: int = 6_000  # group.min.session.timeout.ms
    group_max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    group_initial_rebalance_delay_ms: int = 3_000  # group.initial.rebalance.delay.ms
    # transaction.park.timeout.ms: how long a coordinator holds a request for
    # a transactional.id whose previous transaction is still completing
    # (markers being written) before answering CONCURRENT_TRANSACTIONS; the
    # request runs as soon as the completion applies (Kafka answers at once
    # and the client backs off). Keep it well below the 10 s a coordinator
    # waits for a request's entry (longer, the request times out instead).
    transaction_park_timeout_ms: int = 1_000
    # auto.leader.rebalance.enable: shard s prefers coordinator s mod n (in
    # the order of [[coordinators]]); a leader that is not the preferred one
    # transfers its leadership to it at an imbalance check that finds the
    # preferred node up, its Raft log matching the leader's (Raft's
    # TimeoutNow; the election keeps every committed entry) and its share of
    # the shards it prefers but does not lead above
    # leader.imbalance.per.broker.percentage, so the shards' leaders spread
    # over the nodes without a restarted node taking its shards back at once.
    auto_leader_rebalance_enable: bool = True
    # leader.imbalance.check.interval.seconds: how often each coordinator
    # checks the shards it leads (the first check 5 s after it starts).
    leader_imbalance_check_interval_seconds: int = 300
    # leader.imbalance.per.broker.percentage (1..100).
    leader_imbalance_per_broker_percentage: int = 10
    # Kafka gateways (docs/kafka.md, "Bounds"). queued.max.request.bytes: the
    # bytes of request frames a gateway holds at once (being read or being
    # answered); a frame waits for room before its body is read, frames of
    # at most 1 MiB in a share of their own (an eighth) so that small
    # requests are served while big ones wait.
    queued_max_request_bytes: int = 256 << 20
    # connections.max.idle.ms: a connection with no request for this long is closed.
    connections_max_idle_ms: int = 600_000
    # max.connections: connections a gateway accepts at once; more are closed at once.
    max_connections: int = 2_000
    # max.connections.per.ip: the same for the connections of one client address.
    max_connections_per_ip: int = 1_000
    # max.connection.creation.rate.per.ip: new connections one client address
    # may open per second (bursts of as many); past it they are closed at
    # once. -1: unlimited (Kafka's connection_creation_rate quota).
    max_connection_creation_rate_per_ip: int = -1


_SETTING_NAMES = {
    "transaction.max.timeout.ms": "transaction_max_timeout_ms",
    "transactional.id.expiration.ms": "transactional_id_expiration_ms",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": (
        "abort_timed_out_cleanup_interval_ms"
    ),
    "transaction.remove.expired.transaction.cleanup.interval.ms": (
        "remove_expired_cleanup_interval_ms"
    ),
    "raft.fsync": "fsync",
    "pid.block.size": "pid_block_size",
    "raft.tick.ms": "raft_tick_ms",
    "raft.heartbeat.ms": "raft_heartbeat_ms",
    "raft.election.timeout.ms": "raft_election_timeout_ms",
    "node.scheduling": "node_scheduling",
    "broker.heartbeat.interval.ms": "broker_heartbeat_interval_ms",
    "broker.session.timeout.ms": "broker_session_timeout_ms",
    "replica.lag.time.max.ms": "replica_lag_time_max_ms",
    "default.replication.factor": "default_replication_factor",
    "min.insync.replicas": "min_insync_replicas",
    "log.segment.bytes": "log_segment_bytes",
    "log.index.interval.bytes": "log_index_interval_bytes",
    "log.flush.policy": "log_flush_policy",
    "log.flush.interval.ms": "log_flush_interval_ms",
    "message.max.bytes": "message_max_bytes",
    "log.retention.ms": "log_retention_ms",
    "log.retention.bytes": "log_retention_bytes",
    "log.retention.check.interval.ms": "log_retention_check_interval_ms",
    "producer.epoch.max": "max_producer_epoch",
    "socket.request.max.bytes": "socket_request_max_bytes",
    "transaction.partition.verification.enable": "transaction_partition_verification_enable",
    "transaction.two.phase.commit.enable": "transaction_two_phase_commit_enable",
    "add.partitions.to.txn.retry.backoff.max.ms": "add_partitions_to_txn_retry_backoff_max_ms",
    "group.min.session.timeout.ms": "group_min_session_timeout_ms",
    "group.max.session.timeout.ms": "group_max_session_timeout_ms",
    "group.initial.rebalance.delay.ms": "group_initial_rebalance_delay_ms",
    "transaction.park.timeout.ms": "transaction_park_timeout_ms",
    "auto.leader.rebalance.enable": "auto_leader_rebalance_enable",
    "leader.imbalance.check.interval.seconds": "leader_imbalance_check_interval_seconds",
    "leader.imbalance.per.broker.percentage": "leader_imbalance_per_broker_percentage",
    "queued.max.request.bytes": "queued_max_request_bytes",
    "connections.max.idle.ms": "connections_max_idle_ms",
    "max.connections": "max_connections",
    "max.connections.per.ip": "max_connections_per_ip",
    "max.connection.creation.rate.per.ip": "max_connection_creation_rate_per_ip",
}
#: A Produce request carries a batch's records as protobuf fields, which take
#: up to about 2.5 times the batch's encoded size (tiny records): the gRPC
#: limit must leave room for the largest legal batch.
REQUEST_BYTES_PER_BATCH_BYTE = 3
#: How long a coordinator's Raft transport waits for a peer's connection
#: (pysyncobj's connectionTimeout, 1 s as the coordinator sets it): pysyncobj
#: refuses an election timeout longer than this.
RAFT_CONNECTION_TIMEOUT_MS = 1000
_CHOICES = {
    "fsync": FSYNC_POLICIES,
    "log_flush_policy": LOG_FLUSH_POLICIES,
    "node_scheduling": NODE_SCHEDULING_POLICIES,
}
#: Settings for which -1 means unlimited.
_UNLIMITED = frozenset(
    {"log_retention_ms", "log_retention_bytes", "max_connection_creation_rate_per_ip"}
)
#: The topic-level settings of [topic_config.<topic>] (Kafka's names).
_TOPIC_SETTING_NAMES = {"retention.ms": "retention_ms", "retention.bytes": "retention_bytes"}


@dataclass(frozen=True)
class TopicRetention:
    """How long and how much of a topic's partitions the partition-log nodes keep
    (Kafka's retention.ms / retention.bytes; -1: unlimited)."""

    retention_ms: int
    retention_bytes: int


@dataclass(frozen=True)
class TlsConfig:
    """The ``[tls]`` table: mutual TLS on every gRPC connection
    (:mod:`raftcoord.protocol.tls`). Paths are relative to the config
    file's directory."""

    #: The cluster CA's certificate (PEM): every peer's certificate must chain to it.
    ca_file: Path
    #: Holds ``node-<id>.pem`` and ``node-<id>.key`` of every node.
    cert_dir: Path
    #: Principals (``User:<CN>``) that may act as the cluster besides the nodes.
    super_users: tuple[str, ...] = ()
    #: Kafka's ``allow.everyone.if.no.acl.found``: a resource no ACL names is
    #: open to every principal (off: closed to all but the cluster).
    allow_everyone_if_no_acl_found: bool = False
    #: Principals (``User:<CN>``) that may read the nodes' metrics endpoints
    #: besides the cluster's own (a Prometheus server's certificate).
    metrics_users: tuple[str, ...] = ()

    def node_files(self, node_id: int) -> tuple[Path, Path]:
        """(certificate, key) of node ``node_id``."""
        return (
            self.cert_dir / f"node-{node_id}.pem",
            self.cert_dir / f"node-{node_id}.key",
        )


@dataclass(frozen=True)
class ClusterConfig:
    """The whole cluster as every node sees it."""

    shard_count: int
    coordinators: tuple[NodeAddress, ...]
    partition_nodes: tuple[NodeAddress, ...] = ()
    settings: Settings = field(default_factory=Settings)
    #: Per-topic retention overrides ([topic_config.<topic>]); partial ones are
    #: completed from the settings' defaults.
    topic_config: dict[str, TopicRetention] = field(default_factory=dict)
    #: Kafka wire-protocol gateways ([[kafka_listeners]], docs/kafka.md).
    kafka_listeners: tuple[KafkaListener, ...] = ()
    #: The file holding the key Raft peers authenticate with (``raft_key_file``,
    #: relative to the config file's directory); None: not configured.
    raft_key_file: Path | None = None
    #: Mutual TLS on every gRPC connection; None: plaintext and anonymous.
    tls: TlsConfig | None = None

    def retention(self, topic: str) -> TopicRetention:
        """The retention of ``topic``: its override, else the node-wide defaults."""
        found = self.topic_config.get(topic)
        if found is not None:
            return found
        return TopicRetention(self.settings.log_retention_ms, self.settings.log_retention_bytes)

    def coordinator(self, node_id: int) -> NodeAddress:
        """The coordinator with ``node_id``.

        Raises:
            ConfigError: no such coordinator.
        """
        for node in self.coordinators:
            if node.node_id == node_id:
                return node
        known = ", ".join(str(n.node_id) for n in self.coordinators)
        raise ConfigError(f"no coordinator with id {node_id} (known: {known})")

    def partition_node(self, node_id: int) -> NodeAddress:
        """The partition-log node with ``node_id``.

        Raises:
            ConfigError: no such partition-log node.
        """
        for node in self.partition_nodes:
            if node.node_id == node_id:
                return node
        known = ", ".join(str(n.node_id) for n in self.partition_nodes)
        raise ConfigError(f"no partition-log node with id {node_id} (known: {known})")


#: Written into every node's data directory on its first start.
SHAPE_FILE = "cluster-shape.json"


@dataclass(frozen=True)
class ClusterShape:
    """What a cluster's data is laid out by: a transactional id or group lives
    on the shard its hash picks out of ``shard_count``; each shard's Raft
    group is exactly the coordinators; a topic's partitions live on the
    partition-log nodes the coordinators placed them on."""

    shard_count: int
    coordinators: tuple[int, ...]
    partition_nodes: tuple[int, ...]

    @classmethod
    def of(cls, config: ClusterConfig) -> ClusterShape:
        return cls(
            config.shard_count,
            tuple(sorted(n.node_id for n in config.coordinators)),
            tuple(sorted(n.node_id for n in config.partition_nodes)),
        )

    def __str__(self) -> str:
        return (
            f"{self.shard_count} shards, coordinators {list(self.coordinators)}, "
            f"partition-log nodes {list(self.partition_nodes)}"
        )

    def refusal(self, new: ClusterShape) -> str | None:
        """Why a cluster of shape ``new`` cannot serve data written by one of
        this shape (None: it can; partition-log nodes may be added)."""
        problems = []
        if new.shard_count != self.shard_count:
            problems.append(
                f"shard_count must stay {self.shard_count}: transactional ids and groups "
                "are assigned to shards by that number, so their state would not be found"
            )
        if new.coordinators != self.coordinators:
            problems.append(
                f"the coordinators must stay {list(self.coordinators)}: each shard's Raft "
                "group has exactly these members"
            )
        missing = sorted(set(self.partition_nodes) - set(new.partition_nodes))
        if missing:
            problems.append(
                f"partition-log nodes {missing} are missing: the partitions placed on them "
                "would be unreachable"
            )
        if not problems:
            return None
        return f"the data was written by a cluster of {self}, this config has {new}: " + "; ".join(
            problems
        )


def shape_refusal(data_dir: Path, config: ClusterConfig) -> str | None:
    """Why ``config`` cannot serve the data in a node's ``data_dir`` (None: it
    can, or the directory records no shape yet)."""
    try:
        raw = json.loads((data_dir / SHAPE_FILE).read_text())
        recorded = ClusterShape(
            int(raw["shard_count"]),
            tuple(int(n) for n in raw["coordinators"]),
            tuple(int(n) for n in raw["partition_nodes"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{data_dir / SHAPE_FILE} is unreadable: {exc}"
    refusal = recorded.refusal(ClusterShape.of(config))
    return None if refusal is None else f"{data_dir}: {refusal}"


def check_shape(data_dir: Path, config: ClusterConfig) -> None:
    """Refuse to start a node on data of another cluster shape, else record
    the shape (again, when partition-log nodes were added).

    Raises:
        ConfigError: what differs, and why that would hide data.
    """
    refusal = shape_refusal(data_dir, config)
    if refusal is not None:
        raise ConfigError(refusal + "; start it with the same shape, or use another data dir")
    shape = ClusterShape.of(config)
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = data_dir / (SHAPE_FILE + ".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(shape)))
    tmp.replace(data_dir / SHAPE_FILE)


def load_config(path: str | Path) -> ClusterConfig:
    """Read and validate a cluster config file.

    Raises:
        ConfigError: the file is missing, not TOML, or invalid.
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        config = parse_config(raw)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if config.raft_key_file is not None:
        config = dataclasses.replace(config, raft_key_file=path.parent / config.raft_key_file)
    if config.tls is not None:
        tls = dataclasses.replace(
            config.tls,
            ca_file=path.parent / config.tls.ca_file,
            cert_dir=path.parent / config.tls.cert_dir,
        )
        config = dataclasses.replace(config, tls=tls)
    return config


#: Hex digits of a Raft key (256 bits).
RAFT_KEY_HEX_DIGITS = 64


def new_raft_key() -> str:
    """A new Raft key, as the key file holds it."""
    return secrets.token_hex(RAFT_KEY_HEX_DIGITS // 2)


def write_raft_key(path: Path) -> None:
    """Write a new Raft key to ``path``, readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(new_raft_key() + "\n")


def read_raft_key(path: Path) -> bytes:
    """The key of a Raft key file: 64 hex digits, the file readable by its
    owner only.

    Raises:
        ConfigError: the file is missing, readable by others, or not a key.
    """
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"raft_key_file {path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        text = ""
    if mode & 0o077:
        raise ConfigError(
            f"raft_key_file {path}: readable by others (mode {mode & 0o777:o}); chmod 600 it"
        )
    if len(text) != RAFT_KEY_HEX_DIGITS or not all(c in "0123456789abcdefABCDEF" for c in text):
        raise ConfigError(
            f"raft_key_file {path}: must hold {RAFT_KEY_HEX_DIGITS} hex digits "
            "(e.g. `openssl rand -hex 32`)"
        )
    return bytes.fromhex(text)


def parse_config(raw: dict[str, Any]) -> ClusterConfig:
    """Validate an already parsed TOML document.

    Raises:
        ConfigError: what is wrong, naming the key.
    """
    unknown = set(raw) - {
        "shard_count",
        "settings",
        "coordinators",
        "partition_nodes",
        "topic_config",
        "kafka_listeners",
        "raft_key_file",
        "tls",
    }
    if unknown:
        raise ConfigError(f"unknown top-level keys: {sorted(unknown)}")
    shard_count = raw.get("shard_count", 3)
    if type(shard_count) is not int or not 1 <= shard_count <= 64:
        raise ConfigError(f"shard_count must be an integer in 1..64, got {shard_count!r}")
    coordinators = _nodes(raw.get("coordinators"), "coordinators", shard_count)
    if not coordinators:
        raise ConfigError("at least one [[coordinators]] entry is required")
    partition_nodes = _nodes(raw.get("partition_nodes", []), "partition_nodes", None)
    settings = _settings(raw.get("settings", {}))
    addresses = [n.grpc for n in coordinators + partition_nodes]
    addresses += [a for n in coordinators for a in n.raft]
    addresses += [n.replication for n in partition_nodes if n.replication is not None]
    addresses += [n.link for n in coordinators if n.link is not None]
    topic_config = _topic_config(raw.get("topic_config", {}), settings)
    kafka_listeners = _kafka_listeners(raw.get("kafka_listeners", []))
    addresses += [k.address for k in kafka_listeners]
    duplicated = sorted({a for a in addresses if addresses.count(a) > 1})
    if duplicated:
        raise ConfigError(f"addresses used twice: {duplicated}")
    node_ids = {n.node_id for n in coordinators + partition_nodes}
    listener_ids = [k.node_id for k in kafka_listeners]
    if len(set(listener_ids)) != len(listener_ids) or node_ids & set(listener_ids):
        raise ConfigError(
            f"[[kafka_listeners]] ids must be unique and differ from the nodes' ids, "
            f"got {listener_ids}"
        )
    key_file = raw.get("raft_key_file")
    if key_file is not None and (type(key_file) is not str or not key_file):
        raise ConfigError(f"raft_key_file must be a path, got {key_file!r}")
    tls = _tls(raw.get("tls"))
    secured = [k.node_id for k in kafka_listeners if k.security_protocol != "PLAINTEXT"]
    if secured and tls is None:
        raise ConfigError(
            f"[[kafka_listeners]] {secured} use TLS (SSL or SASL_SSL): the config needs [tls]"
        )
    return ClusterConfig(
        shard_count,
        coordinators,
        partition_nodes,
        settings,
        topic_config,
        kafka_listeners,
        Path(key_file) if key_file is not None else None,
        tls,
    )


def _tls(raw: Any) -> TlsConfig | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError("[tls] must be a table")
    known = {"ca_file", "cert_dir", "super_users", "metrics_users"}
    unknown = set(raw) - known - {"allow_everyone_if_no_acl_found"}
    if unknown:
        raise ConfigError(f"[tls]: unknown keys {sorted(unknown)}")
    paths = {}
    for key in ("ca_file", "cert_dir"):
        value = raw.get(key)
        if type(value) is not str or not value:
            raise ConfigError(f"[tls].{key} must be a path, got {value!r}")
        paths[key] = Path(value)
    supers, scrapers = (_principals(raw, key) for key in ("super_users", "metrics_users"))
    open_by_default = raw.get("allow_everyone_if_no_acl_found", False)
    if type(open_by_default) is not bool:
        raise ConfigError(
            f"[tls].allow_everyone_if_no_acl_found must be true or false, got {open_by_default!r}"
        )
    return TlsConfig(paths["ca_file"], paths["cert_dir"], supers, open_by_default, scrapers)


def _principals(raw: dict[str, Any], key: str) -> tuple[str, ...]:
    found = raw.get(key, [])
    if not isinstance(found, list) or not all(
        type(u) is str and u.startswith("User:") and len(u) > 5 for u in found
    ):
        raise ConfigError(f'[tls].{key} must be a list of "User:<name>", got {found!r}')
    return tuple(found)


def _kafka_listeners(raw: Any) -> tuple[KafkaListener, ...]:
    if not isinstance(raw, list):
        raise ConfigError("[[kafka_listeners]] must be an array of tables")
    listeners = []
    for i, entry in enumerate(raw):
        where = f"kafka_listeners[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a table")
        keys = {"id", "address", "security_protocol", "metrics"}
        if set(entry) - keys:
            raise ConfigError(f"{where}: unknown keys {sorted(set(entry) - keys)}")
        node_id = entry.get("id")
        if type(node_id) is not int or node_id < 1:
            raise ConfigError(f"{where}.id must be a positive integer, got {node_id!r}")
        protocol = entry.get("security_protocol", "PLAINTEXT")
        if protocol not in KAFKA_SECURITY_PROTOCOLS:
            raise ConfigError(
                f"{where}.security_protocol must be one of {list(KAFKA_SECURITY_PROTOCOLS)}, "
                f"got {protocol!r}"
            )
        listeners.append(
            KafkaListener(
                node_id,
                _address(entry.get("address"), f"{where}.address"),
                protocol,
                _metrics_address(entry, where),
            )
        )
    return tuple(listeners)


def _topic_config(raw: Any, settings: Settings) -> dict[str, TopicRetention]:
    if not isinstance(raw, dict):
        raise ConfigError("[topic_config] must be a table of [topic_config.<topic>] tables")
    config = {}
    for topic, entries in raw.items():
        where = f"topic_config.{topic}"
        if not TOPIC_NAME.fullmatch(topic):
            raise ConfigError(f"[{where}]: not a valid topic name")
        if not isinstance(entries, dict):
            raise ConfigError(f"[{where}] must be a table")
        values = {
            "retention_ms": settings.log_retention_ms,
            "retention_bytes": settings.log_retention_bytes,
        }
        for name, value in entries.items():
            attr = _TOPIC_SETTING_NAMES.get(name)
            if attr is None:
                raise ConfigError(
                    f"[{where}]: unknown setting {name!r} (known: {sorted(_TOPIC_SETTING_NAMES)})"
                )
            if type(value) is not int or (value < 1 and value != -1):
                raise ConfigError(f"[{where}] {name} must be -1 or a positive integer")
            values[attr] = value
        config[topic] = TopicRetention(**values)
    return config


def _address(value: Any, where: str) -> str:
    if not isinstance(value, str) or value.count(":") != 1:
        raise ConfigError(f"{where} must be 'host:port', got {value!r}")
    host, port = value.split(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{where} must be 'host:port' with a port in 1..65535, got {value!r}")
    return value


def _metrics_address(entry: dict[str, Any], where: str) -> str | None:
    value = entry.get("metrics")
    return None if value is None else _address(value, f"{where}.metrics")


def _nodes(raw: Any, key: str, shard_count: int | None) -> tuple[NodeAddress, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"[[{key}]] must be an array of tables")
    nodes = []
    for i, entry in enumerate(raw):
        where = f"{key}[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a table")
        allowed = {"id", "grpc", "metrics"} | (
            {"raft", "link"} if shard_count is not None else {"replication"}
        )
        if set(entry) - allowed:
            raise ConfigError(f"{where}: unknown keys {sorted(set(entry) - allowed)}")
        node_id = entry.get("id")
        if type(node_id) is not int or node_id < 1:
            raise ConfigError(f"{where}.id must be a positive integer, got {node_id!r}")
        grpc = _address(entry.get("grpc"), f"{where}.grpc")
        raft: tuple[str, ...] = ()
        if shard_count is not None:
            ports = entry.get("raft")
            if not isinstance(ports, list) or len(ports) != shard_count:
                raise ConfigError(
                    f"{where}.raft must list {shard_count} addresses (one per shard), got {ports!r}"
                )
            raft = tuple(_address(a, f"{where}.raft[{j}]") for j, a in enumerate(ports))
        replication, link = entry.get("replication"), entry.get("link")
        nodes.append(
            NodeAddress(
                node_id,
                grpc,
                raft,
                _metrics_address(entry, where),
                None if replication is None else _address(replication, f"{where}.replication"),
                None if link is None else _address(link, f"{where}.link"),
            )
        )
    ids = [n.node_id for n in nodes]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"[[{key}]] ids must be unique, got {ids}")
    return tuple(nodes)


def _settings(raw: Any) -> Settings:
    if not isinstance(raw, dict):
        raise ConfigError("[settings] must be a table")
    values: dict[str, Any] = {}
    for name, value in raw.items():
        attr = _SETTING_NAMES.get(name)
        if attr is None:
            raise ConfigError(f"unknown setting {name!r} (known: {sorted(_SETTING_NAMES)})")
        values[attr] = value
    defaults = Settings()
    for attr, value in values.items():
        default = getattr(defaults, attr)
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"setting for {attr} must be true or false, got {value!r}")
        elif isinstance(default, tuple):
            ok = (
                isinstance(value, list)
                and len(value) == 2
                and all(isinstance(v, int | float) and v > 0 for v in value)
            )
            if not ok:
                raise ConfigError(f"setting for {attr} must be [low, high] milliseconds")
            values[attr] = (float(value[0]), float(value[1]))
        elif isinstance(default, str):
            if value not in _CHOICES[attr]:
                name = next(k for k, v in _SETTING_NAMES.items() if v == attr)
                raise ConfigError(f"{name} must be one of {_CHOICES[attr]}, got {value!r}")
        elif isinstance(default, float):
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"setting for {attr} must be a positive number, got {value!r}")
            values[attr] = float(value)
        elif attr in _UNLIMITED and type(value) is int and value == -1:
            pass
        elif type(value) is not int or value < 1:
            unlimited = " or -1" if attr in _UNLIMITED else ""
            raise ConfigError(
                f"setting for {attr} must be a positive integer{unlimited}, got {value!r}"
            )
    settings = Settings(**values)
    if settings.transaction_max_timeout_ms > 2**31 - 1:
        raise ConfigError("transaction.max.timeout.ms must fit in 32 bits")
    if not 2 <= settings.max_producer_epoch <= KAFKA_MAX_PRODUCER_EPOCH:
        raise ConfigError(f"producer.epoch.max must be in 2..{KAFKA_MAX_PRODUCER_EPOCH}")
    if settings.socket_request_max_bytes > 2**31 - 1:
        raise ConfigError("socket.request.max.bytes must fit in 32 bits")
    if settings.leader_imbalance_per_broker_percentage > 100:
        raise ConfigError("leader.imbalance.per.broker.percentage must be in 1..100")
    if settings.broker_heartbeat_interval_ms >= settings.broker_session_timeout_ms:
        raise ConfigError("broker.heartbeat.interval.ms must be below broker.session.timeout.ms")
    low, high = settings.raft_election_timeout_ms
    if low >= high:
        raise ConfigError(
            f"raft.election.timeout.ms must be [low, high] with low < high, got [{low:g}, {high:g}]"
        )
    if high > RAFT_CONNECTION_TIMEOUT_MS:
        raise ConfigError(
            f"raft.election.timeout.ms: its high end must be at most {RAFT_CONNECTION_TIMEOUT_MS} "
            f"(the Raft transport's connection timeout), got {high:g}"
        )
    if 3 * settings.raft_heartbeat_ms >= low:
        raise ConfigError(
            f"raft.heartbeat.ms must be below a third of raft.election.timeout.ms's low end "
            f"({low:g}: a follower must hear three heartbeats before it campaigns), "
            f"got {settings.raft_heartbeat_ms:g}"
        )
    if settings.group_min_session_timeout_ms > settings.group_max_session_timeout_ms:
        raise ConfigError("group.min.session.timeout.ms exceeds group.max.session.timeout.ms")
    if (
        settings.socket_request_max_bytes
        < REQUEST_BYTES_PER_BATCH_BYTE * settings.message_max_bytes
    ):
        raise ConfigError(
            f"socket.request.max.bytes must be at least {REQUEST_BYTES_PER_BATCH_BYTE} times "
            "message.max.bytes (a request carries a batch as protobuf fields, which take up "
            f"to about 2.5 times its encoded size), got {settings.socket_request_max_bytes} "
            f"for message.max.bytes={settings.message_max_bytes}"
        )
    return settings
