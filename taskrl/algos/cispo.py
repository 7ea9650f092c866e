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
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from taskrl.algos import grpo
from taskrl.algos.algorithm import Algorithm
from taskrl.algos.losses import Tensor

if TYPE_CHECKING:
    from taskrl.training.config import TrainConfig


def policy_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, *, eps_low: float, eps_high: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token CISPO loss; stats: ``clipfrac`` (tokens whose IS weight hit a bound)."""
    ratio = (logprobs - old_logprobs).detach().exp()
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = -weight * advantages * logprobs
    return loss, {"clipfrac": (weight != ratio).float()}


def token_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, config: TrainConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """``policy_loss`` with the config's IS-weight bounds."""
    return policy_loss(logprobs, old_logprobs, advantages, eps_low=config.cispo_eps_low, eps_high=config.cispo_eps_high)


ALGORITHM = Algorithm(
    "cispo", token_loss, advantages=grpo.advantages, min_group_size=2,
    config_fields=(*grpo.GROUP_FIELDS, "cispo_eps_low", "cispo_eps_high"),
)  # fmt: skip
