"""``taskrl train CONFIG.toml [--set field=value ...]``: the command line of the trainer.

Registered in ``taskrl.cli`` as ``app.command("train")(train_command)``. Importing this module is cheap; the
trainer (torch, transformers) loads when the command runs. Rerunning the same command resumes the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from taskrl.training.config import load_config
from taskrl.training.runs import completed_steps


def train_command(
    config: Annotated[Path | None, typer.Argument(help="TOML config (see recipes/); omit to use the defaults")] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Option("--set", help="override a field with a TOML value, e.g. --set lr=1e-4 (repeatable)"),
    ] = None,
    from_store: Annotated[
        str | None,
        typer.Option("--from-store", help="train on logged production interactions with feedback (store URL)"),
    ] = None,
) -> None:
    """Train a policy: collect, score, update, sync, log and checkpoint every step; a rerun resumes."""
    resolved = load_config(config, overrides or [])
    console = Console()
    if from_store is not None:  # production data instead of rollouts: exact stored tokens, fresh versions only
        from taskrl.deploy.cycle import train_from_store

        rows, out = train_from_store(resolved, from_store)
        console.print(f"{len(rows)} updates from {from_store}; wrote {out} (hot-load with /v1/load_lora_adapter)")
        return
    if resolved.resume and completed_steps(resolved.run_dir) >= resolved.steps:  # no model load for nothing
        console.print(f"nothing to do: {resolved.run_dir} already completed {resolved.steps} steps")
        return
    from taskrl.trainer import train

    rows = train(resolved, console=console)
    last = rows[-1] if rows else {}
    console.print(
        f"done: {len(rows)} steps run, last reward {last.get('rewards/total', float('nan')):.3f}; "
        f"run dir {resolved.run_dir} (see `taskrl report {resolved.run_dir}`)"
    )
