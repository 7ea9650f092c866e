"""The cycle's gate on real training: every verdict is stored with its evidence (pass too), paired by task.

A tiny model's own samples, labelled in a real SQLite store, train one real update per cycle; the eval suite
scores stable and candidate per task (the candidate's tasks in reverse order, so pairing must align them).
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

from taskrl.deploy.cycle import CycleConfig, ProductionCycle
from taskrl.deploy.gate import GateConfig
from taskrl.deploy.router import Router, RouterConfig
from taskrl.deploy.store import Feedback, Interaction, InteractionStore
from taskrl.policies.base import Policy, SamplingParams
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.training.config import config_from_dict
from taskrl.training.learner import Learner
from taskrl.training.model import prepare_model
from taskrl.types import Message

TASKS = [f"task-{i}" for i in range(12)]
STABLE = [i / 11 for i in range(12)]  # widely spread per-task scores


def labelled_store(url: str, policy: HFPolicy) -> None:
    prompt = policy.chat_format.prompt_ids([Message("user", "hi")], None)

    async def sample() -> list:
        params = [SamplingParams(max_new_tokens=4, seed=i) for i in range(8)]
        return await asyncio.gather(*(policy.generate(token_ids=prompt, sampling=p) for p in params))

    with InteractionStore(url) as store:
        for i, completion in enumerate(asyncio.run(sample())):
            row = Interaction(
                "t", f"s{i}", "m", 0, {"messages": [{"role": "user", "content": "hi"}]}, {"message": {}},
                completion.token_ids, completion.logprobs, prompt, id=f"int_{i}",
            )  # fmt: skip
            store.add_sync("interactions", row)
            store.add_sync("feedback", Feedback(row.id, "t", "accepted" if i % 2 else "rejected"))


def run_cycle(tmp_path: Path, candidate_drop: float, with_ids: bool) -> tuple[dict[str, Any], list]:
    model, tokenizer = tiny_model(seed=0)
    served = HFPolicy(copy.deepcopy(model), tokenizer, device="cpu")
    url = f"sqlite:///{tmp_path / 's.db'}"
    labelled_store(url, served)
    train_config = config_from_dict({"run_dir": str(tmp_path / "run"), "algo.name": "grpo", "finetune": "full",
                                     "freeze": ["layers"], "rollout.group_size": 8, "rollout.max_new_tokens": 4,
                                     "progress": False})  # fmt: skip
    learner = Learner(prepare_model(model, train_config), train_config, pad_id=tokenizer.pad_token_id or 0)

    async def suite(policy: Policy) -> dict[str, list[Any]]:
        if policy is served:
            out: dict[str, list[Any]] = {"score": list(STABLE), "task_ids": list(TASKS)}
        else:  # the candidate: every task a little worse, reported in reverse task order
            out = {"score": [s - candidate_drop for s in reversed(STABLE)], "task_ids": list(reversed(TASKS))}
        if not with_ids:
            out.pop("task_ids")
        return out

    config = CycleConfig(min_trajectories=8, max_staleness=0, gate=GateConfig(n_boot=500))
    with InteractionStore(url) as store:
        router = Router("m", served, on_decision=lambda d: store.add_sync("decisions", d))
        report = asyncio.run(ProductionCycle(learner, tokenizer, router, store, config, {"val": suite}).run_once())
        decisions = store.decisions()
    for policy in router.versions.values():
        policy.close()
    return report, decisions


def test_a_passing_gate_stores_its_evidence_before_the_canary(tmp_path: Path) -> None:
    report, decisions = run_cycle(tmp_path, 0.0, with_ids=True)
    assert report["outcome"] == "canary"
    kinds = [d.kind for d in decisions]
    assert kinds.index("gate_pass") < kinds.index("start_canary")
    gate = decisions[kinds.index("gate_pass")]
    assert gate.to_version == report["version"] == 1 and gate.from_version == 0
    assert gate.evidence["paired"] is True and gate.evidence["cycle"] == 0
    assert gate.evidence["val/score"]["ci"] == [0.0, 0.0]  # aligned by task: every pair equal
    assert isinstance(gate.evidence["train"], dict) and gate.evidence["train"]  # the update's metrics


@pytest.mark.parametrize("with_ids", [True, False])
def test_the_gate_pairs_by_task_and_says_when_it_cannot(tmp_path: Path, with_ids: bool) -> None:
    # 0.02 worse on every task: significant paired, invisible unpaired (per-task spread 0..1)
    report, decisions = run_cycle(tmp_path, 0.02, with_ids=with_ids)
    evidence = report["gate"]["evidence"]
    assert evidence["paired"] is with_ids
    if with_ids:
        assert report["outcome"] == "blocked" and evidence["val/score"]["regressed"]
        block = [d for d in decisions if d.kind == "block"][-1]
        assert block.evidence["paired"] is True and block.evidence["val/score"]["ci"][1] < 0
    else:
        assert report["outcome"] == "canary" and "no task_ids" in evidence["pairing"]
        assert [d for d in decisions if d.kind == "gate_pass"][-1].evidence["paired"] is False


def test_rows_of_rolled_back_versions_are_not_trained_on(tmp_path: Path) -> None:
    from taskrl.deploy.dataset import trajectories_from_store

    model, tokenizer = tiny_model(seed=0)
    served = HFPolicy(model, tokenizer, device="cpu")
    url = f"sqlite:///{tmp_path / 's.db'}"
    labelled_store(url, served)  # 8 labelled rows of version 0
    router = Router("m", served)
    v1 = router.add_version(HFPolicy(model, tokenizer, device="cpu"))
    router.start_canary(v1)
    router.rollback({"reason": "test"})
    router.activate(router.add_version(HFPolicy(model, tokenizer, device="cpu")))  # v2 stable, v1 in its window
    with InteractionStore(url) as store:
        rows = store.interactions()
        for row in rows[:3]:  # three of them served by the rolled-back canary
            row.policy_version, row.id = v1, row.id + "-v1"
            store.add_sync("interactions", row)
            store.add_sync("feedback", Feedback(row.id, "t", "accepted"))
        config = CycleConfig(min_trajectories=100, max_staleness=2)
        cycle = ProductionCycle(None, tokenizer, router, store, config, {"val": lambda p: None})  # type: ignore
        assert cycle.rolled_back() == {v1}
        report = asyncio.run(cycle.run_once())  # too few rows to train: the data stats are the point
        assert report["outcome"] == "waiting"
        assert report["data"]["rolled_back"] == 3 and report["data"]["used"] == 8 and report["data"]["read"] == 11
        assert report["data"]["latest_version"] == 2
        _, kept = trajectories_from_store(store, max_staleness=2, model="m", latest_version=2)
        assert kept.rolled_back == 0 and kept.used == 11  # without exclude_versions every row counts
    served.close()


def test_a_rolled_back_canary_does_not_push_stable_traffic_out_of_the_window(tmp_path: Path) -> None:
    model, tokenizer = tiny_model(seed=0)
    served = HFPolicy(model, tokenizer, device="cpu")
    url = f"sqlite:///{tmp_path / 's.db'}"
    labelled_store(url, served)  # 8 labelled rows of version 0, the stable one
    router = Router("m", served)
    router.start_canary(router.add_version(HFPolicy(model, tokenizer, device="cpu")))
    router.rollback({"reason": "test"})
    with InteractionStore(url) as store:
        config = CycleConfig(min_trajectories=100, max_staleness=0)
        report = asyncio.run(ProductionCycle(None, tokenizer, router, store, config, {"v": None}).run_once())  # type: ignore
    assert report["data"]["latest_version"] == 0 and report["data"]["used"] == 8
    served.close()


def test_a_cycle_retires_versions_no_session_can_reach(tmp_path: Path) -> None:
    with InteractionStore(f"sqlite:///{tmp_path / 's.db'}") as store:
        router = Router("m", ScriptedPolicy(lambda m, t: "x", name="v0"), RouterConfig(holdout=0.0))
        v1 = router.add_version(ScriptedPolicy(lambda m, t: "x", name="v1"))
        router.start_canary(v1)
        router.rollback({"why": "test"})
        config = CycleConfig(min_trajectories=10**6)  # no training data: the cycle only tidies up and waits
        report = asyncio.run(ProductionCycle(None, None, router, store, config, {"v": None}).run_once())  # type: ignore[arg-type]
        assert report["outcome"] == "waiting" and sorted(router.versions) == [0]
        assert [d.kind for d in router.decisions][-1] == "retire"
        keep = CycleConfig(min_trajectories=10**6, retire_unroutable=False)
        v2 = router.add_version(ScriptedPolicy(lambda m, t: "x", name="v2"))
        router.start_canary(v2)
        router.rollback({"why": "test"})
        asyncio.run(ProductionCycle(None, None, router, store, keep, {"v": None}).run_once())  # type: ignore[arg-type]
        assert sorted(router.versions) == [0, 2]
