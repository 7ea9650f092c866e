"""Wide- and deep-search task sets for the agent swarm (docs/design/index.md §7, §9) over a search corpus.

A wide task is ``rows`` independent look-ups (single-hop verified clues) answered as a table and scored by item
F1; a deep task is ``rows`` multi-hop branches whose answers combine (right only when every branch is). Rows come
from the verified multi-hop generator, so every answer is string-matched in the corpus. ``taskrl datagen
widesearch|deepsearch`` write JSONL; ``taskrl.datagen.defaults`` caches a wide set beside the default corpus.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from taskrl.datagen.multihop import ExtractiveGenerator, GenerationConfig, GenerationReport
from taskrl.envs.search.store import CorpusStore
from taskrl.envs.swarm.tasks import DEEP, WIDE, render_prompt, render_table
from taskrl.moved import moved_names
from taskrl.types import Task, write_tasks


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


def _command(
    kind: str, corpus: Path, n: int, rows: int, hops: int, seed: int, out: Path | None, allow_fewer: bool
) -> None:
    """Generate and write; exit 1 (after writing what was kept) when fewer than ``n`` tasks were kept, unless
    ``allow_fewer``; with 0 kept nothing is written and the exit is 1 either way."""
    from rich.console import Console

    console = Console(stderr=True, soft_wrap=True)
    config = SwarmTaskConfig(kind=kind, n=n, rows=rows, hops=hops, seed=seed)
    tasks, report = generate_swarm_tasks(CorpusStore(corpus), config)
    dropped = dict(report.dropped) or "none"
    if not tasks:
        console.print(
            f"[red]error:[/red] kept 0/{n} {kind}-search tasks of {rows} rows ({report.kept} verified rows for "
            f"{n * rows} wanted; dropped: {dropped}); nothing written. Try fewer --rows or --hops, or a larger corpus."
        )
        raise typer.Exit(1)
    path = write_tasks(tasks, out or corpus / f"swarm_{kind}.jsonl")
    summary = (
        f"kept {len(tasks)}/{n} {kind}-search tasks of {rows} rows ({report.kept} verified rows); "
        f"dropped: {dropped}; written to {path}"
    )
    if len(tasks) < n:
        console.print(f"[yellow]warning:[/yellow] {summary}: fewer tasks than asked for (--allow-fewer accepts that)")
        if not allow_fewer:
            raise typer.Exit(1)
        return
    Console(soft_wrap=True).print(summary)


CorpusOpt = Annotated[Path, typer.Option(help="corpus directory from `taskrl corpus build`")]
OutOpt = Annotated[Path | None, typer.Option(help="tasks JSONL (default: CORPUS/swarm_<kind>.jsonl)")]
SeedOpt = Annotated[int, typer.Option(help="seed of every random choice")]
AllowFewerOpt = Annotated[
    bool, typer.Option(help="exit 0 when fewer tasks than --n were kept (0 kept is an error regardless)")
]


def widesearch_command(
    corpus: CorpusOpt,
    n: Annotated[int, typer.Option(help="tasks to write")] = 16,
    rows: Annotated[int, typer.Option(help="independent items per task")] = 8,
    seed: SeedOpt = 0,
    out: OutOpt = None,
    allow_fewer: AllowFewerOpt = False,
) -> None:
    """Generate wide-search tasks: many independent look-ups answered as a table (r_perf = item F1)."""
    _command(WIDE, corpus, n, rows, 1, seed, out, allow_fewer)


def deepsearch_command(
    corpus: CorpusOpt,
    n: Annotated[int, typer.Option(help="tasks to write")] = 16,
    rows: Annotated[int, typer.Option(help="branches per task")] = 3,
    hops: Annotated[int, typer.Option(help="hops per branch (2 or 3)")] = 2,
    seed: SeedOpt = 0,
    out: OutOpt = None,
    allow_fewer: AllowFewerOpt = False,
) -> None:
    """Generate deep-search tasks: multi-hop branches whose answers combine (right only when all are)."""
    _command(DEEP, corpus, n, rows, hops, seed, out, allow_fewer)


__getattr__ = moved_names(__name__, {"ensure_default_swarm_tasks": "taskrl.datagen.defaults"})
