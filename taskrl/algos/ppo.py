"""PPO with a value head: GAE(gamma, lambda) over sampled tokens, clipped surrogate, clipped value loss.

The time steps are the sampled tokens of a trajectory, in order across its segments (tool output and other
forced tokens are the environment's transitions, not steps). The episode reward arrives at the last sampled
token; a k1 KL penalty, when enabled, is a per-token reward. A terminated episode bootstraps with 0; a
truncated one with the value of the state after its last token (STYLE: terminated vs truncated).

Where this departs from the paper (Schulman et al. 2017) and common RLHF practice:
- The value head is a linear layer on the policy's last hidden state (shared trunk), not a separate critic
  model: half the memory, and the one backward pass trains both.
- gamma applies per token; the default is 1.0 (the reward comes at the end; per-token discounting of long
  answers would erase it). The seed's gamma 0.9/0.99 are per-turn values: set ``gamma`` accordingly when a
  per-token horizon is short.
- Advantages are not whitened per batch (whitening would shift the sign of a batch that is all failures).
- Loss normalisation is per token over the optimizer batch, as in ``grpo``; the token loss is GRPO's
  (``losses.clipped_token_loss``).

Settings: ``PPOConfig`` (TOML ``[algo]`` with ``name = "ppo"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from taskrl.algos.algorithm import Advantages, AlgoConfig, Algorithm, TrajectoryInput, per_sequence
from taskrl.algos.grpo import check_clip_range
from taskrl.algos.losses import Tensor, clipped_token_loss
from taskrl.validate import finite_at_least, require


@dataclass
class PPOConfig(AlgoConfig):
    """``[algo]`` of PPO."""

    name: str = "ppo"
    gamma: float = 1.0
    """Per-token discount."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_eps_low: float = 0.2
    """Ratio clip below 1."""
    clip_eps_high: float = 0.2
    """Ratio clip above 1."""
    vf_coef: float = 0.5
    """Value loss weight."""
    vf_clip: float = 0.2
    """Value clip range around the old values; 0 disables."""

    def __post_init__(self) -> None:
        check_clip_range(self.clip_eps_low, self.clip_eps_high)
        require("algo", "must be >= 0", finite_at_least(0), vf_coef=self.vf_coef, vf_clip=self.vf_clip)
        for name, value in (("gamma", self.gamma), ("gae_lambda", self.gae_lambda)):
            if not 0 <= value <= 1:
                raise ValueError(f"algo.{name} must be in [0, 1], got {value!r}")


def gae(
    rewards: Sequence[float] | Tensor,
    values: Sequence[float] | Tensor,
    *,
    gamma: float,
    lam: float,
    bootstrap_value: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over one trajectory's steps; returns (advantages, returns).

    delta_t = r_t + gamma * V_{t+1} - V_t (V_T = ``bootstrap_value``), A_t = delta_t + gamma * lam * A_{t+1},
    returns_t = A_t + V_t (the value targets).
    """
    r = torch.as_tensor(rewards, dtype=torch.float64)
    v = torch.as_tensor(values, dtype=torch.float64)
    if r.shape != v.shape or r.ndim != 1:
        raise ValueError(f"gae: rewards and values must be 1-D of equal length, got {tuple(r.shape)}, {tuple(v.shape)}")
    advantages = torch.zeros_like(r)
    next_value, running = float(bootstrap_value), 0.0
    for t in range(len(r) - 1, -1, -1):
        delta = float(r[t]) + gamma * next_value - float(v[t])
        running = delta + gamma * lam * running
        advantages[t] = running
        next_value = float(v[t])
    return advantages.float(), (advantages + v).float()


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, *, clip: float) -> Tensor:
    """Per-token 0.5 * max((V - R)^2, (V_clipped - R)^2), V_clipped = old + clamp(V - old, -clip, clip).

    ``clip`` <= 0 gives the plain squared error.
    """
    unclipped = (values - returns) ** 2
    if clip <= 0:
        return 0.5 * unclipped
    clipped = (old_values + (values - old_values).clamp(-clip, clip) - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped)


def advantages(trajectories: Sequence[TrajectoryInput], config: PPOConfig) -> Advantages:
    """GAE over each trajectory's sampled tokens in order: the reward at the last token, minus the KL penalty
    at every token (kl="k1_reward"), bootstrapped from ``bootstrap_value``."""
    per_token: list[list[Tensor] | None] = []
    returns: list[list[Tensor] | None] = []
    for traj in trajectories:
        if not traj.sizes:
            per_token.append([])
            returns.append([])
            continue
        values = torch.cat(traj.values).float().cpu()
        rewards = torch.zeros_like(values)
        if traj.kl:
            rewards -= torch.cat(traj.kl).float().cpu()
        rewards[-1] += traj.reward
        adv, ret = gae(rewards, values, gamma=config.gamma, lam=config.gae_lambda, bootstrap_value=traj.bootstrap_value)
        per_token.append(per_sequence(adv, traj.sizes))
        returns.append(per_sequence(ret, traj.sizes))
    return Advantages(per_token, returns=returns)


def value_token_loss(values: Tensor, old_values: Tensor, returns: Tensor, config: PPOConfig) -> Tensor:
    """``vf_coef`` x ``value_loss`` with the config's clip (the term the learner adds to the loss)."""
    return config.vf_coef * value_loss(values, old_values, returns, clip=config.vf_clip)


ALGORITHM = Algorithm(
    "ppo", clipped_token_loss, advantages=advantages, value_loss=value_token_loss, config=PPOConfig
)  # fmt: skip
