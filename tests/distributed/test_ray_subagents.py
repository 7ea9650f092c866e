"""Swarm sub-agents on Ray actors (a real local Ray, 2 CPUs): four assignments of one orchestrator turn run on four
actors at once; a killed actor is replaced; an actor that keeps dying becomes an error result, not a crash."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from taskrl.chat import format_tool_call  # noqa: E402
from taskrl.distributed.ray_subagents import RaySubagentRuntime, shutdown_subagent_pools  # noqa: E402
from taskrl.env import make  # noqa: E402
from taskrl.envs.swarm.env import SwarmEnv, SwarmEnvConfig  # noqa: E402
from taskrl.envs.swarm.tasks import WIDE, render_prompt  # noqa: E402
from taskrl.policies.base import Completion, SamplingParams  # noqa: E402
from taskrl.policies.scripted import ScriptedPolicy  # noqa: E402
from taskrl.rollout import RolloutConfig, run_episode  # noqa: E402
from taskrl.types import Message, Task, Trajectory, write_tasks  # noqa: E402

DELAY_S = 0.8
HELPERS = 4


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the helper policy below travels to the actors
    yield
    shutdown_subagent_pools()
    ray.shutdown()


@pytest.fixture(scope="module")
def tasks_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    items = [{"key": str(i), "question": f"item {i}", "answer": f"a{i}"} for i in range(1, HELPERS + 1)]
    task = Task("wide-1", render_prompt(WIDE, [i["question"] for i in items]), info={"kind": WIDE, "items": items})
    return str(write_tasks([task], tmp_path_factory.mktemp("swarm") / "tasks.jsonl"))


class SlowHelper:
    """A message-mode helper that takes DELAY_S per turn (a model's decode time), then answers from its task;
    a task that says "die" kills the actor's process (an OOM kill, a native crash)."""

    name = "slow"
    version = 0
    chat_format = None

    async def generate(self, *, token_ids: Any = None, messages: list[Message] | None = None, tools: Any = None,
                       sampling: SamplingParams) -> Completion:  # fmt: skip
        task = messages[-1].content
        if "die" in task:
            os._exit(3)
        await asyncio.sleep(DELAY_S)
        return Completion(text=f"ANSWER: a{task.split()[-1]}", info={"pid": os.getpid()})


def orchestrator(tasks: list[str]) -> ScriptedPolicy:
    creates = [format_tool_call("create_subagent", {"name": f"h{i}", "system_prompt": "Answer."}) for i in range(4)]
    assigns = [format_tool_call("assign_task", {"agent_id": f"h{i}", "task": t}) for i, t in enumerate(tasks)]
    table = "\n".join(f"| {i} | a{i} |" for i in range(1, HELPERS + 1))
    return ScriptedPolicy.from_turns(["\n".join(creates + assigns), table])


def play(env: SwarmEnv, policy: ScriptedPolicy) -> Trajectory:
    return asyncio.run(run_episode(env, policy, env.tasks("train")[0], RolloutConfig(max_turns=4), seed=0))


def test_four_assignments_of_one_turn_run_on_four_actors_at_once(tasks_path: str) -> None:
    config = SwarmEnvConfig(tasks=tasks_path, subagent_env="noop", subagent_backend="ray", ray_actors=HELPERS,
                            ray_cpus_per_actor=0.25)  # fmt: skip
    helper = SlowHelper()
    env = make("swarm", config=config, subagent_policy=helper)
    assert isinstance(env.runtime, RaySubagentRuntime)
    env.runtime.pool()  # the actors start here (once per process), so the episode below times only the work
    traj = play(env, orchestrator([f"item {i}" for i in range(1, HELPERS + 1)]))
    assert traj.error is None and traj.terminated and traj.rewards["perf"] == 1.0
    assert len(traj.children) == HELPERS
    assert sorted(c.final_answer for c in traj.children) == [f"ANSWER: a{i}" for i in range(1, HELPERS + 1)]
    assert sorted(c.info["ray_actor"] for c in traj.children) == list(range(HELPERS))  # one actor each
    for child in traj.children:
        assert child.parent_id == traj.id and child.trainable is False and child.error is None
        assert child.info["actor_wall_s"] >= DELAY_S
    spans = [(c.info["started_at"], c.info["ended_at"]) for c in traj.children]
    assert all(end - start >= DELAY_S for start, end in spans)
    assert max(s for s, _ in spans) < min(e for _, e in spans)  # all four were running at one moment
    assert traj.metrics["swarm/max_concurrency"] == HELPERS and traj.rewards["parallel"] > 0
    assert traj.metrics["critical_steps"] == (1 + 1) + 1 and traj.metrics["total_steps"] == 2 + HELPERS

    # The next episode's env shares the pool: a killed actor is replaced and its assignment retried.
    second = make("swarm", config=config, subagent_policy=helper)
    pool = second.runtime.pool()
    assert pool is env.runtime.pool()
    ray.kill(pool.actors[0], no_restart=True)
    traj = play(second, orchestrator([f"item {i}" for i in range(1, HELPERS + 1)]))
    assert pool.restarts == 1 and traj.rewards["perf"] == 1.0
    assert all(c.error is None for c in traj.children)


def test_an_actor_that_keeps_dying_becomes_an_error_result(tasks_path: str) -> None:
    config = SwarmEnvConfig(tasks=tasks_path, subagent_env="noop", subagent_backend="ray", ray_actors=1,
                            ray_cpus_per_actor=0.25)  # fmt: skip
    env = make("swarm", config=config, subagent_policy=SlowHelper())
    traj = play(env, orchestrator(["please die 1"]))
    assert traj.error is None and traj.terminated  # the orchestrator's episode goes on
    (child,) = traj.children
    assert child.trainable is False and "died twice" in (child.error or "")
    assert any(m.role == "tool" and "h0 failed: RayActorError" in m.content for m in traj.messages)


def test_an_unpicklable_policy_is_refused_with_the_fix(tasks_path: str) -> None:
    class Locked(SlowHelper):
        lock = threading.Lock()

        def __init__(self) -> None:
            self.held = threading.Lock()

    config = SwarmEnvConfig(tasks=tasks_path, subagent_env="noop", subagent_backend="ray", ray_actors=1)
    env = make("swarm", config=config, subagent_policy=Locked())
    with pytest.raises(ValueError, match="subagent_policy='scripted', 'hf' or 'openai'"):
        env.runtime.pool()


def test_config_validation(tasks_path: str) -> None:
    with pytest.raises(ValueError, match="subagent_backend"):
        SwarmEnvConfig(tasks=tasks_path, subagent_backend="threads")
    with pytest.raises(ValueError, match="ray_actors"):
        SwarmEnvConfig(tasks=tasks_path, subagent_backend="ray", ray_actors=0)
    ray_config = SwarmEnvConfig(tasks=tasks_path, subagent_env="noop", subagent_backend="ray", ray_actors=1)
    with pytest.raises(ValueError, match=r'make\("swarm", subagent_backend="ray"'):  # the factory gives the runtime
        SwarmEnv(ray_config)
    assert Path(tasks_path).is_file()
