"""The ``taskrl`` command line: registers every command and defines the small ones (``env list``, ``env check``,
``rollout``).

Every command is a thin shell over the library; the larger ones live in ``taskrl.commands`` (``train``, ``demo``,
``eval``, ``datagen ...``), the serving ones in ``taskrl.deploy.cli``. Errors a user can fix print one line naming
the problem and the fix, with exit code 2.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

import taskrl.cli_options as opts
from taskrl import __version__
from taskrl.commands.datagen import codebugs_command, deepsearch_command, multihop_command, widesearch_command
from taskrl.commands.demo import demo_command
from taskrl.commands.eval import eval_command
from taskrl.commands.train import train_command
from taskrl.datagen.codebugs import MiningError
from taskrl.deploy.cli import cycle_command, serve_command, train_from_store_command
from taskrl.env import Env, EnvCheckError, UnknownEnvError, acheck_env, make, registry
from taskrl.envs.code.sandbox import SandboxUnavailableError
from taskrl.envs.search.cli import corpus_app
from taskrl.policies import POLICY_KINDS, Policy, PolicyError, SamplingParams, make_policy
from taskrl.report.cli import report_command
from taskrl.rewards.cli import rewards_app
from taskrl.rollout import RolloutConfig, error_note, run_episodes
from taskrl.scoring import batch_metrics
from taskrl.training.config import fields_help
from taskrl.types import Task, Trajectory

app = typer.Typer(
    help="taskrl: train task-oriented LLM agents with RL.", no_args_is_help=True, pretty_exceptions_show_locals=False
)
env_app = typer.Typer(help="Inspect registered environments.", no_args_is_help=True)
app.add_typer(env_app, name="env")
datagen_app = typer.Typer(help="Generate task sets.", no_args_is_help=True)
app.add_typer(datagen_app, name="datagen")
app.add_typer(corpus_app, name="corpus")
app.add_typer(rewards_app, name="rewards")
datagen_app.command("multihop")(multihop_command)
datagen_app.command("codebugs")(codebugs_command)
datagen_app.command("widesearch")(widesearch_command)
datagen_app.command("deepsearch")(deepsearch_command)
app.command("eval")(eval_command)
app.command("report")(report_command)
app.command("train", epilog=fields_help())(train_command)
app.command("serve")(serve_command)
app.command("cycle")(cycle_command)
app.command("train-from-store")(train_from_store_command)
console = Console()
if not console.is_terminal:  # logs and CI: wide enough that the summary tables are not wrapped
    console.width = max(console.width, 120)


def _version(value: bool) -> None:
    if value:
        console.print(f"taskrl {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print taskrl's version and exit")
    ] = False,
) -> None:
    """taskrl: train task-oriented LLM agents with RL."""


class UsageError(Exception):
    """A problem the user fixes by changing the command (printed as one line, exit 2)."""


@env_app.command("list")
def env_list() -> None:
    """List registered environments."""
    table = Table("name", "description")
    for name, spec in sorted(registry().items()):  # not built: some envs open stores or sandboxes
        table.add_row(name, spec.description)
    console.print(table)


@env_app.command("check")
def env_check(
    name: Annotated[str, typer.Argument(help=opts.ENV_HELP)],
    env_kwargs: opts.EnvKwargs = None,
    corpus: opts.Corpus = None,
    tasks: opts.Tasks = None,
    task_columns: opts.TaskColumns = None,
) -> None:
    """Run check_env on one environment (built with --env-kwargs / --corpus / --tasks when given)."""
    env, _ = opts.env_factory(name, opts.parse_env_kwargs(env_kwargs, corpus), tasks, task_columns)
    asyncio.run(acheck_env(env))
    console.print(f"[green]ok[/green] env '{name}' passes check_env; tools: {', '.join(env.tools.names)}")


def _summary_table(rows: dict[str, list[Trajectory]], title: str) -> Table:
    """One row per policy: the batch means a user reads first (per episode)."""
    table = Table(title=title)
    columns = ("policy", "episodes", "reward", "turns", "tool calls", "invalid", "tokens", "sampled", "done", "cut")
    for col in columns:
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, trajectories in rows.items():
        s = batch_metrics(trajectories)
        table.add_row(
            name,
            f"{s['charts/episodes']:.0f}" + (f" ({s['charts/errors']:.0f} err)" if s["charts/errors"] else ""),
            f"{s['rewards/total']:.3f}",
            f"{s['tools/turns']:.2f}",
            f"{s['tools/tool_calls']:.2f}",
            f"{s['tools/invalid_tool_calls']:.2f}",
            f"{s['charts/mean_tokens']:.0f}",
            f"{s['charts/mean_sampled_tokens']:.0f}",
            f"{s['charts/terminated']:.0%}",
            f"{s['charts/truncated']:.0%}",
        )
    return table


async def _play(
    env_name: str,
    policy: Policy,
    tasks: list[Task],
    config: RolloutConfig,
    out: Path,
    factory: Callable[[], Env] | None = None,
) -> list[Trajectory]:
    """Run episodes with a progress bar, appending each trajectory to ``out`` as soon as it ends."""
    total = len(tasks) * config.group_size
    columns = (
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("reward {task.fields[reward]:.2f}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
    )  # fmt: skip
    rewards: list[float] = []
    with out.open("a", encoding="utf-8") as sink, Progress(*columns, console=console) as bar:
        job = bar.add_task(f"{env_name} episodes", total=total, reward=0.0)

        def done(traj: Trajectory) -> None:
            sink.write(traj.to_json() + "\n")
            sink.flush()
            rewards.append(traj.reward)
            bar.update(job, advance=1, reward=sum(rewards) / len(rewards))

        return await run_episodes(factory or (lambda: make(env_name)), policy, tasks, config, on_trajectory=done)


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and out.stat().st_size > 0 and not overwrite:
        raise UsageError(f"{out} already exists; pass --overwrite or choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")


def _write_meta(out: Path, config: RolloutConfig, trajectories: list[Trajectory], extra: dict) -> Path:
    meta = {
        "taskrl_version": __version__,
        "python": platform.python_version(),
        "argv": sys.argv,
        "config": json.loads(json.dumps(config, default=lambda o: o.__dict__)),
        "summary": batch_metrics(trajectories),
        **extra,
    }
    path = out.with_suffix(".meta.json")
    path.write_text(json.dumps(meta, indent=2))
    return path


@app.command()
def rollout(
    env: opts.EnvName,
    policy: Annotated[str, typer.Option(help=f"one of {', '.join(POLICY_KINDS)}")] = "hf",
    n: Annotated[int, typer.Option(help="number of tasks to play")] = 8,
    group_size: Annotated[int, typer.Option(help="episodes per task (K)")] = 1,
    out: Annotated[Path, typer.Option(help="trajectories JSONL, written as episodes finish")] = Path(
        "runs/rollout.jsonl"
    ),
    model: Annotated[str, typer.Option(help="hf: 'smollm2', a local model dir, a LoRA adapter dir or a `taskrl "
                                            "train` run dir; openai: model name")] = "smollm2",
    base_url: opts.BaseUrl = None,
    api_key: opts.ApiKey = None,
    timeout_s: opts.TimeoutS = 120.0,
    device: opts.Device = "auto",
    split: opts.Split = "train",
    max_turns: opts.MaxTurns = 8,
    max_new_tokens: opts.MaxNewTokens = 256,
    max_context_tokens: opts.MaxContextTokens = 4096,
    temperature: opts.Temperature = 1.0,
    concurrency: opts.Concurrency = 8,
    seed: opts.Seed = 0,
    overwrite: Annotated[bool, typer.Option(help="replace an existing --out file")] = False,
    env_kwargs: opts.EnvKwargs = None,
    corpus: opts.Corpus = None,
    tasks_from: opts.Tasks = None,
    task_columns: opts.TaskColumns = None,
) -> None:
    """Play episodes of an env with a policy and write the trajectories as JSONL."""
    kwargs = opts.parse_env_kwargs(env_kwargs, corpus)
    env_obj, factory = opts.env_factory(env, kwargs, tasks_from, task_columns)
    config = RolloutConfig(
        max_turns=max_turns,
        max_context_tokens=max_context_tokens,
        sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature),
        group_size=group_size,
        concurrency=concurrency,
        seed=seed,
    )
    tasks = list(env_obj.tasks(split))[:n]
    if not tasks:
        raise UsageError(f"env '{env}' has no tasks in split '{split}'")
    _prepare_out(out, overwrite)
    pol = make_policy(policy, model=model, base_url=base_url, api_key=api_key, device=device, env=env_obj,
                      timeout_s=timeout_s)  # fmt: skip
    start = time.perf_counter()
    trajectories = asyncio.run(_play(env, pol, tasks, config, out, factory))
    info = {"env": env, "env_kwargs": kwargs, "tasks": tasks_from, "policy": policy, "model": model,
            "wall_time_s": time.perf_counter() - start}  # fmt: skip
    meta = _write_meta(out, config, trajectories, info)
    console.print(_summary_table({policy: trajectories}, f"env {env}"))
    if note := error_note(trajectories):
        console.print(f"[yellow]warning:[/yellow] {note}", highlight=False)
    console.print(f"trajectories: {out}   run info: {meta}")


app.command("demo")(demo_command)  # after rollout: `taskrl --help` lists the commands in the order users meet them


def main() -> None:
    """Entry point: user-fixable errors become one line on stderr and exit code 2 (TASKRL_DEBUG=1: traceback)."""
    try:
        app()
    except (
        UsageError, UnknownEnvError, PolicyError, EnvCheckError, ValueError, FileNotFoundError, MiningError,
        SandboxUnavailableError,
    ) as e:  # fmt: skip
        if os.environ.get("TASKRL_DEBUG"):  # developers want the traceback
            raise
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {e}", highlight=False)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
