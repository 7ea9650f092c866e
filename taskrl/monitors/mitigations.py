"""Counter-measures a trainer can switch on: reward shaping, a temperature floor, forced first-tool hints."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from taskrl.env import Env, Wrapper, maybe_await
from taskrl.monitors.episode import tool_calls
from taskrl.monitors.runner import Monitors
from taskrl.types import Message, Task, Trajectory
from taskrl.validate import at_least, require


@dataclass
class MitigationConfig:
    """Counter-measures to failure modes; all off by default. Reward shaping goes through ``shape_rewards``."""

    tool_call_penalty: float = 0.0
    """Subtracted from the reward per tool call (tool over-use)."""
    tool_cost_weight: float = 0.0
    """Multiplies ``metrics["tool_cost"]`` (the ToolSet per-call costs) and subtracts it (tool over-use)."""
    max_tool_penalty: float = 0.5
    """Cap on the two tool penalties together, so a long honest solve is never worse than giving up."""
    invalid_call_penalty: float = 0.0
    """Subtracted from the reward per invalid tool call."""
    temperature_floor: float = 0.0
    """Sampling temperature never goes below this (minimum exploration); 0 = off."""
    first_tool_hint_every: int = 0
    """Every n-th episode is told to start with the least-used first tool of the last batch; 0 = off."""
    only_on_alert: bool = False
    """Apply the exploration mitigations only while an exploration-collapse monitor alerts."""

    def __post_init__(self) -> None:
        require("MitigationConfig", "must be >= 0", at_least(0), tool_call_penalty=self.tool_call_penalty,
                tool_cost_weight=self.tool_cost_weight, max_tool_penalty=self.max_tool_penalty,
                invalid_call_penalty=self.invalid_call_penalty, temperature_floor=self.temperature_floor,
                first_tool_hint_every=self.first_tool_hint_every)  # fmt: skip


EXPLORATION_MONITORS = frozenset({"tool_ngram_entropy", "duplicate_rate"})


def shape_rewards(trajectories: Iterable[Trajectory], config: MitigationConfig) -> None:
    """Add the penalty terms to each trajectory's measured ``terms`` in place (idempotent: a term is overwritten;
    ``taskrl.scoring.score`` weighs them, 1 unless the rubric lists them).

    Terms: ``tool_cost_penalty`` = -min(max_tool_penalty, tool_call_penalty * calls + tool_cost_weight * cost)
    and ``invalid_call_penalty`` = -invalid_call_penalty * invalid calls. Penalties only lower a reward, so the
    loop's invariant (invalid calls never beat a failure) still holds. Apply before computing advantages.
    """
    for t in trajectories:
        if config.tool_call_penalty or config.tool_cost_weight:
            raw = config.tool_call_penalty * t.metrics.get("tool_calls", 0.0)
            raw += config.tool_cost_weight * t.metrics.get("tool_cost", 0.0)
            t.terms["tool_cost_penalty"] = -min(config.max_tool_penalty, raw)
        if config.invalid_call_penalty:
            t.terms["invalid_call_penalty"] = -config.invalid_call_penalty * t.metrics.get("invalid_tool_calls", 0.0)


def _exploring(config: MitigationConfig, monitors: Monitors | None) -> bool:
    return not config.only_on_alert or (monitors is not None and bool(monitors.active & EXPLORATION_MONITORS))


def sampling_temperature(base: float, config: MitigationConfig, monitors: Monitors | None = None) -> float:
    """The temperature to sample the next batch with: ``base`` raised to the floor when the floor applies."""
    return max(base, config.temperature_floor) if _exploring(config, monitors) else base


def least_used_first_tool(trajectories: Iterable[Trajectory], tool_names: Iterable[str]) -> str | None:
    """The env tool that episodes of the last batch least often called first (ties: alphabetical)."""
    firsts = Counter(calls[0][0] for t in trajectories if (calls := tool_calls(t)))
    names = sorted(tool_names)
    return min(names, key=lambda n: (firsts[n], n)) if names else None


class FirstToolHint(Wrapper):
    """Wraps an env: its opening prompt ends with a request to start with ``tool`` (forced alternative first tool).

    Everything else is the inner env's; the hint is a prompt message (loss mask 0), not a forced sample.
    """

    def __init__(self, env: Env, tool: str) -> None:
        super().__init__(env)
        self.hint = f"Start by calling the `{tool}` tool."

    async def reset(self, task: Task, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        messages, info = await maybe_await(self.env.reset(task, seed=seed))
        return [*messages, Message("user", self.hint)], {**info, "first_tool_hint": self.hint}


def with_first_tool_hints(
    env_factory: Callable[[], Any],
    config: MitigationConfig,
    last_batch: Sequence[Trajectory],
    tool_names: Iterable[str],
    monitors: Monitors | None = None,
) -> Callable[[], Any]:
    """An env factory for ``run_episodes`` that wraps every ``first_tool_hint_every``-th env in ``FirstToolHint``.

    The counter makes the choice deterministic for a given order of env creation.
    """
    tool = least_used_first_tool(last_batch, tool_names)
    if not config.first_tool_hint_every or tool is None or not _exploring(config, monitors):
        return env_factory
    made = 0

    def factory() -> Any:
        nonlocal made
        made += 1
        env = env_factory()
        return FirstToolHint(env, tool) if made % config.first_tool_hint_every == 0 else env

    return factory
