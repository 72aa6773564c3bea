"""The exporter of a run: a checkpoint -> a verified ONNX policy graph -> a signed policy bundle (or a micro one).

Pipeline of `export_run`: load the newest (or a chosen) checkpoint of a run dir; rebuild the learner's
deterministic policy from it (`policy_graph`: PPO's actor with observation normalisation and action
post-processing inside the graph, or SAC's ``tanh(mean)`` scaled to the bounds); export and verify it against
torch in onnxruntime (`cloud.learners._onnx`); sign it with `device.build_bundle`, versioned by the checkpoint
and parented by the next older one. `distill` and `export_micro` make a device-tier micro policy from a run or a
bundle (`cloud.learners._distill`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cloud.learners._distill import DistillConfig, DistillResult, distill_bundle
from cloud.learners._onnx import OPSET, build_policy_graph, export_onnx, output_names, verify_onnx
from cloud.runs._checkpoint import checkpoint_path, list_checkpoints, load_checkpoint, load_latest_checkpoint
from device import Bundle, ConfigError, SigningKey, build_bundle, write_atomic


@dataclass(frozen=True)
class ExportResult:
    """A bundle made by `export_run` and what was checked on the way."""

    bundle: Bundle
    checkpoint: Path
    max_abs_diff: dict[str, float]
    """Largest torch-vs-onnxruntime difference per output over the checked batches."""


def default_policy_name(env_id: str) -> str:
    """A bundle policy name for an env id: characters outside ``[A-Za-z0-9._-]`` become ``-``."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", env_id).lstrip(".-") or "policy"


