"""Running a verified bundle with onnxruntime, and the health check every new policy passes before use.

`OnnxPolicy` wraps one onnxruntime session (one intra-op thread: an edge node runs many small things).
`check_policy` is the health check of the A/B cache: within a deadline the new policy must load, its graph and
manifest must match the local simulator's spaces, its outputs must be finite and valid actions, its p99
latency must be within budget, and, optionally, it must reach a minimum return on the simulator.
`HealthChecker` runs the same check for many bundles against one simulator, read once (what an agent keeps).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from device import Bundle, ConfigError, ObsPipeline, require, space_to_json
from edge._errors import EdgeConfigError


class OnnxPolicy:
    """One bundle's model in an onnxruntime session; `act` maps one observation to one env action."""

    def __init__(self, bundle: Bundle) -> None:
        ort = require("onnxruntime", extra="edge", purpose="running policies at the edge")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only: onnxruntime warns on stderr about harmless graph clean-ups
        self.bundle = bundle
        self.policy = bundle.manifest.policy
        self.version = bundle.manifest.version
        self.created_at = bundle.manifest.created_at
        self.session = ort.InferenceSession(bundle.model, options, providers=["CPUExecutionProvider"])
        self.input_name = bundle.manifest.input_name
        self.output_name = bundle.manifest.output_names[0]
        self._outputs = [self.output_name]
        self.discrete = bundle.manifest.action_space.get("type") == "Discrete"
        names = {o.name for o in self.session.get_outputs()}
        self._logits = "logits" in names and self.discrete
        self._bounds: tuple[np.ndarray, np.ndarray] | None = None

    def run(self, obs_batch: np.ndarray) -> np.ndarray:
        """Raw graph output ``action`` for a batch of observations."""
        out: np.ndarray = self.session.run(self._outputs, {self.input_name: obs_batch})[0]
        return out

    def act(self, obs: np.ndarray) -> Any:
        """The env action for one observation: an int for Discrete, a float32 array for Box."""
        out = self.session.run(self._outputs, {self.input_name: obs.reshape(1, *obs.shape)})[0]
        return int(out[0]) if self.discrete else out[0]

    def logits(self, obs: np.ndarray) -> np.ndarray | None:
        """The ``logits`` output for one observation (Discrete bundles that have it), else None."""
        if not self._logits:
            return None
        out: np.ndarray = self.session.run(["logits"], {self.input_name: obs.reshape(1, *obs.shape)})[0]
        return np.asarray(out[0])

    @property
    def action_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """``(low, high)`` of a Box action space (float64, shaped like an action)."""
        if self._bounds is None:
            from device import space_bounds

            self._bounds = space_bounds(self.bundle.manifest.action_space)
        return self._bounds


@dataclass(frozen=True, kw_only=True)
class HealthConfig:
    """What a new policy must show before it replaces the running one."""

    deadline_s: float = 10.0
    """The whole check must finish within this many seconds, else the policy fails."""
    probe_calls: int = 16
    """Single-observation inferences timed for the latency check (their p99 is in effect their maximum
    from about 10 calls on, so more calls add time, not strictness)."""
    latency_budget_ms: float = 20.0
    """p99 latency of one inference must stay within this (loose: shared machines stall)."""
    min_return: float | None = None
    """When set, the mean return over `episodes` simulator episodes must reach it."""
    episodes: int = 1
    """Simulator episodes for the `min_return` check."""
    max_episode_steps: int = 2000
    """Step cap per health-check episode."""
    pipeline: dict[str, Any] | None = None
    """The observation pipeline the simulator is made with (`device.ObsPipeline.to_json`); when set, a bundle
    whose manifest records another one (another frame stack or lossy codec) fails. None: not checked."""

    def __post_init__(self) -> None:
        if self.deadline_s <= 0 or self.probe_calls < 1 or self.latency_budget_ms <= 0 or self.episodes < 1:
            raise EdgeConfigError(f"HealthConfig: deadline_s={self.deadline_s}, probe_calls={self.probe_calls}, "
                                  f"latency_budget_ms={self.latency_budget_ms} and episodes={self.episodes} "
                                  "must all be positive")


@dataclass(frozen=True)
class HealthReport:
    """Outcome of `check_policy`: `ok`, or the first `reason` it failed."""

    ok: bool
    reason: str
    latency_p99_us: float | None = None
    mean_return: float | None = None
    seconds: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    """Seconds each stage took: ``load``, ``spaces``, ``outputs``, ``latency`` and, when checked, ``return``."""


class _Failed(Exception):
    pass


