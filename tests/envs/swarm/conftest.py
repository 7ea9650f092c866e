"""A planted search corpus (real chromadb + bm25s, hashing vectors, in a temp dir) with wide and deep swarm tasks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "search"))  # the search tests' planted documents
from search_planted import write_planted  # noqa: E402

from taskrl.datagen.widesearch import SwarmTaskConfig, generate_swarm_tasks  # noqa: E402
from taskrl.envs.search.build import TASKS_FILE, build_corpus  # noqa: E402
from taskrl.envs.search.embed import HASHING  # noqa: E402
from taskrl.envs.search.store import CorpusStore  # noqa: E402
from taskrl.types import write_tasks  # noqa: E402


@pytest.fixture(scope="session")
def swarm_corpus(tmp_path_factory: pytest.TempPathFactory) -> CorpusStore:
    """The planted corpus (48-token chunks, hashing vectors) with 2 wide tasks of 3 rows in swarm_wide.jsonl."""
    root = tmp_path_factory.mktemp("swarm_planted")
    store, _ = build_corpus(
        write_planted(root / "src"), root / "corpus", chunk_tokens=48, device="cpu", embedder=HASHING
    )  # hashing vectors: no model to load; the search itself is the real chromadb + bm25s path
    tasks, report = generate_swarm_tasks(store, SwarmTaskConfig(n=2, rows=3, max_answer_df=1, test_every=2))
    assert len(tasks) == 2, report.to_dict()
    write_tasks(tasks, store.path / "swarm_wide.jsonl")
    write_tasks(tasks, store.path / TASKS_FILE)  # the sub-agents' search env wants a task file beside the corpus
    return store


@pytest.fixture
def wide_tasks_path(swarm_corpus: CorpusStore) -> str:
    return str(swarm_corpus.path / "swarm_wide.jsonl")
