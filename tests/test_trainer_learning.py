"""A tiny model learns a trivially learnable task: mean reward rises clearly within 15 seeded steps.

The task: say anything; the reward is the share of sampled tokens with an even id (dense, 0.5 for a uniform
policy). A random model over a 49k vocabulary is almost uniform, so no token is sampled twice and nothing can
be learned in a few steps; scaling its (tied) embeddings makes it prefer a few dozen tokens, as a pretrained
model does, and RL then has to move mass between them. Only the embeddings train (``freeze``), which also
checks that frozen layers stay put through whole training runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from taskrl.env import ToolEnv
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.training.config import config_from_dict
from taskrl.training.trainer import train
from taskrl.types import Task, Trajectory


class ChatEnv(ToolEnv):
    """No tools; a turn without a tool call ends the episode."""

    name = "chat"
    system_prompt = "Talk."

    def tasks(self, split: str = "train") -> list[Task]:
        return [Task(f"t{i}", f"Say something about {w}.") for i, w in enumerate(("cats", "dogs", "tea", "rain"))]


def even_token_share(step: int, trajectories: list[Trajectory]) -> None:
    for t in trajectories:
        ids = [tok for s in t.segments for tok, m in zip(s.token_ids, s.loss_mask, strict=True) if m]
        t.terms["even_tokens"] = sum(tok % 2 == 0 for tok in ids) / max(len(ids), 1)


@pytest.mark.parametrize(("algo", "precision"), [("grpo", "float32"), ("ppo", "float32"), ("grpo", "bfloat16")])
def test_mean_reward_rises(tmp_path: Path, algo: str, precision: str) -> None:
    """``precision=bfloat16``: the learner runs under bf16 autocast over fp32 weights, sampling stays fp32."""
    model, tokenizer = tiny_model(seed=1)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(10.0)
    layers_before = {n: p.clone() for n, p in model.named_parameters() if "embed" not in n}
    config = config_from_dict({"run_dir": str(tmp_path / "run"), "env": "chat", "algo.name": algo, "finetune": "full",
                               "freeze": ["layers",
                                          "norm"], "lr": 1e-2, "steps": 15, "rollout.tasks_per_step": 4,
                                          "rollout.group_size": 8, "rollout.max_turns": 1, "rollout.max_new_tokens": 4,
                                          "seed": 0, "checkpoint_every": 0, "progress": False,
                                          "learner_precision": precision})  # fmt: skip
    policy = HFPolicy(model, tokenizer, device="cpu")
    rows = train(config, policy=policy, env_factory=ChatEnv, score_fn=even_token_share)
    rewards = [r["rewards/total"] for r in rows]
    first, last = sum(rewards[:2]) / 2, sum(rewards[-3:]) / 3
    assert first < 0.8 and last >= first + 0.2 and last >= 0.9, rewards
    mismatch = [r["losses/mismatch_kl"] for r in rows if "losses/mismatch_kl" in r]  # steps that trained
    if precision == "float32":
        assert max(mismatch) < 1e-6, mismatch  # same numerics on both sides
    else:
        assert 0 < max(mismatch) < 0.05, mismatch  # measured, and small enough for the IS weights to absorb
    for name, param in model.named_parameters():
        if name in layers_before:
            assert torch.equal(param, layers_before[name]), name
