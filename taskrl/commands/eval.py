"""``taskrl eval --env ENV --policy KIND[:MODEL] ...``: the command line of ``taskrl.eval.evaluate``.

Builds the env and the policies from the options, runs the evaluation with a progress bar per policy, and prints
one row per policy (mean reward, success, pass@k with 95% CIs, tool calls, alerts); results and trajectories go
to the run directory, where ``taskrl report`` reads them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

import taskrl.cli_options as opts
from taskrl.env import Env
from taskrl.eval import EvalConfig, EvalError, evaluate
from taskrl.policies.base import Policy
from taskrl.runlog import RunLog
from taskrl.types import Task, Trajectory


def _format(estimate: dict[str, Any] | None, percent: bool = False) -> str:
    if not estimate or estimate.get("value") is None or math.isnan(estimate["value"]):
        return "-"
    fmt = (lambda v: f"{v:.0%}") if percent else (lambda v: f"{v:.3f}")
    if estimate["low"] is None:
        return fmt(estimate["value"])
    return f"{fmt(estimate['value'])} [{fmt(estimate['low'])}, {fmt(estimate['high'])}]"


def results_table(result: dict[str, Any]) -> Any:
    """A rich table of one evaluation: one row per policy."""
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
