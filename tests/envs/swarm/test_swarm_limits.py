"""Swarm limits: nested swarms (no deadlock; grandchildren on the critical path), timed-out helpers keep their
steps, one sub-agent works on one task at a time (queued assignments count in critical steps and budgets)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from taskrl.chat import format_tool_call
from taskrl.env import make
from taskrl.envs.swarm.env import SwarmEnv, SwarmEnvConfig
from taskrl.envs.swarm.scripted import fanout_rule
from taskrl.policies.base import Completion, SamplingParams
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episode
from taskrl.types import Message, Trajectory


def search_then_answer(messages: list[Message], tools: Any) -> str:
    """A helper: one noop "search", then an answer naming its task."""
    if not any(m.role == "assistant" for m in messages):
        return format_tool_call("noop", {})
    return f"ANSWER: {messages[1].content.split()[-1]}"


def play(env: SwarmEnv, rule: Any, max_turns: int = 10) -> Trajectory:
    task = env.tasks("train")[0]
    return asyncio.run(run_episode(env, ScriptedPolicy(rule), task, RolloutConfig(max_turns=max_turns), seed=0))


def test_a_swarm_of_swarms_builds_without_deadlock(wide_tasks_path: str, swarm_corpus: Any) -> None:
    built: list[SwarmEnv] = []
    config = SwarmEnvConfig(tasks=wide_tasks_path, corpus=str(swarm_corpus.path), subagent_env="swarm")
    thread = threading.Thread(target=lambda: built.append(SwarmEnv(config)), daemon=True)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "building a nested swarm deadlocked"
    traj = play(built[0], fanout_rule)
    assert traj.error is None and all(c.env == "swarm@subagent" for c in traj.children)


def test_grandchildren_count_in_critical_steps(wide_tasks_path: str, swarm_corpus: Any) -> None:
    def inner_orchestrator(messages: list[Message], tools: Any) -> str:
        """Splits its task between two helpers at once, then answers with the first helper's reply."""
        if not any(m.role == "assistant" for m in messages):
            task = next(m.content for m in messages if m.role == "user")
            calls = [format_tool_call("create_subagent", {"name": n, "system_prompt": "help"}) for n in "ab"]
            calls += [format_tool_call("assign_task", {"agent_id": n, "task": task}) for n in "ab"]
            return "\n".join(calls)
        return next(m.content for m in messages if m.role == "tool")

    config = SwarmEnvConfig(tasks=wide_tasks_path, corpus=str(swarm_corpus.path))

    def inner() -> SwarmEnv:
        return SwarmEnv(config, subagent_policy=ScriptedPolicy(search_then_answer),
                        subagent_env_factory=lambda: make("noop"))  # fmt: skip

    outer = SwarmEnv(config, subagent_policy=ScriptedPolicy(inner_orchestrator), subagent_env_factory=inner)
    traj = play(outer, fanout_rule)
    assert traj.error is None and len(traj.children) == 3
    for child in traj.children:
        assert len(child.children) == 2 and all(g.parent_id == child.id for g in child.children)
        assert child.metrics["critical_steps"] == (1 + 2) + 1  # its turn, its helpers' 2 steps, its answer
    # outer: its turn + the slowest sub-orchestrator's 4 critical steps, then the answer
    assert traj.metrics["critical_steps"] == (1 + 4) + 1
    assert traj.metrics["total_steps"] == 2 + 3 * (2 + 2 * 2)  # every step of every agent at every level


class SlowSearcher:
    """Calls noop forever, 50 ms per turn: only the wall timeout ends it."""

    name, version, chat_format = "slow", 0, None

    async def generate(self, *, sampling: SamplingParams, **kwargs: Any) -> Completion:
        await asyncio.sleep(0.05)
        return Completion(text=format_tool_call("noop", {}))


def test_timed_out_helpers_count_the_steps_they_ran(wide_tasks_path: str, swarm_corpus: Any) -> None:
    config = SwarmEnvConfig(tasks=wide_tasks_path, corpus=str(swarm_corpus.path), subagent_timeout_s=0.4)
    env = SwarmEnv(config, subagent_policy=SlowSearcher(), subagent_env_factory=lambda: make("noop"))
    create = format_tool_call("create_subagent", {"name": "h", "system_prompt": "help"})
    assign = format_tool_call("assign_task", {"agent_id": "h", "task": "find it"})
    traj = play(env, lambda m, t: f"{create}\n{assign}" if len(m) == 2 else "| 1 | x |")
    [child] = traj.children
    assert child.error is not None and "TimeoutError" in child.error
    assert child.metrics["turns"] >= 3  # ~8 turns of 50 ms in 0.4 s; a loaded machine runs fewer
    assert traj.metrics["critical_steps"] == 1 + child.metrics["turns"] + 1


def test_one_sub_agent_runs_one_task_at_a_time(wide_tasks_path: str, swarm_corpus: Any) -> None:
    config = SwarmEnvConfig(tasks=wide_tasks_path, corpus=str(swarm_corpus.path), max_subagents=1)
    helper = ScriptedPolicy(search_then_answer)
    env = SwarmEnv(config, subagent_policy=helper, subagent_env_factory=lambda: make("noop"))
    create = format_tool_call("create_subagent", {"name": "h", "system_prompt": "help"})
    assigns = "\n".join(format_tool_call("assign_task", {"agent_id": "h", "task": f"item {i}"}) for i in range(5))
    traj = play(env, lambda m, t: f"{create}\n{assigns}" if len(m) == 2 else "| 1 | x |")
    spans = sorted((c.info["started_at"], c.info["ended_at"]) for c in traj.children)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False))  # never two at once
    assert traj.metrics["swarm/max_concurrency"] == 1 and traj.metrics["critical_steps"] == 1 + 5 * 2 + 1
    assert [(c.info["step_start"], c.info["step_end"]) for c in traj.children] == [(1 + 2 * i, 3 + 2 * i)
                                                                                   for i in range(5)]  # fmt: skip
    # a critical-steps budget sees the queue: the third task only gets what the first two left
    budget = SwarmEnv(SwarmEnvConfig(tasks=wide_tasks_path, corpus=str(swarm_corpus.path), max_critical_steps=7),
                      subagent_policy=ScriptedPolicy(search_then_answer), subagent_env_factory=lambda: make("noop"))
    traj = play(budget, lambda m, t: f"{create}\n{assigns}" if len(m) == 2 else "| 1 | x |")
    assert [c.metrics["turns"] for c in traj.children][:3] == [2, 2, 1]
