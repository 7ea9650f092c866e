"""GRPO: group-relative advantages (golden values, zero-variance drop, properties) and the clipped loss."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from taskrl.algos.grpo import group_advantages
from taskrl.algos.losses import clipped_policy_loss as policy_loss


def test_group_advantages_golden_values_and_dropped_groups() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 5.0]
    groups = ["a", "a", "a", "a", "b", "b", None]
    out = group_advantages(rewards, groups)
    assert out.advantages[:4] == [0.5, -0.5, -0.5, 0.5]
    assert out.advantages[4:] == [None, None, None]  # all-equal group and a lone sample carry no signal
    assert (out.groups, out.dropped_groups) == (3, 2)
    normalised = group_advantages(rewards, groups, normalize_std=True, eps=0.0)
    assert normalised.advantages[0] == pytest.approx(0.5 / math.sqrt(1 / 3))  # sample std of (1,0,0,1)
    kept = group_advantages(rewards, groups, drop_zero_variance=False)
    assert kept.advantages[4:] == [0.0, 0.0, 0.0] and kept.dropped_groups == 0


def test_group_advantages_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="3 rewards but 2 group ids"):
        group_advantages([1.0, 2.0, 3.0], ["a", "a"])


@given(
    st.lists(st.floats(-100, 100, allow_nan=False), min_size=2, max_size=8),
    st.floats(-50, 50, allow_nan=False),
)
def test_group_advantages_sum_to_zero_and_ignore_a_shift(rewards: list[float], shift: float) -> None:
    out = group_advantages(rewards, ["g"] * len(rewards))
    if out.dropped_groups:
        assert max(rewards) - min(rewards) <= 1e-12
        return
    assert sum(out.advantages) == pytest.approx(0.0, abs=1e-9)  # type: ignore[arg-type]
    shifted = group_advantages([r + shift for r in rewards], ["g"] * len(rewards))
    for a, b in zip(out.advantages, shifted.advantages, strict=True):
        assert b == pytest.approx(a, abs=1e-6)


def test_clipped_surrogate_golden_values_and_gradients() -> None:
    ratios = torch.tensor([1.5, 0.5, 1.1, 0.7])
    logprobs = ratios.log().requires_grad_()
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, stats = policy_loss(logprobs, torch.zeros(4), advantages, clip_eps_low=0.2, clip_eps_high=0.2)
    assert torch.allclose(loss, torch.tensor([-1.2, -0.5, 1.1, 0.8]))
    assert stats["clipfrac"].tolist() == [1.0, 0.0, 0.0, 1.0]
    loss.sum().backward()
    # d(-r*A)/dlogp = -r*A where the unclipped branch is taken; clipped tokens get no gradient
    assert torch.allclose(logprobs.grad, torch.tensor([0.0, -0.5, 1.1, 0.0]))


def test_clip_higher_widens_only_the_upper_bound() -> None:
    logprobs = torch.tensor([1.25, 0.75]).log()
    loss, _ = policy_loss(logprobs, torch.zeros(2), torch.ones(2), clip_eps_low=0.2, clip_eps_high=0.28)
    assert torch.allclose(loss, torch.tensor([-1.25, -0.75]))


def test_dr_grpo_keeps_a_small_credit_small_and_std_normalisation_blows_it_up() -> None:
    from taskrl.algos.algorithm import TrajectoryInput
    from taskrl.algos.grpo import GRPOConfig, advantages

    # group "credit" differs by a 0.1 valid-call credit; group "fix" by a real fix worth 1.0
    inputs = [TrajectoryInput(reward=r, group_id=g, sizes=[2]) for g, r in
              [("credit", 0.0), ("credit", 0.1), ("fix", 0.0), ("fix", 1.0)]]  # fmt: skip
    size = lambda config: [float(a[0][0]) for a in advantages(inputs, config).per_token]  # noqa: E731
    assert size(GRPOConfig()) == pytest.approx([-0.05, 0.05, -0.5, 0.5])  # Dr. GRPO, the default
    scaled = size(GRPOConfig(normalize_std=True))
    assert scaled[1] == pytest.approx(scaled[3], rel=1e-4)  # the credit weighs as much as the fix
