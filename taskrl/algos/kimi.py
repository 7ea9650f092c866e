"""Kimi K2.5 token masking: a policy-gradient loss that zeroes the gradient of tokens that moved too far.

With log-ratio d_t = log pi(token_t) - log pi_old(token_t) and mask m_t = [alpha <= d_t <= beta] (no gradient
through the mask):

    loss_t = m_t * (-A * d_t + tau * d_t^2)

Unlike PPO's clip, the mask applies for either sign of the advantage: a token outside [alpha, beta] gets no
gradient at all, whether the update would push it further or pull it back. The optional tau * d^2 term is the
Kimi K1.5 mirror-descent regulariser that keeps the new policy near the old one.

Where this departs from the papers (Kimi K1.5, 2025; Kimi K2.5, 2026):
- K1.5 writes the objective as a squared loss (A - tau_paper * d)^2 over whole sequences; its gradient equals
  ours per token with tau = tau_paper / 2 (up to a constant factor absorbed by the learning rate).
- Defaults alpha = -log 2, beta = log 2 (ratio in [0.5, 2]) and tau = 0; Kimi did not publish theirs.
- Advantages are GRPO's group-relative ones (r - mean of the group), normalised per token over the batch.

Settings: ``KimiConfig`` (TOML ``[algo]`` with ``name = "kimi"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from taskrl.algos import grpo
from taskrl.algos.algorithm import Algorithm
from taskrl.algos.losses import Tensor
from taskrl.validate import finite_at_least, require


@dataclass
class KimiConfig(grpo.GroupConfig):
    """``[algo]`` of Kimi token masking (with GRPO's group-relative advantage settings)."""

    name: str = "kimi"
    alpha: float = -math.log(2.0)
    """Tokens whose log-ratio is below this get no gradient."""
    beta: float = math.log(2.0)
    """Tokens whose log-ratio is above this get no gradient."""
    tau: float = 0.0
    """Weight of the tau * log-ratio^2 regulariser."""

    def __post_init__(self) -> None:
        require("algo", "must be >= 0", finite_at_least(0), tau=self.tau)
        if not self.alpha < self.beta:
            raise ValueError(f"algo.alpha must be below algo.beta ({self.beta}), got {self.alpha!r}")


def policy_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, *, alpha: float, beta: float, tau: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token masked loss; stats: ``clipfrac`` (share of tokens masked out)."""
    log_ratio = logprobs - old_logprobs
    detached = log_ratio.detach()
    inside = ((detached >= alpha) & (detached <= beta)).to(logprobs.dtype)
    loss = inside * (-advantages * log_ratio + tau * log_ratio**2)
    return loss, {"clipfrac": 1.0 - inside}


def token_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, config: KimiConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """``policy_loss`` with the config's mask bounds and regulariser."""
    return policy_loss(logprobs, old_logprobs, advantages, alpha=config.alpha, beta=config.beta, tau=config.tau)


ALGORITHM = Algorithm("kimi", token_loss, advantages=grpo.advantages, min_group_size=2, config=KimiConfig)
