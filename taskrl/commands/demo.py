"""`make demo` / `taskrl demo` (``demo_command``): what RL adds to an SFT warm start, on SmolLM2-135M-Instruct
and the `prices` env.

Every setting comes from two recipes (one source; ``taskrl train`` runs each alone):
1. ``recipes/demo_sft.toml``: LoRA SFT on the expert's one- and two-item price listings (the task's format, not
   a three-item listing), merged into the base model: the common starting checkpoint.
2. ``recipes/demo.toml``: the **SFT -> GRPO** arm, GRPO from that checkpoint on three-item listings.
3. The **SFT-only** arm continues recipe 1 from the same checkpoint for as long as the GRPO arm trained (in a
   task order of its own, so it does not first replay the warm start's batches).
The start and both arms are played greedily on the same held-out tasks of the RL recipe's shape (no item
combination shared with any training task); the table shows success with bootstrap CIs and each arm's paired
difference from the start. Results go to ``RUN_DIR/eval/{start,sft_only,sft_grpo}.json``.

The verdict says only what one run can: one seed, an interval over the held-out tasks (not over training runs),
arms that train on different task shapes, and no rejection-sampling (RFT) control; the seed-level comparisons of
GRPO, RFT and SFT are the studies in ``experiments/``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import tomllib
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
SFT_RECIPE = RECIPES / "demo_sft.toml"
RL_RECIPE = RECIPES / "demo.toml"
SHAPING_KWARGS = ("lookup_credit",)
"""Env kwargs that shape the training reward only; held-out success is scored without them."""


def load_recipe(path: Path) -> dict[str, Any]:
    """A demo recipe as a dict (validated later by ``config_from_dict``); a missing file names what to do."""
    if not path.is_file():
        raise FileNotFoundError(
            f"demo recipe {str(path)!r} not found: `taskrl demo` runs from a source checkout (recipes/ beside taskrl/)"
        )
    return tomllib.loads(path.read_text(encoding="utf-8"))


def _shape(env_kwargs: dict[str, Any]) -> str:
    """The task size a recipe asks for, e.g. "(1-2 items)" (empty when the env takes no item bounds)."""
    low, high = env_kwargs.get("min_items"), env_kwargs.get("max_items")
    if low is None or high is None:
        return ""
    return f"({low} items)" if low == high else f"({low}-{high} items)"


def _estimate(e: dict[str, Any], sign: str = "") -> str:
    ci = f" [{e['low']:{sign}.2f}, {e['high']:{sign}.2f}]" if e.get("low") is not None else ""
    return f"{e['value']:{sign}.2f}{ci}"


def _row(table: Table, name: str, steps: str, result: dict[str, Any], start: dict[str, Any] | None) -> None:
    stats = result["policies"]["policy"]
    delta = "-"
    if start is not None:
        ours, base = _successes(result), _successes(start)
        delta = f"{(sum(ours) - sum(base)) / max(len(ours), 1):+.2f}"
    table.add_row(name, steps, _estimate(stats["success_rate"]), delta, f"{stats['tool_calls']:.2f}",
                  f"{stats['invalid_tool_calls']:.2f}")  # fmt: skip


def _successes(result: dict[str, Any]) -> list[float]:
    """Per-task greedy success of one evaluation, in task order."""
    return [float(row["policies"]["policy"]["successes"]) for row in result["per_task"]]


def paired_difference(sft_only: dict[str, Any], grpo: dict[str, Any], seed: int, *, sft_shape: str = "",
                      rl_shape: str = "") -> dict[str, Any]:  # fmt: skip
    """GRPO minus SFT-only over the same held-out tasks: the mean per-task difference with a percentile-bootstrap
    95% CI (tasks resampled together), the verdict it supports about this run, and ``limits``: what one run of
    the demo cannot say. ``sft_shape``/``rl_shape``: the task shape each arm trains on (e.g. "1-2 items"). RL's
    contribution is this difference, never the GRPO arm against the warm start."""
    from taskrl.eval import paired_delta

    delta = paired_delta(_successes(sft_only), _successes(grpo), seed)
    low, high, tasks = delta["low"], delta["high"], len(sft_only["per_task"])
    if low is not None and low > 0:
        verdict = "in this run the SFT -> GRPO arm solved more held-out tasks than the SFT-only arm (CI above 0)"
    elif high is not None and high < 0:
        verdict = "in this run the SFT-only arm solved more held-out tasks than the SFT -> GRPO arm (CI below 0)"
    else:
        verdict = "no difference this run can resolve: the paired CI spans 0"
    limits = [
        f"one run, seed {seed}: the CI covers which {tasks} held-out tasks were drawn, not the variance between "
        "training runs (unmeasured here); a claim about the methods needs >= 5 seeds with the seed as the unit",
    ]
    if sft_shape != rl_shape:
        limits.append(
            f"the arms train on different task shapes (SFT-only on {sft_shape or 'its own tasks'}, GRPO on "
            f"{rl_shape or 'its own tasks'}, the held-out shape): this compares RL on the target shape with more "
            "imitation of another shape, not RL with SFT in general"
        )
    limits.append(
        "GRPO vs rejection-sampling fine-tuning (SFT on the policy's own verified samples, the same prompts and "
        "sample budget: the control for an RL claim) is not measured by the demo; the five-seed control ladder "
        "that measures it is docs/experiments/tool_use.md (experiments/tool_use.py --arms sft_only sft3 rft grpo)"
    )
    return {**delta, "tasks": tasks, "verdict": verdict, "limits": limits}


def run_demo(
    out_dir: Path,
    *,
    device: str = "auto",
    console: Console | None = None,
    overrides: dict[str, Any] | None = None,
    sft_overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train and evaluate as described in the module docstring; returns the eval results.

    ``overrides`` replace fields of both recipes, ``sft_overrides`` of the SFT recipe only (tests run the same
    path on a tiny model).
    """
    from taskrl.env import make
    from taskrl.eval import EvalConfig, evaluate
    from taskrl.policies.memory import release_freed
    from taskrl.seeding import sft_only_seed
    from taskrl.training.config import config_from_dict
    from taskrl.training.trainer import Trainer

    console = console or Console()
    common = {**(overrides or {}), "device": device, "resume": False, "progress": False}
    rl_recipe = {**load_recipe(RL_RECIPE), **common, "run_dir": str(out_dir / "grpo")}
    sft_recipe = {**load_recipe(SFT_RECIPE), **common, **(sft_overrides or {}), "run_dir": str(out_dir / "sft")}
    sft_config, rl_config = config_from_dict(dict(sft_recipe)), config_from_dict(dict(rl_recipe))
    if out_dir.exists():  # the previous demo's run: the demo always starts fresh
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    eval_kwargs = {k: v for k, v in rl_config.env_kwargs.items() if k not in SHAPING_KWARGS}
    tasks = list(make(rl_config.env, **eval_kwargs).tasks(rl_config.eval_split))[: rl_config.eval_tasks]
    eval_config = EvalConfig(samples_per_task=1, temperature=0.0, max_turns=rl_config.rollout.max_turns,
                             max_new_tokens=rl_config.rollout.max_new_tokens, concurrency=rl_config.rollout.concurrency,
                             seed=rl_config.seed)  # fmt: skip

    def held_out(trainer: Trainer, name: str) -> dict[str, Any]:
        factory = lambda: make(rl_config.env, **eval_kwargs)  # noqa: E731
        job = evaluate(factory, {"policy": trainer.learner_policy}, tasks, eval_config, run_log=trainer.run,
                       name=name)  # fmt: skip
        result = trainer.rollouts.run(job)
        (out_dir / "eval").mkdir(exist_ok=True)
        (out_dir / "eval" / f"{name}.json").write_text((trainer.run.dir / "eval" / f"{name}.json").read_text())
        return result

    began = time.perf_counter()
    console.print("loading SmolLM2-135M-Instruct (the first run converts the bundled GGUF and caches it) ...")
    console.print(
        f"1/4 warm start: {sft_config.steps} SFT steps on the expert's '{sft_config.env}' demonstrations "
        f"{_shape(sft_config.env_kwargs)} ({SFT_RECIPE.name})"
    )
    trainer = Trainer(sft_config, console=console)
    try:
        trainer.train()
        start = held_out(trainer, "start")
        start_dir = out_dir / "start"
        trainer.learner.model.merge_and_unload().save_pretrained(str(start_dir))
        trainer.learner_policy.chat_format.tokenizer.save_pretrained(str(start_dir))
    finally:
        trainer.close()
    del trainer  # each stage's model, optimizer and activations go before the next stage loads its own
    release_freed()
    console.print(f"2/4 SFT -> GRPO: {rl_config.steps} GRPO steps ({rl_config.rollout.tasks_per_step} tasks "
                  f"{_shape(rl_config.env_kwargs)} x {rl_config.rollout.group_size} samples each) from the warm start "
                  f"({RL_RECIPE.name})")  # fmt: skip
    trainer = Trainer(config_from_dict({**rl_recipe, "model": str(start_dir)}), console=console)
    try:
        rl_began = time.perf_counter()
        rl_rows = trainer.train()
        budget = time.perf_counter() - rl_began
        grpo = held_out(trainer, "sft_grpo")
    finally:
        trainer.close()
    del trainer  # each stage's model, optimizer and activations go before the next stage loads its own
    release_freed()
    console.print(f"3/4 SFT-only: more SFT on the same demonstrations for the same {budget:.0f}s of training")
    sft_only_recipe = {**sft_recipe, "model": str(start_dir), "run_dir": str(out_dir / "sft_only"), "steps": 10_000,
                       "seed": sft_only_seed(sft_config.seed)}  # fmt: skip
    trainer = Trainer(config_from_dict(sft_only_recipe), console=console)
    try:
        sft_began, sft_steps = time.perf_counter(), 0
        while sft_steps == 0 or time.perf_counter() - sft_began < budget:
            sft_steps += len(trainer.train(until=sft_steps + 1))
        sft_only = held_out(trainer, "sft_only")
    finally:
        trainer.close()
    del trainer  # each stage's model, optimizer and activations go before the next stage loads its own
    release_freed()
    console.print(f"4/4 held-out evaluation: {len(tasks)} tasks {_shape(eval_kwargs)}, greedy")
    table = Table(title=f"'{rl_config.env}' held-out tasks {_shape(eval_kwargs)}, {len(tasks)} tasks, greedy "
                  "(95% bootstrap CI)")  # fmt: skip
    for column in ("policy", "training", "success", "vs start", "tool calls", "invalid calls"):
        table.add_column(column, justify="left" if column in ("policy", "training") else "right")
    _row(table, "warm start (SFT)", f"{sft_config.steps} SFT steps", start, None)
    _row(table, "SFT-only arm", f"+{sft_steps} SFT steps", sft_only, start)
    _row(table, "SFT -> GRPO arm", f"+{rl_config.steps} GRPO steps", grpo, start)
    console.print(table)
    paired = paired_difference(sft_only, grpo, rl_config.seed, sft_shape=_shape(sft_config.env_kwargs).strip("()"),
                               rl_shape=_shape(rl_config.env_kwargs).strip("()"))  # fmt: skip
    console.print(f"GRPO - SFT-only, paired over the {paired['tasks']} held-out tasks: {_estimate(paired, '+')} "
                  f"({paired['verdict']})")  # fmt: skip
    console.print("What one run of the demo can say, and what it cannot:", highlight=False)
    for limit in paired["limits"]:
        console.print(f"- {limit}", highlight=False, markup=False)
    sampled = " -> ".join(f"{row['rewards/total']:.2f}" for row in rl_rows)
    console.print(f"GRPO training reward per step (temperature {rl_config.rollout.temperature}, partial credit "
                  "included): "
                  f"{sampled}")  # fmt: skip
    console.print(f"{time.perf_counter() - began:.0f}s in all; run dir {out_dir} (sft/, grpo/, sft_only/: "
                  f"metrics.jsonl, trajectories/; eval/): `taskrl report {out_dir / 'grpo'}`")  # fmt: skip
    return {"start": start, "sft_only": sft_only, "sft_grpo": grpo, "grpo_rows": rl_rows, "sft_only_steps": sft_steps,
            "grpo_minus_sft_only": paired}  # fmt: skip


