"""The Agent Swarm orchestrator env (Kimi K2.5 PARL, docs/design/index.md §7): the trainable orchestrator's tools
and episode.

``SwarmEnv`` gives the orchestrator ``create_subagent(name, system_prompt)`` and ``assign_task(agent_id, task)``.
The assignments of one turn run concurrently (asyncio, or Ray actors with ``subagent_backend="ray"``); each
plays a frozen sub-agent policy in its own context against a wrapped env (``search`` by default) and only its
final answer comes back. A sub-agent works on one task at a time (assignments to a busy one queue), so
``max_subagents`` also bounds how many run at once. ``reward`` attaches the sub-agent episodes as ``children``
(``parent_id``, ``trainable=False``, run intervals on the wall and the step clock, the critical flag, what each was
worth: ``credit.judge_children``), records critical steps, total steps and wall time, and scores
r_perf + λ1·r_parallel + λ2·r_finish + λ3·r_efficiency. ``subagent_env="swarm"`` nests swarms: a sub-agent's
critical steps (its sub-agents included) count as its steps.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from taskrl.env import Env, ToolEnv, make
from taskrl.envs.swarm.credit import judge_children
from taskrl.envs.swarm.reward import SwarmRewardConfig, swarm_reward
from taskrl.envs.swarm.scripted import fanout_rule
from taskrl.envs.swarm.subagents import Subagent, SubagentRuntime
from taskrl.envs.swarm.tasks import item_scores
from taskrl.policies.base import Policy, SamplingParams
from taskrl.rewards.cheating import subagent_intervals
from taskrl.rewards.formulas import max_overlap
from taskrl.rewards.parl import (
    TASK_SIZE_KEY,
    child_steps,
    schedule_length,
    step_schedule,
    subtasks,
    useful_overlap,
)
from taskrl.rollout import RolloutConfig, derive_seed
from taskrl.tools import tool
from taskrl.types import Message, Task, ToolCall, ToolResult, Trajectory
from taskrl.validate import at_least, require

SYSTEM_PROMPT = """\
You lead a team of helper agents. Helpers can search a document corpus; you cannot.

Tools:
- create_subagent(name, system_prompt): create a helper with its own instructions; returns its agent id.
- assign_task(agent_id, task): give a helper a task and get back its final answer. A helper sees only the task \
you write, not this conversation, so make the task self-contained.

