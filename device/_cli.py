"""Device-tier commands: `strata keys generate`, `strata bundle inspect|verify`, `strata device run|config|export-c`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from device._config_file import ConfigLayout, Layered


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the device tier's commands to the root parser."""
    from device._config import add_option, command
    from device._kinds import BUNDLE, TRUST
    from device._options import Choice, Name, OutputFile, OutputFolder, Switch

    keys = sub.add_parser("keys", help="manage Ed25519 bundle-signing keys",
                          description="Manage the Ed25519 keys that sign and verify policy bundles.")
    keys_sub = keys.add_subparsers(dest="keys_command", metavar="COMMAND", required=True)
    gen = keys_sub.add_parser(
        "generate", help="write a new signing key pair",
        description="Write a new Ed25519 key pair: NAME.key (private, mode 0600) and NAME.pub (public). "
        "Existing keys are never overwritten.")
    add_option(gen, "--out", OutputFolder(what="key folder"), required=True, help="folder to write the key pair into")
    add_option(gen, "--name", Name(), default="strata-signing", help="file name stem of the pair")
    command(gen, check=_keys_generate_check, run=_keys_generate)

    bundle = sub.add_parser("bundle", help="inspect and verify signed policy bundles",
                            description="Inspect and verify signed policy bundles (.bundle files).")
    bundle_sub = bundle.add_subparsers(dest="bundle_command", metavar="COMMAND", required=True)
    inspect = bundle_sub.add_parser(
        "inspect", help="print a bundle's manifest without verifying it",
        description="Parse a bundle file and print its manifest, key id and sizes, and whether the device "
        "tier's numpy executor can run its model. Checks the format only; use `strata bundle verify` to check "
        "the signature.")
    add_option(inspect, "file", BUNDLE, help="bundle file")
    add_option(inspect, "--json", Switch(), default=False, help="print one JSON object instead of a table")
    command(inspect, check=_bundle_inspect_check, run=_bundle_inspect)

    verify = bundle_sub.add_parser(
        "verify", help="verify a bundle's signature, digest, expiry, tier and version",
        description="Verify a bundle as a consumer would. Exit 0 when it passes; exit 2 with the reason "
        "when it is refused.")
    add_option(verify, "file", BUNDLE, help="bundle file")
    add_option(verify, "--trust", TRUST, required=True, takes="repeat", metavar="PUBFILE",
               help="trusted public key file (repeat for several keys)")
    add_option(verify, "--tier", Choice(values=("edge", "device", "any")), default="any",
               help="consumer tier to check the bundle's target against (any: no check)")
    add_option(verify, "--state", OutputFile(what="anti-rollback state file"),
               help="anti-rollback state file (JSON); refuses versions not newer than the highest accepted in it")
    add_option(verify, "--accept", Switch(), default=False,
               help="record the verified version in --state as the highest accepted (needs --state)")
    command(verify, check=_bundle_verify_check, run=_bundle_verify)
    _register_device(sub)


