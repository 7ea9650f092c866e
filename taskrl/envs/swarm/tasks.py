"""Swarm task format: wide search (independent rows, scored by item-level F1) and deep search (branches whose
answers combine, scored all-or-nothing), plus parsing the orchestrator's answer table.

A task's ``info`` holds ``kind`` ("wide" or "deep") and ``items``: ``[{"key": "1", "question": ..., "answer": ...,
"doc_ids": [...]}]``. The prompt lists every row's question; the final answer is a table ``| row | answer |``.
``datagen/widesearch.py`` writes such tasks; ``SwarmEnv`` reads them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from taskrl.types import Task

WIDE, DEEP = "wide", "deep"
_ROW_HEADER_RE = re.compile(r"^Row (\d+):$", re.M)
_TABLE_ROW_RE = re.compile(r"^\s*\|?\s*(?:row\s*)?(\d+)\s*[|:]\s*(.*?)\s*\|?\s*$", re.I | re.M)

WIDE_INTRO = "Fill in a table. Each row below is a separate question about documents in a search corpus."
DEEP_INTRO = (
    "Answer a question that combines several findings. Each row below is one part of it; the answer is the "
    "combination of every row's answer, and it is right only when every row is right."
)
ANSWER_FORMAT = "Give your final answer as a table with one line per row, exactly: | <row number> | <answer> |"


class SwarmTaskError(ValueError):
    """A swarm task lacks the ``info`` it needs (kind, items with keys and answers)."""


def render_prompt(kind: str, questions: Sequence[str]) -> str:
    """The task prompt: an intro, one ``Row k:`` block per question, the answer format. Never says "parallel"."""
    intro = WIDE_INTRO if kind == WIDE else DEEP_INTRO
    rows = [f"Row {i}:\n{q.strip()}" for i, q in enumerate(questions, 1)]
    return "\n\n".join([intro, *rows, ANSWER_FORMAT])


def render_table(answers: Mapping[str, str]) -> str:
    """An answer table in the format the reward parses."""
    return "\n".join(f"| {key} | {value} |" for key, value in answers.items())


def split_rows(prompt: str) -> dict[str, str]:
    """Row number -> that row's question, from a prompt written by ``render_prompt``."""
    parts = _ROW_HEADER_RE.split(prompt)
    rows: dict[str, str] = {}
    for i in range(1, len(parts) - 1, 2):
        text = parts[i + 1].split("\n\n" + ANSWER_FORMAT)[0]
        rows[parts[i]] = text.strip()
    return rows


def parse_table(text: str | None) -> dict[str, str]:
    """Row number -> answer from the orchestrator's final answer; the first line for a row wins."""
    out: dict[str, str] = {}
    for key, value in _TABLE_ROW_RE.findall(text or ""):
        if value and set(value) - set("-: ") and key not in out:
            out[key.lstrip("0") or "0"] = value
    return out


def normalize_answer(value: str) -> str:
    """Case, surrounding quotes/backticks/punctuation and a leading "ANSWER:" do not matter."""
    value = re.sub(r"^\s*answer\s*:\s*", "", value.strip(), flags=re.I)
    return value.strip().strip("`'\".,;").strip().lower()


def items_of(task: Task) -> list[dict[str, Any]]:
    items = task.info.get("items")
    if not items or not all(isinstance(i, dict) and "key" in i and "answer" in i for i in items):
        raise SwarmTaskError(
            f"task {task.id}: info['items'] must list {{'key', 'answer', ...}} rows; "
            "generate tasks with `taskrl datagen widesearch` or `taskrl datagen deepsearch`"
        )
    return items


def item_scores(task: Task, final_answer: str | None) -> dict[str, float]:
    """Item precision, recall and F1 of the answer table against the task's rows, and ``all_correct``."""
    gold = {str(i["key"]): normalize_answer(str(i["answer"])) for i in items_of(task)}
    predicted = {k: normalize_answer(v) for k, v in parse_table(final_answer).items() if k in gold}
    correct = sum(predicted[k] == gold[k] for k in predicted)
    answered = len(parse_table(final_answer))
    precision = correct / answered if answered else 0.0
    recall = correct / len(gold)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    all_correct = float(correct == len(gold))
    return {"item_precision": precision, "item_recall": recall, "item_f1": f1, "all_correct": all_correct}


def task_performance(task: Task, final_answer: str | None) -> float:
    """r_perf: item F1 for wide search; 1 when every branch is right (else 0) for deep search."""
    scores = item_scores(task, final_answer)
    kind = task.info.get("kind", WIDE)
    if kind not in (WIDE, DEEP):
        raise SwarmTaskError(f"task {task.id}: info['kind'] must be 'wide' or 'deep', got {kind!r}")
    return scores["item_f1"] if kind == WIDE else scores["all_correct"]
