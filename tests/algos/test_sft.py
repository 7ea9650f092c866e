"""SFT: which trajectories are cloned, and the loss on sampled tokens."""

import torch

from taskrl.algos.sft import nll_loss, select
from taskrl.types import Segment, Trajectory


def _traj(reward: float, *, sampled: bool = True, error: str | None = None, trainable: bool = True,
          group: str | None = None) -> Trajectory:  # fmt: skip
    seg = Segment([1, 2, 3], [0.0, 0.0, 0.0], [0, 1, 1] if sampled else [0, 0, 0])
    return Trajectory(segments=[seg], rewards={"r": reward}, error=error, trainable=trainable, group_id=group)


def test_select_keeps_only_good_trainable_episodes() -> None:
    good = _traj(1.0)
    candidates = [good, _traj(0.5), _traj(1.0, sampled=False), _traj(1.0, error="boom"), _traj(1.0, trainable=False)]
    assert select(candidates, min_reward=1.0) == [good]
    assert len(select(candidates, min_reward=0.0)) == 2


def test_nll_is_minus_logprob() -> None:
    loss, stats = nll_loss(torch.tensor([-0.5, -2.0]))
    assert loss.tolist() == [0.5, 2.0] and stats == {}


def test_keep_best_takes_each_groups_top_sample_only_above_its_mean() -> None:
    a = [_traj(r, group="a") for r in (0.2, 0.7, 0.4, 0.7)]  # ties: the first 0.7
    flat = [_traj(0.5, group="b") for _ in range(3)]  # zero variance: GRPO would not move it, nor does RFT
    low = [_traj(r, group="c") for r in (0.1, 0.3)]  # best 0.3 is above the mean but below min_reward
    lone = _traj(0.9)  # no group: nothing to beat
    kept = select([*a, *flat, *low, lone], min_reward=0.25, keep="best")
    assert kept == [a[1], low[1]]
    assert select([*a, *flat, *low, lone], min_reward=0.5, keep="best") == [a[1]]
    assert len(select([*a, *flat, lone], min_reward=0.0)) == 8


def test_keep_best_ignores_errored_members_in_the_mean() -> None:
    group = [_traj(0.6, group="g"), _traj(0.0, group="g", error="sandbox died"), _traj(0.6, group="g")]
    assert select(group, min_reward=0.0, keep="best") == []  # the usable members are all equal


def test_unknown_keep_mode_is_refused_by_name() -> None:
    import pytest

    with pytest.raises(ValueError, match="keep='top'"):
        select([], min_reward=0.0, keep="top")
