"""The command line of the node and the local launcher, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from raftcoord.cli.main import EXIT_BROKEN_PIPE
from raftcoord.cluster.launcher import (
    LOWEST_FREE_PORT,
    _leaders,
    _leadership_view,
    ephemeral_ports_start,
    free_ports,
)

ROOT = Path(__file__).resolve().parents[1]


def raftcoord(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftcoord.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """``raftcoord ARGS`` with its stdout a pipe nobody reads any more (the
    end of ``raftcoord ... | head``, deterministically)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "raftcoord.cli", *args],
            cwd=ROOT, stdout=write, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(write)


def test_output_to_a_reader_that_went_away_ends_quietly() -> None:
    """Every command: a BrokenPipeError anywhere in it ends it with the exit
    status of SIGPIPE and no traceback (here a command made to print more
    than a pipe holds)."""
    probe = (
        "import sys\n"
        "import raftcoord.cli\n"
        "cli = sys.modules['raftcoord.cli.main']\n"
        "def chatty(args):\n"
        "    for i in range(20000):\n"
        "        print('a line of status', i)\n"
        "    return 0\n"
        "cli._certs = chatty\n"
        "sys.exit(cli.main(['certs', 'ca', '--dir', 'unused']))\n"
    )
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=ROOT, stdout=write, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(write)
    assert (result.returncode, result.stderr) == (EXIT_BROKEN_PIPE, "")


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_node_with_a_missing_config_is_a_clear_error(tmp_path: Path) -> None:
    result = raftcoord("node", "--config", str(tmp_path / "nope.toml"), "--id", "1")
    assert result.returncode == 2
    assert "config file not found" in result.stderr and "Traceback" not in result.stderr


