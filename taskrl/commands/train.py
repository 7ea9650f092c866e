"""``taskrl train CONFIG.toml [--set field=value ...]``: the command line of the trainer.

Registered in ``taskrl.cli`` as ``app.command("train")(train_command)``. Importing this module is cheap; the
trainer (torch, transformers) loads when the command runs. Rerunning the same command resumes the run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from taskrl.training.config import ConfigError, load_config
from taskrl.training.runs import completed_steps


def train_command(
    config: Annotated[Path | None, typer.Argument(help="TOML config (see recipes/); omit to use the defaults")] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="override a key with a TOML value, e.g. --set lr=1e-4 --set rollout.temperature=0.7 (repeatable)"
        ),
    ] = None,
    from_store: Annotated[
        str | None,
        typer.Option("--from-store", help="train on logged production interactions with feedback (store URL)"),
    ] = None,
    ray: Annotated[
        bool, typer.Option("--ray", help="play rollouts in Ray actors (same as --set placement.ray=true)")
    ] = False,
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help='Ray cluster to join: "auto" or ray://host:port (implies --ray)'),
    ] = None,
    nproc: Annotated[
        int | None, typer.Option("--nproc", help="data-parallel learner processes (same as --set placement.nproc=N)")
    ] = None,
) -> None:
    """Train a policy: collect, score, update, sync, log and checkpoint every step; a rerun resumes."""
    overrides = list(overrides or [])
    if ray or ray_address is not None:
        overrides.append("placement.ray=true")
    if ray_address is not None:
        # a TOML string, whatever the address holds
        overrides.append(f"placement.ray_address={json.dumps(ray_address)}")
    if nproc is not None:
        overrides.append(f"placement.nproc={nproc}")
    resolved = load_config(config, overrides)
    console = Console()
    if config is None:  # the defaults train for real: say so before anything loads (see `taskrl train --help`)
        console.print("no config file: TrainConfig defaults plus --set overrides (recipes/ has examples)")
    console.print(resolved.plan(), highlight=False, markup=False)
    if from_store is not None:  # production data instead of rollouts: exact stored tokens, fresh versions only
        from taskrl.deploy.cycle import train_from_store

        if resolved.placement.nproc > 1:
            raise ConfigError("placement.nproc must be 1 with --from-store (one learner process)")
        rows, out = train_from_store(resolved, from_store)
        console.print(f"{len(rows)} updates from {from_store}; wrote {out} (hot-load with /v1/load_lora_adapter)")
        return
    if resolved.resume and completed_steps(resolved.run_dir) >= resolved.steps:  # no model load for nothing
        console.print(f"nothing to do: {resolved.run_dir} already completed {resolved.steps} steps")
        return
    from taskrl.distributed.launch import launched_world

    if launched_world() > 1:  # started by torchrun: this process is one rank; rank 0 speaks for the group
        from taskrl.distributed.launch import run_launched

        result = run_launched(resolved)
        if result.rank != 0:
            return
        rows = result.rows
    elif resolved.placement.nproc > 1:  # N local learner processes; rank 0 logs and checkpoints for all of them
        from taskrl.distributed.launch import launch

        rows = launch(resolved, console)[0].rows
    else:
        from taskrl.training.trainer import train

        rows = train(resolved, console=console)
    last = rows[-1] if rows else {}
    console.print(
        f"done: {len(rows)} steps run, last reward {last.get('rewards/total', float('nan')):.3f}; "
        f"run dir {resolved.run_dir} (see `taskrl report {resolved.run_dir}`)"
    )
