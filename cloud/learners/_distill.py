"""Micro policies: distil a trained policy into a small network for the device tier, by DAgger-style imitation.

Pipeline of `distill_bundle`:

1. the teacher is an exported bundle (run in onnxruntime; `cloud.runs.distill` exports a run dir first);
2. iteration 0 rolls the teacher out in the simulator and records the states it visits with its outputs
   (logits for Discrete, actions for Box); every later iteration rolls the *student* out and labels the
   states it visits with the teacher's outputs (DAgger: the student learns to recover from its own mistakes),
   and all labelled states are aggregated;
3. after each iteration the student (default one hidden layer of 16, tanh) is fitted by supervised learning:
   soft cross-entropy against the teacher's action probabilities (Discrete) or mean squared error against
   its actions (Box);
4. the student is exported with the same graph contract as every strata policy (`cloud.learners._onnx`: input
   ``"obs"``, outputs ``"action"`` and ``"logits"``, the teacher's observation normalisation inside the graph),
   checked, optionally stored with fp16/int8 weights when that makes it smaller (`device.smallest_storage`; the
   log says when the asked storage was not used), and signed as a
   ``target_tier="device"`` bundle whose manifest ``preprocessing["state_region"]`` records the region of the
   aggregated training states (`device.StateRegion`: mean and whitening matrix), from which a device gives a Box
   micro policy its confidence (an observation far outside it is escalated);
5. student and teacher are evaluated on the same seeded episodes; `DistillResult.kept` is the fraction of the
   teacher's mean return the student keeps (the student runs in `device.NumpyExecutor`, as on a device).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from cloud._errors import CloudError
from cloud.rollout._envs import episode_returns
from device import Bundle, ConfigError, SigningKey, StateRegion, build_bundle, require, smallest_storage

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch


class DistillError(CloudError):
    """The teacher cannot be distilled (unsupported spaces, a bundle without the graph contract)."""


@dataclass(frozen=True, kw_only=True)
class DistillConfig:
    """How a micro policy is distilled from its teacher."""

    # Student network
    hidden_sizes: tuple[int, ...] = (16,)
    """Hidden layer widths of the student MLP."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden activation of the student (both are supported by the C exporter)."""
    weights: Literal["fp32", "fp16", "int8"] = "fp32"
    """Weight storage of the exported micro policy (see `device.quantize_model`)."""

    # DAgger
    iterations: int = 4
    """Data-collection iterations: the first rolls out the teacher, the rest the student."""
    steps_per_iteration: int = 2000
    """Env steps collected (and labelled by the teacher) per iteration."""
    epochs: int = 20
    """Passes over the aggregated data after each iteration."""
    batch_size: int = 256
    """Minibatch size of the supervised fit."""
    learning_rate: float = 3e-3
    """Adam learning rate."""

    # Evaluation
    eval_episodes: int = 10
    """Episodes (same seeds for teacher and student) over which the kept return is measured."""
    seed: int = 0
    """Seeds torch, the rollouts and the evaluation episodes."""

    def __post_init__(self) -> None:
        for name in ("iterations", "steps_per_iteration", "epochs", "batch_size", "eval_episodes"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"DistillConfig: {name} must be >= 1, got {getattr(self, name)}")
        if not self.hidden_sizes or any(int(h) < 1 for h in self.hidden_sizes):
            raise ConfigError(f"DistillConfig: hidden_sizes must be positive widths, got {self.hidden_sizes}")
        if self.activation not in ("tanh", "relu"):
            raise ConfigError(f"DistillConfig: activation must be 'tanh' or 'relu', got {self.activation!r}")
        if self.weights not in ("fp32", "fp16", "int8"):
            raise ConfigError(f"DistillConfig: weights must be 'fp32', 'fp16' or 'int8', got {self.weights!r}")


@dataclass(frozen=True)
class DistillResult:
    """A distilled micro policy and what it keeps of its teacher."""

    bundle: Bundle
    teacher_return: float
    """Teacher's mean return over the evaluation episodes."""
    student_return: float
    """Student's mean return (NumpyExecutor on the exported model) over the same episodes."""
    kept: float
    """``student_return / teacher_return`` (for negative returns, ``teacher_return / student_return``)."""
    samples: int
    """Labelled states the student was fitted on."""
    wall_s: float
    teacher_params: int
    """Weights of the teacher's model (initializer elements)."""
    student_params: int
    """Weights of the student's model."""


