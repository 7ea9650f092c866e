"""Evaluation harness: any env x one or more policies x a task set, K samples per task.

``evaluate(env_factory, {"name": policy, ...}, tasks, EvalConfig()) -> dict`` plays K episodes per task and
policy (same seeds for every policy, so the comparison is paired), counts reward >= ``success_threshold`` as a
pass and returns JSON-ready results: mean reward, success rate and pass@k (the unbiased estimator of Chen et
al. 2021) with percentile-bootstrap 95% CIs over tasks, a per-task table, paired differences against the first
policy, and the monitors. With a ``RunLog`` it writes ``eval/NAME.json`` and each policy's trajectories as they
finish, and resumes an interrupted evaluation without replaying finished episodes. ``taskrl eval`` is the CLI.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

import taskrl.cli_options as opts
from taskrl import context
from taskrl.algos.schedules import Schedule
from taskrl.env import Env
from taskrl.monitor import MonitorConfig, Monitors
from taskrl.policies.base import Policy, SamplingParams
from taskrl.rollout import RolloutConfig, error_note, run_episodes, summarize
from taskrl.runlog import RunLog, read_trajectories
from taskrl.scoring import Clock, rubric_of, score_collected
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
        summary = summarize(trajectories)
        monitors = Monitors(monitor_config, tool_names=tool_names, max_turns=config.max_turns)
        metrics, alerts = monitors.check(step, trajectories)
        policies[name] = {
            "episodes": len(trajectories),
            **{key: _estimate(values, config, f"{name}/{key}") for key, values in series.items()},
            "turns": summary.get("turns"),
            "tool_calls": summary.get("tool_calls"),
            "invalid_tool_calls": summary.get("invalid_tool_calls"),
            "tokens": summary.get("tokens"),
            "errors": summary.get("errors", 0.0),
            "error_note": error_note(trajectories),
            "reward_terms": {k.removeprefix("reward/"): v for k, v in summary.items() if k.startswith("reward/")},
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
) -> dict[str, Any]:
    """Evaluate every policy on ``tasks``; see the module docstring. ``step`` tags a mid-training evaluation.

    Episodes are scored exactly as the trainer scores them (``taskrl.scoring.score_collected``: group terms per
    task's K samples, clamp, gates, invalid-call cap) at ``clock`` (default ``Clock(step)``) and under the run's
    ``reward_weights``; ``on_trajectory`` sees an episode as it finishes, the same object scored afterwards."""
    config = config or EvalConfig()
    clock = clock if clock is not None else Clock(step)
    if not tasks:
        raise EvalError("no tasks to evaluate; check the env's split or --n")
    if not policies:
        raise EvalError("no policy to evaluate")
    rollout = replace(config.rollout_config(), clock=clock)
    probe = env_factory()
    rubric = rubric_of(probe)
    task_of = {t.id: t for t in tasks}.get
    tool_names = list(probe.tools.names)
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
        score_collected(played, probe, clock, rubric=rubric, reward_weights=reward_weights, task_of=task_of)
        by_policy[policy_name] = played
    result = {
        "name": name,
        "step": step,
        "env": probe.name,
        "config": asdict(config),
        "wall_time_s": time.perf_counter() - start,
        **score(by_policy, tasks, config, monitor_config, tool_names, step),
    }
    if run_log is not None:
        run_log.write_eval(name, result)
        if not (run_log.dir / "config.json").exists():  # never clobber a training run's config
            run_log.write_config({"command": "eval", "env": result["env"], **asdict(config)})
    return result


# ---- command line -----------------------------------------------------------------------------------------


def _format(estimate: dict[str, Any] | None, percent: bool = False) -> str:
    if not estimate or estimate.get("value") is None or math.isnan(estimate["value"]):
        return "-"
    fmt = (lambda v: f"{v:.0%}") if percent else (lambda v: f"{v:.3f}")
    if estimate["low"] is None:
        return fmt(estimate["value"])
    return f"{fmt(estimate['value'])} [{fmt(estimate['low'])}, {fmt(estimate['high'])}]"


def results_table(result: dict[str, Any]) -> Any:
    """A rich table of one evaluation: one row per policy."""
    from rich.table import Table

    ks = list(result["config"]["pass_ks"])
    table = Table(title=f"eval {result['name']}: env {result['env']}, {result['tasks']} tasks x "
                        f"{result['samples_per_task']} samples (95% CI)")  # fmt: skip
    for col in ("policy", "mean reward", "success", *[f"pass@{k}" for k in ks], "tool calls", "alerts"):
        table.add_column(col, justify="left" if col in ("policy", "alerts") else "right")
    for name, p in result["policies"].items():
        table.add_row(
            name, _format(p["mean_reward"]), _format(p["success_rate"], True),
            *[_format(p[f"pass@{k}"], True) for k in ks],
            f"{p['tool_calls']:.2f}" if p["tool_calls"] is not None else "-",
            ", ".join(a["monitor"] for a in p["alerts"]) or "-",
        )  # fmt: skip
    return table


async def _evaluate_with_progress(
    factory: Callable[[], Env], policies: dict[str, Policy], tasks: list[Task], config: EvalConfig, run_log: RunLog,
    name: str, console: Any,
) -> dict[str, Any]:
    """``evaluate`` with a progress bar per policy (episodes done / total, mean reward so far, ETA)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    total = len(tasks) * config.samples_per_task
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("reward {task.fields[reward]:.2f}"), TextColumn("eta"), TimeRemainingColumn())  # fmt: skip
    rewards: dict[str, list[float]] = {}
    with Progress(*columns, console=console, transient=False) as bar:
        jobs = {p: bar.add_task(f"eval {p}", total=total, reward=0.0) for p in policies}

        def done(policy_name: str, traj: Trajectory) -> None:
            seen = rewards.setdefault(policy_name, [])
            seen.append(traj.reward)
            bar.update(jobs[policy_name], advance=1, reward=sum(seen) / len(seen))

        return await evaluate(factory, policies, tasks, config, run_log=run_log, name=name, on_trajectory=done)


