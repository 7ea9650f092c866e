"""`prices`: held-out splits share no item combination with training; per-item credit only for looked-up,
reported prices; malformed calls score the failure floor; the scripted expert solves every task end to end."""

from __future__ import annotations

from typing import Any

import pytest
from price_episodes import episode

from taskrl.env import make
from taskrl.envs.builtin import PRICES
from taskrl.envs.prices import PricesEnv, held_out_combination, make_prices_tasks, reported_prices
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episode
from taskrl.types import Message, Task, Trajectory


def _combos(tasks: list[Task]) -> set[frozenset[str]]:
    return {frozenset(t.info["items"]) for t in tasks}


@pytest.mark.parametrize("held_out", ["test", "val"])
def test_held_out_splits_share_no_item_combination_with_training(held_out: str) -> None:
    env = PricesEnv(num_tasks=300, min_items=2, max_items=3)
    train, other = _combos(list(env.tasks("train"))), _combos(list(env.tasks(held_out)))
    assert len(train) > 50 and len(other) > 20 and not train & other
    assert all(held_out_combination(sorted(c)) for c in other)
    assert not any(held_out_combination(sorted(c)) for c in train)
    singles = PricesEnv(num_tasks=100, min_items=1, max_items=1).tasks("train")
    assert _combos(list(singles)) == {frozenset([item]) for item in PRICES}, "every item is demonstrated alone"
    with pytest.raises(ValueError, match="single items are training-only"):
        PricesEnv(min_items=1, max_items=1).tasks(held_out)


def test_val_and_test_are_disjoint_cover_every_item_and_repeat_no_combination_early() -> None:
    val = make_prices_tasks(40, 2, split="val", min_items=3, max_items=3)
    test = make_prices_tasks(65, 1, split="test", min_items=3, max_items=3)
    assert len(_combos(test)) == 65 and len(_combos(val)) == 40  # each combination once before any repeat
    assert not _combos(test) & _combos(val)
    assert {i for t in test for i in t.info["items"]} == set(PRICES)  # every item, not a hash-favoured few
    again = make_prices_tasks(66, 1, split="test", min_items=3, max_items=3)
    assert len(_combos(again)) == 65  # the 66th repeats a combination, in another order at most


def test_tasks_are_deterministic_and_bounds_fail_naming_them() -> None:
    assert make_prices_tasks(8, 0, min_items=2, max_items=2) == make_prices_tasks(8, 0, min_items=2, max_items=2)
    tasks = make_prices_tasks(40, 1, split="test", min_items=2, max_items=3)
    assert {len(t.info["items"]) for t in tasks} == {2, 3}
    assert all(t.info["listing"] == ", ".join(f"{i}: {PRICES[i]}" for i in t.info["items"]) for t in tasks)
    with pytest.raises(ValueError, match="min_items"):
        PricesEnv(min_items=3, max_items=2)


def test_credit_per_item_only_for_looked_up_reported_prices() -> None:
    env = PricesEnv(num_tasks=4, min_items=2, max_items=2)
    task = env.tasks("train")[0]
    env.reset(task)
    a, b = task.info["items"]

    def reward(looked_up: list[str], answer: str) -> float:
        return env.reward(episode(task, looked_up, answer))["items_right"]

    both = f"{a}: {PRICES[a]}, {b}: ${PRICES[b]}"
    assert reward([a, b], both) == 1.0
    assert reward([b, a], f"{b} ${PRICES[b]}\n{a}: {PRICES[a]}") == 1.0  # order and light formatting free
    assert reward([a], both) == 0.5, "a guessed (not looked-up) price earns nothing"
    assert reward([a, b], f"{a}: {PRICES[a]}") == 0.5
    assert reward([a, b], f"{a}: {PRICES[a] + 1}, {b}: {PRICES[b]}") == 0.5  # a wrong price earns nothing
    assert reward([a, b], "I don't know") == 0.0 and reward([], both) == 0.0
    assert reported_prices("Pear: $4, tea = 6") == {"pear": 4, "tea": 6}


def _run(rule: Any, task: Task) -> Trajectory:
    import asyncio

    env = make("prices", min_items=2, max_items=3)
    return asyncio.run(run_episode(env, ScriptedPolicy(rule), task, RolloutConfig(max_turns=3), seed=0))


def test_scripted_expert_solves_held_out_tasks_and_a_malformed_call_scores_the_floor() -> None:
    tasks = make_prices_tasks(6, 1, split="test", min_items=2, max_items=3)
    for task in tasks:
        traj = _run(PricesEnv.scripted_rule, task)
        assert traj.error is None and traj.reward == 1.0, traj.messages
        assert traj.metrics["tool_calls"] == len(task.info["items"])

    def malformed(messages: list[Message], tools: Any) -> str:
        if not any(m.role == "tool" for m in messages):
            return PricesEnv.scripted_rule(messages, tools) + '\n<tool_call>{"name": "lookup_price", "arg'
        return PricesEnv.scripted_rule(messages, tools)

    traj = _run(malformed, tasks[0])
    assert traj.metrics["invalid_tool_calls"] >= 1 and traj.reward <= 0.0


def test_novel_items_are_a_held_out_set_no_training_task_or_error_names() -> None:
    import asyncio

    from taskrl.envs.builtin import NOVEL_PRICES, lookup

    tasks = make_prices_tasks(8 * 64, 1, split="test", min_items=3, max_items=3, novel=True)
    assert all(set(t.info["items"]) <= set(NOVEL_PRICES) for t in tasks)
    assert len({t.prompt for t in tasks}) >= 64  # enough distinct prompts for the standard's 64 held-out tasks
    shapes = [("train", 1), *((split, n) for split in ("train", "val", "test") for n in (2, 3))]
    seen = {item for split, n in shapes
            for t in make_prices_tasks(200, 0, split=split, min_items=n, max_items=n) for item in t.info["items"]}
    assert seen == set(PRICES) and not seen & set(NOVEL_PRICES)  # the default envs never ask for a novel item
    with pytest.raises(ValueError, match="novel items are for held-out evaluation only"):
        make_prices_tasks(4, 0, split="train", novel=True)
    assert lookup("kiwi") == f"kiwi: ${NOVEL_PRICES['kiwi']}"
    with pytest.raises(KeyError) as unknown:
        lookup("durian")
    assert not any(item in str(unknown.value) for item in NOVEL_PRICES)  # training observations never name them
    env = make("prices", min_items=3, max_items=3, novel=True)  # the expert solves them as it solves seen items
    traj = asyncio.run(run_episode(env, ScriptedPolicy(PricesEnv.scripted_rule), tasks[0], RolloutConfig(max_turns=3),
                                   seed=0))  # fmt: skip
    assert traj.error is None and traj.reward == 1.0, traj.messages
