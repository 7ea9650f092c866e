"""Tasks of the swarm learning recipe (issue 14): narrow demonstrations, wide RL and held-out tasks, disjoint.

``prepare(data_dir)`` generates (once) verified single-hop rows over the default search corpus with
``taskrl.datagen``'s extractive generator (the rows ``taskrl datagen widesearch`` is made of), splits them by
document (``split_rows``: no held-out row shares a document, a quoted sentence or a question with any training
row), and assembles wide-search tasks from each side (``assemble``):
- ``sft.jsonl``: 1-2 row tasks from training rows (the fan-out expert's demonstrations: one or two helpers);
- ``rl.jsonl``: ``RL_ROWS``-row tasks from training rows, for the GRPO arm (a fan-out no demonstration shows);
- ``eval.jsonl``: ``EVAL_ROWS``-row tasks from held-out rows only.
``split.json`` records the files, counts and overlaps (all 0, checked before anything is written).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.search_tasks import disjointness, split_two_hop, task_docs
from taskrl.envs.swarm.tasks import WIDE, render_prompt, render_table
from taskrl.types import Task

ROWS_REQUESTED = 240
GENERATION_SEED = 0
MAX_WORDS = 16
"""Longest quoted clue: the orchestrator copies every row's clue into its fan-out turn, so short clues keep a
3-row turn near 300 tokens (CPU sampling time) without changing the skill."""
SFT_ROWS = (1, 2)
RL_ROWS = 3
EVAL_ROWS = 3
SFT_TASKS, RL_TASKS, EVAL_TASKS = 60, 40, 24


def split_rows(rows: Sequence[Task], eval_share: float = 0.4) -> tuple[list[Task], list[Task]]:
    """(train, held-out) single-hop rows: whole documents to one side (``search_tasks.split_two_hop``), then any
    train row quoting a held-out sentence or asking a held-out question dropped, so the sides share nothing."""
    train, held = split_two_hop(rows, eval_share)
    quotes = {f["quote"] for t in held for f in t.info["facts"]}
    prompts = {t.prompt for t in held}
    train = [t for t in train if t.prompt not in prompts and not {f["quote"] for f in t.info["facts"]} & quotes]
    return train, held


def wide_task(rows: Sequence[Task], task_id: str, split: str) -> Task:
    """One wide-search task of ``rows`` (the format of ``datagen.widesearch``: item F1 over a row table)."""
    items = [{"key": str(k), "question": r.prompt, "answer": r.info["answer"], "doc_ids": task_docs(r),
              "facts": r.info["facts"], "row_id": r.id} for k, r in enumerate(rows, 1)]  # fmt: skip
    info = {"kind": WIDE, "items": items, "rows": len(items), "hops": 1, "split": split, "generator": "extractive"}
    gold = render_table({i["key"]: i["answer"] for i in items})
    return Task(task_id, render_prompt(WIDE, [r.prompt for r in rows]), gold, info)


def assemble(rows: Sequence[Task], sizes: Sequence[int], n: int, *, seed: int, prefix: str, split: str) -> list[Task]:
    """``n`` tasks, each of a size drawn from ``sizes``, of distinct rows with distinct answers, sampled from
    ``rows`` (a row may appear in several tasks, never twice in one)."""
    if not rows or max(sizes) > len(rows):
        raise ValueError(f"{len(rows)} rows cannot fill tasks of {max(sizes, default=0)} rows")
    rng = random.Random(seed)
    tasks: list[Task] = []
    while len(tasks) < n:
        size, chosen = rng.choice(list(sizes)), []
        for row in rng.sample(list(rows), len(rows)):
            if all(row.info["answer"].lower() != c.info["answer"].lower() for c in chosen):
                chosen.append(row)
            if len(chosen) == size:
                break
        if len(chosen) < size:
            raise ValueError(f"rows hold fewer than {size} distinct answers")
        tasks.append(wide_task(chosen, f"{prefix}-{len(tasks)}", split))
    return tasks


def row_overlaps(train: Sequence[Task], held: Sequence[Task]) -> dict[str, int]:
    """Overlaps between the rows of held-out tasks and the rows of training tasks (every count must be 0)."""

    def rows_of(tasks: Sequence[Task]) -> list[Task]:
        return [Task(i["row_id"], i["question"], i["answer"], {"facts": i["facts"]}) for t in tasks
                for i in t.info["items"]]  # fmt: skip

    return disjointness(rows_of(train), [], rows_of(held))


def prepare(data_dir: Path) -> dict[str, Any]:
    """Generate the rows and the three task files once (reused when ``split.json`` exists); their summary."""
    summary_path = data_dir / "split.json"
    settings = {"generation_seed": GENERATION_SEED, "max_words": MAX_WORDS, "rows_requested": ROWS_REQUESTED,
                "sizes": {"sft": list(SFT_ROWS), "rl": RL_ROWS, "eval": EVAL_ROWS},
                "tasks": [SFT_TASKS, RL_TASKS, EVAL_TASKS]}  # fmt: skip
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        if summary.get("settings") != settings:
            raise ValueError(f"{data_dir} holds tasks made with other settings; remove it (and the runs on it)")
        return summary
    from taskrl.datagen.defaults import ensure_default_corpus
    from taskrl.datagen.multihop import ExtractiveGenerator, GenerationConfig
    from taskrl.envs.search.store import CorpusStore
    from taskrl.types import write_tasks

    config = GenerationConfig(n=ROWS_REQUESTED, seed=GENERATION_SEED, hops=(1,), distractors=0, max_words=MAX_WORDS)
    rows, report = ExtractiveGenerator(CorpusStore(ensure_default_corpus()), config).generate()
    train, held = split_rows(rows)
    files = {
        "sft": assemble(train, SFT_ROWS, SFT_TASKS, seed=1, prefix="sft", split="train"),
        "rl": assemble(train, (RL_ROWS,), RL_TASKS, seed=2, prefix="rl", split="train"),
        "eval": assemble(held, (EVAL_ROWS,), EVAL_TASKS, seed=3, prefix="eval", split="test"),
    }
    overlaps = row_overlaps([*files["sft"], *files["rl"]], files["eval"])
    if any(overlaps.values()):
        raise AssertionError(f"held-out tasks overlap training tasks: {overlaps}")
    for name, tasks in files.items():
        write_tasks(tasks, data_dir / f"{name}.jsonl")
    summary = {
        "corpus": "default", "settings": settings,
        "files": {name: str(data_dir / f"{name}.jsonl") for name in files},
        "counts": {name: len(tasks) for name, tasks in files.items()},
        "rows": {"train": len(train), "held_out": len(held), "sft": list(SFT_ROWS), "rl": RL_ROWS, "eval": EVAL_ROWS},
        "overlaps": overlaps, "generation": report.to_dict(),
    }  # fmt: skip
    summary_path.write_text(json.dumps(summary, indent=1))
    return summary