def _register_device(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from device._config import add_option, command
    from device._kinds import DEVICE_BUNDLE, SEED, TRUST, config_file
    from device._options import EnvId, Integer, OutputFile, OutputFolder, Switch

    device = sub.add_parser("device", help="run a terminal device; export micro policies to C",
                            description="The terminal-device tier: micro policies that escalate to their edge node.")
    device_sub = device.add_subparsers(dest="device_command", metavar="COMMAND", required=True)
    run = device_sub.add_parser(
        "run", help="act on a local env with a micro policy relayed by the edge, escalating uncertain steps",
        description="Connect to the edge node's broker (paho-mqtt; --username/--password-file and TLS for a secure "
        "broker), wait for a verified device "
        "bundle on the edge's device-policy topic, act on a local gymnasium env (standing in for sensors) with "
        "the numpy executor and escalate low-confidence or stale decisions to the edge within a latency budget. "
        "Ends with one JSON line: returns, decisions per tier, escalated fraction, latencies.")
    add_option(run, "--env", EnvId(), required=True, help="gymnasium env id standing in for the sensors")
    add_option(run, "--steps", Integer(min=1, max=10**9), default=1000, help="decisions to make")
    add_option(run, "--seed", SEED, default=0, help="env seed")
    add_option(run, "--decisions-out", OutputFile(what="decision log"),
               help="write one JSON line per decision (step, tier, reason, confidence, latency, edge version)")
    _device_config_options(run.add_argument_group("device (DeviceConfig)"), config_file("device-config"))
    command(run, check=_device_run_check, run=_device_run)

    config_cmd = device_sub.add_parser("config", help="show or check a device's merged config",
                                       description="Merge the config file, STRATA_DEVICE_* variables and flags "
                                       "as `strata device run` does.")
    config_sub = config_cmd.add_subparsers(dest="config_command", metavar="COMMAND", required=True)
    show = config_sub.add_parser("show", help="print the merged config and where each value came from",
                                 description="Print the merged config as TOML, each value followed by its "
                                 "source: default, file, env or flag.")
    _device_config_options(show, config_file("device-config"))
    command(show, check=_device_config_checked, run=_device_config_show)
    check = config_sub.add_parser("check", help="validate a device's config and the files it names",
                                  description="Exit 0 when the merged config passes exactly the checks `strata "
                                  "device run` makes before it connects (values, trusted keys, password and TLS "
                                  "files, the anti-rollback state); otherwise one line, exit 2.")
    _device_config_options(check, config_file("device-config"))
    command(check, check=_device_config_checked, run=_device_config_check)

    export_c = device_sub.add_parser(
        "export-c", help="write a micro policy as dependency-free C99 (static weights, no malloc, libm only)",
        description="Translate a bundle's dense-MLP policy into strata_policy.h / strata_policy.c (API: int32_t "
        "strata_policy_act(const float *obs, float *out)) plus a test harness strata_policy_main.c. The bundle is "
        "verified first against --trust (nothing is compiled from an unverified bundle). Operators "
        "outside the supported set are refused by name. A NaN or infinite observation is refused: the call returns "
        "STRATA_POLICY_NONFINITE (-1) and leaves `out` untouched.")
    add_option(export_c, "--bundle", DEVICE_BUNDLE, required=True, help="policy bundle (.bundle)")
    add_option(export_c, "--out", OutputFolder(what="folder for the C files"), required=True,
               help="folder to write the C files into")
    add_option(export_c, "--trust", TRUST, takes="repeat", metavar="PUBFILE",
               help="trusted public key file the bundle must be signed with (repeat for several keys); the bundle is "
               "verified (signature, digest, expiry) before any C is written")
    add_option(export_c, "--insecure-skip-verify", Switch(), default=False,
               help="write C from a bundle that is NOT verified (local experiments only; prints a warning)")
    command(export_c, check=_device_export_c_check, run=_device_export_c)


def _device_config_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, config_kind: Any) -> None:
    from device._config import add_config_arguments, add_option
    from device._device_run import DeviceConfig

    add_option(parser, "--config", config_kind, metavar="FILE",
               help="TOML config file ([broker], [identity], [state], [decisions]); STRATA_DEVICE_* variables, then "
               "flags, override its values")
    add_config_arguments(parser, DeviceConfig)


def _device_layout() -> ConfigLayout:
    """How `DeviceConfig` is laid out in ``device.toml`` and ``STRATA_DEVICE_*`` (see `device._config_file`)."""
    from device._config_file import ConfigLayout
    from device._device_run import DeviceConfig

    return ConfigLayout(
        cls=DeviceConfig,
        groups={"broker": ("broker", "username", "password_file", "ca_file", "cert_file", "key_file", "keepalive_s",
                           "max_bundle_bytes"),
                "identity": ("fleet", "edge_node", "device_id", "trust"),
                "state": ("state_path",),
                "decisions": ("confidence", "threshold", "budget_ms", "stale_after_s", "policy_wait_s")},
        env_prefix="STRATA_DEVICE_")


def _layered_device_config(args: argparse.Namespace) -> tuple[ConfigLayout, Layered[Any]]:
    import dataclasses
    import os

    from device._config_file import load_layered

    layout = _device_layout()
    flags = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(layout.cls) if f.init}
    return layout, load_layered(layout, file=args.config, environ=os.environ, flags=flags)


