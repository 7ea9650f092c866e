"""``prices``: list the unit prices of one to a few items, each looked up with the tool (the learning recipe's env).

A task asks "List the prices of: pear, tea." and is solved by one ``lookup_price`` call per item (in one turn or
several) and a final answer such as "pear: 4, tea: 6". The reward is dense and copy-only (no arithmetic): each
item earns 1/n when its price was looked up **and** the final answer reports it, so a guessed price earns
nothing, and an episode with a malformed call is capped at the failure floor by the rollout loop. Reward 1
(every item right) is success. Demonstrations of single-item tasks show the format without the multi-item skill
(one lookup per item); the held-out splits draw only item combinations that no training task uses.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from itertools import combinations
from typing import Any

from taskrl.chat import format_tool_call
from taskrl.env import ToolEnv
from taskrl.envs.builtin import HELD_OUT_SPLITS, PRICES, PriceLookup, split_seed
from taskrl.types import Message, Task, Trajectory

ITEMS = tuple(sorted(PRICES))
_LOOKUP_RE = re.compile(r"^([a-z]+): \$(\d+)$")  # a successful lookup_price reply
PROMPT = "List the prices of: {}."


def held_out_combination(items: Sequence[str]) -> bool:
    """Whether a combination of two or more distinct items belongs to the held-out splits (about a quarter of
    them; order does not matter). Single items are always training items: a lone item is no new combination."""
    if len(items) < 2:
        return False
    return sum((ITEMS.index(item) + 1) ** 2 for item in items) % 4 == 0


def make_prices_tasks(n: int, seed: int, *, split: str = "train", min_items: int = 1, max_items: int = 3) -> list[Task]:
    """``n`` tasks of ``min_items``..``max_items`` distinct items whose combination belongs to ``split``."""
    if not 1 <= min_items <= max_items <= len(ITEMS):
        raise ValueError(f"need 1 <= min_items <= max_items <= {len(ITEMS)}, got {min_items}..{max_items}")
    held_out = split in HELD_OUT_SPLITS
    pool = [
        combo
        for size in range(min_items, max_items + 1)
        for combo in combinations(ITEMS, size)
        if held_out_combination(combo) == held_out
    ]
    if not pool:
        raise ValueError(f"split '{split}' has no combination of {min_items}..{max_items} items (single items are "
                         "training-only; held-out splits need min_items >= 2 or max_items >= 2)")  # fmt: skip
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        items = list(rng.choice(pool))
        rng.shuffle(items)  # the order asked is random; the combination decides the split
        # No ``answer``: the gold listing alone earns nothing (its prices were not looked up), so it lives in info.
        listing = ", ".join(f"{item}: {PRICES[item]}" for item in items)
        tasks.append(Task(id=f"prices-{seed}-{i}", prompt=PROMPT.format(", ".join(items)),
                          info={"items": items, "listing": listing}))  # fmt: skip
    return tasks


def reported_prices(text: str | None) -> dict[str, int]:
    """The "item: price" pairs of a final answer ("pear: 4", "pear: $4", "pear $4" all count; last one wins)."""
    found = re.findall(r"\b([a-z]+)s?\s*[:=-]?\s*\$?\s*(\d+)\b", (text or "").lower())
    return {item: int(price) for item, price in found}


class PricesEnv(PriceLookup, ToolEnv):
    """List looked-up unit prices; per-item credit, success when every item is right."""

    name = "prices"
    system_prompt = "Look up prices with the tool. Then answer with item: price for each item asked."

    def __init__(self, num_tasks: int = 64, min_items: int = 1, max_items: int = 3) -> None:
        super().__init__()
        make_prices_tasks(1, 0, min_items=min_items, max_items=max_items)  # bad bounds fail here, naming them
        self.num_tasks = num_tasks
        self.min_items = min_items
        self.max_items = max_items

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return make_prices_tasks(self.num_tasks, seed=split_seed(split), split=split, min_items=self.min_items,
                                 max_items=self.max_items)  # fmt: skip

    @staticmethod
    def scripted_rule(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        """An expert: look every item up in one turn, then list the prices the tool returned."""
        prompt = next(m.content for m in messages if m.role == "user")
        items = [item.strip() for item in prompt.split(":", 1)[1].rstrip(".").split(",")]
        replies = [m.content for m in messages if m.role == "tool"]
        if not replies:
            return "\n".join(format_tool_call("lookup_price", {"item": item}) for item in items)
        looked = dict(match.groups() for reply in replies if (match := _LOOKUP_RE.match(reply)))
        return ", ".join(f"{item}: {looked.get(item, '?')}" for item in items)

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        assert self.task is not None, "reward() before reset()"
        items = self.task.info["items"]
        looked = {
            match.group(1): int(match.group(2))
            for m in trajectory.messages
            if m.role == "tool" and (match := _LOOKUP_RE.match(m.content))
        }
        reported = reported_prices(trajectory.final_answer)
        right = sum(item in looked and reported.get(item) == PRICES[item] for item in items)
        return {"items_right": right / len(items)}
