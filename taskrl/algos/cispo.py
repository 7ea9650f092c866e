"""CISPO: clipped importance-sampling-weight policy optimisation (MiniMax-M1; used by Chroma's Context-1).

loss_t = -sg(clip(ratio_t, 1 - eps_low, 1 + eps_high)) * A * log pi(token_t)

The IS weight is clipped and detached, so every token keeps a gradient (PPO's clip zeroes the gradient of
clipped tokens, which in long reasoning are often the rare "fork" tokens that matter). Advantages are GRPO's
group-relative ones (see ``grpo.group_advantages``).

Where this departs from the paper (MiniMax-M1, 2025):
- Defaults: no lower bound in effect (eps_low = 1.0, ratio >= 0 anyway) and eps_high = 2.0 (weight <= 3);
  MiniMax tuned eps_high and did not publish it.
- Token-level normalisation over the optimizer batch, as in the paper; no KL unless the learner adds one.
- The reported ``clipfrac`` counts tokens whose weight was clipped (their gradient is scaled, not zeroed).

Settings: ``CISPOConfig`` (TOML ``[algo]`` with ``name = "cispo"``).
"""

from __future__ import annotations

from dataclasses import dataclass

from taskrl.algos import grpo
from taskrl.algos.algorithm import Algorithm
from taskrl.algos.losses import Tensor
from taskrl.validate import finite_at_least, require


@dataclass
class CISPOConfig(grpo.GroupConfig):
    """``[algo]`` of CISPO (with GRPO's group-relative advantage settings)."""

    name: str = "cispo"
    eps_low: float = 1.0
    """IS-weight clip below 1 (1.0 = no lower bound)."""
    eps_high: float = 2.0
    """IS-weight clip above 1."""

    def __post_init__(self) -> None:
        require("algo", "must be >= 0", finite_at_least(0), eps_low=self.eps_low, eps_high=self.eps_high)


def policy_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, *, eps_low: float, eps_high: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token CISPO loss; stats: ``clipfrac`` (tokens whose IS weight hit a bound)."""
    ratio = (logprobs - old_logprobs).detach().exp()
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = -weight * advantages * logprobs
    return loss, {"clipfrac": (weight != ratio).float()}


def token_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, config: CISPOConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """``policy_loss`` with the config's IS-weight bounds."""
    return policy_loss(logprobs, old_logprobs, advantages, eps_low=config.eps_low, eps_high=config.eps_high)


ALGORITHM = Algorithm("cispo", token_loss, advantages=grpo.advantages, min_group_size=2, config=CISPOConfig)