When you are done, reply without a tool call, with the final answer in the format the question asks for."""


class UnknownSubagentError(KeyError):
    """assign_task named an agent id that create_subagent never returned."""

    def __str__(self) -> str:
        return str(self.args[0])


class TooManySubagentsError(RuntimeError):
    """create_subagent was called past ``SwarmEnvConfig.max_subagents``."""


@dataclass
class SwarmEnvConfig:
    """Tasks, sub-agents, step limits per role, the critical-steps budget and the reward of the swarm env."""

    tasks: str | None = None
    """Tasks JSONL from `taskrl datagen widesearch|deepsearch`; None: ``make("swarm")`` fills in a wide-search set it
    generates once on the default corpus (``taskrl.datagen.defaults``)."""
    corpus: str = "default"
    """Search corpus directory for the sub-agents' env ("default": the cached stdlib corpus)."""
    subagent_env: str = "search"
    """Registered env the sub-agents act in."""
    subagent_policy: str = "scripted"
    """Frozen sub-agent policy when none is passed in: "scripted" (the wrapped env's rule), "hf" or "openai"."""
    subagent_model: str = "smollm2"
    """Model of an "hf" or "openai" sub-agent policy."""
    subagent_base_url: str | None = None
    """Server URL of an "openai" sub-agent policy."""
    orchestrator_max_steps: int = 15
    """Orchestrator turns with tool calls before the episode is truncated (Kimi: 15 deep search, 100 wide)."""
    subagent_max_steps: int = 100
    """Turns of one sub-agent assignment (Kimi: 100)."""
    max_critical_steps: int | None = None
    """Episode budget in critical steps; reaching it truncates the episode. None: no budget."""
    max_subagents: int = 32
    """Most sub-agents one episode may create; each works on one task at a time, so also the most running at once."""
    subagent_timeout_s: float = 600.0
    """Wall-clock limit of one sub-agent assignment."""
    subagent_max_context_tokens: int = 4096
    """Context size of a sub-agent."""
    subagent_max_new_tokens: int = 256
    """Most tokens a sub-agent samples per turn."""
    subagent_temperature: float = 0.0
    """Sampling temperature of the sub-agents (frozen helpers: greedy by default)."""
    subagent_backend: str = "asyncio"
    """Where sub-agents run: "asyncio" (this process) or "ray" (a pool of actors, each with its own policy and envs)."""
    ray_address: str = ""
    """Ray cluster of subagent_backend="ray": "" starts a local Ray (or joins this process's), "auto", "ray://h:p"."""
    ray_actors: int = 4
    """Sub-agent actors in the Ray pool; each assignment goes to the least busy one."""
    ray_cpus_per_actor: float = 0.5
    """CPUs Ray reserves for each sub-agent actor."""
    reward: SwarmRewardConfig = field(default_factory=SwarmRewardConfig)
    """λ1, λ2, K and the annealing of the PARL reward."""

    def __post_init__(self) -> None:
        require("SwarmEnvConfig", "must be >= 1", at_least(1), orchestrator_max_steps=self.orchestrator_max_steps,
                subagent_max_steps=self.subagent_max_steps, max_subagents=self.max_subagents,
                subagent_max_context_tokens=self.subagent_max_context_tokens,
                subagent_max_new_tokens=self.subagent_max_new_tokens, ray_actors=self.ray_actors)  # fmt: skip
        if self.max_critical_steps is not None and self.max_critical_steps < 2:
            raise ValueError(f"SwarmEnvConfig.max_critical_steps must be >= 2 or None, got {self.max_critical_steps}")
        if self.subagent_timeout_s <= 0:
            raise ValueError(f"SwarmEnvConfig.subagent_timeout_s must be > 0, got {self.subagent_timeout_s}")
        if self.subagent_temperature < 0:
            raise ValueError(f"SwarmEnvConfig.subagent_temperature must be >= 0, got {self.subagent_temperature}")
        if self.subagent_policy not in ("scripted", "hf", "openai"):
            raise ValueError(
                f"SwarmEnvConfig.subagent_policy must be 'scripted', 'hf' or 'openai', got {self.subagent_policy!r}"
            )
        if self.subagent_backend not in ("asyncio", "ray"):
            raise ValueError(
                f"SwarmEnvConfig.subagent_backend must be 'asyncio' or 'ray', got {self.subagent_backend!r}"
            )
        if self.ray_cpus_per_actor < 0:
            raise ValueError(f"SwarmEnvConfig.ray_cpus_per_actor must be >= 0, got {self.ray_cpus_per_actor}")
        if isinstance(self.reward, dict):  # from a TOML/JSON config
            self.reward = SwarmRewardConfig(**self.reward)

    @classmethod
    def preset(cls, kind: str, **overrides: Any) -> SwarmEnvConfig:
        """Kimi's step limits: "deep" search 15 orchestrator / 100 sub-agent steps, "wide" 100 / 100."""
        limits = {"deep": 15, "wide": 100}
        if kind not in limits:
            raise ValueError(f"SwarmEnvConfig.preset: kind must be 'wide' or 'deep', got {kind!r}")
        return cls(**{"orchestrator_max_steps": limits[kind], "subagent_max_steps": 100, **overrides})


_TASKS: dict[str, list[Task]] = {}
_POLICIES: dict[tuple[Any, ...], Policy] = {}
_CACHE_LOCK = threading.RLock()  # re-entered when a nested swarm's sub-agent env loads its tasks


def _load_tasks(config: SwarmEnvConfig) -> list[Task]:
    from taskrl.types import read_tasks

    if not config.tasks:
        raise ValueError(
            'SwarmEnvConfig.tasks is not set: build the env with make("swarm"), which generates a wide-search set '
            "on the default corpus once, or pass tasks=<JSONL from `taskrl datagen widesearch|deepsearch`>"
        )
    with _CACHE_LOCK:
        if config.tasks not in _TASKS:
            _TASKS[config.tasks] = read_tasks(config.tasks)
        return _TASKS[config.tasks]


RuntimeBuilder = Callable[..., Any]
"""Builds the Ray sub-agent runtime: ``(config, rollout, env_factory, *, policy, custom_env) -> runtime`` (the
factory ``make("swarm")`` passes ``taskrl.distributed.ray_subagents.swarm_runtime``)."""


