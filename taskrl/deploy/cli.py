"""``taskrl serve`` (OpenAI-compatible server with logging, feedback and routing) and ``taskrl cycle`` (the loop).

    TASKRL_API_KEYS=KEY:TENANT TASKRL_ADMIN_KEY=ADMINKEY taskrl serve --policy hf --model smollm2 \\
        --store sqlite:///runs/serve/interactions.db --spool runs/serve/spool.jsonl

Keys are best given by environment variable (``TASKRL_API_KEYS``: ``KEY:TENANT`` pairs separated by commas or
newlines) or ``--api-keys-file`` (one ``KEY:TENANT`` per line), since command-line arguments show in ``ps``.
    taskrl cycle recipes/grpo_smollm2_lora.toml --store sqlite:///runs/cycle/interactions.db --cycle-s 18000
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from taskrl.deploy.config import ServeConfig
from taskrl.deploy.router import RouterConfig
from taskrl.deploy.store import InteractionStore

ADMIN_KEY_ENV = "TASKRL_ADMIN_KEY"
API_KEYS_ENV = "TASKRL_API_KEYS"
SALT_ENV = "TASKRL_ROUTER_SALT"


def _keys(api_keys: list[str] | None, keys_file: Path | None = None) -> dict[str, str]:
    items = [(f"--api-key {item!r}", item) for item in api_keys or []]
    env = os.environ.get(API_KEYS_ENV, "")
    parts = env.replace("\n", ",").split(",")
    items += [(f"${API_KEYS_ENV} entry {i + 1}", part.strip()) for i, part in enumerate(parts)]
    if keys_file is not None:
        try:
            lines = keys_file.read_text().splitlines()
        except OSError as exc:
            raise typer.BadParameter(f"--api-keys-file {keys_file}: {exc}") from exc
        items += [(f"{keys_file}:{n + 1}", line.strip()) for n, line in enumerate(lines)]
    out = {}
    for where, item in items:
        if not item or item.startswith("#"):
            continue
        key, sep, tenant = item.partition(":")
        if not sep or not key.strip() or not tenant.strip():
            raise typer.BadParameter(f"{where}: expected KEY:TENANT")
        out[key.strip()] = tenant.strip()
    return out


def default_spool(store_url: str) -> Path:
    """A spool file that belongs to this store only (a spool replays into the database it was written for)."""
    if store_url.startswith("sqlite:///"):
        return Path(store_url.removeprefix("sqlite:///") + ".spool.jsonl")
    digest = hashlib.blake2b(store_url.encode(), digest_size=6).hexdigest()
    return Path(f"taskrl-spool-{digest}.jsonl")


ROUTER_FLAGS = {
    "holdout": "--holdout",
    "stages": "--canary-stages",
    "min_samples": "--stage-sessions",
    "rollback_min_samples": "--rollback-sessions",
    "rollback_margin": "--rollback-margin",
    "advance_margin": "--advance-margin",
    "max_stage_samples": "--max-stage-sessions",
}
"""RouterConfig field -> the ``serve``/``cycle`` flag that sets it."""


def router_config(
    holdout: float = 0.05,
    stages: str = "0.01,0.05,0.2,1.0",
    stage_sessions: int = 100,
    rollback_sessions: int = 30,
    rollback_margin: float = 0.0,
    advance_margin: float = 0.1,
    max_stage_sessions: int = 0,
) -> RouterConfig:
    """The canary rule from ``serve``/``cycle`` flags; a bad value fails at start naming its flag."""
    try:
        shares = tuple(float(part) for part in stages.split(","))
    except ValueError as exc:
        raise typer.BadParameter(f"--canary-stages: expected comma-separated shares, got {stages!r}") from exc
    fields = {
        "holdout": holdout, "stages": shares, "min_samples": stage_sessions, "rollback_min_samples": rollback_sessions,
        "rollback_margin": rollback_margin, "advance_margin": advance_margin, "max_stage_samples": max_stage_sessions,
    }  # fmt: skip
    try:
        return RouterConfig(salt=os.environ.get(SALT_ENV) or None, **fields)  # type: ignore[arg-type]
    except ValueError as exc:
        flag = next((flag for name, flag in ROUTER_FLAGS.items() if f"RouterConfig.{name} " in str(exc)), "router")
        raise typer.BadParameter(f"{flag}: {exc}") from exc


def _serve_config(
    api_keys: list[str] | None,
    admin_keys: list[str] | None,
    router: RouterConfig,
    keys_file: Path | None = None,
    **extra: Any,
) -> ServeConfig:
    admins = list(admin_keys or [])
    if os.environ.get(ADMIN_KEY_ENV):  # keeps the key out of the process list
        admins.append(os.environ[ADMIN_KEY_ENV])
    return ServeConfig(api_keys=_keys(api_keys, keys_file), admin_keys=tuple(admins), router=router, **extra)


StoreOpt = Annotated[str, typer.Option("--store", help="interaction store URL (sqlite:///file.db or postgresql+...)")]
ApiKeyOpt = Annotated[
    list[str] | None, typer.Option("--api-key", help=f"KEY:TENANT for chat and feedback (repeat; or ${API_KEYS_ENV})")
]
KeysFileOpt = Annotated[Path | None, typer.Option("--api-keys-file", help="file of KEY:TENANT lines")]
AdminOpt = Annotated[list[str] | None, typer.Option("--admin-key", help=f"admin key (repeat; or ${ADMIN_KEY_ENV})")]
HoldoutOpt = Annotated[float, typer.Option("--holdout", help="share of sessions kept on the previous version")]
StagesOpt = Annotated[str, typer.Option("--canary-stages", help="canary shares of non-holdout sessions, ending at 1")]
StageSessionsOpt = Annotated[
    int, typer.Option("--stage-sessions", help="counted sessions with feedback a canary stage needs before it advances")
]
RollbackSessionsOpt = Annotated[
    int, typer.Option("--rollback-sessions", help="candidate sessions with feedback before the live test runs")
]
RollbackMarginOpt = Annotated[
    float, typer.Option("--rollback-margin", help="roll back when the live CI's upper end is below -this")
]
AdvanceMarginOpt = Annotated[
    float, typer.Option("--advance-margin", help="advance/promote only when the live CI's lower end is >= -this")
]
MaxStageOpt = Annotated[
    int, typer.Option("--max-stage-sessions", help="roll back a stage still inconclusive after this many (0: 10x)")
]


def serve_command(
    policy: Annotated[str, typer.Option(help="hf, openai (proxy an upstream server) or scripted")] = "hf",
    model: Annotated[str, typer.Option(help="smollm2, a save_pretrained dir, or the upstream model name")] = "smollm2",
    name: Annotated[str, typer.Option(help="served model name (what clients pass as model)")] = "taskrl",
    base_url: Annotated[str | None, typer.Option(help="upstream /v1 URL for --policy openai")] = None,
    env: Annotated[str | None, typer.Option(help="env whose scripted_rule serves (--policy scripted)")] = None,
    store: StoreOpt = "sqlite:///interactions.db",
    api_key: ApiKeyOpt = None,
    api_keys_file: KeysFileOpt = None,
    admin_key: AdminOpt = None,
    holdout: HoldoutOpt = 0.05,
    canary_stages: StagesOpt = "0.01,0.05,0.2,1.0",
    stage_sessions: StageSessionsOpt = 100,
    rollback_sessions: RollbackSessionsOpt = 30,
    rollback_margin: RollbackMarginOpt = 0.0,
    advance_margin: AdvanceMarginOpt = 0.1,
    max_stage_sessions: MaxStageOpt = 0,
    spool: Annotated[
        Path | None,
        typer.Option(help="outage spool file (default: beside a SQLite file, else taskrl-spool-<url hash>.jsonl)"),
    ] = None,
    spool_max_rows: Annotated[int, typer.Option(help="spool bound; when full, responses are refused (503)")] = 100_000,
    fail_closed: Annotated[bool, typer.Option(help="no spool: refuse responses (503) while the store is down")] = False,
    timeout_s: Annotated[float, typer.Option(help="per-request generation time limit (504 past it)")] = 600.0,
    rate_limit: Annotated[int | None, typer.Option(help="requests per minute per tenant (429 past it)")] = None,
    max_concurrent: Annotated[int | None, typer.Option(help="concurrent requests per tenant (429 past it)")] = None,
    drain_s: Annotated[float, typer.Option(help="on SIGTERM, seconds in-flight requests get to finish")] = 30.0,
    allow_runtime_lora: Annotated[bool, typer.Option(help="enable /v1/load_lora_adapter (admin key needed)")] = False,
    adapter_root: Annotated[Path | None, typer.Option(help="adapters load only from below this directory")] = None,
    backend: Annotated[
        str, typer.Option(help="taskrl (the --policy engine) or vllm (vLLM samples --model, token in/out)")
    ] = "taskrl",
    vllm: Annotated[
        list[str] | None,
        typer.Option("--vllm", help="--backend vllm: a VLLMServerConfig field=value (repeat), e.g. threads=0-1"),
    ] = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    device: str = "auto",
) -> None:
    """Serve a policy OpenAI-compatibly, log every interaction, accept feedback, route versions.

    ``--backend vllm`` starts a supervised local vLLM over ``--model`` (or uses the vLLM at ``--base-url``) and
    samples from it; canary versions loaded with ``/v1/load_lora_adapter`` become adapters in that vLLM."""
    from taskrl.deploy.server import serve
    from taskrl.env import make
    from taskrl.policies import make_policy

    router = router_config(
        holdout, canary_stages, stage_sessions, rollback_sessions, rollback_margin, advance_margin, max_stage_sessions
    )
    config = _serve_config(
        api_key, admin_key, router, api_keys_file,
        generation_timeout_s=timeout_s, rate_limit_per_minute=rate_limit, max_concurrent_per_tenant=max_concurrent,
        drain_timeout_s=drain_s, allow_runtime_lora=allow_runtime_lora,
        adapter_root=str(adapter_root) if adapter_root is not None else None,
    )  # fmt: skip
    engine = None
    if backend == "vllm":
        engine, served = _vllm_backend(policy, model, base_url, vllm)
    elif backend == "taskrl":
        served = make_policy(policy, model=model, base_url=base_url, device=device, env=make(env) if env else None)
    else:
        raise typer.BadParameter(f"--backend must be taskrl or vllm, got {backend!r}")
    spool_path = None if fail_closed else (spool or default_spool(store))
    durability = "fail closed on store errors" if fail_closed else f"outage spool {spool} ({spool_max_rows} rows)"
    try:
        with InteractionStore(store, spool_path=spool_path, spool_max_rows=spool_max_rows) as interactions:
            Console(stderr=True).print(f"serving {name!r} on http://{host}:{port}/v1, logging to {store}; {durability}")
            serve({name: served}, host, port, store=interactions, config=config)
    finally:
        if engine is not None:
            engine.stop()


def _vllm_backend(policy: str, model: str, base_url: str | None, settings: list[str] | None) -> tuple[Any, Any]:
    """``--backend vllm``: the vLLM server (started here, or the one at --base-url) and the policy it samples."""
    from taskrl.deploy.vllm_backend import start_vllm_backend
    from taskrl.policies.vllm_server import VLLMServerError
    from taskrl.training.config import ConfigError, parse_overrides

    if policy != "hf":
        raise typer.BadParameter(f"--policy {policy} cannot go with --backend vllm: vLLM samples --model itself")
    try:
        table = parse_overrides(list(settings or []))
    except ConfigError as exc:
        raise typer.BadParameter(f"--vllm: {exc}") from exc
    served_name = str(table.pop("served_name", "base"))
    try:
        return start_vllm_backend(model, base_url=base_url, served_name=served_name, settings=table)
    except ValueError as exc:
        raise typer.BadParameter(f"--vllm: {exc}") from exc
    except VLLMServerError as exc:
        raise typer.BadParameter(f"--backend vllm: {exc}") from exc


def cycle_command(
    config: Annotated[Path | None, typer.Argument(help="TrainConfig TOML (model, algo, lr, env for the gate)")] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="override a TrainConfig field")] = None,
    name: Annotated[str, typer.Option(help="served model name")] = "taskrl",
    store: StoreOpt = "sqlite:///interactions.db",
    api_key: ApiKeyOpt = None,
    api_keys_file: KeysFileOpt = None,
    admin_key: AdminOpt = None,
    cycle_s: Annotated[float, typer.Option(help="seconds per cycle (Cursor: ~5 h = 18000)")] = 18000.0,
    cycles: Annotated[int, typer.Option(help="cycles to run; 0 = until interrupted")] = 0,
    min_trajectories: Annotated[int, typer.Option(help="labelled interactions needed to train")] = 64,
    rollout: Annotated[str, typer.Option(help="canary or activate")] = "canary",
    suite_tasks: Annotated[int, typer.Option(help="eval tasks of the config's env played per policy by the gate")] = 32,
    holdout: HoldoutOpt = 0.05,
    canary_stages: StagesOpt = "0.01,0.05,0.2,1.0",
    stage_sessions: StageSessionsOpt = 100,
    rollback_sessions: RollbackSessionsOpt = 30,
    rollback_margin: RollbackMarginOpt = 0.0,
    advance_margin: AdvanceMarginOpt = 0.1,
    max_stage_sessions: MaxStageOpt = 0,
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

    router = router_config(
        holdout, canary_stages, stage_sessions, rollback_sessions, rollback_margin, advance_margin, max_stage_sessions
    )  # before loading anything: a bad flag fails at once
    train_config = load_config(config, overrides or [])
    cycle_config = CycleConfig(
        cycle_s=cycle_s,
        cycles=cycles,
        min_trajectories=min_trajectories,
        max_staleness=train_config.rollout.max_staleness,
        rollout=rollout,  # type: ignore[arg-type]
    )
    serve_config = _serve_config(api_key, admin_key, router, api_keys_file)
    base = HFPolicy.from_pretrained(train_config.model, device=train_config.device)
    served = HFPolicy(copy.deepcopy(base.model), base.tokenizer, name=name, device=base.device)
    learner = Learner(prepare_model(base.model, train_config), train_config, pad_id=base._pad_id)

    from taskrl.env import make

    env = make(train_config.env)
    try:  # the tasks evaluate_env plays, in its order, so the gate can pair stable and candidate by task
        eval_tasks = list(env.tasks("eval")) or list(env.tasks())
    except (TypeError, ValueError, KeyError):
        eval_tasks = list(env.tasks())
    task_ids = [str(task.id) for task in eval_tasks[:suite_tasks]]

    async def env_suite(policy: HFPolicy) -> dict[str, list[Any]]:
        scores = await evaluate_env(train_config.env, policy, n_tasks=suite_tasks, seed=train_config.seed)
        return {**scores, "task_ids": task_ids}

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

    try:
        rows, out = train_from_store(load_config(config, overrides or []), store, model_name=model_name)
    except ValueError as exc:
        Console(stderr=True).print(f"[red]train-from-store: {exc}[/red]")
        raise typer.Exit(1) from exc
    last = rows[-1] if rows else {}
    Console(stderr=True).print(
        f"{len(rows)} updates on {int(last.get('charts/trained_trajectories', 0))} interactions; wrote {out} "
        "(serve it with POST /v1/load_lora_adapter)"
    )
