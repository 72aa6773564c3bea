"""How a training job wires its modes into a `Switcher`, and how the control endpoint reaches it.

Modes a run can use (``--modes``, the first is where it starts):

    sync        envs in the learner process (gymnasium SyncVectorEnv)
    colocated   the shared-memory env worker pool on this host
    decoupled   batched gRPC env services (started by the job, or ``--env-services``)
    fragments   gRPC env services acting with the exported policy, whole fragments back
    functions   serverless rollout functions acting with the exported policy (local runtime or AWS)
    edge        the fleet's experience over MQTT (`cloud.rollout._edge`): edge agents act with the published
                policy, ingesters store their records once, the learner learns from each exactly once

Fragment modes and the edge mode need the current policy as a signed bundle: the job exports it once per
version with a signing key of its own run dir (``run_dir/keys``), and hands the hosts the public key (edge
agents must trust it: ``--trust RUN_DIR/keys/strata-signing.pub``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cloud._errors import CloudError
from cloud.rollout._edge import EdgeLedger, EdgeSourceConfig
from cloud.rollout._sources import FragmentFeed, RolloutSource, VectorEnvSource
from cloud.switching._control import RunStatus
from cloud.switching._switcher import Switcher, SwitchRules
from device import ConfigError, ObsPipeline
from functions._secure import PLAINTEXT, ServiceTLS

FRAGMENT_MODES = ("fragments", "functions")
EDGE_MODE = "edge"
BUNDLE_MODES = (*FRAGMENT_MODES, EDGE_MODE)
"""Modes that need the learner's policy as a signed bundle (`PolicyPublisher`)."""


@dataclass(frozen=True, kw_only=True)
class SwitchingConfig:
    """Which modes a training job may run in and how it moves between them."""

    modes: tuple[str, ...] = ()
    """Modes of the run; the first is the initial one. Empty: just PPOConfig.env_mode."""
    warm_standby: bool = True
    """Start every mode at the beginning and keep the idle ones warm, so a switch pauses briefly."""
    functions: Literal["local", "aws"] = "local"
    """Where the ``functions`` mode invokes rollout functions: the local runtime or AWS Lambda."""
    function_name: str = "strata-rollout"
    """Lambda function of the ``functions`` mode."""
    fragment_steps: int = 128
    """Steps one function invocation simulates (a multiple of num_steps; one stream per invocation). Functions
    are stateless, so each stream's running episode travels with the invocation and the next one continues it
    (functions/_envstate.py); for an env without an env-state codec episodes end at this length."""
    env_services: str = ""
    """``HOST:PORT,...`` of running env services for ``decoupled``; empty: the job starts its own. A DNS name
    with several addresses (a headless Service) is one service per address."""
    control: bool = True
    """Serve the control endpoint (``strata switch``/``status``) on loopback while the job runs."""
    tls: ServiceTLS = PLAINTEXT
    """How the job's gRPC connections off this host are secured: to ``env_services``, and the hybrid units'
    parameter server (the --tls-* flags, `functions._secure`)."""


def switching_from_args(args: Any, **overrides: Any) -> SwitchingConfig:
    """`SwitchingConfig` from `strata train`'s flags; its `tls` from the --tls-* flags and ``STRATA_TLS_*``.

    The TLS files are read and checked here, before any work starts.
    """
    from device import config_from_args
    from functions._secure import service_tls_from_args

    tls = service_tls_from_args(args)
    tls.load("strata train")
    return config_from_args(SwitchingConfig, args, tls=tls, **overrides)


class PolicyPublisher:
    """Exports the learner's current policy as a signed bundle, once per version."""

    def __init__(self, run_dir: Path, *, agent: Any, normalizer: Any, obs_space: dict[str, Any],
                 action_space: dict[str, Any], policy: str, producer: dict[str, str] | None = None,
                 pipeline: ObsPipeline | None = None) -> None:
        from device import generate_keypair, load_signing_key

        keys = Path(run_dir) / "keys"
        key_path, self.public_key = keys / "strata-signing.key", keys / "strata-signing.pub"
        if not key_path.exists():
            generate_keypair(keys)
        self._key = load_signing_key(key_path)
        self._agent, self._normalizer = agent, normalizer
        self._obs_space, self._action_space, self._policy = obs_space, action_space, policy
        self._pipeline = pipeline or ObsPipeline()
        self._producer = {"algo": "ppo", "purpose": "acting policy of a fragment source", **(producer or {})}
        self._cache: tuple[int, bytes] | None = None

    def bundle(self, version: int) -> bytes:
        """The signed bundle of the learner's policy at `version` (bundles count from 1: version + 1)."""
        if self._cache is not None and self._cache[0] == version:
            return self._cache[1]
        from cloud.learners._onnx import build_policy_graph, export_onnx, output_names
        from device import build_bundle

        graph = build_policy_graph(self._agent, normalizer_state=self._normalizer.state_dict(),
                                   action_space=self._action_space)
        model = export_onnx(graph, obs_shape=tuple(self._obs_space["shape"]), action_space=self._action_space)
        data = build_bundle(model, policy=self._policy, version=version + 1, parent_version=version or None,
                            observation_space=self._obs_space, action_space=self._action_space,
                            signing_key=self._key, output_names=output_names(self._action_space),
                            preprocessing={"in_graph": True, "pipeline": self._pipeline.to_json()},
                            producer=self._producer).to_bytes()
        self._cache = (version, data)
        return data


