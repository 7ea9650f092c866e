"""The built-in envs' default data, built once into the cache and reused: the ``stdlib`` corpus with its verified
multi-hop tasks (``search``) and a wide-search set over it (``swarm``).

The env factories (``taskrl.recipes``) call these when no corpus or task file is given; the envs themselves only
read (``taskrl.envs.search.build.default_corpus``), so no env generates data.
"""

from __future__ import annotations

import json
from pathlib import Path

from taskrl.datagen.multihop import ExtractiveGenerator, GenerationConfig
from taskrl.datagen.widesearch import SwarmTaskConfig, generate_swarm_tasks
from taskrl.envs.search.build import (
    DEFAULT_SOURCE,
    DEFAULT_TASKS,
    DEFAULT_TASKS_VERSION,
    DONE_MARKER,
    TASKS_FILE,
    build_corpus,
    default_corpus_dir,
)
from taskrl.envs.search.store import CorpusStore
from taskrl.types import write_tasks

DEFAULT_SWARM_TASKS = "swarm_wide_v1.jsonl"


class TooFewTasksError(RuntimeError):
    """The corpus yielded no swarm task at all (nothing is written)."""


def ensure_default_corpus(device: str = "auto") -> Path:
    """The default corpus directory, built (with its tasks) on first use; later calls only check a marker."""
    path = default_corpus_dir()
    try:
        if json.loads((path / DONE_MARKER).read_text()).get("tasks_version") == DEFAULT_TASKS_VERSION:
            return path
    except (OSError, ValueError):
        pass  # not built yet, or interrupted: build (resumes) below
    store, _ = build_corpus(DEFAULT_SOURCE, path, device=device)
    tasks, report = ExtractiveGenerator(store, GenerationConfig(n=DEFAULT_TASKS, seed=0)).generate()
    write_tasks(tasks, path / TASKS_FILE)
    marker = {"tasks_version": DEFAULT_TASKS_VERSION, "tasks": len(tasks), "report": report.to_dict()}
    (path / DONE_MARKER).write_text(json.dumps(marker))
    return path


def ensure_default_swarm_tasks() -> Path:
    """A wide-search set (16 tasks x 8 rows) beside the default corpus, generated once and cached."""
    corpus = ensure_default_corpus()
    path = corpus / DEFAULT_SWARM_TASKS
    if not path.exists():
        tasks, report = generate_swarm_tasks(CorpusStore(corpus), SwarmTaskConfig())
        if not tasks:
            raise TooFewTasksError(f"the default corpus {corpus} yielded no swarm task ({report.to_dict()})")
        write_tasks(tasks, path)  # atomic: an interrupted run leaves no half file
    return path
