"""``experiments.common.run_arm``, the arm loop every learning recipe runs: trained for its budget (no step
started that would end past it), a curve point on the way, final evaluations, a finished record left alone,
recovered steps keep the recipe's keys."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from experiments.common import lost_steps, run_arm, run_sft
from taskrl.policies.models import tiny_model

KEYS = ("rewards/total", "charts/step_time_s")


def _recipe() -> dict[str, Any]:
    calls: dict[str, list[Any]] = {"held_out": [], "final": []}

    def stage_config(arm: str, run_dir: Path, start: Path, args: argparse.Namespace) -> dict[str, Any]:
        return {"run_dir": str(run_dir), "env": "price", "model": str(start), "finetune": "lora", "lora.rank": 4,
                "algo.name": "grpo", "steps": 1000, "lr": 1e-3, "rollout.tasks_per_step": 1, "rollout.group_size": 2,
                "rollout.max_turns": 2,
                "rollout.max_new_tokens": 8, "checkpoint_every": 1, "eval_every": 0, "progress": False}  # fmt: skip

    def held_out(trainer: Any, name: str, args: argparse.Namespace, *, n: int, sampled: bool) -> dict[str, Any]:
        calls["held_out"].append((name, trainer.completed, n, sampled))
        return {"success": {"value": 0.5}, "tasks": n, "per_task": [0.5] * n}

    def final_evals(trainer: Any, args: argparse.Namespace) -> dict[str, Any]:
        calls["final"].append(trainer.completed)
        return {"greedy": {"success": {"value": 0.25}}}

    return {"stage_config": stage_config, "held_out": held_out, "final_evals": final_evals, "calls": calls}


def _start(tmp_path: Path) -> Path:
    """A tiny model saved as the arms' starting checkpoint."""
    model, tokenizer = tiny_model()
    start = tmp_path / "start"
    model.save_pretrained(str(start))
    tokenizer.save_pretrained(str(start))
    return start


def test_an_arm_trains_for_its_budget_with_a_curve_point_then_final_evals(tmp_path: Path) -> None:
    start = _start(tmp_path)
    recipe = _recipe()
    calls = recipe.pop("calls")
    args = argparse.Namespace(threads=1, minutes=0.02, curve_points=1, curve_tasks=3)  # a 1.2 s budget
    run_arm("grpo", tmp_path, start, args, step_keys=KEYS, **recipe)
    record = json.loads((tmp_path / "grpo.json").read_text())
    steps = record["steps"]
    assert steps and [s["step"] for s in steps] == list(range(1, len(steps) + 1))
    # No step starts that the previous one's duration says would end past the budget (a step may still run longer
    # than its forecast: the check is on the forecast, not on timing luck); it stopped for that reason.
    ends = [0.0, 0.0] + [s["train_s"] for s in steps]
    assert all(ends[i - 1] + (ends[i - 1] - ends[i - 2]) <= 1.2 for i in range(3, len(ends)))
    assert record["train_s"] + (ends[-1] - ends[-2]) > 1.2
    assert set(steps[0]) == {"step", "train_s", *KEYS}
    assert [c["step"] for c in record["curve"]] == [calls["held_out"][0][1]] and "per_task" not in record["curve"][0]
    assert calls["held_out"][0][2:] == (3, False) and record["final"] == {"greedy": {"success": {"value": 0.25}}}
    run_arm("grpo", tmp_path, start, args, step_keys=KEYS, **recipe)  # finished: nothing runs again
    assert calls["final"] == [len(steps)]


def test_an_arm_stops_at_its_step_budget_before_its_time_budget(tmp_path: Path) -> None:
    """``--max-steps`` (the config's ``steps``) is a budget too: RFT and GRPO matched by steps, not by minutes."""
    start = _start(tmp_path)
    recipe = _recipe()
    calls = recipe.pop("calls")
    config = recipe["stage_config"]
    recipe["stage_config"] = lambda *a: {**config(*a), "steps": 2}
    args = argparse.Namespace(threads=1, minutes=60.0, curve_points=0, curve_tasks=1)
    run_arm("grpo", tmp_path, start, args, step_keys=KEYS, **recipe)
    record = json.loads((tmp_path / "grpo.json").read_text())
    assert [s["step"] for s in record["steps"]] == [1, 2] and calls["final"] == [2]


