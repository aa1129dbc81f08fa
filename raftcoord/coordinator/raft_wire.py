"""Raft traffic between coordinators: messages, frames and the peer handshake (pure).

Nothing here touches a socket; :mod:`raftcoord.coordinator.raft_transport`
moves the bytes. Nothing here unpickles: pysyncobj's message dicts are
mapped to a fixed msgpack schema, decoded strictly (every field's type and
range checked), and anything else is a :class:`WireError`.

Messages (msgpack arrays, the first element the kind):

=============== =====================================================================
kind            fields
=============== =====================================================================
APPEND          term, commit index, prev index, prev term, entries
                (``[command bytes, index, term]`` each); or, for a snapshot chunk,
                prev index and prev term nil, entries nil, chunk
                (``[data, first, last]`` or nil)
NEXT_INDEX      next index, reset, success (a follower's answer), directory
REQUEST_VOTE    term, last log index, last log term, directory
RESPONSE_VOTE   term, directory
TIMEOUT_NOW     term (leadership transfer)
PRE_VOTE        term (the candidate's term + 1), last log index, last log term, directory
PRE_VOTE_ANSWER term (the one asked about), granted, the answerer's term, directory
=============== =====================================================================

PRE_VOTE and its answer are the coordinators' own (pysyncobj has no
pre-vote; see :mod:`raftcoord.coordinator.election`).

``directory`` is the sender's data directory id (the empty string for a
member without one): a shard counts a vote or an acknowledgement only from
the directory it recorded for that member (see
:mod:`raftcoord.coordinator.voters`). The transport adds it to what
pysyncobj sends.

pysyncobj's other messages are not Raft traffic of ours: a follower
forwarding a command to the leader (``apply_command``) is answered locally by
the transport, and its utility, membership and read-only-peer messages have
no encoding.

Frames: a 4-byte big-endian length, then a flags byte, the payload, and (on
an authenticated connection) a 16-byte BLAKE2b tag over a per-direction
frame counter, the flags and the payload, keyed by the session key of that
direction. A message longer than :data:`FRAGMENT_BYTES` travels in several
frames, all but the last flagged :data:`MORE`; the receiver reassembles at
most its configured message cap. The length is checked against the frame
cap before anything else is read.

Handshake (the member with the greater address connects, as pysyncobj's
own transport does): the initiator sends HELLO (protocol, its Raft address,
the address it dialled, whether it authenticates, a 32-byte nonce); the
acceptor checks that the initiator is a member of this Raft group and
answers CHALLENGE (its nonce and an HMAC-SHA256 under the cluster key over
both nonces and both addresses), which the initiator checks before sending
AUTH (its own HMAC over the same, with another role label). Both then
derive one session key per direction from the cluster key and the nonces.
Without a cluster key (``--insecure-raft``) HELLO alone is sent and frames
carry no tag.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Any

import msgpack

from raftcoord.protocol.limits import is_directory_id

#: The coordinator epoch is Kafka's int32; a Raft term is a shard's epoch.
MAX_TERM = 2**31 - 1
#: From this term on a shard logs that its epochs are running out.
TERM_WARNING = 2**30
MAX_INDEX = 2**63 - 1

PROTOCOL = "raftcoord-raft/3"
NONCE_BYTES = 32
TAG_BYTES = 16
HEADER = struct.Struct(">I")
#: The largest frame a peer may send before it has authenticated.
HANDSHAKE_FRAME_BYTES = 1024
#: A message longer than this is sent in several frames.
FRAGMENT_BYTES = 1 << 20
#: The longest frame (flags, payload, tag) once authenticated.
MAX_FRAME_BYTES = 1 + FRAGMENT_BYTES + TAG_BYTES
#: Flags: this frame is a fragment, more of the message follows.
MORE = 1

APPEND, NEXT_INDEX, REQUEST_VOTE, RESPONSE_VOTE, TIMEOUT_NOW = 1, 2, 3, 4, 5
PRE_VOTE, PRE_VOTE_ANSWER = 6, 7
HELLO, CHALLENGE, AUTH = "hello", "challenge", "auth"


class WireError(ValueError):
    """Bytes from a peer that are not a valid frame or message."""


# --- messages ---------------------------------------------------------------------------


def encode_message(message: dict[str, Any]) -> bytes:
    """pysyncobj's ``message`` as msgpack.

    Raises:
        WireError: the message has no encoding (a kind that is not Raft
            traffic of ours, or a large entry in pickled chunks, which the
            transport reassembles first), or its term is past :data:`MAX_TERM`.
    """
    kind = message.get("type")
    if kind == "append_entries":
        if "transmission" in message:
            raise WireError("entry chunks are reassembled before encoding")
        if "serialized" in message:
            chunk = message["serialized"]
            body: list[Any] = [
                APPEND,
                message["term"],
                message["commit_index"],
                None,
                None,
                None,
                None if chunk is None else [bytes(chunk[0]), bool(chunk[1]), bool(chunk[2])],
            ]
        else:
            body = [
                APPEND,
                message["term"],
                message["commit_index"],
                message["prevLogIdx"],
                message["prevLogTerm"],
                [[e[0], e[1], e[2]] for e in message.get("entries", ())],
            ]
    elif kind == "next_node_idx":
        body = [
            NEXT_INDEX,
            message["next_node_idx"],
            bool(message["reset"]),
            bool(message["success"]),
            message["directory"],
        ]
    elif kind == "request_vote":
        body = [
            REQUEST_VOTE,
            message["term"],
            message["last_log_index"],
            message["last_log_term"],
            message["directory"],
        ]
    elif kind == "response_vote":
        body = [RESPONSE_VOTE, message["term"], message["directory"]]
    elif kind == "timeout_now":
        body = [TIMEOUT_NOW, message["term"]]
    elif kind == "pre_vote":
        body = [
            PRE_VOTE,
            message["term"],
            message["last_log_index"],
            message["last_log_term"],
            message["directory"],
        ]
    elif kind == "pre_vote_answer":
        body = [
            PRE_VOTE_ANSWER,
            message["term"],
            bool(message["granted"]),
            message["current_term"],
            message["directory"],
        ]
    else:
        raise WireError(f"no wire encoding for a {kind!r} message")
    if kind != "next_node_idx" and not 0 <= body[1] <= MAX_TERM:
        raise WireError(f"term {body[1]} is out of the coordinator epoch's range")
    if kind == "pre_vote_answer" and not 0 <= body[3] <= MAX_TERM:
        raise WireError(f"term {body[3]} is out of the coordinator epoch's range")
    return bytes(msgpack.packb(body, use_bin_type=True))


def _unpack(data: bytes, max_bytes: int) -> Any:
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_bin_len=max_bytes,
            max_str_len=4096,
            max_array_len=max_bytes,
            max_map_len=0,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises many types on hostile input
        raise WireError(f"not a msgpack message: {type(exc).__name__}") from None


def _int(value: Any, what: str, high: int) -> int:
    if type(value) is not int or not 0 <= value <= high:
        raise WireError(f"{what} must be an integer in 0..{high}, got {value!r:.40}")
    return value


def _bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise WireError(f"{what} must be a boolean, got {value!r:.40}")
    return value


def _term(value: Any) -> int:
    return _int(value, "term", MAX_TERM)


def _index(value: Any, what: str) -> int:
    return _int(value, what, MAX_INDEX)


def _entries(value: Any) -> list[tuple[bytes, int, int]]:
    if type(value) is not list:
        raise WireError("entries must be a list")
    entries = []
    for item in value:
        if type(item) is not list or len(item) != 3 or type(item[0]) is not bytes:
            raise WireError("an entry must be [command bytes, index, term]")
        entries.append((item[0], _index(item[1], "entry index"), _term(item[2])))
    return entries


def _directory(value: Any) -> str:
    if type(value) is not str or (value and not is_directory_id(value)):
        raise WireError(f"a directory id must be one or empty, got {value!r:.40}")
    return value


def _chunk(value: Any) -> tuple[bytes, bool, bool] | None:
    if value is None:
        return None
    if type(value) is not list or len(value) != 3 or type(value[0]) is not bytes:
        raise WireError("a snapshot chunk must be [data, first, last]")
    return value[0], _bool(value[1], "first"), _bool(value[2], "last")


def decode_message(data: bytes, max_bytes: int) -> dict[str, Any]:
    """The pysyncobj message dict that ``data`` encodes.

    Raises:
        WireError: anything but a well-formed message of a known kind with
            every field in range.
    """
    body = _unpack(data, max_bytes)
    if type(body) is not list or not body or type(body[0]) is not int:
        raise WireError("a message must be a list starting with its kind")
    kind, n = body[0], len(body)
    if kind == APPEND and n == 6:
        return {
            "type": "append_entries",
            "term": _term(body[1]),
            "commit_index": _index(body[2], "commit index"),
            "prevLogIdx": _index(body[3], "prev index"),
            "prevLogTerm": _term(body[4]),
            "entries": _entries(body[5]),
        }
    if kind == APPEND and n == 7 and body[3] is None and body[4] is None and body[5] is None:
        return {
            "type": "append_entries",
            "term": _term(body[1]),
            "commit_index": _index(body[2], "commit index"),
            "serialized": _chunk(body[6]),
        }
    if kind == NEXT_INDEX and n == 5:
        return {
            "type": "next_node_idx",
            "next_node_idx": _index(body[1], "next index"),
            "reset": _bool(body[2], "reset"),
            "success": _bool(body[3], "success"),
            "directory": _directory(body[4]),
        }
    if kind == REQUEST_VOTE and n == 5:
        return {
            "type": "request_vote",
            "term": _term(body[1]),
            "last_log_index": _index(body[2], "last log index"),
            "last_log_term": _term(body[3]),
            "directory": _directory(body[4]),
        }
    if kind == RESPONSE_VOTE and n == 3:
        return {"type": "response_vote", "term": _term(body[1]), "directory": _directory(body[2])}
    if kind == TIMEOUT_NOW and n == 2:
        return {"type": "timeout_now", "term": _term(body[1])}
    if kind == PRE_VOTE and n == 5:
        return {
            "type": "pre_vote",
            "term": _term(body[1]),
            "last_log_index": _index(body[2], "last log index"),
            "last_log_term": _term(body[3]),
            "directory": _directory(body[4]),
        }
    if kind == PRE_VOTE_ANSWER and n == 5:
        return {
            "type": "pre_vote_answer",
            "term": _term(body[1]),
            "granted": _bool(body[2], "granted"),
            "current_term": _term(body[3]),
            "directory": _directory(body[4]),
        }
    raise WireError(f"unknown message kind {kind} with {n} fields")


# --- handshake --------------------------------------------------------------------------


def encode_hello(initiator: str, acceptor: str, nonce: bytes, authenticated: bool) -> bytes:
    return bytes(
        msgpack.packb(
            [HELLO, PROTOCOL, initiator, acceptor, nonce, authenticated], use_bin_type=True
        )
    )


def decode_hello(data: bytes) -> tuple[str, str, bytes, bool]:
    """(initiator's address, dialled address, nonce, authenticates) of a HELLO."""
    body = _unpack(data, HANDSHAKE_FRAME_BYTES)
    if (
        type(body) is not list
        or len(body) != 6
        or body[0] != HELLO
        or type(body[2]) is not str
        or type(body[3]) is not str
        or type(body[4]) is not bytes
        or len(body[4]) != NONCE_BYTES
        or type(body[5]) is not bool
    ):
        raise WireError("not a HELLO")
    if body[1] != PROTOCOL:
        raise WireError(f"protocol {body[1]!r:.40}, expected {PROTOCOL!r}")
    return body[2], body[3], body[4], body[5]


def encode_challenge(nonce: bytes, mac: bytes) -> bytes:
    return bytes(msgpack.packb([CHALLENGE, nonce, mac], use_bin_type=True))


def decode_challenge(data: bytes) -> tuple[bytes, bytes]:
    """(acceptor's nonce, acceptor's MAC) of a CHALLENGE."""
    body = _unpack(data, HANDSHAKE_FRAME_BYTES)
    if (
        type(body) is not list
        or len(body) != 3
        or body[0] != CHALLENGE
        or type(body[1]) is not bytes
        or len(body[1]) != NONCE_BYTES
        or type(body[2]) is not bytes
    ):
        raise WireError("not a CHALLENGE")
    return body[1], body[2]


def encode_auth(mac: bytes) -> bytes:
    return bytes(msgpack.packb([AUTH, mac], use_bin_type=True))


def decode_auth(data: bytes) -> bytes:
    """The initiator's MAC of an AUTH."""
    body = _unpack(data, HANDSHAKE_FRAME_BYTES)
    if type(body) is not list or len(body) != 2 or body[0] != AUTH or type(body[1]) is not bytes:
        raise WireError("not an AUTH")
    return body[1]


def _transcript(
    label: bytes, nonce_i: bytes, nonce_a: bytes, initiator: str, acceptor: str
) -> bytes:
    return b"\0".join(
        [PROTOCOL.encode(), label, nonce_i, nonce_a, initiator.encode(), acceptor.encode()]
    )


def handshake_mac(
    key: bytes, role: str, nonce_i: bytes, nonce_a: bytes, initiator: str, acceptor: str
) -> bytes:
    """The proof that the ``role`` ("initiator" or "acceptor") holds ``key``."""
    message = _transcript(role.encode(), nonce_i, nonce_a, initiator, acceptor)
    return hmac.digest(key, message, "sha256")


def session_keys(
    key: bytes, nonce_i: bytes, nonce_a: bytes, initiator: str, acceptor: str
) -> tuple[bytes, bytes]:
    """(initiator-to-acceptor key, acceptor-to-initiator key) of one connection."""
    return (
        hmac.digest(key, _transcript(b"i2a", nonce_i, nonce_a, initiator, acceptor), "sha256"),
        hmac.digest(key, _transcript(b"a2i", nonce_i, nonce_a, initiator, acceptor), "sha256"),
    )


def macs_equal(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)


class FrameSeal:
    """Tags (or checks) one direction's frames: each frame's tag covers its
    number in the direction, so a frame replayed, dropped or reordered
    fails the check of every frame after it."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._count = 0

    def tag(self, flags_and_payload: bytes | memoryview) -> bytes:
        h = hashlib.blake2b(self._count.to_bytes(8, "big"), key=self._key, digest_size=TAG_BYTES)
        h.update(flags_and_payload)
        self._count += 1
        return h.digest()


def frame(flags: int, payload: bytes, seal: FrameSeal | None) -> bytes:
    """One frame: length, flags, payload and (with ``seal``) the tag."""
    body = bytes((flags,)) + payload
    if seal is not None:
        body += seal.tag(body)
    return HEADER.pack(len(body)) + body


def frames_of(payload: bytes, seal: FrameSeal | None) -> list[bytes]:
    """``payload`` as one frame, or as fragments of :data:`FRAGMENT_BYTES`."""
    if len(payload) <= FRAGMENT_BYTES:
        return [frame(0, payload, seal)]
    view = memoryview(payload)
    out = []
    for start in range(0, len(payload), FRAGMENT_BYTES):
        piece = bytes(view[start : start + FRAGMENT_BYTES])
        more = MORE if start + FRAGMENT_BYTES < len(payload) else 0
        out.append(frame(more, piece, seal))
    return out


class FrameReader:
    """Frames out of a byte stream from one peer, checked one at a time.

    :meth:`feed` takes what the socket gave; :meth:`next_frame` returns the
    next complete frame's (flags, payload) or None. A length over
    :attr:`max_frame` or a wrong tag raises :class:`WireError` before the
    frame's payload is looked at. The caller may change :attr:`max_frame`
    and :attr:`seal` between frames (the handshake does).
    """

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self.seal: FrameSeal | None = None
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_frame(self) -> tuple[int, bytes] | None:
        if len(self._buffer) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(self._buffer)
        if not 1 + (TAG_BYTES if self.seal else 0) <= length <= self.max_frame:
            raise WireError(f"a frame of {length} bytes (at most {self.max_frame})")
        end = HEADER.size + length
        if len(self._buffer) < end:
            return None
        body = bytes(self._buffer[HEADER.size : end])
        del self._buffer[:end]
        if self.seal is not None:
            content, tag = body[:-TAG_BYTES], body[-TAG_BYTES:]
            if not hmac.compare_digest(self.seal.tag(content), tag):
                raise WireError("a frame whose tag does not match (not from the peer)")
            body = content
        return body[0], body[1:]
