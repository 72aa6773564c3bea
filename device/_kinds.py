"""The option kinds several commands share: key, bundle, config, credential and TLS files, broker URLs, seeds.

Declaring them once keeps one cap and one wording per kind of file across the tiers (`device._options`).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

from device._bundle import MAX_MANIFEST_BYTES, MAX_MODEL_BYTES
from device._bundle_errors import KeyFileError
from device._keys import MAX_KEY_FILE_BYTES, parse_public_keys
from device._obs_pipeline import MAX_FRAME_STACK
from device._options import InputFile, Integer, Kind, Many, Matching, Name, Refused, Url

MAX_BUNDLE_BYTES = MAX_MODEL_BYTES + MAX_MANIFEST_BYTES + 64 * 1024
"""A bundle file above this cannot be valid (its model and manifest sections are capped)."""
MAX_CONFIG_BYTES = 1024 * 1024
"""A TOML config file, a kit's ``edge.toml``: far below this."""
MAX_PASSWORD_BYTES = 4096
MAX_PEM_BYTES = 1024 * 1024
"""A PEM certificate bundle or key (a system CA bundle is ~200 KB)."""

PUBLIC_KEY = InputFile(what="public key file (.pub)", max_bytes=MAX_KEY_FILE_BYTES, content="public-key")
PRIVATE_KEY = InputFile(what="private key file (.key)", max_bytes=MAX_KEY_FILE_BYTES, content="private-key")
TRUST = Many(item=PUBLIC_KEY)
"""Trusted public keys, one file per key (rotation: the old and the new)."""
BUNDLE = InputFile(what="bundle file", max_bytes=MAX_BUNDLE_BYTES, content="bundle")
DEVICE_BUNDLE = InputFile(what="bundle file", max_bytes=MAX_BUNDLE_BYTES, content="device-bundle")
PASSWORD_FILE = InputFile(what="password file", max_bytes=MAX_PASSWORD_BYTES, content="password")
CA_FILE = InputFile(what="PEM certificate file", max_bytes=MAX_PEM_BYTES, content="certificate")
CERT_FILE = InputFile(what="PEM certificate file", max_bytes=MAX_PEM_BYTES, content="certificate")
KEY_FILE = InputFile(what="PEM private key file", max_bytes=MAX_PEM_BYTES, content="tls-key")
BROKER_URL = Url(schemes=("mqtt", "mqtts", "tcp", "ssl"))
"""An MQTT broker: mqtt:// (tcp://) or mqtts:// (ssl://) with TLS."""
SEED = Integer(min=0, max=2**32 - 1)
"""numpy and gymnasium take seeds 0 to 2**32 - 1."""
FLEET = Name()
FRAME_STACK = Integer(min=1, max=MAX_FRAME_STACK)
"""Observations stacked per step by the observation pipeline (1: none)."""
OBS_CODEC = Matching(pattern=r"(raw|png|webp|jxl)(:[0-9]{1,3})?", example="webp:90",
                     words="raw, png, webp or jxl, lossy as webp:Q or jxl:Q (Q from 1 to 100)")
"""An observation codec as a run records it (`device.ObsCodec`'s spec); the quality's range is checked there."""
NODE = Name()
STAGE = Matching(pattern=r"[a-z0-9][a-z0-9-]{0,19}", example="dev",
                 words="a stage name: 1-20 lowercase letters, digits or '-', starting with a letter or digit")
"""A deployment stage: the identifier rule narrowed to what S3 bucket names take (no capitals, '_' or '.') and
short enough for ``strata-{stage}-{account}-{region}`` to stay within S3's 63 characters."""


def config_file(content: str) -> InputFile:
    """A TOML config file of `content` (``edge-config``, ``device-config``)."""
    return InputFile(what="TOML config file", max_bytes=MAX_CONFIG_BYTES, content=content)


@dataclass(frozen=True)
class PublicKeyText(Kind):
    """Ed25519 public key(s) as PEM text, or the path of a ``.pub`` file holding them; "" for none."""

    metavar = "PEM_OR_FILE"

    @property
    def form(self) -> str:
        return "the PEM of an Ed25519 public key, or the path of a .pub file"

    def check_form(self, value: Any) -> str:
        if not isinstance(value, str) or len(value) > MAX_KEY_FILE_BYTES or "\x00" in value:
            raise Refused(self.problem())
        return value

    def check(self, value: Any) -> str:
        value = self.check_form(value)
        if not value:
            return typing.cast(str, value)
        if "-----BEGIN" in value:
            try:
                parse_public_keys(value, source="the key")
            except KeyFileError as exc:
                raise Refused(f"is not a public key: {str(exc)[:160]}") from None
            return typing.cast(str, value)
        return PUBLIC_KEY.check(value)
