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
  token budget, or with a turn cut short by ``max_new_tokens`` whose calls still ran, no loss, while their rewards
  still count in their group's mean (``charts/overlong_filtered``). A turn limit or an env's own truncation is
  not overlong. Where the overlong episodes are a group's successes, that mean pushes the episodes that end
  within budget down: on the issue-40 tool-use pilot (one val seed) GRPO leaned on the cap more with the filter
  than without; room in ``max_new_tokens`` let it end its own turns on 3 of 5 seeds (``docs/experiments/tool_use.md``).
- No KL term by default; k1-in-reward or k3-in-loss are options of the learner (``kl``), not of this file.
- Upper and lower clip ranges are separate (DAPO's clip-higher); both default to 0.2.

Settings: ``GRPOConfig`` (TOML ``[algo]`` with ``name = "grpo"``); ``GroupConfig`` holds the advantage settings
``cispo`` and ``kimi`` share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from taskrl.algos.algorithm import Advantages, AlgoConfig, Algorithm, TrajectoryInput
from taskrl.algos.losses import clipped_token_loss
from taskrl.validate import finite_at_least, require


@dataclass
class GroupConfig(AlgoConfig):
    """The group-relative advantage settings (``advantages``), shared by grpo, cispo and kimi."""

    normalize_std: bool = False
    """Divide group-relative advantages by the group's std (original GRPO); off = Dr. GRPO."""
    drop_zero_variance: bool = True
    """Drop groups whose rewards are all equal (no signal) before the update."""


@dataclass
class GRPOConfig(GroupConfig):
    """``[algo]`` of GRPO."""

    name: str = "grpo"
    clip_eps_low: float = 0.2
    """Ratio clip below 1."""
    clip_eps_high: float = 0.2
    """Ratio clip above 1 (DAPO's clip-higher uses 0.28)."""

    def __post_init__(self) -> None:
        check_clip_range(self.clip_eps_low, self.clip_eps_high)


def check_clip_range(clip_eps_low: float, clip_eps_high: float) -> None:
    """``clip_eps_low`` in [0, 1) and ``clip_eps_high`` >= 0, errors naming ``algo.<field>``."""
    require("algo", "must be >= 0", finite_at_least(0), clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high)
    if clip_eps_low >= 1:
        raise ValueError(f"algo.clip_eps_low must be < 1, got {clip_eps_low!r}")


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


def advantages(trajectories: Sequence[TrajectoryInput], config: GroupConfig) -> Advantages:
    """Group-relative advantages of the trajectories' rewards (less their summed KL penalty), the same for every
    sampled token of a trajectory; shared by ``cispo`` and ``kimi``."""
    rewards = []
    for traj in trajectories:
        penalty = sum(float(kl.sum()) for kl in traj.kl) if traj.kl else 0.0
        rewards.append(traj.reward - penalty)
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


ALGORITHM = Algorithm("grpo", clipped_token_loss, advantages=advantages, min_group_size=2, config=GRPOConfig)
