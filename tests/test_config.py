"""Cluster config parsing: valid files load, invalid ones say what is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raftcoord.cluster.launcher import write_config
from raftcoord.coordinator.settings import fsm_config
from raftcoord.protocol.config import (
    SHAPE_FILE,
    ClusterShape,
    ConfigError,
    check_shape,
    load_config,
    parse_config,
    read_raft_key,
)


def minimal(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "shard_count": 2,
        "coordinators": [
            {"id": 1, "grpc": "127.0.0.1:7001", "raft": ["127.0.0.1:7101", "127.0.0.1:7102"]},
            {"id": 2, "grpc": "127.0.0.1:7002", "raft": ["127.0.0.1:7201", "127.0.0.1:7202"]},
        ],
    }
    raw.update(changes)
    return raw


def test_minimal_config_and_defaults() -> None:
    config = parse_config(minimal())
    assert config.shard_count == 2
    assert [n.node_id for n in config.coordinators] == [1, 2]
    assert config.settings.fsync == "always"
    assert config.settings.node_scheduling == "batch"
    assert config.settings.transaction_max_timeout_ms == 900_000
    assert config.coordinator(2).raft == ("127.0.0.1:7201", "127.0.0.1:7202")
    with pytest.raises(ConfigError, match="no coordinator with id 9"):
        config.coordinator(9)


def test_kafka_named_settings() -> None:
    config = parse_config(
        minimal(
            settings={
                "transaction.max.timeout.ms": 1000,
                "transactional.id.expiration.ms": 5000,
                "transaction.abort.timed.out.transaction.cleanup.interval.ms": 250,
                "raft.fsync": "batch",
                "raft.election.timeout.ms": [200, 400],
                "node.scheduling": "normal",
            }
        )
    )
    s = config.settings
    assert (s.transaction_max_timeout_ms, s.transactional_id_expiration_ms) == (1000, 5000)
    assert s.abort_timed_out_cleanup_interval_ms == 250 and s.fsync == "batch"
    assert s.raft_election_timeout_ms == (200.0, 400.0)
    assert s.node_scheduling == "normal"
    assert fsm_config(s).transaction_max_timeout_ms == 1000


def test_partition_verification_switch() -> None:
    assert parse_config(minimal()).settings.transaction_partition_verification_enable
    off = {"transaction.partition.verification.enable": False}
    assert not parse_config(
        minimal(settings=off)
    ).settings.transaction_partition_verification_enable


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"shard_count": 0}, "shard_count"),
        ({"shard_count": "3"}, "shard_count"),
        ({"coordinators": []}, "at least one"),
        ({"coordinators": [{"id": 1, "grpc": "nohost", "raft": ["a:1", "b:2"]}]}, "host:port"),
        (
            {"coordinators": [{"id": 1, "grpc": "127.0.0.1:1", "raft": ["127.0.0.1:2"]}]},
            "2 addresses",
        ),
        ({"coordinators": [{"id": 0, "grpc": "127.0.0.1:1", "raft": ["h:2", "h:3"]}]}, "id"),
        ({"settings": {"raft.fsync": "sometimes"}}, "raft.fsync"),
        ({"settings": {"node.scheduling": "realtime"}}, "node.scheduling"),
        ({"settings": {"no.such.setting": 1}}, "unknown setting"),
        ({"settings": {"transaction.max.timeout.ms": -1}}, "positive integer"),
        ({"settings": {"message.max.bytes": 50 << 20}}, "socket.request.max.bytes must be at"),
        ({"settings": {"socket.request.max.bytes": 2**31}}, "32 bits"),
        ({"settings": {"transaction.partition.verification.enable": 0}}, "true or false"),
        ({"extra": 1}, "unknown top-level"),
        (
            {"tls": {"ca_file": "ca.pem", "cert_dir": "tls", "metrics_users": ["prometheus"]}},
            'metrics_users must be a list of "User:<name>"',
        ),
        (
            {"partition_nodes": [{"id": 101, "grpc": "127.0.0.1:7300", "replication": "7320"}]},
            "partition_nodes\\[0\\].replication must be 'host:port'",
        ),
        (
            {
                "partition_nodes": [
                    {"id": 101, "grpc": "127.0.0.1:7300", "replication": "127.0.0.1:7300"}
                ]
            },
            "used twice",
        ),
        (
            {"partition_nodes": [{"id": 101, "grpc": "127.0.0.1:7300", "link": "127.0.0.1:7320"}]},
            "unknown keys \\['link'\\]",
        ),
        (
            {
                "coordinators": [
                    {"id": 1, "grpc": "127.0.0.1:1", "raft": ["h:2", "h:3"], "link": "h:2"}
                ]
            },
            "used twice",
        ),
    ],
)
def test_invalid_configs_are_clear_errors(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(minimal(**changes))


def test_metrics_users() -> None:
    tls = {"ca_file": "ca.pem", "cert_dir": "tls"}
    assert parse_config(minimal(tls=tls)).tls.metrics_users == ()  # type: ignore[union-attr]
    config = parse_config(minimal(tls={**tls, "metrics_users": ["User:prometheus"]}))
    assert config.tls is not None and config.tls.metrics_users == ("User:prometheus",)


def test_duplicate_ids_and_addresses() -> None:
    raw = minimal()
    raw["coordinators"][1]["id"] = 1
    with pytest.raises(ConfigError, match="unique"):
        parse_config(raw)
    raw = minimal()
    raw["coordinators"][1]["grpc"] = "127.0.0.1:7001"
    with pytest.raises(ConfigError, match="used twice"):
        parse_config(raw)


def test_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("shard_count = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(broken)
    written = tmp_path / "cluster.toml"
    write_config(written, coordinators=3, shards=4, fsync="batch")
    config = load_config(written)
    assert config.shard_count == 4 and len(config.coordinators) == 3
    assert all(len(n.raft) == 4 for n in config.coordinators)
    assert config.settings.fsync == "batch"
    # Followers fetch from a partition-log node's replication listener.
    replication = {n.replication for n in config.partition_nodes}
    assert None not in replication and len(replication) == len(config.partition_nodes)
    assert replication.isdisjoint(n.grpc for n in config.partition_nodes)
    # Partition-log nodes add partitions at a coordinator's link listener.
    links = {n.link for n in config.coordinators}
    assert None not in links and len(links) == len(config.coordinators)
    assert links.isdisjoint(n.grpc for n in config.coordinators)
    # A setting given replaces the template's entry of that name.
    write_config(
        written, coordinators=3, shards=4, settings={"raft.tick.ms": 25, "pid.block.size": 50}
    )
    settings = load_config(written).settings
    assert (settings.raft_tick_ms, settings.pid_block_size) == (25.0, 50)


def test_the_raft_key_file(tmp_path: Path) -> None:
    """The launcher writes a key beside the config, for its owner only; a
    node reads it from the config's directory and refuses a key file that
    others can read or that holds no key."""
    written = tmp_path / "cluster.toml"
    write_config(written, coordinators=3, shards=1)
    config = load_config(written)
    assert config.raft_key_file == tmp_path / "raft.key"
    assert config.raft_key_file.stat().st_mode & 0o777 == 0o600
    key = read_raft_key(config.raft_key_file)
    assert len(key) == 32
    write_config(written, coordinators=3, shards=1)  # written again: the same key
    assert read_raft_key(config.raft_key_file) == key
    config.raft_key_file.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        read_raft_key(config.raft_key_file)
    short = tmp_path / "short.key"
    short.write_text("abcd\n")
    short.chmod(0o600)
    with pytest.raises(ConfigError, match="64 hex digits"):
        read_raft_key(short)
    with pytest.raises(ConfigError, match="cannot read"):
        read_raft_key(tmp_path / "missing.key")
    raw = minimal()
    raw["raft_key_file"] = 7
    with pytest.raises(ConfigError, match="raft_key_file"):
        parse_config(raw)
    assert parse_config(minimal()).raft_key_file is None


def shaped(tmp_path: Path, name: str, **options: Any) -> Any:
    path = tmp_path / f"{name}.toml"
    write_config(path, **{"coordinators": 3, "shards": 3, "partition_nodes": 3, **options})
    return load_config(path)


def test_a_node_refuses_data_of_another_cluster_shape(tmp_path: Path) -> None:
    node_dir = tmp_path / "node-1"
    first = shaped(tmp_path, "first")
    check_shape(node_dir, first)  # first start: records the shape
    check_shape(node_dir, shaped(tmp_path, "same"))  # new ports, same shape
    more = shaped(tmp_path, "more", partition_nodes=4)
    check_shape(node_dir, more)  # a partition-log node may be added...
    with pytest.raises(ConfigError, match=r"partition-log nodes \[104\] are missing"):
        check_shape(node_dir, first)  # ...but not removed again
    with pytest.raises(ConfigError, match="shard_count must stay 3") as refused:
        check_shape(node_dir, shaped(tmp_path, "shards", shards=5, partition_nodes=4))
    assert "coordinators must stay" not in str(refused.value)
    with pytest.raises(ConfigError, match=r"coordinators must stay \[1, 2, 3\]"):
        check_shape(node_dir, shaped(tmp_path, "coordinators", coordinators=5, partition_nodes=4))
    (node_dir / SHAPE_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable"):
        check_shape(node_dir, more)


def test_a_shape_refusal_names_both_shapes() -> None:
    old = ClusterShape(3, (1, 2, 3), (101, 102, 103))
    assert old.refusal(ClusterShape(3, (1, 2, 3), (101, 102, 103, 104))) is None
    refusal = old.refusal(ClusterShape(5, (1, 2, 3), (101, 102)))
    assert refusal is not None
    assert str(old) in refusal and "5 shards" in refusal and "[103]" in refusal


def test_kafka_listeners() -> None:
    listeners = [{"id": 201, "address": "127.0.0.1:9092"}, {"id": 202, "address": "127.0.0.1:9093"}]
    config = parse_config(minimal(kafka_listeners=listeners))
    assert [(k.node_id, k.address) for k in config.kafka_listeners] == [
        (201, "127.0.0.1:9092"),
        (202, "127.0.0.1:9093"),
    ]
    assert parse_config(minimal()).kafka_listeners == ()
    with pytest.raises(ConfigError, match="kafka_listeners"):
        parse_config(minimal(kafka_listeners=[{"id": 1, "address": "127.0.0.1:9092"}]))
    with pytest.raises(ConfigError, match="used twice"):
        parse_config(minimal(kafka_listeners=[{"id": 201, "address": "127.0.0.1:7001"}]))
    with pytest.raises(ConfigError, match="unknown keys"):
        parse_config(minimal(kafka_listeners=[{"id": 201, "address": "h:1", "grpc": "h:2"}]))
    with pytest.raises(ConfigError, match="host:port"):
        parse_config(minimal(kafka_listeners=[{"id": 201, "address": "nohost"}]))