def _device_config_checked(args: argparse.Namespace) -> tuple[ConfigLayout, Layered[Any]]:
    """`strata device run`'s config check (also `device config show|check`): the merged config and its files.

    Everything `DeviceRuntime` reads before it connects is read here: the trusted keys, the password file, the TLS
    files (parsed into a TLS context) and the anti-rollback state, so a config that passes never fails at start.
    """
    from device._bundle import Verifier
    from device._device_run import read_password_file
    from device._errors import ConfigError
    from device._keys import TrustStore
    from device._mqtt import tls_context
    from device._names import shown

    layout, layered = _layered_device_config(args)
    config = layered.config
    if not config.trust:
        raise ConfigError("strata device: trust is empty; pass at least one --trust PUBFILE (or [identity] trust "
                          "in the config file) that signs device bundles")
    trust = TrustStore.from_paths(config.trust)
    Verifier(trust=trust, tier="device", state_path=config.state_path)  # reads the anti-rollback state
    if config.password_file:
        read_password_file(config.password_file)
    if config.ca_file or config.cert_file or config.broker.startswith(("mqtts:", "ssl:")):
        try:
            tls_context(ca_file=config.ca_file, cert_file=config.cert_file, key_file=config.key_file)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise ConfigError(f"strata device: the TLS files (ca_file, cert_file, key_file) cannot be used: "
                              f"{shown(str(exc), 160)}; pass PEM files of the broker's CA and this device's "
                              "certificate") from None
    return layout, layered


def _device_config_show(args: argparse.Namespace, checked: tuple[ConfigLayout, Layered[Any]]) -> int:
    from device._config_file import format_layered

    layout, layered = checked
    print(format_layered(layout, layered), end="")
    return 0


def _device_config_check(args: argparse.Namespace, checked: tuple[ConfigLayout, Layered[Any]]) -> int:
    config = checked[1].config
    print(f"{config.device_id}: config valid (fleet {config.fleet}, edge {config.edge_node}, broker {config.broker})")
    return 0


def _device_run_check(args: argparse.Namespace) -> Any:
    """`strata device run`: the config check, and the env the device stands on (made once and closed)."""
    from device._obs_pipeline import make_checked_env

    config = _device_config_checked(args)[1].config
    env: Any = make_checked_env(args.env, command="strata device run", extra="edge")
    env.close()
    return config


def _device_run(args: argparse.Namespace, config: Any) -> int:
    import numpy as np

    from device._bundle import spaces_mismatch
    from device._deps import require
    from device._device_run import Decision, DeviceRunError, DeviceRuntime, run_device

    # The env stands in for the device's sensors; only this command needs gymnasium, so it is imported here.
    gym = require("gymnasium", extra="edge", purpose="the local observation stream of `strata device run`")
    env = gym.make(args.env)
    with DeviceRuntime(config) as runtime:
        bundle = runtime.wait_for_policy(config.policy_wait_s)
        m = bundle.manifest
        mismatch = spaces_mismatch(m, env.observation_space, env.action_space)
        if mismatch is not None:  # the policy arrived over the network; the env is known only here
            raise DeviceRunError(f"strata device run: micro policy {m.policy!r} v{m.version} cannot act on --env "
                                 f"{args.env}: {mismatch}; pass the env it was trained on")
        print(f"strata device run: {config.device_id}: micro policy {m.policy!r} v{m.version} from edge "
              f"{config.edge_node}", flush=True)
        log: list[str] = []

        def record(d: Decision) -> None:
            log.append(json.dumps({"step": len(log), "tier": d.tier, "reason": d.reason,
                                   "confidence": round(d.confidence, 6), "latency_ms": round(d.latency_s * 1e3, 4),
                                   "edge_version": d.edge_version, "action": np.asarray(d.action).tolist()}))

        report = run_device(runtime, env, steps=args.steps, seed=args.seed,
                            on_decision=record if args.decisions_out else None)
    env.close()
    if args.decisions_out is not None:
        _write_text_atomic(args.decisions_out, "".join(line + "\n" for line in log))
    summary = report.summary()
    by = summary["by_tier"]
    print(f"strata device run: {report.steps} decisions: device {by['device']}, edge {by['edge']}, fallback "
          f"{by['device-fallback']} ({summary['escalated_fraction']:.1%} escalated); "
          f"{summary['episodes']} episodes, mean return {summary['mean_return']}")
    print(json.dumps(summary, sort_keys=True))
    return 0


