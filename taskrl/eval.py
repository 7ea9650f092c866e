"""Evaluation harness: any env x one or more policies x a task set, K samples per task.

``evaluate(env_factory, {"name": policy, ...}, tasks, EvalConfig()) -> dict`` plays K episodes per task and
policy (same seeds for every policy, so the comparison is paired), counts reward >= ``success_threshold`` as a
pass and returns JSON-ready results: mean reward, success rate and pass@k (the unbiased estimator of Chen et
al. 2021) with percentile-bootstrap 95% CIs over tasks, a per-task table, paired differences against the first
policy, and the monitors. With a ``RunLog`` it writes ``eval/NAME.json`` and each policy's trajectories as they
finish, and resumes an interrupted evaluation without replaying finished episodes. ``taskrl eval`` is its command
line (``taskrl.commands.eval``).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from taskrl import context
from taskrl.algos.schedules import Schedule
from taskrl.env import Env
from taskrl.env_spec import EnvSpec, aread_spec
from taskrl.monitor import MonitorConfig, Monitors
from taskrl.moved import moved_names
from taskrl.policies.base import Policy, SamplingParams
from taskrl.rollout import RolloutConfig, error_note, run_episodes
from taskrl.runlog import RunLog, read_trajectories
from taskrl.scoring import Clock, batch_metrics, score_collected
from taskrl.seeding import derive_seed
from taskrl.types import Task, Trajectory
from taskrl.validate import at_least, require

CI_METHOD = "percentile bootstrap over tasks (tasks resampled with replacement; a task's K samples stay together)"


class EvalError(ValueError):
    """An evaluation cannot run as asked (no tasks, clashing policy names, bad pass@k)."""


@dataclass
class EvalConfig:
    """How an evaluation samples and scores."""

    samples_per_task: int = 4
    """K: episodes per task and policy."""
    pass_ks: tuple[int, ...] = (1,)
    """The k of each reported pass@k; each must be <= samples_per_task (K itself is always added)."""
    success_threshold: float = 1.0
    """An episode passes when its reward is >= this."""
    confidence: float = 0.95
    """Coverage of the confidence intervals."""
    bootstrap_resamples: int = 2000
    """Resamples of the bootstrap CIs."""
    max_turns: int = 8
    """Assistant turns per episode."""
    max_context_tokens: int = 4096
    """Tokens in the model's context per episode."""
    max_new_tokens: int = 256
    """Tokens sampled per turn."""
    temperature: float = 1.0
    """Sampling temperature (pass@k with k > 1 needs samples that differ: keep it > 0)."""
    concurrency: int = 8
    """Episodes in flight at once."""
    seed: int = 0
    """Root seed of episodes (the same for every policy) and of the bootstrap."""
    summary: context.SummaryConfig | dict[str, Any] | None = None
    """Context compaction at a token trigger (``taskrl.context``): None = off, a SummaryConfig, or a table of its
    fields (e.g. ``{"trigger_tokens": 400, "mode": "prompted"}``), validated here."""

    def __post_init__(self) -> None:
        self.summary = context.from_value(self.summary, "EvalConfig.summary")
        if self.summary is not None and self.summary.trigger_tokens >= self.max_context_tokens:
            raise ValueError(f"EvalConfig.summary.trigger_tokens ({self.summary.trigger_tokens}) must be below "
                             f"max_context_tokens ({self.max_context_tokens})")  # fmt: skip
        require("EvalConfig", "must be >= 1", at_least(1), samples_per_task=self.samples_per_task,
                bootstrap_resamples=self.bootstrap_resamples, max_turns=self.max_turns,
                max_context_tokens=self.max_context_tokens, max_new_tokens=self.max_new_tokens,
                concurrency=self.concurrency)  # fmt: skip
        if not 0 < self.confidence < 1:
            raise ValueError(f"EvalConfig.confidence must be in (0, 1), got {self.confidence}")
        if self.temperature < 0:
            raise ValueError(f"EvalConfig.temperature must be >= 0, got {self.temperature}")
        bad = [k for k in self.pass_ks if not 1 <= k <= self.samples_per_task]
        if bad:
            raise ValueError(f"EvalConfig.pass_ks {bad} must be between 1 and samples_per_task={self.samples_per_task}")
        self.pass_ks = tuple(sorted({*self.pass_ks, self.samples_per_task}))

    def rollout_config(self) -> RolloutConfig:
        return RolloutConfig(
            max_turns=self.max_turns,
            max_context_tokens=self.max_context_tokens,
            sampling=SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature),
            group_size=self.samples_per_task,
            concurrency=self.concurrency,
            seed=self.seed,
            training=False,  # evaluation sees the env as production does (no training-only guidance)
            summary=self.summary,  # type: ignore[arg-type]  # a SummaryConfig after __post_init__
        )


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c passes: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, numerically stable)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def bootstrap_ci(
    values: Sequence[float], *, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile-bootstrap CI of the mean of per-task ``values``; None with fewer than two tasks."""
    data = np.asarray(values, dtype=float)
    if data.size < 2:
        return None
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(resamples, data.size))].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def paired_delta(a: Sequence[float], b: Sequence[float], seed: int = 0) -> dict[str, float | None]:
    """Mean of b - a over the same tasks, with a percentile-bootstrap 95% CI (tasks resampled together)."""
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    ci = bootstrap_ci(diffs, seed=seed)
    value = sum(diffs) / len(diffs) if diffs else None  # no tasks: nothing to estimate
    return {"value": value, "low": ci[0] if ci else None, "high": ci[1] if ci else None}


def _estimate(values: Sequence[float], config: EvalConfig, salt: str) -> dict[str, float | None]:
    ci = bootstrap_ci(values, confidence=config.confidence, resamples=config.bootstrap_resamples,
                      seed=derive_seed(config.seed, salt))  # fmt: skip
    mean = float(np.mean(values)) if len(values) else float("nan")
    return {"value": mean, "low": ci[0] if ci else None, "high": ci[1] if ci else None}


TOTALS = ("rewards/total", "rewards/std")


def score(
    by_policy: dict[str, list[Trajectory]],
    tasks: Sequence[Task],
    config: EvalConfig,
    monitor_config: MonitorConfig | None = None,
    tool_names: Sequence[str] | None = None,
    step: int = 0,
) -> dict[str, Any]:
    """Aggregate played episodes into the results ``evaluate`` returns (usable on any saved trajectories)."""
    task_ids = [t.id for t in tasks]
    per_task: dict[str, dict[str, dict[str, Any]]] = {tid: {} for tid in task_ids}
    policies: dict[str, Any] = {}
    stats: dict[str, dict[str, list[float]]] = {}
    for name, trajectories in by_policy.items():
        grouped: dict[str, list[Trajectory]] = {tid: [] for tid in task_ids}
        for t in trajectories:
            grouped.setdefault(t.task_id, []).append(t)
        series: dict[str, list[float]] = {"mean_reward": [], "success_rate": []}
        for tid in task_ids:
            episodes = grouped[tid]
            rewards = [t.reward for t in episodes]
            passes = sum(t.error is None and t.reward >= config.success_threshold - 1e-9 for t in episodes)
            row: dict[str, Any] = {"n": len(episodes), "successes": passes,
                                   "mean_reward": float(np.mean(rewards)) if rewards else float("nan")}  # fmt: skip
            series["mean_reward"].append(row["mean_reward"])
            series["success_rate"].append(passes / len(episodes) if episodes else float("nan"))
            for k in config.pass_ks:
                value = pass_at_k(len(episodes), passes, k) if len(episodes) >= k else float("nan")
                row[f"pass@{k}"] = value
                series.setdefault(f"pass@{k}", []).append(value)
            per_task[tid][name] = row
        stats[name] = series
        summary = batch_metrics(trajectories)
        monitors = Monitors(monitor_config, tool_names=tool_names, max_turns=config.max_turns)
        metrics, alerts = monitors.check(step, trajectories)
        policies[name] = {
            "episodes": len(trajectories),
            **{key: _estimate(values, config, f"{name}/{key}") for key, values in series.items()},
            "turns": summary["tools/turns"],
            "tool_calls": summary["tools/tool_calls"],
            "invalid_tool_calls": summary["tools/invalid_tool_calls"],
            "tokens": summary["charts/mean_tokens"],
            "errors": summary["charts/errors"],
            "error_note": error_note(trajectories),
            "reward_terms": {k.removeprefix("rewards/"): v for k, v in summary.items()
                             if k.startswith("rewards/") and k.count("/") == 1 and k not in TOTALS},  # fmt: skip
            "monitors": metrics,
            "alerts": [a.to_dict() for a in alerts],
        }
    names = list(by_policy)
    for name in names[1:]:  # paired over tasks: every policy played the same tasks with the same seeds
        for key in ("mean_reward", "success_rate"):
            diffs = [a - b for a, b in zip(stats[name][key], stats[names[0]][key], strict=True)]
            policies[name][f"delta_{key}_vs_{names[0]}"] = _estimate(diffs, config, f"{name}/delta/{key}")
    return {
        "tasks": len(task_ids),
        "samples_per_task": config.samples_per_task,
        "success_threshold": config.success_threshold,
        "ci_method": f"{CI_METHOD}, {config.bootstrap_resamples} resamples, {config.confidence:.0%}",
        "policies": policies,
        "per_task": [{"task_id": tid, "policies": per_task[tid]} for tid in task_ids],
    }


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "-", name).strip("-") or "policy"


async def evaluate(
    env_factory: Callable[[], Env],
    policies: dict[str, Policy],
    tasks: Sequence[Task],
    config: EvalConfig | None = None,
    *,
    run_log: RunLog | None = None,
    name: str = "eval",
    step: int = 0,
    monitor_config: MonitorConfig | None = None,
    on_trajectory: Callable[[str, Trajectory], None] | None = None,
    clock: Clock | None = None,
    reward_weights: Mapping[str, float | Schedule] | None = None,
    spec: EnvSpec | None = None,
) -> dict[str, Any]:
    """Evaluate every policy on ``tasks``; see the module docstring. ``step`` tags a mid-training evaluation.
    ``spec``: the env's rubric, tool names and name, as the caller already read them (the trainer's); without it
    one env from ``env_factory`` is read and closed.

    Episodes are scored exactly as the trainer scores them (``taskrl.scoring.score_collected``: group terms per
    task's K samples, clamp, gates, invalid-call cap) at ``clock`` (default ``Clock(step)``) and under the run's
    ``reward_weights``; ``on_trajectory`` sees an episode as it finishes, the same object scored afterwards."""
    config = config or EvalConfig()
    clock = clock if clock is not None else Clock(step)
    if not tasks:
        raise EvalError("no tasks to evaluate; check the env's split or --n")
    if not policies:
        raise EvalError("no policy to evaluate")
    rollout = config.rollout_config()  # the envs know no clock: ``clock`` enters when the episodes are scored
    spec = spec if spec is not None else await aread_spec(env_factory, [])  # the tasks are the caller's
    rubric = spec.rubric
    task_of = {t.id: t for t in tasks}.get
    tool_names = list(spec.tool_names)
    by_policy: dict[str, list[Trajectory]] = {}
    start = time.perf_counter()
    for policy_name, policy in policies.items():
        traj_name = f"{_safe(name)}-{_safe(policy_name)}"
        done: dict[int, Trajectory] = {}
        if run_log is not None:  # resume: episodes already written are reused, matched by their seed
            for t in read_trajectories(run_log.dir, traj_name).get(step, []):
                if t.seed is not None and t.error is None:
                    done[t.seed] = t

        def sink(traj: Trajectory, policy_name: str = policy_name, traj_name: str = traj_name) -> None:
            if run_log is not None:
                run_log.write_trajectories(step, [traj], name=traj_name)
            if on_trajectory is not None:
                on_trajectory(policy_name, traj)

        played = await run_episodes(env_factory, policy, tasks, rollout, on_trajectory=sink, done=done)
        score_collected(played, None, clock, rubric=rubric, reward_weights=reward_weights, task_of=task_of)
        by_policy[policy_name] = played
    result = {
        "name": name,
        "step": step,
        "env": spec.name,
        "config": asdict(config),
        "wall_time_s": time.perf_counter() - start,
        **score(by_policy, tasks, config, monitor_config, tool_names, step),
    }
    if run_log is not None:
        run_log.write_eval(name, result)
        if not (run_log.dir / "config.json").exists():  # never clobber a training run's config
            run_log.write_config({"command": "eval", "env": result["env"], **asdict(config)})
    return result


__getattr__ = moved_names(__name__, dict.fromkeys(("eval_command", "results_table"), "taskrl.commands.eval"))
