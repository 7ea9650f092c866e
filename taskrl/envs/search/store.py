"""The document store of the search env: chromadb (dense vectors + texts), a bm25s index, a SQLite manifest.

A corpus directory holds ``manifest.json`` (embedder, chunk size, collection), ``chunks.sqlite`` (documents
with content hashes and their chunks: the source of truth for idempotent, resumable builds and for grep),
``bm25/`` (the bm25s index) and ``chroma/`` (the embedded PersistentClient; absent with a Chroma server).
``CorpusStore(dir, create=True).ingest(docs)`` adds what is new; re-running adds nothing twice, and an
interrupted build resumes where it stopped. Writers take a file lock, so concurrent builders cannot clash.
"""

from __future__ import annotations

import fcntl
import json
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import regex

from taskrl.envs.search.corpus import Chunk, CorpusSourceError, Document, chunk_document
from taskrl.envs.search.embed import MINILM, Embedder, get_embedder

FORMAT = 1
BM25_STOPWORDS = "en"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    doc_id TEXT PRIMARY KEY, title TEXT, source TEXT, content_hash TEXT, n_chunks INTEGER, done INTEGER);
CREATE TABLE IF NOT EXISTS chunks (
    chunk_id TEXT PRIMARY KEY, doc_id TEXT, position INTEGER, text TEXT, tokens INTEGER, char_start INTEGER);
CREATE INDEX IF NOT EXISTS chunks_doc ON chunks(doc_id, position);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""


class _ThreadConnection(threading.local):
    """Each thread's own sqlite3 connection (None until the thread first uses the store)."""

    conn: sqlite3.Connection | None = None


class CorpusStoreError(ValueError):
    """A corpus directory is missing, incompatible with the request, or a Chroma server is unreachable.

    A ValueError so the CLI prints it as one line that names the fix.
    """


class InvalidPatternError(ValueError):
    """``grep`` got a pattern that is not a valid regular expression."""


class GrepStoppedError(InvalidPatternError):
    """``grep`` ran out of its total time budget, or its caller stopped it, before the scan finished."""


@dataclass
class IngestStats:
    """What one ``ingest`` call did."""

    documents_added: int = 0
    documents_replaced: int = 0
    documents_skipped: int = 0
    chunks_added: int = 0


def _chroma_client(path: Path, chroma_url: str | None) -> Any:
    import chromadb
    from chromadb.config import Settings

    settings = Settings(anonymized_telemetry=False)
    if not chroma_url:
        return chromadb.PersistentClient(path=str(path / "chroma"), settings=settings)
    url = urlparse(chroma_url if "://" in chroma_url else f"http://{chroma_url}")
    if not url.hostname:
        raise CorpusStoreError(f"--chroma-url {chroma_url!r} has no host; use e.g. http://127.0.0.1:8000")
    try:
        client = chromadb.HttpClient(
            host=url.hostname, port=url.port or (443 if url.scheme == "https" else 8000),
            ssl=url.scheme == "https", settings=settings,
        )  # fmt: skip
        client.heartbeat()
    except Exception as e:  # noqa: BLE001 - any connection failure gets the same actionable message
        raise CorpusStoreError(f"cannot reach the Chroma server at {chroma_url}: {e} (is `chroma run` up?)") from None
    return client


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


