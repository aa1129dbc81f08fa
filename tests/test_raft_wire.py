"""The Raft wire format (pure): messages, frames, handshake proofs.

Every message kind round-trips; whatever else arrives (pickles, wrong types,
terms past the coordinator epoch, random bytes) is a WireError, never
another exception and never a decoded message.
"""

from __future__ import annotations

import pickle
import random
import struct
import zlib
from typing import Any

import msgpack
import pytest

from raftcoord.coordinator import raft_wire
from raftcoord.coordinator.raft_wire import (
    MAX_TERM,
    FrameReader,
    FrameSeal,
    WireError,
    decode_message,
    encode_message,
)
from tests.seeds import chosen_seed

CAP = 1 << 20

DIRECTORY = "0123456789abcdef0123456789abcdef"

MESSAGES: list[dict[str, Any]] = [
    {
        "type": "append_entries",
        "term": 7,
        "commit_index": 41,
        "prevLogIdx": 40,
        "prevLogTerm": 6,
        "entries": [(b"\x00Rabc", 41, 7), (b"\x01", 42, 7)],
    },
    {
        "type": "append_entries",
        "term": 7,
        "commit_index": 3,
        "prevLogIdx": 3,
        "prevLogTerm": 7,
        "entries": [],
    },
    {"type": "append_entries", "term": 2, "commit_index": 9, "serialized": (b"snap", True, False)},
    {"type": "append_entries", "term": 2, "commit_index": 9, "serialized": None},
    {
        "type": "next_node_idx",
        "next_node_idx": 12,
        "reset": False,
        "success": True,
        "directory": "",
    },
    {
        "type": "request_vote",
        "term": MAX_TERM,
        "last_log_index": 3,
        "last_log_term": 2,
        "directory": DIRECTORY,
    },
    {"type": "response_vote", "term": 4, "directory": DIRECTORY},
    {"type": "timeout_now", "term": 4},
    {
        "type": "pre_vote",
        "term": 9,
        "last_log_index": 120,
        "last_log_term": 8,
        "directory": DIRECTORY,
    },
    {
        "type": "pre_vote_answer",
        "term": 9,
        "granted": False,
        "current_term": MAX_TERM,
        "directory": "",
    },
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m["type"])
def test_every_message_kind_round_trips(message: dict[str, Any]) -> None:
    assert decode_message(encode_message(message), CAP) == message


@pytest.mark.parametrize("kind", ["apply_command", "apply_command_response", "status", None])
def test_messages_that_are_not_raft_traffic_have_no_encoding(kind: str | None) -> None:
    with pytest.raises(WireError):
        encode_message({"type": kind, "command": b"x", "request_id": 1})


def test_a_term_past_the_coordinator_epoch_is_neither_sent_nor_accepted() -> None:
    with pytest.raises(WireError):
        encode_message({"type": "response_vote", "term": MAX_TERM + 1, "directory": ""})
    for answer in ((MAX_TERM + 1, 1), (1, MAX_TERM + 1)):
        with pytest.raises(WireError):
            encode_message(
                {
                    "type": "pre_vote_answer",
                    "term": answer[0],
                    "granted": False,
                    "current_term": answer[1],
                    "directory": "",
                }
            )
    # 2**64 and beyond have no msgpack encoding: the largest that can arrive is 2**64 - 1.
    for term in (MAX_TERM + 1, 2**31 + 10, 2**64 - 1, -1, -(2**63)):
        for body in (
            [raft_wire.RESPONSE_VOTE, term, ""],
            [raft_wire.APPEND, term, 1, 1, 1, []],
            [raft_wire.REQUEST_VOTE, 1, 1, term, ""],
            [raft_wire.APPEND, 1, 1, 1, 1, [[b"x", 2, term]]],
            [raft_wire.PRE_VOTE, term, 1, 1, ""],
            [raft_wire.PRE_VOTE, 1, 1, term, ""],
            [raft_wire.PRE_VOTE_ANSWER, term, True, 1, ""],
            [raft_wire.PRE_VOTE_ANSWER, 1, False, term, ""],
        ):
            with pytest.raises(WireError):
                decode_message(bytes(msgpack.packb(body, use_bin_type=True)), CAP)


@pytest.mark.parametrize(
    "body",
    [
        [raft_wire.APPEND, 1, 1, 1, 1, "entries"],
        [raft_wire.APPEND, 1, 1, 1, 1, [[b"x", 1]]],
        [raft_wire.APPEND, 1, 1, 1, 1, [["text", 1, 1]]],
        [raft_wire.APPEND, True, 1, 1, 1, []],
        [raft_wire.APPEND, 1, 1, None, None, None, [b"x", 1, 1]],
        [raft_wire.APPEND, 1, 1, 1, None, None, None],
        [raft_wire.NEXT_INDEX, 1, 0, 1, ""],
        [raft_wire.NEXT_INDEX, -1, False, True, ""],
        [raft_wire.NEXT_INDEX, 1, False, True],
        [raft_wire.NEXT_INDEX, 1, False, True, "not-a-directory"],
        [raft_wire.NEXT_INDEX, 1, False, True, b"0123456789abcdef0123456789abcdef"],
        [raft_wire.REQUEST_VOTE, 1, 1, 1],
        [raft_wire.RESPONSE_VOTE, 1, 2],
        [raft_wire.RESPONSE_VOTE, 1],
        [raft_wire.PRE_VOTE, 1, 1, 1],
        [raft_wire.PRE_VOTE, 1, -1, 1, ""],
        [raft_wire.PRE_VOTE, 1, 1, 1, "not-a-directory"],
        [raft_wire.PRE_VOTE_ANSWER, 1, 1, 1, ""],
        [raft_wire.PRE_VOTE_ANSWER, 1, True, 1],
        [raft_wire.PRE_VOTE_ANSWER, 1, None, 1, ""],
        [99, 1],
        ["append_entries", 1],
        {"type": "append_entries"},
        [],
        "readonly",
        None,
    ],
)
def test_a_malformed_message_is_refused(body: Any) -> None:
    with pytest.raises(WireError):
        decode_message(bytes(msgpack.packb(body, use_bin_type=True)), CAP)


