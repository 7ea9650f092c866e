"""SFT: which trajectories are cloned, and the loss on sampled tokens."""

import torch

from taskrl.algos.sft import nll_loss, select
from taskrl.types import Segment, Trajectory


def _traj(reward: float, *, sampled: bool = True, error: str | None = None, trainable: bool = True) -> Trajectory:
    seg = Segment([1, 2, 3], [0.0, 0.0, 0.0], [0, 1, 1] if sampled else [0, 0, 0])
    return Trajectory(segments=[seg], rewards={"r": reward}, error=error, trainable=trainable)


def test_select_keeps_only_good_trainable_episodes() -> None:
    good = _traj(1.0)
    candidates = [good, _traj(0.5), _traj(1.0, sampled=False), _traj(1.0, error="boom"), _traj(1.0, trainable=False)]
    assert select(candidates, min_reward=1.0) == [good]
    assert len(select(candidates, min_reward=0.0)) == 2


def test_nll_is_minus_logprob() -> None:
    loss, stats = nll_loss(torch.tensor([-0.5, -2.0]))
    assert loss.tolist() == [0.5, 2.0] and stats == {}
