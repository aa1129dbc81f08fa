"""The Raft ports of a running cluster against a process that is not a member.

A real local cluster (3 coordinators x 3 shards, the launcher's Raft key);
the attacker is this test process on loopback, holding no key. Whatever it
sends (pysyncobj's pickled frames, a pickle that would create a file,
frames announcing 2 GiB, random bytes, HELLOs naming strangers or members,
forged terms of 10^6, 2^31 + 10 and 2^64 - 1) must be dropped: no file, no
term change in memory or on disk, no leader change, nothing sent back but
the handshake's challenge, and the cluster goes on committing transactions.
A rolling restart of every coordinator keeps serving.
"""

from __future__ import annotations

import os
import pickle
import random
import socket
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from raftcoord.cluster.launcher import LocalCluster
from raftcoord.coordinator import raft_journal, raft_wire
from raftcoord.protocol.config import load_config
from tests.crowd import Crowd
from tests.local_cluster import commit_offsets, running_cluster
from tests.seeds import chosen_seed

pytestmark = pytest.mark.slow

#: How long a node may take to drop a connection it refuses: the handshake
#: deadline is the Raft connection timeout (1 s), plus a loaded machine.
DROP_S = 5.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("raft-ports") / "cluster") as running:
        yield running


def raft_ports(cluster: LocalCluster) -> list[tuple[str, int]]:
    config = load_config(cluster.data_dir / "cluster.toml")
    ports = []
    for node in config.coordinators:
        for address in node.raft:
            host, port = address.rsplit(":", 1)
            ports.append((host, int(port)))
    return ports


def terms(cluster: LocalCluster) -> dict[tuple[int, int], tuple[int, int]]:
    """(node, shard) -> (term, leader node id) as each coordinator reports it."""
    seen = {}
    for record in cluster.coordinators():
        status = cluster.node_status(record.node_id, timeout_s=5.0)
        assert status is not None, f"coordinator {record.node_id} does not answer"
        for shard in status.shards:
            seen[(record.node_id, shard.shard)] = (shard.term, shard.leader_node_id)
    return seen


def stored_terms(cluster: LocalCluster) -> dict[Path, int]:
    """Each shard journal's stored term (its own term/vote file)."""
    found = {}
    for meta in sorted(cluster.data_dir.glob("node-*/shard-*/journal.meta")):
        found[meta] = int(raft_journal.decode_meta(meta.read_bytes()).get("currentTerm", 0))
    return found


def dropped(sock: socket.socket, timeout_s: float = DROP_S) -> bytes:
    """What the node sent before it closed ``sock``; fails if it did not close it."""
    received = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return received
        if not data:
            return received
        received += data
    raise AssertionError(f"the node kept the connection open for {timeout_s} s")


def read_frame(sock: socket.socket) -> bytes:
    """The payload of the next frame the node sends (no tag: a handshake frame)."""
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
        chunk = sock.recv(4096)
        assert chunk, "the node closed the connection"
        data += chunk
    return data[5 : 4 + struct.unpack(">I", data[:4])[0]]


def connect(host: str, port: int) -> socket.socket:
    return socket.create_connection((host, port), timeout=5.0)


def pysyncobj_frame(message: object) -> bytes:
    """A frame of pysyncobj's own TCP transport: length, zlib of a pickle."""
    data = zlib.compress(pickle.dumps(message), 3)
    return struct.pack("i", len(data)) + data


