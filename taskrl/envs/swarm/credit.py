"""What each sub-agent assignment of a swarm episode was worth, judged against the task's rows.

``judge_children(task, final_answer, turns)`` writes on every child: ``info["row"]`` (the row its assignment asks
about, or None: off-task), ``["useful"]`` (its answer fills a row the final table got right, and no earlier child
filled that row), ``["subtask"]`` (that row), ``["duplicate"]`` (it asked about a row another assignment of the same
turn asked about, or one already solved), ``["decoy"]`` (not useful and off-task or a duplicate: dummies, padding,
one row assigned many times) and ``["trivial"]`` ("ANSWER: unknown"). The PARL terms and the monitors read these.
A task without rows (a nested swarm's sub-task) is left to ``taskrl.rewards.parl``'s fallback.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from taskrl.envs.swarm.tasks import parse_table
from taskrl.rewards.parl import is_trivial, normalize_answer
from taskrl.types import Task, Trajectory

_WORD_RE = re.compile(r"[a-z0-9_]{3,}")
MIN_QUESTION_OVERLAP = 0.6
"""An assignment asks about a row when it contains at least this share of the row question's words."""


def _words(text: str) -> set[str]:
    return set(_WORD_RE.findall(text.lower()))


def target_row(task_text: str, questions: dict[str, set[str]]) -> str | None:
    """The row whose question the assignment text covers best (>= ``MIN_QUESTION_OVERLAP`` of its words)."""
    said = _words(task_text)
    best, best_share = None, 0.0
    for key, words in questions.items():
        share = len(words & said) / len(words) if words else 0.0
        if share > best_share:
            best, best_share = key, share
    return best if best_share >= MIN_QUESTION_OVERLAP else None


def _contains(answer: str, gold: str) -> bool:
    return answer == gold or re.search(rf"(?<!\w){re.escape(gold)}(?!\w)", answer) is not None


def judge_children(task: Task, final_answer: str | None, turns: Sequence[Sequence[Trajectory]]) -> dict[str, Any]:
    """Annotate every child (see the module docstring); returns counts for the episode's metrics."""
    items = task.info.get("items")
    if not isinstance(items, list) or not items:
        return {}
    gold = {str(i["key"]): normalize_answer(str(i["answer"])) for i in items}
    questions = {str(i["key"]): _words(str(i.get("question", ""))) for i in items}
    table = {k: normalize_answer(v) for k, v in parse_table(final_answer).items()}
    right = {k for k, v in table.items() if k in gold and gold[k] and v == gold[k]}  # an empty gold fills nothing
    solved: set[str] = set()
    counts = {"useful": 0, "decoys": 0, "trivial": 0, "off_task": 0, "duplicates": 0}
    for turn in turns:
        asked: set[str] = set()
        solved_before = set(solved)
        for child in turn:
            answer = "" if child.error is not None else normalize_answer(child.final_answer)
            trivial = is_trivial(answer)
            row = target_row(str(child.info.get("task", "")), questions)
            matches = [] if trivial else [k for k in sorted(right, key=int) if _contains(answer, gold[k])]
            filled = matches[0] if matches else None
            useful = filled is not None and filled not in solved
            duplicate = (
                row is not None and (row in asked or row in solved_before) or (filled is not None and not useful)
            )
            decoy = not useful and (row is None or duplicate)
            child.info.update({"row": row, "useful": useful, "subtask": filled if useful else None,
                               "duplicate": duplicate, "decoy": decoy, "trivial": trivial})  # fmt: skip
            if row is not None:
                asked.add(row)
            if useful:
                solved.add(filled)  # type: ignore[arg-type]
            counts["useful"] += useful
            counts["decoys"] += decoy
            counts["trivial"] += trivial
            counts["off_task"] += row is None
            counts["duplicates"] += duplicate
    return counts
