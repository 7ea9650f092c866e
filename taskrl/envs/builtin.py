"""Small built-in envs: ``shop`` (a two-tool task with a verifiable answer), ``price`` and ``noop``.

``shop`` asks for the total price of an order; the model must look prices up and may use a calculator.
The reward is 1 when the last number of the final answer equals the total. ``price`` is the smallest
tool-use task (one lookup, then "quantity x price = total"; the ``make demo`` training env). ``noop``
exists to measure the agent loop itself: its only tool does nothing.
"""

from __future__ import annotations

import ast
import operator
import random
import re
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

_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")
_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.USub: operator.neg, ast.UAdd: operator.pos,
}  # fmt: skip


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
    return ev(ast.parse(expression, mode="eval"))


def lookup(item: str) -> str:
    """The shared price lookup of the shop and price envs; unknown items raise (an error the model sees)."""
    key = item.strip().lower().removesuffix("s")
    if key not in PRICES:
        raise KeyError(f"no item '{item}'; known items: {', '.join(sorted(PRICES))}")
    return f"{key}: ${PRICES[key]}"


def last_number(text: str | None) -> float | None:
    found = _NUMBER_RE.findall((text or "").replace(",", ""))
    return float(found[-1]) if found else None


def make_shop_tasks(n: int, seed: int) -> list[Task]:
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        items = rng.sample(sorted(PRICES), rng.randint(1, 3))
        qty = {item: rng.randint(1, 5) for item in items}
        order = ", ".join(f"{q} x {item}" for item, q in qty.items())
        total = sum(PRICES[item] * q for item, q in qty.items())
        prompt = f"An order has {order}. How much does it cost in total?"
        tasks.append(Task(id=f"shop-{seed}-{i}", prompt=prompt, answer=total, info={"order": qty}))
    return tasks


class ShopEnv(ToolEnv):
    """Order totals from looked-up prices; reward 1 for the right total."""

    name = "shop"
    system_prompt = (
        "You are a shop assistant. Use the tools to look up prices and to calculate. "
        "When you know the total, reply with the number only, without a tool call."
    )

    def __init__(self, num_tasks: int = 64) -> None:
        super().__init__()
        self.num_tasks = num_tasks

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return make_shop_tasks(self.num_tasks, seed={"train": 0, "test": 1}.get(split, 2))

    @tool
    def lookup_price(self, item: str) -> str:
        """Look up the unit price of an item, in dollars.

        Args:
            item: the item's name, singular, e.g. "apple".
        """
        return lookup(item)

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
        return {"correct": float(answer is not None and answer == float(self.task.answer))}


def make_price_tasks(n: int, seed: int) -> list[Task]:
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        item, qty = rng.choice(sorted(PRICES)), rng.randint(1, 3)
        prompt = f"What is the price of {qty} x {item}?"
        info = {"item": item, "quantity": qty}
        tasks.append(Task(id=f"price-{seed}-{i}", prompt=prompt, answer=qty * PRICES[item], info=info))
    return tasks


class PriceEnv(ToolEnv):
    """Look up one unit price and answer quantity x price; reward 1 for the right total."""

    name = "price"
    system_prompt = "Look up the unit price with the tool, then reply with quantity x unit price = total."

    def __init__(self, num_tasks: int = 64) -> None:
        super().__init__()
        self.num_tasks = num_tasks

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return make_price_tasks(self.num_tasks, seed={"train": 0, "test": 1}.get(split, 2))

    @tool
    def lookup_price(self, item: str) -> str:
        """Look up the unit price of an item, in dollars.

        Args:
            item: the item's name, singular, e.g. "apple".
        """
        return lookup(item)

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
