"""Proximal Policy Optimisation: the config, the rollout collector and one PPO update, in paper order.

One iteration of the learner (driven by `cloud._train.train`):

1. `RolloutCollector.collect` runs policy version ``v`` (weights + frozen normaliser statistics)
   for ``num_steps`` steps of ``num_envs`` envs and returns a `device.RolloutBatch` of raw
   observations, actions, rewards, terminations, truncations, real final observations, log-probs
   and values, stamped with ``v``.
2. `ppo_update` bootstraps truncated episodes from their final observations, computes GAE
   (`cloud._losses.compute_gae`), then runs ``update_epochs`` passes of minibatch SGD on the
   clipped surrogate, the (clipped) value loss and the entropy bonus, with gradient clipping.
3. The learner folds the batch's raw observations into the normaliser and the version becomes
   ``v + 1`` (the number of completed updates).

Torch is imported inside the functions, so the CLI can show `PPOConfig` in ``--help`` without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cloud._losses import compute_gae, normalize_advantages, policy_loss, total_loss, value_loss
from device import ConfigError, RolloutBatch, config_from_dict

if TYPE_CHECKING:
    import gymnasium
    import torch

    from cloud._agent import Agent, ObsNormalizer


@dataclass(frozen=True, kw_only=True)
class PPOConfig:
    """Hyperparameters of strata's PPO.

    The defaults are tuned for sample efficiency and wall-clock speed on small classic-control tasks
    (many short rollouts, 20 epochs of one full-batch step each, lr 1e-3 annealed): they solve
    CartPole-v1 (20-episode mean >= 475) in about 30k env steps. Longer-horizon or continuous tasks
    want bigger batches and minibatches (see tests/cloud/test_ppo_solves.py for Pendulum-v1).
    """

    # --- rollout ---
    num_envs: int = 8
    """Parallel environments that feed the learner."""
    num_steps: int = 32
    """Steps per environment in each rollout (the batch is num_envs * num_steps transitions)."""
    env_mode: str = "colocated"
    """Where the envs run: a mode registered in cloud._envs.VECTOR_ENV_MODES ("colocated" = the shared-memory
    worker pool on this host, "sync" = in the learner process, "decoupled" = gRPC env services)."""

    # --- optimisation ---
    learning_rate: float = 1e-3
    """Adam step size at the start of training."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to zero over the run's total steps."""
    update_epochs: int = 20
    """Passes over each rollout batch."""
    num_minibatches: int = 1
    """Minibatches per pass (the minibatch is batch_size / num_minibatches transitions)."""
    max_grad_norm: float = 0.5
    """Clip the global gradient norm to this value."""
    target_kl: float | None = None
    """Stop an update's epochs early once the approximate KL exceeds this (None: never)."""

    # --- PPO objective ---
    gamma: float = 0.98
    """Discount factor."""
    gae_lambda: float = 0.8
    """Lambda of generalised advantage estimation."""
    clip_coef: float = 0.2
    """Surrogate clipping range epsilon (ratio kept within 1 +- clip_coef)."""
    clip_vloss: bool = True
    """Clip the value loss around the old value estimate, with the same clip_coef."""
    norm_adv: bool = True
    """Normalise advantages to mean 0 and std 1 within each minibatch."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    vf_coef: float = 0.5
    """Weight of the value loss."""

    # --- observations ---
    normalize_obs: bool = True
    """Normalise observations by running mean and std (the statistics are exported inside the ONNX graph)."""
    obs_clip: float = 10.0
    """Clip normalised observations to +- this value."""

    # --- rewards ---
    normalize_reward: bool = False
    """Scale the rewards the update sees by the running std of the discounted return (SB3's VecNormalize reward
    scaling); reported episode returns stay unscaled."""
    reward_clip: float = 10.0
    """Clip scaled rewards to +- this value (with normalize_reward)."""

    # --- network ---
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the actor and of the critic (tanh activations)."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy (Box actions only)."""
    ortho_init: bool = True
    """Orthogonal weights (gain sqrt(2) for hidden layers, 0.01 for the policy head, 1 for the value head) and zero
    biases; false keeps torch's default nn.Linear initialisation (SB3's ortho_init=False)."""
    use_sde: bool = False
    """Generalised state-dependent exploration (Box actions only; SB3's use_sde): the action noise is the actor's
    last hidden features times a noise matrix redrawn every sde_sample_freq steps; init_log_std (SAC:
    sde_log_std_init) then sets that matrix's scale. PPO: not with the functions or fragments modes, whose remote
    actors add plain Gaussian noise."""
    sde_sample_freq: int = -1
    """Steps between two draws of the gSDE noise matrix; -1 draws it only at the start of each rollout (SAC: of
    each episode)."""

    # --- compute ---
    torch_threads: int = 1
    """Torch intra-op threads; one is fastest for networks this small and leaves cores to the envs."""

    def __post_init__(self) -> None:
        positive = ("num_envs", "num_steps", "update_epochs", "num_minibatches", "torch_threads")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"PPOConfig: {name} must be >= 1, got {getattr(self, name)}")
        if self.sde_sample_freq == 0 or self.sde_sample_freq < -1:
            raise ConfigError(f"PPOConfig: sde_sample_freq must be -1 (once per rollout) or >= 1, got "
                              f"{self.sde_sample_freq}")
        if self.batch_size % self.num_minibatches:
            raise ConfigError(f"PPOConfig: num_envs * num_steps = {self.batch_size} must be divisible by "
                              f"num_minibatches = {self.num_minibatches}")
        for name in ("learning_rate", "max_grad_norm", "clip_coef", "obs_clip", "reward_clip"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"PPOConfig: {name} must be > 0, got {getattr(self, name)}")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"PPOConfig: {name} must be within [0, 1], got {getattr(self, name)}")
        if not self.hidden_sizes or min(self.hidden_sizes) < 1:
            raise ConfigError(f"PPOConfig: hidden_sizes must be positive widths, got {self.hidden_sizes}")

    # --- derived values (computed here only) ---
    @property
    def batch_size(self) -> int:
        """Transitions per rollout: ``num_envs * num_steps``."""
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        """Transitions per gradient step: ``batch_size // num_minibatches``."""
        return self.batch_size // self.num_minibatches

    def num_updates(self, total_steps: int) -> int:
        """Updates (policy versions) in a run of `total_steps` env steps; at least one."""
        return max(1, total_steps // self.batch_size)

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as JSON-able plain values (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PPOConfig:
        """Inverse of `to_dict`; unknown keys are an error."""
        return config_from_dict(cls, values)

    @classmethod
    def from_flags(cls, args: Any, *, resume_from: Any = None) -> PPOConfig:
        """The config `strata train` runs with: the flags given on `args`, over a resumed checkpoint's config.

        `resume_from` is the checkpoint file a resumed run continues, so it keeps its lineage's hyperparameters.
        """
        given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if getattr(args, f.name) is not None}
        given = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}
        if resume_from is None:
            return cls(**given)
        from cloud._checkpoint import load_checkpoint

        return dataclasses.replace(cls.from_dict(load_checkpoint(resume_from)["config"]), **given)


