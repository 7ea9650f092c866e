"""Small built-in envs: ``shop`` (a two-tool task with a verifiable answer), ``price`` and ``noop``.

``shop`` asks for the total price of an order; the model must look prices up and may use a calculator.
The reward is 1 when the last number of the final answer equals the total (``lookup_credit`` adds partial
credit below 1 for looking up the order's items). ``price`` is the smallest tool-use task (one lookup, then
"quantity x price = total"). The held-out splits (test, val) of both draw only (item, quantity) pairs that no
training task uses. ``noop`` exists to measure the agent loop itself: its only tool does nothing.
"""

from __future__ import annotations

import ast
import operator
import random
import re
import threading
from collections.abc import Sequence
from typing import Any

from taskrl.chat import format_tool_call
from taskrl.env import ToolEnv
from taskrl.tools import tool
from taskrl.types import Message, Task, Trajectory

PRICES = {
    "apple": 3, "pear": 4, "banana": 2, "melon": 7, "bread": 5, "cheese": 9,
    "milk": 2, "coffee": 12, "tea": 6, "rice": 8, "butter": 4, "honey": 11,
}  # fmt: skip
NOVEL_PRICES = {"kiwi": 5, "plum": 3, "yogurt": 6, "pasta": 7, "sugar": 2, "flour": 4, "jam": 8, "soap": 10}
"""Items no training task of any price env asks for (``PricesEnv(novel=True)`` draws only these): a generalisation
set. The lookup tool prices them too, so a policy can answer them; its error for an unknown item lists only
``PRICES``, so no training observation names a novel item."""
CATALOGUE = {**PRICES, **NOVEL_PRICES}
"""Every item the lookup tool prices."""

_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")
_LOOKUP_RE = re.compile(r"^[a-z]+: \$\d+$")  # a successful lookup_price reply
_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.USub: operator.neg, ast.UAdd: operator.pos,
}  # fmt: skip
_PARSE_LOCK = threading.Lock()
"""CPython 3.11 keeps ast.parse's recursion-depth check in interpreter state, so two tool threads parsing at
once can fail with "SystemError: AST constructor recursion depth mismatch" (seen in CI with parallel
calculator calls); one parse at a time avoids it and costs microseconds."""


def safe_eval(expression: str) -> float:
    """Evaluate + - * / and parentheses over numbers; anything else is refused."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("only numbers, + - * / and parentheses are allowed")

    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    with _PARSE_LOCK:
        tree = ast.parse(expression, mode="eval")
    return ev(tree)


def lookup(item: str) -> str:
    """The shared price lookup of the shop and price envs; unknown items raise (an error the model sees)."""
    key = item.strip().lower().removesuffix("s")
    price = CATALOGUE.get(key)
    if price is None:
        raise KeyError(f"no item '{item}'; known items: {', '.join(sorted(PRICES))}")
    return f"{key}: ${price}"


def last_number(text: str | None) -> float | None:
    found = _NUMBER_RE.findall((text or "").replace(",", ""))
    return float(found[-1]) if found else None


HELD_OUT_SPLITS = ("test", "val")
"""Splits drawn from the held-out (item, quantity) pairs; every other split draws from the training pairs."""


def held_out_pair(item: str, quantity: int) -> bool:
    """Whether an (item, quantity) pair belongs to the held-out splits: a quarter of the pairs (with quantities
    up to 4 or more every item is in both splits, with different quantities).

    Train and held-out tasks of ``shop`` and ``price`` never share an (item, quantity) combination, so a
    held-out success cannot be a memorised training answer.
    """
    return (sorted(PRICES).index(item) + quantity) % 4 == 0


def _quantities(split: str, max_quantity: int) -> dict[str, list[int]]:
    """Each item's allowed quantities (1..max_quantity) in ``split``; items with none are left out."""
    held_out = split in HELD_OUT_SPLITS
    allowed = {
        item: [q for q in range(1, max_quantity + 1) if held_out_pair(item, q) == held_out] for item in sorted(PRICES)
    }
    return {item: qs for item, qs in allowed.items() if qs}


