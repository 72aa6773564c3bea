from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class InsertRequest(_message.Message):
    __slots__ = ("payload", "timeout_s")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    timeout_s: float
    def __init__(self, payload: _Optional[bytes] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class InsertReply(_message.Message):
    __slots__ = ("inserted",)
    INSERTED_FIELD_NUMBER: _ClassVar[int]
    inserted: bool
    def __init__(self, inserted: _Optional[bool] = ...) -> None: ...

class SampleRequest(_message.Message):
    __slots__ = ("batch_size", "beta", "timeout_s")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    beta: float
    timeout_s: float
    def __init__(self, batch_size: _Optional[int] = ..., beta: _Optional[float] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class SampleReply(_message.Message):
    __slots__ = ("sampled", "payload")
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    sampled: bool
    payload: bytes
    def __init__(self, sampled: _Optional[bool] = ..., payload: _Optional[bytes] = ...) -> None: ...

class UpdatePrioritiesRequest(_message.Message):
    __slots__ = ("payload",)
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    def __init__(self, payload: _Optional[bytes] = ...) -> None: ...

class UpdatePrioritiesReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoReply(_message.Message):
    __slots__ = ("size", "capacity", "inserts", "samples", "nbytes", "item_nbytes", "signature_json", "config_json")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    INSERTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    ITEM_NBYTES_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_JSON_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    size: int
    capacity: int
    inserts: int
    samples: int
    nbytes: int
    item_nbytes: int
    signature_json: str
    config_json: str
    def __init__(self, size: _Optional[int] = ..., capacity: _Optional[int] = ..., inserts: _Optional[int] = ..., samples: _Optional[int] = ..., nbytes: _Optional[int] = ..., item_nbytes: _Optional[int] = ..., signature_json: _Optional[str] = ..., config_json: _Optional[str] = ...) -> None: ...

class DumpRequest(_message.Message):
    __slots__ = ("chunk_bytes",)
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    chunk_bytes: int
    def __init__(self, chunk_bytes: _Optional[int] = ...) -> None: ...

class StateChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class LoadReply(_message.Message):
    __slots__ = ("size",)
    SIZE_FIELD_NUMBER: _ClassVar[int]
    size: int
    def __init__(self, size: _Optional[int] = ...) -> None: ...
