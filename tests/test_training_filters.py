"""Dynamic sampling (DAPO) and overlong filtering: the pure functions, the learner's mask, the trainer's refill."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from taskrl.env import make
from taskrl.policies.base import SamplingParams
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.training.config import config_from_dict
from taskrl.training.filters import fill_batch, groups_of, overlong
from taskrl.training.learner import Learner
from taskrl.training.model import prepare_model
from taskrl.training.trainer import train
from taskrl.types import Trajectory


def _group(name: str, rewards: list[float]) -> list[Trajectory]:
    out = []
    for r in rewards:
        t = Trajectory(task_id=name, group_id=name)
        t.rewards["r"] = r
        out.append(t)
    return out


def test_overlong_means_cut_off_by_a_token_budget_only() -> None:
    def traj(truncated: bool, why: str | None) -> Trajectory:
        t = Trajectory(task_id="t", truncated=truncated)
        if why:
            t.info["truncation"] = why
        return t

    assert overlong(traj(True, "max_new_tokens")) and overlong(traj(True, "max_context_tokens"))
    assert not overlong(traj(True, "max_turns")) and not overlong(traj(True, "env"))
    assert not overlong(traj(False, None))


def test_fill_batch_drops_flat_groups_plays_more_and_trims() -> None:
    first = _group("a", [0, 0]) + _group("b", [0, 1]) + _group("c", [1, 1]) + _group("d", [1, 1])
    asked: list[tuple[int, int]] = []

    def play_more(round_: int, n: int) -> list[Trajectory]:
        asked.append((round_, n))
        return [t for i in range(n) for t in _group(f"r{round_}-{i}", [0.0, 0.5])]

    out = fill_batch(first, play_more, groups_wanted=4, max_rounds=3)
    # 1 of 4 groups had signal: 3 missing / (1/4) = 12 asked, capped at 4; the surplus 1 group is trimmed
    assert asked == [(1, 4)]
    assert [g[0].group_id for g in groups_of(out.train)] == ["b", "r1-0", "r1-1", "r1-2"]
    assert len(out.played) == 16
    assert out.metrics == {"charts/dynamic_rounds": 1.0, "charts/dynamic_drawn_groups": 8.0,
                           "charts/dynamic_dropped_groups": 3.0, "charts/dynamic_trimmed_groups": 1.0,
                           "charts/dynamic_kept_groups": 4.0}  # fmt: skip


def test_fill_batch_stops_after_max_rounds() -> None:
    def flat(round_: int, n: int) -> list[Trajectory]:
        return [t for i in range(n) for t in _group(f"x{round_}-{i}", [1, 1])]

    out = fill_batch(_group("a", [0, 0]) + _group("b", [0, 0]), flat, groups_wanted=2, max_rounds=2)
    assert out.train == [] and out.metrics["charts/dynamic_rounds"] == 2.0
    assert out.metrics["charts/dynamic_drawn_groups"] == 6.0 and out.metrics["charts/dynamic_dropped_groups"] == 6.0
    with pytest.raises(ValueError, match="max_rounds >= 0"):
        fill_batch([], flat, groups_wanted=1, max_rounds=-1)


def test_the_learner_gives_overlong_episodes_no_loss() -> None:
    model, tokenizer = tiny_model(seed=0)
    policy = HFPolicy(copy.deepcopy(model), tokenizer, device="cpu")
    tasks = list(make("price").tasks())[:2]
    config = RolloutConfig(max_turns=1, sampling=SamplingParams(max_new_tokens=4), group_size=4, seed=0)
    trajectories = asyncio.run(run_episodes(lambda: make("price"), policy, tasks, config))
    assert all(overlong(t) for t in trajectories)  # a random model never ends a turn in 4 tokens
    for i, t in enumerate(trajectories):
        t.rewards["synthetic"] = float(i % 3)
        if i % 4 == 0:  # one episode per group ends within the budget
            t.truncated, t.terminated = False, True
            t.info.pop("truncation")
            t.metrics["capped_turns"] = 0.0
    results = {}
    for flag in (False, True):
        cfg = config_from_dict(
            {
                "lr": 1e-2,
                "rollout.group_size": 4,
                "finetune": "lora",
                "lora.rank": 4,
                "progress": False,
                "overlong_filter": flag,
            }
        )
        torch.manual_seed(0)
        learner = Learner(prepare_model(copy.deepcopy(model), cfg), cfg, pad_id=0)
        results[flag] = learner.update(trajectories, step=0)
    assert results[False]["charts/trained_trajectories"] == 8.0 and "charts/overlong_filtered" not in results[False]
    assert results[True]["charts/trained_trajectories"] == 2.0 and results[True]["charts/overlong_filtered"] == 6.0
    assert results[True]["charts/trained_tokens"] < results[False]["charts/trained_tokens"]
    # RFT (SFT on the policy's own samples) with the filter clones no overlong success: the ladder's RFT arm takes
    # its RL arm's filter, or it would learn to lean on the cap from the successes GRPO is kept from training on
    for flag in (False, True):
        cfg = config_from_dict({"algo.name": "sft", "sft_data": "policy", "sft_min_reward": 0.0, "lr": 1e-2,
                                "finetune": "lora", "lora.rank": 4, "progress": False, "overlong_filter": flag})
        learner = Learner(prepare_model(copy.deepcopy(model), cfg), cfg, pad_id=0)
        results[flag] = learner.update(trajectories, step=0)
    assert results[False]["charts/trained_trajectories"] == 8.0 and "charts/overlong_filtered" not in results[False]
    assert results[True]["charts/trained_trajectories"] == 2.0 and results[True]["charts/overlong_filtered"] == 6.0


def test_the_trainer_refills_a_batch_of_flat_groups(tmp_path: Path) -> None:
    calls = {"n": 0}

    def spread_after_the_first_round(step: int, trajectories: list[Trajectory]) -> None:
        calls["n"] += 1
        for i, t in enumerate(trajectories):  # the first round is flat; later rounds vary inside every group
            t.terms["spread"] = 0.0 if calls["n"] == 1 else 0.1 * (i % 3)

    model, tokenizer = tiny_model(seed=0)
    base: dict[str, Any] = {"run_dir": str(tmp_path / "run"), "env": "price", "lora.rank": 4, "steps": 1,
                            "rollout.tasks_per_step": 2, "rollout.group_size": 3, "rollout.max_turns": 1,
                            "rollout.max_new_tokens": 8, "progress": False, "checkpoint_every": 0,
                            "dynamic_sampling": True, "dynamic_sampling_max_rounds": 2}  # fmt: skip
    (row,) = train(config_from_dict({**base}), policy=HFPolicy(model, tokenizer, device="cpu"),
                   score_fn=spread_after_the_first_round)  # fmt: skip
    assert row["charts/dynamic_rounds"] == 1.0 and row["charts/dynamic_drawn_groups"] == 4.0
    assert row["charts/dynamic_dropped_groups"] == 2.0 and row["charts/dynamic_kept_groups"] == 2.0
    assert row["charts/trained_trajectories"] == 6.0  # the two refilled groups, not the flat ones
    # every played episode (both rounds: 6 flat at 0, then 0, .1, .2, 0, .1, .2) is in the step's reward metrics
    assert row["rewards/total"] == pytest.approx(0.6 / 12)


def test_a_turn_cut_by_the_token_cap_is_counted_and_overlong_even_when_its_calls_ran() -> None:
    """The ladder's RL arms learned to let max_new_tokens end their lookup turn (the complete calls still ran and
    earned the reward); such episodes are overlong, so ``overlong_filter`` gives them no loss."""
    from taskrl.chat import ChatFormat
    from taskrl.policies.models import smollm2_tokenizer
    from taskrl.policies.scripted import ScriptedPolicy
    from taskrl.types import Message

    env = make("prices", min_items=2, max_items=2)
    task = env.tasks("test")[0]
    fmt = ChatFormat(smollm2_tokenizer())
    calls = env.scripted_rule([Message("system", ""), Message("user", task.prompt)], None)
    policy = ScriptedPolicy(env.scripted_rule, chat_format=fmt)
    cap = len(fmt.encode(calls))  # the lookup turn fills the cap exactly: no end-of-turn token fits
    config = RolloutConfig(max_turns=3, sampling=SamplingParams(max_new_tokens=cap), seed=0)
    capped = asyncio.run(run_episodes(lambda: make("prices", min_items=2, max_items=2), policy, [task], config))[0]
    assert capped.reward == 1.0 and capped.terminated and capped.metrics["capped_turns"] == 1.0
    assert overlong(capped)
    config = RolloutConfig(max_turns=3, sampling=SamplingParams(max_new_tokens=cap + 8), seed=0)
    ended = asyncio.run(run_episodes(lambda: make("prices", min_items=2, max_items=2), policy, [task], config))[0]
    assert ended.reward == 1.0 and ended.metrics["capped_turns"] == 0.0 and not overlong(ended)