def split_seed(split: str) -> int:
    """The task-generation seed of a split: train 0, test 1, any other split 2."""
    return {"train": 0, "test": 1}.get(split, 2)


def make_shop_tasks(
    n: int, seed: int, *, split: str = "train", min_items: int = 1, max_items: int = 3, max_quantity: int = 5
) -> list[Task]:
    """``n`` orders of ``min_items``..``max_items`` distinct items, from ``split``'s (item, quantity) pairs."""
    if not 1 <= min_items <= max_items <= len(PRICES) or max_quantity < 1:
        raise ValueError(f"need 1 <= min_items <= max_items <= {len(PRICES)} and max_quantity >= 1")
    allowed = _quantities(split, max_quantity)
    if len(allowed) < max_items:
        raise ValueError(f"split '{split}' has only {len(allowed)} items with quantities <= {max_quantity}")
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        items = rng.sample(sorted(allowed), rng.randint(min_items, max_items))
        qty = {item: rng.choice(allowed[item]) for item in items}
        order = ", ".join(f"{q} x {item}" for item, q in qty.items())
        total = sum(PRICES[item] * q for item, q in qty.items())
        prompt = f"An order has {order}. How much does it cost in total?"
        tasks.append(Task(id=f"shop-{seed}-{i}", prompt=prompt, answer=total, info={"order": qty}))
    return tasks


class PriceLookup:
    """The ``lookup_price`` tool of every price env (``shop``, ``price``, ``prices``): one definition, one schema."""

    @tool
    def lookup_price(self, item: str) -> str:
        """Look up the unit price of an item, in dollars.

        Args:
            item: the item's name, singular, e.g. "apple".
        """
        return lookup(item)


