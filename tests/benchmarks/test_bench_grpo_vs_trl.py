"""benchmarks/grpo_vs_trl.py: the taskrl side does the work the comparison fixes (one step on a tiny model).

TRL itself is not run here (it is a `bench` extra, not a test dependency); the script's own run prints both.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from taskrl.env import acheck_env
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.training.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import grpo_vs_trl as bench  # noqa: E402


def _args(**overrides: object) -> argparse.Namespace:
    values = {"seed": 0, "device": "cpu", "lora_rank": 4, "lora_alpha": 8, "group_size": 8,
              "max_completion_length": 64, "lr": 1e-5}  # fmt: skip
    return argparse.Namespace(**{**values, **overrides})


async def test_prompt_env_passes_the_env_check() -> None:
    await acheck_env(bench.PromptEnv())


def test_reward_is_continuous_in_the_text() -> None:
    assert bench.reward_of("") == 0.0
    assert bench.reward_of("the cat the dog") == pytest.approx(3 / 64)
    assert bench.reward_of("a b c") > bench.reward_of("a a a")


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_config_fixes_what_the_comparison_fixes(tmp_path: Path, mode: str) -> None:
    config = bench.taskrl_config(_args(), mode, str(tmp_path))
    assert (config.finetune, config.rollout.tasks_per_step, config.rollout.group_size,
            config.rollout.max_turns) == (mode, 1, 8, 1)
    assert (config.rollout.max_new_tokens, config.rollout.temperature, config.rollout.top_p, config.kl) == (64, 1.0,
                                                                                                            1.0, "none")
    assert (config.epochs_per_batch, config.minibatches, config.dtype) == (1, 1, "float32")
    assert config.lora.targets == bench.LORA_TARGETS and not config.algo.drop_zero_variance
    assert (config.learner_precision, config.gradient_checkpointing) == ("float32", False)
    best = bench.taskrl_config(_args(), mode, str(tmp_path), "best")  # bf16 where accelerated + checkpointing
    assert (best.learner_precision, best.gradient_checkpointing, best.dtype) == ("auto", True, "float32")
    assert best.to_dict() | {"learner_precision": "float32", "gradient_checkpointing": False} == config.to_dict()


def test_cpu_line_names_the_model_and_the_bf16_flags() -> None:
    line = bench.cpu_line()
    assert line.startswith("CPU: ") and "amx_bf16" in line and "avx512_bf16" in line


def test_in_order_sampler_walks_the_prompts_and_resumes() -> None:
    tasks = list(bench.PromptEnv().tasks())
    sampler = bench.InOrder(tasks)
    first = [sampler.sample(step, 1, None)[0].prompt for step in range(len(tasks) + 1)]
    assert first == [*bench.PROMPTS, bench.PROMPTS[0]]
    resumed = bench.InOrder(tasks)
    resumed.load_state_dict(sampler.state_dict())
    assert resumed.sample(0, 1, None)[0].prompt == bench.PROMPTS[1]


def test_one_step_trains_on_eight_samples_of_the_first_prompt(tmp_path: Path) -> None:
    model, tokenizer = tiny_model(seed=0)
    config = bench.taskrl_config(_args(max_completion_length=4), "full", str(tmp_path / "run"))
    policy = HFPolicy(model, tokenizer, device="cpu")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = Trainer(config, policy=policy, env_factory=bench.PromptEnv,
                      task_sampler=bench.InOrder(list(bench.PromptEnv().tasks())))  # fmt: skip
    try:
        (metrics,) = trainer.train(until=1)
        trajectories = trainer.collect(1)  # the next step's prompt, to check the order
    finally:
        trainer.close()
    assert metrics["charts/episodes"] == 8 and metrics["charts/trained_trajectories"] == 8
    assert 8 <= metrics["charts/sampled_tokens"] <= 8 * 4
    assert any(not p.detach().equal(before[n]) for n, p in model.named_parameters())
    assert {t.messages[1].content for t in trajectories} == {bench.PROMPTS[1]}
