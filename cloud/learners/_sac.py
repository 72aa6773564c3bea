"""Soft Actor-Critic for Box action spaces, learning from the prioritized replay service.

The learner follows the SAC papers (Haarnoja et al. 2018, with automatic entropy tuning) and
CleanRL's ``sac_continuous_action.py``: twin soft Q networks with Polyak-averaged targets, a
tanh-squashed Gaussian actor, a learned temperature ``alpha = exp(log_alpha)`` driven towards a
target entropy, and TD3's delayed actor updates. With ``SACConfig.use_sde`` the actor explores with
generalised state-dependent exploration as SB3's SAC does (a learned log-std matrix; noise that is the
last hidden features times a matrix held for ``sde_sample_freq`` env steps). The loss terms are pure
functions below, tested against hand-computed values; importance weights from prioritized replay scale
the Q losses and the absolute TD errors go back to the replay as priorities.

`SACTrainer` is the importable loop: step the env, insert into the replay, sample, update; its
replay can be swapped mid-run (`SACTrainer.switch_replay`) from one deployment to another without
losing a transition. `train_sac` runs it and exports the deterministic policy
(``tanh(mean)`` scaled to the action bounds) as a verified ONNX graph and, given a key, a signed bundle.

`train_sac` checkpoints like PPO (`cloud.runs._stop`): every `SACConfig.commit_every` env steps (and every
`SACConfig.log_every`) is a commit (policy version = env steps), written in the background as the rolling
checkpoint, kept every ``checkpoint_every`` x ``log_every`` steps, written on every stop; a checkpoint
holds the actor, the twin critics and their targets, the three optimisers, the temperature, the step
counters, the sampler's state and the replay's contents, so ``--resume`` continues the same run. Env
state is not checkpointed: a resumed run starts a fresh episode (and, with gSDE, a fresh exploration matrix).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from cloud._errors import CloudError
from cloud.replay._factory import make_replay
from cloud.replay._tables import Replay, ReplayConfig, SampleBatch, Signature, annealed_beta
from device import (
    Bundle,
    ConfigError,
    ObsCodec,
    ObsPipeline,
    SigningKey,
    build_bundle,
    config_from_dict,
    require,
    space_bounds,
)

if TYPE_CHECKING:
    import torch


class SACError(CloudError):
    """The SAC learner hit a state it cannot continue from (e.g. the replay refused a sample)."""


@dataclass(frozen=True, kw_only=True)
class SACConfig:
    """Hyperparameters of SAC and of its replay table (defaults follow CleanRL, sized for 2 cores)."""

    # networks
    hidden_sizes: tuple[int, ...] = (128, 128)
    """Hidden layer widths of the actor and of each Q network."""
    # optimisation
    q_lr: float = 1e-3
    """Adam learning rate of the twin Q networks."""
    policy_lr: float = 3e-4
    """Adam learning rate of the actor and of log_alpha."""
    anneal_lr: bool = False
    """Decay all three learning rates linearly to zero over the run's total steps (SB3's ``lin_`` schedules, which
    RL Zoo's SAC entries use)."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak averaging rate of the target Q networks (target <- tau * online + (1 - tau) * target)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    learning_starts: int = 1000
    """Env steps of uniformly random actions before learning starts (also the replay's minimum size)."""
    policy_frequency: int = 2
    """Delayed actor updates (TD3): every this many steps, this many actor and alpha steps."""
    target_network_frequency: int = 1
    """Polyak-update the target Q networks every this many gradient steps."""
    # entropy
    autotune: bool = True
    """Learn the temperature alpha towards the target entropy; otherwise keep `alpha` fixed."""
    alpha: float = 0.2
    """Initial (or, without autotune, fixed) entropy temperature."""
    target_entropy_scale: float = 1.0
    """Target entropy is -target_entropy_scale * action dimensions."""
    # exploration
    use_sde: bool = False
    """Generalised state-dependent exploration (gSDE, SB3's ``use_sde``): the action noise is the actor's last
    hidden features times a noise matrix held for `sde_sample_freq` env steps, so exploration is smooth in time
    (what finds MountainCarContinuous' goal); the log-std is a learned matrix, not a network head."""
    sde_sample_freq: int = -1
    """With use_sde: redraw the exploration matrix every this many env steps; -1 at each episode's start."""
    sde_log_std_init: float = -3.0
    """With use_sde: initial value of every entry of the learned log-std matrix (SB3's ``log_std_init``)."""
    sde_at_warmup: bool = False
    """With use_sde: the gSDE policy acts before learning_starts instead of uniformly random actions (SB3's
    ``use_sde_at_warmup``; how SB3 runs a Zoo entry whose learning_starts is 0)."""
    # replay
    buffer_size: int = 100_000
    """Replay capacity in transitions."""
    prioritized: bool = True
    """Prioritized experience replay (by |TD error|) instead of uniform sampling."""
    per_alpha: float = 0.6
    """Priority exponent of prioritized replay."""
    per_beta_start: float = 0.4
    """Importance-sampling exponent at the start; annealed linearly to 1 over the run."""
    rate_limit_slack: float = 2.0
    """Rate limiter's error buffer in sample batches: how far inserting actors may run ahead or behind."""
    replay: Literal["local", "shared_memory", "grpc"] = "shared_memory"
    """Replay deployment: in this process's memory, in shared memory, or behind a gRPC replay server."""
    replay_address: str = ""
    """host:port of a running replay server for replay='grpc'; empty starts one in this process."""
    # image observations (the same flags as PPO's)
    frame_stack: int = 1
    """Observations stacked per step (1: none)."""
    obs_codec: Literal["raw", "png", "webp", "jxl"] = "raw"
    """Observation codec of image observations (see PPOConfig.obs_codec)."""
    obs_quality: int = 0
    """0: lossless; 1-100: lossy quality, applied once where each frame is made."""
    network: Literal["auto", "mlp", "cnn"] = "auto"
    """auto: the Nature CNN encoder (one for the actor, one shared by the twin critics) for image observations."""
    # runtime
    torch_threads: int = 1
    """torch intra-op threads (small nets are fastest on one)."""
    env_mode: str = "sync"
    """Vector-env mode of cloud.rollout._envs.make_vector_env (the env source); "edge": the fleet's experience alone
    (--edge-broker, --edge-fleet), into the replay with each transition's acting version."""
    log_every: int = 1000
    """Write metrics every this many env steps."""
    commit_every: int = 250
    """Commit every this many env steps: the rolling checkpoint a kill -9 resumes from is at most this far behind
    (benchmarks/rolling_checkpoint.py measures the cost)."""
    eval_episodes: int = 20
    """Episodes of the exported deterministic policy evaluated at the end of train_sac."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "learning_starts", "policy_frequency", "target_network_frequency", "buffer_size",
                     "torch_threads", "log_every", "commit_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"SACConfig: {name}={getattr(self, name)} must be at least 1")
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError(f"SACConfig: tau={self.tau} must lie in (0, 1]")
        if self.rate_limit_slack < 1.0:
            raise ConfigError(f"SACConfig: rate_limit_slack={self.rate_limit_slack} must be at least 1 (one batch), "
                              "or inserts and samples could both wait forever")
        if self.sde_sample_freq == 0 or self.sde_sample_freq < -1:
            raise ConfigError(f"SACConfig: sde_sample_freq={self.sde_sample_freq} must be -1 (each episode) or a "
                              "positive number of env steps")
        if self.sde_at_warmup and not self.use_sde:
            raise ConfigError("SACConfig: sde_at_warmup acts with the gSDE policy during warm-up; it needs use_sde "
                              "(--use-sde), or drop --sde-at-warmup")
        try:
            self.pipeline  # noqa: B018  (checks frame_stack, obs_codec and obs_quality together)
        except ConfigError as exc:
            raise ConfigError(f"SACConfig: {exc}") from None
        if self.learning_starts < self.batch_size:
            raise ConfigError(f"SACConfig: learning_starts={self.learning_starts} is below batch_size="
                              f"{self.batch_size}; collect at least one batch before learning")

    @property
    def pipeline(self) -> ObsPipeline:
        """The observation pipeline the run's envs are made with."""
        return ObsPipeline(frame_stack=self.frame_stack,
                           obs_codec=ObsCodec.from_flags(self.obs_codec, self.obs_quality).spec)

    def replay_config(self) -> ReplayConfig:
        """The replay table this config trains from (derived values live here, in one place)."""
        # One gradient step of batch_size samples per env step: the rate limiter holds exactly that
        # ratio, with rate_limit_slack batches of slack, so decoupled actors can neither starve nor
        # outrun the learner.
        spi = float(self.batch_size)
        return ReplayConfig(capacity=self.buffer_size, prioritized=self.prioritized, alpha=self.per_alpha,
                            min_size_to_sample=self.learning_starts, samples_per_insert=spi,
                            error_buffer=self.rate_limit_slack * spi)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready field values."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SACConfig:
        """Inverse of `to_dict`; unknown keys are an error."""
        return config_from_dict(cls, values)


