"""A small planted corpus (real chromadb + bm25s + MiniLM store in a temp dir), built once per test session."""

from __future__ import annotations

import pytest
from search_planted import write_planted

from taskrl.datagen.multihop import ExtractiveGenerator, GenerationConfig
from taskrl.envs.search.build import TASKS_FILE, build_corpus
from taskrl.envs.search.store import CorpusStore
from taskrl.types import write_tasks


@pytest.fixture(scope="session")
def planted_corpus(tmp_path_factory: pytest.TempPathFactory) -> CorpusStore:
    """The planted corpus with MiniLM vectors, 48-token chunks, and 12 verified tasks in tasks.jsonl."""
    root = tmp_path_factory.mktemp("planted")
    store, _ = build_corpus(write_planted(root / "src"), root / "corpus", chunk_tokens=48, device="cpu")
    tasks, report = ExtractiveGenerator(store, GenerationConfig(n=12, seed=0, max_answer_df=1)).generate()
    assert report.kept == 12, report.to_dict()
    write_tasks(tasks, store.path / TASKS_FILE)
    return store


@pytest.fixture(scope="session")
def namespaced_corpus(tmp_path_factory: pytest.TempPathFactory) -> CorpusStore:
    """Package-metadata-like ids (``pkg:name-part``, ``g++-12``, ``lib:a-b`` beside ``lib:a-b-c``), hashing
    vectors, 64-token chunks, and 15 verified tasks (5 each of 1, 2 and 3 hops) in tasks.jsonl."""
    from search_planted import write_namespaced

    root = tmp_path_factory.mktemp("namespaced")
    store, _ = build_corpus(write_namespaced(root / "src"), root / "corpus", embedder="hashing-384", chunk_tokens=64)
    tasks, report = ExtractiveGenerator(store, GenerationConfig(n=15, seed=0)).generate()
    assert report.kept == 15, report.to_dict()
    write_tasks(tasks, store.path / TASKS_FILE)
    return store