def check_exploration(config: Any, modes: tuple[str, ...]) -> None:
    """Refuse gSDE in fragment and edge modes: their remote actors add plain Gaussian noise, not the learner's."""
    fragment_modes = [m for m in modes if m in BUNDLE_MODES]
    if fragment_modes and getattr(config, "use_sde", False):
        raise ConfigError(f"train: --use-sde cannot run in mode {fragment_modes[0]}: its remote actors add plain "
                          "Gaussian noise, so their actions would not follow the learner's policy; drop --use-sde "
                          "or that mode")


@dataclass(frozen=True, kw_only=True)
class EdgeWiring:
    """What the ``edge`` mode needs from the run besides its config: spaces, resume state, checkpoint progress."""

    config: EdgeSourceConfig
    observation_space: dict[str, Any]
    action_space: dict[str, Any]
    ledger: EdgeLedger
    """What the run has learned from (restored from the checkpoint); every edge source of the run shares it."""
    checkpointed: Callable[[], int] = lambda: -1
    """Version of the newest checkpoint on disk (-1: none)."""


def build_switcher(*, env_id: str, config: Any, switching: SwitchingConfig, rules: SwitchRules, run_dir: Path,
                   seed: int, agent: Any, normalizer: Any, publisher: PolicyPublisher | None,
                   log: Callable[[str], None], first_version: int = 0,
                   colocated_workers: int | None = None, edge: EdgeWiring | None = None) -> Switcher:
    """A `Switcher` over the run's modes; `config` is the run's `PPOConfig`, `first_version` its current version.

    `colocated_workers` fixes the worker processes of the ``colocated`` mode's pool (None: its own choice); `edge`
    wires the ``edge`` mode.
    """
    from cloud.rollout._envs import VECTOR_ENV_MODES, make_vector_env

    pipeline = ObsPipeline.from_config(config)
    modes = switching.modes or (config.env_mode,)
    known = {*VECTOR_ENV_MODES, *FRAGMENT_MODES, EDGE_MODE}
    unknown = [m for m in modes if m not in known]
    if unknown:
        raise ConfigError(f"train: modes {unknown} are not known; choose from {sorted(known)}")
    if len(set(modes)) != len(modes):
        raise ConfigError(f"train: --modes {','.join(modes)} names a mode twice")
    check_exploration(config, modes)
    if any(m in BUNDLE_MODES for m in modes) and publisher is None:
        raise ConfigError("train: fragment and edge modes need a policy publisher")
    if EDGE_MODE in modes and edge is None:
        raise ConfigError("train: mode edge needs --edge-broker and --edge-fleet")
    builders: dict[str, Callable[[], RolloutSource]] = {}
    for index, mode in enumerate(modes):
        mode_seed = seed + 1_000_003 * index  # every mode has streams of its own
        if mode == EDGE_MODE:
            assert publisher is not None and edge is not None
            builders[mode] = _edge_builder(edge, config=config, run_dir=run_dir, agent=agent, normalizer=normalizer,
                                           publisher=publisher, log=log)
            continue
        if mode in FRAGMENT_MODES:
            assert publisher is not None
            builders[mode] = _fragment_builder(mode, env_id=env_id, config=config, switching=switching,
                                               seed=mode_seed, agent=agent, normalizer=normalizer,
                                               publisher=publisher)
            continue

        def make_envs(mode: str = mode, mode_seed: int = mode_seed) -> Any:
            if mode == "decoupled" and switching.env_services:
                from cloud.rollout._decoupled import make_decoupled_vector_env

                return make_decoupled_vector_env(env_id, num_envs=config.num_envs, seed=mode_seed,
                                                 services=switching.env_services, tls=switching.tls,
                                                 pipeline=pipeline)
            if mode == "colocated" and colocated_workers is not None:
                from cloud.rollout._colocated import ColocatedConfig, build_colocated_vector_env

                return build_colocated_vector_env(env_id, num_envs=config.num_envs, seed=mode_seed,
                                                  config=ColocatedConfig(num_workers=colocated_workers),
                                                  pipeline=pipeline)
            return make_vector_env(env_id, num_envs=config.num_envs, seed=mode_seed, mode=mode, pipeline=pipeline)

        def build(mode: str = mode, make_envs: Callable[[], Any] = make_envs) -> RolloutSource:
            return VectorEnvSource(mode, make_envs, agent=agent, normalizer=normalizer, num_steps=config.num_steps)

        builders[mode] = build
    profile = measure_env(env_id) if rules.thresholds else None
    return Switcher(builders=builders, initial=modes[0], rules=rules, warm_standby=switching.warm_standby, log=log,
                    first_version=first_version, env_profile=profile)


