"""The training loop end to end on a tiny model: SFT warm-up then GRPO, run directory, hooks, CLI errors."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from taskrl.envs.builtin import PriceEnv
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.runlog import read_metrics, read_trajectories
from taskrl.scoring import Rubric, TermWeight
from taskrl.training.config import TrainConfig, config_from_dict
from taskrl.training.trainer import InProcessSync, Trainer, train
from taskrl.types import Task, Trajectory


def _config(tmp_path: Path, **changes: Any) -> TrainConfig:
    base = {"run_dir": str(tmp_path / "run"), "env": "price", "finetune": "lora", "lora.rank": 4, "steps": 3,
            "sft_warmup_steps": 1, "sft_lr": 1e-2, "lr": 1e-3, "rollout.tasks_per_step": 2, "rollout.group_size": 3,
            "rollout.max_turns": 3, "rollout.max_new_tokens": 40, "checkpoint_every": 2, "eval_every": 3,
            "eval_tasks": 2,
            "progress": False}  # fmt: skip
    return config_from_dict({**{**base, **changes}})


def _policy() -> HFPolicy:
    model, tokenizer = tiny_model(seed=0)
    return HFPolicy(model, tokenizer, device="cpu")


GROUPS: list[tuple[int, str]] = []


def group_bonus(trajectories: Sequence[Trajectory], task: Task | None) -> list[float]:
    """A group term: varies inside the group, so GRPO has something to learn; records the groups it sees."""
    GROUPS.append((len(trajectories), task.id if task else ""))
    return [0.1 * i for i in range(len(trajectories))]


class GroupBonusPriceEnv(PriceEnv):
    """Declares a group term on its rubric: the trainer's ``score`` computes it per group of K samples."""

    rubric = Rubric(group_terms=[TermWeight("group_bonus", fn=group_bonus)])


def test_sft_warmup_then_grpo_writes_a_complete_run_dir(tmp_path: Path) -> None:
    config = _config(tmp_path)
    GROUPS.clear()
    rows = train(config, policy=_policy(), env_factory=GroupBonusPriceEnv)
    assert [r["charts/phase"] for r in rows] == ["sft", "grpo", "grpo"]
    sft = rows[0]
    assert sft["rewards/correct"] == 1.0 and sft["losses/sft_nll"] > 0 and sft["charts/trained_trajectories"] == 2
    assert GROUPS and all(size == 3 for size, _ in GROUPS)  # expert steps have groups of 1: skipped
    for row in rows[1:]:
        assert row["rewards/group_bonus"] == pytest.approx(0.1) and row["charts/trained_tokens"] > 0
        assert row["rewards/weight/group_bonus"] == 1.0  # the rubric's weights at the step's clock are logged
        expected = {"losses/entropy", "charts/lr", "charts/tokens_per_s", "tools/tool_calls", "charts/dropped_groups"}
        assert expected <= set(row)
    assert "eval/success_rate" in rows[2] and "eval/mean_reward" in rows[2]

    run = Path(config.run_dir)
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    assert sorted(read_trajectories(run)) == [1, 2, 3]
    assert json.loads((run / "config.json").read_text())["sft_warmup_steps"] == 1
    assert (run / "eval" / "step_000003.json").exists()
    assert (run / "checkpoints" / "latest").read_text() == "step_000003"
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000002", "step_000003"]
    assert (run / "policy" / "adapter_config.json").exists()


def test_score_applies_weights_and_keeps_the_invalid_call_cap(tmp_path: Path) -> None:
    weights = {"correct": {"kind": "linear", "start": 5.0, "end": 1.0, "steps": 4}}
    trainer = Trainer(_config(tmp_path, reward_weights=weights), policy=_policy())
    good = Trajectory(terms={"correct": 1.0, "other": 0.25}, metrics={"invalid_tool_calls": 0})
    cheat = Trajectory(terms={"correct": 1.0}, metrics={"invalid_tool_calls": 1})
    trainer.score(2, [good, cheat])  # weight 3 at step 2 of 4
    assert good.rewards == {"correct": 3.0, "other": 0.25}
    assert cheat.rewards["correct"] == 3.0 and cheat.reward == 0.0  # an invalid call never beats a failure
    trainer.close()


def test_in_process_sync_needs_the_shared_model() -> None:
    policy = _policy()
    with pytest.raises(ValueError, match="does not hold the learner's model"):
        InProcessSync(policy, object())
    sync = InProcessSync(policy, policy.model)
    sync(4)
    assert policy.version == 4


def test_sft_expert_needs_a_scripted_rule(tmp_path: Path) -> None:
    from taskrl.env import ToolEnv

    class NoExpert(ToolEnv):
        def tasks(self, split: str = "train") -> list[Task]:
            return [Task("t", "hi")]

    with pytest.raises(ValueError, match="sft_data='expert' needs env 'price' to define scripted_rule"):
        Trainer(_config(tmp_path), policy=_policy(), env_factory=NoExpert)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from taskrl.cli import main; main()", "train", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_cli_errors_are_one_line_naming_the_field(tmp_path: Path) -> None:
    cases = {
        ("--set", "algo.name=dpo"): "algo.name must be one of",
        ("--set", "learning_rate=1e-4"): "unknown config key(s): learning_rate",
        (str(tmp_path / "missing.toml"),): "not found; see recipes/",
        ("--set", "steps"): "is not key=value",
        ("--set", "temperature=0.5"): "temperature moved to rollout.temperature",
    }
    for args, fix in cases.items():
        run = _cli(*args, "--set", f'run_dir="{tmp_path / "never"}"')
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        assert run.returncode == 2 and len(lines) == 1 and fix in lines[0], (args, run.stderr)
    assert not (tmp_path / "never").exists()


