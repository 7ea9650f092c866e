"""The ladder's arms (issue 40): RFT sees the same prompts and samples as many episodes as its GRPO arm, keeps only
verified successes, and every arm records its budget; held-out results carry honest intervals."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from experiments.arms import budget_of, grpo_config, held_out, model_dir, rft_config, sft_config, train_arm
from taskrl.env import make
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.runlog import read_trajectories


def _base(run_dir: Path) -> dict[str, Any]:
    return {"run_dir": str(run_dir), "env": "price", "finetune": "lora", "lora.rank": 4, "steps": 2,
            "rollout.max_turns": 2,
            "rollout.max_new_tokens": 12, "seed": 3, "progress": False, "checkpoint_every": 0,
            "eval_every": 0}  # fmt: skip


def _policy() -> HFPolicy:
    model, tokenizer = tiny_model(seed=0)
    return HFPolicy(model, tokenizer, device="cpu")


def test_rft_matches_its_grpo_arm_prompts_and_samples(tmp_path: Path) -> None:
    filtered = grpo_config(_base(tmp_path), lr=1e-3, tasks_per_step=2, group_size=3, overlong_filter=True,
                           entropy_coef=0.01)  # fmt: skip
    matched = rft_config(filtered, min_reward=1.0)
    assert matched["overlong_filter"] is True and "entropy_coef" not in matched  # the filter is matched, RL's own not
    rl = grpo_config(_base(tmp_path / "grpo"), lr=1e-3, tasks_per_step=2, group_size=3)
    rft = rft_config({**rl, "run_dir": str(tmp_path / "rft")}, min_reward=0.0, lr=1e-3)
    assert rft["algo.name"] == "sft" and rft["sft_data"] == "policy"
    budgets, prompts = {}, {}
    for name, config in (("grpo", rl), ("rft", rft)):
        trainer, budgets[name] = train_arm(config, minutes=30, policy=_policy())
        trainer.close()
        steps = read_trajectories(config["run_dir"])
        prompts[name] = {step: Counter(t.task_id for t in trajs) for step, trajs in steps.items()}
    assert prompts["rft"] == prompts["grpo"] and len(prompts["grpo"]) == 2  # the same prompts, step by step
    assert all(sum(c.values()) == 6 for c in prompts["rft"].values())  # K = 3 samples of 2 prompts per step
    assert budgets["rft"]["episodes"] == budgets["grpo"]["episodes"] == 12.0
    assert budgets["rft"]["steps"] == 2 and not budgets["rft"]["time_limited"]
    assert budgets["rft"]["trained_trajectories"] > 0  # min_reward 0 keeps every error-free sample


def test_rft_keeps_only_verified_successes(tmp_path: Path) -> None:
    rl = grpo_config(_base(tmp_path / "grpo"), lr=1e-3, tasks_per_step=2, group_size=2)
    trainer, budget = train_arm(rft_config(rl, min_reward=1.0), minutes=30, policy=_policy())
    trainer.close()
    assert budget["episodes"] == 8.0 and budget["trained_trajectories"] == 0.0  # a random model never succeeds


def test_sft_arm_clones_the_expert_and_the_held_out_eval_has_intervals(tmp_path: Path) -> None:
    config = sft_config({**_base(tmp_path / "sft"), "steps": 1, "rollout.max_new_tokens": 40}, lr=1e-3,
                        tasks_per_step=2)
    trainer, budget = train_arm(config, minutes=30, policy=_policy())
    try:
        assert budget["episodes"] == 2.0 and budget["rewards"] == [1.0]  # the expert solves every task
        tasks = list(make("price").tasks("test"))[:3]
        out = held_out(trainer, lambda: make("price"), tasks, samples=2, temperature=1.0, max_new_tokens=8,
                       max_turns=2, pass_ks=(1, 2))  # fmt: skip
    finally:
        trainer.close()
    assert out["tasks"] == 3 and out["successes"]["n"] == 6 and out["successes"]["wilson"][1] > 0
    assert "pass@2" in out and len(out["per_task_reward"]) == 3


def test_a_time_limit_stops_an_arm_and_is_recorded(tmp_path: Path) -> None:
    rl = grpo_config({**_base(tmp_path / "grpo"), "steps": 50}, lr=1e-3, tasks_per_step=1, group_size=2)
    trainer, budget = train_arm(rl, minutes=0.0, policy=_policy())
    trainer.close()
    assert budget["steps"] == 1 and budget["time_limited"]  # the first step always runs; then the limit holds
    assert budget_of([], 0.0, time_limited=False)["episodes"] == 0.0


def test_model_dir_refuses_what_it_cannot_load(tmp_path: Path) -> None:
    assert model_dir("smollm2", tmp_path) == "smollm2"
    with pytest.raises(SystemExit, match="config.json"):
        model_dir(tmp_path, tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(SystemExit, match="a .gguf file"):
        model_dir(tmp_path / "weights.bin", tmp_path)


@pytest.mark.smollm
def test_model_dir_dequantises_a_gguf_once_to_the_same_weights(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from taskrl.policies.models import smollm2_cache_path, smollm2_gguf_path

    path = model_dir(smollm2_gguf_path(), tmp_path)
    assert model_dir(smollm2_gguf_path(), tmp_path) == path  # converted once, then reused
    ours = load_file(str(Path(path) / "model.safetensors"))
    reference = load_file(str(smollm2_cache_path() / "model.safetensors"))
    assert ours.keys() == reference.keys() and all(torch.equal(ours[k], reference[k]) for k in reference)
    assert (Path(path) / "tokenizer.json").is_file()
