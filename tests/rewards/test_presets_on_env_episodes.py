"""The presets apply for real (issue 15): on episodes the registered envs play, each recipe's preset reads only
keys its env writes, every term it needs gets a value, and the search env's reward is the ``context1`` preset
(it measures with the preset's terms and declares the preset's rubric).

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
from taskrl.envs.code.env import CodeEnvConfig
from taskrl.envs.code.reward import CodeRewardConfig
from taskrl.envs.swarm.reward import TaskPerformance
from taskrl.eval import EvalConfig, evaluate
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rewards.presets import PrunePenalty, TurnPenalty, make_reward
from taskrl.rewards.terms import EffortPenalty
from taskrl.scoring import Clock, Rubric, score
from taskrl.types import Task, Trajectory


def scored(rubric: Rubric, traj: Trajectory, task: Task) -> Trajectory:
    """A copy of ``traj`` measured by ``rubric`` and scored alone at the start of training."""
    copy = dataclasses.replace(traj, terms=rubric.measure(traj, task), rewards={})
    score([copy], rubric, Clock())
    return copy


def measured_as(rubric: Rubric, traj: Trajectory, task: Task) -> bool:
    """``traj.terms`` are the rubric's measurements, plus the derived terms ``score`` wrote."""
    measured = rubric.measure(traj, task)
    derived = {d.name for d in rubric.derived}
    assert set(traj.terms) == set(measured) | derived
    return {k: v for k, v in traj.terms.items() if k not in derived} == pytest.approx(measured, nan_ok=True)


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