@dataclass(frozen=True)
class Episode:
    """One finished training episode."""

    global_step: int
    """Env steps taken by the whole learner when it ended."""
    episodic_return: float
    episodic_length: int


class RolloutCollector:
    """Steps a same-step-autoreset vector env with the current policy and returns `RolloutBatch`es.

    Keeps the envs' current observations, each stream's running episode return and length, and
    per-stream transition sequence numbers across calls.
    """

    def __init__(self, envs: gymnasium.vector.VectorEnv[Any, Any, Any], *, num_steps: int, source: str = "sync",
                 seq_start: int = 0) -> None:
        import gymnasium

        self.envs = envs
        self.num_steps = num_steps
        self.source = source
        self.num_envs = envs.num_envs
        action_space = envs.single_action_space
        self.discrete = isinstance(action_space, gymnasium.spaces.Discrete)
        self.action_low = None if self.discrete else getattr(action_space, "low", None)
        self.action_high = None if self.discrete else getattr(action_space, "high", None)
        self.next_obs, _ = envs.reset()
        self.worker = np.arange(self.num_envs, dtype=np.int64)
        self.next_seq = np.full(self.num_envs, seq_start, dtype=np.int64)
        self.episode_return = np.zeros(self.num_envs, dtype=np.float64)
        self.episode_length = np.zeros(self.num_envs, dtype=np.int64)

    def collect(self, agent: Agent, normalizer: ObsNormalizer, *, policy_version: int,
                global_step: int) -> tuple[RolloutBatch, list[Episode]]:
        """Run `agent` for ``num_steps`` steps; return the batch and the episodes that ended in it."""
        import torch

        t, n = self.num_steps, self.num_envs
        obs_shape = self.next_obs.shape[1:]
        obs = np.zeros((t, n, *obs_shape), dtype=np.float32)
        final_obs = np.zeros((t, n, *obs_shape), dtype=np.float32)
        actions: np.ndarray | None = None
        rewards = np.zeros((t, n), dtype=np.float32)
        terminations = np.zeros((t, n), dtype=bool)
        truncations = np.zeros((t, n), dtype=bool)
        episodes: list[Episode] = []
        for step in range(t):
            if agent.sde and (step == 0 or (agent.sde_sample_freq > 0 and step % agent.sde_sample_freq == 0)):
                agent.reset_noise(n)
            obs[step] = self.next_obs
            with torch.inference_mode():
                action = agent.sample_action(torch.from_numpy(normalizer(self.next_obs))).numpy()
            if actions is None:
                actions = np.zeros((t, *action.shape), dtype=action.dtype)
            actions[step] = action
            # A Box policy's Gaussian sample may leave the bounds: the env gets it clipped, the
            # learner keeps the raw sample so its log-prob stays exact.
            env_action = action if self.discrete else np.clip(action, self.action_low, self.action_high)
            self.next_obs, reward, terminated, truncated, info = self.envs.step(env_action)
            rewards[step], terminations[step], truncations[step] = reward, terminated, truncated
            self.episode_return += reward
            self.episode_length += 1
            done = np.logical_or(terminated, truncated)
            if done.any():
                for i in np.flatnonzero(done):
                    final_obs[step, i] = info["final_obs"][i]
                    episodes.append(Episode(global_step + (step + 1) * n, float(self.episode_return[i]),
                                            int(self.episode_length[i])))
                self.episode_return[done] = 0.0
                self.episode_length[done] = 0
        assert actions is not None
        # Log-probs and values of the acting policy, in one batched pass: the weights did not change
        # during the rollout, so this equals computing them step by step, at a fraction of the cost.
        with torch.inference_mode():
            b_obs = torch.from_numpy(normalizer(obs.reshape(t * n, *obs_shape)))
            logprobs, _ = agent.evaluate_actions(b_obs, torch.from_numpy(actions.reshape(t * n, *actions.shape[2:])))
            values = agent.get_value(b_obs)
        seq = self.next_seq + np.arange(t, dtype=np.int64)[:, None]
        self.next_seq = self.next_seq + t
        batch = RolloutBatch(
            source=self.source, obs=obs, actions=actions, rewards=rewards, terminations=terminations,
            truncations=truncations, final_obs=final_obs, next_obs=np.asarray(self.next_obs, dtype=np.float32).copy(),
            policy_version=np.full((t, n), policy_version, dtype=np.int64), worker=self.worker.copy(), seq=seq,
            logprobs=logprobs.numpy().reshape(t, n), values=values.numpy().reshape(t, n),
        )
        return batch, episodes