def _write_text_atomic(path: Path, text: str) -> None:
    from device._atomic import write_atomic

    write_atomic(path, text, durable=False)


def _device_export_c_check(args: argparse.Namespace) -> Any:
    """The flags agree, and the bundle is read and verified (or parsed, unverified on request): nothing is written."""
    import sys

    from device._bundle import Bundle, Verifier
    from device._errors import ConfigError
    from device._keys import TrustStore

    if args.trust and args.insecure_skip_verify:
        raise ConfigError("strata device export-c: --trust and --insecure-skip-verify contradict each other; pass "
                          "--trust PUBFILE to verify the bundle (or only --insecure-skip-verify for a local test)")
    if not args.trust and not args.insecure_skip_verify:
        raise ConfigError("strata device export-c: needs --trust PUBFILE, the public key the bundle is signed with "
                          "(nothing is compiled from an unverified bundle); --insecure-skip-verify skips the check "
                          "for local experiments")
    data = _read_bundle(args.bundle)
    if args.insecure_skip_verify:
        bundle = Bundle.from_bytes(data)
        print(f"strata device export-c: WARNING: --insecure-skip-verify: {args.bundle} is NOT verified (signature "
              "and digest unchecked); never ship this C", file=sys.stderr)
        return bundle
    return Verifier(trust=TrustStore.from_paths(args.trust), tier="any").verify(data)


def _device_export_c(args: argparse.Namespace, bundle: Any) -> int:
    from device._export_c import export_c

    discrete = bundle.manifest.action_space.get("type") == "Discrete"
    policy, paths = export_c(bundle.model, args.out, discrete=discrete)
    m = bundle.manifest
    print(f"strata device export-c: {m.policy!r} v{m.version}: {policy.num_weights} float constants, obs dim "
          f"{policy.obs_dim}, {'logits' if discrete else 'action'} dim {policy.out_dim}")
    for path in paths:
        print(f"  wrote {path}")
    print(f"  build: gcc -std=c99 -O2 -o policy {paths[1]} {paths[2]} -lm")
    return 0


def _keys_generate_check(args: argparse.Namespace) -> None:
    from device._bundle_errors import KeyFileError

    for suffix in (".key", ".pub"):
        path = args.out / f"{args.name}{suffix}"
        if path.exists() or path.is_symlink():
            raise KeyFileError(f"strata keys generate: {path} already exists; keys are never overwritten, choose "
                               "another --out folder or --name")


def _keys_generate(args: argparse.Namespace, checked: None) -> int:
    from device._keys import generate_keypair, load_public_key

    key_path, pub_path = generate_keypair(args.out, name=args.name)
    print(f"private key: {key_path} (mode 0600; keep it secret)")
    print(f"public key:  {pub_path}")
    print(f"key id:      {load_public_key(pub_path).key_id}")
    return 0


def _read_bundle(path: Path) -> bytes:
    from device._kinds import BUNDLE

    return BUNDLE.read(path, where="bundle file")


def _bundle_inspect_check(args: argparse.Namespace) -> Any:
    from device._bundle import Bundle

    data = _read_bundle(args.file)
    return data, Bundle.from_bytes(data)


def _bundle_inspect(args: argparse.Namespace, checked: Any) -> int:
    from device._bundle_errors import ModelError
    from device._executor import NumpyExecutor

    data, bundle = checked
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


def _bundle_verify_check(args: argparse.Namespace) -> Any:
    from device._bundle import Verifier
    from device._errors import ConfigError
    from device._keys import TrustStore

    if args.accept and args.state is None:
        raise ConfigError("strata bundle verify: --accept records the version in --state; pass --state FILE too, "
                          "or drop --accept")
    verifier = Verifier(trust=TrustStore.from_paths(args.trust), tier=args.tier, state_path=args.state)
    return verifier, _read_bundle(args.file)


def _bundle_verify(args: argparse.Namespace, checked: Any) -> int:
    verifier, data = checked
    bundle = verifier.verify(data)
    if args.accept:
        verifier.accept(bundle)
    m = bundle.manifest
    note = f"; recorded as highest accepted in {args.state}" if args.accept else ""
    print(f"OK {m.policy} v{m.version} signed by {bundle.key_id}, target tier {m.target_tier}{note}")
    return 0