class _OrtTeacher:
    """A bundle's model in onnxruntime: raw outputs for a batch of observations."""

    def __init__(self, bundle: Bundle) -> None:
        ort = require("onnxruntime", extra="cloud", purpose="running the teacher policy")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(bundle.model, options, providers=["CPUExecutionProvider"])
        self.discrete = bundle.manifest.action_space["type"] == "Discrete"
        names = [o.name for o in self.session.get_outputs()]
        need = "logits" if self.discrete else "action"
        if need not in names or [i.name for i in self.session.get_inputs()] != ["obs"]:
            raise DistillError(f"distill: the teacher bundle {bundle.manifest.policy!r} v{bundle.manifest.version} "
                               f"has outputs {names}; the graph contract needs input 'obs' and output {need!r}")
        self.output = need

    def labels(self, obs: np.ndarray) -> np.ndarray:
        """Logits (Discrete) or actions (Box) for ``obs [batch, *shape]``."""
        out: np.ndarray = self.session.run([self.output], {"obs": obs.astype(np.float32)})[0]
        return out


def _param_count(model: bytes) -> int:
    from device._onnx_proto import parse_model

    return int(sum(a.size for a in parse_model(model).graph.initializers.values()))


def _normalizer_state(bundle: Bundle, obs: np.ndarray) -> dict[str, Any]:
    """The teacher's in-graph normalisation when its manifest records it, else statistics of `obs`."""
    import torch

    norm = bundle.manifest.preprocessing.get("obs_normalization") if bundle.manifest.preprocessing else None
    if isinstance(norm, dict) and norm.get("enabled"):
        mean, var = np.asarray(norm["mean"], np.float64), np.asarray(norm["var"], np.float64)
        clip, eps = float(norm["clip"]), float(norm["epsilon"])
    else:
        flat = obs.reshape(len(obs), -1).astype(np.float64)
        mean, var, clip, eps = flat.mean(0), flat.var(0) + 1e-6, 10.0, 1e-8
    return {"enabled": True, "clip": clip, "epsilon": eps, "mean": torch.from_numpy(mean),
            "var": torch.from_numpy(var)}


def _rollout(env: Any, act: Callable[[np.ndarray], Any], steps: int, seed: int) -> np.ndarray:
    """States visited by `act` over `steps` env steps (episodes restart as they end)."""
    out = []
    obs, _ = env.reset(seed=seed)
    episode = 0
    for _ in range(steps):
        out.append(np.asarray(obs, dtype=np.float32))
        obs, _r, terminated, truncated, _ = env.step(act(np.asarray(obs, dtype=np.float32)))
        if terminated or truncated:
            episode += 1
            obs, _ = env.reset(seed=seed + episode)
    return np.stack(out)


def _evaluate(env: Any, act: Callable[[np.ndarray], Any], episodes: int, seed: int) -> float:
    return float(np.mean(episode_returns(env, act, episodes=episodes, seed=seed)))


def _student(obs_dim: int, out_dim: int, config: DistillConfig) -> torch.nn.Sequential:
    from torch import nn

    act: type[nn.Module] = nn.Tanh if config.activation == "tanh" else nn.ReLU
    layers: list[nn.Module] = []
    width = obs_dim
    for hidden in config.hidden_sizes:
        layers += [nn.Linear(width, int(hidden)), act()]
        width = int(hidden)
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)