class MakeDirectory:
    """Unpickled, this creates a directory: what an attacker's payload would run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (str(self.path),))


def unchanged(cluster: LocalCluster, before_terms: object, before_stored: object) -> None:
    assert terms(cluster) == before_terms
    assert stored_terms(cluster) == before_stored
    assert all(cluster.alive(record.node_id) for record in cluster.coordinators())


def test_a_pickle_sent_to_every_raft_port_runs_nothing(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    before, stored = terms(cluster), stored_terms(cluster)
    for host, port in raft_ports(cluster):
        payload = MakeDirectory(tmp_path / f"ran-on-{port}")
        # As pysyncobj's transport frames it, and inside one of our frames.
        for data in (pysyncobj_frame(payload), raft_wire.frame(0, pickle.dumps(payload), None)):
            with connect(host, port) as sock:
                sock.sendall(data)
                assert dropped(sock) == b""
        with connect(host, port) as sock:  # pysyncobj's read-only peer asking for the log
            sock.sendall(pysyncobj_frame("readonly"))
            sock.sendall(
                pysyncobj_frame(
                    {"type": "next_node_idx", "next_node_idx": 1, "reset": True, "success": False}
                )
            )
            assert dropped(sock) == b""
    assert not list(tmp_path.iterdir()), "a pickle sent to a Raft port ran"
    unchanged(cluster, before, stored)
    commit_offsets(cluster, "after-pickles")


def test_a_frame_announcing_two_gib_is_dropped_at_its_header(cluster: LocalCluster) -> None:
    """Followed by a slow trickle of bytes: the node closes the connection
    at the header, its tick thread never waits, no leader changes."""
    before, stored = terms(cluster), stored_terms(cluster)
    for host, port in raft_ports(cluster):
        with connect(host, port) as sock:
            sock.sendall(struct.pack(">I", 0x80000000) + b"x")
            started = time.monotonic()
            try:
                for _ in range(20):
                    sock.sendall(b"y" * 1024)
                    time.sleep(0.01)
            except (BrokenPipeError, ConnectionResetError):
                pass
            assert dropped(sock) == b""
            assert time.monotonic() - started < DROP_S
        with connect(host, port) as sock:  # a frame within the handshake cap that never ends
            sock.sendall(struct.pack(">I", 1000) + b"z" * 10)
            assert dropped(sock) == b""
    unchanged(cluster, before, stored)
    commit_offsets(cluster, "after-large-frames")


def test_random_bytes_on_the_raft_ports_change_nothing(cluster: LocalCluster) -> None:
    seed = chosen_seed(11)
    rng = random.Random(seed)
    before, stored = terms(cluster), stored_terms(cluster)
    ports = raft_ports(cluster)
    for _ in range(36):
        host, port = rng.choice(ports)
        data = rng.randbytes(rng.randrange(1, 3000))
        if rng.random() < 0.3:  # a plausible header in front of the noise
            data = struct.pack(">I", rng.randrange(1, 1024)) + data
        with connect(host, port) as sock:
            try:
                sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                continue
            assert dropped(sock) == b"", f"seed {seed}"
    unchanged(cluster, before, stored)
    commit_offsets(cluster, "after-random-bytes")


def forged_append(term: int) -> bytes:
    body = [raft_wire.APPEND, term, 10**6, 1, term, [[b"\x00Rforged", 2, term]]]
    return raft_wire.frame(0, bytes(msgpack.packb(body, use_bin_type=True)), None)


def test_forged_higher_terms_from_strangers_and_impostors_change_nothing(
    cluster: LocalCluster,
) -> None:
    """Terms of 10^6, 2^31 + 10 and 2^64 - 1: sent with no handshake, after
    a HELLO naming a stranger, after a HELLO naming a real member (the node
    answers its challenge) with a made-up AUTH, and in pysyncobj's format."""
    before, stored = terms(cluster), stored_terms(cluster)
    config = load_config(cluster.data_dir / "cluster.toml")
    for shard in range(config.shard_count):
        members = sorted(node.raft[shard] for node in config.coordinators)
        target, impostor = members[0], members[-1]  # the greater address dials
        host, port = target.rsplit(":", 1)
        for term in (10**6, 2**31 + 10, 2**64 - 1):
            forged = forged_append(term)
            with connect(host, int(port)) as sock:
                sock.sendall(forged)
                assert dropped(sock) == b""
            stranger = raft_wire.encode_hello("127.0.0.1:1", target, os.urandom(32), True)
            with connect(host, int(port)) as sock:
                sock.sendall(raft_wire.frame(0, stranger, None) + forged)
                assert dropped(sock) == b""
            hello = raft_wire.encode_hello(impostor, target, os.urandom(32), True)
            with connect(host, int(port)) as sock:
                sock.sendall(raft_wire.frame(0, hello, None))
                challenge = read_frame(sock)  # the node proves it holds the key
                assert raft_wire.decode_challenge(challenge)
                sock.sendall(raft_wire.frame(0, raft_wire.encode_auth(os.urandom(32)), None))
                sock.sendall(forged)
                assert dropped(sock) == b""
            with connect(host, int(port)) as sock:
                sock.sendall(pysyncobj_frame(impostor))
                sock.sendall(
                    pysyncobj_frame({"type": "append_entries", "term": term, "commit_index": 0})
                )
                assert dropped(sock) == b""
    unchanged(cluster, before, stored)
    commit_offsets(cluster, "after-forged-terms")


def test_strangers_holding_every_place_they_may_do_not_keep_members_out(
    cluster: LocalCluster,
) -> None:
    """Strangers on 9 addresses other than the cluster's keep every place
    for connections in their handshake that they may take on every Raft
    port full (8 per address, 64 in all, and more asking), dialling again
    whenever a node closes one; meanwhile a coordinator restarts, its
    members connect to it and it to them, and transactions commit. (The
    members' own places are what lets them in at once; without them the
    Raft handshake's deadline of one connection timeout frees places often
    enough that members get in too, later.)"""
    victim = cluster.coordinators()[-1].node_id
    with Crowd([port for _host, port in raft_ports(cluster)], sources=9, per_source=8) as crowd:
        cluster.kill(victim, "KILL")
        commit_offsets(cluster, f"crowded-without-{victim}")
        cluster.start(victim)
        cluster.wait_until(
            lambda: (
                (status := cluster.node_status(victim)) is not None
                and all(shard.leader_node_id > 0 for shard in status.shards)
            ),
            30,
            f"coordinator {victim} did not rejoin its shards",
        )
        commit_offsets(cluster, f"crowded-after-{victim}")
        assert crowd.dialled > len(crowd.places)  # the nodes did close them


def test_a_rolling_restart_of_every_coordinator_keeps_serving(cluster: LocalCluster) -> None:
    """Each coordinator in turn stopped (SIGTERM) and started again; between
    two restarts every shard has a leader and a transaction commits, and at
    the end every replica reports the same leader and term per shard."""
    for record in cluster.coordinators():
        cluster.kill(record.node_id, "TERM")
        commit_offsets(cluster, f"without-{record.node_id}")
        cluster.wait_until(  # kill() waits 10 s for the exit; a loaded machine may take longer
            lambda r=record: not cluster.alive(r.node_id),
            60,
            f"node {record.node_id} did not exit on SIGTERM",
        )
        cluster.start(record.node_id)
        cluster.wait_for_leaders(timeout_s=30)
        commit_offsets(cluster, f"after-restart-{record.node_id}")

    def agreed() -> bool:
        seen = terms(cluster)
        return all(
            len({seen[(node.node_id, shard)] for node in cluster.coordinators()}) == 1
            for shard in range(3)
        )

    deadline = time.monotonic() + 30
    while not agreed():
        assert time.monotonic() < deadline, terms(cluster)
        time.sleep(0.1)
