"""GRPO: group-relative advantages and the clipped surrogate with token-level normalisation.

K samples per task form a group; each trajectory's advantage is its reward minus the group mean (optionally
divided by the group's standard deviation), shared by every sampled token of the trajectory.

Where this departs from the paper (Shao et al. 2024, DeepSeekMath):
- Std normalisation is off by default (Dr. GRPO, Liu et al. 2025: it over-weights near-solved and
  near-failed groups); ``normalize_std=True`` restores it (sample std, as TRL computes it).
- Loss normalisation is per token over the whole optimizer batch (DAPO), not per sequence then per group:
  long answers are not down-weighted, and micro-batching never changes the gradient.
- Groups whose rewards are all equal carry no signal and are dropped before the update (Context-1, DAPO's
  dynamic sampling without the resampling); the learner logs how many.
- No KL term by default; k1-in-reward or k3-in-loss are options of the learner (``kl``), not of this file.
- Upper and lower clip ranges are separate (DAPO's clip-higher); both default to 0.2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from taskrl.algos.losses import Tensor, clipped_surrogate


@dataclass
class GroupAdvantages:
    """Per-trajectory advantages; ``None`` for trajectories of dropped groups."""

    advantages: list[float | None]
    groups: int
    """Groups seen (a trajectory without a group id is its own group)."""
    dropped_groups: int
    """Groups whose rewards were all equal (no learning signal), dropped."""


def group_advantages(
    rewards: Sequence[float],
    group_ids: Sequence[str | None],
    *,
    normalize_std: bool = False,
    drop_zero_variance: bool = True,
    eps: float = 1e-6,
) -> GroupAdvantages:
    """A_i = r_i - mean(r of i's group), divided by (std + eps) when ``normalize_std``.

    A trajectory with no group id forms a group of one: its advantage is 0 and, with ``drop_zero_variance``,
    it is dropped (GRPO needs K >= 2 samples per task).
    """
    if len(rewards) != len(group_ids):
        raise ValueError(f"group_advantages: {len(rewards)} rewards but {len(group_ids)} group ids")
    members: dict[object, list[int]] = {}
    for i, gid in enumerate(group_ids):
        members.setdefault(gid if gid is not None else ("__alone__", i), []).append(i)
    advantages: list[float | None] = [None] * len(rewards)
    dropped = 0
    for indices in members.values():
        values = [float(rewards[i]) for i in indices]
        mean = sum(values) / len(values)
        flat = max(values) - min(values) <= 1e-12
        if flat and drop_zero_variance:
            dropped += 1
            continue
        scale = 1.0
        if normalize_std and len(values) > 1:
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
            scale = std + eps
        for i, v in zip(indices, values, strict=True):
            advantages[i] = (v - mean) / scale
    return GroupAdvantages(advantages, groups=len(members), dropped_groups=dropped)


def policy_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, *, clip_eps_low: float, clip_eps_high: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token clipped surrogate (sum it with token weights); stats: ``clipfrac``."""
    loss, clipped = clipped_surrogate(logprobs, old_logprobs, advantages, eps_low=clip_eps_low, eps_high=clip_eps_high)
    return loss, {"clipfrac": clipped.float()}