def distill_bundle(teacher: Bundle, *, env_id: str | None = None, signing_key: SigningKey,
                   config: DistillConfig | None = None, policy: str | None = None, version: int | None = None,
                   ttl_s: float | None = None, log: Callable[[str], None] | None = None) -> DistillResult:
    """Distil `teacher` into a micro policy and sign it as a device-tier bundle (see the module docstring).

    Args:
        teacher: An exported, verified `Bundle` (`cloud.runs.distill` also takes a ``.bundle`` file or a run dir).
        env_id: The gymnasium env the teacher acts in (states are collected there); None takes the
            ``env_id`` the exporter records in the teacher's producer.
        signing_key: Signs the micro bundle.
        config: Distillation settings.
        policy: Bundle policy name; default ``{teacher policy}-micro``.
        version: Bundle version; default the teacher's version (one micro policy per teacher version).
        ttl_s: Seconds until the micro bundle expires, or None.
        log: Called with one progress line per iteration.
    """
    import torch

    from cloud.learners._onnx import build_policy_graph, export_onnx, verify_onnx
    from device import NumpyExecutor

    config = config or DistillConfig()
    gym = require("gymnasium", extra="cloud", purpose="collecting states for distillation")
    start = time.perf_counter()
    teacher_bundle = teacher
    m = teacher_bundle.manifest
    env_id = _check_teacher(m, env_id)
    obs_space, action_space = m.observation_space, m.action_space
    discrete = action_space["type"] == "Discrete"
    obs_shape = tuple(int(d) for d in obs_space["shape"])
    obs_dim = int(np.prod(obs_shape))
    out_dim = int(action_space["n"]) if discrete else int(np.prod(action_space["shape"]))
    oracle = _OrtTeacher(teacher_bundle)

    torch.manual_seed(config.seed)
    env = gym.make(env_id)

    def teacher_act(obs: np.ndarray) -> Any:
        out = oracle.labels(obs[None])[0]
        return int(np.argmax(out)) if discrete else out

    states = [_rollout(env, teacher_act, config.steps_per_iteration, config.seed)]
    normalizer = _normalizer_state(teacher_bundle, states[0])
    net = _student(obs_dim, out_dim, config)
    graph = build_policy_graph(SimpleNamespace(actor=net), normalizer_state=normalizer,  # type: ignore[arg-type]
                               action_space=action_space)
    optimizer = torch.optim.Adam(net.parameters(), lr=config.learning_rate)
    generator = torch.Generator().manual_seed(config.seed)

    def student_act(obs: np.ndarray) -> Any:
        with torch.no_grad():
            out = graph(torch.from_numpy(obs[None]))
        return int(out[0][0]) if discrete else out[0].numpy()

    labels: list[np.ndarray] = []
    for iteration in range(config.iterations):
        if iteration > 0:
            states.append(_rollout(env, student_act, config.steps_per_iteration, config.seed + 1000 * iteration))
        labels.append(oracle.labels(states[-1].reshape(len(states[-1]), *obs_shape)))
        loss = _fit(net, graph, optimizer, generator, np.concatenate(states), np.concatenate(labels), config,
                    discrete=discrete)
        if log is not None:
            log(f"distill: iteration {iteration + 1}/{config.iterations}: {sum(len(x) for x in states):,} labelled "
                f"states, loss {loss:.4f}")

    net.eval()
    region = StateRegion.fit(np.concatenate(states))
    model = export_onnx(graph, obs_shape=obs_shape, action_space=action_space)
    verify_onnx(model, graph, obs_space=obs_space, action_space=action_space)
    model, weights, note = smallest_storage(model, config.weights)  # quantised only when it saves bytes
    if note is not None and log is not None:
        log(f"distill: {note}")
    executor = NumpyExecutor(model)

    def micro_act(obs: np.ndarray) -> Any:
        action = executor.act(obs[None])
        return int(action[0]) if discrete else action[0]

    eval_seed = config.seed + 10_000
    teacher_return = _evaluate(env, teacher_act, config.eval_episodes, eval_seed)
    student_return = _evaluate(env, micro_act, config.eval_episodes, eval_seed)
    env.close()
    kept = _kept(teacher_return, student_return)
    bundle = _micro_bundle(model, m, env_id=env_id, region=region, config=config, weights=weights,
                           returns=(teacher_return, student_return), signing_key=signing_key, policy=policy,
                           version=version, ttl_s=ttl_s)
    return DistillResult(bundle=bundle, teacher_return=teacher_return, student_return=student_return, kept=kept,
                         samples=int(sum(len(s) for s in states)), wall_s=time.perf_counter() - start,
                         teacher_params=_param_count(teacher_bundle.model), student_params=_param_count(model))