def _percentile(values: list[float], q: float) -> float:
    """``np.percentile(values, q)`` (linear interpolation) without numpy's overhead on a few values."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _space_problem(manifest_space: dict[str, Any], env_json: dict[str, Any] | str) -> str | None:
    if isinstance(env_json, str):  # the simulator's space has no bundle form
        return env_json
    if manifest_space.get("type") != env_json["type"]:
        return f"space type {manifest_space.get('type')} does not match the simulator's {env_json['type']}"
    key = "n" if env_json["type"] == "Discrete" else "shape"
    if manifest_space.get(key) != env_json[key]:
        return f"space {key} {manifest_space.get(key)} does not match the simulator's {env_json[key]}"
    return None


def _pipeline_problem(trained: Any, node: dict[str, Any]) -> str | None:
    """Why a policy trained through pipeline `trained` (a manifest's, None: the plain env) cannot act here."""
    try:
        want = ObsPipeline.from_json(trained if isinstance(trained, dict) else None)
    except ConfigError as exc:
        return f"the manifest's observation pipeline is malformed: {exc}"
    have = ObsPipeline.from_json(node)

    def seen(p: ObsPipeline) -> tuple[int, str | None]:  # what the policy sees (a lossless codec changes no pixel)
        return p.frame_stack, p.codec.spec if p.codec.lossy else None

    if seen(want) == seen(have):
        return None
    return (f"the policy was trained on observations through frame stack {want.frame_stack} and codec "
            f"{want.obs_codec}; this node makes frame stack {have.frame_stack} and codec {have.obs_codec}: start "
            f"the agent with --frame-stack {want.frame_stack} --obs-codec {want.obs_codec}")


def _space_json(env_space: Any) -> dict[str, Any] | str:
    try:
        return space_to_json(env_space)
    except ValueError as exc:
        return f"the simulator's space {env_space} has no bundle form ({exc})"


@dataclass(frozen=True)
class _Simulator:
    """What the health check needs to know about the local simulator; the same for every bundle."""

    observation_json: dict[str, Any] | str
    action_json: dict[str, Any] | str
    observation_shape: list[int]
    action_space: Any
    probe: np.ndarray
    """8 observations sampled from the observation space (seed 0), float32."""
    first_obs: np.ndarray
    """The observation of ``reset(seed=0)``, float32."""


class HealthChecker:
    """The health check (see `check_policy`) bound to one simulator, for a node that checks many bundles.

    The simulator's spaces, 8 probe observations sampled from its observation space (seed 0) and its first
    observation after ``reset(seed=0)`` do not depend on the bundle: they are read from one env, once, on
    the first check, instead of making an env per bundle. Every bundle still passes every check against
    them; an env is made per bundle only for the `min_return` episodes.

    Args:
        make_env: Makes the local simulator (a gymnasium env).
        config: What a new policy must show.
    """

    def __init__(self, make_env: Callable[[], Any], config: HealthConfig) -> None:
        self.make_env = make_env
        self.config = config
        self._simulator: _Simulator | None = None

    def prepare(self) -> None:
        """Read the simulator now (an env is made and closed), so the first check does not have to."""
        self._read_simulator()

    def _read_simulator(self) -> _Simulator:
        if self._simulator is None:
            env = self.make_env()
            try:
                env.observation_space.seed(0)
                probe = np.stack([np.asarray(env.observation_space.sample(), dtype=np.float32) for _ in range(8)])
                obs, _ = env.reset(seed=0)
                self._simulator = _Simulator(
                    observation_json=_space_json(env.observation_space), action_json=_space_json(env.action_space),
                    observation_shape=list(env.observation_space.shape), action_space=env.action_space,
                    probe=probe, first_obs=np.asarray(obs, dtype=np.float32))
            finally:
                env.close()
        return self._simulator

    def check(self, bundle: Bundle, *, clock: Callable[[], float] = time.perf_counter
              ) -> tuple[OnnxPolicy | None, HealthReport]:
        """Run the health check; return the loaded policy (None when it failed) and the report."""
        config = self.config
        started = clock()
        stages: dict[str, float] = {}
        mark = [time.perf_counter()]

        def stage(name: str) -> None:
            now = time.perf_counter()
            stages[name] = now - mark[0]
            mark[0] = now

        def left(step: str) -> None:
            if clock() - started > config.deadline_s:
                raise _Failed(f"deadline of {config.deadline_s}s passed during {step}")

        p99: float | None = None
        mean_return: float | None = None
        try:
            m = bundle.manifest
            try:
                policy = OnnxPolicy(bundle)
            except Exception as exc:  # onnxruntime raises its own untyped errors on a bad graph
                raise _Failed(f"onnxruntime cannot load the model: {type(exc).__name__}: {exc}") from None
            stage("load")
            left("loading")
            if config.pipeline is not None:
                problem = _pipeline_problem(m.preprocessing.get("pipeline"), config.pipeline)
                if problem:
                    raise _Failed(problem)
            sim = self._read_simulator()
            for name, manifest_space, env_json in (("observation", m.observation_space, sim.observation_json),
                                                   ("action", m.action_space, sim.action_json)):
                problem = _space_problem(manifest_space, env_json)
                if problem:
                    raise _Failed(f"{name} {problem}")
            inputs = {i.name: i for i in policy.session.get_inputs()}
            if policy.input_name not in inputs:
                raise _Failed(f"the graph has no input {policy.input_name!r} (inputs: {sorted(inputs)})")
            graph_shape = list(inputs[policy.input_name].shape)[1:]
            obs_shape = sim.observation_shape
            if len(graph_shape) != len(obs_shape) or any(isinstance(g, int) and g != o
                                                         for g, o in zip(graph_shape, obs_shape, strict=False)):
                raise _Failed(f"graph input shape {graph_shape} does not match observations of shape {obs_shape}")
            outputs = [o.name for o in policy.session.get_outputs()]
            if policy.output_name not in outputs:
                raise _Failed(f"the graph has no output {policy.output_name!r} (outputs: {outputs})")
            stage("spaces")
            probe = sim.probe
            try:
                every_output = policy.session.run(None, {policy.input_name: probe})
            except Exception as exc:  # shape or type errors inside the graph surface here
                raise _Failed(f"inference failed: {type(exc).__name__}: {exc}") from None
            for name, value in zip(outputs, every_output, strict=True):
                if np.asarray(value).dtype.kind == "f" and not np.all(np.isfinite(value)):
                    raise _Failed(f"output {name!r} is not finite")
            actions = np.asarray(every_output[outputs.index(policy.output_name)])
            if actions.shape[:1] != (len(probe),):
                raise _Failed(f"output {policy.output_name!r} has shape {list(actions.shape)} for a batch of "
                              f"{len(probe)}")
            if not np.all(np.isfinite(actions.astype(np.float64))):
                raise _Failed(f"output {policy.output_name!r} is not finite")
            if policy.discrete and not all(sim.action_space.contains(int(a)) for a in actions):
                raise _Failed(f"actions {actions.tolist()} are not in the simulator's action space")
            stage("outputs")
            left("the output check")
            times = []
            obs = sim.first_obs
            for _ in range(config.probe_calls):
                t0 = time.perf_counter()
                policy.act(obs)
                times.append(time.perf_counter() - t0)
            p99 = _percentile(times, 99.0) * 1e6
            if p99 > config.latency_budget_ms * 1000:
                raise _Failed(f"p99 latency {p99 / 1000:.2f} ms exceeds the budget of {config.latency_budget_ms} ms")
            stage("latency")
            left("the latency check")
            if config.min_return is not None:
                mean_return = self._mean_return(policy, left)
                if mean_return < config.min_return:
                    raise _Failed(f"mean return {mean_return:.2f} over {config.episodes} episodes is below "
                                  f"the minimum {config.min_return}")
                stage("return")
            return policy, HealthReport(True, "ok", p99, mean_return, clock() - started, stages)
        except _Failed as failed:
            return None, HealthReport(False, str(failed), p99, mean_return, clock() - started, stages)

    def _mean_return(self, policy: OnnxPolicy, left: Callable[[str], None]) -> float:
        config = self.config
        env = self.make_env()
        try:
            returns = []
            for episode in range(config.episodes):
                obs, _ = env.reset(seed=episode)
                total = 0.0
                for _ in range(config.max_episode_steps):
                    obs, reward, terminated, truncated, _ = env.step(policy.act(np.asarray(obs, np.float32)))
                    total += float(reward)
                    if terminated or truncated:
                        break
                    left("the simulator episodes")
                returns.append(total)
            return float(np.mean(returns))
        finally:
            env.close()


def check_policy(bundle: Bundle, make_env: Callable[[], Any], config: HealthConfig, *,
                 clock: Callable[[], float] = time.perf_counter) -> tuple[OnnxPolicy | None, HealthReport]:
    """Run the health check once; return the loaded policy (None when it failed) and the report.

    An `EdgeAgent` keeps one `HealthChecker` instead, which reads the simulator once for all its bundles.
    """
    return HealthChecker(make_env, config).check(bundle, clock=clock)
