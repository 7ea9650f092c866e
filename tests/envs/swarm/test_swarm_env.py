from __future__ import annotations

import asyncio
from typing import Any

import pytest

from taskrl.chat import format_tool_call
from taskrl.env import acheck_env
from taskrl.envs.search.env import SearchEnv
from taskrl.envs.swarm.env import SwarmEnv, SwarmEnvConfig
from taskrl.envs.swarm.scripted import fanout_rule, serial_rule
from taskrl.envs.swarm.tasks import WIDE, render_prompt
from taskrl.monitor import MonitorConfig, Monitors, spurious_parallelism
from taskrl.monitor import serial_collapse as serial_collapse_rate
from taskrl.parsing import parse_hermes
from taskrl.policies.base import PolicyError
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.report.data import timeline
from taskrl.rollout import RolloutConfig, run_episode, run_episodes
from taskrl.types import Message, Task, ToolCall, Trajectory


def env_for(wide_tasks_path: str, corpus: Any, **overrides: Any) -> SwarmEnv:
    return SwarmEnv(SwarmEnvConfig(tasks=wide_tasks_path, corpus=str(corpus.path), **overrides))


def play(env_factory: Any, rule: Any, tasks: list[Task], max_turns: int = 20) -> list[Trajectory]:
    return asyncio.run(run_episodes(env_factory, ScriptedPolicy(rule), tasks, RolloutConfig(max_turns=max_turns)))


def test_env_passes_the_contract(wide_tasks_path: str, swarm_corpus: Any) -> None:
    asyncio.run(acheck_env(env_for(wide_tasks_path, swarm_corpus)))


def test_fanout_and_serial_e2e_over_a_real_corpus(wide_tasks_path: str, swarm_corpus: Any) -> None:
    env = env_for(wide_tasks_path, swarm_corpus)
    tasks = list(env.tasks("train")) + list(env.tasks("test"))
    assert len(tasks) == 2
    factory = lambda: env_for(wide_tasks_path, swarm_corpus)  # noqa: E731
    swarm = play(factory, fanout_rule, tasks)
    serial = play(factory, serial_rule, tasks)
    for traj in swarm + serial:
        assert traj.error is None and traj.terminated
        assert traj.metrics["swarm/item_f1"] == 1.0 and traj.rewards["perf"] == 1.0
        assert len(traj.children) == 3
        for child in traj.children:
            assert child.parent_id == traj.id and child.trainable is False
            assert child.info["ended_at"] >= child.info["started_at"]
            assert child.metrics["turns"] == 2  # search, then answer
            assert child.messages[0].content.startswith("You answer one search question")
        assert Trajectory.from_json(traj.to_json()).children[0].parent_id == traj.id
    # fan-out: one turn launches 3 helpers of 2 steps, then the answer: (1 + 2) + 1; serial: 3 x (1 + 2) + 1
    assert [t.metrics["critical_steps"] for t in swarm] == [4.0, 4.0]
    assert [t.metrics["critical_steps"] for t in serial] == [10.0, 10.0]
    assert [t.metrics["total_steps"] for t in swarm + serial] == [8.0, 8.0, 10.0, 10.0]  # turns + every helper step
    assert all(sum(c.info["critical"] for c in t.children) == 1 for t in swarm)
    assert all(all(c.info["critical"] for c in t.children) for t in serial)
    assert [t.info["subagents_created"] for t in swarm + serial] == [3, 3, 1, 1]
    # parallel credit only where the helpers really overlapped
    assert all(t.rewards["parallel"] > 0 for t in swarm) and all(t.rewards["parallel"] == 0 for t in serial)
    config = MonitorConfig()
    assert serial_collapse_rate(serial, config, None) == 1.0 and serial_collapse_rate(swarm, config, None) == 0.0
    assert spurious_parallelism(swarm, config, None) == 0.0
    # the expert over real search helpers raises no alert; its independent check ran and passed
    assert Monitors(tool_names=env.tools.names, log_alerts=False).check(0, swarm)[1] == []
    assert all(t.info["failed_checks"] == [] and t.metrics["swarm/useful"] == 3 for t in swarm)
    gantt = timeline(swarm[0])
    assert gantt is not None and len(gantt["rows"]) == 3 and gantt["critical_steps"] == 4.0
    assert sum(r["critical"] for r in gantt["rows"]) == 1