def measure_env(env_id: str, *, seconds: float = 0.3) -> dict[str, float]:
    """One env's step rate (random actions, one process) and memory, for the design thresholds.

    Memory is the Python-heap peak of making and stepping it (tracemalloc): a floor of the real
    footprint, good enough to tell a 4 GB simulator from a classic-control one.
    """
    import tracemalloc

    from device import make_env

    tracemalloc.start()
    try:
        env = make_env(env_id)
        env.reset(seed=0)
        steps, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            steps += 1
            if terminated or truncated:
                env.reset()
        rate = steps / (time.perf_counter() - started)
        peak = tracemalloc.get_traced_memory()[1]
        env.close()
    finally:
        tracemalloc.stop()
    return {"steps_per_s": rate, "bytes": float(peak)}


def _edge_builder(edge: EdgeWiring, *, config: Any, run_dir: Path, agent: Any, normalizer: Any,
                  publisher: PolicyPublisher, log: Callable[[str], None]) -> Callable[[], RolloutSource]:
    from cloud.rollout._edge import EdgeSource

    edge.config.check_ready()  # before anything starts

    def build() -> RolloutSource:
        return EdgeSource(edge.config, run_dir=run_dir, observation_space=edge.observation_space,
                          action_space=edge.action_space, bundle_for=publisher.bundle, agent=agent,
                          normalizer=normalizer, num_envs=config.num_envs, num_steps=config.num_steps,
                          ledger=edge.ledger, checkpointed=edge.checkpointed, log=log)

    return build


def _fragment_builder(mode: str, *, env_id: str, config: Any, switching: SwitchingConfig, seed: int, agent: Any,
                      normalizer: Any, publisher: PolicyPublisher) -> Callable[[], RolloutSource]:
    steps = switching.fragment_steps
    pipeline = ObsPipeline.from_config(config)
    if mode == "functions":
        # One env stream per invocation, cut into steps / num_steps update columns: an update takes
        # num_envs / columns invocations, all in flight at once.
        if steps % config.num_steps or config.num_envs % (steps // config.num_steps):
            raise ConfigError(f"train: fragment_steps={steps} must be a multiple of num_steps={config.num_steps} "
                              f"that cuts into a divisor of num_envs={config.num_envs} pieces")
        invocations = config.num_envs // (steps // config.num_steps)

        def make_producer() -> Any:
            from cloud.rollout._serverless import ServerlessConfig, make_serverless_source

            serverless = ServerlessConfig(function_name=switching.function_name, env_id=env_id,
                                          envs_per_invocation=1, steps_per_invocation=steps, seed=seed,
                                          actions="sample", source="functions", max_concurrency=invocations,
                                          frame_stack=pipeline.frame_stack, obs_codec=pipeline.obs_codec,
                                          # small CNN bundles travel in the event (Lambda takes 6 MB); larger ones
                                          # need S3 (result_bucket), which the source says when it refuses one
                                          inline_bundle_bytes=3 << 20)
            return make_serverless_source(switching.functions, serverless,
                                          environment={"STRATA_TRUSTED_KEYS": publisher.public_key.read_text()})

        return lambda: FragmentFeed(mode, make_producer, bundle_for=publisher.bundle, agent=agent,
                                    normalizer=normalizer, num_envs=config.num_envs, num_steps=config.num_steps,
                                    envs_per_fragment=1, fragment_steps=steps)

    def make_services() -> Any:
        from cloud.rollout._decoupled import FragmentSource, start_services

        envs_per_service = max(1, config.num_envs // 2)
        services = start_services(env_id, count=2, envs=envs_per_service, seed=seed,
                                  trust=[str(publisher.public_key)], pipeline=pipeline)
        return FragmentSource([s.address for s in services], steps=config.num_steps, inflight=1, owned=services)

    return lambda: FragmentFeed(mode, make_services, bundle_for=publisher.bundle, agent=agent,
                                normalizer=normalizer, num_envs=config.num_envs, num_steps=config.num_steps,
                                envs_per_fragment=max(1, config.num_envs // 2))


class JobControl(RunStatus):
    """A PPO job's side of the control endpoint: the status snapshot with its modes, and blocking switches."""

    def __init__(self, switcher: Switcher, *, env_id: str, run_dir: Path, switch_timeout_s: float = 300.0) -> None:
        super().__init__(run_dir, env_id=env_id, mode=switcher.mode, modes=switcher.modes)
        self.switcher = switcher
        self._timeout = switch_timeout_s

    def start(self) -> JobControl:
        """Serve the endpoint in the background."""
        super().start()
        return self

    def update(self, **values: Any) -> None:
        """Merge fresh figures, and the switcher's mode, workers and last switch, into the status snapshot."""
        last = self.switcher.history[-1] if self.switcher.history else None
        super().update(**values, mode=self.switcher.mode, workers=self.switcher.active.workers(),
                       last_switch=last.to_dict() if last else None, switches=len(self.switcher.history))

    def switch(self, to: str, *, reason: str) -> dict[str, Any]:
        """Request a switch and wait until the learner has carried it out."""
        future = self.switcher.request(to, reason=reason)
        try:
            event = future.result(timeout=self._timeout)
        except TimeoutError:
            raise CloudError(f"the switch to {to!r} did not complete within {self._timeout:g} s") from None
        return event.to_dict()
