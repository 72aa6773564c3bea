"""GAE and PPO's loss terms against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cloud.learners._losses import (
    compute_gae,
    compute_vtrace,
    normalize_advantages,
    policy_loss,
    total_loss,
    value_loss,
)


def test_gae_one_env_no_episode_end() -> None:
    # gamma 0.5, lambda 0.5: deltas d_t = r_t + 0.5 V_{t+1} - V_t
    rewards = np.array([[1.0], [0.0], [2.0]], dtype=np.float32)
    values = np.array([[1.0], [2.0], [0.0]], dtype=np.float32)
    next_values = np.array([[2.0], [0.0], [4.0]], dtype=np.float32)
    no = np.zeros((3, 1), dtype=bool)
    adv, ret = compute_gae(rewards, values, next_values, no, no, gamma=0.5, gae_lambda=0.5)
    # d = [1 + 1 - 1, 0 + 0 - 2, 2 + 2 - 0] = [1, -2, 4]
    # A2 = 4; A1 = -2 + 0.25 * 4 = -1; A0 = 1 + 0.25 * -1 = 0.75
    np.testing.assert_allclose(adv[:, 0], [0.75, -1.0, 4.0])
    np.testing.assert_allclose(ret[:, 0], [1.75, 1.0, 4.0])


def test_gae_termination_drops_bootstrap_and_cuts_the_trace() -> None:
    rewards = np.array([[1.0], [1.0]], dtype=np.float32)
    values = np.array([[0.5], [0.5]], dtype=np.float32)
    next_values = np.array([[9.0], [3.0]], dtype=np.float32)  # 9.0 must be ignored: step 0 terminated
    terminations = np.array([[True], [False]])
    adv, _ = compute_gae(rewards, values, next_values, terminations, terminations, gamma=0.9, gae_lambda=0.95)
    # A1 = 1 + 0.9 * 3 - 0.5 = 3.2; A0 = 1 - 0.5 = 0.5 (no bootstrap, no trace from A1)
    np.testing.assert_allclose(adv[:, 0], [0.5, 3.2], rtol=1e-6)


def test_gae_truncation_bootstraps_but_cuts_the_trace() -> None:
    rewards = np.array([[1.0], [1.0]], dtype=np.float32)
    values = np.array([[0.5], [0.5]], dtype=np.float32)
    next_values = np.array([[2.0], [3.0]], dtype=np.float32)  # 2.0 = V(real final obs) of step 0
    terminations = np.zeros((2, 1), dtype=bool)
    dones = np.array([[True], [False]])
    adv, _ = compute_gae(rewards, values, next_values, terminations, dones, gamma=0.9, gae_lambda=0.95)
    # A1 = 1 + 2.7 - 0.5 = 3.2; A0 = 1 + 0.9 * 2 - 0.5 = 2.3 (bootstrapped, trace cut)
    np.testing.assert_allclose(adv[:, 0], [2.3, 3.2], rtol=1e-6)


def test_gae_lambda_one_is_the_discounted_return_minus_value() -> None:
    rewards = np.ones((4, 2), dtype=np.float32)
    values = np.zeros((4, 2), dtype=np.float32)
    next_values = np.zeros((4, 2), dtype=np.float32)
    no = np.zeros((4, 2), dtype=bool)
    adv, _ = compute_gae(rewards, values, next_values, no, no, gamma=0.5, gae_lambda=1.0)
    np.testing.assert_allclose(adv[:, 1], [1.875, 1.75, 1.5, 1.0])


def test_policy_loss_clips_the_ratio() -> None:
    old = torch.zeros(3)
    new = torch.log(torch.tensor([1.5, 0.5, 1.0]))
    adv = torch.tensor([1.0, 1.0, -2.0])
    pg_loss, approx_kl, clipfrac = policy_loss(new, old, adv, clip_coef=0.2)
    # per sample max(-A r, -A clip(r)): [-1.2, -0.5, 2.0] -> mean 0.1
    assert float(pg_loss) == pytest.approx(0.1, abs=1e-6)
    expected_kl = ((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5)) + 0.0) / 3
    assert float(approx_kl) == pytest.approx(expected_kl, rel=1e-5)
    assert float(clipfrac) == pytest.approx(2 / 3)


def test_value_loss_unclipped_and_clipped() -> None:
    new = torch.tensor([1.0, 3.0])
    old = torch.tensor([0.0, 0.0])
    ret = torch.tensor([2.0, 0.0])
    # unclipped: 0.5 * mean([1, 9]) = 2.5
    assert float(value_loss(new, old, ret, clip_coef=None)) == pytest.approx(2.5)
    # clipped values [0.5, 0.5] -> errors [2.25, 0.25]; max with [1, 9] -> [2.25, 9] -> 0.5 * 5.625
    assert float(value_loss(new, old, ret, clip_coef=0.5)) == pytest.approx(2.8125)


def test_normalize_advantages_and_total_loss() -> None:
    adv = normalize_advantages(torch.tensor([1.0, 3.0]))
    assert adv.tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)], rel=1e-6)
    assert normalize_advantages(torch.tensor([5.0])).tolist() == [0.0]
    loss = total_loss(torch.tensor(1.0), torch.tensor(2.0), torch.tensor(0.5), ent_coef=0.1, vf_coef=0.5)
    assert float(loss) == pytest.approx(1.0 - 0.05 + 1.0)


def test_vtrace_on_policy_is_gae() -> None:
    rng = np.random.default_rng(3)
    t, n = 9, 4
    rewards, values, next_values = (rng.normal(size=(t, n)).astype(np.float32) for _ in range(3))
    terminations = rng.random((t, n)) < 0.15
    dones = terminations | (rng.random((t, n)) < 0.1)
    adv, ret = compute_gae(rewards, values, next_values, terminations, dones, gamma=0.98, gae_lambda=0.8)
    vadv, vret = compute_vtrace(rewards, values, next_values, terminations, dones, np.zeros((t, n), np.float32),
                                gamma=0.98, gae_lambda=0.8)
    np.testing.assert_allclose(vadv, adv, atol=1e-5)
    np.testing.assert_allclose(vret, ret, atol=1e-5)


def test_vtrace_by_hand_truncates_the_weights_and_the_traces() -> None:
    # ratios 2 and 0.5: rho = (1, 0.5), c = (1, 0.5); delta = 1 + 0.9 * 0.5 - 0.5 = 0.95 at both steps.
    # t=1: A = 0.95, D = 0.5 * 0.95 = 0.475.  t=0: A = 0.95 + 0.9 * 1 * 0.475 = 1.3775 = D.
    adv, ret = compute_vtrace(np.ones((2, 1), np.float32), np.full((2, 1), 0.5, np.float32),
                              np.full((2, 1), 0.5, np.float32), np.zeros((2, 1), bool), np.zeros((2, 1), bool),
                              np.log(np.array([[2.0], [0.5]], np.float32)), gamma=0.9, gae_lambda=1.0)
    np.testing.assert_allclose(adv.ravel(), [1.3775, 0.95], rtol=1e-6)
    np.testing.assert_allclose(ret.ravel(), [1.8775, 0.975], rtol=1e-6)
    # a record acted by a policy the learner's finds absurdly unlikely: the weights stay bounded
    adv, ret = compute_vtrace(np.ones((2, 1), np.float32), np.zeros((2, 1), np.float32), np.zeros((2, 1), np.float32),
                              np.zeros((2, 1), bool), np.zeros((2, 1), bool), np.full((2, 1), 400.0, np.float32),
                              gamma=0.9, gae_lambda=1.0)
    assert np.isfinite(adv).all() and np.isfinite(ret).all() and ret.max() <= 1.9 + 1e-6