def test_node_with_an_invalid_config_or_id(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("shard_count = 0\n")
    result = raftcoord("node", "--config", str(bad), "--id", "1")
    assert result.returncode == 2 and "shard_count" in result.stderr
    good = tmp_path / "good.toml"
    good.write_text(
        '[[coordinators]]\nid = 1\ngrpc = "127.0.0.1:1"\n'
        'raft = ["127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"]\n'
    )
    result = raftcoord("node", "--config", str(good), "--id", "7")
    assert result.returncode == 2 and "no coordinator with id 7" in result.stderr
    result = raftcoord("partition-node", "--config", str(good), "--id", "7")
    assert result.returncode == 2 and "no partition-log node with id 7" in result.stderr


def test_a_node_without_a_raft_key_refuses_to_start(tmp_path: Path) -> None:
    config = tmp_path / "cluster.toml"
    config.write_text(
        '[[coordinators]]\nid = 1\ngrpc = "127.0.0.1:1"\n'
        'raft = ["127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"]\n'
    )
    result = raftcoord("node", "--config", str(config), "--id", "1")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "raft_key_file" in result.stderr and "--insecure-raft" in result.stderr
    config.write_text('raft_key_file = "raft.key"\n' + config.read_text())
    (tmp_path / "raft.key").write_text("00" * 32)
    (tmp_path / "raft.key").chmod(0o640)
    result = raftcoord("node", "--config", str(config), "--id", "1")
    assert result.returncode == 2 and "chmod 600" in result.stderr


@pytest.mark.slow
def test_cluster_up_status_kill_start_down(tmp_path: Path) -> None:
    data = str(tmp_path / "c")
    pids: list[int] = []
    try:
        up = raftcoord(
            "cluster", "up", "--cluster-dir", data, "--shards", "2", "--kafka-listeners", "1"
        )
        assert up.returncode == 0, up.stderr
        state = json.loads((Path(data) / "cluster.json").read_text())
        pids = [n["pid"] for n in state["nodes"]]
        assert len(pids) == 7 and all(Path(n["log"]).exists() for n in state["nodes"])
        kinds = [n["kind"] for n in state["nodes"]]
        assert kinds == ["coordinator"] * 3 + ["partition-log"] * 3 + ["kafka-gateway"]
        assert up.stdout.count("leader") == 2  # one leader per shard in the table
        assert up.stdout.count("partition-log, serving") == 3
        healthy = raftcoord("cluster", "status", "--cluster-dir", data, "--json")
        assert healthy.returncode == 0, healthy.stdout
        assert all(n["answers"] for n in json.loads(healthy.stdout))
        made = raftcoord("topic", "create", "t", "--partitions", "3", "--cluster-dir", data)
        assert made.returncode == 0, made.stderr
        summary = raftcoord("cluster", "status", "--cluster-dir", data).stdout
        assert "partitions: 3 in 1 topics; leaders: node 101 1, node 102 1, node 103 1" in summary
        # `cluster status | head`: the reader gone, the status ends quietly.
        cut = into_a_closed_pipe("cluster", "status", "--cluster-dir", data)
        assert (cut.returncode, cut.stderr) == (EXIT_BROKEN_PIPE, "")
        assert "without a leader: 0" in summary and "under-replicated: 0" in summary
        # A stopped gateway still takes connections (the kernel does), but answers nothing.
        assert (
            raftcoord(
                "cluster", "kill", "201", "--signal", "STOP", "--cluster-dir", data
            ).returncode
            == 0
        )
        stopped = raftcoord("cluster", "status", "--cluster-dir", data)
        assert stopped.returncode == 1 and "kafka-gateway, no answer" in stopped.stdout
        assert stopped.stderr == "raftcoord cluster status: nodes not answering: 201\n"
        assert (
            raftcoord(
                "cluster", "kill", "201", "--signal", "CONT", "--cluster-dir", data
            ).returncode
            == 0
        )
        killed = raftcoord("cluster", "kill", "102", "--cluster-dir", data)
        assert killed.returncode == 0
        started = raftcoord("cluster", "start", "102", "--cluster-dir", data)
        assert started.returncode == 0, started.stderr
        killed = raftcoord("cluster", "kill", "2", "--cluster-dir", data)
        assert killed.returncode == 0
        status = raftcoord("cluster", "status", "--cluster-dir", data)
        assert "no" in status.stdout.splitlines()[2].split()  # node 2 not alive
        started = raftcoord("cluster", "start", "2", "--cluster-dir", data)
        assert started.returncode == 0, started.stderr
        # Node 2 is shard 1's preferred leader: an election gives it back at once.
        elected = raftcoord("cluster", "elect-leaders", "--cluster-dir", data)
        assert elected.returncode == 0, elected.stderr
        assert elected.stdout.strip() == "shard 0: node 1, shard 1: node 2"
        state = json.loads((Path(data) / "cluster.json").read_text())
        pids = [n["pid"] for n in state["nodes"]]
        # A node's data is its user's alone; without [tls] each node says so once.
        for node in state["nodes"]:
            log = Path(node["log"]).read_text()
            assert log.count("event=plaintext") >= 1, node["log"]
        for directory in Path(data).glob("*node-*"):
            if not directory.is_dir():
                continue
            for path in [directory, *directory.rglob("*")]:
                mode = path.stat().st_mode & 0o777
                assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    finally:
        down = raftcoord("cluster", "down", "--cluster-dir", data)
    assert down.returncode == 0, down.stderr
    assert not any(running(pid) for pid in pids)
    # --data-dir, the option's older name, still works; every node down: status 1
    dead = raftcoord("cluster", "status", "--data-dir", data)
    assert dead.returncode == 1 and dead.stdout.count(" no ") >= 7
    assert dead.stderr == (
        "raftcoord cluster status: nodes not answering: 1, 2, 3, 101, 102, 103, 201 "
        "(not running: 1, 2, 3, 101, 102, 103, 201); shards without a leader: 0, 1\n"
    )


@pytest.mark.slow
def test_cluster_up_refuses_another_shape_on_the_same_data(tmp_path: Path) -> None:
    """Committed group offsets must not silently read as missing because the
    cluster came back with another shard count, nor partitions vanish with a
    partition-log node."""
    from raftcoord.client import Consumer, TopicPartition

    data = tmp_path / "c"
    try:
        up = raftcoord("cluster", "up", "--cluster-dir", str(data))
        assert up.returncode == 0, up.stderr
        bootstrap = [n["grpc"] for n in json.loads((data / "cluster.json").read_text())["nodes"]]
        offsets = {TopicPartition("in", 0): 42}
        with Consumer(bootstrap[:3], group_id="g") as consumer:
            consumer.commit(offsets)
        assert raftcoord("cluster", "down", "--cluster-dir", str(data)).returncode == 0
        config_before = (data / "cluster.toml").read_text()

        other = raftcoord(
            "cluster", "up", "--cluster-dir", str(data), "--shards", "5", "--partition-nodes", "2"
        )
        assert other.returncode != 0
        assert "shard_count must stay 3" in other.stderr, other.stderr
        assert "partition-log nodes [103] are missing" in other.stderr
        assert "Traceback" not in other.stderr
        assert (data / "cluster.toml").read_text() == config_before  # nothing was started
        state = json.loads((data / "cluster.json").read_text())
        assert not any(running(n["pid"]) for n in state["nodes"])

        again = raftcoord("cluster", "up", "--cluster-dir", str(data))
        assert again.returncode == 0, again.stderr
        bootstrap = [n["grpc"] for n in json.loads((data / "cluster.json").read_text())["nodes"]]
        with Consumer(bootstrap[:3], group_id="g") as consumer:
            assert consumer.committed(TopicPartition("in", 0)) == 42
    finally:
        raftcoord("cluster", "down", "--cluster-dir", str(data))


def test_a_node_started_by_hand_on_data_of_another_shape_is_a_clear_error(
    tmp_path: Path,
) -> None:
    from raftcoord.cluster.launcher import write_config
    from raftcoord.protocol.config import check_shape, load_config

    old, new = tmp_path / "old.toml", tmp_path / "new.toml"
    write_config(old, coordinators=3, shards=3)
    write_config(new, coordinators=3, shards=2)
    check_shape(tmp_path / "node-1", load_config(old))
    result = raftcoord(
        "node",
        "--config",
        str(new),
        "--id",
        "1",
        "--data-dir",
        str(tmp_path / "node-1"),
        timeout=20,
    )
    assert result.returncode == 2 and "shard_count must stay 3" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("where", ["a file", "under a file", "unwritable"])
def test_cluster_up_on_an_unusable_data_dir_is_a_clear_error(tmp_path: Path, where: str) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    data = {"a file": afile, "under a file": afile / "sub", "unwritable": Path("/proc/raftcoord")}
    result = raftcoord("cluster", "up", "--cluster-dir", str(data[where]))
    assert result.returncode == 1
    assert f"cannot use {data[where]} as the data directory" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert afile.read_text() == "not a directory"


@pytest.mark.slow
def test_a_cluster_up_that_fails_stops_the_nodes_it_started(tmp_path: Path) -> None:
    data = tmp_path / "c"
    try:
        result = raftcoord("cluster", "up", "--cluster-dir", str(data), "--timeout", "0.01")
        assert result.returncode == 1
        assert "stopped the nodes started" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
        state = json.loads((data / "cluster.json").read_text())
        assert state["nodes"] and not any(running(n["pid"]) for n in state["nodes"])
    finally:
        raftcoord("cluster", "down", "--cluster-dir", str(data))


def test_cluster_up_help_explains_every_option_with_its_default() -> None:
    result = raftcoord("cluster", "up", "--help")
    assert result.returncode == 0, result.stderr
    options = result.stdout.split("options:", 1)[1]
    for option, default in [
        ("--coordinators", "3"),
        ("--shards", "3"),
        ("--partition-nodes", "3"),
        ("--fsync", "always"),
        ("--log-flush", "always"),
        ("--timeout", "30.0"),
        ("--cluster-dir", ".raftcoord"),
    ]:
        text = options.split(option, 1)[1].split("\n  --", 1)[0]
        assert f"(default: {default})" in " ".join(text.split()), (option, text)


def test_free_ports_are_distinct_and_below_the_ephemeral_range() -> None:
    """A node's ports are never ones the kernel could hand to an outgoing
    connection while the node is down (it listens on them again at restart)."""
    ports = free_ports(40)
    assert len(set(ports)) == 40
    assert all(LOWEST_FREE_PORT <= p < ephemeral_ports_start() for p in ports), ports


_NODE_CONFIG = (
    'raft_key_file = "raft.key"\n\n[[coordinators]]\nid = 1\ngrpc = "127.0.0.1:1"\n'
    'raft = ["127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"]\n\n'
    '[[partition_nodes]]\nid = 101\ngrpc = "127.0.0.1:5"\n'
)


_SETTINGS_REFUSED = [
    ('[settings]\n"raft.heartbeat.ms" = 500\n', "raft.heartbeat.ms must be below a third"),
    ('[settings]\n"raft.heartbeat.ms" = 5000\n', "raft.heartbeat.ms must be below a third"),
    (
        '[settings]\n"raft.election.timeout.ms" = [600, 300]\n',
        "raft.election.timeout.ms must be [low, high] with low < high",
    ),
    (
        '[settings]\n"raft.election.timeout.ms" = [1000, 2000]\n',
        "raft.election.timeout.ms: its high end must be at most 1000",
    ),
]
_TLS_REFUSED = [
    ('[tls]\nca_file = "nope/ca.pem"\ncert_dir = "nope"\n', "[tls] ca_file: cannot read"),
    ('[tls]\nca_file = "ca.pem"\ncert_dir = "certs"\n', "[tls] cert_dir: cannot read"),
]


@pytest.mark.parametrize(
    ("command", "node_id", "table", "refusal"),
    [("node", "1", *case) for case in _SETTINGS_REFUSED + _TLS_REFUSED]
    + [("partition-node", "101", *case) for case in _TLS_REFUSED],
)
def test_a_config_no_node_can_run_with_is_one_line_naming_the_key(
    tmp_path: Path, command: str, node_id: str, table: str, refusal: str
) -> None:
    """pysyncobj would assert (a traceback, exit 1: a restart loop under
    systemd) or a file be missing at the first connection: refused before
    anything starts, with exit status 2 and one line naming the key."""
    config = tmp_path / "cluster.toml"
    config.write_text(_NODE_CONFIG + "\n" + table)
    (tmp_path / "raft.key").write_text("00" * 32)
    (tmp_path / "raft.key").chmod(0o600)
    (tmp_path / "ca.pem").write_text("PEM")
    result = raftcoord(command, "--config", str(config), "--id", node_id)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"raftcoord {command}: ") and refusal in line, line
    assert not (tmp_path / f"{command}-{node_id}").exists()  # no data directory made


