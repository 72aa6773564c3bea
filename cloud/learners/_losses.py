"""PPO's pure math: generalised advantage estimation and the three loss terms, with no state.

Everything here is a function of its arguments only, so each piece is unit-tested against values
computed by hand (tests/cloud/test_ppo_losses.py). Names follow the PPO paper and CleanRL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def compute_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminations: np.ndarray,
    dones: np.ndarray,
    *,
    gamma: float,
    gae_lambda: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(advantages, returns)`` by generalised advantage estimation, all arrays ``[T, N]``.

    Truncation is handled by the caller through `next_values`: ``next_values[t]`` is the value of
    the state *after* step ``t`` -- ``values[t + 1]`` inside an episode, the value of the real final
    observation where a time limit cut the episode, and anything (it is masked) where the MDP
    terminated. `terminations` stops bootstrapping; `dones` (terminated or truncated) stops the
    advantage from flowing back across an episode boundary.

    Args:
        rewards: Reward of each step.
        values: ``V(s_t)`` under the policy that acted.
        next_values: ``V(s_{t+1})`` as described above.
        terminations: True where the MDP ended at step ``t`` (no bootstrap).
        dones: True where the episode ended at step ``t`` for any reason.
        gamma: Discount factor.
        gae_lambda: GAE's lambda; 1 gives Monte-Carlo returns, 0 one-step TD.
    """
    num_steps = rewards.shape[0]
    nextnonterminal = 1.0 - terminations.astype(np.float32)
    nextnotdone = 1.0 - dones.astype(np.float32)
    advantages = np.zeros_like(rewards, dtype=np.float32)
    lastgaelam = np.zeros(rewards.shape[1:], dtype=np.float32)
    for t in reversed(range(num_steps)):
        delta = rewards[t] + gamma * next_values[t] * nextnonterminal[t] - values[t]
        lastgaelam = delta + gamma * gae_lambda * nextnotdone[t] * lastgaelam
        advantages[t] = lastgaelam
    returns = advantages + values
    return advantages, returns.astype(np.float32)


def compute_vtrace(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminations: np.ndarray,
    dones: np.ndarray,
    log_rhos: np.ndarray,
    *,
    gamma: float,
    gae_lambda: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(advantages, returns)`` of experience acted by another policy: V-trace in the shape of GAE.

    V-trace (Espeholt et al. 2018, IMPALA) corrects n-step returns for the policy that acted (``mu``) with truncated
    importance weights of the learner's policy (``pi``): with ``ratio_t = exp(log_rhos[t]) = pi(a_t|s_t) /
    mu(a_t|s_t)``, ``rho_t = min(rho_bar, ratio_t)`` and ``c_t = gae_lambda * min(c_bar, ratio_t)``,

        delta_t = r_t + gamma * V(s_{t+1}) * (1 - term_t) - V(s_t)
        D_t     = rho_t * delta_t + gamma * c_t * (1 - done_t) * D_{t+1}     (= v_t - V(s_t), v_t the V-trace target)
        A_t     = delta_t + gamma * c_t * (1 - done_t) * D_{t+1}             (the advantage of the action at t)

    ``returns = v_t = V(s_t) + D_t`` are the value targets. `A_t` leaves out the weight of the action taken at
    ``t`` itself: the policy loss applies it (PPO's ratio against ``mu``, clipped: a truncated importance weight);
    the later steps' weights reach `A_t` through the traces ``c``. On-policy data (``log_rhos = 0``) with
    ``rho_bar, c_bar >= 1`` gives `compute_gae`'s advantages and returns.

    Args:
        rewards: Reward of each step.
        values: ``V(s_t)`` under the learner's policy.
        next_values: ``V(s_{t+1})``, as for `compute_gae`.
        terminations: True where the MDP ended at step ``t`` (no bootstrap).
        dones: True where the episode ended at step ``t`` for any reason.
        gamma: Discount factor.
        gae_lambda: Lambda of the traces (1: full V-trace returns).
        log_rhos: ``log pi(a_t|s_t) - log mu(a_t|s_t)`` of each step, ``[T, N]``.
        rho_bar: Truncation of each step's importance weight in the value targets.
        c_bar: Truncation of the traces that carry later TD errors back.
    """
    ratios = np.exp(np.minimum(log_rhos.astype(np.float64), 50.0))
    rhos = np.minimum(rho_bar, ratios).astype(np.float32)
    cs = (gae_lambda * np.minimum(c_bar, ratios)).astype(np.float32)
    nextnonterminal = 1.0 - terminations.astype(np.float32)
    nextnotdone = 1.0 - dones.astype(np.float32)
    advantages = np.zeros_like(rewards, dtype=np.float32)
    corrections = np.zeros_like(rewards, dtype=np.float32)
    later = np.zeros(rewards.shape[1:], dtype=np.float32)  # D_{t+1}
    for t in reversed(range(rewards.shape[0])):
        delta = rewards[t] + gamma * next_values[t] * nextnonterminal[t] - values[t]
        carried = gamma * cs[t] * nextnotdone[t] * later
        advantages[t] = delta + carried
        later = rhos[t] * delta + carried
        corrections[t] = later
    returns = corrections + values
    return advantages, returns.astype(np.float32)


def normalize_advantages(mb_advantages: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Return the advantages shifted to mean 0 and scaled to standard deviation 1 (per minibatch)."""
    if mb_advantages.numel() < 2:
        return mb_advantages - mb_advantages.mean()
    return (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + eps)


def policy_loss(
    newlogprob: torch.Tensor, oldlogprob: torch.Tensor, mb_advantages: torch.Tensor, *, clip_coef: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return ``(pg_loss, approx_kl, clipfrac)``: PPO's clipped surrogate objective, negated for descent.

    ``approx_kl`` is the low-variance estimator ``E[(ratio - 1) - log ratio]``; ``clipfrac`` the
    fraction of samples whose ratio left ``[1 - clip_coef, 1 + clip_coef]``. Both are diagnostics
    (no gradient).
    """
    import torch

    logratio = newlogprob - oldlogprob
    ratio = logratio.exp()
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1.0 - clip_coef, 1.0 + clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()
    with torch.no_grad():
        approx_kl = ((ratio - 1.0) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    return pg_loss, approx_kl, clipfrac


def value_loss(
    newvalue: torch.Tensor,
    oldvalue: torch.Tensor,
    mb_returns: torch.Tensor,
    *,
    clip_coef: float | None,
) -> torch.Tensor:
    """Return the value loss ``0.5 * E[(V - R)^2]``, clipped around the old value when `clip_coef` is set.

    With clipping (PPO2 / CleanRL ``clip_vloss``), the loss is the larger of the unclipped and the
    clipped squared errors, so one update cannot move a value estimate further than `clip_coef`
    for free.
    """
    import torch

    v_loss_unclipped = (newvalue - mb_returns) ** 2
    if clip_coef is None:
        return 0.5 * v_loss_unclipped.mean()
    v_clipped = oldvalue + torch.clamp(newvalue - oldvalue, -clip_coef, clip_coef)
    v_loss_clipped = (v_clipped - mb_returns) ** 2
    return 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()


def total_loss(
    pg_loss: torch.Tensor, v_loss: torch.Tensor, entropy_loss: torch.Tensor, *, ent_coef: float, vf_coef: float
) -> torch.Tensor:
    """Return the PPO objective to minimise: ``pg_loss - ent_coef * entropy + vf_coef * v_loss``."""
    return pg_loss - ent_coef * entropy_loss + vf_coef * v_loss