def _subagent_env_factory(config: SwarmEnvConfig) -> Callable[[], Env]:
    kwargs: dict[str, Any] = {}
    if config.subagent_env == "swarm":  # nested: the inner orchestrators' helpers search the same corpus
        kwargs.update(corpus=config.corpus, tasks=config.tasks)
    elif config.subagent_env == "search":
        kwargs["corpus"] = config.corpus
        if config.corpus != "default" and config.tasks:
            kwargs["tasks"] = config.tasks  # a corpus built without multi-hop tasks: any Task JSONL will do
    return lambda: make(config.subagent_env, **kwargs)


def _default_policy(config: SwarmEnvConfig, env_factory: Callable[[], Env]) -> Policy:
    """One frozen sub-agent policy per process and setting (envs are built per episode; models load once)."""
    from taskrl.policies import make_policy

    key = (config.subagent_policy, config.subagent_model, config.subagent_base_url, config.subagent_env)
    with _CACHE_LOCK:
        if key not in _POLICIES:
            env = env_factory() if config.subagent_policy == "scripted" else None
            _POLICIES[key] = make_policy(
                config.subagent_policy, model=config.subagent_model, base_url=config.subagent_base_url, env=env
            )
        return _POLICIES[key]


class SwarmEnv(ToolEnv):
    """The orchestrator's env; one instance plays one episode at a time."""

    name = "swarm"
    system_prompt = SYSTEM_PROMPT
    failure_reward = 0.0
    scripted_rule = staticmethod(fanout_rule)
    """The env's expert rule (`--policy scripted`): one helper per row, all assigned in the first turn."""

    def __init__(
        self,
        config: SwarmEnvConfig | None = None,
        *,
        subagent_policy: Policy | str | None = None,
        subagent_env_factory: Callable[[], Env] | None = None,
        ray_runtime: RuntimeBuilder | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__()
        if isinstance(subagent_policy, str):  # a config value from TOML/CLI env kwargs ("scripted", "hf", ...)
            overrides["subagent_policy"], subagent_policy = subagent_policy, None
        self.config = config if config is not None else SwarmEnvConfig(**overrides)
        self._tasks = _load_tasks(self.config)
        env_factory = subagent_env_factory or _subagent_env_factory(self.config)
        sampling = SamplingParams(
            max_new_tokens=self.config.subagent_max_new_tokens, temperature=self.config.subagent_temperature
        )
        rollout = RolloutConfig(
            max_turns=self.config.subagent_max_steps,
            max_context_tokens=self.config.subagent_max_context_tokens,
            sampling=sampling,
            training=False,
        )
        self.runtime: Any
        if self.config.subagent_backend == "ray":  # the actors build their own policy and envs: nothing loads here
            if ray_runtime is None:
                raise ValueError(
                    'SwarmEnvConfig.subagent_backend="ray" needs the Ray runtime, which the env\'s factory gives it: '
                    'build the env with make("swarm", subagent_backend="ray", ...) or pass '
                    "ray_runtime=taskrl.distributed.ray_subagents.swarm_runtime"
                )
            custom = subagent_env_factory is not None
            self.runtime = ray_runtime(self.config, rollout, env_factory, policy=subagent_policy, custom_env=custom)
        else:
            policy = subagent_policy or _default_policy(self.config, env_factory)
            self.runtime = SubagentRuntime(policy, env_factory, rollout, timeout_s=self.config.subagent_timeout_s)
        self.rubric = swarm_reward(self.config.reward, budget=self.config.max_critical_steps)
        """The ``parl`` preset: its terms measure the episode (``reward``); ``taskrl.scoring.score`` weighs them,
        annealing λ1, λ2 on the clock it is given."""
        self._reset_state(0)

    def _reset_state(self, seed: int) -> None:
        self.agents: dict[str, Subagent] = {}
        self.turns: list[list[Trajectory]] = []
        """Per orchestrator turn with tool calls: the sub-agent episodes it launched, in launch order."""
        self._assignments = 0
        self._agent_locks: dict[str, asyncio.Lock] = {}
        self._recorded: str | None = None
        self._seed = seed
        self._started = time.monotonic()

    # -- contract -----------------------------------------------------------------------------------
    def tasks(self, split: str = "train") -> Sequence[Task]:
        return [t for t in self._tasks if t.info.get("split", "train") == split]

    def reset(self, task: Task, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        self._reset_state(seed or 0)
        return super().reset(task, seed)

    def _launches(self, turns: Sequence[Sequence[Trajectory]]) -> list[list[Trajectory]]:
        return [sorted(turn, key=lambda c: c.info.get("assignment", 0)) for turn in turns]

    @staticmethod
    def _agent_steps(turns: Sequence[Sequence[Trajectory]]) -> list[list[tuple[Any, int]]]:
        return [[(c.info.get("agent_id"), child_steps(c)) for c in turn] for turn in turns]

    def critical_steps_so_far(self, turns: int | None = None) -> int:
        """Critical steps of the first ``turns`` tool turns (all by default): ``rewards.parl.schedule_length``."""
        return schedule_length(self._agent_steps(self._launches(self.turns[:turns])))

    async def step(self, tool_calls: list[ToolCall]) -> tuple[list[ToolResult], bool, bool, dict[str, Any]]:
        self.turns.append([])
        # Agents must exist before this turn's assignments look them up; creating is instant, so do it first.
        creates = [c for c in tool_calls if c.name == "create_subagent"]
        others = [c for c in tool_calls if c.name != "create_subagent"]
        results = (await self.tools.execute(creates) if creates else []) + (
            await self.tools.execute(others) if others else []
        )
        by_id = {r.call_id: r for r in results}
        ordered = [by_id[c.id] for c in tool_calls]
        budget = self.config.max_critical_steps
        over_budget = budget is not None and self.critical_steps_so_far() >= budget
        truncated = over_budget or len(self.turns) >= self.config.orchestrator_max_steps
        info: dict[str, Any] = {}
        if truncated:
            info["swarm_truncation"] = "max_critical_steps" if over_budget else "orchestrator_max_steps"
        return ordered, False, truncated, info

    # -- tools --------------------------------------------------------------------------------------
    @tool(in_thread=False)
    def create_subagent(self, name: str, system_prompt: str) -> str:
        """Create a helper agent with its own instructions. Returns the helper's agent id.

        Args:
            name: a short name for the helper, e.g. "row3_finder".
            system_prompt: the helper's instructions: its role and how it should answer.
        """
        if len(self.agents) >= self.config.max_subagents:
            raise TooManySubagentsError(
                f"at most {self.config.max_subagents} sub-agents per task; reuse one of: {', '.join(self.agents)}"
            )
        base = re.sub(r"\W+", "_", name).strip("_")[:40] or "agent"
        agent_id, n = base, 2
        while agent_id in self.agents:
            agent_id, n = f"{base}_{n}", n + 1
        self.agents[agent_id] = Subagent(agent_id, name, system_prompt)
        return f"Created sub-agent with agent_id: {agent_id}"

    @tool(timeout_s=None)
    async def assign_task(self, agent_id: str, task: str) -> str:
        """Give a helper agent a task. Returns the helper's final answer.

        Args:
            agent_id: an id returned by create_subagent.
            task: the task, self-contained: the helper does not see this conversation.
        """
        agent = self.agents.get(agent_id)
        if agent is None:
            known = ", ".join(self.agents) or "none yet: call create_subagent first"
            raise UnknownSubagentError(f"no sub-agent {agent_id!r}; known agent ids: {known}")
        if not task.strip():
            raise ValueError("the task is empty; write what the helper should find and how to answer")
        if not self.turns:  # called outside step (a direct call): count it as its own turn
            self.turns.append([])
        turn, index = len(self.turns) - 1, self._assignments
        self._assignments += 1
        task_id = f"{self.task.id if self.task else 'task'}/{agent_id}/{index}"
        async with self._agent_locks.setdefault(agent_id, asyncio.Lock()):  # one task at a time per sub-agent
            child = await self.runtime.run(
                agent, task, task_id=task_id, seed=derive_seed(self._seed, turn, index),
                max_steps=self._steps_left(turn, agent_id),
            )  # fmt: skip
        child.info.update({"turn": turn, "assignment": index, "task": task, "agent_id": agent_id})
        self.turns[turn].append(child)
        if child.error is not None:
            return f"Sub-agent {agent_id} failed: {child.error}"
        answer = (child.final_answer or "").strip()
        if not answer:
            return f"Sub-agent {agent_id} ended without an answer ({child.info.get('truncation', 'no answer')})."
        return answer

    def _steps_left(self, turn: int, agent_id: str) -> int:
        """Sub-agent step limit, lowered so this turn cannot overrun the critical-steps budget (the agent's earlier
        tasks of this turn, which ran before this one, count)."""
        if self.config.max_critical_steps is None:
            return self.config.subagent_max_steps
        before = self.critical_steps_so_far(turn)
        used = sum(child_steps(c) for c in self.turns[turn] if c.info.get("agent_id") == agent_id)
        left = self.config.max_critical_steps - before - 2 - used  # this turn's own step and a final answer
        return max(1, min(self.config.subagent_max_steps, left))

    # -- reward -------------------------------------------------------------------------------------
    def record_episode(self, trajectory: Trajectory) -> None:
        """Attach the sub-agent episodes and write the swarm's keys (children, step clock, critical steps, what each
        sub-task was worth, independent checks); no reward. ``reward`` calls it; a nested swarm's wrapper too.

        ``trajectory.info`` keys: ``started_at``/``ended_at`` (monotonic seconds), ``subagents_created``,
        ``turn_subagent_steps`` (per tool turn, each assignment's steps), ``TASK_SIZE_KEY`` (items of a wide task)
        and ``failed_checks`` (``["decoy_subtasks"]`` when work was done for credit, not the task)."""
        if self._recorded == trajectory.id:
            return
        self._recorded = trajectory.id
        orchestrator_turns = sum(m.role == "assistant" for m in trajectory.messages)
        launched = self._launches(self.turns)
        schedule = step_schedule(self._agent_steps(launched))
        children = []
        for turn, spans in zip(launched, schedule, strict=True):
            ends = [end for _, end in spans]
            last = max(range(len(turn)), key=lambda i: (ends[i], -i)) if turn else None
            for child, (start, end) in zip(turn, spans, strict=True):
                child.parent_id = trajectory.id
                # every task of the agent that finished the turn last lies on the critical path
                child.info["critical"] = last is not None and child.info.get("agent_id") == turn[last].info.get(
                    "agent_id"
                )
                child.info.update(step_start=start, step_end=end)
                children.append(child)
        trajectory.children = children
        answer = trajectory.final_answer if trajectory.terminated else None
        counts = judge_children(self.task, answer, launched) if self.task is not None else {}
        critical = schedule_length(self._agent_steps(launched)) + max(0, orchestrator_turns - len(launched))
        total = orchestrator_turns + sum(int(c.metrics.get("total_steps", child_steps(c))) for c in children)
        ended = time.monotonic()
        steps = [[child_steps(c) for c in turn] for turn in launched]
        items = self.task.info.get("items") if self.task is not None else None
        trajectory.info.update(
            {"started_at": self._started, "ended_at": ended, "subagents_created": len(self.agents),
             "turn_subagent_steps": steps}
        )  # fmt: skip
        if isinstance(items, list) and items:
            trajectory.info[TASK_SIZE_KEY] = len(items)
        if counts:
            # independent check (the monitors' reward-hacking key): decoys are work done for credit, not the task
            trajectory.info["failed_checks"] = ["decoy_subtasks"] if counts["decoys"] else []
        trajectory.metrics.update(
            {"critical_steps": float(critical), "total_steps": float(total),
             "swarm/wall_time_s": ended - self._started, "swarm/subagents_created": float(len(self.agents)),
             "swarm/assignments": float(len(children)),
             "swarm/subagents_finished": float(sum(bool((c.final_answer or "").strip()) for c in children)),
             "swarm/max_concurrency": float(max_overlap(subagent_intervals(trajectory))),
             "swarm/useful_parallelism": float(useful_overlap(subtasks(trajectory))),
             **{f"swarm/{k}": float(v) for k, v in counts.items()}}
        )  # fmt: skip

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        assert self.task is not None, "reward() before reset()"
        self.record_episode(trajectory)
        scores = item_scores(self.task, trajectory.final_answer if trajectory.terminated else None)
        trajectory.metrics.update({f"swarm/{k}": v for k, v in scores.items()})
        return self.rubric.measure(trajectory, self.task)  # unweighted: score anneals λ1, λ2
