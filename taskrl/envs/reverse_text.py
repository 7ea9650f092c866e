"""``reverse_text``: reverse a random lowercase string character by character (prime-rl's reverse-text, issue 40).

A task's prompt is the string itself; the system prompt asks for the reversal inside ``<reversed_text>`` tags.
The reward is prime-rl's (verifiers' ``reverse_text`` environment): the longest-common-subsequence ratio of
``difflib.SequenceMatcher(None, answer, gold).ratio()`` between the tagged answer and the exact reversal, so a
near miss earns partial credit; an answer without the tags parses to "" and earns 0. Reward 1 (exact) is success.

Departures from prime-rl: strings are random lowercase letters (optionally several words), not Wikipedia
paragraphs; there is no <think> block. Train and held-out strings are disjoint by construction: a string belongs
to ``test`` or ``val`` by a stable hash of itself (``held_out_split``), and every split draws only its own.
The expert (``scripted_rule``) writes the exact reversal: the SFT warm start's demonstrations.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Sequence
from difflib import SequenceMatcher
from typing import Any

from taskrl.env import ToolEnv
from taskrl.envs.builtin import split_seed
from taskrl.seeding import derive_seed
from taskrl.types import Message, Task, Trajectory

SYSTEM_PROMPT = "Reverse the text character-by-character. Put your answer in <reversed_text> tags."
_TAGGED = re.compile(r"<reversed_text>(.*?)</reversed_text>", re.DOTALL)


def held_out_split(text: str) -> str:
    """The split a string belongs to: about 1/8 ``test``, 1/8 ``val``, the rest ``train`` (a stable hash)."""
    bucket = derive_seed("reverse_text", text) % 8
    return "test" if bucket == 0 else "val" if bucket == 1 else "train"


def make_reverse_tasks(n: int, split: str = "train", *, min_chars: int = 5, max_chars: int = 10,
                       words: int = 1) -> list[Task]:  # fmt: skip
    """``n`` distinct strings of ``words`` space-separated lowercase words of ``min_chars``..``max_chars`` letters
    each, all belonging to ``split`` (train, test or val; any other split draws from train)."""
    if not 1 <= min_chars <= max_chars or words < 1 or n < 1:
        raise ValueError(f"need n >= 1, 1 <= min_chars <= max_chars and words >= 1, got n={n}, "
                         f"min_chars={min_chars}, max_chars={max_chars}, words={words}")  # fmt: skip
    owner = split if split in ("test", "val") else "train"
    rng = random.Random(split_seed(split) * 1_000_003 + min_chars * 1009 + max_chars * 31 + words)
    seen: set[str] = set()
    tasks: list[Task] = []
    for _ in range(200 * n):
        text = " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(min_chars, max_chars)))
                        for _ in range(words))  # fmt: skip
        if text in seen or held_out_split(text) != owner:
            continue
        seen.add(text)
        # the gold final answer (what check_env and a reader compare); the bare reversal is in info
        tasks.append(Task(id=f"reverse-{owner}-{len(tasks)}", prompt=text, answer=tagged(text[::-1]),
                          info={"reversed": text[::-1]}))  # fmt: skip
        if len(tasks) == n:
            return tasks
    raise ValueError(f"could not draw {n} distinct {owner} strings of {min_chars}..{max_chars} letters: "
                     "raise max_chars or lower num_tasks")  # fmt: skip


def parse_answer(text: str | None) -> str:
    """The last ``<reversed_text>`` block's content, stripped; "" when there is none."""
    found = _TAGGED.findall(text or "")
    return found[-1].strip() if found else ""


def similarity(answer: str, gold: str) -> float:
    """prime-rl's reward: ``SequenceMatcher(None, answer, gold).ratio()`` (2 x matches / total length)."""
    return SequenceMatcher(None, answer, gold).ratio()


def tagged(reversal: str) -> str:
    return f"<reversed_text>{reversal}</reversed_text>"


def expert_rule(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """The exact reversal of the prompt, tagged."""
    return tagged(next(m.content for m in messages if m.role == "user")[::-1])


class ReverseTextEnv(ToolEnv):
    """Reverse the prompt; reward = LCS ratio of the tagged answer to the reversal."""

    name = "reverse_text"
    system_prompt = SYSTEM_PROMPT
    scripted_rule = staticmethod(expert_rule)

    def __init__(self, num_tasks: int = 1000, min_chars: int = 5, max_chars: int = 10, words: int = 1,
                 num_held_out: int = 128) -> None:  # fmt: skip
        super().__init__()
        make_reverse_tasks(1, min_chars=min_chars, max_chars=max_chars, words=words)  # bad bounds fail here
        self.num_tasks, self.num_held_out = num_tasks, num_held_out
        self.min_chars, self.max_chars, self.words = min_chars, max_chars, words

    def tasks(self, split: str = "train") -> Sequence[Task]:
        n = self.num_held_out if split in ("test", "val") else self.num_tasks
        return make_reverse_tasks(n, split, min_chars=self.min_chars, max_chars=self.max_chars, words=self.words)

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        assert self.task is not None, "reward() before reset()"
        return {"similarity": similarity(parse_answer(trajectory.final_answer), self.task.info["reversed"])}