def _show_episode(console: Console, traj: Any) -> None:
    console.rule(f"one episode: task {traj.task_id}, reward {traj.reward:.2f}")
    for m in traj.messages:
        if m.role == "system":
            continue
        text = m.content + "".join(f"\n-> {c.name}({json.dumps(c.arguments)})" for c in m.tool_calls)
        console.print(f"[bold]{m.role}[/bold]: {text.strip()[:400]}", markup=True, highlight=False)


def demo_command(
    out_dir: Annotated[Path, typer.Option(help="run directory (replaced on every demo)")] = Path("runs/demo"),
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:1 ...")] = "auto",
    seed: Annotated[int | None, typer.Option(help="seed of both recipes (default: the recipes' own, 0)")] = None,
) -> None:
    """What RL adds: SmolLM2-135M-Instruct, an SFT warm start on 1-2 item price listings, then an SFT-only arm
    and an SFT -> GRPO arm on 3-item listings, side by side on held-out tasks (recipes/demo*.toml). ``--seed``
    reruns the whole comparison with another seed (task order, sampling; the held-out tasks stay the same)."""
    from taskrl.runlog import read_trajectories

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    console = Console()
    if not console.is_terminal:  # logs and CI: wide enough that the summary tables are not wrapped
        console.width = max(console.width, 120)
    run_demo(out_dir, device=device, console=console, overrides=None if seed is None else {"seed": seed})
    after = read_trajectories(out_dir / "grpo", "sft_grpo-policy").get(0, [])
    if after:
        _show_episode(console, max(after, key=lambda t: (t.reward, t.metrics.get("tool_calls", 0))))