def _check_teacher(m: Any, env_id: str | None) -> str:
    """The env the teacher acts in; refuse a teacher whose spaces a micro policy cannot take."""
    env_id = env_id or m.producer.get("env_id")
    if not env_id:
        raise ConfigError(f"distill: teacher {m.policy!r} v{m.version} does not record its env id; pass env_id "
                          "(the gymnasium env to collect states in)")
    obs_type, action_type = m.observation_space.get("type"), m.action_space.get("type")
    if obs_type != "Box" or action_type not in ("Discrete", "Box"):
        raise DistillError(f"distill: teacher {m.policy!r} has observation space {obs_type} and action space "
                           f"{action_type}; micro policies need a Box observation and a Discrete or Box action")
    return str(env_id)


def _fit(net: Any, graph: Any, optimizer: Any, generator: Any, states: np.ndarray, labels: np.ndarray,
         config: DistillConfig, *, discrete: bool) -> float:
    """`config.epochs` of supervised learning on every labelled state so far; the last minibatch's loss.

    Soft cross-entropy against the teacher's action probabilities (Discrete), or the mean squared error of the
    clipped action against the teacher's (Box).
    """
    import torch

    x_all = torch.from_numpy(states)
    y_all = torch.from_numpy(labels.astype(np.float32))
    target = torch.softmax(y_all, dim=-1) if discrete else y_all
    for _ in range(config.epochs):
        order = torch.randperm(len(x_all), generator=generator)
        for i in range(0, len(order), config.batch_size):
            idx = order[i:i + config.batch_size]
            out = net(_normalise(graph, x_all[idx]))
            if discrete:
                loss = -(target[idx] * torch.log_softmax(out, dim=-1)).sum(-1).mean()
            else:
                low, high = graph.action_low, graph.action_high
                loss = ((torch.minimum(torch.maximum(out, low), high) - target[idx]) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
    return float(loss.detach())


def _kept(teacher_return: float, student_return: float) -> float:
    """The fraction of the teacher's return the student keeps (for negative returns: the ratio the other way)."""
    if teacher_return > 0:
        return student_return / teacher_return
    if student_return < 0:
        return teacher_return / student_return
    return float(student_return >= teacher_return)


def _micro_bundle(model: bytes, m: Any, *, env_id: str, region: StateRegion, config: DistillConfig, weights: str,
                  returns: tuple[float, float], signing_key: SigningKey, policy: str | None, version: int | None,
                  ttl_s: float | None) -> Bundle:
    """Sign the student as a device-tier bundle: the teacher's preprocessing, the state region, the provenance."""
    import torch

    from cloud.learners._onnx import output_names

    teacher_return, student_return = returns
    action_space = m.action_space
    return build_bundle(
        model, policy=policy or f"{m.policy}-micro", version=version or m.version, parent_version=None,
        observation_space=m.observation_space, action_space=action_space,
        preprocessing={**(m.preprocessing or {}), "in_graph": True, "distilled_from": m.policy,
                       StateRegion.KEY: region.to_manifest()},
        signing_key=signing_key, target_tier="device", ttl_s=ttl_s,
        producer={"algo": "distill", "torch": torch.__version__, "teacher_policy": m.policy,
                  "teacher_version": str(m.version), "teacher_sha256": m.model_sha256, "env_id": env_id,
                  "student": f"{'x'.join(str(h) for h in config.hidden_sizes)} {config.activation}",
                  "weights": weights, "teacher_return": f"{teacher_return:.2f}",
                  "student_return": f"{student_return:.2f}"},
        output_names=output_names(action_space),
    )


def _normalise(graph: Any, obs: torch.Tensor) -> torch.Tensor:
    """What `cloud.learners._onnx.build_policy_graph` applies before the actor (kept identical to it)."""
    import torch

    if not graph.normalize:
        return obs
    out: torch.Tensor = torch.clamp((obs - graph.obs_mean) * graph.obs_inv_std, -graph.obs_clip, graph.obs_clip)
    return out
