"""Wide- and deep-search task sets for the agent swarm (docs/design/index.md §7, §9) over a search corpus.

A wide task is ``rows`` independent look-ups (single-hop verified clues) answered as a table and scored by item
F1; a deep task is ``rows`` multi-hop branches whose answers combine (right only when every branch is). Rows come
from the verified multi-hop generator, so every answer is string-matched in the corpus. ``taskrl datagen
widesearch|deepsearch`` write JSONL; ``taskrl.datagen.defaults`` caches a wide set beside the default corpus.
"""

from __future__ import annotations

from dataclasses import dataclass

from taskrl.datagen.multihop import ExtractiveGenerator, GenerationConfig, GenerationReport
from taskrl.envs.search.store import CorpusStore
from taskrl.envs.swarm.tasks import DEEP, WIDE, render_prompt, render_table
from taskrl.moved import moved_names
from taskrl.types import Task


@dataclass
class SwarmTaskConfig:
    """How many swarm tasks, how wide, how deep."""

    kind: str = WIDE
    """"wide" (independent rows, item F1) or "deep" (branches that combine, all-or-nothing)."""
    n: int = 16
    """Tasks to write (fewer when the corpus yields too few verified rows; the report says so)."""
    rows: int = 8
    """Rows (items or branches) per task."""
    hops: int = 1
    """Hops per row: 1 for wide search; 2-3 make deep-search branches."""
    seed: int = 0
    """Seed of every random choice."""
    test_every: int = 5
    """Every n-th task goes to the "test" split (``info["split"]``), the rest to "train"."""
    max_answer_df: int = 2
    """An answer term may occur in at most this many documents."""

    def __post_init__(self) -> None:
        if self.kind not in (WIDE, DEEP):
            raise ValueError(f"SwarmTaskConfig.kind must be 'wide' or 'deep', got {self.kind!r}")
        if self.n < 1 or self.rows < 1:
            raise ValueError(f"SwarmTaskConfig.n and rows must be >= 1, got n={self.n}, rows={self.rows}")
        if self.hops not in (1, 2, 3):
            raise ValueError(f"SwarmTaskConfig.hops must be 1, 2 or 3, got {self.hops}")
        if self.test_every < 2 or self.max_answer_df < 1:
            raise ValueError("SwarmTaskConfig.test_every must be >= 2 and max_answer_df >= 1")


def generate_swarm_tasks(store: CorpusStore, config: SwarmTaskConfig) -> tuple[list[Task], GenerationReport]:
    """Up to ``config.n`` tasks of ``config.rows`` verified rows each; rows of one task have distinct answers."""
    generation = GenerationConfig(
        n=config.n * config.rows, seed=config.seed, hops=(config.hops,), distractors=0,
        max_answer_df=config.max_answer_df,
    )  # fmt: skip
    rows, report = ExtractiveGenerator(store, generation).generate()
    tasks: list[Task] = []
    pending: list[Task] = []
    for row in rows:
        if any(p.info["answer"].lower() == row.info["answer"].lower() for p in pending):
            report.dropped["repeated_answer_in_task"] += 1
            continue
        pending.append(row)
        if len(pending) == config.rows:
            tasks.append(_assemble(pending, config, len(tasks)))
            pending = []
    report.dropped["rows_left_over"] += len(pending)
    return tasks, report


def _assemble(rows: list[Task], config: SwarmTaskConfig, index: int) -> Task:
    items = [
        {"key": str(k), "question": r.prompt, "answer": r.info["answer"],
         "doc_ids": [f["doc_id"] for f in r.info["facts"]], "facts": r.info["facts"]}
        for k, r in enumerate(rows, 1)
    ]  # fmt: skip
    split = "test" if index % config.test_every == config.test_every - 1 else "train"
    info = {"kind": config.kind, "items": items, "rows": len(items), "hops": config.hops, "split": split,
            "generator": "extractive"}  # fmt: skip
    prompt = render_prompt(config.kind, [r.prompt for r in rows])
    gold = render_table({i["key"]: i["answer"] for i in items})
    return Task(f"{config.kind}-{config.seed}-{index}", prompt, gold, info)


__getattr__ = moved_names(__name__, {"ensure_default_swarm_tasks": "taskrl.datagen.defaults",
                                     "widesearch_command": "taskrl.commands.datagen",
                                     "deepsearch_command": "taskrl.commands.datagen"})  # fmt: skip