def bootstrap_next_values(agent: Agent, normalizer: ObsNormalizer, batch: RolloutBatch) -> np.ndarray:
    """Return ``next_values[t, n]`` for `compute_gae`: ``V(s_{t+1})``, from the real final observation on truncation.

    Inside an episode that is the next step's value; after the last step, the value of
    ``batch.next_obs``; where a time limit cut the episode, the value of ``batch.final_obs`` (the
    observation in ``batch.obs[t + 1]`` already belongs to the next episode).
    """
    import torch

    assert batch.values is not None
    next_values = np.empty_like(batch.values)
    next_values[:-1] = batch.values[1:]
    truncated = np.logical_and(batch.truncations, np.logical_not(batch.terminations))
    with torch.inference_mode():
        next_values[-1] = agent.get_value(torch.from_numpy(normalizer(batch.next_obs))).numpy()
        if truncated.any():
            final = torch.from_numpy(normalizer(batch.final_obs[truncated]))
            next_values[truncated] = agent.get_value(final).numpy()
    return next_values


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients of `params` to an L2 norm of at most `max_norm`; return their norm before.

    `torch.nn.utils.clip_grad_norm_` bit for bit (a test holds it to that), less its per-call grouping of tensors
    by device and dtype: half its CPU time on these tiny CPU networks.
    """
    import torch

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    total: torch.Tensor = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, (max_norm / (total + 1e-6)).clamp(max=1.0))
    return total


def ppo_update(agent: Agent, optimizer: torch.optim.Optimizer, normalizer: ObsNormalizer, batch: RolloutBatch,
               config: PPOConfig, *, generator: np.random.Generator,
               reduce_gradients: Callable[[], None] | None = None) -> dict[str, float]:
    """Run one PPO update on `batch` (collected by the current policy); return namespaced loss metrics.

    `reduce_gradients`, when given, runs after every backward pass and before gradient clipping: data-parallel
    learners (`cloud.hybrid`) average the gradients of their replicas there, so every replica clips and steps
    with the same gradient.
    """
    import torch

    assert batch.values is not None and batch.logprobs is not None
    next_values = bootstrap_next_values(agent, normalizer, batch)
    dones = np.logical_or(batch.terminations, batch.truncations)
    advantages, returns = compute_gae(batch.rewards, batch.values, next_values, batch.terminations, dones,
                                      gamma=config.gamma, gae_lambda=config.gae_lambda)

    # Flatten the batch: [T, N, ...] -> [T * N, ...].
    obs_shape = batch.obs.shape[2:]
    b_obs = torch.from_numpy(normalizer(batch.obs.reshape(-1, *obs_shape)))
    b_actions = torch.from_numpy(batch.actions.reshape(-1, *batch.actions.shape[2:]))
    b_logprobs = torch.from_numpy(batch.logprobs.reshape(-1))
    b_advantages = torch.from_numpy(advantages.reshape(-1))
    b_returns = torch.from_numpy(returns.reshape(-1))
    b_values = torch.from_numpy(batch.values.reshape(-1))

    b_inds = np.arange(config.batch_size)
    params = list(agent.parameters())  # once: walking the module tree per minibatch cost more than Adam's step
    clipfracs: list[float] = []
    approx_kl = torch.zeros(())
    for _epoch in range(config.update_epochs):
        generator.shuffle(b_inds)
        for start in range(0, config.batch_size, config.minibatch_size):
            mb_inds = torch.from_numpy(b_inds[start:start + config.minibatch_size])
            newlogprob, entropy = agent.evaluate_actions(b_obs[mb_inds], b_actions[mb_inds])
            newvalue = agent.get_value(b_obs[mb_inds])

            mb_advantages = b_advantages[mb_inds]
            if config.norm_adv:
                mb_advantages = normalize_advantages(mb_advantages)
            pg_loss, approx_kl, clipfrac = policy_loss(newlogprob, b_logprobs[mb_inds], mb_advantages,
                                                       clip_coef=config.clip_coef)
            clipfracs.append(float(clipfrac))
            v_loss = value_loss(newvalue, b_values[mb_inds], b_returns[mb_inds],
                                clip_coef=config.clip_coef if config.clip_vloss else None)
            entropy_loss = entropy.mean()
            loss = total_loss(pg_loss, v_loss, entropy_loss, ent_coef=config.ent_coef, vf_coef=config.vf_coef)

            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            if reduce_gradients is not None:
                reduce_gradients()
            clip_grad_norm(params, config.max_grad_norm)
            optimizer.step()
        if config.target_kl is not None and float(approx_kl) > config.target_kl:
            break

    y_pred, y_true = batch.values.reshape(-1), returns.reshape(-1)
    var_y = float(np.var(y_true))
    explained_var = float("nan") if var_y == 0 else 1.0 - float(np.var(y_true - y_pred)) / var_y
    return {
        "losses/pg_loss": float(pg_loss.detach()),
        "losses/value_loss": float(v_loss.detach()),
        "losses/entropy": float(entropy_loss.detach()),
        "losses/approx_kl": float(approx_kl),
        "losses/clipfrac": float(np.mean(clipfracs)),
        "losses/explained_variance": explained_var,
    }
