# mypy: ignore-errors
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensors(_message.Message):
    __slots__ = ("data", "codec", "raw_size")
    DATA_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    RAW_SIZE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    codec: str
    raw_size: int
    def __init__(self, data: _Optional[bytes] = ..., codec: _Optional[str] = ..., raw_size: _Optional[int] = ...) -> None: ...

class PushRequest(_message.Message):
    __slots__ = ("policy", "weights", "version")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    policy: str
    weights: Tensors
    version: int
    def __init__(self, policy: _Optional[str] = ..., weights: _Optional[_Union[Tensors, _Mapping]] = ..., version: _Optional[int] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("version", "sha256")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    version: int
    sha256: str
    def __init__(self, version: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("policy", "since_version", "since_sha256", "lossy")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SINCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SINCE_SHA256_FIELD_NUMBER: _ClassVar[int]
    LOSSY_FIELD_NUMBER: _ClassVar[int]
    policy: str
    since_version: int
    since_sha256: str
    lossy: bool
    def __init__(self, policy: _Optional[str] = ..., since_version: _Optional[int] = ..., since_sha256: _Optional[str] = ..., lossy: _Optional[bool] = ...) -> None: ...

class PullReply(_message.Message):
    __slots__ = ("version", "kind", "base_version", "payload", "sha256", "full_size")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    FULL_SIZE_FIELD_NUMBER: _ClassVar[int]
    version: int
    kind: str
    base_version: int
    payload: Tensors
    sha256: str
    full_size: int
    def __init__(self, version: _Optional[int] = ..., kind: _Optional[str] = ..., base_version: _Optional[int] = ..., payload: _Optional[_Union[Tensors, _Mapping]] = ..., sha256: _Optional[str] = ..., full_size: _Optional[int] = ...) -> None: ...

class LatestRequest(_message.Message):
    __slots__ = ("policy",)
    POLICY_FIELD_NUMBER: _ClassVar[int]
    policy: str
    def __init__(self, policy: _Optional[str] = ...) -> None: ...

class LatestReply(_message.Message):
    __slots__ = ("version", "sha256")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    version: int
    sha256: str
    def __init__(self, version: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...
