from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ElectLeadersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ElectLeadersResponse(_message.Message):
    __slots__ = ("shards",)
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, shards: _Optional[_Iterable[int]] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShardStatus(_message.Message):
    __slots__ = ("shard", "is_leader", "term", "leader_node_id", "leader_address", "commit_index", "applied_index", "state_digest", "transactional_ids", "parked_requests")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONAL_IDS_FIELD_NUMBER: _ClassVar[int]
    PARKED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    shard: int
    is_leader: bool
    term: int
    leader_node_id: int
    leader_address: str
    commit_index: int
    applied_index: int
    state_digest: str
    transactional_ids: int
    parked_requests: int
    def __init__(self, shard: _Optional[int] = ..., is_leader: _Optional[bool] = ..., term: _Optional[int] = ..., leader_node_id: _Optional[int] = ..., leader_address: _Optional[str] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., state_digest: _Optional[str] = ..., transactional_ids: _Optional[int] = ..., parked_requests: _Optional[int] = ...) -> None: ...

class NodeStatusResponse(_message.Message):
    __slots__ = ("node_id", "address", "pid", "shards")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    address: str
    pid: int
    shards: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    def __init__(self, node_id: _Optional[int] = ..., address: _Optional[str] = ..., pid: _Optional[int] = ..., shards: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ...) -> None: ...