class CorpusStore:
    """One corpus: add documents, then query it densely, lexically, by id, by document or by regex."""

    def __init__(
        self,
        path: str | Path,
        *,
        create: bool = False,
        chroma_url: str | None = None,
        collection: str | None = None,
        embedder: str = MINILM,
        chunk_tokens: int = 512,
        device: str = "auto",
    ) -> None:
        self.path = Path(path)
        manifest_path = self.path / "manifest.json"
        if manifest_path.exists():
            manifest = json.loads(manifest_path.read_text())
            if manifest.get("format") != FORMAT:
                raise CorpusStoreError(f"{self.path} was built by another taskrl (format {manifest.get('format')})")
            if create and (manifest["embedder"], manifest["chunk_tokens"]) != (embedder, chunk_tokens):
                raise CorpusStoreError(
                    f"{self.path} was built with embedder={manifest['embedder']}, chunk_tokens="
                    f"{manifest['chunk_tokens']}; rebuild into a new --out to use embedder={embedder}, "
                    f"chunk_tokens={chunk_tokens}"
                )
            if chroma_url and manifest.get("chroma_url") not in (None, chroma_url):
                raise CorpusStoreError(f"{self.path} lives on the Chroma server {manifest['chroma_url']}")
            if manifest.get("building") and not create:
                raise CorpusStoreError(
                    f"{self.path} is an unfinished build (it stopped before the end); rerun "
                    f"`taskrl corpus build SOURCE --out {self.path}` to finish it (finished work is kept)"
                )
        elif create:
            self.path.mkdir(parents=True, exist_ok=True)
            manifest = {
                "format": FORMAT,
                "embedder": embedder,
                "chunk_tokens": chunk_tokens,
                "chroma_url": chroma_url,
                "collection": collection or "taskrl-chunks",
            }
            _write_json_atomic(manifest_path, manifest)
        else:
            raise CorpusStoreError(
                f"no corpus at {self.path}; build one with `taskrl corpus build SOURCE --out {self.path}`"
            )
        self.manifest = manifest
        self.chunk_tokens: int = manifest["chunk_tokens"]
        self.embedder: Embedder = get_embedder(manifest["embedder"], device)
        self._client = _chroma_client(self.path, manifest.get("chroma_url"))
        self.collection = self._client.get_or_create_collection(
            manifest["collection"], embedding_function=None, configuration={"hnsw": {"space": "cosine"}}
        )
        self._local = _ThreadConnection()
        self._vector_count: int | None = None
        self._bm25: Any = None
        self._bm25_ids: list[str] = []
        self._bm25_lock = threading.Lock()
        with self._db() as db:
            db.executescript(_SCHEMA)

    def set_building(self, building: bool) -> None:
        """Mark the corpus as an unfinished build (readers refuse it, builders resume it) or as finished."""
        if building:
            self.manifest["building"] = True
        else:
            self.manifest.pop("building", None)
        _write_json_atomic(self.path / "manifest.json", self.manifest)

    # -- plumbing -----------------------------------------------------------------------------------
    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """A per-thread connection (sqlite3 objects must stay in their thread); commits on success."""
        conn = self._local.conn
        if conn is None:
            conn = sqlite3.connect(self.path / "chunks.sqlite", timeout=60)
            conn.execute("PRAGMA journal_mode=WAL")
            self._local.conn = conn
        with conn:
            yield conn

    @contextmanager
    def _write_lock(self) -> Iterator[None]:
        with (self.path / ".lock").open("w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _generation(self) -> int:
        with self._db() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
        return int(row[0]) if row else 0

    # -- building -----------------------------------------------------------------------------------
    def ingest(
        self,
        documents: Iterable[Document],
        *,
        batch_chunks: int = 256,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> IngestStats:
        """Chunk, embed and store new or changed documents; unchanged ones are skipped by content hash.

        Work is committed in batches (Chroma upsert, then the SQLite rows that mark documents done), so an
        interrupted run resumes with the first unfinished document. ``on_progress(documents, chunks)`` is
        called after each document. The BM25 index is rebuilt at the end when anything changed.
        """
        stats = IngestStats()
        pending: list[tuple[Document, list[Chunk]]] = []
        this_run: set[str] = set()
        with self._write_lock():
            with self._db() as db:
                known = {
                    d: (h, bool(done)) for d, h, done in db.execute("SELECT doc_id, content_hash, done FROM documents")
                }
            for document in documents:
                if document.id in this_run:
                    raise CorpusSourceError(
                        f"document id {document.id!r} occurs twice in the source; ids must be unique"
                    )
                this_run.add(document.id)
                previous = known.get(document.id)
                new_chunks = 0
                if previous == (document.content_hash, True):
                    stats.documents_skipped += 1
                else:
                    if previous is not None and previous[0] != document.content_hash:
                        self._delete_document(document.id)
                        stats.documents_replaced += 1
                    else:
                        stats.documents_added += 1
                    chunks = chunk_document(document, self.chunk_tokens)
                    pending.append((document, chunks))
                    new_chunks = len(chunks)
                    if sum(len(c) for _, c in pending) >= batch_chunks:
                        stats.chunks_added += self._flush(pending)
                        pending = []
                if on_progress is not None:
                    on_progress(1, new_chunks)
            stats.chunks_added += self._flush(pending)
            if stats.documents_added or stats.documents_replaced or self._bm25_stale():
                self._build_bm25()
        return stats

    def _flush(self, pending: list[tuple[Document, list[Chunk]]]) -> int:
        chunks = [c for _, cs in pending for c in cs]
        self._vector_count = None
        if chunks:
            vectors = self.embedder.embed([c.text for c in chunks])
            self.collection.upsert(
                ids=[c.id for c in chunks],
                embeddings=vectors,
                documents=[c.text for c in chunks],
                metadatas=[{"doc_id": c.doc_id, "position": c.position, "tokens": c.tokens} for c in chunks],
            )
        with self._db() as db:  # after the vectors: a crash before this commit redoes these documents
            db.executemany(
                "INSERT OR REPLACE INTO chunks VALUES (?, ?, ?, ?, ?, ?)",
                [(c.id, c.doc_id, c.position, c.text, c.tokens, c.char_start) for c in chunks],
            )
            db.executemany(
                "INSERT OR REPLACE INTO documents VALUES (?, ?, ?, ?, ?, 1)",
                [(d.id, d.title, d.source, d.content_hash, len(cs)) for d, cs in pending],
            )
            if pending:
                db.execute(
                    "INSERT INTO meta VALUES ('generation', '1') "
                    "ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1"
                )
        return len(chunks)

    def _delete_document(self, doc_id: str) -> None:
        with self._db() as db:
            ids = [r[0] for r in db.execute("SELECT chunk_id FROM chunks WHERE doc_id = ?", (doc_id,))]
            if ids:
                self.collection.delete(ids=ids)
                self._vector_count = None
            db.execute("DELETE FROM chunks WHERE doc_id = ?", (doc_id,))
            db.execute("DELETE FROM documents WHERE doc_id = ?", (doc_id,))

    def _bm25_state_path(self) -> Path:
        return self.path / "bm25" / "taskrl_state.json"

    def _bm25_stale(self) -> bool:
        try:
            state = json.loads(self._bm25_state_path().read_text())
        except (OSError, ValueError):
            return True
        return state.get("generation") != self._generation()

    def _build_bm25(self) -> None:
        import bm25s

        with self._db() as db:
            rows = db.execute("SELECT chunk_id, text FROM chunks ORDER BY doc_id, position").fetchall()
        generation = self._generation()
        out = self.path / "bm25"
        out.mkdir(exist_ok=True)
        state = self._bm25_state_path()
        state.unlink(missing_ok=True)  # a crash mid-save must leave the index marked stale
        ids = [r[0] for r in rows]
        if rows:
            retriever = bm25s.BM25()
            retriever.index(bm25s.tokenize([r[1] for r in rows], stopwords=BM25_STOPWORDS, show_progress=False),
                            show_progress=False)  # fmt: skip
            retriever.save(str(out), show_progress=False)
        (out / "taskrl_ids.json").write_text(json.dumps(ids))
        state.write_text(json.dumps({"generation": generation, "chunks": len(ids)}))
        self._bm25 = None

    def bm25_index(self) -> tuple[Any, list[str]]:
        with self._bm25_lock:
            if self._bm25 is None:
                import bm25s

                if self._bm25_stale():  # e.g. a build was interrupted after its last commit
                    with self._write_lock():
                        if self._bm25_stale():
                            self._build_bm25()
                self._bm25_ids = json.loads((self.path / "bm25" / "taskrl_ids.json").read_text())
                self._bm25 = bm25s.BM25.load(str(self.path / "bm25"), show_progress=False) if self._bm25_ids else False
            return self._bm25, self._bm25_ids

    # -- reading ------------------------------------------------------------------------------------
    def count(self) -> int:
        with self._db() as db:
            return int(db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0])

    def document_ids(self) -> list[str]:
        with self._db() as db:
            return [r[0] for r in db.execute("SELECT doc_id FROM documents WHERE done = 1 ORDER BY doc_id")]

    def documents(self) -> list[tuple[str, str]]:
        """``(doc_id, title)`` of every stored document."""
        with self._db() as db:
            return db.execute("SELECT doc_id, title FROM documents WHERE done = 1 ORDER BY doc_id").fetchall()

    def has_document(self, doc_id: str) -> bool:
        with self._db() as db:
            return db.execute("SELECT 1 FROM documents WHERE doc_id = ? AND done = 1", (doc_id,)).fetchone() is not None

    def chunks(self, ids: Iterable[str]) -> dict[str, Chunk]:
        """The stored chunks among ``ids`` (unknown ids are absent from the result)."""
        ids = list(dict.fromkeys(ids))
        out: dict[str, Chunk] = {}
        with self._db() as db:
            for start in range(0, len(ids), 500):
                part = ids[start : start + 500]
                marks = ",".join("?" * len(part))
                for row in db.execute(f"SELECT * FROM chunks WHERE chunk_id IN ({marks})", part):
                    out[row[0]] = Chunk(*row)
        return out

    def document_chunks(self, doc_id: str) -> list[Chunk]:
        with self._db() as db:
            rows = db.execute("SELECT * FROM chunks WHERE doc_id = ? ORDER BY position", (doc_id,)).fetchall()
        return [Chunk(*r) for r in rows]

    def chunk_ids(self) -> list[str]:
        with self._db() as db:
            return [r[0] for r in db.execute("SELECT chunk_id FROM chunks ORDER BY doc_id, position")]

    def iter_chunks(self) -> Iterator[Chunk]:
        with self._db() as db:
            rows = db.execute("SELECT * FROM chunks ORDER BY doc_id, position").fetchall()
        return (Chunk(*r) for r in rows)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embedder.embed([text])[0]

    def dense(self, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """Nearest chunks by cosine distance (smaller is closer), best first."""
        if self._vector_count is None:  # counting asks chromadb every time: cache it until the next write
            self._vector_count = self.collection.count()
        k = min(k, self._vector_count)
        if k < 1:
            return []
        found = self.collection.query(query_embeddings=[vector], n_results=k, include=["distances"])
        return list(zip(found["ids"][0], found["distances"][0], strict=True))

    def lexical(self, query: str, k: int) -> list[tuple[str, float]]:
        """BM25 matches with a positive score, best first."""
        import bm25s

        index, ids = self.bm25_index()
        tokens = bm25s.tokenize([query], stopwords=BM25_STOPWORDS, show_progress=False, return_ids=False)
        if not index or not tokens[0]:
            return []
        docs, scores = index.retrieve(tokens, k=min(k, len(ids)), show_progress=False, n_threads=1)
        return [(ids[int(d)], float(s)) for d, s in zip(docs[0], scores[0], strict=True) if s > 0]

    def embeddings(self, ids: list[str]) -> dict[str, np.ndarray]:
        if not ids:
            return {}
        got = self.collection.get(ids=ids, include=["embeddings"])
        return {i: np.asarray(e, dtype=np.float32) for i, e in zip(got["ids"], got["embeddings"], strict=True)}

    def grep(
        self,
        pattern: str,
        *,
        exclude: set[str] | frozenset[str] = frozenset(),
        limit: int = 5,
        timeout_s: float = 2.0,
        budget_s: float | None = 10.0,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[Chunk]:
        """Chunks whose text matches the regex ``pattern`` (first ``limit`` in corpus order, ``exclude`` skipped).

        Uses the ``regex`` module with a per-chunk timeout, and a total budget over the whole scan: between
        chunks the scan checks its deadline and ``should_stop`` (the tool call's stop flag), so a slow pattern
        that stays under the per-chunk limit still ends. Either way ``GrepStoppedError`` names how far it got.
        """
        try:
            compiled = regex.compile(pattern)
        except (regex.error, TypeError, ValueError, OverflowError, RecursionError) as e:
            raise InvalidPatternError(f"invalid regular expression {pattern!r}: {e}") from None
        deadline = time.monotonic() + budget_s if budget_s is not None else math.inf
        found: list[Chunk] = []
        scanned = 0

        def stopped(scanned: int, total: int) -> GrepStoppedError:
            within = f"within its {budget_s:g}s budget" if budget_s is not None else "when asked to stop"
            return GrepStoppedError(
                f"grep stopped: {pattern!r} scanned {scanned:,} of {total:,} chunks {within}; use a simpler pattern"
            )

        with self._db() as db:
            total = int(db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0])
            for row in db.execute("SELECT * FROM chunks ORDER BY doc_id, position"):
                if row[0] in exclude:
                    continue
                left = deadline - time.monotonic()
                if left <= 0 or (should_stop is not None and should_stop()):
                    raise stopped(scanned, total)
                try:
                    hit = compiled.search(row[3], timeout=min(timeout_s, left), concurrent=True)
                except TimeoutError:
                    # The per-chunk limit was the budget's remainder: the budget ran out, whichever clock (regex's
                    # or ours) noticed first, and even on the last chunk. Only a full per-chunk timeout is the
                    # pattern's own fault.
                    if left < timeout_s:
                        raise stopped(scanned, total) from None
                    raise InvalidPatternError(
                        f"regular expression {pattern!r} took over {timeout_s:g}s on one chunk; simplify it"
                    ) from None
                scanned += 1
                if hit:
                    found.append(Chunk(*row))
                    if len(found) >= limit:
                        break
        return found
