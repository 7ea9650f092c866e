"""experiments/reverse_text_scale.py: prime-rl's budget as defaults over reverse_text.py's study, and one
step of it end to end in bf16 on CPU with a tiny random model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from experiments import reverse_text, reverse_text_scale
from experiments.ladder import add_arguments
from taskrl.policies.models import tiny_model


def test_defaults_are_prime_rl_scale_with_reverse_text_seeds_and_evaluation() -> None:
    args = reverse_text_scale.parse_args(["--model-path", "smollm2"])
    assert (args.tasks_per_step, args.group_size, args.max_steps) == (16, 8, 20)  # 128 rollouts per step, 20 steps
    assert args.minutes == float("inf") and args.dtype == "bfloat16" and args.device == "auto"
    assert reverse_text_scale.SPEC is reverse_text.SPEC  # same env, arms, greedy held-out evaluation
    plain = argparse.ArgumentParser()
    add_arguments(plain, reverse_text.SPEC)
    same = plain.parse_args([])
    for field in ("seeds", "split", "eval_tasks", "eval_samples", "warm_steps", "warm_tasks", "lr", "sft_lr",
                  "rft_min_reward", "max_new_tokens"):  # fmt: skip
        assert getattr(args, field) == getattr(same, field), field


@pytest.mark.parametrize("argv, message", [
    ([], "--model-path is required"),
    (["--model-path", "smollm2", "--samples", "1"], "--samples must be >= 2"),
    (["--model-path", "smollm2", "--dtype", "bf16"], "--dtype must be"),
])  # fmt: skip
def test_bad_arguments_name_the_flag(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        reverse_text_scale.parse_args(argv)
    assert message in capsys.readouterr().err


def test_one_step_in_bf16_on_cpu_records_the_scaled_budget(tmp_path: Path) -> None:
    model_path = tmp_path / "tiny"
    model, tokenizer = tiny_model(seed=0)
    model.save_pretrained(str(model_path))
    tokenizer.save_pretrained(str(model_path))
    paths = reverse_text_scale.main([
        "--model-path", str(model_path), "--steps", "1", "--prompts", "2", "--samples", "2", "--seeds", "0",
        "--device", "cpu", "--eval-tasks", "64", "--warm-steps", "1", "--warm-tasks", "2", "--max-new-tokens", "16",
        "--arms", "grpo",
        "--runs-dir", str(tmp_path / "runs"), "--work-dir", str(tmp_path / "work"), "--threads", "1",
    ])  # fmt: skip
    records = [json.loads(p.read_text()) for p in paths]
    assert [r["arm"] for r in records] == ["start", "grpo"]  # the warm start, then the arm from it
    assert all(r["study"] == "reverse_text" and r["design"] == "scale128" and r["split"] == "val" for r in records)
    assert all(r["held_out_tasks"] == 64 and 0.0 <= r["outcome"]["reward"]["value"] <= 1.0 for r in records)
    assert records[0]["warm_start"]["steps"] == 1 and records[0]["warm_start"]["config"]["dtype"] == "bfloat16"
    grpo = records[1]
    assert (grpo["config"]["dtype"], grpo["config"]["device"], grpo["config"]["algo.name"]) == ("bfloat16", "cpu",
                                                                                                "grpo")
    assert (grpo["config"]["rollout.tasks_per_step"], grpo["config"]["rollout.group_size"]) == (2, 2)
    assert grpo["budget"]["steps"] == 1 and not grpo["budget"]["time_limited"] and grpo["budget"]["episodes"] == 4
