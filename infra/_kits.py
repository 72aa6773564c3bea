"""Provisioning kits for nodes on AWS IoT Core: ``strata infra apply --kits DIR``.

After an apply, each edge node of the stage has a credentials file (`infra._iot.write_credentials`: the
thing's certificate and private key, the account's data endpoint, the client id, the stage's fleet). A kit
turns it into what ``strata edge install --kit`` takes: ``DIR/<node>/`` holding ``edge.toml`` (broker
``mqtts://ENDPOINT:8883``, TLS files, fleet, node id, trusted keys), the certificate, the key, the Amazon root CA
and every trusted signing key (public keys only), folder 0700 and files 0600. The root CA comes from the
``certifi`` bundle (the same Amazon Root CA 1 that AWS serves), so no download is needed. Nothing here logs a key.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from device import KeyFileError, identifier, inside
from device._config_file import toml_tables, write_kit
from device._keys import trusted_key_files
from infra._errors import DeployConfigError
from infra._iot import credentials_path

ROOT_CA_FILE = "AmazonRootCA1.pem"
CERT_FILE = "certificate.pem.crt"
KEY_FILE = "private.pem.key"
_ROOT_CA_LABEL = '# Label: "Amazon Root CA 1"'


def amazon_root_ca() -> bytes:
    """Amazon Root CA 1 (PEM), the CA of IoT Core's ATS endpoints, read from the certifi bundle."""
    try:
        import certifi
    except ImportError:
        raise DeployConfigError("--kits needs the Amazon root CA from the certifi package: pip install "
                                "'strata[infra]'") from None
    text = Path(certifi.where()).read_text(encoding="ascii", errors="replace")
    start = text.find(_ROOT_CA_LABEL)
    begin = text.find("-----BEGIN CERTIFICATE-----", start)
    end = text.find("-----END CERTIFICATE-----", begin)
    if start < 0 or begin < 0 or end < 0:
        raise DeployConfigError(f"the certifi bundle {certifi.where()} has no Amazon Root CA 1; upgrade certifi")
    return (text[begin:end] + "-----END CERTIFICATE-----\n").encode()


def write_iot_kits(out: Path, *, state_dir: Path, stage: str, nodes: tuple[str, ...],
                   trust: Sequence[Path]) -> list[Path]:
    """Write ``out/<node>/`` for every node of `stage` from its credentials file; return the kit folders.

    Every trusted key goes through the one trust-anchor parser (a private key is refused, never copied) and
    keeps a file of its own (rotation: old and new key side by side).
    """
    try:
        trusted = trusted_key_files(trust, what="--trust", taken=("edge.toml", CERT_FILE, KEY_FILE, ROOT_CA_FILE))
    except KeyFileError as exc:
        raise DeployConfigError(f"strata infra apply --kits: {exc}") from None
    ca = amazon_root_ca()
    kits = []
    for node in nodes:
        path = credentials_path(state_dir, stage, node)
        try:
            creds: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise DeployConfigError(f"node {node!r} of stage {stage!r} has no readable credentials file {path} "
                                    f"({exc}); run `strata infra apply` for the stage first") from None
        config = {
            "identity": {"fleet": creds["fleet"], "node_id": node, "trust": list(trusted)},
            "broker": {"broker": f"mqtts://{creds['endpoint']}:{creds['port']}", "ca_file": ROOT_CA_FILE,
                       "cert_file": CERT_FILE, "key_file": KEY_FILE},
            "cache": {"cache_dir": "cache"},
        }
        folder = inside(out, identifier(node, what="node id"), what="kit folder")
        write_kit(folder, {"edge.toml": toml_tables(config).encode(), CERT_FILE: creds["certificate_pem"].encode(),
                           KEY_FILE: creds["private_key_pem"].encode(), ROOT_CA_FILE: ca, **trusted})
        kits.append(out / node)
    return kits
