"""``taskrl serve`` (OpenAI-compatible server with logging, feedback and routing) and ``taskrl cycle`` (the loop).

    taskrl serve --policy hf --model smollm2 --store sqlite:///runs/serve/interactions.db \\
        --api-key KEY:TENANT --admin-key ADMINKEY
    taskrl cycle recipes/grpo_smollm2_lora.toml --store sqlite:///runs/cycle/interactions.db --cycle-s 18000
"""

from __future__ import annotations

import asyncio
import copy
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from taskrl.deploy.config import ServeConfig
from taskrl.deploy.router import RouterConfig
from taskrl.deploy.store import InteractionStore

ADMIN_KEY_ENV = "TASKRL_ADMIN_KEY"


def _keys(api_keys: list[str] | None) -> dict[str, str]:
    out = {}
    for item in api_keys or []:
        key, sep, tenant = item.partition(":")
        if not sep or not key or not tenant:
            raise typer.BadParameter(f"--api-key {item!r}: expected KEY:TENANT")
        out[key] = tenant
    return out


def _serve_config(api_keys: list[str] | None, admin_keys: list[str] | None, holdout: float) -> ServeConfig:
    admins = list(admin_keys or [])
    if os.environ.get(ADMIN_KEY_ENV):  # keeps the key out of the process list
        admins.append(os.environ[ADMIN_KEY_ENV])
    return ServeConfig(api_keys=_keys(api_keys), admin_keys=tuple(admins), router=RouterConfig(holdout=holdout))


StoreOpt = Annotated[str, typer.Option("--store", help="interaction store URL (sqlite:///file.db or postgresql+...)")]
ApiKeyOpt = Annotated[list[str] | None, typer.Option("--api-key", help="KEY:TENANT for chat and feedback (repeat)")]
AdminOpt = Annotated[list[str] | None, typer.Option("--admin-key", help=f"admin key (repeat; or ${ADMIN_KEY_ENV})")]


def serve_command(
    policy: Annotated[str, typer.Option(help="hf, openai (proxy an upstream server) or scripted")] = "hf",
    model: Annotated[str, typer.Option(help="smollm2, a save_pretrained dir, or the upstream model name")] = "smollm2",
    name: Annotated[str, typer.Option(help="served model name (what clients pass as model)")] = "taskrl",
    base_url: Annotated[str | None, typer.Option(help="upstream /v1 URL for --policy openai")] = None,
    env: Annotated[str | None, typer.Option(help="env whose scripted_rule serves (--policy scripted)")] = None,
    store: StoreOpt = "sqlite:///interactions.db",
    api_key: ApiKeyOpt = None,
    admin_key: AdminOpt = None,
    holdout: Annotated[float, typer.Option(help="share of sessions kept on the previous version")] = 0.05,
    host: str = "127.0.0.1",
    port: int = 8000,
    device: str = "auto",
) -> None:
    """Serve a policy OpenAI-compatibly, log every interaction, accept feedback, route versions."""
    from taskrl.deploy.server import serve
    from taskrl.env import make
    from taskrl.policies import make_policy

    config = _serve_config(api_key, admin_key, holdout)
    served = make_policy(policy, model=model, base_url=base_url, device=device, env=make(env) if env else None)
    with InteractionStore(store) as interactions:
        Console(stderr=True).print(f"serving {name!r} on http://{host}:{port}/v1, logging to {store}")
        serve({name: served}, host, port, store=interactions, config=config)


def cycle_command(
    config: Annotated[Path | None, typer.Argument(help="TrainConfig TOML (model, algo, lr, env for the gate)")] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="override a TrainConfig field")] = None,
    name: Annotated[str, typer.Option(help="served model name")] = "taskrl",
    store: StoreOpt = "sqlite:///interactions.db",
    api_key: ApiKeyOpt = None,
    admin_key: AdminOpt = None,
    cycle_s: Annotated[float, typer.Option(help="seconds per cycle (Cursor: ~5 h = 18000)")] = 18000.0,
    cycles: Annotated[int, typer.Option(help="cycles to run; 0 = until interrupted")] = 0,
    min_trajectories: Annotated[int, typer.Option(help="labelled interactions needed to train")] = 64,
    rollout: Annotated[str, typer.Option(help="canary or activate")] = "canary",
    suite_tasks: Annotated[int, typer.Option(help="eval tasks of the config's env played per policy by the gate")] = 32,
    holdout: float = 0.05,
    host: str = "127.0.0.1",
    port: int = 8000,
) -> None:
    """Serve and collect -> train from the store -> gate on the config's env -> deploy, every --cycle-s seconds."""
    # imported here, like the rest: the cycle loads torch, which `taskrl --help` must not pay for
    from taskrl.deploy.cycle import CycleConfig, ProductionCycle
    from taskrl.deploy.gate import evaluate_env
    from taskrl.deploy.server import ServerThread, create_app
    from taskrl.policies.hf import HFPolicy
    from taskrl.training.config import load_config
    from taskrl.training.learner import Learner
    from taskrl.training.model import prepare_model

    train_config = load_config(config, overrides or [])
    cycle_config = CycleConfig(
        cycle_s=cycle_s,
        cycles=cycles,
        min_trajectories=min_trajectories,
        max_staleness=train_config.max_staleness,
        rollout=rollout,  # type: ignore[arg-type]
    )
    serve_config = _serve_config(api_key, admin_key, holdout)
    base = HFPolicy.from_pretrained(train_config.model, device=train_config.device)
    served = HFPolicy(copy.deepcopy(base.model), base.tokenizer, name=name, device=base.device)
    learner = Learner(prepare_model(base.model, train_config), train_config, pad_id=base._pad_id)

    async def env_suite(policy: HFPolicy) -> dict[str, list[float]]:
        return await evaluate_env(train_config.env, policy, n_tasks=suite_tasks, seed=train_config.seed)

    console = Console(stderr=True)
    with InteractionStore(store) as interactions:
        app = create_app({name: served}, store=interactions, config=serve_config)
        router = app.state.routers[name]
        cycle = ProductionCycle(
            learner, base.tokenizer, router, interactions, cycle_config, {train_config.env: env_suite}
        )
        with ServerThread(app, host, port, log_level="warning") as server:
            console.print(f"serving {name!r} on {server.base_url}; a cycle every {cycle_s:g}s, logging to {store}")
            history = asyncio.run(cycle.run())
    for report in history:
        reason = report.get("gate", {}).get("reason") or report.get("reason", "")
        console.print(f"cycle {report['cycle']}: {report['outcome']} ({reason})")


def train_from_store_command(
    store: Annotated[str, typer.Argument(help="interaction store URL (sqlite:///file.db or postgresql+...)")],
    config: Annotated[Path | None, typer.Option("--config", help="TrainConfig TOML (model, algo, lr, steps)")] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="override a TrainConfig field")] = None,
    model_name: Annotated[str | None, typer.Option("--served-model", help="only this served model's traffic")] = None,
) -> None:
    """Train on logged production interactions with feedback (exact stored tokens), write an adapter/model."""
    from taskrl.deploy.cycle import train_from_store
    from taskrl.training.config import load_config

    rows, out = train_from_store(load_config(config, overrides or []), store, model_name=model_name)
    last = rows[-1] if rows else {}
    Console(stderr=True).print(
        f"{len(rows)} updates on {int(last.get('charts/trained_trajectories', 0))} interactions; wrote {out} "
        "(serve it with POST /v1/load_lora_adapter)"
    )