def test_demo_path_on_a_tiny_model(tmp_path: Path) -> None:
    """`make demo` runs this code with SmolLM2 (minutes); here the same path runs on a tiny model."""
    from rich.console import Console

    from taskrl.commands.demo import run_demo

    model_dir = tmp_path / "tiny"
    model, tokenizer = tiny_model(seed=0)
    model.save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
    out = tmp_path / "demo"
    out.mkdir()
    (out / "config.json").write_text("{}")  # a previous demo's run is replaced
    console = Console(record=True, width=140)
    overrides = {"model": str(model_dir), "steps": 2, "eval_tasks": 2, "rollout.group_size": 2,
                 "rollout.tasks_per_step": 1,
                 "rollout.max_turns": 2, "rollout.max_new_tokens": 12, "dtype": "float32"}  # fmt: skip
    results = run_demo(out, device="cpu", console=console, overrides=overrides, sft_overrides={"steps": 1})
    assert {"start", "sft_only", "sft_grpo"} <= set(results) and results["sft_only_steps"] >= 1
    text = console.export_text()
    assert "SFT-only arm" in text and "SFT -> GRPO arm" in text and "+2 GRPO steps" in text
    assert "GRPO - SFT-only, paired over the 2 held-out tasks" in text and "verdict" in results["grpo_minus_sft_only"]
    # the verdict's scope, with the shapes the recipes train on: SFT-only 1-2 items, GRPO 3 items
    limits = results["grpo_minus_sft_only"]["limits"]
    assert "What one run of the demo can say" in text and "seed 0" in text and "1-2 items" in text
    assert any("SFT-only on 1-2 items, GRPO on 3 items" in limit for limit in limits)
    assert sorted(p.name for p in (out / "eval").iterdir()) == ["sft_grpo.json", "sft_only.json", "start.json"]
    assert [r["step"] for r in read_metrics(out / "grpo")] == [1, 2] and (out / "start" / "config.json").exists()
    assert not (out / "config.json").exists()
    sft_only = json.loads((out / "sft_only" / "config.json").read_text())
    assert sft_only["algo"]["name"] == "sft" and sft_only["model"] == str(out / "start")
    assert sft_only["seed"] != json.loads((out / "sft" / "config.json").read_text())["seed"]  # no replayed batches


def test_the_demo_verdict_is_the_paired_difference_between_the_arms() -> None:
    from taskrl.commands.demo import paired_difference

    def evaluation(successes: list[int]) -> dict[str, Any]:
        return {"per_task": [{"policies": {"policy": {"successes": s}}} for s in successes]}

    sft_only = evaluation([0] * 12 + [1] * 4)
    shapes = {"sft_shape": "1-2 items", "rl_shape": "3 items"}
    better = paired_difference(sft_only, evaluation([1] * 12 + [1] * 4), seed=0, **shapes)
    assert better["value"] == 0.75 and better["low"] > 0
    assert better["verdict"].startswith("in this run the SFT -> GRPO arm solved more held-out tasks")
    worse = paired_difference(evaluation([1] * 16), evaluation([0] * 14 + [1] * 2), seed=0, **shapes)
    assert worse["high"] < 0 and worse["verdict"].startswith("in this run the SFT-only arm solved more")
    # one task better, one worse, the rest equal: no verdict either way
    tie = paired_difference(evaluation([0, 1] + [1] * 14), evaluation([1, 0] + [1] * 14), seed=0, **shapes)
    assert tie["value"] == 0 and tie["low"] < 0 < tie["high"] and tie["verdict"].startswith("no difference")


def test_the_demo_verdict_states_what_one_run_cannot_say() -> None:
    """Issue 40: a won run reads as "in this run", never as "RL beats SFT", and names its limits: one seed, a CI
    over tasks not runs, arms trained on different shapes, no RFT control."""
    from taskrl.commands.demo import paired_difference

    def evaluation(successes: list[int]) -> dict[str, Any]:
        return {"per_task": [{"policies": {"policy": {"successes": s}}} for s in successes]}

    won = paired_difference(evaluation([0] * 16), evaluation([1] * 16), seed=7, sft_shape="1-2 items",
                            rl_shape="3 items")  # fmt: skip
    text = " ".join([won["verdict"], *won["limits"]])
    assert "beats" not in text and "in this run" in won["verdict"]
    one_run, shapes, rft = won["limits"]
    assert "one run, seed 7" in one_run and "which 16 held-out tasks were drawn, not the variance between" in one_run
    assert ">= 5 seeds" in one_run
    assert "SFT-only on 1-2 items, GRPO on 3 items" in shapes and "not RL with SFT in general" in shapes
    assert "rejection-sampling fine-tuning" in rft and "not measured by the demo" in rft
    # arms trained on the same shape: no shape caveat, the other two remain
    same = paired_difference(evaluation([0] * 16), evaluation([1] * 16), seed=7, sft_shape="3 items",
                             rl_shape="3 items")  # fmt: skip
    assert len(same["limits"]) == 2 and not any("different task shapes" in limit for limit in same["limits"])
