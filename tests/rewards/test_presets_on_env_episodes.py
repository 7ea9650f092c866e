"""The presets apply for real (issue 15): on episodes the registered envs play, each recipe's preset reads only
keys its env writes, every term it needs gets a value, and the search env's reward is the ``context1`` preset's.

A preset used to read ``info["seen_chunks"]`` (the search env writes ``encountered_chunk_ids``) and
``info["tests_passed"/"tests_tampered"]`` (the code env writes ``metrics["tests_passed"]``/``["tampering"]``),
so its terms were silently None and its tamper gate passed. The recording dicts below fail such a preset.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from taskrl.env import make
from taskrl.eval import EvalConfig, evaluate
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rewards.presets import make_reward
from taskrl.types import Task, Trajectory


class Recording(dict):  # type: ignore[type-arg]
    """A dict that remembers every key looked up in it, and whether it was there."""

    def __init__(self, data: dict[str, Any], reads: dict[str, bool], where: str) -> None:
        super().__init__(data)
        self.reads, self.where = reads, where

    def _note(self, key: Any) -> None:
        self.reads.setdefault(f"{self.where}[{key!r}]", dict.__contains__(self, key))

    def __getitem__(self, key: Any) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self._note(key)
        return super().__contains__(key)


def _walk(traj: Trajectory) -> Iterator[Trajectory]:
    yield traj
    for child in traj.children:
        yield from _walk(child)


def _expert_episodes(env_name: str, tasks: int = 2) -> tuple[list[Trajectory], dict[str, Task]]:
    env = make(env_name)
    chosen = list(env.tasks("test") or env.tasks("train"))[:tasks]
    played: list[Trajectory] = []
    config = EvalConfig(samples_per_task=1, max_turns=16, concurrency=2, seed=0, bootstrap_resamples=10)
    policy = ScriptedPolicy(env.scripted_rule)  # type: ignore[attr-defined]
    asyncio.run(evaluate(lambda: make(env_name), {"expert": policy}, chosen, config,
                         on_trajectory=lambda _name, t: played.append(t)))  # fmt: skip
    assert len(played) == len(chosen)
    return played, {t.id: t for t in chosen}


# recipe env -> (preset, its terms that must apply on the env's expert episodes, keys an episode may lack)
CASES = {
    "search": ("context1", {"f_beta", "trajectory_recall", "answer_found", "prune_penalty", "turn_penalty"}, set()),
    "code-bugs": ("composer", {"tests", "valid_tool_use", "effort"}, {"info['test_coverage']"}),
    "swarm": ("parl", {"perf", "parallel", "finish", "efficiency"}, set()),
}


@pytest.mark.parametrize("env_name", sorted(CASES))
def test_the_recipe_preset_reads_only_keys_its_env_writes(env_name: str) -> None:
    preset, needed, optional = CASES[env_name]
    trajectories, tasks = _expert_episodes(env_name)
    reward = make_reward(preset)
    reads: dict[str, bool] = {}
    for traj in trajectories:
        for t in _walk(traj):
            t.info = Recording(t.info, reads, "info")
            t.metrics = Recording(t.metrics, reads, "metrics")
        task = tasks[traj.task_id]
        breakdown = reward.evaluate(traj, dataclasses.replace(task, info=Recording(task.info, reads, "task")))
        applied = {name for name, value in breakdown.raw.items() if value is not None}
        assert needed <= applied, f"{preset} on {env_name}: terms {sorted(needed - applied)} never applied"
    missing = sorted(key for key, present in reads.items() if not present and key not in optional)
    assert not missing, f"preset {preset} reads keys env {env_name} never writes: {missing}"
    assert any(key.startswith(("info[", "metrics[")) for key in reads), "the preset read nothing the env wrote"


def test_composer_tamper_gate_reads_the_code_env_flag() -> None:
    trajectories, tasks = _expert_episodes("code-bugs", tasks=1)
    traj = trajectories[0]
    reward = make_reward("composer")
    assert reward.evaluate(traj, tasks[traj.task_id]).raw["tests"] == pytest.approx(traj.metrics["tests_passed"])
    assert reward.evaluate(traj, tasks[traj.task_id]).weighted["tests_intact_cap"] == 0.0
    traj.metrics["tampering"] = 1.0  # what the env records when the agent rewrote a test file
    tampered = reward.evaluate(traj, tasks[traj.task_id])
    assert tampered.raw["tests_intact"] == 0.0
    assert tampered.total == pytest.approx(reward.failure_reward)


def test_the_search_env_reward_is_the_context1_preset() -> None:
    trajectories, tasks = _expert_episodes("search", tasks=3)
    reward = make_reward("context1")
    for traj in trajectories:
        env_total = sum(v for v in traj.terms.values() if v is not None)
        assert reward.evaluate(traj, tasks[traj.task_id]).total == pytest.approx(env_total), traj.task_id
    assert any(t.reward > 0.5 for t in trajectories)  # the expert's episodes are not all trivial
