"""After a rejected candidate (blocked by the gate, or rolled back in its canary) the learner goes back to the
stable version's weights and optimizer state, so the next update does not build on the rejected one."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from taskrl.deploy.cycle import CycleConfig, ProductionCycle
from taskrl.deploy.gate import GateConfig
from taskrl.deploy.router import Router
from taskrl.deploy.store import InteractionStore
from taskrl.policies.base import Policy
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.training.config import config_from_dict
from taskrl.training.learner import Learner
from taskrl.training.model import prepare_model
from tests.deploy.test_deploy_cycle_gate import STABLE, TASKS, labelled_store


def state(learner: Learner) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in learner.trainable_state().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def setup(tmp_path: Path, drop: float, revert: bool) -> tuple[ProductionCycle, Learner, HFPolicy, str]:
    model, tokenizer = tiny_model(seed=0)
    served = HFPolicy(copy.deepcopy(model), tokenizer, device="cpu")
    url = f"sqlite:///{tmp_path / 's.db'}"
    labelled_store(url, served)
    train_config = config_from_dict({"run_dir": str(tmp_path / "run"), "algo.name": "grpo", "finetune": "full",
                                     "freeze": ["layers"], "rollout.group_size": 8, "rollout.max_new_tokens": 4,
                                     "progress": False, "lr": 0.05})  # fmt: skip
    learner = Learner(prepare_model(model, train_config), train_config, pad_id=tokenizer.pad_token_id or 0)

    async def suite(policy: Policy) -> dict[str, list[Any]]:
        scores = STABLE if policy is served else [s - drop for s in STABLE]
        return {"score": list(scores), "task_ids": list(TASKS)}

    config = CycleConfig(min_trajectories=8, max_staleness=0, gate=GateConfig(n_boot=500), revert_rejected=revert)
    store = InteractionStore(url)
    router = Router("m", served, on_decision=lambda d: store.add_sync("decisions", d))
    return ProductionCycle(learner, tokenizer, router, store, config, {"val": suite}), learner, served, url


def idle(cycle: ProductionCycle) -> dict[str, Any]:
    """A cycle that does not train (too little data): only its revert, if any, changes the learner."""
    cycle.config = dataclasses.replace(cycle.config, min_trajectories=10**6)
    return asyncio.run(cycle.run_once())


@pytest.mark.parametrize("revert", [True, False])
def test_a_blocked_candidate_is_not_built_on(tmp_path: Path, revert: bool) -> None:
    cycle, learner, served, _ = setup(tmp_path, drop=0.5, revert=revert)
    start = state(learner)
    report = asyncio.run(cycle.run_once())
    assert report["outcome"] == "blocked"
    trained = state(learner)
    assert not same(start, trained), "the update must move the weights for this test to mean anything"
    report = idle(cycle)
    kinds = [d.kind for d in cycle.store.decisions()]
    if revert:
        assert report["reverted_to"] == 0 and same(state(learner), start)
        assert learner.optimizer.state_dict()["state"] == {}  # Adam's moments are the start's (none) too
        assert "revert_learner" in kinds
    else:
        assert "reverted_to" not in report and same(state(learner), trained) and "revert_learner" not in kinds
    cycle.store.close()
    served.close()


def test_a_rolled_back_candidate_is_not_built_on_and_a_promoted_one_is(tmp_path: Path) -> None:
    cycle, learner, served, _ = setup(tmp_path, drop=0.0, revert=True)
    start = state(learner)
    report = asyncio.run(cycle.run_once())
    assert report["outcome"] == "canary"
    first = state(learner)
    optimizer = copy.deepcopy(learner.optimizer.state_dict())
    cycle.router.rollback({"reason": "test"})
    assert idle(cycle)["reverted_to"] == 0 and same(state(learner), start)

    cycle.config = dataclasses.replace(cycle.config, min_trajectories=8)
    report = asyncio.run(cycle.run_once())
    assert report["outcome"] == "canary" and same(state(learner), first)  # same data, same start: same update
    version = report["version"]
    assert torch.equal(learner.optimizer.state_dict()["state"][0]["exp_avg"], optimizer["state"][0]["exp_avg"])
    cycle.router.activate(version)  # promoted: the learner holds the stable version's weights and keeps them
    assert "reverted_to" not in idle(cycle) and same(state(learner), first)
    cycle.store.close()
    for policy in cycle.router.versions.values():
        policy.close()
