"""Tool-call loop detection (the seed's death loop: query -> list -> filter -> not enough -> query again).

``LoopDetector`` finds a cycle of (tool, canonical arguments) repeated back to back within an episode.
``LoopGuard(env, response=...)`` wraps any env: it warns the model, truncates the episode or penalises it,
and always records ``trajectory.metrics["loop_detections"]``. ``LoopPenalty`` scores a finished trajectory.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from taskrl.env import Env, StepOutput, Wrapper, maybe_await, step_output
from taskrl.rewards.views import call_key, tool_exchanges
from taskrl.types import Message, Task, ToolCall, Trajectory
from taskrl.validate import at_least, require

LOOP_METRIC = "loop_detections"
LOOP_WARNING = (
    "You are repeating the same tool calls ({cycle}) without making progress. Do not repeat them: "
    "change your approach, or give your final answer with what you have."
)


@dataclass(frozen=True)
class LoopConfig:
    """When a run of tool calls counts as a loop."""

    min_repeats: int = 2
    """A cycle must occur at least this many times back to back."""
    min_calls: int = 4
    """...and cover at least this many calls (so one retry of a failed call is not a loop)."""
    max_period: int = 8
    """Longest cycle looked for, in calls."""
    key: Callable[[ToolCall], Hashable] = call_key
    """What makes two calls the same; default (tool name, arguments as canonical JSON)."""

    def __post_init__(self) -> None:
        require("LoopConfig", "must be >= 1", at_least(1), min_repeats=self.min_repeats, min_calls=self.min_calls,
                max_period=self.max_period)  # fmt: skip
        if self.min_repeats < 2:
            raise ValueError(f"LoopConfig.min_repeats must be >= 2 (a cycle must repeat), got {self.min_repeats}")


class LoopDetector:
    """Feed it each call as it is made; it reports a loop once per fresh run of ``min_repeats`` cycles.

    After a detection, only calls made afterwards can form the next one, so a loop that goes on is counted
    again every ``min_repeats`` cycles rather than on every call.
    """

    def __init__(self, config: LoopConfig | None = None) -> None:
        self.config = config or LoopConfig()
        self.reset()

    def reset(self) -> None:
        self.keys: list[Hashable] = []
        self.names: list[str] = []
        self.detections = 0
        self.last_cycle: list[str] = []
        self._fresh_from = 0

    def observe(self, calls: Iterable[ToolCall]) -> bool:
        """Add calls in the order made; True when they completed a new loop."""
        found = False
        for call in calls:
            self.keys.append(self.config.key(call))
            self.names.append(call.name)
            period = self._cycle_at_end()
            if period:
                self.detections += 1
                self.last_cycle = self.names[-period:]
                self._fresh_from = len(self.keys)
                found = True
        return found

    def _cycle_at_end(self) -> int:
        """The shortest period p such that the fresh calls end in >= min_repeats copies of a p-call block."""
        keys, cfg = self.keys, self.config
        n = len(keys)
        fresh = n - self._fresh_from
        for period in range(1, min(cfg.max_period, fresh // cfg.min_repeats) + 1):
            repeats = 1
            while (repeats + 1) * period <= fresh and all(
                keys[n - 1 - i] == keys[n - 1 - i - repeats * period] for i in range(period)
            ):
                repeats += 1
                if repeats >= cfg.min_repeats and repeats * period >= cfg.min_calls:
                    return period
        return 0


def count_loops(calls: Sequence[ToolCall], config: LoopConfig | None = None) -> int:
    """Loops in a finished episode's calls, exactly as ``LoopGuard`` would have counted them live."""
    detector = LoopDetector(config)
    detector.observe(calls)
    return detector.detections


@dataclass(frozen=True)
class LoopPenalty:
    """Minus the number of tool-call loops in the episode (calls that ran; invalid calls never reach the env)."""

    config: LoopConfig = LoopConfig()
    """When a run of calls counts as a loop."""
    value_range: ClassVar[tuple[float, float]] = (float("-inf"), 0.0)

    def __call__(self, trajectory: Trajectory, task: Task | None) -> float | None:
        calls = [e.call for e in tool_exchanges(trajectory) if not e.is_invalid]
        return -float(count_loops(calls, self.config))


LoopResponse = Literal["warn", "truncate", "penalize"]


class LoopGuard(Wrapper):
    """Wraps an env and watches its tool calls for loops; the rest of the Env contract is the wrapped env's.

    ``response``: ``warn`` appends a user message telling the model it is looping; ``truncate`` ends the
    episode as truncated; ``penalize`` adds ``rewards["loop_penalty"] = -penalty · detections``. Every
    response records ``trajectory.metrics["loop_detections"]``.
    """

    def __init__(
        self,
        env: Env,
        response: LoopResponse = "warn",
        *,
        config: LoopConfig | None = None,
        penalty: float = 0.5,
        warning: str = LOOP_WARNING,
    ) -> None:
        if response not in ("warn", "truncate", "penalize"):
            raise ValueError(f"LoopGuard.response must be 'warn', 'truncate' or 'penalize', got {response!r}")
        if not penalty >= 0:
            raise ValueError(f"LoopGuard.penalty must be >= 0, got {penalty}")
        super().__init__(env)
        self.response = response
        self.penalty = float(penalty)
        self.detector = LoopDetector(config)
        self.warning = warning

    async def reset(self, task: Task, seed: int | None = None) -> Any:
        self.detector.reset()
        return await maybe_await(self.env.reset(task, seed=seed))

    async def step(self, tool_calls: list[ToolCall]) -> StepOutput:
        results, terminated, truncated, info = step_output(await maybe_await(self.env.step(tool_calls)), self.name)
        if not self.detector.observe(tool_calls):
            return StepOutput(results, terminated, truncated, info)
        info = dict(info)
        info["loop_detected"] = True
        if self.response == "warn":
            text = self.warning.format(cycle=" -> ".join(self.detector.last_cycle))
            info["append_messages"] = [*info.get("append_messages", []), Message("user", text)]
        elif self.response == "truncate":
            truncated = True
        return StepOutput(results, terminated, truncated, info)

    async def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        rewards = dict(await maybe_await(self.env.reward(trajectory)))
        detections = self.detector.detections
        trajectory.metrics[LOOP_METRIC] = float(detections)
        if self.response == "penalize":
            rewards["loop_penalty"] = -self.penalty * detections
        return rewards
