"""Device-tier commands: `strata keys generate`, `strata bundle inspect` and `strata bundle verify`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the device tier's commands to the root parser."""
    keys = sub.add_parser("keys", help="manage Ed25519 bundle-signing keys",
                          description="Manage the Ed25519 keys that sign and verify policy bundles.")
    keys_sub = keys.add_subparsers(dest="keys_command", metavar="COMMAND", required=True)
    gen = keys_sub.add_parser(
        "generate", help="write a new signing key pair",
        description="Write a new Ed25519 key pair: NAME.key (private, mode 0600) and NAME.pub (public). "
        "Existing keys are never overwritten.")
    gen.add_argument("--out", required=True, type=Path, help="folder to write the key pair into")
    gen.add_argument("--name", default="strata-signing", help="file name stem of the pair (default: %(default)s)")
    gen.set_defaults(func=_keys_generate)

    bundle = sub.add_parser("bundle", help="inspect and verify signed policy bundles",
                            description="Inspect and verify signed policy bundles (.bundle files).")
    bundle_sub = bundle.add_subparsers(dest="bundle_command", metavar="COMMAND", required=True)
    inspect = bundle_sub.add_parser(
        "inspect", help="print a bundle's manifest without verifying it",
        description="Parse a bundle file and print its manifest, key id and sizes, and whether the device "
        "tier's numpy executor can run its model. Checks the format only; use `strata bundle verify` to check "
        "the signature.")
    inspect.add_argument("file", type=Path, help="bundle file")
    inspect.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    inspect.set_defaults(func=_bundle_inspect)

    verify = bundle_sub.add_parser(
        "verify", help="verify a bundle's signature, digest, expiry, tier and version",
        description="Verify a bundle as a consumer would. Exit 0 when it passes; exit 2 with the reason "
        "when it is refused.")
    verify.add_argument("file", type=Path, help="bundle file")
    verify.add_argument("--trust", required=True, action="append", type=Path, metavar="PUBFILE",
                        help="trusted public key file (repeat for several keys)")
    verify.add_argument("--tier", default="any", choices=["edge", "device", "any"],
                        help="consumer tier to check the bundle's target against (default: %(default)s, no check)")
    verify.add_argument("--state", type=Path, default=None,
                        help="anti-rollback state file (JSON); refuses versions not newer than the highest "
                        "accepted in it")
    verify.add_argument("--accept", action="store_true",
                        help="record the verified version in --state as the highest accepted")
    verify.set_defaults(func=_bundle_verify)


def _keys_generate(args: argparse.Namespace) -> int:
    from device._keys import generate_keypair, load_public_key

    key_path, pub_path = generate_keypair(args.out, name=args.name)
    print(f"private key: {key_path} (mode 0600; keep it secret)")
    print(f"public key:  {pub_path}")
    print(f"key id:      {load_public_key(pub_path).key_id}")
    return 0


def _read_file(path: Path, command: str) -> bytes:
    from device._bundle_errors import BundleFormatError

    try:
        return path.read_bytes()
    except OSError as exc:
        raise BundleFormatError(f"{command}: cannot read {path}: {exc.strerror or exc}") from exc


def _bundle_inspect(args: argparse.Namespace) -> int:
    from device._bundle import Bundle
    from device._bundle_errors import ModelError
    from device._executor import NumpyExecutor

    data = _read_file(args.file, "strata bundle inspect")
    bundle = Bundle.from_bytes(data)
    m = bundle.manifest
    try:
        executor: dict[str, object] = {"ok": True, "plan_steps": NumpyExecutor(bundle.model).num_steps}
    except ModelError as exc:
        executor = {"ok": False, "reason": str(exc)}
    summary = {"file": str(args.file), "bytes": len(data), "model_bytes": len(bundle.model),
               "key_id": bundle.key_id or None, "signed": bundle.signed, "manifest": m.to_json_dict(),
               "numpy_executor": executor}
    if args.json:
        print(json.dumps(summary, sort_keys=True))
        return 0
    print(f"bundle            {args.file} ({len(data)} bytes, model {len(bundle.model)} bytes)")
    print(f"signed            {'yes, key ' + bundle.key_id if bundle.signed else 'NO (every verifier refuses it)'}")
    for name, value in m.to_json_dict().items():
        if name != "format":
            print(f"{name:<18}{json.dumps(value, sort_keys=True)}")
    runs = f"loads ({executor['plan_steps']} plan steps)" if executor["ok"] else f"cannot run it: {executor['reason']}"
    print(f"numpy executor    {runs}")
    return 0


def _bundle_verify(args: argparse.Namespace) -> int:
    from device._bundle import Verifier
    from device._keys import TrustStore

    data = _read_file(args.file, "strata bundle verify")
    verifier = Verifier(trust=TrustStore.from_paths(args.trust), tier=args.tier, state_path=args.state)
    bundle = verifier.verify(data)
    if args.accept:
        verifier.accept(bundle)
    m = bundle.manifest
    note = f"; recorded as highest accepted in {args.state}" if args.accept and args.state else ""
    print(f"OK {m.policy} v{m.version} signed by {bundle.key_id}, target tier {m.target_tier}{note}")
    return 0
