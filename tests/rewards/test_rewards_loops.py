"""Loop detection: the detector's cycles, LoopGuard's contract and its three responses through the real loop."""

from __future__ import annotations

from typing import Any

import pytest

from taskrl.env import ToolEnv, acheck_env, make
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rewards.loops import LOOP_METRIC, LoopConfig, LoopDetector, LoopGuard, LoopPenalty, count_loops
from taskrl.rollout import RolloutConfig, run_episode
from taskrl.tools import tool
from taskrl.types import Message, Task, ToolCall, Trajectory

call = ScriptedPolicy.call


def calls(*spec: str | tuple[str, dict[str, Any]]) -> list[ToolCall]:
    out = []
    for i, s in enumerate(spec):
        name, args = (s, {}) if isinstance(s, str) else s
        out.append(ToolCall(f"c{i}", name, args))
    return out


def test_detector_finds_cycles_back_to_back() -> None:
    assert count_loops(calls("query", "list", "filter", "query", "list", "filter")) == 1  # the death loop
    assert count_loops(calls("query", "list", "filter", "query", "list")) == 0
    assert count_loops(calls("a", "a")) == 0  # one retry is not a loop
    assert count_loops(calls("a", "a", "a", "a")) == 1
    assert count_loops(calls("a", "b", "a", "b")) == 1
    assert count_loops(calls(*[("get", {"id": i}) for i in range(8)])) == 0  # different arguments: progress
    assert count_loops(calls(("f", {"a": 1, "b": 2}), ("f", {"b": 2, "a": 1}), ("f", {"a": 1, "b": 2}),
                             ("f", {"b": 2, "a": 1}))) == 1  # fmt: skip  # argument order is not a difference
    # A loop that goes on is counted again every min_repeats cycles, not on every call.
    assert count_loops(calls(*["q", "l", "f"] * 3)) == 1
    assert count_loops(calls(*["q", "l", "f"] * 4)) == 2
    assert count_loops(calls(*["q", "l", "f"] * 3), LoopConfig(min_repeats=3)) == 1
    assert count_loops(calls(*[("q", {"x": i}) for i in range(4)]), LoopConfig(key=lambda c: c.name)) == 1


def test_detector_reports_the_cycle_and_rejects_bad_config() -> None:
    detector = LoopDetector()
    assert not detector.observe(calls("query", "list", "filter"))
    assert detector.observe(calls("query", "list", "filter"))
    assert detector.last_cycle == ["query", "list", "filter"] and detector.detections == 1
    with pytest.raises(ValueError, match="min_repeats"):
        LoopConfig(min_repeats=1)
    with pytest.raises(ValueError, match="response"):
        LoopGuard(make("shop"), "explode")  # type: ignore[arg-type]


async def test_loop_guard_keeps_the_env_contract() -> None:
    guard = LoopGuard(make("shop"))
    await acheck_env(guard)
    assert guard.name == "shop" and "lookup_price" in guard.tools
    guard.training = False  # what the loop does: it must reach the wrapped env
    assert guard.env.training is False
    assert guard.user_turn is None and guard.scripted_rule == guard.env.scripted_rule  # declared, forwarded
    assert guard.unwrapped is guard.env and LoopGuard(guard).unwrapped is guard.env


class Catalogue(ToolEnv):
    """The seed's recommendation task: query history -> list products -> filter -> answer the cheapest."""

    name = "catalogue"

    def tasks(self, split: str = "train") -> list[Task]:
        return [Task("rec", "Recommend a snack for user 7 under $3.", answer="pretzels")]

    @tool
    def query_history(self, user: int) -> str:
        """A user's purchase history.

        Args:
            user: the user id.
        """
        return "user 7 likes snacks"

    @tool
    def list_products(self, category: str) -> str:
        """Products of a category with prices.

        Args:
            category: e.g. "snacks".
        """
        return "chips $4, pretzels $2, nuts $5"

    @tool
    def filter_products(self, max_price: float) -> str:
        """Keep the listed products under a price.

        Args:
            max_price: the price limit in dollars.
        """
        return "pretzels $2"

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        return {"correct": float((trajectory.final_answer or "").strip().lower() == "pretzels")}


CYCLE = [call("query_history", user=7), call("list_products", category="snacks"), call("filter_products", max_price=3)]


def looper(cycles: int) -> ScriptedPolicy:
    """Goes round the death loop ``cycles`` times, then answers; stops looping as soon as it is warned."""

    def rule(messages: list[Message], tools: Any) -> str:
        if any(m.role == "user" and "repeating" in m.content for m in messages):
            return "pretzels"
        n = sum(m.role == "assistant" for m in messages)
        return CYCLE[n % 3] if n < 3 * cycles else "pretzels"

    return ScriptedPolicy(rule)


async def play(env: Any, policy: ScriptedPolicy) -> Trajectory:
    return await run_episode(env, policy, env.tasks()[0], RolloutConfig(max_turns=20), seed=0)


async def test_truncate_response_ends_a_death_loop_below_the_honest_policy() -> None:
    honest = await play(LoopGuard(Catalogue(), "truncate"), looper(1))
    looping = await play(LoopGuard(Catalogue(), "truncate"), looper(99))
    assert honest.reward == 1.0 and honest.metrics[LOOP_METRIC] == 0.0 and honest.terminated
    assert looping.truncated and looping.info["truncation"] == "env" and looping.metrics["turns"] == 6
    assert looping.metrics[LOOP_METRIC] == 1.0 and looping.reward < honest.reward


async def test_penalize_response_counts_every_loop() -> None:
    looping = await play(LoopGuard(Catalogue(), "penalize", penalty=0.25), looper(4))
    assert looping.terminated and looping.rewards == {"correct": 1.0, "loop_penalty": -0.5}
    assert looping.metrics[LOOP_METRIC] == 2.0
    assert LoopPenalty()(looping, None) == -2.0  # offline scoring agrees with the live guard


async def test_warn_response_tells_the_model_and_it_can_recover() -> None:
    traj = await play(LoopGuard(Catalogue(), "warn"), looper(99))
    warnings = [m for m in traj.messages if m.role == "user" and "repeating" in m.content]
    assert len(warnings) == 1 and "query_history -> list_products -> filter_products" in warnings[0].content
    assert traj.messages.index(warnings[0]) == len(traj.messages) - 2  # right after the looping turn's result
    assert traj.reward == 1.0 and traj.metrics[LOOP_METRIC] == 1.0
