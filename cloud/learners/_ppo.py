"""Proximal Policy Optimisation: the config, the rollout collector and one PPO update, in paper order.

One iteration of the learner (driven by `cloud.runs._train.train`):

1. `RolloutCollector.collect` runs policy version ``v`` (weights + frozen normaliser statistics)
   for ``num_steps`` steps of ``num_envs`` envs and returns a `device.RolloutBatch` of raw
   observations, actions, rewards, terminations, truncations, real final observations, log-probs
   and values, stamped with ``v``.
2. `ppo_update` bootstraps truncated episodes from their final observations, computes GAE
   (`cloud.learners._losses.compute_gae`), then runs ``update_epochs`` passes of minibatch SGD on the
   clipped surrogate, the (clipped) value loss and the entropy bonus, with gradient clipping. Experience acted
   by an older policy (the edge fleet's, whose batches carry ``behaviour_logprobs``) is corrected for it as
   APPO does: the clipped ratio is taken against the policy that acted, so it is the importance weight of each
   action, truncated to ``1 +- clip_coef``, and advantages and value targets come from V-trace
   (`compute_vtrace`: truncated weights of the learner's policy at the update's start over the one that acted).
3. The learner folds the batch's raw observations into the normaliser and the version becomes
   ``v + 1`` (the number of completed updates).

Torch is imported inside the functions, so the CLI can show `PPOConfig` in ``--help`` without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from cloud.learners._losses import (
    compute_gae,
    compute_vtrace,
    normalize_advantages,
    policy_loss,
    total_loss,
    value_loss,
)
from cloud.rollout._collector import evaluate
from device import RolloutBatch

if TYPE_CHECKING:
    import torch

    from cloud.learners._agent import Agent, ObsNormalizer
    from cloud.learners._ppo_config import PPOConfig


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
    old_logprobs = batch.logprobs
    if batch.behaviour_logprobs is not None:
        advantages, returns = compute_vtrace(
            batch.rewards, batch.values, next_values, batch.terminations, dones,
            batch.logprobs - batch.behaviour_logprobs, gamma=config.gamma, gae_lambda=config.gae_lambda,
            rho_bar=config.vtrace_rho_bar, c_bar=config.vtrace_c_bar)
        old_logprobs = batch.behaviour_logprobs  # the ratio is the (clipped) importance weight of each action
    else:
        advantages, returns = compute_gae(batch.rewards, batch.values, next_values, batch.terminations, dones,
                                          gamma=config.gamma, gae_lambda=config.gae_lambda)

    # Flatten the batch: [T, N, ...] -> [T * N, ...].
    obs_shape = batch.obs.shape[2:]
    b_obs = torch.from_numpy(normalizer(batch.obs.reshape(-1, *obs_shape)))
    b_actions = torch.from_numpy(batch.actions.reshape(-1, *batch.actions.shape[2:]))
    b_logprobs = torch.from_numpy(np.ascontiguousarray(old_logprobs, dtype=np.float32).reshape(-1))
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
            newlogprob, entropy, newvalue = evaluate(agent, b_obs[mb_inds], b_actions[mb_inds])

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


class PPOLearner:
    """What PPO learns and carries from one update to the next, built and restored in one place.

    The agent, its Adam optimiser, the observation normaliser, the reward scaler and the recent episode returns:
    one construction for the single learner (`cloud.runs._train`) and every hybrid unit (`cloud.hybrid`), so both
    build (and resume) the same networks with the same optimiser settings, and checkpoint the same fields.
    """

    def __init__(self, obs_space: Any, action_space: Any, config: PPOConfig,
                 state: dict[str, Any] | None = None) -> None:
        """Build the learner for these gymnasium spaces; restore every part from `state` when given.

        A checkpoint from before reward scaling has no scaler state: its scaler starts fresh.
        """
        import collections

        import gymnasium as gym
        import torch

        from cloud.learners._agent import ObsNormalizer, RewardScaler, check_action_space
        from cloud.learners._cnn import make_agent, uses_cnn

        check_action_space(config, action_space)
        discrete = isinstance(action_space, gym.spaces.Discrete)
        action_dim = int(action_space.n) if discrete else int(np.prod(action_space.shape or ()))
        self.config = config
        self.agent = make_agent(tuple(obs_space.shape), obs_space.dtype, action_dim=action_dim, discrete=discrete,
                                config=config)
        # A CNN scales pixels to [0, 1] inside its graph: running pixel statistics would only cost time.
        image = uses_cnn(config.network, tuple(obs_space.shape), obs_space.dtype)
        # fused: one kernel for all parameters; on these tiny nets it cuts ~25% of the CPU time of a gradient step.
        self.optimizer = torch.optim.Adam(self.agent.parameters(), lr=config.learning_rate, eps=1e-5, fused=True)
        self.normalizer = ObsNormalizer(obs_space.shape, clip=config.obs_clip,
                                        enabled=config.normalize_obs and not image)
        self.reward_scaler = RewardScaler(gamma=config.gamma, clip=config.reward_clip, enabled=config.normalize_reward)
        self.recent: collections.deque[float] = collections.deque(maxlen=100)
        """Returns of the latest episodes (the moving mean that decides "solved" reads the last 20)."""
        if state:
            if "reward_scaler" in state:
                self.reward_scaler.load_state_dict(state["reward_scaler"])
            self.agent.load_state_dict(state["agent"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.normalizer.load_state_dict(state["normalizer"])
            self.recent.extend(float(r) for r in state["recent_returns"])

    @property
    def learning_rate(self) -> float:
        """The optimiser's current step size."""
        return float(self.optimizer.param_groups[0]["lr"])

    def anneal(self, version: int, num_updates: int) -> None:
        """Set the learning rate of update `version` of `num_updates`: linear decay to zero with ``anneal_lr``."""
        if self.config.anneal_lr:
            self.optimizer.param_groups[0]["lr"] = max(0.0, 1.0 - version / num_updates) * self.config.learning_rate

    def update(self, batch: RolloutBatch, *, generator: np.random.Generator,
               reduce_gradients: Callable[[], None] | None = None) -> dict[str, float]:
        """One PPO update on `batch` (rewards already scaled as the update should see them); its loss metrics."""
        return ppo_update(self.agent, self.optimizer, self.normalizer, batch, self.config, generator=generator,
                          reduce_gradients=reduce_gradients)

    def state_dict(self) -> dict[str, Any]:
        """The learned state, cloned (tensors detached), as a checkpoint holds it."""
        from cloud.learners._state import clone_state

        state: dict[str, Any] = clone_state({
            "agent": self.agent.state_dict(), "optimizer": self.optimizer.state_dict(),
            "normalizer": self.normalizer.state_dict(), "reward_scaler": self.reward_scaler.state_dict(),
            "recent_returns": list(self.recent)})
        return state
