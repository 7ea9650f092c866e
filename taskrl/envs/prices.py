"""``prices``: list the unit prices of one to a few items, each looked up with the tool (the learning recipe's env).

A task asks "List the prices of: pear, tea." and is solved by one ``lookup_price`` call per item (in one turn or
several) and a final answer such as "pear: 4, tea: 6". The reward is dense and copy-only (no arithmetic): each
item earns 1/n when its price was looked up **and** the final answer reports it, so a guessed price earns
nothing, and an episode with a malformed call is capped at the failure floor by the rollout loop. Reward 1
(every item right) is success. Demonstrations of single-item tasks show the format without the multi-item skill
(one lookup per item). Every combination of two or more items belongs to one split (``combination_split``: a
stable hash, about 55% train, 15% val, 30% test, every item in each), so val and test share no combination with
training or with each other, and a split's tasks take each of its combinations once before any repeats (65
distinct three-item combinations in test, 40 in val). ``novel=True`` draws held-out tasks from ``NOVEL_PRICES``
only, items no training task asks for (the control ladder's generalisation set).

``one_call_per_turn=True`` executes only the first call of a turn (the others get an error reply), so a long
listing takes one turn per item and its early observations sit far back in the context: the setting that
context-compaction comparisons need. The expert then looks up one item per turn, answers a summary request (the
agent's own or the harness's, ``taskrl.context``) with the prices known so far, and after a compaction looks up
only the items the summary does not give.
"""

from __future__ import annotations

import functools
import random
import re
import zlib
from collections.abc import Sequence
from itertools import combinations
from typing import Any

from taskrl import context
from taskrl.chat import format_tool_call
from taskrl.env import StepOutput, ToolEnv
from taskrl.envs.builtin import CATALOGUE, HELD_OUT_SPLITS, NOVEL_PRICES, PRICES, PriceLookup, split_seed
from taskrl.types import Message, Task, ToolCall, ToolResult, Trajectory

ITEMS = tuple(sorted(PRICES))
NOVEL_ITEMS = tuple(sorted(NOVEL_PRICES))
_LOOKUP_RE = re.compile(r"^([a-z]+): \$(\d+)$")  # a successful lookup_price reply
PROMPT = "List the prices of: {}."


def combination_split(items: Sequence[str]) -> str:
    """The split a combination of items belongs to: ``train`` for a single item (a lone item is no new
    combination), else by a stable hash of the sorted items: 30% ``test``, 15% ``val``, the rest ``train``."""
    if len(items) < 2:
        return "train"
    bucket = zlib.crc32(",".join(sorted(items)).encode()) % 100
    return "test" if bucket < 30 else "val" if bucket < 45 else "train"


def held_out_combination(items: Sequence[str]) -> bool:
    """Whether a combination of items belongs to a held-out split (``val`` or ``test``; order does not matter)."""
    return combination_split(items) != "train"


def make_prices_tasks(n: int, seed: int, *, split: str = "train", min_items: int = 1, max_items: int = 3,
                      novel: bool = False) -> list[Task]:  # fmt: skip
    """``n`` tasks of ``min_items``..``max_items`` distinct items whose combination belongs to ``split`` (any
    split but val and test draws from train's). Combinations are drawn without replacement: each once, in a
    seeded order, before any repeats (a repeat asks the items in another order). ``novel``: only items of
    ``NOVEL_PRICES``, which no training task asks for (a generalisation set; a held-out split is required)."""
    names = NOVEL_ITEMS if novel else ITEMS
    if not 1 <= min_items <= max_items <= len(names):
        raise ValueError(f"need 1 <= min_items <= max_items <= {len(names)}, got {min_items}..{max_items}")
    if novel and split not in HELD_OUT_SPLITS:
        raise ValueError(f"novel items are for held-out evaluation only (val or test), not split '{split}'")
    wanted = split if split in HELD_OUT_SPLITS else "train"
    pool = [
        combo
        for size in range(min_items, max_items + 1)
        for combo in combinations(names, size)
        if combination_split(combo) == wanted
    ]
    if not pool:
        raise ValueError(f"split '{split}' has no combination of {min_items}..{max_items} items (single items are "
                         "training-only; held-out splits need min_items >= 2 or max_items >= 2)")  # fmt: skip
    rng = random.Random(seed)
    tasks = []
    order: list[tuple[str, ...]] = []
    for i in range(n):
        if not order:
            order = list(pool)
            rng.shuffle(order)
        items = list(order.pop())
        rng.shuffle(items)  # the order asked is random; the combination decides the split
        # No ``answer``: the gold listing alone earns nothing (its prices were not looked up), so it lives in info.
        listing = ", ".join(f"{item}: {CATALOGUE[item]}" for item in items)
        tasks.append(Task(id=f"prices-{seed}-{i}", prompt=PROMPT.format(", ".join(items)),
                          info={"items": items, "listing": listing}))  # fmt: skip
    return tasks