def eval_command(
    env: opts.EnvName,
    policy: Annotated[list[str], typer.Option(help="KIND[:MODEL], repeat to compare: scripted, hf, hf:PATH, "
                                                   "openai:MODEL (with --base-url)")] = ["scripted"],  # noqa: B006
    out: Annotated[Path, typer.Option(help="run directory (eval/NAME.json + trajectories)")] = Path("runs/eval"),
    name: Annotated[str, typer.Option(help="name of this evaluation in the run directory")] = "eval",
    split: opts.Split = "test",
    n: Annotated[int, typer.Option(help="number of tasks (0: all)")] = 16,
    k: Annotated[int, typer.Option(help="samples per task (K)")] = 4,
    pass_k: Annotated[list[int], typer.Option(help="report pass@k for this k (K is always reported)")] = [1],  # noqa: B006
    threshold: Annotated[float, typer.Option(help="reward >= threshold counts as a pass")] = 1.0,
    base_url: opts.BaseUrl = None,
    api_key: opts.ApiKey = None,
    timeout_s: opts.TimeoutS = 120.0,
    device: opts.Device = "auto",
    max_turns: opts.MaxTurns = 8,
    max_new_tokens: opts.MaxNewTokens = 256,
    max_context_tokens: opts.MaxContextTokens = 4096,
    temperature: opts.Temperature = 1.0,
    concurrency: opts.Concurrency = 8,
    seed: opts.Seed = 0,
    env_kwargs: opts.EnvKwargs = None,
    corpus: opts.Corpus = None,
    tasks_from: opts.Tasks = None,
    task_columns: opts.TaskColumns = None,
) -> None:
    """Evaluate policies on an env: K samples per task, pass@k and mean with 95% CIs, per-task table."""
    from rich.console import Console

    from taskrl.policies import make_policy

    config = EvalConfig(
        samples_per_task=k, pass_ks=tuple(pass_k), success_threshold=threshold, max_turns=max_turns,
        max_context_tokens=max_context_tokens, max_new_tokens=max_new_tokens, temperature=temperature,
        concurrency=concurrency, seed=seed,
    )  # fmt: skip
    env_obj, factory = opts.env_factory(env, opts.parse_env_kwargs(env_kwargs, corpus), tasks_from, task_columns)
    tasks = list(env_obj.tasks(split))
    tasks = tasks[:n] if n > 0 else tasks
    if not tasks:
        raise EvalError(f"env '{env}' has no tasks in split '{split}'")
    if len(set(policy)) != len(policy):
        raise EvalError(f"--policy given twice: {policy}; each policy is evaluated once")
    policies = {}
    for spec in policy:
        kind, _, model = spec.partition(":")
        policies[spec] = make_policy(kind, model=model or "smollm2", base_url=base_url, api_key=api_key,
                                     device=device, env=env_obj, timeout_s=timeout_s)  # fmt: skip
    console = Console()
    if not console.is_terminal:  # logs and CI: wide enough that the table is not wrapped
        console.width = max(console.width, 120)
    result = asyncio.run(_evaluate_with_progress(factory, policies, tasks, config, RunLog(out), name, console))
    console.print(results_table(result))
    for p_name, p in result["policies"].items():
        for alert in p["alerts"]:
            console.print(f"[yellow]alert[/yellow] {p_name}: {alert['message']}", highlight=False)
        if p.get("error_note"):
            console.print(f"[yellow]warning[/yellow] {p_name}: {p['error_note']}", highlight=False)
    console.print(f"results: {out / 'eval' / (name + '.json')}   report: taskrl report {out} -o {out}/report.html")
