"""The environment contract, the registry, and ``check_env``.

An env has ``tools`` (a ToolSet), ``tasks(split)``, ``reset(task, seed) -> (messages, info)``,
``step(tool_calls) -> (results, terminated, truncated, info)`` and ``reward(trajectory) -> {term: value}``.
Methods may be sync or async. ``ToolEnv`` implements ``step`` for the common case (run the calls on its
tools); subclass it and write tools, tasks and a reward. ``check_env`` is run on every registered env.

``step`` may put ``"context"`` in its info to change the model's view (pruning, summaries): a new
``list[Message]``, or a function from the current view (tool results of this step included) to the new one;
the loop then re-renders the context and opens a new token Segment. ``"append_messages"`` adds messages
after the tool results. Envs with a ``training`` attribute get ``RolloutConfig.training`` before reset.

A turn without tool calls ends the episode unless the env defines
``user_turn(text) -> (messages, terminated, truncated, info)``: a simulated user who answers and lets
the conversation go on (dialogue tasks, clarifying questions). An env that defines
``observe_context(used_tokens, max_tokens)`` is told, after every sampled turn and before ``step``, how
many tokens the model's view holds (token budgets, "[Token usage: ...]" lines).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from taskrl.tools import ToolSet
from taskrl.types import Message, Task, ToolCall, ToolResult, Trajectory

StepOutput = tuple[list[ToolResult], bool, bool, dict[str, Any]]


class UnknownEnvError(KeyError):
    """No env is registered under the requested name."""

    def __str__(self) -> str:  # KeyError would print the message with quotes
        return str(self.args[0])


class EnvCheckError(AssertionError):
    """An env breaks the contract; the message names the method and what was wrong."""


@runtime_checkable
class Env(Protocol):
    name: str
    tools: ToolSet

    def tasks(self, split: str = "train") -> Sequence[Task]: ...

    def reset(self, task: Task, seed: int | None = None) -> Any: ...

    def step(self, tool_calls: list[ToolCall]) -> Any: ...

    def reward(self, trajectory: Trajectory) -> Any: ...


def step_hooks(env: Any, name: str) -> list[Callable[..., Any]]:
    """``env.<name>`` and ``<name>`` of every object the env holds (its reward, its reward's terms): how a trainer
    reaches optional hooks such as ``set_step(step, epoch)`` and ``finalize_group(group, task)``."""
    hooks = []
    for target in [env, *vars(env).values()] if hasattr(env, "__dict__") else [env]:
        hook = getattr(target, name, None)
        if callable(hook) and not isinstance(target, type):
            hooks.append(hook)
    return hooks


async def maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class ToolEnv:
    """Base class: an env whose actions are calls to its ``@tool`` methods.

    Subclasses set ``name`` and ``system_prompt``, define ``@tool`` methods, ``tasks`` and ``reward``;
    ``reset`` stores the task in ``self.task`` and opens with the system prompt and the task prompt.
    """

    name: str = "tool_env"
    system_prompt: str = "You are a helpful assistant. Use the tools when they help."
    max_parallel: int | None = None
    failure_reward: float = 0.0
    """Reward of a failed episode; trajectories with invalid tool calls score no better than this."""

    def __init__(self) -> None:
        self.tools = ToolSet.from_object(self, max_parallel=self.max_parallel)
        self.task: Task | None = None

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return []

    def reset(self, task: Task, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        self.task = task
        return [Message("system", self.system_prompt), Message("user", task.prompt)], {}

    async def step(self, tool_calls: list[ToolCall]) -> StepOutput:
        return await self.tools.execute(tool_calls), False, False, {}

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        return {}


@dataclass
class EnvSpec:
    name: str
    factory: Callable[..., Env]
    description: str = ""


_REGISTRY: dict[str, EnvSpec] = {}
_BUILTINS_LOADED = False


def register(name: str, factory: Callable[..., Env], *, description: str = "", overwrite: bool = False) -> None:
    """Make ``make(name)`` build an env with ``factory(**kwargs)``."""
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"env '{name}' is already registered; pass overwrite=True to replace it")
    _REGISTRY[name] = EnvSpec(name, factory, description)


def registry() -> dict[str, EnvSpec]:
    """All registered envs, the built-in ones included."""
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        import taskrl.envs  # noqa: F401 - registers the built-in envs

    return dict(_REGISTRY)


def make(name: str, **kwargs: Any) -> Env:
    specs = registry()
    if name not in specs:
        raise UnknownEnvError(
            f"unknown env '{name}'; registered envs: {', '.join(sorted(specs)) or 'none'} "
            "(see `taskrl env list`)"
        )
    env = specs[name].factory(**kwargs)
    if not getattr(env, "name", None):
        env.name = name
    return env


async def acheck_env(env: Env, *, num_tasks: int = 3) -> None:
    """Exercise an env through the contract; raise ``EnvCheckError`` naming what is wrong."""

    def fail(msg: str) -> None:
        raise EnvCheckError(f"env '{getattr(env, 'name', type(env).__name__)}': {msg}")

    async def call(method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return await maybe_await(getattr(env, method)(*args, **kwargs))
        except Exception as e:  # noqa: BLE001 - reported as a contract failure naming the method
            fail(f"{method} raised {type(e).__name__}: {e}")

    async def reward_for_answer(task: Task, messages: list[Message], answer: str) -> float:
        await call("reset", task, seed=0)
        traj = Trajectory(task_id=task.id, messages=[*messages, Message("assistant", answer)], terminated=True)
        traj.info["final_answer"] = answer
        rewards = await call("reward", traj)
        if not isinstance(rewards, dict):
            fail(f"reward must return a dict of terms, got {type(rewards).__name__}")
        return float(sum(v for v in rewards.values() if v is not None))

    for attr in ("tools", "tasks", "reset", "step", "reward"):
        if not hasattr(env, attr):
            fail(f"missing '{attr}'")
    if not isinstance(env.tools, ToolSet):
        fail(f"tools must be a ToolSet, got {type(env.tools).__name__}")
    for schema in env.tools.schemas():
        fn = schema.get("function", {})
        if not fn.get("name") or not fn.get("description") or fn.get("parameters", {}).get("type") != "object":
            fail(f"tool schema incomplete: {schema}")
    tasks = list(await call("tasks", "train"))[:num_tasks]
    if not tasks:
        fail("tasks('train') returned no tasks")
    for task in tasks:
        if not isinstance(task, Task):
            fail(f"tasks() must yield Task objects, got {type(task).__name__}")
        out = await call("reset", task, seed=0)
        if not (isinstance(out, tuple) and len(out) == 2):
            fail("reset must return (messages, info)")
        messages, info = out
        if not messages or not all(isinstance(m, Message) for m in messages) or not isinstance(info, dict):
            fail("reset must return a non-empty list[Message] and a dict")
        bogus = ToolCall("call_check", "__no_such_tool__", {})
        step = await call("step", [bogus])
        if not (isinstance(step, tuple) and len(step) == 4):
            fail("step must return (results, terminated, truncated, info)")
        results, terminated, truncated, info = step
        if (
            not isinstance(results, list)
            or len(results) != 1
            or not isinstance(results[0], ToolResult)
            or not results[0].is_error
            or results[0].call_id != "call_check"
        ):
            fail("step must answer an unknown tool with one error ToolResult carrying the call id")
        if not isinstance(terminated, bool) or not isinstance(truncated, bool) or not isinstance(info, dict):
            fail("step must return bools for terminated/truncated and a dict for info")
        if task.answer is not None:
            gold = await reward_for_answer(task, messages, str(task.answer))
            wrong = await reward_for_answer(task, messages, "__certainly wrong__")
            if not gold > wrong:
                fail(f"task {task.id}: the gold answer scores {gold}, not more than a wrong answer ({wrong})")


def check_env(env: Env, *, num_tasks: int = 3) -> None:
    """Synchronous wrapper of ``acheck_env`` for scripts and the CLI."""
    import asyncio

    asyncio.run(acheck_env(env, num_tasks=num_tasks))
