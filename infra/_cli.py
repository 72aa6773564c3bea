"""Infra-tier commands: `strata infra plan|apply|destroy|rollback|template`.

AWS credentials and endpoints come from the standard chain (environment, config files, instance role)
and the ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_<SERVICE>`` variables; nothing here reads them.
Flags not given on the command line default to what the stage's last apply recorded. Every command that
talks to AWS first prints one line naming the region it acts in and why (`_region`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

DEFAULT_STATE_DIR = ".strata/infra"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the infra tier's commands to the root parser."""
    from device import add_config_arguments
    from infra._models import DeployConfig
    from infra._readback import register as register_readback

    register_readback()  # `strata functions serve --from-endpoint` reads deployments through infra

    infra = sub.add_parser("infra", help="plan, apply, destroy and roll back the AWS deployment",
                           description="Deploy strata's functions, bucket, role and IoT edge nodes to AWS. "
                           "Credentials and endpoints come from the standard AWS chain and AWS_ENDPOINT_URL*.")
    cmds = infra.add_subparsers(dest="infra_command", metavar="ACTION", required=True)

    def common(p: argparse.ArgumentParser, *, full: bool) -> None:
        p.add_argument("--state-dir", default=DEFAULT_STATE_DIR,
                       help="folder of the stage state files and node credentials (default: %(default)s)")
        if full:
            add_config_arguments(p, DeployConfig)
        else:
            p.add_argument("--stage", required=True, help="stage name")
            p.add_argument("--region", default=None, help="AWS region (default: where the stage is deployed, "
                           "else AWS_REGION / AWS_DEFAULT_REGION / the profile's; printed with the reason)")

    plan = cmds.add_parser("plan", help="print what apply would change (read-only)",
                           description="Compare the desired deployment with the recorded state and the live "
                           "resources and print the diff; drift made outside strata is marked. Reads only: it "
                           "builds no package (apply does) and changes nothing.")
    common(plan, full=True)
    plan.set_defaults(func=_wrapped("plan", _plan))

    apply = cmds.add_parser("apply", help="create or update the stage's resources",
                            description="Build the function packages, plan, and carry the plan out. Idempotent: "
                            "a second apply changes nothing; a failed apply completes when run again.")
    common(apply, full=True)
    apply.add_argument("--dry-run", action="store_true", help="print each step instead of changing AWS")
    apply.add_argument("--yes", action="store_true", help="accepted for symmetry; apply does not ask")
    apply.add_argument("--kits", default=None, type=Path,
                       help="also write a provisioning kit per edge node into KITS/<node>/ (edge.toml for "
                       "mqtts://ENDPOINT:8883, the thing's certificate and key, the Amazon root CA, the trusted key; "
                       "files 0600) for `strata edge install --kit`")
    apply.add_argument("--trust", default=None, type=Path, action="append", metavar="PUBFILE",
                       help="public signing key the nodes trust (strata-signing.pub); needed with --kits; repeat it "
                       "to trust the old and the new key while rotating (a private key is refused)")
    apply.set_defaults(func=_wrapped("apply", _apply))

    destroy = cmds.add_parser("destroy", help="delete every resource of the stage",
                              description="Delete the stage's functions, role, IoT things/certificates/policies "
                              "and its bucket (every object version included). Asks first unless --yes.")
    common(destroy, full=False)
    destroy.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    destroy.add_argument("--dry-run", action="store_true", help="print each step instead of changing AWS")
    destroy.set_defaults(func=_wrapped("destroy", _destroy))

    rollback = cmds.add_parser("rollback", help="move the stage alias back to the previous version",
                               description="Point each function's stage alias at the version it had before the "
                               "last apply. The next apply moves it forward again. Asks first unless --yes.")
    common(rollback, full=False)
    rollback.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    rollback.set_defaults(func=_wrapped("rollback", _rollback))

    tmpl = cmds.add_parser("template", help="write the deployment as a CloudFormation template",
                           description="Write the same deployment as a CloudFormation template (JSON); no AWS "
                           "call. The functions zip is built (or reused from the cache) so each Lambda version in "
                           "the template carries its CodeSha256; --package also writes the zip to upload as "
                           "CodeBucket/CodeKey.")
    add_config_arguments(tmpl, DeployConfig)
    tmpl.add_argument("--out", required=True, help="template file to write")
    tmpl.add_argument("--package", default=None, help="also write the functions zip here")
    tmpl.set_defaults(func=_template)
    _register_k8s(cmds)


