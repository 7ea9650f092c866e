"""experiments_curve.py: its arms are valid `price`-recipe configs and its plot renders from a record."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from taskrl.training.config import config_from_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import learning_curve as bench  # noqa: E402


def _args() -> argparse.Namespace:
    return argparse.Namespace(device="cpu", max_steps=10_000, sft_steps=3, eval_tasks=32, seed=0)


def test_arms_are_the_demo_recipe_with_and_without_the_sft_warm_start(tmp_path: Path) -> None:
    configs = {arm: config_from_dict(bench.arm_config(arm, tmp_path / arm, _args())) for arm in bench.ARMS}
    assert configs["grpo"].sft_warmup_steps == 0 and configs["sft+grpo"].sft_warmup_steps == 3
    for config in configs.values():
        assert (config.env, config.finetune, config.algo.name, config.lr) == (
            "price", "lora", "grpo", bench.PRICE_RECIPE["lr"],
        )  # fmt: skip
        assert config.steps == 10_000 and config.eval_tasks == 32


def test_plot_writes_a_png_from_arm_records(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    summary = {"success_rate": 0.5, "success_ci": [0.25, 0.75], "mean_reward": 0.5, "tool_calls": 1.0,
               "invalid_tool_calls": 0.0}  # fmt: skip
    steps = [{"step": i + 1, "phase": "sft" if i < 2 else "grpo", "reward": i / 10} for i in range(8)]
    records = [
        {"arm": "grpo", "config": {"eval_tasks": 4}, "steps": steps[2:], "before": summary, "after": summary},
        {"arm": "sft+grpo", "config": {"eval_tasks": 4}, "steps": steps, "before": summary,
         "after_sft": summary, "after": {**summary, "success_ci": [None, None]}},
    ]  # fmt: skip
    path = tmp_path / "curve.png"
    bench.plot(records, path, minutes=1)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
