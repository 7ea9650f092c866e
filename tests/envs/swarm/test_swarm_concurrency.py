"""Real concurrency: 8 assign_task calls of one turn, each a sub-agent served over HTTP with added latency."""

from __future__ import annotations

import asyncio
from typing import Any

from taskrl.chat import format_tool_call
from taskrl.deploy.server import create_app, running_server
from taskrl.env import make
from taskrl.envs.swarm.env import SwarmEnv, SwarmEnvConfig
from taskrl.policies.base import Completion, SamplingParams
from taskrl.policies.openai import OpenAIPolicy
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episode
from taskrl.types import Message

DELAY_S = 0.6
HELPERS = 8


class SlowHelper:
    """A message-mode model that takes DELAY_S per turn (a served model's decode time), then answers."""

    name = "slow"
    version = 0
    chat_format = None

    async def generate(self, *, token_ids: Any = None, messages: list[Message] | None = None, tools: Any = None,
                       sampling: SamplingParams) -> Completion:  # fmt: skip
        await asyncio.sleep(DELAY_S)
        return Completion(text=f"ANSWER: {messages[-1].content[-1]}")


def test_assignments_of_one_turn_overlap(wide_tasks_path: str, swarm_corpus: Any) -> None:
    creates = [format_tool_call("create_subagent", {"name": f"h{i}", "system_prompt": "Answer."}) for i in range(8)]
    assigns = [format_tool_call("assign_task", {"agent_id": f"h{i}", "task": f"item {i}"}) for i in range(HELPERS)]
    orchestrator = ScriptedPolicy.from_turns(["\n".join(creates + assigns), "| 1 | done |"])
    with running_server(create_app({"slow": SlowHelper()})) as base_url:
        env = SwarmEnv(
            SwarmEnvConfig(tasks=wide_tasks_path, corpus=str(swarm_corpus.path)),
            subagent_policy=OpenAIPolicy(base_url, "slow"),
            subagent_env_factory=lambda: make("noop"),
        )
        task = env.tasks("train")[0]
        traj = asyncio.run(run_episode(env, orchestrator, task, RolloutConfig(max_turns=4), seed=0))
    assert traj.error is None and len(traj.children) == HELPERS
    assert sorted(c.final_answer for c in traj.children) == [f"ANSWER: {i}" for i in range(HELPERS)]
    spans = [(c.info["started_at"], c.info["ended_at"]) for c in traj.children]
    assert all(end - start >= DELAY_S for start, end in spans)
    # all eight were running at one moment: the latest start precedes the earliest end
    assert max(s for s, _ in spans) < min(e for _, e in spans)
    assert traj.metrics["swarm/max_concurrency"] == HELPERS
    # the turn took about one helper's time, not eight (generous bound: a loaded machine is slow, not serial)
    turn_wall = max(e for _, e in spans) - min(s for s, _ in spans)
    assert turn_wall < HELPERS * DELAY_S / 2
    assert traj.metrics["critical_steps"] == (1 + 1) + 1 and traj.metrics["total_steps"] == 2 + HELPERS