class ShopEnv(PriceLookup, ToolEnv):
    """Order totals from looked-up prices; reward 1 for the right total."""

    name = "shop"
    system_prompt = (
        "You are a shop assistant. Use the tools to look up prices and to calculate. "
        "When you know the total, reply with the number only, without a tool call."
    )

    def __init__(self, num_tasks: int = 64, min_items: int = 1, max_items: int = 3, lookup_credit: float = 0.0) -> None:
        """``min_items``/``max_items`` bound the distinct items per order; ``lookup_credit`` (0 = off) is the
        partial credit of a wrong answer: that weight times the F1 of the distinct items looked up against
        the order's items, so looking up every item in the shop earns less than looking up the right ones."""
        super().__init__()
        if not 0 <= lookup_credit < 1:
            raise ValueError(f"ShopEnv.lookup_credit must be in [0, 1) (below a correct answer), got {lookup_credit}")
        make_shop_tasks(1, 0, min_items=min_items, max_items=max_items)  # bad bounds fail here, naming them
        self.num_tasks = num_tasks
        self.min_items = min_items
        self.max_items = max_items
        self.lookup_credit = lookup_credit

    def tasks(self, split: str = "train") -> Sequence[Task]:
        bounds = {"min_items": self.min_items, "max_items": self.max_items}
        return make_shop_tasks(self.num_tasks, seed=split_seed(split), split=split, **bounds)

    @tool
    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression such as "3*4 + 2*7".

        Args:
            expression: numbers with + - * / and parentheses.
        """
        value = safe_eval(expression)
        return str(int(value) if float(value).is_integer() else value)

    @staticmethod
    def scripted_rule(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        """An expert that solves every task: look up each price, compute, answer (cold start, tests)."""
        order = re.findall(r"(\d+) x (\w+)", next(m.content for m in messages if m.role == "user"))
        asked = sum(len(m.tool_calls) for m in messages if m.role == "assistant")
        if asked == 0:
            return "\n".join(format_tool_call("lookup_price", {"item": item}) for _, item in order)
        if asked == len(order):
            prices = [last_number(m.content) for m in messages if m.role == "tool"]
            expression = " + ".join(f"{q}*{p:g}" for (q, _), p in zip(order, prices, strict=True))
            return format_tool_call("calculator", {"expression": expression})
        return f"The total is {messages[-1].content}."

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        assert self.task is not None, "reward() before reset()"
        answer = last_number(trajectory.final_answer)
        correct = float(answer is not None and answer == float(self.task.answer))
        if not self.lookup_credit:
            return {"correct": correct}
        return {
            "correct": correct,
            "lookup_credit": 0.0 if correct else self.lookup_credit * self._lookup_f1(trajectory),
        }

    def _lookup_f1(self, trajectory: Trajectory) -> float:
        """F1 of the distinct items whose price lookup succeeded (the tool's own replies) against the order's."""
        assert self.task is not None
        wanted = set(self.task.info["order"])
        looked = {
            m.content.split(":", 1)[0] for m in trajectory.messages if m.role == "tool" and _LOOKUP_RE.match(m.content)
        }
        hits = len(looked & wanted)
        return 0.0 if not hits else 2 * hits / (len(looked) + len(wanted))


def make_price_tasks(n: int, seed: int, *, split: str = "train", max_quantity: int = 3) -> list[Task]:
    """``n`` single lookups from ``split``'s (item, quantity) pairs (see ``held_out_pair``)."""
    allowed = _quantities(split, max_quantity)
    pairs = [(item, q) for item in sorted(allowed) for q in allowed[item]]
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        item, qty = rng.choice(pairs)
        prompt = f"What is the price of {qty} x {item}?"
        info = {"item": item, "quantity": qty}
        tasks.append(Task(id=f"price-{seed}-{i}", prompt=prompt, answer=qty * PRICES[item], info=info))
    return tasks


class PriceEnv(PriceLookup, ToolEnv):
    """Look up one unit price and answer quantity x price; reward 1 for the right total."""

    name = "price"
    system_prompt = "Look up the unit price with the tool, then reply with quantity x unit price = total."

    def __init__(self, num_tasks: int = 64) -> None:
        super().__init__()
        self.num_tasks = num_tasks

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return make_price_tasks(self.num_tasks, seed=split_seed(split), split=split)

    @staticmethod
    def scripted_rule(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        """An expert: look the price up, then answer with the multiplication written out."""
        qty, item = re.findall(r"(\d+) x (\w+)", next(m.content for m in messages if m.role == "user"))[0]
        prices = [last_number(m.content) for m in messages if m.role == "tool"]
        if not prices or prices[-1] is None:
            return format_tool_call("lookup_price", {"item": item})
        return f"{qty} x {prices[-1]:g} = {int(qty) * prices[-1]:g}"

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        assert self.task is not None, "reward() before reset()"
        answer = last_number(trajectory.final_answer)
        return {"correct": float(answer is not None and answer == float(self.task.answer))}


class NoopEnv(ToolEnv):
    """Call ``noop`` as often as the task says, then answer ``done``."""

    name = "noop"
    system_prompt = "Call the noop tool as many times as asked, then reply 'done'."

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return [Task(id=f"noop-{k}", prompt=f"Call noop {k} times.", answer="done") for k in (1, 4, 16)]

    @tool(max_output_chars=None, in_thread=False)
    def noop(self) -> str:
        """Do nothing and return "ok"."""
        return "ok"

    @staticmethod
    def scripted_rule(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        """Call noop as often as asked, then answer."""
        wanted = int(re.findall(r"\d+", next(m.content for m in messages if m.role == "user"))[0])
        done = sum(len(m.tool_calls) for m in messages if m.role == "assistant")
        return format_tool_call("noop", {}) if done < wanted else "done"

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        return {"done": float((trajectory.final_answer or "").strip().lower() == "done")}
