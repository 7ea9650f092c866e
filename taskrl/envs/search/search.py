"""Hybrid search over a ``CorpusStore``: dense + BM25 in parallel, reciprocal rank fusion, rerank, token budget.

``HybridSearcher.search(query, exclude=seen, budget=S)`` runs the dense (chromadb) and lexical (bm25s) queries
concurrently, fuses them with RRF (k=60), keeps the top 50, reranks them and returns the best chunks whose
token counts fit in ``budget``. Chunks in ``exclude`` (already shown this episode) never come back.
No cross-encoder ships offline, so the default reranker is ``LexicalDenseReranker`` (documented below);
any callable with the ``Reranker`` signature can replace it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from taskrl.envs.search.corpus import Chunk
from taskrl.envs.search.store import CorpusStore

RRF_K = 60
FUSED_TOP = 50
_WORD_RE = re.compile(r"(?u)\b\w\w+\b")
_STOPWORD_TEXT = (
    "a an and are as at be but by for from has have in into is it its of on or that the their then there these "
    "this to was were what when where which who why will with does do how not no can"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def rrf(rankings: Sequence[Sequence[str]], k: int = RRF_K) -> list[tuple[str, float]]:
    """Reciprocal rank fusion: score(d) = sum over rankings of 1 / (k + rank), rank starting at 1.

    Ties keep the order of first appearance (the first ranking wins), so fusion is deterministic.
    """
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, 1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda kv: -kv[1])


def query_terms(text: str) -> set[str]:
    """Lower-cased words of two or more characters, minus common English stopwords."""
    return {w for w in _WORD_RE.findall(text.lower()) if w not in _STOPWORDS}


class Reranker(Protocol):
    def __call__(self, query: str, query_vector: np.ndarray, chunks: list[Chunk], store: CorpusStore) -> list[float]:
        """One relevance score per chunk (higher is better)."""
        ...


@dataclass(frozen=True)
class LexicalDenseReranker:
    """score = dense_weight * cosine(query, chunk) + (1 - dense_weight) * term coverage.

    Term coverage is the share of the query's distinct content words found in the chunk. RRF only sees
    ranks, and each list only its own candidates; this late fusion scores all 50 fused candidates on both
    signals (a BM25-only hit gets its cosine, a dense-only hit its coverage), which is what promotes a chunk
    that matches the exact words of a clue and its meaning. Costs one Chroma ``get`` of 50 vectors.
    """

    dense_weight: float = 0.5

    def __call__(self, query: str, query_vector: np.ndarray, chunks: list[Chunk], store: CorpusStore) -> list[float]:
        vectors = store.embeddings([c.id for c in chunks])
        terms = query_terms(query)
        scores = []
        for chunk in chunks:
            vector = vectors.get(chunk.id)
            cosine = float(np.dot(query_vector, vector)) if vector is not None else 0.0
            coverage = len(terms & query_terms(chunk.text)) / len(terms) if terms else 0.0
            scores.append(self.dense_weight * cosine + (1.0 - self.dense_weight) * coverage)
        return scores


@dataclass
class SearchResult:
    """What one search returned, plus what it looked at (for diagnostics and benchmarks)."""

    chunks: list[Chunk] = field(default_factory=list)
    candidates: int = 0
    """Fused candidates that were reranked (at most 50)."""
    over_budget: int = 0
    """Reranked candidates left out because they did not fit in the token budget."""

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.chunks)


def fit_budget(chunks: Sequence[Chunk], budget: int) -> tuple[list[Chunk], int]:
    """Take chunks in order while they fit in ``budget`` tokens; a chunk that does not fit is skipped.

    Returns (kept, skipped count). Skipping instead of stopping lets a smaller, lower-ranked chunk use
    the room a large one could not.
    """
    kept, used, skipped = [], 0, 0
    for chunk in chunks:
        if used + chunk.tokens <= budget:
            kept.append(chunk)
            used += chunk.tokens
        else:
            skipped += 1
    return kept, skipped


class HybridSearcher:
    """Dense + BM25 retrieval with RRF and reranking over one store; safe to share between threads."""

    def __init__(
        self,
        store: CorpusStore,
        *,
        reranker: Reranker | None = None,
        per_list: int = FUSED_TOP,
        fused_top: int = FUSED_TOP,
        rrf_k: int = RRF_K,
    ) -> None:
        self.store = store
        self.reranker: Reranker = reranker or LexicalDenseReranker()
        self.per_list = per_list
        self.fused_top = fused_top
        self.rrf_k = rrf_k
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="taskrl-search")

    def dense_ids(self, vector: np.ndarray, exclude: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """The dense ranking, excluding ``exclude``: over-fetches by its size so ``per_list`` remain."""
        hits = self.store.dense(vector, self.per_list + len(exclude))
        return [i for i, _ in hits if i not in exclude][: self.per_list]

    def lexical_ids(self, query: str, exclude: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """The BM25 ranking, excluding ``exclude`` (same over-fetch)."""
        hits = self.store.lexical(query, self.per_list + len(exclude))
        return [i for i, _ in hits if i not in exclude][: self.per_list]

    def search(self, query: str, *, exclude: set[str] | frozenset[str] = frozenset(), budget: int) -> SearchResult:
        """The best unseen chunks for ``query`` that fit in ``budget`` tokens, best first."""
        lexical = self._pool.submit(self.lexical_ids, query, exclude)  # BM25 runs while the query embeds
        vector = self.store.embed_query(query)
        dense = self.dense_ids(vector, exclude)
        fused = [i for i, _ in rrf([dense, lexical.result()], self.rrf_k)[: self.fused_top]]
        if not fused:
            return SearchResult()
        by_id = self.store.chunks(fused)
        candidates = [by_id[i] for i in fused if i in by_id]
        scores = self.reranker(query, vector, candidates, self.store)
        order = sorted(range(len(candidates)), key=lambda i: -scores[i])  # stable: RRF order breaks ties
        kept, skipped = fit_budget([candidates[i] for i in order], budget)
        return SearchResult(kept, len(candidates), skipped)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
