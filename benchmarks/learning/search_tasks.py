"""Tasks of the search learning recipe (issue 14): a small-chunk stdlib corpus and three disjoint task files.

``prepare(data_dir)`` builds (once, resumable, about a minute on two cores) the built-in ``stdlib`` pydoc source
into a corpus of 128-token chunks, generates verified one-hop and two-hop questions with ``taskrl.datagen``'s
extractive generator, and writes:
- ``sft.jsonl``: one-hop questions (the expert's demonstrations: search the clue, cite its document);
- ``rl.jsonl``: two-hop questions (a bridge clue whose masked term names the second hop's document: a skill no
  demonstration shows) for the GRPO arm;
- ``eval.jsonl``: held-out two-hop questions.
Two-hop tasks are split by connected components of their documents (``split_two_hop``), so no held-out task
shares a document, a document pair or a question with an RL task; one-hop tasks on held-out documents are
dropped from ``sft.jsonl``. ``split.json`` records the counts and documents of each file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from taskrl.types import Task

CHUNK_TOKENS = 128
"""Small chunks keep episodes short on a CPU (a search result of 256 tokens holds two)."""
TWO_HOP_REQUESTED = 300
ONE_HOP_REQUESTED = 200
GENERATION_SEED = 0


def task_docs(task: Task) -> list[str]:
    """The documents a task's facts are in, in hop order."""
    return [f["doc_id"] for f in task.info["facts"]]


def split_two_hop(tasks: Sequence[Task], eval_share: float = 0.4) -> tuple[list[Task], list[Task]]:
    """(train, held-out): whole connected components of the task-document graph, largest first, each to the
    side furthest below its target share, so the two sides share no document (hence no pair, no question)."""
    if not 0 < eval_share < 1:
        raise ValueError(f"eval_share must be in (0, 1), got {eval_share}")
    parent: dict[str, str] = {}

    def find(doc: str) -> str:
        while parent.setdefault(doc, doc) != doc:
            parent[doc] = parent[parent[doc]]
            doc = parent[doc]
        return doc

    for task in tasks:
        first, *rest = task_docs(task)
        for doc in rest:
            parent[find(doc)] = find(first)
    components: dict[str, list[Task]] = {}
    for task in tasks:
        components.setdefault(find(task_docs(task)[0]), []).append(task)
    ordered = sorted(components.values(), key=lambda c: (-len(c), min(d for t in c for d in task_docs(t))))
    train: list[Task] = []
    held: list[Task] = []
    for component in ordered:
        total = len(train) + len(held) + len(component)
        if (eval_share * total - len(held)) > ((1 - eval_share) * total - len(train)):
            held += component
        else:
            train += component
    if not train or not held:
        raise ValueError(f"{len(tasks)} two-hop tasks form one document component: no disjoint held-out split")
    return train, held


def disjointness(sft: Sequence[Task], rl: Sequence[Task], held: Sequence[Task]) -> dict[str, int]:
    """Overlaps between held-out tasks and training tasks (every count must be 0)."""
    held_docs = {d for t in held for d in task_docs(t)}
    held_quotes = {f["quote"] for t in held for f in t.info["facts"]}
    train = [*sft, *rl]
    return {
        "shared_documents": len({d for t in train for d in task_docs(t)} & held_docs),
        "shared_pairs": len({tuple(task_docs(t)) for t in rl} & {tuple(task_docs(t)) for t in held}),
        "shared_quotes": len({f["quote"] for t in train for f in t.info["facts"]} & held_quotes),
        "shared_prompts": len({t.prompt for t in train} & {t.prompt for t in held}),
        "shared_ids": len({t.id for t in train} & {t.id for t in held}),
    }


def _rename(tasks: list[Task], prefix: str) -> list[Task]:
    """Task ids unique across the files (each generator run numbers its tasks from the same seed)."""
    return [Task(f"{prefix}-{t.id}", t.prompt, t.answer, t.info) for t in tasks]


def prepare(data_dir: Path, device: str = "auto") -> dict[str, Any]:
    """Build the corpus and the three task files once (reused when ``split.json`` exists); their summary."""
    summary_path = data_dir / "split.json"
    if summary_path.exists():
        return json.loads(summary_path.read_text())
    from taskrl.datagen.multihop import ExtractiveGenerator, GenerationConfig, write_tasks
    from taskrl.envs.search.build import build_corpus

    store, _ = build_corpus("stdlib", data_dir / "corpus", chunk_tokens=CHUNK_TOKENS, device=device)
    two, two_report = ExtractiveGenerator(store, GenerationConfig(n=TWO_HOP_REQUESTED, hops=(2,),
                                                                  seed=GENERATION_SEED)).generate()  # fmt: skip
    one, one_report = ExtractiveGenerator(store, GenerationConfig(n=ONE_HOP_REQUESTED, hops=(1,),
                                                                  seed=GENERATION_SEED)).generate()  # fmt: skip
    rl, held = split_two_hop(_rename(two, "hop2"))
    held_docs = {d for t in held for d in task_docs(t)}
    held_quotes = {f["quote"] for t in held for f in t.info["facts"]}
    sft = [t for t in _rename(one, "hop1") if not set(task_docs(t)) & held_docs
           and not {f["quote"] for f in t.info["facts"]} & held_quotes]  # fmt: skip
    overlaps = disjointness(sft, rl, held)
    if any(overlaps.values()):
        raise AssertionError(f"held-out tasks overlap training tasks: {overlaps}")
    files = {"sft": sft, "rl": rl, "eval": held}
    for name, tasks in files.items():
        write_tasks(tasks, data_dir / f"{name}.jsonl")
    summary = {
        "corpus": str(data_dir / "corpus"), "chunk_tokens": CHUNK_TOKENS, "generation_seed": GENERATION_SEED,
        "files": {name: str(data_dir / f"{name}.jsonl") for name in files},
        "counts": {name: len(tasks) for name, tasks in files.items()},
        "documents": {name: sorted({d for t in tasks for d in task_docs(t)}) for name, tasks in files.items()},
        "pairs": {name: sorted({"->".join(task_docs(t)) for t in files[name]}) for name in ("rl", "eval")},
        "overlaps": overlaps,
        "generation": {"two_hop": two_report.to_dict(), "one_hop": one_report.to_dict()},
    }  # fmt: skip
    summary_path.write_text(json.dumps(summary, indent=1))
    return summary