# -- pure loss functions ---------------------------------------------------------------------------------


def soft_q_target(rewards: torch.Tensor, terminations: torch.Tensor, next_q: torch.Tensor, next_log_pi: torch.Tensor,
                  *, alpha: float | torch.Tensor, gamma: float) -> torch.Tensor:
    """Soft Bellman target ``r + gamma * (1 - d) * (min_k Q'_k(s', a') - alpha * log pi(a'|s'))``.

    Args:
        rewards: ``[B]``.
        terminations: ``[B]`` 1 where the MDP ended (no bootstrap); time-limit truncations are 0.
        next_q: ``[2, B]`` both target Q networks at ``(s', a' ~ pi(s'))``.
        next_log_pi: ``[B]`` log-probability of ``a'``.
        alpha: Entropy temperature.
        gamma: Discount factor.
    """
    min_qf_next_target = next_q.min(dim=0).values - alpha * next_log_pi
    return rewards + (1.0 - terminations) * gamma * min_qf_next_target


def q_losses(qf_a_values: torch.Tensor, next_q_value: torch.Tensor,
             weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(qf1_loss, qf2_loss)``: importance-weighted mean squared errors against the soft target.

    Args:
        qf_a_values: ``[2, B]`` both online Q networks at the replayed ``(s, a)``.
        next_q_value: ``[B]`` the (detached) soft target.
        weights: ``[B]`` importance weights from prioritized replay; None for plain means.
    """
    sq = (qf_a_values - next_q_value) ** 2
    if weights is not None:
        sq = sq * weights
    per_head = sq.mean(dim=1)
    return per_head[0], per_head[1]


def actor_loss_fn(log_pi: torch.Tensor, min_qf_pi: torch.Tensor, *, alpha: float | torch.Tensor) -> torch.Tensor:
    """``mean(alpha * log pi(a|s) - min_k Q_k(s, a))`` with ``a ~ pi(s)`` reparameterised."""
    return (alpha * log_pi - min_qf_pi).mean()


def alpha_loss_fn(log_alpha: torch.Tensor, log_pi: torch.Tensor, *, target_entropy: float) -> torch.Tensor:
    """``mean(-exp(log_alpha) * (log pi + target_entropy))``; `log_pi` must be detached."""
    return (-log_alpha.exp() * (log_pi + target_entropy)).mean()


def polyak_update(target: list[torch.Tensor], online: list[torch.Tensor], tau: float) -> None:
    """``target <- tau * online + (1 - tau) * target``, in place, without autograd."""
    import torch

    with torch.no_grad():
        for t, o in zip(target, online, strict=True):
            t.lerp_(o, tau)


# -- networks --------------------------------------------------------------------------------------------


def transition_signature(obs_shape: tuple[int, ...], act_shape: tuple[int, ...], obs_dtype: str = "float32", *,
                         version: bool = False) -> Signature:
    """The replay fields SAC stores; ``step`` is the transition's env-step id (counts loss and duplicates).

    Image frames are stored as uint8 (`obs_dtype`): a quarter of float32's memory, scaled by the CNN. With
    `version` (the edge mode), also the bundle version of the policy that acted, for diagnostics.
    """
    fields = {"obs": (obs_shape, obs_dtype), "action": (act_shape, "float32"), "reward": ((), "float32"),
              "next_obs": (obs_shape, obs_dtype), "terminated": ((), "bool"), "step": ((), "int64")}
    if version:
        fields["version"] = ((), "int64")
    return fields


class SACTrainer:
    """The SAC loop over one env source and one replay (any deployment), importable and steppable.

    Args:
        config: Hyperparameters.
        env_id: Gymnasium env id with Box observations and Box actions.
        seed: Seeds torch, the env and the replay's sampler.
        total_steps: Planned env steps (anneals the importance-sampling exponent beta).
        replay: A replay to train from; None makes one of `config.replay`'s deployment (and, for gRPC
            without an address, a server in this process).
    """

    def __init__(self, config: SACConfig, *, env_id: str, seed: int, total_steps: int,
                 replay: Replay | None = None) -> None:
        self.torch = torch = require("torch", extra="cloud", purpose="the SAC learner")
        gym = require("gymnasium", extra="cloud", purpose="training environments")
        from cloud.learners._sac_networks import build_networks
        from cloud.rollout._envs import make_vector_env
        from device import space_to_json

        self.config = config
        self.env_id = env_id
        self.total_steps = total_steps
        torch.set_num_threads(config.torch_threads)
        torch.manual_seed(seed)
        self.fed = config.env_mode == "edge"
        """Whether the fleet's experience is the env source (`run_fed`); the local env then only names the spaces."""
        self.envs = make_vector_env(env_id, num_envs=1, seed=seed, mode="sync" if self.fed else config.env_mode,
                                    pipeline=config.pipeline)
        act_space = self.envs.single_action_space
        if not isinstance(act_space, gym.spaces.Box):
            self.envs.close()
            raise ConfigError(f"SACTrainer: {env_id!r} has action space {act_space}; SAC needs a Box action space "
                              "(use PPO for Discrete actions)")
        if not (np.all(np.isfinite(act_space.low)) and np.all(np.isfinite(act_space.high))):
            self.envs.close()
            raise ConfigError(f"SACTrainer: {env_id!r} has unbounded actions {act_space}; the tanh-squashed actor "
                              "needs finite action bounds")
        self.act_space = act_space
        self.observation_space = space_to_json(self.envs.single_observation_space)
        self.action_space = space_to_json(act_space)
        obs_space_shape = self.envs.single_observation_space.shape
        assert obs_space_shape is not None  # check_spaces admitted only a Box
        self.obs_shape = tuple(obs_space_shape)
        self.act_shape = tuple(act_space.shape)
        obs_dim, act_dim = int(np.prod(self.obs_shape)), int(np.prod(self.act_shape))
        low, high = act_space.low.astype(np.float64).reshape(-1), act_space.high.astype(np.float64).reshape(-1)
        from cloud.learners._cnn import uses_cnn

        obs_dtype = self.envs.single_observation_space.dtype
        try:
            self.image = uses_cnn(config.network, self.obs_shape, obs_dtype, caller="SACConfig")
        except ConfigError:
            self.envs.close()
            raise
        self.actor, self.qf, self.qf_target = build_networks(obs_dim, act_dim, config.hidden_sizes, low, high,
                                                             sde=config.use_sde,
                                                             sde_log_std_init=config.sde_log_std_init,
                                                             image_shape=self.obs_shape if self.image else None)
        # fused: one kernel per step for all parameters (~5% of a MountainCarContinuous env step against foreach)
        self.q_optimizer = torch.optim.Adam(self.qf.parameters(), lr=config.q_lr, fused=True)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=config.policy_lr, fused=True)
        self.target_entropy = -config.target_entropy_scale * act_dim
        self.log_alpha = torch.tensor([math.log(config.alpha)], requires_grad=True)
        self.a_optimizer = torch.optim.Adam([self.log_alpha], lr=config.policy_lr)
        self.alpha = config.alpha

        self.signature = transition_signature(self.obs_shape, self.act_shape, "uint8" if self.image else "float32",
                                              version=self.fed)
        self._server: Any = None
        self.replay = replay if replay is not None else self._make_replay(seed)
        self.rng = np.random.default_rng(seed)
        self.global_step = 0
        self.gradient_steps = 0
        self.obs, _ = self.envs.reset()
        self._sde_eps: Any = None  # gSDE's exploration matrix while collecting; None: draw anew
        self.train_returns: list[float] = []
        self._episode_return = 0.0
        self.last_metrics: dict[str, float] = {}

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs, as tensors and plain values (readable with ``weights_only``)."""
        from cloud.learners._state import clone_state

        meta, arrays = self.replay.export_state()
        torch = self.torch
        return {
            **clone_state({
                "actor": self.actor.state_dict(), "qf": self.qf.state_dict(), "qf_target": self.qf_target.state_dict(),
                "q_optimizer": self.q_optimizer.state_dict(), "actor_optimizer": self.actor_optimizer.state_dict(),
                "a_optimizer": self.a_optimizer.state_dict(), "log_alpha": self.log_alpha,
            }),
            "alpha": float(self.alpha), "global_step": int(self.global_step),
            "gradient_steps": int(self.gradient_steps),
            "rng": json.loads(json.dumps(self.rng.bit_generator.state)), "train_returns": list(self.train_returns),
            "replay_meta": json.loads(json.dumps(meta)),
            "replay": {k: torch.from_numpy(np.array(v)) for k, v in arrays.items()},  # own, writable copies
        }

    def load_state_dict(self, state: dict[str, Any], *, seed: int) -> None:
        """Continue from `state_dict` output: same networks, optimisers, counters and replay; a fresh episode."""
        torch = self.torch
        self.actor.load_state_dict(state["actor"])
        self.qf.load_state_dict(state["qf"])
        self.qf_target.load_state_dict(state["qf_target"])
        self.q_optimizer.load_state_dict(state["q_optimizer"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.a_optimizer.load_state_dict(state["a_optimizer"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.alpha = float(state["alpha"])
        self.global_step = int(state["global_step"])
        self.gradient_steps = int(state["gradient_steps"])
        self.rng.bit_generator.state = state["rng"]
        self.train_returns = [float(r) for r in state["train_returns"]]
        self.replay.load_state(state["replay_meta"], {k: v.numpy() for k, v in state["replay"].items()})
        self.obs, _ = self.envs.reset(seed=seed + 104729 * max(self.global_step, 1))
        self._episode_return = 0.0

    def _make_replay(self, seed: int) -> Replay:
        cfg = self.config
        if cfg.replay == "grpc" and not cfg.replay_address:
            from cloud.replay._grpc import ReplayServer

            self._server = ReplayServer(self.signature, cfg.replay_config(), seed=seed).start()
            return make_replay("grpc", self.signature, cfg.replay_config(), address=self._server.address)
        address = cfg.replay_address or None
        return make_replay(cfg.replay, self.signature, cfg.replay_config(), seed=seed, address=address)

    # -- the loop ----------------------------------------------------------------------------------------

    def run(self, until_step: int, *, on_log: Callable[[int, dict[str, float]], None] | None = None,
            on_step: Callable[[int], None] | None = None) -> None:
        """Step the env and learn until `global_step` reaches `until_step`.

        ``on_step(global_step)`` runs after every step's update, ``on_log(global_step, metrics)`` after it every
        ``log_every`` steps.
        """
        torch = self.torch
        cfg = self.config
        started, steps_at_start = time.perf_counter(), self.global_step
        while self.global_step < until_step:
            step = self.global_step
            if step < cfg.learning_starts and not cfg.sde_at_warmup:
                actions = self.rng.uniform(self.act_space.low, self.act_space.high, (1, *self.act_shape))
            else:
                if cfg.use_sde and (self._sde_eps is None or (cfg.sde_sample_freq > 0
                                                             and step % cfg.sde_sample_freq == 0)):
                    self._sde_eps = torch.randn(self.actor.sde_noise_shape())
                with torch.no_grad():
                    obs = torch.as_tensor(self.obs) if self.image else torch.as_tensor(self.obs, dtype=torch.float32)
                    sampled, _, _ = self.actor.get_action(obs,
                                                          self._sde_eps)
                actions = sampled.numpy()
            next_obs, rewards, terminations, truncations, infos = self.envs.step(actions.astype(self.act_space.dtype))
            # Same-step autoreset: where an episode ended, next_obs is already the next episode's first
            # observation and the real last one is in infos["final_obs"].
            real_next_obs = next_obs.copy()
            if "_final_obs" in infos and infos["_final_obs"][0]:
                real_next_obs[0] = infos["final_obs"][0]
            self._insert({"obs": self.obs, "action": actions, "reward": rewards, "next_obs": real_next_obs,
                          "terminated": terminations, "step": np.array([step])})
            self._episode_return += float(rewards[0])
            if terminations[0] or truncations[0]:
                self.train_returns.append(self._episode_return)
                self._episode_return = 0.0
                if cfg.sde_sample_freq == -1:
                    self._sde_eps = None
            self.obs = next_obs
            self.global_step += 1
            if self.global_step >= cfg.learning_starts:
                self.update()
            if on_step is not None:
                on_step(self.global_step)
            if on_log is not None and self.global_step % cfg.log_every == 0:
                rate = (self.global_step - steps_at_start) / max(time.perf_counter() - started, 1e-9)
                on_log(self.global_step, {**self.last_metrics, "perf/env_steps_per_s": rate,
                                          "charts/episodic_return": self.train_returns[-1] if self.train_returns
                                          else math.nan})

    def run_fed(self, until_step: int, *, take: Callable[[int], list[Any]],
                on_log: Callable[[int, dict[str, float]], None] | None = None) -> None:
        """Learn from the fleet's records (``take(budget) -> [edge.Experience]``) until `until_step` env steps.

        Each transition goes into the replay with its acting version, followed by one gradient step, as an env step
        would be; records are taken whole, at most up to the next ``log_every`` boundary, so a commit never splits
        one.
        """
        cfg = self.config
        started, steps_at_start = time.perf_counter(), self.global_step
        while self.global_step < until_step:
            budget = min(cfg.log_every - self.global_step % cfg.log_every, until_step - self.global_step)
            for record in take(budget):
                self._insert_record(record)
            if on_log is not None and self.global_step % cfg.log_every == 0:
                rate = (self.global_step - steps_at_start) / max(time.perf_counter() - started, 1e-9)
                on_log(self.global_step, {**self.last_metrics, "perf/env_steps_per_s": rate,
                                          "charts/episodic_return": self.train_returns[-1] if self.train_returns
                                          else math.nan})

    def _insert_record(self, record: Any) -> None:
        """The transitions of one `edge.Experience` record into the replay, one gradient step after each."""
        b = record.batch
        done = np.logical_or(b.terminations, b.truncations)
        for n in range(b.num_envs):
            for t in range(b.num_steps):
                if done[t, n]:
                    next_obs = b.final_obs[t, n]
                else:
                    next_obs = b.obs[t + 1, n] if t + 1 < b.num_steps else b.next_obs[n]
                self._insert({"obs": b.obs[t, n][None], "action": np.asarray(b.actions[t, n], np.float32)[None],
                              "reward": np.asarray([b.rewards[t, n]], np.float32), "next_obs": next_obs[None],
                              "terminated": np.asarray([b.terminations[t, n]]),
                              "step": np.array([self.global_step]), "version": np.array([b.policy_version[t, n]])})
                if done[t, n] and record.episode_return is not None:
                    self.train_returns.append(float(record.episode_return[t, n]))
                self.global_step += 1
                if self.global_step >= self.config.learning_starts:
                    self.update()

    def _insert(self, items: dict[str, np.ndarray]) -> None:
        # Timeout 0: in this loop inserts and samples alternate, so the limiter can only block on a bug.
        if not self.replay.insert(items, timeout=0):
            raise SACError(f"SACTrainer: the replay's rate limiter refused an insert at step {self.global_step}; "
                           "the replay config does not match this loop's one-update-per-step ratio")

    def update(self) -> dict[str, float]:
        """One gradient step on a prioritized batch (plus delayed actor/alpha steps and the target update)."""
        cfg = self.config
        beta = annealed_beta(self.global_step, self.total_steps, beta_start=cfg.per_beta_start)
        batch = self.replay.sample(cfg.batch_size, beta=beta, timeout=0)
        if batch is None:
            raise SACError(f"SACTrainer: the replay held a sample at step {self.global_step} ({self.replay.stats()}); "
                           "it should have had learning_starts transitions and samples to spare")
        metrics = self.learn(batch)
        self.gradient_steps += 1
        return metrics

    def learn(self, batch: SampleBatch) -> dict[str, float]:
        """The SAC update of one sampled batch; sends |TD error| back to the replay as priorities."""
        torch = self.torch
        cfg = self.config
        if cfg.anneal_lr:  # as SB3: the fraction of the planned steps still to come, before each gradient step
            remaining = max(0.0, 1.0 - self.global_step / self.total_steps)
            self.q_optimizer.param_groups[0]["lr"] = remaining * cfg.q_lr
            self.actor_optimizer.param_groups[0]["lr"] = remaining * cfg.policy_lr
            self.a_optimizer.param_groups[0]["lr"] = remaining * cfg.policy_lr
        d = batch.data
        obs = torch.from_numpy(d["obs"])
        actions = torch.from_numpy(d["action"])
        rewards = torch.from_numpy(d["reward"])
        next_obs = torch.from_numpy(d["next_obs"])
        terminations = torch.from_numpy(d["terminated"].astype(np.float32))
        weights = torch.from_numpy(batch.weights) if cfg.prioritized else None
        # gSDE: one exploration matrix per gradient step, shared by the batch's next and current actions (as SB3).
        eps = torch.randn(self.actor.sde_noise_shape()) if cfg.use_sde else None

        with torch.no_grad():
            next_state_actions, next_state_log_pi, _ = self.actor.get_action(next_obs, eps)
            qf_next_target = self.qf_target(next_obs, next_state_actions)
            next_q_value = soft_q_target(rewards, terminations, qf_next_target, next_state_log_pi,
                                         alpha=self.alpha, gamma=cfg.gamma)
        qf_a_values = self.qf(obs, actions)
        qf1_loss, qf2_loss = q_losses(qf_a_values, next_q_value, weights)
        qf_loss = qf1_loss + qf2_loss
        self.q_optimizer.zero_grad(set_to_none=True)
        qf_loss.backward()  # type: ignore[no-untyped-call]
        self.q_optimizer.step()
        td_error = (qf_a_values.detach() - next_q_value).abs().mean(dim=0)
        self.replay.update_priorities(batch.keys, td_error.numpy().astype(np.float64))

        metrics = self.last_metrics
        metrics.update({"losses/qf1_loss": qf1_loss.item(), "losses/qf2_loss": qf2_loss.item(),
                        "losses/qf1_values": qf_a_values[0].mean().item()})
        if self.global_step % cfg.policy_frequency == 0:
            for _ in range(cfg.policy_frequency):  # compensate for the delay, as CleanRL does
                pi, log_pi, _ = self.actor.get_action(obs, eps)
                min_qf_pi = self.qf(obs, pi).min(dim=0).values
                actor_loss = actor_loss_fn(log_pi, min_qf_pi, alpha=self.alpha)
                self.actor_optimizer.zero_grad(set_to_none=True)
                # Gradients flow through Q into the actor only; Q's own grads are not needed here.
                actor_loss.backward(inputs=list(self.actor.parameters()))  # type: ignore[no-untyped-call]
                self.actor_optimizer.step()
                metrics["losses/actor_loss"] = actor_loss.item()
                if cfg.autotune:
                    alpha_loss = alpha_loss_fn(self.log_alpha, log_pi.detach(), target_entropy=self.target_entropy)
                    self.a_optimizer.zero_grad(set_to_none=True)
                    alpha_loss.backward()  # type: ignore[no-untyped-call]
                    self.a_optimizer.step()
                    self.alpha = self.log_alpha.exp().item()
                    metrics["losses/alpha_loss"] = alpha_loss.item()
            metrics["losses/alpha"] = self.alpha
        if self.gradient_steps % cfg.target_network_frequency == 0:
            polyak_update(list(self.qf_target.parameters()), list(self.qf.parameters()), cfg.tau)
        return metrics

    # -- replay handover, export, teardown ---------------------------------------------------------------

    def switch_replay(self, new: Replay) -> None:
        """Move the replay's contents into `new` (empty, any deployment) and train from it from now on.

        Called between steps, so nothing is in flight: every transition the old replay holds, its
        priorities and the rate limiter's counters arrive in `new`, or this raises and the old replay
        stays in use.
        """
        meta, arrays = self.replay.export_state()
        new.load_state(meta, arrays)
        before, after = self.replay.stats(), new.stats()
        if (before.size, before.inserts, before.samples) != (after.size, after.inserts, after.samples):
            raise SACError(f"SACTrainer.switch_replay: the new replay holds {after}, the old one {before}; "
                           "kept the old replay")
        old, self.replay = self.replay, new
        old.close()

    def policy_graph(self) -> Any:
        """The deterministic policy module that is exported (``obs -> action``)."""
        from cloud.learners._sac_networks import DeterministicPolicy

        return DeterministicPolicy(self.actor).eval()

    def export_onnx(self) -> bytes:
        """Export the deterministic policy with strata's exporter and check it against torch (1e-5, batch 1 and 3)."""
        from cloud.learners._onnx import export_onnx, verify_onnx

        graph = self.policy_graph()
        model: bytes = export_onnx(graph, obs_shape=self.obs_shape, action_space=self.action_space)
        verify_onnx(model, graph, obs_space=self.observation_space, action_space=self.action_space)
        return model

    def build_bundle(self, model: bytes, *, signing_key: SigningKey, policy: str, version: int = 1,
                     parent_version: int | None = None, producer: dict[str, str] | None = None) -> Bundle:
        """Sign `model` as a policy bundle with this run's spaces and provenance."""
        import onnx
        import torch

        from cloud.learners._onnx import OPSET

        return build_bundle(
            model, policy=policy, version=version, parent_version=parent_version,
            observation_space=self.observation_space, action_space=self.action_space,
            preprocessing=sac_preprocessing(self.action_space, self.config.pipeline), signing_key=signing_key,
            producer={"torch": torch.__version__, "onnx": onnx.__version__, "algo": "sac", "env_id": self.env_id,
                      "global_step": str(self.global_step),
                      "exporter": f"torch.onnx.export(dynamo=False, opset_version={OPSET})", **(producer or {})},
        )

    def close(self) -> None:
        """Close the env and the replay (and the in-process replay server, if this trainer started one)."""
        self.envs.close()
        self.replay.close()
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None


