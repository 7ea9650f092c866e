"""Kimi K2.5 token masking: zero gradient outside [alpha, beta] for both advantage signs; tau * d^2 term."""

import math

import pytest
import torch

from taskrl.algos.kimi import policy_loss


def test_mask_applies_to_both_advantage_signs_and_tau_term() -> None:
    ratios = torch.tensor([1.5, 0.5, 1.1, 0.7])  # log-ratios 0.405, -0.693, 0.095, -0.357
    logprobs = ratios.log().requires_grad_()
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, stats = policy_loss(logprobs, torch.zeros(4), advantages, alpha=-0.3, beta=0.3, tau=0.5)
    d = math.log(1.1)
    assert loss.tolist() == pytest.approx([0.0, 0.0, d + 0.5 * d * d, 0.0])
    assert stats["clipfrac"].tolist() == [1.0, 1.0, 0.0, 1.0]
    loss.sum().backward()
    # token 0 (A > 0, above beta) and token 3 (A < 0, below alpha) are both silenced, unlike PPO's clip
    assert logprobs.grad.tolist() == pytest.approx([0.0, 0.0, 1.0 + 2 * 0.5 * d, 0.0])


def test_inside_the_band_it_is_the_policy_gradient() -> None:
    logprobs = torch.tensor([-1.0, -2.0], requires_grad=True)
    loss, _ = policy_loss(logprobs, logprobs.detach(), torch.tensor([2.0, -1.0]), alpha=-0.5, beta=0.5, tau=0.0)
    loss.sum().backward()
    assert logprobs.grad.tolist() == [-2.0, 1.0]
