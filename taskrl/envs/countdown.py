"""``countdown``: reach a target from three numbers with + - * / (issue 40's task with no demonstrations).

A task gives three numbers (or two, ``num_numbers=2``: the easiest form, one a 135M model can start on) and a
target that some expression over them reaches; the model answers with an
expression in ``<answer>...</answer>`` tags. ``check_expression`` is exact: it parses with ``ast`` (never
``eval``), allows only integer literals, + - * / and parentheses, uses each given number at most once, and
computes with fractions (no float rounding, division by zero fails). Reward 1 for a correct expression, else 0;
``format_credit`` (0 = off; TinyZero's Countdown recipe uses 0.1) adds that much for a wrong answer that is still
a valid expression over the given numbers, so a policy that never solves a task still gets a gradient toward
answering in the checked form (success stays reward 1: the credit is below it and only for wrong answers).

There is no expert (no ``scripted_rule``): only the verifier teaches. ``chance_rate(numbers, target)`` is the
share of all expressions over the numbers (each at most once, every order, operator and bracketing) that hit the
target: the success rate of a uniform random guesser, computed by enumeration. Held-out splits draw number
sets (as multisets) that no training task uses (a stable hash of the sorted numbers picks the split).
"""

from __future__ import annotations

import ast
import copy
import functools
import itertools
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import Any

from taskrl.env import ToolEnv
from taskrl.envs.builtin import _PARSE_LOCK, split_seed
from taskrl.seeding import derive_seed
from taskrl.types import Task, Trajectory

OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
MAX_EXPRESSION_CHARS = 120
PROMPT = ("Using the numbers {numbers}, make {target}. You may use + - * / and parentheses, and each number at "
          "most once. Answer with the expression in <answer></answer> tags, e.g. <answer>(1 + 2) * 3</answer>.")


def _divide(a: int | Fraction, b: int | Fraction) -> int | Fraction | None:
    """Exact division; an int when it divides evenly (ints keep the enumeration fast), None for b == 0."""
    if b == 0:
        return None
    if isinstance(a, int) and isinstance(b, int):
        return a // b if a % b == 0 else Fraction(a, b)
    return Fraction(a) / b


_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": _divide}  # fmt: skip


class ExpressionError(ValueError):
    """An answer that is not a valid countdown expression; the message says why."""


