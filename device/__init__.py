"""strata's device tier: the policy-bundle contract and a numpy-only policy runtime.

The lowest tier: it needs only the standard library, numpy, cryptography and (for its broker link) paho-mqtt,
all pure Python or small wheels, so it runs where torch and onnxruntime do not, and every other tier can build
on it.
"""

from device._atomic import atomic_file, fsync_dir, write_atomic
from device._bundle import Bundle, Manifest, Verifier, build_bundle, space_bounds, space_to_json
from device._bundle_errors import (
    BundleError,
    BundleFormatError,
    ExpiredBundleError,
    KeyFileError,
    ModelError,
    RollbackError,
    TamperedBundleError,
    UnknownKeyError,
    UnsignedBundleError,
    UnsupportedOperatorError,
    VerifierStateError,
    WrongTierError,
)
from device._config import add_config_arguments, config_from_args, config_from_dict, field_docs, finite_float, seconds
from device._deps import require
from device._device_run import (
    Decision,
    DeviceConfig,
    DeviceReport,
    DeviceRunError,
    DeviceRuntime,
    StateRegion,
    TieredController,
    run_device,
)
from device._device_topics import DevicePayloadError, DeviceTopics, EscalationReply, EscalationRequest
from device._errors import ConfigError, MissingDependencyError, StrataError
from device._executor import NumpyExecutor, supported_operators
from device._export_c import export_c
from device._keys import PublicKey, SigningKey, TrustStore, generate_keypair, load_public_key, load_signing_key
from device._mqtt import DeviceLink, LinkOptions, MqttLinkError
from device._mqtt_access import (
    MqttAccess,
    MqttRole,
    MqttTopicName,
    mqtt_client_id,
    mqtt_topic,
    shared_filter,
)
from device._names import host, identifier, inside, is_host, is_identifier, shown
from device._obs_codec import ObsCodec, frame_shape, is_image
from device._obs_codec import available_codecs as available_obs_codecs
from device._obs_pipeline import ObsPipeline, env_maker, make_env
from device._quantize import quantization_error, quantize_model, smallest_storage
from device._rollout import RolloutBatch
from device._wire import WireError, pack_arrays, unpack_arrays

__all__ = [
    "Bundle",
    "BundleError",
    "BundleFormatError",
    "ConfigError",
    "Decision",
    "DeviceConfig",
    "DeviceLink",
    "DevicePayloadError",
    "DeviceReport",
    "DeviceRunError",
    "DeviceRuntime",
    "DeviceTopics",
    "EscalationReply",
    "EscalationRequest",
    "ExpiredBundleError",
    "KeyFileError",
    "LinkOptions",
    "Manifest",
    "MissingDependencyError",
    "ModelError",
    "MqttAccess",
    "MqttLinkError",
    "MqttRole",
    "MqttTopicName",
    "NumpyExecutor",
    "ObsCodec",
    "ObsPipeline",
    "PublicKey",
    "RollbackError",
    "RolloutBatch",
    "SigningKey",
    "StateRegion",
    "StrataError",
    "TamperedBundleError",
    "TieredController",
    "TrustStore",
    "UnknownKeyError",
    "UnsignedBundleError",
    "UnsupportedOperatorError",
    "Verifier",
    "VerifierStateError",
    "WireError",
    "WrongTierError",
    "add_config_arguments",
    "atomic_file",
    "available_obs_codecs",
    "build_bundle",
    "config_from_args",
    "config_from_dict",
    "env_maker",
    "export_c",
    "field_docs",
    "finite_float",
    "frame_shape",
    "fsync_dir",
    "generate_keypair",
    "host",
    "identifier",
    "inside",
    "is_host",
    "is_identifier",
    "is_image",
    "load_public_key",
    "load_signing_key",
    "make_env",
    "mqtt_client_id",
    "mqtt_topic",
    "pack_arrays",
    "quantization_error",
    "quantize_model",
    "require",
    "run_device",
    "seconds",
    "shared_filter",
    "shown",
    "smallest_storage",
    "space_bounds",
    "space_to_json",
    "supported_operators",
    "unpack_arrays",
    "write_atomic",
]