def _register_k8s(cmds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`strata infra k8s render`: Kubernetes manifests of a run (no cluster is contacted)."""
    from device import add_config_arguments
    from infra._k8s import K8sConfig

    k8s = cmds.add_parser("k8s", help="Kubernetes manifests of a run: learner, env services, hybrid units",
                          description="Kubernetes manifests for strata (infra/_k8s.py); nothing talks to a cluster.")
    k8s_cmds = k8s.add_subparsers(dest="k8s_command", metavar="ACTION", required=True)
    render = k8s_cmds.add_parser(
        "render", help="write the manifests (a kustomize base and overlays) into a new folder",
        description="Write a kustomize base (namespace, service accounts, the learner with its parameter server, "
        "env services with an autoscaler and a headless Service, hybrid units as a StatefulSet running torchrun, "
        "network policies, optionally a Mosquitto broker) and overlays (the units as a PyTorchJob; cert-manager "
        "Certificates) into --out. Env services prefer the learner's zone, units never share a node. Prints the "
        "`strata certs` line that makes the TLS Secrets' material. See docs/kubernetes.md.")
    render.add_argument("--out", required=True, type=Path, metavar="DIR",
                        help="folder to create (must be new or empty)")
    add_config_arguments(render, K8sConfig)
    render.set_defaults(func=_k8s_render)


def _k8s_render(args: argparse.Namespace) -> int:
    from device import config_from_args
    from infra._k8s import K8sConfig, Names, certs_command, write_manifests

    config = config_from_args(K8sConfig, args)
    written = write_manifests(config, args.out)
    print(f"strata infra k8s render: wrote {len(written)} files into {args.out} (apply with `kubectl apply -k "
          f"{args.out}/base`, or an overlay under {args.out}/overlays)")
    names = Names(config)
    print(f"strata infra k8s render: TLS material: `{certs_command(config)}`, then for each ROLE in learner env"
          f"{' broker' if config.broker else ''}: `kubectl -n {config.namespace} create secret generic "
          f"{names.tls_secret('ROLE')} --type=kubernetes.io/tls --from-file=certs/ROLE/` and `kubectl -n "
          f"{config.namespace} create secret generic {names.token_secret} --from-file=token=certs/token`")
    return 0


@contextlib.contextmanager
def _aws_errors(action: str) -> Iterator[None]:
    """Turn botocore's own errors (no credentials, no endpoint, an unexpected refusal) into one error line."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

    from infra._errors import AwsCallError

    try:
        yield
    except (NoCredentialsError, NoRegionError) as exc:
        raise AwsCallError(f"{action}: {exc}; configure the standard AWS chain (AWS_PROFILE or "
                           "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, and --region or AWS_REGION)") from exc
    except (BotoCoreError, ClientError) as exc:
        raise AwsCallError(f"{action}: {exc}") from exc


def _wrapped(action: str, run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    @functools.wraps(run)
    def call(args: argparse.Namespace) -> int:
        with _aws_errors(action):
            return run(args)

    return call


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    from infra._models import DeployConfig

    given: dict[str, Any] = {}
    for f in dataclasses.fields(DeployConfig):
        value = getattr(args, f.name, None)
        if value is not None:
            given[f.name] = tuple(value) if isinstance(value, list) else value
    if given.get("trusted_public_key"):
        from infra._models import trusted_key_pem

        given["trusted_public_key"] = trusted_key_pem(given["trusted_public_key"])
    return given


def _config(args: argparse.Namespace, verb: str) -> Any:
    """The stage's config (recorded settings, then the flags), in the region `_region` announces."""
    from infra._deploy import recorded_config
    from infra._models import check_stage

    overrides = _overrides(args)
    stage = overrides.pop("stage", None)
    stage = check_stage("dev" if stage is None else stage)  # `--stage ''` is refused, never read as the default
    overrides["region"] = _region(overrides.get("region"), Path(args.state_dir), stage, verb)
    return recorded_config(Path(args.state_dir), stage, **overrides)


def _region(given: str | None, state_dir: Path, stage: str, verb: str) -> str:
    """The region to act in (``--region``, else where the stage is deployed, else the standard chain), announced.

    One line says where and why, e.g. ``infra: deploying stage 'dev' to us-east-1 (no --region, AWS_REGION or
    profile region set)``: strata never picks a region silently.
    """
    from infra._state import StateStore
    from infra.aws import resolve_region

    store = StateStore(state_dir, stage)
    recorded = store.load().region
    if given:
        region, why = given, "--region"
    elif recorded:
        region, why = recorded, f"where the stage's last apply deployed it, recorded in {store.path}"
    else:
        region, why = resolve_region(None)
    print(f"infra: {verb.format(stage=repr(stage))} {region} ({why})", flush=True)
    return region


def _confirm(action: str, stage: str, yes: bool) -> None:
    from infra._errors import InfraError

    if yes:
        return
    if not sys.stdin.isatty():
        raise InfraError(f"{action} --stage {stage}: needs confirmation; pass --yes to run it "
                         "without a terminal")
    answer = input(f"{action} stage {stage!r}? Type the stage name to confirm: ").strip()
    if answer != stage:
        raise InfraError(f"{action}: not confirmed (typed {answer!r}, expected {stage!r}); nothing "
                         "was changed")


def _progress(step: Any) -> None:
    if step.action != "no-op":
        print(f"done: {step.action} {step.kind} {step.name}", flush=True)


def _plan(args: argparse.Namespace) -> int:
    from infra._deploy import plan

    print(plan(_config(args, "planning stage {stage} in"), state_dir=Path(args.state_dir)).render())
    return 0


def _apply(args: argparse.Namespace) -> int:
    from infra._deploy import apply
    from infra._errors import DeployConfigError
    from infra._executor import DryRunExecutor

    config = _config(args, "deploying stage {stage} to")
    if args.kits is not None and (not args.trust or args.dry_run or not config.edge_nodes):
        why = ("needs --trust PUBKEY, the signing key the nodes trust" if not args.trust
               else "writes files, which a --dry-run never does" if args.dry_run
               else "needs edge nodes: pass --edge-nodes n1,n2")
        raise DeployConfigError(f"strata infra apply: --kits {why}")
    if args.kits is not None:  # refuse a private or malformed --trust before anything is deployed
        from device import KeyFileError
        from device._keys import trusted_key_files

        try:
            trusted_key_files(args.trust, what="--trust")
        except KeyFileError as exc:
            raise DeployConfigError(f"strata infra apply --kits: {exc}") from None
    executor = DryRunExecutor(sys.stdout) if args.dry_run else None
    the_plan = apply(config, state_dir=Path(args.state_dir), executor=executor, after_step=_progress,
                     before=lambda p: print(p.render(), flush=True))
    changed = len(the_plan.changes)
    verb = "would change" if args.dry_run else "changed"
    print(f"apply: {verb} {changed} resource(s)" if changed else "apply: nothing to do")
    if args.kits is not None:
        from infra._kits import write_iot_kits

        for kit in write_iot_kits(args.kits, state_dir=Path(args.state_dir), stage=config.stage,
                                  nodes=config.edge_nodes, trust=args.trust):
            print(f"kit for {kit.name}: {kit}/ (edge.toml, certificate, key, Amazon root CA, trusted key)")
    return 0


def _destroy(args: argparse.Namespace) -> int:
    from infra._deploy import destroy, destroy_plan, recorded_config
    from infra._executor import DryRunExecutor

    state_dir = Path(args.state_dir)
    region = _region(args.region, state_dir, args.stage, "destroying stage {stage} in")
    config = recorded_config(state_dir, args.stage, region=region)
    the_plan = destroy_plan(args.stage, state_dir=state_dir, config=config)
    print(the_plan.render())
    if not the_plan.changes:
        print("destroy: nothing to delete")
        if not args.dry_run:
            destroy(args.stage, state_dir=state_dir, config=config)  # forget what is recorded but gone
        return 0
    if not args.dry_run:
        _confirm("destroy", args.stage, args.yes)
    executor = DryRunExecutor(sys.stdout) if args.dry_run else None
    done = destroy(args.stage, state_dir=state_dir, config=config, executor=executor, after_step=_progress)
    verb = "would delete" if args.dry_run else "deleted"
    print(f"destroy: {verb} {len(done.changes)} resource(s)")
    return 0


def _rollback(args: argparse.Namespace) -> int:
    from infra._deploy import rollback, rollback_plan
    from infra.aws import Clients

    state_dir = Path(args.state_dir)
    aws = Clients(region=_region(args.region, state_dir, args.stage, "rolling back stage {stage} in"))
    the_plan = rollback_plan(args.stage, state_dir=state_dir, aws=aws)
    print(the_plan.render())
    _confirm("rollback", args.stage, args.yes)
    rollback(args.stage, state_dir=state_dir, aws=aws, after_step=_progress)
    print("rollback: done; the next `strata infra apply` moves the alias forward again")
    return 0


def _template(args: argparse.Namespace) -> int:
    import tempfile

    from infra._deploy import build_artifacts
    from infra._models import DeployConfig, check_config
    from infra._template import write_template

    overrides = _overrides(args)
    config = check_config(DeployConfig(**overrides))
    # The versions in the template carry the code's CodeSha256, so the package is built (or reused) here.
    with tempfile.TemporaryDirectory() as tmp:
        artifact = next(iter(build_artifacts(config, state_dir=Path(tmp)).values()))
        out = write_template(config, Path(args.out), artifact)
        print(f"template: wrote {out} (code {artifact.sha256_b64}, CodeKey default {artifact.key})")
        if args.package:
            import shutil

            target = Path(args.package)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(artifact.path, target)
            print(f"template: wrote {target} ({artifact.zipped_bytes / 1e6:.1f} MB zipped, "
                  f"{artifact.unzipped_bytes / 1e6:.1f} MB unzipped); upload it and pass CodeBucket/CodeKey")
    return 0