def _value(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = _value(node.left, used), _value(node.right, used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ExpressionError("division by zero")
        return _APPLY[OPERATORS[type(node.op)]](left, right)
    raise ExpressionError(f"only non-negative integers, + - * / and parentheses are allowed, got {ast.dump(node)[:60]}")


def check_expression(expression: str, numbers: Sequence[int], target: int) -> bool:
    """Whether ``expression`` uses each of ``numbers`` at most once and equals ``target`` exactly; raises
    ``ExpressionError`` for anything that is not such an expression (syntax, other operators, names, calls,
    unary minus, floats, numbers not given or used too often)."""
    if not isinstance(expression, str) or not expression.strip():
        raise ExpressionError("empty expression")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        with _PARSE_LOCK:  # ast.parse from several tool threads at once can fail on CPython 3.11
            tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ExpressionError(f"not an arithmetic expression: {e}") from None
    used: list[int] = []
    value = _value(tree.body, used)
    available = list(numbers)
    for n in used:
        if n not in available:
            raise ExpressionError(f"{n} is not one of the numbers {list(numbers)} (or is used more than once)")
        available.remove(n)
    return value == target


def _expressions(numbers: Sequence[int]) -> Iterator[tuple[str, int | Fraction | None]]:
    """Every expression over the numbers, each at most once: one number, every ordered pair with every operator,
    every ordered triple with every two operators in both bracketings; (text, value or None on division by zero)."""
    values = [int(n) for n in numbers]
    for i in range(len(values)):
        yield str(numbers[i]), values[i]
    for i, j in itertools.permutations(range(len(values)), 2):
        for op in _APPLY:
            yield f"{numbers[i]} {op} {numbers[j]}", _APPLY[op](values[i], values[j])
    for i, j, k in itertools.permutations(range(len(values)), 3):
        a, b, c = values[i], values[j], values[k]
        for op1, op2 in itertools.product(_APPLY, repeat=2):
            inner = _APPLY[op1](a, b)
            yield f"({numbers[i]} {op1} {numbers[j]}) {op2} {numbers[k]}", None if inner is None else _APPLY[op2](
                inner, c)  # fmt: skip
            inner = _APPLY[op2](b, c)
            yield f"{numbers[i]} {op1} ({numbers[j]} {op2} {numbers[k]})", None if inner is None else _APPLY[op1](
                a, inner)  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _outcomes(numbers: tuple[int, ...]) -> tuple[Counter[int | Fraction | None], frozenset[int]]:
    """How many expressions over ``numbers`` reach each value, and the integers reachable using all of them."""
    counts: Counter[int | Fraction | None] = Counter()
    with_all: set[int] = set()
    for text, value in _expressions(numbers):
        counts[value] += 1
        if text.count(" ") == 2 * (len(numbers) - 1) and value is not None and value.denominator == 1:
            with_all.add(int(value))
    return counts, frozenset(with_all)


def chance_rate(numbers: Sequence[int], target: int) -> float:
    """The share of all expressions over ``numbers`` (``_expressions``) that equal ``target``."""
    counts, _ = _outcomes(tuple(sorted(numbers)))
    return counts[target] / sum(counts.values())


def solutions(numbers: Sequence[int], target: int, *, limit: int | None = None) -> list[str]:
    """Enumerated expressions that reach ``target`` (at most ``limit``; for tests, analysis and the gold answer:
    nothing trains on them)."""
    found = itertools.islice((text for text, value in _expressions(numbers) if value == target), limit)
    return list(found)


def number_split(numbers: Sequence[int]) -> str:
    """The split a number set (a multiset) belongs to: about 1/8 ``test``, 1/8 ``val``, the rest ``train``."""
    bucket = derive_seed("countdown", *sorted(numbers)) % 8
    return "test" if bucket == 0 else "val" if bucket == 1 else "train"


def make_countdown_tasks(n: int, split: str = "train", *, max_number: int = 30, max_target: int = 100,
                         num_numbers: int = 3) -> list[Task]:  # fmt: skip
    """``n`` tasks of ``num_numbers`` (2 or 3) numbers in 1..``max_number`` from ``split``'s number sets, each with
    a target in 1..``max_target`` that an expression using all of them reaches (so every task is solvable)."""
    return copy.deepcopy(_make_tasks(n, split, max_number, max_target, num_numbers))


@functools.lru_cache(maxsize=8)
def _make_tasks(n: int, split: str, max_number: int, max_target: int, num_numbers: int) -> list[Task]:
    if n < 1 or max_number < 2 or max_target < 1 or num_numbers not in (2, 3):
        raise ValueError(f"need n >= 1, max_number >= 2, max_target >= 1, num_numbers 2 or 3, got {n}, "
                         f"{max_number}, {max_target}, {num_numbers}")  # fmt: skip
    owner = split if split in ("test", "val") else "train"
    # three numbers keep the stream the first records were drawn from; two draw from their own
    rng = random.Random(split_seed(split) * 7919 + max_number * 101 + max_target + (num_numbers != 3) * 104729)
    seen: set[tuple[tuple[int, ...], int]] = set()
    tasks: list[Task] = []
    for _ in range(500 * n):
        numbers = [rng.randint(1, max_number) for _ in range(num_numbers)]
        if number_split(numbers) != owner:
            continue
        reachable = sorted(v for v in _outcomes(tuple(sorted(numbers)))[1] if 1 <= v <= max_target)
        if not reachable:
            continue
        target = rng.choice(reachable)
        key = (tuple(sorted(numbers)), target)
        if key in seen:
            continue
        seen.add(key)
        tasks.append(Task(id=f"countdown-{owner}-{len(tasks)}", prompt=PROMPT.format(numbers=numbers, target=target),
                          answer=f"<answer>{solutions(numbers, target, limit=1)[0]}</answer>",
                          info={"numbers": numbers, "target": target,
                                                    "chance_rate": chance_rate(numbers, target)}))  # fmt: skip
        if len(tasks) == n:
            return tasks
    raise ValueError(f"could not draw {n} distinct {owner} countdown tasks: raise max_number or max_target")


def parse_answer(text: str | None) -> str | None:
    """The last ``<answer>...</answer>`` block's content; None without one."""
    text = text or ""
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end if end >= 0 else None)
    return text[start + len("<answer>") : end] if start >= 0 and end > start else None


class CountdownEnv(ToolEnv):
    """Reach the target from ``num_numbers`` (3, or 2) numbers; reward 1 for an exact, valid expression."""

    name = "countdown"
    system_prompt = "You solve arithmetic puzzles. Think briefly, then give the expression in <answer></answer> tags."

    def __init__(self, num_tasks: int | None = None, num_held_out: int = 128, max_number: int = 30,
                 max_target: int = 100, format_credit: float = 0.0, num_numbers: int = 3) -> None:  # fmt: skip
        """``num_tasks`` training tasks (default 1000 of three numbers, 300 of two: at the default bounds two
        numbers have about 1,200 distinct training tasks and 200 per held-out split); every split is drawn here,
        so bounds that cannot give that many tasks fail at start, not mid-run."""
        super().__init__()
        num_tasks = (1000 if num_numbers == 3 else 300) if num_tasks is None else num_tasks
        for n, split in ((num_tasks, "train"), (num_held_out, "val"), (num_held_out, "test")):
            _make_tasks(n, split, max_number, max_target, num_numbers)  # cached: tasks() reuses the draw
        if not 0.0 <= format_credit < 1.0:
            raise ValueError(f"format_credit must be in [0, 1) (below a solve's reward 1), got {format_credit!r}")
        self.num_tasks, self.num_held_out = num_tasks, num_held_out
        self.max_number, self.max_target = max_number, max_target
        self.format_credit, self.num_numbers = float(format_credit), num_numbers

    def tasks(self, split: str = "train") -> Sequence[Task]:
        n = self.num_held_out if split in ("test", "val") else self.num_tasks
        return make_countdown_tasks(n, split, max_number=self.max_number, max_target=self.max_target,
                                    num_numbers=self.num_numbers)  # fmt: skip

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        assert self.task is not None, "reward() before reset()"
        expression = parse_answer(trajectory.final_answer)
        info: dict[str, Any] = self.task.info
        try:
            solved = expression is not None and check_expression(expression, info["numbers"], info["target"])
            valid = expression is not None
        except ExpressionError:
            solved = valid = False
        if not self.format_credit:
            return {"solved": float(solved)}
        return {"solved": float(solved), "format": self.format_credit if valid and not solved else 0.0}