def test_cluster_up_refuses_a_setting_no_node_can_run_with_before_starting(
    tmp_path: Path,
) -> None:
    data = tmp_path / "c"
    result = raftcoord("cluster", "up", "--cluster-dir", str(data), "--setting",
                       "raft.heartbeat.ms=500")  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "raft.heartbeat.ms must be below a third" in result.stderr
    assert "Traceback" not in result.stderr
    assert not list(data.glob("*node-*")) and not (data / "cluster.json").exists()


def _status(*shards: tuple[int, bool, int, int]) -> SimpleNamespace:
    return SimpleNamespace(
        shards=[
            SimpleNamespace(shard=s, is_leader=leads, term=term, leader_node_id=leader)
            for s, leads, term, leader in shards
        ]
    )


def test_a_shard_is_led_by_the_coordinator_of_the_later_term() -> None:
    """A coordinator that has not heard of the next term yet still says it
    leads; the one elected in that term is the leader, whatever the order of
    the answers."""
    old = _status((0, True, 1, 1), (1, False, 2, 2))
    new = _status((0, True, 2, 2), (1, True, 2, 2))
    assert _leaders({1: old, 2: new, 3: None}) == {0: 2, 1: 2}
    assert _leaders({2: new, 1: old}) == {0: 2, 1: 2}


