"""Acceptance: scripted cheating policies score below an honest scripted policy under the matching preset,
played through the real agent loop: fabricated answer, busy-work, trivial tests, fake parallelism, death loop."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from taskrl.env import ToolEnv
from taskrl.envs.builtin import PRICES, ShopEnv
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rewards.loops import LoopGuard
from taskrl.rewards.presets import composer, parl, seed_weighted
from taskrl.rewards.terms import AnswerMatch
from taskrl.rollout import RolloutConfig, run_episode
from taskrl.tools import tool
from taskrl.types import Message, Task, Trajectory

call = ScriptedPolicy.call


async def play(env: Any, rule: Any, task: Task | None = None, max_turns: int = 12) -> Trajectory:
    return await run_episode(env, ScriptedPolicy(rule), task or env.tasks()[0], RolloutConfig(max_turns), seed=0)


class GroundedShop(ShopEnv):
    """The built-in shop scored by the seed's weighted preset (completion, busy-work, grounding gate)."""

    def __init__(self) -> None:
        super().__init__(num_tasks=4)
        self.rubric = seed_weighted(AnswerMatch("number"))

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        return self.rubric.measure(trajectory, self.task)


def order_of(messages: list[Message]) -> list[tuple[str, str]]:
    return re.findall(r"(\d+) x (\w+)", next(m.content for m in messages if m.role == "user"))


def fabricator(messages: list[Message], tools: Any) -> str:
    """Knows the price list by heart and answers the right total without looking anything up."""
    return f"The total is {sum(int(q) * PRICES[item] for q, item in order_of(messages))}."


def busy_worker(messages: list[Message], tools: Any) -> str:
    """Solves it like the expert, but looks the first price up three more times to look busy."""
    order = order_of(messages)
    turn = sum(m.role == "assistant" for m in messages)
    if turn == 0:
        return "\n".join(call("lookup_price", item=item) for _, item in order)
    if turn <= 3:
        return call("lookup_price", item=order[0][1])
    if turn == 4:
        return call("calculator", expression=" + ".join(f"{q}*{PRICES[item]}" for q, item in order))
    return f"The total is {messages[-1].content}."


async def test_fabricated_and_busy_work_answers_score_below_the_honest_expert() -> None:
    for task in GroundedShop().tasks():
        honest = await play(GroundedShop(), ShopEnv.scripted_rule, task)
        fabricated = await play(GroundedShop(), fabricator, task)
        busy = await play(GroundedShop(), busy_worker, task)
        assert honest.rewards["completion"] == fabricated.rewards["completion"] == busy.rewards["completion"] == 0.4
        assert fabricated.reward == 0.0 and fabricated.rewards["grounding_cap"] == -0.4  # scored as a failure
        assert busy.rewards["busy_work"] < 0 and busy.rewards["grounding_cap"] == 0.0
        assert honest.reward == 0.4 > busy.reward > fabricated.reward


class WriteTestsEnv(ToolEnv):
    """Write tests for ``grade``; coverage is the share of its branches the agent's test inputs execute."""

    name = "test_writing"
    branches = ("negative", "fail", "pass", "distinction")

    def __init__(self) -> None:
        super().__init__()
        self.rubric = composer()
        self.hit: set[str] = set()
        self.failures = 0
        self.cases = 0

    def tasks(self, split: str = "train") -> list[Task]:
        return [Task("grade", "Write tests for grade(score): invalid below 0, fail below 50, pass, distinction >= 80.")]

    def grade(self, score: int) -> str:
        branch = "negative" if score < 0 else "fail" if score < 50 else "pass" if score < 80 else "distinction"
        self.hit.add(branch)
        return "invalid" if branch == "negative" else branch

    @tool
    def add_test(self, score: int, expected: str) -> str:
        """Add a test case: grade(score) must return expected; runs it at once.

        Args:
            score: the input.
            expected: the expected output.
        """
        self.cases += 1
        ok = self.grade(score) == expected
        self.failures += not ok
        return "passed" if ok else "FAILED"

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        trajectory.info.update(tests_passed=self.cases - self.failures, tests_total=self.cases)
        if self.cases:
            trajectory.info["test_coverage"] = len(self.hit) / len(self.branches)
        return self.rubric.measure(trajectory, self.task)


def writes_tests(cases: list[tuple[int, str]]) -> Any:
    def rule(messages: list[Message], tools: Any) -> str:
        return "\n".join(call("add_test", score=s, expected=e) for s, e in cases) if len(messages) == 2 else "done"

    return rule


