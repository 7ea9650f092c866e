"""The production loop's user task (issue 22): read one item's price off a short price list, reply with the number.

Every task shows ``ITEMS_SHOWN`` items with random prices (so no price can be memorised: the skill is reading
the list) and asks for one of them. The hidden check is the reply's last number against the asked price.
``make_tasks(n, split)`` draws a split; train and held-out splits (val: the gate, test: the report) never share a
prompt. ``evaluate(policy, tasks)`` plays each task greedily through the policy's own chat rendering (the one
the server uses) and returns 1/0 per task; ``suite(tasks)`` wraps it as a ``ProductionCycle`` eval suite.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from taskrl.envs.builtin import PRICES, last_number

SYSTEM_PROMPT = "You are a shop assistant. Reply with the price in dollars, as a number only."
ITEMS = tuple(sorted(PRICES))
ITEMS_SHOWN = 4
MAX_PRICE = 19
SPLIT_SEEDS = {"train": 11, "val": 12, "test": 13}


@dataclass(frozen=True)
class ListingTask:
    """One user request and its hidden answer."""

    id: str
    prompt: str
    answer: int

    def messages(self) -> list[dict[str, str]]:
        """The request as OpenAI chat messages (what a user sends)."""
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": self.prompt}]


def held_out_prompt(prompt: str) -> bool:
    """A quarter of all possible prompts (by hash) belong to the held-out splits, the rest to train."""
    return hashlib.blake2b(prompt.encode(), digest_size=4).digest()[0] % 4 == 0


def make_tasks(n: int, split: str = "train") -> list[ListingTask]:
    """``n`` distinct tasks of ``split`` (train, val or test); val and test never share a prompt either."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"split must be one of {', '.join(SPLIT_SEEDS)}, got {split!r}")
    rng = random.Random(SPLIT_SEEDS[split])
    tasks: list[ListingTask] = []
    seen: set[str] = set()
    other = make_tasks(n, "val") if split == "test" else []
    taken = {t.prompt for t in other}
    while len(tasks) < n:
        shown = rng.sample(ITEMS, ITEMS_SHOWN)
        prices = {item: rng.randint(1, MAX_PRICE) for item in shown}
        asked = rng.choice(shown)
        listing = ", ".join(f"{item} ${prices[item]}" for item in shown)
        prompt = f"Price list: {listing}.\nWhat does one {asked} cost?"
        if prompt in seen or prompt in taken or held_out_prompt(prompt) != (split != "train"):
            continue
        seen.add(prompt)
        tasks.append(ListingTask(f"{split}-{len(tasks)}", prompt, prices[asked]))
    return tasks


def correct(reply: str | None, task: ListingTask) -> bool:
    """The hidden check: the reply's last number is the asked price."""
    return last_number(reply) == float(task.answer)


def answer_number(row: Any) -> str | None:
    """Trust key of a stored reply (``feedback_trust``): the number it ends with, so equal answers compare."""
    message = row.response.get("message") if isinstance(row.response, dict) else None
    value = last_number(message.get("content") if isinstance(message, dict) else None)
    return None if value is None else f"{value:g}"


async def evaluate(policy: Any, tasks: list[ListingTask], max_new_tokens: int) -> list[float]:
    """Greedy success (1/0) of ``policy`` on each task, rendered by the policy's chat format as the server does."""
    from taskrl.policies.base import SamplingParams
    from taskrl.types import Message

    async def one(task: ListingTask) -> float:
        messages = [Message(m["role"], m["content"]) for m in task.messages()]
        completion = await policy.generate(
            messages=messages, sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
        )
        return float(correct(completion.text, task))

    return list(await asyncio.gather(*(one(t) for t in tasks)))


def suite(tasks: list[ListingTask], max_new_tokens: int) -> Callable[[Any], Awaitable[dict[str, list[Any]]]]:
    """A ``ProductionCycle`` eval suite: per-task greedy success on ``tasks`` and their ids (gated paired by task)."""

    async def run(policy: Any) -> dict[str, list[Any]]:
        return {"success": await evaluate(policy, tasks, max_new_tokens), "task_ids": [t.id for t in tasks]}

    return run