def test_fanout_expert_writes_one_create_then_assign_unit_per_row() -> None:
    """A 3-row turn repeats the 1- and 2-row turns' unit (create row k, assign row k), not a block of creates."""

    def calls(rows: int) -> list[tuple[str, str]]:
        prompt = render_prompt(WIDE, [f"Clue {i}\nQuestion: what is [X{i}]?" for i in range(1, rows + 1)])
        turn = parse_hermes(fanout_rule([Message("user", prompt)], None))
        assert not turn.invalid and not turn.content
        return [(c.name, c.arguments.get("name") or c.arguments["agent_id"]) for c in turn.tool_calls]

    unit = lambda k: [("create_subagent", f"row{k}"), ("assign_task", f"row{k}")]  # noqa: E731
    assert calls(1) == unit(1)
    assert calls(2) == unit(1) + unit(2)
    assert calls(3) == unit(1) + unit(2) + unit(3)


def test_a_turn_that_assigns_each_helper_right_after_creating_it_runs_every_assignment(
    wide_tasks_path: str, swarm_corpus: Any
) -> None:
    env = env_for(wide_tasks_path, swarm_corpus)
    prompt = env.tasks("train")[0].prompt
    traj = one_episode(env, [fanout_rule([Message("user", prompt)], None), "| 1 | x |"])
    results = [m for m in traj.messages if m.role == "tool"]
    assert [m.name for m in results] == ["create_subagent", "assign_task"] * 3
    assert traj.metrics["invalid_tool_calls"] == 0 and not any("no sub-agent" in m.content for m in results)
    assert traj.metrics["swarm/assignments"] == 3 and len(traj.children) == 3


def one_episode(env: SwarmEnv, turns: list[str], max_turns: int = 10) -> Trajectory:
    task = env.tasks("train")[0]
    policy = ScriptedPolicy.from_turns(turns)
    return asyncio.run(run_episode(env, policy, task, RolloutConfig(max_turns=max_turns), seed=1))


def test_spurious_parallelism_is_detected_and_earns_less(wide_tasks_path: str, swarm_corpus: Any) -> None:
    env = env_for(wide_tasks_path, swarm_corpus, subagent_max_steps=1)  # helpers cut off before they answer
    calls = [format_tool_call("create_subagent", {"name": f"a{i}", "system_prompt": "help"}) for i in range(4)]
    calls += [format_tool_call("assign_task", {"agent_id": f"a{i}", "task": 'Clue 1: "x [X1] y"'}) for i in range(4)]
    traj = one_episode(env, ["\n".join(calls), "| 1 | nothing |"])
    assert traj.info["subagents_created"] == 4 and traj.metrics["swarm/subagents_finished"] == 0
    assert all(c.truncated for c in traj.children)
    assert traj.rewards["finish"] == 0.0
    assert spurious_parallelism([traj], MonitorConfig(), None) == 1.0
    assert traj.metrics["critical_steps"] == 1 + 1 + 1


def test_bad_calls_are_error_observations(wide_tasks_path: str, swarm_corpus: Any) -> None:
    env = env_for(wide_tasks_path, swarm_corpus, max_subagents=1)
    env.reset(env.tasks("train")[0], seed=0)
    calls = [ToolCall("c0", "assign_task", {"agent_id": "ghost", "task": "find"}),
             ToolCall("c1", "create_subagent", {"name": "a", "system_prompt": "p"}),
             ToolCall("c2", "create_subagent", {"name": "b", "system_prompt": "p"}),
             ToolCall("c3", "assign_task", {"agent_id": "a", "task": "  "})]  # fmt: skip
    results, terminated, truncated, _ = asyncio.run(env.step(calls))
    assert [r.call_id for r in results] == ["c0", "c1", "c2", "c3"]
    assert [r.is_error for r in results] == [True, False, True, True]
    assert "no sub-agent 'ghost'" in results[0].content and "at most 1 sub-agents" in results[2].content
    assert not terminated and not truncated


