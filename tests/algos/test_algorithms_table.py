"""The algorithms table (issue 15): every registered algorithm trains through the one learner, a new one is a
table entry, an unknown name fails at config time listing the choices, and the learner never branches on a name."""

from __future__ import annotations

import ast
import asyncio
import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

import taskrl.training.learner as learner_module
from taskrl.algos import ALGORITHMS, Algorithm, UnknownAlgorithmError, algorithm, grpo
from taskrl.algos.algorithm import AlgoConfig
from taskrl.algos.losses import Tensor
from taskrl.env import make
from taskrl.policies.base import SamplingParams
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.training.config import ConfigError, TrainConfig, config_from_dict
from taskrl.training.learner import Learner
from taskrl.training.model import prepare_model
from taskrl.types import Trajectory

BASE = {
    "lr": 1e-2,
    "rollout.temperature": 1.0,
    "progress": False,
    "rollout.group_size": 4,
    "finetune": "lora",
    "lora.rank": 4,
    "sft_min_reward": 0.0,
}


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def trajectories(tiny: tuple[Any, Any]) -> list[Trajectory]:
    policy = HFPolicy(copy.deepcopy(tiny[0]), tiny[1], device="cpu")
    tasks = list(make("price").tasks())[:2]
    config = RolloutConfig(max_turns=1, sampling=SamplingParams(max_new_tokens=5), group_size=4, seed=0)
    out = asyncio.run(run_episodes(lambda: make("price"), policy, tasks, config))
    for i, t in enumerate(out):
        t.rewards["synthetic"] = float(i % 3)  # every group has a spread: no group is dropped
    return out


def _learner(tiny: tuple[Any, Any], config: TrainConfig) -> Learner:
    torch.manual_seed(0)
    return Learner(prepare_model(copy.deepcopy(tiny[0]), config), config, pad_id=0)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_registered_algorithm_runs_one_update(
    name: str, tiny: tuple[Any, Any], trajectories: list[Trajectory]
) -> None:
    learner = _learner(tiny, config_from_dict({"algo.name": name, **BASE}))
    before = {k: v.clone() for k, v in learner.trainable_state().items()}
    metrics = learner.update(trajectories, step=0)
    assert metrics["charts/optimizer_steps"] == 1.0 and learner.version == 1
    assert metrics["charts/trained_trajectories"] == len(trajectories)
    loss = "losses/sft_nll" if ALGORITHMS[name].imitation else "losses/policy_loss"
    assert torch.isfinite(torch.tensor(metrics[loss]))
    assert ("losses/value_loss" in metrics) == ALGORITHMS[name].value_head
    assert any(not torch.equal(v, before[k]) for k, v in learner.trainable_state().items())


def _reinforce_loss(logprobs: Tensor, old: Tensor, advantages: Tensor, config: Any) -> tuple[Tensor, dict]:
    return -advantages * logprobs, {}


def test_adding_an_algorithm_is_a_table_entry(
    tiny: tuple[Any, Any], trajectories: list[Trajectory], monkeypatch: pytest.MonkeyPatch
) -> None:
    reinforce = Algorithm(
        "reinforce", _reinforce_loss, advantages=grpo.advantages, min_group_size=2, config=grpo.GroupConfig
    )
    monkeypatch.setitem(ALGORITHMS, "reinforce", reinforce)
    config = config_from_dict({"algo.name": "reinforce", **BASE})  # the config validates against the table as it is now
    assert algorithm("reinforce") is reinforce
    with pytest.raises(ConfigError, match="rollout.group_size must be >= 2 for reinforce"):
        config_from_dict({"algo.name": "reinforce", **{**BASE, "rollout.group_size": 1}})
    learner = _learner(tiny, config)
    assert learner.value_head is None
    metrics = learner.update(trajectories, step=0)
    # One step from the sampled policy (ratio 1): REINFORCE's gradient -A * grad log pi is GRPO's, so the weights
    # land where GRPO's do; a learner that ignored the entry (or branched on names) would not get here.
    reference = _learner(tiny, config_from_dict({"algo.name": "grpo", **BASE}))
    reference.update(trajectories, step=0)
    assert metrics["charts/optimizer_steps"] == 1.0 and "losses/clipfrac" not in metrics
    for name, value in learner.trainable_state().items():
        torch.testing.assert_close(value, reference.trainable_state()[name], rtol=1e-5, atol=1e-6)


def test_an_unknown_algorithm_fails_at_config_time_naming_the_field_and_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"algo\.name must be one of grpo, ppo, cispo, kimi, sft, got 'dpo'"):
        config_from_dict({"algo.name": "dpo"})
    with pytest.raises(UnknownAlgorithmError, match="algo.name must be one of grpo, ppo, cispo, kimi, sft"):
        algorithm("dpo")


def test_every_entry_names_itself_and_declares_its_own_config() -> None:
    """Issue 39 item 4: each algorithm reads its own dataclass (declared in its file), named after it."""
    for name, entry in ALGORITHMS.items():
        assert entry.name == name and entry.config().name == name
        assert entry.config.__module__ == f"taskrl.algos.{name}" or entry.config.__module__ == "taskrl.algos.sft"
        assert dataclasses.is_dataclass(entry.config) and issubclass(entry.config, AlgoConfig)
        assert entry.imitation or entry.min_group_size >= 1
        assert isinstance(config_from_dict({"algo.name": name, "rollout.group_size": 2}).algo, entry.config)


def test_the_learner_never_compares_with_an_algorithm_name() -> None:
    tree = ast.parse(Path(learner_module.__file__).read_text())
    named = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        for side in [node.left, *node.comparators]
        for constant in ast.walk(side)
        if isinstance(constant, ast.Constant) and constant.value in ALGORITHMS
    ]
    assert not named, f"the learner branches on algorithm names: {named}"