def test_a_pickle_is_not_a_message() -> None:
    """pysyncobj's own frame body (zlib of a pickle) and a bare pickle."""
    message = {"type": "append_entries", "term": 10**6, "commit_index": 0}
    for data in (pickle.dumps(message), zlib.compress(pickle.dumps(message), 3)):
        with pytest.raises(WireError):
            decode_message(data, CAP)


def test_random_bytes_only_ever_raise_wire_error() -> None:
    seed = chosen_seed(20)
    rng = random.Random(seed)
    for _ in range(3000):
        data = rng.randbytes(rng.randrange(0, 200))
        try:
            decode_message(data, CAP)
        except WireError:
            pass
        for decode in (raft_wire.decode_hello, raft_wire.decode_challenge, raft_wire.decode_auth):
            try:
                decode(data)
            except WireError:
                pass
        reader = FrameReader(raft_wire.HANDSHAKE_FRAME_BYTES)
        reader.feed(data)
        try:
            while reader.next_frame() is not None:
                pass
        except WireError:
            pass


def test_a_frame_longer_than_the_cap_is_refused_from_its_header() -> None:
    reader = FrameReader(raft_wire.HANDSHAKE_FRAME_BYTES)
    reader.feed(struct.pack(">I", 0x7FFFFFFF) + b"x")  # 2 GiB announced, one byte sent
    with pytest.raises(WireError, match="2147483647 bytes"):
        reader.next_frame()


def test_sealed_frames_check_their_tag_and_their_order() -> None:
    key = bytes(range(32))
    sender = FrameSeal(key)
    frames = [raft_wire.frame(0, payload, sender) for payload in (b"one", b"two", b"three")]
    reader = FrameReader(raft_wire.MAX_FRAME_BYTES)
    reader.seal = FrameSeal(key)
    reader.feed(frames[0])
    assert reader.next_frame() == (0, b"one")
    reader.feed(frames[2])  # the second one dropped (or the third replayed early)
    with pytest.raises(WireError, match="tag"):
        reader.next_frame()

    forged = FrameReader(raft_wire.MAX_FRAME_BYTES)
    forged.seal = FrameSeal(key)
    forged.feed(raft_wire.frame(0, b"one", FrameSeal(bytes(32))))  # another key
    with pytest.raises(WireError, match="tag"):
        forged.next_frame()


def test_a_long_message_travels_in_fragments_under_the_frame_cap() -> None:
    payload = bytes(range(256)) * (3 * raft_wire.FRAGMENT_BYTES // 256 + 7)
    key = bytes(range(32))
    frames = raft_wire.frames_of(payload, FrameSeal(key))
    assert len(frames) == 4
    reader = FrameReader(raft_wire.MAX_FRAME_BYTES)
    reader.seal = FrameSeal(key)
    pieces = []
    for data in frames:
        reader.feed(data)
        flags, piece = reader.next_frame() or (None, b"")
        pieces.append((flags, piece))
    assert [f for f, _ in pieces] == [raft_wire.MORE] * 3 + [0]
    assert b"".join(p for _, p in pieces) == payload


def test_handshake_proofs_bind_the_key_the_nonces_the_roles_and_the_addresses() -> None:
    key, other = bytes(range(32)), bytes(32)
    ni, na = bytes([1]) * 32, bytes([2]) * 32
    mac = raft_wire.handshake_mac(key, "acceptor", ni, na, "127.0.0.1:2", "127.0.0.1:1")
    assert mac == raft_wire.handshake_mac(key, "acceptor", ni, na, "127.0.0.1:2", "127.0.0.1:1")
    for changed in (
        raft_wire.handshake_mac(other, "acceptor", ni, na, "127.0.0.1:2", "127.0.0.1:1"),
        raft_wire.handshake_mac(key, "initiator", ni, na, "127.0.0.1:2", "127.0.0.1:1"),
        raft_wire.handshake_mac(key, "acceptor", na, ni, "127.0.0.1:2", "127.0.0.1:1"),
        raft_wire.handshake_mac(key, "acceptor", ni, na, "127.0.0.1:3", "127.0.0.1:1"),
    ):
        assert not raft_wire.macs_equal(mac, changed)
    i2a, a2i = raft_wire.session_keys(key, ni, na, "127.0.0.1:2", "127.0.0.1:1")
    assert i2a != a2i


def test_handshake_messages_round_trip() -> None:
    nonce = bytes(range(32))
    hello = raft_wire.encode_hello("127.0.0.1:2", "127.0.0.1:1", nonce, True)
    assert raft_wire.decode_hello(hello) == ("127.0.0.1:2", "127.0.0.1:1", nonce, True)
    assert raft_wire.decode_challenge(raft_wire.encode_challenge(nonce, b"m" * 32)) == (
        nonce,
        b"m" * 32,
    )
    assert raft_wire.decode_auth(raft_wire.encode_auth(b"m" * 32)) == b"m" * 32
    for older in ("raftcoord-raft/0", "raftcoord-raft/2"):  # /2 had no pre-vote messages
        with pytest.raises(WireError, match="protocol"):
            raft_wire.decode_hello(bytes(msgpack.packb(["hello", older, "a", "b", nonce, True])))
