"""``taskrl rewards list|score``: show the presets, and re-score saved trajectories term by term.

``score`` reads a trajectories JSONL (a rollout's output or a run's ``trajectories/*.jsonl``), scores every
episode with a preset at a given step/epoch, prints each term's mean (weighted and raw) and can write the
re-scored trajectories: a researcher's way to ask "what would this reward have said about these episodes?".
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from taskrl.env import make
from taskrl.rewards.presets import PRESETS, make_reward
from taskrl.rewards.terms import AnswerMatch
from taskrl.scoring import Clock, batch_metrics, rescore
from taskrl.types import read_jsonl, write_jsonl

ANSWER_PRESETS = {"parl": "perf", "seed_weighted": "completion"}
"""Presets whose outcome term is an answer match, and the argument that sets it."""

rewards_app = typer.Typer(help="Reward presets: list them, re-score saved trajectories.", no_args_is_help=True)
console = Console()


@rewards_app.command("list")
def list_presets() -> None:
    """List the reward presets with their terms and starting weights."""
    table = Table("preset", "terms (weight at step 0)", "group terms", "gates", "source")
    for name, build in PRESETS.items():
        reward = build()
        weights = reward.weights(Clock())
        source = (build.__doc__ or "").split("(")[0].strip()
        table.add_row(
            name,
            ", ".join(f"{t.name} {weights[t.name]:g}" for t in [*reward.terms, *reward.derived]),
            ", ".join(f"{t.name} {weights[t.name]:g}" for t in reward.group_terms) or "-",
            ", ".join(g.name for g in reward.gates) or "-",
            source,
        )
    console.print(table)


@rewards_app.command("score")
def score(
    path: Annotated[Path, typer.Argument(help="trajectories JSONL")],
    preset: Annotated[str, typer.Option(help=f"one of: {', '.join(PRESETS)}")],
    env: Annotated[str | None, typer.Option(help="registered env whose tasks hold the gold answers")] = None,
    split: Annotated[str, typer.Option(help="task split of --env")] = "train",
    step: Annotated[int, typer.Option(help="trainer step the weight schedules are evaluated at")] = 0,
    epoch: Annotated[int, typer.Option(help="epoch (Context-1's beta anneals by epoch)")] = 0,
    answer_mode: Annotated[
        str | None, typer.Option(help="parl/seed_weighted outcome: exact, number or contains answer match")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="write the re-scored trajectories here")] = None,
) -> None:
    """Score saved trajectories with a preset and print every term's batch mean."""
    if not path.is_file():
        raise FileNotFoundError(f"no trajectories file {str(path)!r}; pass a JSONL written by a rollout or a run")
    trajectories = read_jsonl(str(path))
    if not trajectories:
        raise ValueError(f"{path} holds no trajectories")
    tasks = {t.id: t for t in make(env).tasks(split)} if env else {}
    outcome = {}
    if answer_mode is not None:
        if preset not in ANSWER_PRESETS:
            raise ValueError(f"--answer-mode applies to {', '.join(ANSWER_PRESETS)}, not {preset!r}")
        outcome[ANSWER_PRESETS[preset]] = AnswerMatch(answer_mode)  # type: ignore[arg-type]
    reward = make_reward(preset, **outcome)
    clock = Clock(step, epoch)
    rescore(trajectories, reward, clock, task_of=tasks.get)  # measured by the preset, scored at the clock
    metrics = batch_metrics(trajectories, reward, clock)
    table = Table("term", "weight", "weighted mean", "raw mean", "applies to", title=f"{preset} on {len(trajectories)}")
    for t in [*reward.terms, *reward.derived, *reward.group_terms]:
        if f"rewards/{t.name}" in metrics:
            table.add_row(
                t.name,
                f"{metrics[f'rewards/weight/{t.name}']:.3g}",
                f"{metrics[f'rewards/{t.name}']:.4f}",
                f"{metrics.get(f'rewards_raw/{t.name}', float('nan')):.4f}",
                f"{metrics[f'rewards/applicable/{t.name}']:.0%}",
            )
        else:
            table.add_row(t.name, f"{metrics[f'rewards/weight/{t.name}']:.3g}", "-", "-", "0%")
    for gate in reward.gates:
        cap = f"{gate.name}_cap"
        if f"rewards/{cap}" in metrics:
            raw = metrics.get(f"rewards_raw/{gate.name}", float("nan"))
            applies = metrics[f"rewards/applicable/{cap}"]
            table.add_row(f"{cap} (gate)", "-", f"{metrics[f'rewards/{cap}']:.4f}", f"{raw:.4f}", f"{applies:.0%}")
    console.print(table)
    console.print(f"mean reward: {metrics['rewards/total']:.4f}")
    if out is not None:
        write_jsonl(str(out), trajectories, append=False)
        console.print(f"re-scored trajectories: {out}")
