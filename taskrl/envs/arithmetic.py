"""``arithmetic``: one operation on two small numbers, answered with the number (a task with no demonstrations).

A task asks ``What is a op b?`` for ``a, b`` in 1..``max_number`` and ``op`` one of + - *; the reward is 1 when
the last integer of the reply is the exact result, else 0 (the usual final-number rule of GSM8K-style checkers:
the reply may show its working, only its last number counts, so listing candidates cannot earn more than one).

Like ``countdown``, there is no expert (no ``scripted_rule``): only the verifier teaches, so it is issue 40's
no-demonstration task at a size SmolLM2-135M can start on (its T=1 samples solve a few percent, where Countdown's
solve none). Held-out splits draw (unordered pair, operator) items no training task uses: ``3 + 5`` and ``5 + 3``
fall in the same split, so a held-out task is never a training task with its numbers swapped. ``chance_rate`` is
Countdown's: the share of the expressions over the two numbers (each at most once, + - * /, both orders, and each
number alone) that equal the result, the success rate of a guesser that knows the answer is some operation on the
two numbers but not which.
"""

from __future__ import annotations

import copy
import functools
import itertools
import re
from collections.abc import Sequence
from typing import Any

from taskrl.env import ToolEnv
from taskrl.envs.builtin import split_seed
from taskrl.envs.countdown import chance_rate
from taskrl.seeding import derive_seed
from taskrl.types import Task, Trajectory

OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
PROMPT = "What is {a} {op} {b}?"
_INTEGER = re.compile(r"(?<!\d)(?<!\d\.)-?\d+(?!\d|\.\d)")
MAX_REPLY_CHARS = 4000
"""Only a reply's last this many characters are read (where its last number is; bounds the regex's work)."""


def item_split(a: int, b: int, op: str) -> str:
    """The split an item belongs to, by its unordered pair and operator: ~1/8 ``test``, ~1/8 ``val``, the rest
    ``train``."""
    bucket = derive_seed("arithmetic", op, *sorted((a, b))) % 8
    return "test" if bucket == 0 else "val" if bucket == 1 else "train"


def last_integer(text: str | None) -> int | None:
    """The reply's last integer (a sign counts, digits inside a decimal such as ``2.5`` do not); None without one."""
    found = _INTEGER.findall((text or "")[-MAX_REPLY_CHARS:])
    return int(found[-1]) if found else None


def make_arithmetic_tasks(n: int | None, split: str = "train", *, max_number: int = 20) -> list[Task]:
    """``n`` tasks (None: all) of ``split``'s items, in a fixed shuffled order (the same for every caller)."""
    return copy.deepcopy(_make_tasks(n, split, max_number))


@functools.lru_cache(maxsize=8)
def _make_tasks(n: int | None, split: str, max_number: int) -> list[Task]:
    if max_number < 2 or (n is not None and n < 1):
        raise ValueError(f"need max_number >= 2 and n >= 1, got max_number={max_number}, n={n}")
    owner = split if split in ("test", "val") else "train"
    items = [(a, op, b) for a, b in itertools.product(range(1, max_number + 1), repeat=2) for op in OPERATIONS
             if item_split(a, b, op) == owner]  # fmt: skip
    items.sort(key=lambda item: derive_seed("arithmetic-order", split_seed(owner), *item[::2], item[1]))
    if n is not None and n > len(items):
        raise ValueError(
            f"only {len(items)} distinct {owner} arithmetic items with max_number={max_number}, asked for {n}: "
            "raise max_number"
        )
    return [
        Task(id=f"arithmetic-{owner}-{i}", prompt=PROMPT.format(a=a, op=op, b=b), answer=str(OPERATIONS[op](a, b)),
             info={"a": a, "b": b, "op": op, "result": OPERATIONS[op](a, b),
                   "chance_rate": chance_rate([a, b], OPERATIONS[op](a, b))})  # fmt: skip
        for i, (a, op, b) in enumerate(items[:n])
    ]


class ArithmeticEnv(ToolEnv):
    """``What is a op b?``; reward 1 when the reply's last integer is the result."""

    name = "arithmetic"
    system_prompt = "You are a careful calculator. Reply with only the final number."

    def __init__(self, num_tasks: int | None = None, num_held_out: int = 100, max_number: int = 20) -> None:
        """``num_tasks`` training items (None: all of them); every split is drawn here, so bounds that cannot give
        that many items fail at start, not mid-run."""
        super().__init__()
        for n, split in ((num_tasks, "train"), (num_held_out, "val"), (num_held_out, "test")):
            _make_tasks(n, split, max_number)
        self.num_tasks, self.num_held_out, self.max_number = num_tasks, num_held_out, max_number

    def tasks(self, split: str = "train") -> Sequence[Task]:
        n = self.num_held_out if split in ("test", "val") else self.num_tasks
        return make_arithmetic_tasks(n, split, max_number=self.max_number)

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        assert self.task is not None, "reward() before reset()"
        info: dict[str, Any] = self.task.info
        return {"correct": float(last_integer(trajectory.final_answer) == info["result"])}
