"""A training step on a swarm env updates the orchestrator and leaves the frozen sub-agents bit-identical."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from taskrl.env import make
from taskrl.envs.swarm.env import SwarmEnv, SwarmEnvConfig
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.training.config import config_from_dict
from taskrl.training.trainer import train


def test_frozen_subagents_are_bit_identical_after_training(
    tmp_path: Path, wide_tasks_path: str, swarm_corpus: Any
) -> None:
    orchestrator_model, tokenizer = tiny_model(seed=1)
    helper_model, helper_tokenizer = tiny_model(seed=1)  # the same initial weights: a frozen copy
    helper = HFPolicy(helper_model, helper_tokenizer, device="cpu")
    helper_calls = 0
    generate = helper.generate

    async def counting_generate(**kwargs: Any) -> Any:
        nonlocal helper_calls
        helper_calls += 1
        return await generate(**kwargs)

    helper.generate = counting_generate  # type: ignore[method-assign]
    before = {n: p.detach().clone() for n, p in helper_model.named_parameters()}
    orchestrator_before = {n: p.detach().clone() for n, p in orchestrator_model.named_parameters()}
    config = SwarmEnvConfig(tasks=wide_tasks_path, corpus=str(swarm_corpus.path), subagent_max_steps=1,
                            subagent_max_new_tokens=4)  # fmt: skip

    def env_factory() -> SwarmEnv:
        return SwarmEnv(config, subagent_policy=helper, subagent_env_factory=lambda: make("noop"))

    train_config = config_from_dict({"run_dir": str(tmp_path / "run"), "env": "swarm", "algo.name": "grpo",
                                     "finetune": "full", "lr": 1e-2, "steps": 1, "sft_warmup_steps": 1,
                                     "sft_data": "expert", "sft_lr": 1e-2, "sft_min_reward": 0.0,
                                     "rollout.tasks_per_step": 1, "rollout.group_size": 2, "rollout.max_turns": 2,
                                     "rollout.max_new_tokens": 1024, "rollout.max_context_tokens": 2048, "seed": 0,
                                     "checkpoint_every": 0, "progress": False})  # fmt: skip
    policy = HFPolicy(orchestrator_model, tokenizer, device="cpu")
    rows = train(train_config, policy=policy, env_factory=env_factory)
    assert rows and helper_calls >= 3  # the expert's fan-out ran three sub-agents during the step
    for name, param in helper_model.named_parameters():
        assert torch.equal(param, before[name]), name
    changed = [n for n, p in orchestrator_model.named_parameters() if not torch.equal(p, orchestrator_before[n])]
    assert changed  # the orchestrator did learn from the same episodes
