# mypy: ignore-errors
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
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

class SpecRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SpecReply(_message.Message):
    __slots__ = ("env_id", "num_envs", "observation_space", "action_space", "service_id", "policy_version")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_ENVS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    SERVICE_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    num_envs: int
    observation_space: str
    action_space: str
    service_id: str
    policy_version: int
    def __init__(self, env_id: _Optional[str] = ..., num_envs: _Optional[int] = ..., observation_space: _Optional[str] = ..., action_space: _Optional[str] = ..., service_id: _Optional[str] = ..., policy_version: _Optional[int] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("has_seed", "seed")
    HAS_SEED_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    has_seed: bool
    seed: int
    def __init__(self, has_seed: _Optional[bool] = ..., seed: _Optional[int] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("envs", "actions", "autoreset")
    ENVS_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    AUTORESET_FIELD_NUMBER: _ClassVar[int]
    envs: _containers.RepeatedScalarFieldContainer[int]
    actions: Tensors
    autoreset: str
    def __init__(self, envs: _Optional[_Iterable[int]] = ..., actions: _Optional[_Union[Tensors, _Mapping]] = ..., autoreset: _Optional[str] = ...) -> None: ...

class StepReply(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: Tensors
    def __init__(self, result: _Optional[_Union[Tensors, _Mapping]] = ...) -> None: ...

class PolicyRequest(_message.Message):
    __slots__ = ("bundle", "param_server", "policy", "min_version")
    BUNDLE_FIELD_NUMBER: _ClassVar[int]
    PARAM_SERVER_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    bundle: bytes
    param_server: str
    policy: str
    min_version: int
    def __init__(self, bundle: _Optional[bytes] = ..., param_server: _Optional[str] = ..., policy: _Optional[str] = ..., min_version: _Optional[int] = ...) -> None: ...

class PolicyReply(_message.Message):
    __slots__ = ("policy", "version")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    policy: str
    version: int
    def __init__(self, policy: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class RolloutRequest(_message.Message):
    __slots__ = ("steps", "min_version", "codec", "refresh_policy")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    REFRESH_POLICY_FIELD_NUMBER: _ClassVar[int]
    steps: int
    min_version: int
    codec: str
    refresh_policy: bool
    def __init__(self, steps: _Optional[int] = ..., min_version: _Optional[int] = ..., codec: _Optional[str] = ..., refresh_policy: _Optional[bool] = ...) -> None: ...

class RolloutReply(_message.Message):
    __slots__ = ("batch", "policy_version")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    batch: Tensors
    policy_version: int
    def __init__(self, batch: _Optional[_Union[Tensors, _Mapping]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("status", "env_steps")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    status: str
    env_steps: int
    def __init__(self, status: _Optional[str] = ..., env_steps: _Optional[int] = ...) -> None: ...
