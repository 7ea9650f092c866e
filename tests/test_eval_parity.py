"""Eval parity (issue 15): for every registered env, ``taskrl eval`` and the trainer give the same per-trajectory
rewards for the same trajectories, group terms included, and no failed or invalid episode beats a failure.

Kept fast for CI: one task per env (a group of 3 samples still differs inside, so group terms are exercised), a
one-layer model that never samples (the trainer only scores here), one parametrised case per env."""

from __future__ import annotations

import asyncio
import copy
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from taskrl.env import Env, make, registry
from taskrl.envs.builtin import PriceEnv
from taskrl.eval import EvalConfig, evaluate
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.scoring import Clock, GateRule, Rubric, TermWeight
from taskrl.training.config import config_from_dict
from taskrl.training.trainer import Trainer
from taskrl.types import Message, Task, Trajectory

WRONG = ["I cannot do this.", '<tool_call>\n{"name": "no_such_tool", "arguments": {}}\n</tool_call>']


def _mixed_rule(env: Env, seed: int) -> Callable[[list[Message], Any], str]:
    """The env's own expert most turns, a give-up or an invalid call otherwise: episodes in one group differ."""
    rule, rng = env.scripted_rule, random.Random(seed)  # type: ignore[attr-defined]

    def mixed(messages: list[Message], tools: Any) -> str:
        return rule(messages, tools) if rng.random() < 0.6 else rng.choice(WRONG)

    return mixed


def _rank(group: Sequence[Trajectory], task: Task | None) -> list[float]:
    """A group term that differs inside a group: each sample's rank by reward."""
    order = sorted(range(len(group)), key=lambda i: (group[i].terms.get("correct") or 0.0, group[i].id))
    ranks = [0.0] * len(group)
    for r, i in enumerate(order):
        ranks[i] = r / max(1, len(group) - 1)
    return ranks


def _group_bonus(group: Sequence[Trajectory], task: Task | None) -> list[float]:
    return [0.1 * i for i in range(len(group))]


class GroupBonusPriceEnv(PriceEnv):
    """An env whose rubric declares only a group term (its measured ``correct`` weighs 1)."""

    name = "price-group-bonus"
    rubric = Rubric(group_terms=[TermWeight("group_bonus", fn=_group_bonus)])


class RubricPriceEnv(PriceEnv):
    """An env declaring its rubric: a weighted term, a group term, a gate."""

    name = "price-rubric"
    rubric = Rubric(
        terms=[TermWeight("correct", {"kind": "linear", "start": 2.0, "end": 1.0, "steps": 4})],
        group_terms=[TermWeight("rank", 0.5, fn=_rank)],
        gates=[GateRule("answered")],
        failure_reward=-0.5,
    )

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        return {**super().reward(trajectory), "answered": float(trajectory.final_answer is not None)}


ENVS: dict[str, Callable[[], Env]] = {name: (lambda name=name: make(name)) for name in sorted(registry())}
ENVS |= {"price-group-bonus": GroupBonusPriceEnv, "price-rubric": RubricPriceEnv}


@pytest.fixture(scope="module")
def tiny_policy() -> HFPolicy:
    model, tokenizer = tiny_model(seed=0, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                                  intermediate_size=32)  # fmt: skip
    return HFPolicy(model, tokenizer, device="cpu")


@pytest.mark.parametrize("name", sorted(ENVS))
def test_eval_and_the_trainer_score_the_same_trajectories_alike(
    name: str, tmp_path: Path, tiny_policy: HFPolicy
) -> None:
    factory = ENVS[name]
    env = factory()
    tasks = list(env.tasks("test") or env.tasks("train"))[:1]
    assert tasks, f"env '{name}' has no tasks"
    collected: list[Trajectory] = []
    scored: list[Trajectory] = []

    def keep(policy_name: str, traj: Trajectory) -> None:  # the episode as played, before any scoring of a batch
        collected.append(copy.deepcopy(traj))
        scored.append(traj)

    weights = {"correct": 3.0}
    config = EvalConfig(samples_per_task=3, max_turns=6, concurrency=3, seed=7, bootstrap_resamples=50)
    policy = ScriptedPolicy(_mixed_rule(env, seed=3))
    clock = Clock(step=2, epoch=1)
    result = asyncio.run(evaluate(
        factory, {"mixed": policy}, tasks, config, on_trajectory=keep, clock=clock, reward_weights=weights, step=2
    ))
    assert len(scored) == len(tasks) * 3

    cfg = config_from_dict({"run_dir": str(tmp_path / "run"), "env": name if name in registry() else "price",
                            "finetune": "lora", "lora.rank": 4, "steps": 1, "rollout.tasks_per_step": 1,
                            "rollout.group_size": 3, "reward_weights": weights, "progress": False})  # fmt: skip
    trainer = Trainer(cfg, policy=tiny_policy, env_factory=factory)
    try:
        trainer._clocks[2] = clock
        trainer.score(2, collected)
    finally:
        trainer.close()
    by_id = {t.id: t for t in collected}
    for traj in scored:
        assert traj.rewards == pytest.approx(by_id[traj.id].rewards, nan_ok=True), traj.id
        failure = trainer.rubric.failure_reward
        if traj.metrics.get("invalid_tool_calls", 0) > 0:
            assert traj.reward <= failure + 1e-9
    for row in result["per_task"]:
        mine = [t.reward for t in scored if t.task_id == row["task_id"]]
        assert row["policies"]["mixed"]["mean_reward"] == pytest.approx(sum(mine) / len(mine))
    if name == "price-group-bonus":  # the group term reached eval's rewards (it used to be training-only)
        assert sorted(t.rewards["group_bonus"] for t in scored)[-1] == pytest.approx(0.2)
    if name == "price-rubric":
        assert any(t.rewards.get("rank") for t in scored)