def sac_preprocessing(action_space: dict[str, Any], pipeline: ObsPipeline | None = None) -> dict[str, Any]:
    """The bundle manifest's ``preprocessing`` of an exported SAC policy (all in the graph; no normalisation)."""
    low, high = (np.asarray(b, dtype=np.float64).reshape(-1) for b in space_bounds(action_space))
    return {"in_graph": True, "obs_normalization": {"enabled": False}, "action": "tanh_mean_scaled",
            "pipeline": (pipeline or ObsPipeline()).to_json(),
            "action_scale": ((high - low) / 2.0).tolist(), "action_bias": ((high + low) / 2.0).tolist()}


def sac_policy_graph(state: dict[str, Any]) -> Any:
    """The deterministic policy module (``obs -> tanh(mean)`` scaled to the bounds) of a SAC checkpoint's state."""
    from cloud.learners._cnn import uses_cnn
    from cloud.learners._sac_networks import DeterministicPolicy, build_actor

    obs_shape = tuple(int(d) for d in state["observation_space"]["shape"])
    low, high = (np.asarray(b, dtype=np.float64).reshape(-1) for b in space_bounds(state["action_space"]))
    image = uses_cnn(state["config"].get("network", "auto"), obs_shape,
                     state["observation_space"].get("dtype", "float32"), caller="SACConfig")
    actor = build_actor(int(np.prod(obs_shape)), int(low.size), tuple(int(h) for h in state["config"]["hidden_sizes"]),
                        low, high, sde=bool(state["config"].get("use_sde", False)),  # older checkpoints lack it
                        image_shape=obs_shape if image else None)
    actor.load_state_dict(state["actor"])
    return DeterministicPolicy(actor).eval()