def test_step_limits_and_critical_budget_truncate(wide_tasks_path: str, swarm_corpus: Any) -> None:
    env = env_for(wide_tasks_path, swarm_corpus, orchestrator_max_steps=2)
    noop = format_tool_call("create_subagent", {"name": "a", "system_prompt": "p"})
    traj = one_episode(env, [noop, noop, noop, "| 1 | x |"])
    assert traj.truncated and traj.metrics["turns"] == 2
    budget = env_for(wide_tasks_path, swarm_corpus, max_critical_steps=3)
    traj = one_episode(budget, [noop, noop, noop, "| 1 | x |"])
    assert traj.truncated and traj.metrics["critical_steps"] == 3
    # helpers get only the steps left in the budget (3 - 0 - 2 = 1: no room to answer after searching)
    fanout = fanout_rule([Message("user", budget.tasks("train")[0].prompt)], None)
    traj = one_episode(env_for(wide_tasks_path, swarm_corpus, max_critical_steps=3), [fanout, "| 1 | x |"])
    assert [c.metrics["turns"] for c in traj.children] == [1, 1, 1] and traj.metrics["critical_steps"] == 3


def test_subagent_prompt_and_context_are_their_own(wide_tasks_path: str, swarm_corpus: Any) -> None:
    seen: list[list[Message]] = []

    def helper(messages: list[Message], tools: Any) -> str:
        seen.append(list(messages))
        return "ANSWER: 42"

    env = SwarmEnv(SwarmEnvConfig(tasks=wide_tasks_path, corpus=str(swarm_corpus.path)),
                   subagent_policy=ScriptedPolicy(helper))  # fmt: skip
    create = format_tool_call("create_subagent", {"name": "h", "system_prompt": "You are H."})
    assign = format_tool_call("assign_task", {"agent_id": "h", "task": "What is six times seven?"})
    traj = one_episode(env, [f"{create}\n{assign}", "| 1 | 42 |"])
    assert [m.role for m in seen[0]] == ["system", "user"]
    assert seen[0][0].content.startswith("You are H.") and SearchEnv.system_prompt in seen[0][0].content
    assert seen[0][1].content == "What is six times seven?"
    tool_msgs = [m for m in traj.messages if m.role == "tool"]
    assert tool_msgs[-1].content == "ANSWER: 42"  # only the final answer returns to the orchestrator


def test_env_kwargs_from_a_config_file(wide_tasks_path: str, swarm_corpus: Any) -> None:
    env = SwarmEnv(tasks=wide_tasks_path, corpus=str(swarm_corpus.path), subagent_policy="scripted", reward={"k": 3})
    assert env.config.subagent_policy == "scripted" and env.config.reward.k == 3
    assert env.runtime.policy.rule is SearchEnv.scripted_rule


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="SwarmEnvConfig.subagent_max_steps"):
        SwarmEnvConfig(subagent_max_steps=0)
    with pytest.raises(ValueError, match="SwarmEnvConfig.max_critical_steps"):
        SwarmEnvConfig(max_critical_steps=1)
    with pytest.raises(ValueError, match="subagent_policy"):
        SwarmEnvConfig(subagent_policy="magic")
    assert SwarmEnvConfig.preset("wide").orchestrator_max_steps == 100
    assert SwarmEnvConfig.preset("deep").orchestrator_max_steps == 15


class DeadEngine(ScriptedPolicy):
    async def generate(self, **kwargs: Any) -> Any:
        raise PolicyError("HTTP 502 from the sub-agents' server")


def test_a_sub_agent_whose_engine_fails_ends_the_episode_as_an_infrastructure_failure(
    wide_tasks_path: str, swarm_corpus: Any
) -> None:
    env = SwarmEnv(SwarmEnvConfig(tasks=wide_tasks_path, corpus=str(swarm_corpus.path)),
                   subagent_policy=DeadEngine(lambda m, t: ""))  # fmt: skip
    create = format_tool_call("create_subagent", {"name": "h", "system_prompt": "You are H."})
    assign = format_tool_call("assign_task", {"agent_id": "h", "task": "What is six times seven?"})
    traj = one_episode(env, [f"{create}\n{assign}", "| 1 | 42 |"])
    # before: the helper's failure was an error observation and the orchestrator was scored on it
    assert traj.infra_failure is not None and traj.infra_failure["source"] == "engine", traj.messages[-1]
    assert "HTTP 502" in traj.infra_failure["detail"] and not traj.trainable


def test_the_env_reads_tasks_and_its_factory_supplies_the_default_set() -> None:
    with pytest.raises(ValueError, match=r'SwarmEnvConfig.tasks is not set: build the env with make\("swarm"\)'):
        SwarmEnv()  # the env generates no data (issue 39): make("swarm") fills in the default wide-search set
