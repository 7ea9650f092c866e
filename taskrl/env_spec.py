"""What a run knows of its env without holding one: ``EnvSpec`` (tasks per split, rubric, tool names, expert rule).

    spec = EnvSpec.read(make("shop"), ["train", "test"])   # reads, does not close: the caller owns the env
    spec.tasks("train"); spec.rubric; spec.tool_names; spec.scripted_rule

The trainer and ``taskrl eval`` read one from a single instance of the env, close that instance, and play every
episode on fresh envs from the factory: no env lives for the run beside the episodes' own (a live "probe" env
kept its sandbox, corpus handles or sub-agent runtime open for hours, and a second one was built at each
evaluation). A spec can also be built directly, e.g. ``EnvSpec("mine", {"train": tasks}, Rubric(...))``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from taskrl.env import call_hook, declared, maybe_await
from taskrl.scoring import Rubric, rubric_of
from taskrl.types import Message, Task

ScriptedRule = Callable[[list[Message], list[dict[str, Any]] | None], str]
"""An expert: ``rule(messages, tools) -> assistant text`` (``taskrl.policies.scripted.ScriptedPolicy`` plays it)."""


class EnvSpecError(KeyError):
    """A split the spec did not read."""

    def __str__(self) -> str:  # KeyError quotes its message; this one is a sentence
        return str(self.args[0])


@dataclass(frozen=True)
class EnvSpec:
    """An env's tasks per split, rubric, tool names and expert rule, read once (``read``) or declared."""

    name: str
    splits: Mapping[str, tuple[Task, ...]]
    rubric: Rubric
    tool_names: tuple[str, ...] = ()
    scripted_rule: ScriptedRule | None = None
    unreadable: Mapping[str, Exception] = field(default_factory=dict)
    """Split -> the error the env raised listing it: raised again (by ``tasks``) only if that split is used."""

    def tasks(self, split: str) -> tuple[Task, ...]:
        if split in self.unreadable:
            raise self.unreadable[split]  # the env's own error, as if the split were listed now
        if split not in self.splits:
            raise EnvSpecError(
                f"env '{self.name}': split '{split}' was not read (read: {', '.join(sorted(self.splits)) or 'none'})"
            )
        return self.splits[split]

    @classmethod
    def read(cls, env: Any, splits: Iterable[str]) -> EnvSpec:
        """Read ``splits`` (in order, each once) and the rest of the spec from ``env``; the env stays open.

        A split the env refuses (raises for) is kept as its error, raised when the split is asked for: an env
        without a test split trains as before and fails only if it is evaluated."""
        tasks: dict[str, tuple[Task, ...]] = {}
        unreadable: dict[str, Exception] = {}
        for split in dict.fromkeys(splits):
            try:
                tasks[split] = tuple(env.tasks(split))
            except Exception as exc:  # an env's own refusal, whatever its type: reported when the split is used
                unreadable[split] = exc
        return cls(
            name=str(getattr(env, "name", type(env).__name__)),
            splits=tasks,
            rubric=rubric_of(env),
            tool_names=tuple(env.tools.names),
            scripted_rule=declared(env, "scripted_rule"),
            unreadable=unreadable,
        )


async def aread_spec(env_factory: Callable[[], Any], splits: Iterable[str]) -> EnvSpec:
    """``EnvSpec.read`` of one env from ``env_factory``, which is closed (its ``close`` hook awaited) before return."""
    env = env_factory()
    try:
        return EnvSpec.read(env, splits)
    finally:
        await maybe_await(call_hook(env, "close"))


def read_spec(env_factory: Callable[[], Any], splits: Iterable[str]) -> EnvSpec:
    """``aread_spec`` from synchronous code (no event loop running in this thread)."""
    return asyncio.run(aread_spec(env_factory, splits))