def policy_graph(state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The deterministic policy module of a checkpoint's `state`, and the manifest's ``preprocessing`` for it."""
    if state.get("algo") == "sac":
        from cloud.learners._sac import sac_policy_graph, sac_preprocessing

        return sac_policy_graph(state), sac_preprocessing(state["action_space"])
    from cloud.learners._cnn import make_agent
    from cloud.learners._ppo_config import PPOConfig

    config = PPOConfig.from_dict(state["config"])
    obs_space, action_space = state["observation_space"], state["action_space"]
    discrete = action_space["type"] == "Discrete"
    agent = make_agent(tuple(int(d) for d in obs_space["shape"]), obs_space.get("dtype", "float32"),
                       action_dim=int(action_space["n"]) if discrete else int(np.prod(action_space["shape"])),
                       discrete=discrete, config=config)
    agent.load_state_dict(state["agent"])  # the graph holds the mean only: gSDE's noise is for training
    normalizer = state["normalizer"]
    preprocessing: dict[str, Any] = {
        "in_graph": True,
        # the observation pipeline the policy was trained through: the edge makes its simulators with it
        "pipeline": config.pipeline.to_json(),
        "obs_normalization": {"enabled": bool(normalizer["enabled"]), "clip": float(normalizer["clip"]),
                              "epsilon": float(normalizer["epsilon"]),
                              "mean": [float(v) for v in normalizer["mean"].reshape(-1).tolist()],
                              "var": [float(v) for v in normalizer["var"].reshape(-1).tolist()]},
        "action": "argmax" if discrete else "clipped_mean",
    }
    if len(obs_space["shape"]) > 1:  # image frames: the CNN scales pixels in its graph; no statistics travel
        preprocessing["obs_normalization"] = {"enabled": False, "pixels": "x / 255 in the graph"}
    return build_policy_graph(agent, normalizer_state=normalizer, action_space=action_space), preprocessing


def export_run(run_dir: Path, *, signing_key: SigningKey, version: int | None = None, policy: str | None = None,
               target_tier: Literal["edge", "device", "any"] = "any", ttl_s: float | None = None) -> ExportResult:
    """Export a checkpoint of `run_dir` (PPO or SAC) as a signed, verified policy bundle.

    Args:
        run_dir: A run dir written by `strata train`.
        signing_key: Signs the bundle.
        version: Policy version (checkpoint) to export; None for the newest.
        policy: Bundle policy name; None derives it from the env id (``CartPole-v1``).
        target_tier: Where the bundle may run: ``"edge"``, ``"device"`` or ``"any"``.
        ttl_s: Seconds until the bundle expires, or None.

    The bundle's version is the checkpoint's policy version (completed updates; a SAC run's env steps); its parent
    version is the next older checkpoint of the run, or None for the first.
    """
    import onnx
    import torch

    run_dir = Path(run_dir)
    state = _checkpoint_state(run_dir, version)
    graph, preprocessing = policy_graph(state)
    obs_space, action_space = state["observation_space"], state["action_space"]
    model = export_onnx(graph, obs_shape=tuple(int(d) for d in obs_space["shape"]), action_space=action_space)
    max_abs_diff = verify_onnx(model, graph, obs_space=obs_space, action_space=action_space)
    policy_version = int(state["version"])
    older = [int(p.stem) for p in list_checkpoints(run_dir) if int(p.stem) < policy_version]
    bundle = build_bundle(
        model, policy=policy or default_policy_name(state["env_id"]), version=max(policy_version, 1),
        parent_version=max(older) if older else None, observation_space=obs_space, action_space=action_space,
        preprocessing=preprocessing, signing_key=signing_key, target_tier=target_tier, ttl_s=ttl_s,
        producer={"torch": torch.__version__, "onnx": onnx.__version__, "algo": state.get("algo", "ppo"),
                  "env_id": state["env_id"], "exporter": f"torch.onnx.export(dynamo=False, opset_version={OPSET})",
                  "global_step": str(state["global_step"])},
        output_names=output_names(action_space),
    )
    return ExportResult(bundle=bundle, checkpoint=checkpoint_path(run_dir, policy_version), max_abs_diff=max_abs_diff)


def _checkpoint_state(run_dir: Path, version: int | None) -> dict[str, Any]:
    """The newest checkpoint's state, or that of `version`."""
    if version is None:
        return load_latest_checkpoint(run_dir, caller="export_run")
    path = checkpoint_path(run_dir, version)
    if not path.exists():
        have = [int(p.stem) for p in list_checkpoints(run_dir)]
        raise ConfigError(f"export_run: run dir {str(run_dir)!r} has no checkpoint of version {version}; "
                          f"it has {have}")
    return load_checkpoint(path)


def write_bundle(path: Path, bundle: Bundle) -> None:
    """Write `bundle` to `path` atomically (a temp file in the same folder, then a rename)."""
    write_atomic(path, bundle.to_bytes())


def distill(teacher: Bundle | Path, *, env_id: str | None = None, signing_key: SigningKey,
            config: DistillConfig | None = None, policy: str | None = None, version: int | None = None,
            ttl_s: float | None = None, log: Callable[[str], None] | None = None) -> DistillResult:
    """Distil `teacher` into a micro policy and sign it as a device-tier bundle (`cloud.learners._distill`).

    Args:
        teacher: An exported `Bundle`, a ``.bundle`` file, or a run dir written by `strata train` (exported first).
        env_id: The gymnasium env the teacher acts in; None takes the one its bundle records.
        signing_key: Signs the micro bundle.
        config: Distillation settings.
        policy: Bundle policy name; default ``{teacher policy}-micro``.
        version: Bundle version; default the teacher's version (one micro policy per teacher version).
        ttl_s: Seconds until the micro bundle expires, or None.
        log: Called with one progress line per iteration.
    """
    return distill_bundle(_teacher_bundle(teacher, signing_key), env_id=env_id, signing_key=signing_key,
                          config=config, policy=policy, version=version, ttl_s=ttl_s, log=log)


def _teacher_bundle(teacher: Bundle | Path, signing_key: SigningKey) -> Bundle:
    if isinstance(teacher, Bundle):
        return teacher
    path = Path(teacher)
    if path.is_dir():
        return export_run(path, signing_key=signing_key).bundle
    try:
        return Bundle.from_bytes(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"distill: cannot read the teacher {str(path)!r}: {exc.strerror or exc}; pass a run dir "
                          "or a .bundle file") from None


def export_micro(args: Any, signing_key: SigningKey) -> int:
    """`strata export --tier device`: distil the run's policy into a signed micro bundle and report what it keeps."""
    teacher = export_run(Path(args.run), signing_key=signing_key, version=args.version).bundle
    config = DistillConfig(weights=args.weights, steps_per_iteration=args.distill_steps)
    result = distill_bundle(teacher, signing_key=signing_key, config=config, policy=args.policy, ttl_s=args.ttl_s,
                            log=lambda line: print(f"strata export: {line}", flush=True))
    write_bundle(Path(args.out), result.bundle)
    m = result.bundle.manifest
    print(f"strata export: wrote {args.out}: micro policy {m.policy!r} version {m.version}, tier device, "
          f"{result.student_params:,} weights (teacher {result.teacher_params:,}), "
          f"{m.producer.get('weights', args.weights)}, model "
          f"{len(result.bundle.model):,} B; return {result.student_return:.1f} vs teacher {result.teacher_return:.1f} "
          f"({result.kept:.1%} kept)")
    return 0
