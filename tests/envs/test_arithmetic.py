"""The arithmetic env: an exact final-number checker, held-out items disjoint from training (issue 40)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskrl.env import check_env, make
from taskrl.envs.arithmetic import ArithmeticEnv, item_split, last_integer, make_arithmetic_tasks
from taskrl.types import Message, Trajectory


def _reward(env: ArithmeticEnv, reply: str) -> float:
    traj = Trajectory(task_id=env.task.id, messages=[Message("assistant", reply)])  # type: ignore[union-attr]
    traj.info["final_answer"] = reply
    return env.reward(traj)["correct"]  # type: ignore[return-value]


def test_only_the_last_integer_of_the_reply_counts() -> None:
    env = make("arithmetic")
    check_env(env)
    assert isinstance(env, ArithmeticEnv)
    task = next(t for t in env.tasks("test") if t.info["op"] == "-" and t.info["result"] < 0)
    env.reset(task)
    result = task.info["result"]
    assert _reward(env, str(result)) == 1.0 and _reward(env, f"{task.prompt} It is {result}.") == 1.0
    assert _reward(env, f"{result} or {result + 1}") == 0.0  # listing candidates earns nothing
    assert _reward(env, str(-result)) == 0.0  # the sign counts
    assert _reward(env, f"{result}.5") == 0.0 and _reward(env, "") == 0.0 and _reward(env, "no number") == 0.0
    assert last_integer("3 + 4 = 7") == 7 and last_integer("-12") == -12 and last_integer("2.5") is None
    assert last_integer("1 " * 100_000 + "= 42") == 42  # a flood of text before the answer: its end is read


@given(st.text(max_size=200))
def test_the_checker_reads_any_text_without_raising(text: str) -> None:
    value = last_integer(text)
    assert value is None or str(value) in text


def test_held_out_items_are_disjoint_from_training_even_with_the_numbers_swapped() -> None:
    train, val, test = (make_arithmetic_tasks(None, split) for split in ("train", "val", "test"))
    assert len(val) >= 64 and len(test) >= 64 and len(train) > 6 * len(test)
    key = lambda t: (t.info["op"], *sorted((t.info["a"], t.info["b"])))  # noqa: E731
    assert not {key(t) for t in train} & {key(t) for t in test} and not {key(t) for t in val} & {key(t) for t in test}
    assert all(item_split(t.info["a"], t.info["b"], t.info["op"]) == "test" for t in test)
    assert make_arithmetic_tasks(5, "test") == test[:5]  # a fixed order: the first n are the same for every n
    for t in test:
        assert int(t.answer) == t.info["result"] == eval(f"{t.info['a']} {t.info['op']} {t.info['b']}")  # noqa: S307
        assert 0 < t.info["chance_rate"] < 1  # the result is one of the 10 expressions over the two numbers


def test_bounds_that_cannot_fill_a_split_fail_at_start() -> None:
    with pytest.raises(ValueError, match="distinct val arithmetic items"):
        ArithmeticEnv(num_held_out=10_000)
    with pytest.raises(ValueError, match="max_number >= 2"):
        ArithmeticEnv(max_number=1)
