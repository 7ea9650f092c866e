"""Sub-agent runtime: frozen policies playing their own episodes, in their own contexts, against a wrapped env.

``SubagentEnv`` wraps any env (e.g. ``search``) so a sub-agent sees the system prompt the orchestrator gave it
plus the wrapped env's own, and the task text it was assigned. ``SubagentRuntime.run`` plays one assignment with
the agent loop (``run_episode``) under the sub-agent step limit and a wall timeout, and returns the child
trajectory with its run interval. Assignments of one orchestrator turn are awaited together, so they overlap.
A sub-agent cut off by the timeout keeps the model turns it started in ``metrics["turns"]`` (critical steps).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from taskrl.env import Env, Wrapper, call_hook, declared, maybe_await
from taskrl.policies.base import InvalidRequestError, Policy, PolicyError
from taskrl.rollout import RolloutConfig, run_episode
from taskrl.types import InfraError, Message, Task, Trajectory

if TYPE_CHECKING:
    from taskrl.chat import ChatFormat


class SubagentEngineError(InfraError):
    """A sub-agent's engine (a served model) failed: the orchestrator's episode ends as an infrastructure
    failure, out of its GRPO group, instead of being scored on a helper that could not answer."""

    source = "engine"


@dataclass(frozen=True)
class Subagent:
    """A sub-agent the orchestrator created."""

    agent_id: str
    """Id the orchestrator assigns tasks to."""
    name: str
    """Name the orchestrator gave it."""
    system_prompt: str
    """Instructions the orchestrator wrote for it (put before the wrapped env's own system prompt)."""


class SubagentEnv(Wrapper):
    """The wrapped env as one sub-agent sees it: the orchestrator's instructions first, the env's tools, no reward.

    Sub-agents are never trained, so their episodes carry no reward (no rubric, no group terms, no clock, no tasks
    of their own); the orchestrator's reward scores the outcome. Every other hook (``observe_context``, ``close``,
    ``scripted_rule``, ``training``, ...) is the wrapped env's.
    """

    rubric = None
    failure_reward = 0.0

    def __init__(self, inner: Env, agent: Subagent) -> None:
        super().__init__(inner)
        self.agent = agent

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"{declared(self.env, 'name') or 'env'}@subagent"

    def tasks(self, split: str = "train") -> list[Task]:
        return []

    async def reset(self, task: Task, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        messages, info = await maybe_await(self.env.reset(task, seed=seed))
        messages = list(messages)
        if messages and messages[0].role == "system":
            messages[0] = Message("system", f"{self.agent.system_prompt.strip()}\n\n{messages[0].content}")
        else:
            messages.insert(0, Message("system", self.agent.system_prompt))
        return messages, info

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        self.record_episode(trajectory)  # a nested swarm attaches its own sub-agents and critical steps, unscored
        return {}


class _CountedPolicy:
    """The frozen policy as one assignment sees it: counts the model turns started, so a sub-agent cut off by the
    timeout still reports the steps it spent."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.turns = 0

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def version(self) -> int:
        return self.inner.version

    @property
    def chat_format(self) -> ChatFormat | None:
        return self.inner.chat_format

    async def generate(self, **kwargs: Any) -> Any:
        self.turns += 1
        return await self.inner.generate(**kwargs)


class SubagentRuntime:
    """Plays sub-agent assignments: a fresh wrapped env per assignment, a frozen policy, a step limit."""

    def __init__(
        self,
        policy: Policy,
        env_factory: Callable[[], Env],
        rollout: RolloutConfig,
        *,
        timeout_s: float = 600.0,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"SubagentRuntime timeout_s must be > 0, got {timeout_s}")
        self.policy = policy
        self.env_factory = env_factory
        self.rollout = rollout
        self.timeout_s = timeout_s

    async def run(self, agent: Subagent, task_text: str, *, task_id: str, seed: int, max_steps: int) -> Trajectory:
        """One assignment as a child trajectory (``trainable=False``). Its ``info`` adds ``started_at``/``ended_at``
        (monotonic seconds), ``name``, ``agent_id`` and ``policy``; ``SwarmEnv`` adds ``turn``, ``assignment``,
        ``task`` and, in ``record_episode``, ``critical``, ``step_start``/``step_end`` and the credit keys.

        A sub-agent that times out or whose env breaks still returns a trajectory (with ``error`` set), so the
        orchestrator sees what happened and the episode goes on. A sub-agent whose engine fails (a
        ``PolicyError`` other than an invalid request) raises ``SubagentEngineError``: no fault of the policy.
        """
        config = replace(self.rollout, max_turns=max(1, min(max_steps, self.rollout.max_turns)), training=False)
        env = SubagentEnv(self.env_factory(), agent)
        policy = _CountedPolicy(self.policy)
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout_s):
                child = await run_episode(env, policy, Task(task_id, task_text), config, seed=seed)  # type: ignore[arg-type]
        except InvalidRequestError:
            raise
        except PolicyError as e:
            raise SubagentEngineError(f"sub-agent {agent.agent_id}'s engine failed: {e}") from e
        except TimeoutError:
            child = Trajectory(task_id=task_id, env=env.name, seed=seed, truncated=True)
            child.error = f"TimeoutError: sub-agent ran past {self.timeout_s:g}s"
            child.info["truncation"] = "timeout"
            child.metrics["turns"] = float(min(policy.turns, config.max_turns))  # the turn in flight counts
        finally:
            await maybe_await(call_hook(env, "close"))
        failure = child.infra_failure
        if failure is not None and failure.get("source") == "engine":  # a rollout config that drops engine failures
            raise SubagentEngineError(f"sub-agent {agent.agent_id}'s engine failed: {failure.get('detail')}")
        child.trainable = False
        child.info.update(
            {"started_at": started, "ended_at": time.monotonic(), "name": agent.name, "agent_id": agent.agent_id,
             "policy": self.policy.name}
        )  # fmt: skip
        child.metrics.setdefault("turns", 0.0)
        return child
