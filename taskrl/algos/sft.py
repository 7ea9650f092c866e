"""SFT / behaviour cloning on filtered trajectories: maximise log pi of the sampled (loss_mask = 1) tokens.

The seed's cold start is BC -> SFT -> RL: clone an expert (an env's ``scripted_rule`` played token-exactly),
or the policy's own successful episodes (rejection sampling), then hand over to RL. Only tokens the policy
(or the expert in its place) wrote are trained; prompts and tool output never are.

Where this departs from common practice:
- Token-level normalisation over the optimizer batch (every sampled token weighs the same), like the RL losses,
  rather than a per-sequence mean.
- Filtering is by the trajectory's total reward (``min_reward``); errored and untrainable episodes never pass.
  ``keep="best"`` keeps at most one sample per group (``group_id``): the highest-reward one, and only when it beats
  its group's mean (expert iteration / best-of-K; the samples GRPO would push up most). It is the rejection
  sampling control for a graded reward, where a fixed threshold keeps nothing early and everything later.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from statistics import fmean

from taskrl.algos.algorithm import AlgoConfig, Algorithm
from taskrl.algos.losses import Tensor
from taskrl.types import Trajectory


@dataclass
class SFTConfig(AlgoConfig):
    """``[algo]`` of SFT: nothing of its own (which trajectories it clones is the trainer's ``sft_min_reward`` and
    ``sft_keep``)."""

    name: str = "sft"


KEEP_MODES = ("all", "best")
"""``select``'s ``keep``: every trajectory that passes, or each group's best one above its group mean."""


def select(trajectories: Iterable[Trajectory], *, min_reward: float, keep: str = "all") -> list[Trajectory]:
    """Trajectories worth cloning: trainable, no error, at least one sampled token, reward >= ``min_reward``.

    ``keep="best"``: of those, only each group's highest-reward trajectory (the first of ties), and only when its
    reward is above the mean of its whole group (usable members); a trajectory without ``group_id`` is its own
    group and never beats its own mean, so it is never kept."""
    if keep not in KEEP_MODES:
        raise ValueError(f"keep={keep!r}: choose one of {', '.join(KEEP_MODES)}")
    usable = [t for t in trajectories if t.trainable and t.error is None and t.num_sampled_tokens > 0]
    passed = [t for t in usable if t.reward >= min_reward]
    if keep == "all":
        return passed
    groups: dict[str, list[Trajectory]] = {}
    for t in usable:
        if t.group_id is not None:
            groups.setdefault(t.group_id, []).append(t)
    best: dict[str, Trajectory] = {}
    for t in passed:
        if t.group_id is None or t.reward <= fmean(m.reward for m in groups[t.group_id]):
            continue
        if t.group_id not in best or t.reward > best[t.group_id].reward:
            best[t.group_id] = t
    return [t for t in passed if best.get(t.group_id or "") is t]


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
