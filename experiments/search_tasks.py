"""Tasks of the search learning recipe (issue 14): a small-chunk stdlib corpus and three disjoint task files.

``prepare(data_dir, design)`` builds (once, resumable) a pydoc corpus of 128-token chunks, generates verified
questions with ``taskrl.datagen``'s extractive generator and writes ``sft.jsonl`` (the expert's demonstrations),
``rl.jsonl`` (GRPO's questions) and ``eval.jsonl`` (held-out questions). Two task designs (``DESIGNS``; ``hops3b``
has hops3's tasks, its change is in search.py's ``DESIGN_ENV``):
- ``onehop`` (the first, about a minute on two cores): the built-in ``stdlib`` source (40 modules); SFT on
  one-hop questions, RL and evaluation on two-hop questions (a bridge clue whose masked term names the second
  hop's document: a skill no demonstration shows). Two-hop tasks are split by connected components of their
  documents (``split_two_hop``).
- ``hops3`` (the second, about five minutes): the 40 modules plus every public stdlib module whose pydoc is at
  most ``HOPS3_MAX_CHARS`` long (165 modules: enough bridges for three-hop chains); SFT on one- AND two-hop
  questions (one and two searches), RL and evaluation on three-hop questions (a third search and a second
  bridge: never demonstrated). The documents of the three-hop chains are split by ``split_documents``.
Either way no held-out task shares a document (hence a document pair), a quote, a prompt or an id with a
training task (``disjointness``, checked before anything is written); demonstrations touching held-out documents
or quotes are dropped. ``split.json`` records the counts and documents of each file.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from taskrl.types import Task

CHUNK_TOKENS = 128
"""Small chunks keep episodes short on a CPU (a search result of 256 tokens holds two)."""
TWO_HOP_REQUESTED = 300
ONE_HOP_REQUESTED = 200
GENERATION_SEED = 0
DESIGNS = ("onehop", "hops3", "hops3b")
HOPS3_MAX_CHARS = 30_000
"""hops3 corpus: the default 40 modules plus every public stdlib module whose pydoc text is at most this long."""
HOPS3_REQUESTED = {1: 300, 2: 600, 3: 1000}
"""Questions generated per hop count for hops3 (three-hop chains are rare: about a quarter are kept)."""
SPLIT_TRIALS = 3000


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


def split_documents(tasks: Sequence[Task], eval_share: float = 0.4, trials: int = SPLIT_TRIALS,
                    seed: int = GENERATION_SEED) -> set[str]:  # fmt: skip
    """Held-out documents for tasks whose documents form one big graph (hub modules such as ``re`` or ``time``
    join every chain): of ``trials`` seeded random document partitions, the one keeping the most tasks whole on
    either side (a task is held out when all its documents are, trained on when none is; the rest are dropped)
    with a held-out share of kept tasks as close to ``eval_share`` as the kept count allows."""
    if not 0 < eval_share < 1:
        raise ValueError(f"eval_share must be in (0, 1), got {eval_share}")
    rng = random.Random(seed)
    docs = sorted({d for t in tasks for d in task_docs(t)})
    chains = [set(task_docs(t)) for t in tasks]
    best: tuple[float, set[str]] = (-1.0, set())
    for _ in range(trials):
        share = rng.uniform(0.2, 0.7)
        held = {d for d in docs if rng.random() < share}
        n_held = sum(chain <= held for chain in chains)
        n_train = sum(not chain & held for chain in chains)
        score = min(n_held / eval_share, n_train / (1 - eval_share))  # tasks kept at the target shares
        if score > best[0]:
            best = (score, held)
    if best[0] <= 0:
        raise ValueError(f"no partition of {len(docs)} documents leaves both sides of {len(tasks)} tasks non-empty")
    return best[1]


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


def _generate(store: Any, hops: int, n: int) -> tuple[list[Task], dict[str, Any]]:
    """``n`` requested ``hops``-hop questions, ids prefixed ``hop<hops>`` (unique across files), and the report."""
    from taskrl.datagen.multihop import ExtractiveGenerator, GenerationConfig

    tasks, report = ExtractiveGenerator(store, GenerationConfig(n=n, hops=(hops,), seed=GENERATION_SEED)).generate()
    return _rename(tasks, f"hop{hops}"), report.to_dict()


def _without_held_out(tasks: Sequence[Task], held: Sequence[Task]) -> list[Task]:
    """The training tasks that touch no held-out document and no held-out quote."""
    held_docs = {d for t in held for d in task_docs(t)}
    held_quotes = {f["quote"] for t in held for f in t.info["facts"]}
    return [t for t in tasks if not set(task_docs(t)) & held_docs
            and not {f["quote"] for f in t.info["facts"]} & held_quotes]  # fmt: skip


def _onehop_files(store: Any) -> tuple[dict[str, list[Task]], dict[str, Any]]:
    """First design: SFT on one-hop questions, RL and held-out evaluation on two-hop questions."""
    two, two_report = _generate(store, 2, TWO_HOP_REQUESTED)
    one, one_report = _generate(store, 1, ONE_HOP_REQUESTED)
    rl, held = split_two_hop(two)
    return {"sft": _without_held_out(one, held), "rl": rl, "eval": held}, {"two_hop": two_report,
                                                                          "one_hop": one_report}  # fmt: skip


def _hops3_files(store: Any) -> tuple[dict[str, list[Task]], dict[str, Any]]:
    """Second design: SFT on one- and two-hop questions (interleaved), RL and evaluation on three-hop questions."""
    generated = {hops: _generate(store, hops, n) for hops, n in HOPS3_REQUESTED.items()}
    three = generated[3][0]
    held_docs = split_documents(three)
    held = [t for t in three if set(task_docs(t)) <= held_docs]
    rl = _without_held_out(three, held)
    one, two = (_without_held_out(generated[h][0], held) for h in (1, 2))
    sft = [t for pair in zip(one, two, strict=False) for t in pair] + one[len(two) :] + two[len(one) :]
    return {"sft": sft, "rl": rl, "eval": held}, {f"{h}_hop": generated[h][1] for h in generated}


def corpus_source(design: str, data_dir: Path) -> str | Path:
    """The corpus source of a design: ``stdlib`` (onehop) or a JSONL of the hops3 modules' pydoc (written once)."""
    if design == "onehop":
        return "stdlib"
    from taskrl.envs.search.corpus import DEFAULT_STDLIB_MODULES, render_stdlib_docs, stdlib_module_names

    path = data_dir / "source.jsonl"
    if not path.exists():
        docs = [d for d in render_stdlib_docs(stdlib_module_names())
                if d.id in DEFAULT_STDLIB_MODULES or len(d.text) <= HOPS3_MAX_CHARS]  # fmt: skip
        data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"id": d.id, "title": d.title, "text": d.text}) + "\n" for d in docs))
    return path