def _expert_episodes(env_name: str, tasks: int = 2, **kwargs: Any) -> tuple[list[Trajectory], dict[str, Task]]:
    env = make(env_name, **kwargs)
    chosen = list(env.tasks("test") or env.tasks("train"))[:tasks]
    played: list[Trajectory] = []
    config = EvalConfig(samples_per_task=1, max_turns=16, concurrency=2, seed=0, bootstrap_resamples=10)
    policy = ScriptedPolicy(env.scripted_rule)  # type: ignore[attr-defined]
    asyncio.run(evaluate(lambda: make(env_name, **kwargs), {"expert": policy}, chosen, config,
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
        copy = scored(reward, traj, dataclasses.replace(task, info=Recording(task.info, reads, "task")))
        applied = {name for name, value in copy.terms.items() if value is not None}
        assert needed <= applied, f"{preset} on {env_name}: terms {sorted(needed - applied)} never applied"
    missing = sorted(key for key, present in reads.items() if not present and key not in optional)
    assert not missing, f"preset {preset} reads keys env {env_name} never writes: {missing}"
    assert any(key.startswith(("info[", "metrics[")) for key in reads), "the preset read nothing the env wrote"


def test_composer_tamper_gate_reads_the_code_env_flag() -> None:
    trajectories, tasks = _expert_episodes("code-bugs", tasks=1)
    traj = trajectories[0]
    reward = make_reward("composer")
    honest = scored(reward, traj, tasks[traj.task_id])
    assert honest.terms["tests"] == pytest.approx(traj.metrics["tests_passed"])
    assert honest.rewards["tests_intact_cap"] == 0.0
    traj.metrics["tampering"] = 1.0  # what the env records when the agent rewrote a test file
    tampered = scored(reward, traj, tasks[traj.task_id])
    assert tampered.terms["tests_intact"] == 0.0
    assert tampered.reward == pytest.approx(reward.failure_reward)


def described(rubric: Rubric) -> tuple[Any, ...]:
    """What a rubric decides, comparable: term names and weights along the clock, measurements, derived terms and
    their parameters, group terms, gates, clamp."""
    clocks = [Clock(step, epoch) for step in (0, 500, 5000) for epoch in (0, 2, 9)]
    return (
        [t.name for t in rubric.terms], [t.name for t in rubric.group_terms], [rubric.weights(c) for c in clocks],
        [m.name for m in rubric.measures], [(d.name, d.inputs) for d in rubric.derived],
        [rubric.params(c) for c in clocks],
        [(g.name, g.min_value) for g in rubric.gates], rubric.clamp, rubric.failure_reward, rubric.default_weight,
    )  # fmt: skip


def test_the_search_env_reward_is_the_context1_preset() -> None:
    """One formula: the env measures with the preset's own terms and declares the preset's rubric, so its reward
    (scored by ``taskrl.scoring``) is the preset's on the episodes it recorded."""
    env, preset = make("search"), make_reward("context1")
    assert described(env.rubric) == described(preset)
    assert env.rubric.terms == preset.terms and env.rubric.measures == preset.measures  # the same term functions
    assert env.rubric.derived == preset.derived
    assert env.rubric.clamp is not None and preset.clamp is not None
    assert env.rubric.clamp.epsilon == preset.clamp.epsilon == 0.01
    trajectories, tasks = _expert_episodes("search", tasks=3)
    for traj in trajectories:
        task = tasks[traj.task_id]
        assert measured_as(preset, traj, task), traj.task_id  # unweighted measurements
        assert scored(preset, traj, task).reward == pytest.approx(traj.reward), traj.task_id
        assert traj.rewards["f_beta"] == pytest.approx(0.7 * traj.terms["f_beta"])  # derived, weighted by the rubric
    assert any(t.reward > 0.5 for t in trajectories)  # the expert's episodes are not all trivial


def test_a_configured_search_env_is_the_preset_with_those_parameters() -> None:
    config = {"f_beta_weight": 0.5, "answer_weight": 0.25, "floor": 0.05, "beta_start": 3.0, "max_output_docs": 4,
              "prune_penalty": 0.2, "turn_penalty_start": 8, "turn_penalty_end": 16}  # fmt: skip
    env = make("search", reward=config)
    preset = make_reward(
        "context1", beta={"kind": "linear", "start": 3.0, "end": 2.0, "steps": 4}, epsilon=0.05, f_beta_weight=0.5,
        answer_weight=0.25, max_output_docs=4, prune=PrunePenalty(per_call=0.2), turns=TurnPenalty(8, 16),
    )  # fmt: skip
    assert described(env.rubric) == described(preset)
    assert env.rubric.terms == preset.terms and env.rubric.measures == preset.measures
    assert "answer_correct" in {t.name for t in env.rubric.terms}
    assert described(env.rubric) != described(make("search").rubric)  # the config reaches the rubric


CODE_CONFIGS = {  # the code env's reward config -> the composer preset it must be
    "default": ({}, {"valid_tool_use_weight": 0.0, "effort_weight": 0.0, "trivial_tests_weight": 0.0,
                     "tamper_gate": False}),
    "every term": (
        {"effort_weight": 0.1, "effort_k": 1.0, "effort_q": 2.0, "valid_tool_use_weight": 0.1,
         "trivial_tests_weight": 0.5},
        {"effort": EffortPenalty(1.0, 2.0), "floor_at_failure": True},
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CODE_CONFIGS))
def test_the_code_env_reward_is_the_composer_preset(case: str) -> None:
    """One formula: the code env measures with the composer preset's terms and declares its rubric; with every
    term on it is Composer's defaults (plus the floor at a failure), and its rewards are the preset's."""
    reward_config, preset_kwargs = CODE_CONFIGS[case]
    config = CodeEnvConfig(reward=CodeRewardConfig(**reward_config))
    env, preset = make("code-bugs", config=config), make_reward("composer", **preset_kwargs)
    assert described(env.rubric) == described(preset)
    assert [(t.name, t.fn) for t in env.rubric.terms] == [(t.name, t.fn) for t in preset.terms]
    assert [(g.name, g.check) for g in env.rubric.gates] == [(g.name, g.check) for g in preset.gates]
    trajectories, tasks = _expert_episodes("code-bugs", tasks=2, config=config)
    for traj in trajectories:
        task = tasks[traj.task_id]
        assert measured_as(preset, traj, task), traj.task_id
        assert scored(preset, traj, task).reward == pytest.approx(traj.reward), traj.task_id
        assert traj.terms["tests"] == 1.0  # the expert's gold fix passes the hidden tests
    assert len({t.name for t in env.rubric.terms}) == (1 if case == "default" else 4)


def test_the_swarm_env_reward_is_the_parl_preset() -> None:
    """One formula: the swarm env measures with the parl preset's terms (r_perf = the task's own score) and
    declares its rubric, λ1 and λ2 annealed by the rubric on the scoring clock."""
    env = make("swarm")
    budget = env.config.max_critical_steps or env.config.reward.critical_steps_budget
    preset = make_reward("parl", perf=TaskPerformance(), critical_steps_budget=budget)
    assert described(env.rubric) == described(preset)
    assert [(t.name, t.fn) for t in env.rubric.terms] == [(t.name, t.fn) for t in preset.terms]
    assert env.rubric.weights(Clock(step=500))["parallel"] == pytest.approx(0.15)  # annealed halfway
    trajectories, tasks = _expert_episodes("swarm", tasks=2)
    for traj in trajectories:
        task = tasks[traj.task_id]
        assert measured_as(preset, traj, task), traj.task_id
        assert scored(preset, traj, task).reward == pytest.approx(traj.reward), traj.task_id
    assert any(t.reward > 1.0 for t in trajectories)  # the expert's sub-agents earn auxiliary credit