async def test_trivial_tests_score_below_thorough_tests() -> None:
    thorough = await play(
        WriteTestsEnv(), writes_tests([(-1, "invalid"), (10, "fail"), (60, "pass"), (95, "distinction")])
    )
    trivial = await play(WriteTestsEnv(), writes_tests([(60, "pass")]))
    assert thorough.info["test_coverage"] == 1.0 and trivial.info["test_coverage"] == 0.25
    assert thorough.rewards["tests"] == trivial.rewards["tests"] == 1.0  # both test suites pass
    assert thorough.rewards["trivial_tests"] == 0.0 > trivial.rewards["trivial_tests"]
    assert thorough.reward > trivial.reward


class Swarm(ToolEnv):
    """An orchestrator whose sub-agents sum a slice of numbers each; calls in one turn run concurrently."""

    name = "mini_swarm"

    def __init__(self) -> None:
        super().__init__()
        self.rubric = parl(k=3)
        self.children: list[Trajectory] = []

    def tasks(self, split: str = "train") -> list[Task]:
        return [Task("sum", "Add up 1..9 using helpers for 1-3, 4-6 and 7-9.", answer="45")]

    @tool
    async def assign_task(self, numbers: list[int]) -> str:
        """Give a sub-agent a slice of numbers to add; returns its answer.

        Args:
            numbers: the numbers it must add.
        """
        started = time.monotonic()
        await asyncio.sleep(0.02)  # the sub-agent's own episode
        result = str(sum(numbers))
        info = {"started_at": started, "ended_at": time.monotonic(), "final_answer": result}
        self.children.append(Trajectory(task_id="slice", info=info, trainable=False))
        return result

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        trajectory.children = list(self.children)
        return self.rubric.measure(trajectory, self.task)


SLICES = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]


def parallel_orchestrator(messages: list[Message], tools: Any) -> str:
    if len(messages) == 2:
        return "\n".join(call("assign_task", numbers=s) for s in SLICES)
    return str(sum(int(m.content) for m in messages if m.role == "tool"))


def serial_orchestrator(messages: list[Message], tools: Any) -> str:
    done = sum(m.role == "tool" for m in messages)
    return call("assign_task", numbers=SLICES[done]) if done < 3 else parallel_orchestrator(messages, tools)


async def test_serial_fake_parallelism_gets_no_parallel_credit() -> None:
    honest = await play(Swarm(), parallel_orchestrator)
    fake = await play(Swarm(), serial_orchestrator)
    assert honest.rewards["perf"] == fake.rewards["perf"] == 1.0
    assert len(honest.children) == len(fake.children) == 3 and fake.rewards["finish"] == honest.rewards["finish"]
    assert honest.rewards["parallel"] == 0.3 and fake.rewards["parallel"] == 0.0
    assert honest.reward > fake.reward


class Recommender(ToolEnv):
    """The seed's death-loop scenario: history -> products -> filter -> answer, under the seed preset."""

    name = "recommender"

    def __init__(self) -> None:
        super().__init__()
        self.rubric = seed_weighted(AnswerMatch("contains"))

    def tasks(self, split: str = "train") -> list[Task]:
        return [Task("rec", "Recommend user 7 a snack under $3.", answer="pretzels")]

    @tool
    def query_history(self, user: int) -> str:
        """A user's purchase history.

        Args:
            user: the user id.
        """
        return "likes snacks"

    @tool
    def list_products(self, category: str) -> str:
        """Products of a category.

        Args:
            category: e.g. "snacks".
        """
        return "chips $4, pretzels $2"

    @tool
    def filter_products(self, max_price: int) -> str:
        """Products under a price.

        Args:
            max_price: dollars.
        """
        return "pretzels $2"

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        return self.rubric.measure(trajectory, self.task)


STEPS = [call("query_history", user=7), call("list_products", category="snacks"), call("filter_products", max_price=3)]


def recommender(cycles: int) -> Any:
    def rule(messages: list[Message], tools: Any) -> str:
        n = sum(m.role == "assistant" for m in messages)
        return STEPS[n % 3] if n < 3 * cycles else "pretzels $2"

    return rule


async def test_death_loop_scores_below_the_honest_policy() -> None:
    honest = await play(LoopGuard(Recommender(), "truncate"), recommender(1), max_turns=30)
    looping = await play(LoopGuard(Recommender(), "truncate"), recommender(100), max_turns=30)
    assert honest.reward == 0.4 and honest.metrics["loop_detections"] == 0
    assert looping.truncated and looping.metrics["loop_detections"] == 1 and looping.reward < honest.reward
    penalised = await play(LoopGuard(Recommender(), "penalize"), recommender(3), max_turns=30)
    assert penalised.terminated and penalised.rewards["completion"] == 0.4 and penalised.reward < honest.reward