def reported_prices(text: str | None) -> dict[str, int]:
    """The "item: price" pairs of a final answer ("pear: 4", "pear: $4", "pear $4" all count; last one wins)."""
    found = re.findall(r"\b([a-z]+)s?\s*[:=-]?\s*\$?\s*(\d+)\b", (text or "").lower())
    return {item: int(price) for item, price in found}


def relookups(messages: Sequence[Message]) -> int:
    """Lookups of an item whose price an earlier lookup of the episode already returned (the cost of forgetting)."""
    seen: set[str] = set()
    count = 0
    results = {m.tool_call_id: m for m in messages if m.role == "tool"}
    for m in messages:
        for call in m.tool_calls:
            item = str(call.arguments.get("item", "")).strip().lower() if isinstance(call.arguments, dict) else ""
            count += item in seen
            reply = results.get(call.id)
            if reply is not None and _LOOKUP_RE.match(reply.content):
                seen.add(item)
    return count


ONE_CALL_ERROR = "Only one lookup per turn is allowed: make this call again in your next turn."


def expert_rule(messages: list[Message], tools: list[dict[str, Any]] | None, *,
                one_call_per_turn: bool = False) -> str:  # fmt: skip
    """An expert: look the items up (all in one turn, or one per turn), then list the prices the tool returned.
    A summary request gets the prices known so far; after a compaction they come from the summary."""
    if context.is_harness_request(messages):  # mode=prompted: the transcript is in the request
        return ", ".join(f"{i}: {p}" for i, p in _known(messages[-1].content).items())
    prompt = next(m.content for m in messages if m.role == "user")
    items = [item.strip() for item in prompt.split(":", 1)[1].rstrip(".").split(",")]
    looked = {i: int(p) for reply in messages if reply.role == "tool" and (match := _LOOKUP_RE.match(reply.content))
              for i, p in [match.groups()]}  # fmt: skip
    for m in messages[1:]:
        if m.role == "user" and m.content != prompt:  # a continuation carries the summary's prices
            looked = {**_known(m.content), **looked}
    if context.is_summary_request(messages):
        return ", ".join(f"{i}: {p}" for i, p in looked.items())
    missing = [item for item in items if item not in looked]
    if missing and not any(m.role == "tool" for m in messages) or missing and one_call_per_turn:
        todo = missing[:1] if one_call_per_turn else missing
        return "\n".join(format_tool_call("lookup_price", {"item": item}) for item in todo)
    return ", ".join(f"{item}: {looked.get(item, '?')}" for item in items)


class PricesEnv(PriceLookup, ToolEnv):
    """List looked-up unit prices; per-item credit, success when every item is right."""

    name = "prices"
    system_prompt = "Look up prices with the tool. Then answer with item: price for each item asked."

    def __init__(self, num_tasks: int = 64, min_items: int = 1, max_items: int = 3,
                 one_call_per_turn: bool = False, novel: bool = False) -> None:  # fmt: skip
        """``novel``: held-out tasks list only items no training task asks for (``NOVEL_PRICES``); the train
        split is refused then."""
        super().__init__()
        make_prices_tasks(1, 0, split="test" if novel else "train", min_items=min_items, max_items=max_items,
                          novel=novel)  # bad bounds fail here, naming them  # fmt: skip
        self.num_tasks = num_tasks
        self.min_items = min_items
        self.max_items = max_items
        self.novel = novel
        self.one_call_per_turn = one_call_per_turn
        if one_call_per_turn:
            self.scripted_rule = functools.partial(expert_rule, one_call_per_turn=True)

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return make_prices_tasks(self.num_tasks, seed=split_seed(split), split=split, min_items=self.min_items,
                                 max_items=self.max_items, novel=self.novel)  # fmt: skip

    async def step(self, tool_calls: list[ToolCall]) -> StepOutput:
        if not self.one_call_per_turn or len(tool_calls) <= 1:
            return await super().step(tool_calls)
        first = await self.tools.execute(tool_calls[:1])
        refused = [ToolResult(c.id, c.name, ONE_CALL_ERROR, True) for c in tool_calls[1:]]
        return StepOutput(first + refused, False, False, {})

    scripted_rule = staticmethod(expert_rule)
    """The expert (``expert_rule``); with ``one_call_per_turn`` it looks up one item per turn."""

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        assert self.task is not None, "reward() before reset()"
        items = self.task.info["items"]
        looked = {
            match.group(1): int(match.group(2))
            for m in trajectory.messages
            if m.role == "tool" and (match := _LOOKUP_RE.match(m.content))
        }
        reported = reported_prices(trajectory.final_answer)
        right = sum(item in looked and reported.get(item) == CATALOGUE[item] for item in items)
        return {"items_right": right / len(items)}


def _known(text: str) -> dict[str, int]:
    """The "item: price" (or "item: $price") pairs of known items in a text."""
    return {item: int(price) for item, price in re.findall(r"\b([a-z]+): \$?(\d+)\b", text) if item in CATALOGUE}
