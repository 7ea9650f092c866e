"""`make demo` / `taskrl demo`: SmolLM2-135M-Instruct learns a built-in tool-use task, on embedded defaults.

The seed's recipe in miniature: a short SFT warm start on the ``price`` env's expert (token-exact episodes of
its ``scripted_rule``: SmolLM2 never writes a ``<tool_call>`` zero-shot, so pure GRPO would only see groups
with zero variance), then GRPO with LoRA on the model's own samples. Held-out tasks are played greedily before
training, after the SFT warm start and after GRPO; the results are printed with bootstrap CIs and written to
``RUN_DIR/eval/{before,after_sft,after}.json``.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

DEMO_CONFIG: dict[str, Any] = {
    "run_dir": "runs/demo",
    "model": "smollm2",
    "env": "price",
    "finetune": "lora",
    "lora_rank": 16,
    "lora_alpha": 32.0,
    "algo": "grpo",
    "steps": 8,
    "sft_warmup_steps": 3,
    "sft_data": "expert",
    "sft_lr": 1e-3,
    "lr": 2e-4,
    "tasks_per_step": 4,
    "group_size": 4,
    "max_turns": 3,
    "max_new_tokens": 40,
    "temperature": 1.0,
    "checkpoint_every": 4,
    "eval_tasks": 12,
    "seed": 0,
}
"""The demo run; ``recipes/demo.toml`` holds the same values for ``taskrl train`` (a test keeps them equal)."""


def _row(table: Table, name: str, result: dict[str, Any]) -> None:
    stats = result["policies"]["policy"]

    def estimate(key: str) -> str:
        e = stats[key]
        ci = f" [{e['low']:.2f}, {e['high']:.2f}]" if e.get("low") is not None else ""
        return f"{e['value']:.2f}{ci}"

    table.add_row(
        name,
        estimate("success_rate"),
        estimate("mean_reward"),
        f"{stats['tool_calls']:.2f}",
        f"{stats['invalid_tool_calls']:.2f}",
    )


def run_demo(
    out_dir: Path, *, device: str = "auto", console: Console | None = None, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Train and evaluate as described in the module docstring; returns the eval results.

    ``overrides`` replace ``DEMO_CONFIG`` fields (tests run the same path on a tiny model).
    """
    from taskrl.eval import EvalConfig, evaluate
    from taskrl.policies.scripted import ScriptedPolicy
    from taskrl.trainer import Trainer
    from taskrl.training.config import config_from_dict

    console = console or Console()
    config = config_from_dict(
        {**DEMO_CONFIG, **(overrides or {}), "run_dir": str(out_dir), "device": device, "resume": False}
    )
    if (out_dir / "config.json").exists():  # the previous demo's run: the demo always starts fresh
        shutil.rmtree(out_dir)
    start = time.perf_counter()
    console.print("loading SmolLM2-135M-Instruct (the first run converts the bundled GGUF and caches it) ...")
    trainer = Trainer(config, console=console)
    try:
        console.print(f"evaluating on {config.eval_tasks} held-out '{config.env}' tasks (greedy) ...")
        before = trainer.evaluate(0, name="before")
        console.print(
            f"training: {config.sft_warmup_steps} SFT steps on the env's expert, then "
            f"{config.steps - config.sft_warmup_steps} GRPO steps ({config.tasks_per_step} tasks x "
            f"{config.group_size} samples each), LoRA r={config.lora_rank}"
        )
        sft_rows = trainer.train(until=config.sft_warmup_steps)
        after_sft = trainer.evaluate(config.sft_warmup_steps, name="after_sft")
        rl_rows = trainer.train()
        after = trainer.evaluate(config.steps, name="after")
        tasks = list(trainer.env_factory().tasks(config.eval_split))[: config.eval_tasks]
        expert = ScriptedPolicy(trainer.env_factory().scripted_rule, chat_format=trainer.policy.chat_format)
        reference = asyncio.run(
            evaluate(trainer.env_factory, {"policy": expert}, tasks, EvalConfig(samples_per_task=1, temperature=0.0))
        )
    finally:
        trainer.close()
    table = Table(title=f"'{config.env}' env, {config.eval_tasks} held-out tasks, greedy (95% bootstrap CI)")
    for column in ("policy", "success rate", "mean reward", "tool calls", "invalid calls"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    _row(table, "SmolLM2-135M before", before)
    _row(table, f"after {config.sft_warmup_steps} SFT steps", after_sft)
    _row(table, f"after {config.steps - config.sft_warmup_steps} more GRPO steps", after)
    _row(table, "expert rule (reference)", reference)
    console.print(table)
    sampled = " -> ".join(f"{row['rewards/total']:.2f}" for row in rl_rows)
    console.print(
        f"training reward of the GRPO steps (episodes sampled at temperature {config.temperature}, "
        f"{config.tasks_per_step * config.group_size} per step): {sampled}; SFT steps: {len(sft_rows)}"
    )
    console.print(
        f"{time.perf_counter() - start:.0f}s in all; run dir {out_dir} "
        f"(metrics.jsonl, trajectories/, eval/, checkpoints/, policy/): `taskrl report {out_dir}`"
    )
    return {"before": before, "after_sft": after_sft, "after": after, "expert": reference}
