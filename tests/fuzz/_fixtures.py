"""Real artifacts for the fuzz harness: keys, bundles, configs, a kit, an edge cache and a trained run dir.

Every one is made with strata's public API or its own CLI, so a path option that reads a bundle gets a real
bundle, and the harness can also damage them ("files we wrote").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _pem_certificate(folder: Path) -> tuple[Path, Path]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fuzz")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    key_path, cert_path = folder / "tls.key", folder / "tls.pem"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def _cartpole_model() -> bytes:
    import numpy as np
    from onnx import TensorProto, helper

    weights = np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["obs", "W"], ["logits"]),
         helper.make_node("ArgMax", ["logits"], ["action"], axis=1, keepdims=0)], "policy",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("action", TensorProto.INT64, ["batch"]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor("W", TensorProto.FLOAT, [4, 2], weights.ravel().tolist())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


CARTPOLE_OBS = {"type": "Box", "shape": [4], "dtype": "float32",
                "low": [-4.800000190734863, "-inf", -0.41887903213500977, "-inf"],
                "high": [4.800000190734863, "inf", 0.41887903213500977, "inf"]}


def build(root: Path, *, run_dir: bool = True) -> dict[str, Path]:
    """Write the fixtures under `root`; return content tag -> path."""
    from device import build_bundle, generate_keypair, load_signing_key

    root.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    private, public = generate_keypair(root / "keys", name="signer")
    key = load_signing_key(private)
    out["private-key"], out["public-key"] = private, public
    model = _cartpole_model()
    common = {"observation_space": CARTPOLE_OBS, "action_space": {"type": "Discrete", "n": 2}, "signing_key": key,
              "output_names": ("action", "logits")}
    edge = build_bundle(model, policy="cartpole", version=1, parent_version=None, target_tier="edge", **common)
    micro = build_bundle(model, policy="cartpole-micro", version=1, parent_version=None, target_tier="device",
                         **common)
    out["bundle"] = root / "policy.bundle"
    out["bundle"].write_bytes(edge.to_bytes())
    out["device-bundle"] = root / "micro.bundle"
    out["device-bundle"].write_bytes(micro.to_bytes())
    out["certificate"], out["tls-key"] = _pem_certificate(root)
    out["password"] = root / "password"
    out["password"].write_text("secret\n")
    out["state"] = root / "verifier.json"
    out["state"].write_text(json.dumps({"format": 1, "highest_accepted": {"cartpole": 1}}))
    cache = root / "edge-cache"
    from device import TrustStore, load_public_key
    from edge._cache import PolicyCache

    policy_cache = PolicyCache(cache, trust=TrustStore([load_public_key(public)]), tier="edge")
    policy_cache.stage(policy_cache.verify(edge.to_bytes()), data=edge.to_bytes())
    policy_cache.commit()
    out["edge-cache"] = cache
    out["edge-config"] = root / "edge.toml"
    out["edge-config"].write_text(f'[identity]\nfleet = "fleet"\nnode_id = "node-1"\ntrust = ["{public}"]\n'
                                  f'[cache]\ncache_dir = "{cache}"\n[simulator]\nsteps = 5\n')
    out["device-config"] = root / "device.toml"
    out["device-config"].write_text(f'[identity]\nfleet = "fleet"\ntrust = ["{public}"]\n'
                                    '[decisions]\npolicy_wait_s = 0.5\n')
    from edge._provision import write_kit

    kit = write_kit(root / "kits", node="node-1", config={"fleet": "fleet", "trust": ("signer.pub",)},
                    files={"signer.pub": public.read_bytes()})
    out["kit"] = root / "kits" / kit.node
    out["spaces"] = root / "spaces.json"
    out["spaces"].write_text(json.dumps({"observation_space": CARTPOLE_OBS,
                                         "action_space": {"type": "Discrete", "n": 2}, "max_steps": 64}))
    out["requirements"] = root / "requirements.txt"
    out["requirements"].write_text("numpy\n")
    if run_dir:
        out["run-dir"] = train_tiny_run(root / "run")
    return out


def train_tiny_run(run: Path) -> Path:
    """A finished 256-step PPO run on CartPole (sync envs), trained by `strata train` itself."""
    code = ("import sys; from cloud.cli import main; sys.exit(main(['train', '--env', 'CartPole-v1', '--run-dir', "
            f"{str(run)!r}, '--total-steps', '256', '--num-envs', '2', '--num-steps', '64', '--env-mode', 'sync', "
            "'--update-epochs', '1', '--confirm-episodes', '0', '--preset', 'none', '--no-control']))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STRATA_", "AWS_"))}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"training the fixture run failed: {result.stderr[-2000:]}")
    return run
