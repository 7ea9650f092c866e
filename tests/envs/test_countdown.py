"""``countdown`` (issue 40): the exact checker (ast, never eval; each number at most once), chance rates by
enumeration with golden values, disjoint held-out number sets, and the registered env."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskrl.env import check_env, make
from taskrl.envs.countdown import (
    CountdownEnv,
    ExpressionError,
    chance_rate,
    check_expression,
    make_countdown_tasks,
    number_split,
    parse_answer,
    solutions,
)  # fmt: skip
from taskrl.types import Message, Trajectory


def test_checker_accepts_exact_answers_only() -> None:
    assert check_expression("(3 + 7) * 12", [3, 7, 12], 120)
    assert check_expression("12 / (7 - 3) * 1", [3, 7, 12, 1], 3)
    assert check_expression("7 / 3 * 3", [3, 7, 3], 7)  # exact fractions: no float rounding
    assert not check_expression("3 + 7", [3, 7, 12], 11)
    assert check_expression("12", [3, 7, 12], 12)  # a number may be left unused


@pytest.mark.parametrize(("expression", "why"), [
    ("3 + 3", "used more than once"), ("5 + 7", "not one of the numbers"), ("2 ** 3", "only non-negative"),
    ("-3 + 7", "only non-negative"), ("__import__('os').system('true')", "only non-negative"),
    ("3.0 + 7", "only non-negative"), ("12 / (7 - 7)", "division by zero"), ("3 +", "not an arithmetic"),
    ("", "empty"), ("1" * 200, "longer than"), ("True + 7", "only non-negative"),
])  # fmt: skip
def test_checker_refuses_what_is_not_a_countdown_expression(expression: str, why: str) -> None:
    with pytest.raises(ExpressionError, match=why):
        check_expression(expression, [3, 7, 12], 10)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_checker_never_raises_anything_but_expression_error(text: str) -> None:
    with contextlib.suppress(ExpressionError):
        check_expression(text, [1, 2, 3], 6)


def test_chance_rate_golden_values_by_enumeration() -> None:
    # 3 single numbers + 6 ordered pairs x 4 operators + 6 orders x 16 operator pairs x 2 bracketings = 219
    assert sorted(solutions([3, 7, 12], 33)) == ["(3 * 7) + 12", "(7 * 3) + 12", "12 + (3 * 7)", "12 + (7 * 3)"]
    assert chance_rate([3, 7, 12], 33) == pytest.approx(4 / 219)
    assert chance_rate([1, 2, 3], 1000) == 0.0
    assert all(check_expression(s, [3, 7, 12], 33) for s in solutions([3, 7, 12], 33))


def test_held_out_number_sets_are_disjoint_and_every_task_is_solvable() -> None:
    train, test = make_countdown_tasks(400), make_countdown_tasks(100, "test")
    sets = [{tuple(sorted(t.info["numbers"])) for t in tasks} for tasks in (train, test)]
    assert not sets[0] & sets[1] and all(number_split(t.info["numbers"]) == "test" for t in test)
    assert len({t.prompt for t in test}) == 100
    for t in test[:20]:
        assert solutions(t.info["numbers"], t.info["target"]) and 0 < t.info["chance_rate"] < 1
        assert check_expression(parse_answer(t.answer) or "", t.info["numbers"], t.info["target"])


def test_the_registered_env_rewards_exact_tagged_answers() -> None:
    env = make("countdown", num_tasks=8)
    check_env(env)
    assert isinstance(env, CountdownEnv)
    task = env.tasks("test")[0]
    env.reset(task)
    for answer, expected in ((task.answer, 1.0), ("<answer>1 + 1 + 1 + 1</answer>", 0.0), ("no tags", 0.0)):
        traj = Trajectory(task_id=task.id, messages=[Message("assistant", str(answer))])
        traj.info["final_answer"] = answer
        assert env.reward(traj) == {"solved": expected}
    assert parse_answer("x <answer>1</answer> y <answer>2 + 3</answer>") == "2 + 3"


def test_format_credit_pays_a_valid_wrong_expression_only() -> None:
    env = make("countdown", num_tasks=8, format_credit=0.1)
    task = env.tasks("test")[0]
    env.reset(task)
    a, b, c = task.info["numbers"]
    wrong = next(e for e in (f"{a} + {b} + {c}", f"{a} * {b} * {c}", f"{a} + {b}") if not check_expression(
        e, task.info["numbers"], task.info["target"]))  # fmt: skip
    cases = ((task.answer, {"solved": 1.0, "format": 0.0}),
             (f"<answer>{wrong}</answer>", {"solved": 0.0, "format": 0.1}),
             ("<answer>999 + 1</answer>", {"solved": 0.0, "format": 0.0}),  # numbers not given: no credit
             (f"{wrong}", {"solved": 0.0, "format": 0.0}))  # untagged: no credit  # fmt: skip
    for answer, expected in cases:
        traj = Trajectory(task_id=task.id, messages=[Message("assistant", str(answer))])
        traj.info["final_answer"] = answer
        assert env.reward(traj) == expected, answer
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="format_credit must be in"):
            CountdownEnv(format_credit=bad)


def test_two_number_tasks_are_held_out_solvable_and_checked_like_three() -> None:
    env = make("countdown", num_numbers=2, format_credit=0.1)
    assert isinstance(env, CountdownEnv) and len(env.tasks("train")) == 300
    train, test = env.tasks("train"), env.tasks("test")
    assert {len(t.info["numbers"]) for t in [*train, *test]} == {2}
    sets = [{tuple(sorted(t.info["numbers"])) for t in tasks} for tasks in (train, test)]
    assert not sets[0] & sets[1]
    a, b = test[0].info["numbers"]
    target = test[0].info["target"]
    assert solutions([a, b], target) and all(check_expression(s, [a, b], target) for s in solutions([a, b], target))
    assert chance_rate([3, 4], 7) == pytest.approx(2 / 10)  # 3, 4 and 8 ordered pair expressions: 3+4, 4+3
    env.reset(test[0])
    traj = Trajectory(task_id=test[0].id, messages=[Message("assistant", str(test[0].answer))])
    traj.info["final_answer"] = test[0].answer
    assert env.reward(traj) == {"solved": 1.0, "format": 0.0}
    assert make_countdown_tasks(5) == make_countdown_tasks(5, num_numbers=3)  # three numbers: the first draws kept


def test_countdown_bounds_that_cannot_fill_a_split_fail_at_start() -> None:
    with pytest.raises(ValueError, match="could not draw 1000 distinct train"):
        CountdownEnv(num_numbers=2, num_tasks=1000)
    with pytest.raises(ValueError, match="num_numbers 2 or 3"):
        CountdownEnv(num_numbers=4)
