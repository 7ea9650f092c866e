"""PPO: GAE against a hand-computed example, bootstrapping, and the clipped value loss."""

import pytest
import torch

from taskrl.algos.ppo import gae, value_loss


def test_gae_matches_hand_computed_example() -> None:
    # delta_2 = 1 - 0.7 = 0.3; delta_1 = 0.9*0.7 - 0.6 = 0.03; delta_0 = 0.9*0.6 - 0.5 = 0.04
    # A_2 = 0.3; A_1 = 0.03 + 0.9*0.8*0.3 = 0.246; A_0 = 0.04 + 0.72*0.246 = 0.21712
    advantages, returns = gae([0.0, 0.0, 1.0], [0.5, 0.6, 0.7], gamma=0.9, lam=0.8)
    assert advantages.tolist() == pytest.approx([0.21712, 0.246, 0.3])
    assert returns.tolist() == pytest.approx([0.71712, 0.846, 1.0])


def test_gae_bootstraps_a_truncated_episode() -> None:
    advantages, _ = gae([0.0, 1.0], [0.5, 0.5], gamma=0.9, lam=0.8, bootstrap_value=2.0)
    # delta_1 = 1 + 0.9*2 - 0.5 = 2.3; delta_0 = 0.9*0.5 - 0.5 = -0.05; A_0 = -0.05 + 0.72*2.3 = 1.606
    assert advantages.tolist() == pytest.approx([1.606, 2.3])


def test_gae_with_gamma_and_lambda_one_is_monte_carlo() -> None:
    _, returns = gae([0.0, 0.0, 0.0, 1.0], [0.3, -0.2, 0.9, 0.1], gamma=1.0, lam=1.0)
    assert returns.tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="equal length"):
        gae([0.0, 1.0], [0.0], gamma=1.0, lam=1.0)


def test_value_loss_golden_values() -> None:
    values, old, returns = torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]), torch.tensor([2.0, 0.0])
    # row 0: max((1-2)^2, (0.7-2)^2) / 2 = 0.845; row 1: max(0, (0.3-0)^2) / 2 = 0.045
    assert torch.allclose(value_loss(values, old, returns, clip=0.2), torch.tensor([0.845, 0.045]))
    assert torch.allclose(value_loss(values, old, returns, clip=0.0), torch.tensor([0.5, 0.0]))
