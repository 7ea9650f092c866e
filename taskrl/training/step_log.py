"""What a training step logs beside the learner's own metrics: rollout staleness, the evaluation's headline numbers,
and the one-line step summary printed to the console."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from taskrl.types import Trajectory


def staleness_metrics(trajectories: Sequence[Trajectory], version: int) -> dict[str, float]:
    """How many versions behind the learner (before this update) each sampled trajectory's oldest turn is."""
    lags = [
        version - min(s.policy_version for s in t.segments if s.num_sampled)
        for t in trajectories
        if t.trainable and t.num_sampled_tokens > 0
    ]
    return {
        "charts/staleness_mean": _mean([float(x) for x in lags]),
        "charts/staleness_max": float(max(lags, default=0)),
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def eval_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The headline numbers of a ``taskrl.eval`` result for its policy "policy", as ``eval/*`` metrics."""
    stats = result["policies"]["policy"]
    return {
        "eval/mean_reward": stats["mean_reward"]["value"],
        "eval/success_rate": stats["success_rate"]["value"],
        "eval/tool_calls": stats["tool_calls"],
        "eval/invalid_tool_calls": stats["invalid_tool_calls"],
    }


def step_line(completed: int, total: int, metrics: dict[str, Any]) -> str:
    """``step 3/20 [grpo] reward 0.5 loss 0.01 tool_calls 2 time 4.1s``: the console line after each step."""
    def show(key: str) -> str:
        value = metrics.get(key)
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3g}"

    return (
        f"step {completed}/{total} [{metrics.get('charts/phase')}] reward {show('rewards/total')} "
        f"loss {show('losses/policy_loss') if 'losses/policy_loss' in metrics else show('losses/sft_nll')} "
        f"tool_calls {show('tools/tool_calls')} time {show('charts/step_time_s')}s"
    )