def test_the_sft_only_arm_draws_its_own_task_order(tmp_path: Path) -> None:
    """From the warm start's seed the arm's sampler would replay the warm start's batches first."""
    from taskrl.seeding import sft_only_seed

    start = _start(tmp_path)
    recipe = _recipe()
    recipe.pop("calls")
    args = argparse.Namespace(threads=1, minutes=0.001, curve_points=0, curve_tasks=1)
    run_arm("sft_only", tmp_path, start, args, step_keys=KEYS, **recipe)
    assert json.loads((tmp_path / "sft_only.json").read_text())["config"]["seed"] == sft_only_seed(0) != 0


def test_recovered_steps_carry_the_recipe_keys(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "charts/step_time_s": 2.0, "rewards/total": 1.0}))
    rows = lost_steps(tmp_path, [], completed=1, keys=KEYS)
    assert rows == [{"step": 1, "train_s": 2.0, "rewards/total": 1.0, "charts/step_time_s": 2.0, "recovered": True}]


def test_the_warm_start_is_trained_merged_evaluated_and_kept(tmp_path: Path) -> None:
    model, tokenizer = tiny_model()
    base = tmp_path / "base"
    model.save_pretrained(str(base))
    tokenizer.save_pretrained(str(base))
    evaluated: list[int] = []

    def stage_config(stage: str, run_dir: Path, start: Path | None, args: argparse.Namespace) -> dict[str, Any]:
        config = {"run_dir": str(run_dir), "env": "price", "finetune": "lora", "lora.rank": 4,
                  "rollout.tasks_per_step": 1,
                  "rollout.group_size": 2, "rollout.max_turns": 2, "rollout.max_new_tokens": 8, "eval_every": 0,
                  "progress": False}  # fmt: skip
        if stage == "sft":
            return {**config, "algo.name": "sft", "sft_data": "expert", "model": str(base), "steps": args.sft_steps}
        return {**config, "algo.name": "sft", "model": str(start), "steps": 1}

    def start_evals(trainer: Any) -> dict[str, Any]:
        evaluated.append(trainer.completed or 0)
        return {"greedy": {"success": {"value": 1.0}}}

    args = argparse.Namespace(threads=1, sft_steps=2)
    run_sft(tmp_path / "sft_seed_0", args, stage_config=stage_config, start_evals=start_evals)
    record = json.loads((tmp_path / "sft_seed_0" / "start.json").read_text())
    assert (tmp_path / "sft_seed_0" / "start" / "config.json").exists() and evaluated == [0]
    assert record["sft_steps"] == 2 and len(record["sft_nll"]) == 2 and record["greedy"]["success"]["value"] == 1.0
    run_sft(tmp_path / "sft_seed_0", args, stage_config=stage_config, start_evals=start_evals)  # kept
    assert evaluated == [0]
    with pytest.raises(SystemExit, match="another config; pass --redo-sft"):
        run_sft(tmp_path / "sft_seed_0", argparse.Namespace(threads=1, sft_steps=3), stage_config=stage_config,
                start_evals=start_evals)  # fmt: skip


def test_fresh_dirs_and_save_seed(tmp_path: Path) -> None:
    from experiments.common import fresh_dirs, save_seed

    seed_dir, sft_dir = tmp_path / "seed_0", tmp_path / "sft_seed_0"
    for d in (seed_dir, sft_dir):
        d.mkdir()
        (d / "old").write_text("x")
    fresh_dirs(seed_dir, sft_dir, argparse.Namespace(resume=False, redo_sft=False))
    assert not (seed_dir / "old").exists() and (sft_dir / "old").exists()  # the warm start is kept
    path = tmp_path / "docs" / "recipe.json"
    save_seed(path, 0, {"a": 1})
    assert save_seed(path, 1, {"b": 2}) == {"seeds": {"0": {"a": 1}, "1": {"b": 2}}}
    assert json.loads(path.read_text())["seeds"]["0"] == {"a": 1}
