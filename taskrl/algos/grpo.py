"""GRPO: group-relative advantages and the clipped surrogate with token-level normalisation.

K samples per task form a group; each trajectory's advantage is its reward minus the group mean (optionally
divided by the group's standard deviation), shared by every sampled token of the trajectory.

Where this departs from the paper (Shao et al. 2024, DeepSeekMath):
- Std normalisation is off by default (Dr. GRPO, Liu et al. 2025: it over-weights near-solved and
  near-failed groups); ``normalize_std=True`` restores it (sample std, as TRL computes it).
- Loss normalisation is per token over the whole optimizer batch (DAPO), not per sequence then per group:
  long answers are not down-weighted, and micro-batching never changes the gradient.
- Groups whose rewards are all equal carry no signal and are dropped before the update (Context-1); the
  learner logs how many (``charts/dropped_groups``).
- Dynamic sampling (DAPO) is an option of the trainer, not of this file: ``dynamic_sampling=True`` plays more
  tasks until ``tasks_per_step`` groups with signal are in hand, at most ``dynamic_sampling_max_rounds`` extra
  rounds (DAPO samples until the batch is full, unbounded); surplus groups are trimmed (``charts/dynamic_*``).
- Overlong filtering (DAPO) is an option of the learner: ``overlong_filter=True`` gives episodes cut off by the
  token budget no loss, while their rewards still count in their group's mean (``charts/overlong_filtered``).
  A turn limit or an env's own truncation is not overlong.
- No KL term by default; k1-in-reward or k3-in-loss are options of the learner (``kl``), not of this file.
- Upper and lower clip ranges are separate (DAPO's clip-higher); both default to 0.2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from taskrl.algos.algorithm import Advantages, Algorithm, TrajectoryInput
from taskrl.algos.losses import Tensor, clipped_surrogate

if TYPE_CHECKING:
    from taskrl.training.config import TrainConfig


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


def advantages(trajectories: Sequence[TrajectoryInput], config: TrainConfig) -> Advantages:
    """Group-relative advantages of the trajectories' rewards (less ``kl_coef`` x their summed k1 penalty), the
    same for every sampled token of a trajectory; shared by ``cispo`` and ``kimi``."""
    rewards = []
    for traj in trajectories:
        penalty = sum(float(kl.sum()) for kl in traj.kl) if traj.kl else 0.0
        rewards.append(traj.reward - config.kl_coef * penalty)
    result = group_advantages(
        rewards,
        [t.group_id for t in trajectories],
        normalize_std=config.normalize_std,
        drop_zero_variance=config.drop_zero_variance,
    )
    per_token = [
        None if advantage is None else [torch.full((size,), advantage) for size in traj.sizes]
        for traj, advantage in zip(trajectories, result.advantages, strict=True)
    ]
    metrics = {"charts/groups": float(result.groups), "charts/dropped_groups": float(result.dropped_groups)}
    return Advantages(per_token, metrics=metrics)


def token_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, config: TrainConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """``policy_loss`` with the config's clip range."""
    return policy_loss(
        logprobs, old_logprobs, advantages, clip_eps_low=config.clip_eps_low, clip_eps_high=config.clip_eps_high
    )


GROUP_FIELDS = ("normalize_std", "drop_zero_variance")
"""Config fields of ``advantages`` (every group-relative algorithm reads them)."""
ALGORITHM = Algorithm(
    "grpo", token_loss, advantages=advantages, min_group_size=2,
    config_fields=(*GROUP_FIELDS, "clip_eps_low", "clip_eps_high"),
)  # fmt: skip