def prepare(data_dir: Path, design: str = "onehop", device: str = "auto") -> dict[str, Any]:
    """Build a design's corpus and three task files once (reused when ``split.json`` exists); their summary."""
    if design not in DESIGNS:
        raise ValueError(f"design must be one of {DESIGNS}, got {design!r}")
    summary_path = data_dir / "split.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        if summary.get("design", "onehop") != design:
            raise ValueError(f"{data_dir} holds the {summary.get('design', 'onehop')} design's data, not {design}")
        return summary
    from taskrl.envs.search.build import build_corpus
    from taskrl.types import write_tasks

    store, _ = build_corpus(corpus_source(design, data_dir), data_dir / "corpus", chunk_tokens=CHUNK_TOKENS,
                            device=device)  # fmt: skip
    files, generation = (_onehop_files if design == "onehop" else _hops3_files)(store)  # hops3b: hops3's tasks
    overlaps = disjointness(files["sft"], files["rl"], files["eval"])
    if any(overlaps.values()):
        raise AssertionError(f"held-out tasks overlap training tasks: {overlaps}")
    for name, tasks in files.items():
        write_tasks(tasks, data_dir / f"{name}.jsonl")
    summary = {
        "design": design, "corpus": str(data_dir / "corpus"), "chunk_tokens": CHUNK_TOKENS,
        "documents_in_corpus": len(store.document_ids()), "generation_seed": GENERATION_SEED,
        "files": {name: str(data_dir / f"{name}.jsonl") for name in files},
        "counts": {name: len(tasks) for name, tasks in files.items()},
        "hops": {name: Counter(str(len(task_docs(t))) for t in tasks) for name, tasks in files.items()},
        "documents": {name: sorted({d for t in tasks for d in task_docs(t)}) for name, tasks in files.items()},
        "pairs": {name: sorted({"->".join(task_docs(t)) for t in files[name]}) for name in ("rl", "eval")},
        "overlaps": overlaps, "generation": generation,
    }  # fmt: skip
    summary_path.write_text(json.dumps(summary, indent=1))
    return summary
