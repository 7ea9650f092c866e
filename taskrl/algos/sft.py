"""SFT / behaviour cloning on filtered trajectories: maximise log pi of the sampled (loss_mask = 1) tokens.

The seed's cold start is BC -> SFT -> RL: clone an expert (an env's ``scripted_rule`` played token-exactly),
or the policy's own successful episodes (rejection sampling), then hand over to RL. Only tokens the policy
(or the expert in its place) wrote are trained; prompts and tool output never are.

Where this departs from common practice:
- Token-level normalisation over the optimizer batch (every sampled token weighs the same), like the RL losses,
  rather than a per-sequence mean.
- Filtering is by the trajectory's total reward (``min_reward``); errored and untrainable episodes never pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from taskrl.algos.algorithm import AlgoConfig, Algorithm
from taskrl.algos.losses import Tensor
from taskrl.types import Trajectory


@dataclass
class SFTConfig(AlgoConfig):
    """``[algo]`` of SFT: nothing of its own (which trajectories it clones is the trainer's ``sft_min_reward``)."""

    name: str = "sft"


def select(trajectories: Iterable[Trajectory], *, min_reward: float) -> list[Trajectory]:
    """Trajectories worth cloning: trainable, no error, at least one sampled token, reward >= ``min_reward``."""
    return [
        t
        for t in trajectories
        if t.trainable and t.error is None and t.num_sampled_tokens > 0 and t.reward >= min_reward
    ]


def nll_loss(logprobs: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token negative log-likelihood of the sampled tokens."""
    return -logprobs, {}


def token_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, config: AlgoConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """``nll_loss``: imitation has no ratio and no advantage, so ``old_logprobs`` and ``advantages`` play no part."""
    return nll_loss(logprobs)


ALGORITHM = Algorithm("sft", token_loss, config=SFTConfig)
"""Imitation (no ``advantages``): the learner selects trajectories with ``select`` and trains every sampled token."""