def test_a_preferred_election_that_does_not_happen_says_what_each_coordinator_said() -> None:
    statuses = {1: _status((0, True, 3, 1), (1, False, 3, 2)), 2: _status((1, True, 3, 2)), 3: None}
    view = _leadership_view({0: 2, 1: 2, 2: 3}, statuses)
    assert view == (
        "shard 0, preferred 2: 1 leader in term 3; "
        "shard 2, preferred 3: no answer; no answer from coordinator 3"
    )


def test_fresh_removes_nothing_from_a_directory_cluster_up_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "node-1").mkdir()
    (tmp_path / "history.jsonl").write_text("{}\n")
    result = raftcoord("cluster", "up", "--fresh", "--cluster-dir", str(tmp_path))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "no cluster.json" in result.stderr and "nothing removed" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.jsonl", "node-1"]


@pytest.mark.slow
def test_cluster_up_says_it_resumes_a_stopped_cluster_and_fresh_starts_anew(
    tmp_path: Path,
) -> None:
    data = str(tmp_path / "c")
    small = ("--coordinators", "1", "--shards", "1", "--partition-nodes", "1", "--cluster-dir")

    def topics() -> str:
        listed = raftcoord("topic", "list", "--json", "--cluster-dir", data)
        assert listed.returncode == 0, listed.stderr
        return listed.stdout

    try:
        first = raftcoord("cluster", "up", *small, data)
        assert first.returncode == 0, first.stderr
        assert "resuming" not in first.stdout
        made = raftcoord(
            "topic", "create", "kept", "--partitions", "1", "--replication-factor", "1",
            "--cluster-dir", data,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        (Path(data) / "history.jsonl").write_text("{}\n")  # as a workload leaves it
        assert raftcoord("cluster", "down", "--cluster-dir", data).returncode == 0

        again = raftcoord("cluster", "up", *small, data)
        assert again.returncode == 0, again.stderr
        [said] = [line for line in again.stdout.splitlines() if "resuming" in line]
        assert "the data of 2 nodes, history.jsonl" in said and "--fresh" in said
        assert '"kept"' in topics()
        assert raftcoord("cluster", "down", "--cluster-dir", data).returncode == 0

        fresh = raftcoord("cluster", "up", "--fresh", *small, data)
        assert fresh.returncode == 0, fresh.stderr
        assert f"--fresh: removed the data of 2 nodes, history.jsonl from {data}" in fresh.stdout
        assert "resuming" not in fresh.stdout
        assert not (Path(data) / "history.jsonl").exists()
        assert '"kept"' not in topics()
        refused = raftcoord("cluster", "up", "--fresh", *small, data)  # it runs: nothing removed
        assert refused.returncode == 1 and "cluster down" in refused.stderr
        assert '"kept"' not in topics()
    finally:
        raftcoord("cluster", "down", "--cluster-dir", data)
