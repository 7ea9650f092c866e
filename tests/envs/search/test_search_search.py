"""Hybrid search on the planted MiniLM corpus: RRF, the planted needle, exclusion of seen chunks, budgets."""

from __future__ import annotations

import pytest

from taskrl.envs.search.corpus import Chunk
from taskrl.envs.search.search import HybridSearcher, fit_budget, query_terms, rrf
from taskrl.envs.search.store import CorpusStore


def test_rrf_golden_values() -> None:
    fused = dict(rrf([["a", "b", "c"], ["b", "d"]]))
    assert fused["a"] == pytest.approx(1 / 61)
    assert fused["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert fused["c"] == pytest.approx(1 / 63)
    assert fused["d"] == pytest.approx(1 / 62)
    assert [k for k, _ in rrf([["a", "b", "c"], ["b", "d"]])] == ["b", "a", "d", "c"]
    assert [k for k, _ in rrf([["x", "y"], ["y", "x"]])] == ["x", "y"]  # ties keep first appearance
    assert rrf([]) == []


def test_fit_budget_skips_what_does_not_fit() -> None:
    chunks = [Chunk(f"d#{i}", "d", i, "t", tokens, 0) for i, tokens in enumerate([60, 50, 30, 10])]
    kept, skipped = fit_budget(chunks, 100)
    assert [c.id for c in kept] == ["d#0", "d#2", "d#3"] and skipped == 1
    assert fit_budget(chunks, 5) == ([], 4)


def test_query_terms_drop_stopwords() -> None:
    assert query_terms("What is the lamp of the Lighthouse?") == {"lamp", "lighthouse"}


def test_planted_query_returns_the_relevant_chunk_first(planted_corpus: CorpusStore) -> None:
    searcher = HybridSearcher(planted_corpus)
    result = searcher.search("what fuel burns in the lamp of the lighthouse on Gull Point", budget=1000)
    assert result.chunks[0].id == "lighthouse#0"
    assert "whalefat" in result.chunks[0].text
    assert result.candidates == planted_corpus.count()  # a tiny corpus: everything is a candidate
    # Each half finds it on its own too: the dense half by meaning, the BM25 half by words.
    assert searcher.dense_ids(planted_corpus.embed_query("oil for the beacon's flame on the point"))[0] in {
        "lighthouse#0",
        "lighthouse#1",
    }
    assert searcher.lexical_ids("whalefat pinewax")[0] == "lighthouse#0"


def test_seen_chunks_are_excluded(planted_corpus: CorpusStore) -> None:
    searcher = HybridSearcher(planted_corpus)
    query = "lighthouse lamp fuel"
    first = searcher.search(query, budget=1000)
    seen = {first.chunks[0].id}
    second = searcher.search(query, exclude=seen, budget=1000)
    assert seen.isdisjoint(c.id for c in second.chunks)
    everything = frozenset(c.id for c in planted_corpus.iter_chunks())
    assert searcher.search(query, exclude=everything, budget=1000).chunks == []


def test_results_fit_the_per_call_budget(planted_corpus: CorpusStore) -> None:
    result = HybridSearcher(planted_corpus).search("council harbor fees", budget=60)
    assert 0 < result.tokens <= 60
    assert result.over_budget > 0
