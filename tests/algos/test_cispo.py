"""CISPO: the clipped, detached IS weight on every token; unlike PPO, clipped tokens keep a gradient."""

import torch

from taskrl.algos.cispo import policy_loss


def test_cispo_golden_values_and_every_token_keeps_a_gradient() -> None:
    ratios = torch.tensor([1.5, 0.5, 1.1, 0.7])
    logprobs = ratios.log().requires_grad_()
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, stats = policy_loss(logprobs, torch.zeros(4), advantages, eps_low=0.2, eps_high=0.2)
    weights = torch.tensor([1.2, 0.8, 1.1, 0.8])  # clip(ratio, 0.8, 1.2)
    assert torch.allclose(loss, -weights * advantages * ratios.log())
    assert stats["clipfrac"].tolist() == [1.0, 1.0, 0.0, 1.0]
    loss.sum().backward()
    assert torch.allclose(logprobs.grad, -weights * advantages)  # the weight is a constant: sg(...)
    assert (logprobs.grad != 0).all()
