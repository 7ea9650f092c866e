"""The real store (chromadb + bm25s + SQLite): idempotent and resumable ingestion, grep, a real Chroma server."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from taskrl.envs.search.corpus import CorpusSourceError, Document
from taskrl.envs.search.embed import HASHING, HashingEmbedder
from taskrl.envs.search.search import HybridSearcher
from taskrl.envs.search.store import CorpusStore, CorpusStoreError, GrepStoppedError, InvalidPatternError

DOCS = [
    Document(f"doc{i}", f"Document {i} talks about topic{i}. " * 12 + f"The secret code is zx{i}q.") for i in range(6)
]


def open_store(path: Path, **kw: object) -> CorpusStore:
    return CorpusStore(path, create=True, embedder=HASHING, chunk_tokens=32, **kw)  # type: ignore[arg-type]


def test_ingestion_is_idempotent_by_content_hash(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    first = store.ingest(DOCS)
    assert (first.documents_added, first.documents_skipped) == (6, 0)
    assert first.chunks_added == store.count() == store.collection.count() > 6
    again = open_store(tmp_path).ingest(DOCS)
    assert (again.documents_added, again.documents_skipped, again.chunks_added) == (0, 6, 0)
    assert store.count() == store.collection.count() == first.chunks_added
    changed = Document("doc0", "Only one short sentence now.")
    replaced = store.ingest([changed, *DOCS[1:]])
    assert (replaced.documents_replaced, replaced.documents_skipped) == (1, 5)
    assert [c.text for c in store.document_chunks("doc0")] == ["Only one short sentence now."]
    assert store.count() == store.collection.count()  # the old doc0 chunks left chromadb too
    assert store.lexical("topic0", 5) == []  # and the BM25 index
    with pytest.raises(CorpusSourceError, match="'doc1' occurs twice"):
        store.ingest([DOCS[1], DOCS[1]])


def test_interrupted_build_resumes(tmp_path: Path) -> None:
    def crashing() -> Iterator[Document]:
        yield from DOCS[:3]
        raise KeyboardInterrupt  # e.g. Ctrl-C in the middle of a build

    store = open_store(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        store.ingest(crashing(), batch_chunks=1)
    done = store.document_ids()
    assert done == ["doc0", "doc1", "doc2"]
    resumed = open_store(tmp_path).ingest(DOCS)
    assert (resumed.documents_skipped, resumed.documents_added) == (3, 3)
    assert store.count() == store.collection.count()
    assert store.lexical("zx5q", 3)[0][0].startswith("doc5#")


def test_bm25_index_rebuilds_when_stale(tmp_path: Path) -> None:
    open_store(tmp_path).ingest(DOCS)
    (tmp_path / "bm25" / "taskrl_state.json").unlink()  # as if a build died before saving the index
    reopened = CorpusStore(tmp_path)
    assert reopened.lexical("zx4q", 3)[0][0].startswith("doc4#")
    assert json.loads((tmp_path / "bm25" / "taskrl_state.json").read_text())["chunks"] == reopened.count()


def test_grep(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.ingest(DOCS)
    hits = store.grep(r"zx[0-9]q")
    assert len(hits) == 5 and all("zx" in c.text for c in hits)
    assert [c.doc_id for c in store.grep(r"zx[0-9]q", exclude={hits[0].id}, limit=1)] == [hits[1].doc_id]
    assert store.grep("no such text") == []
    with pytest.raises(InvalidPatternError, match=r"invalid regular expression '\(unclosed'"):
        store.grep("(unclosed")


# Fuzzy matching with 3 errors: ~0.1 s per chunk, well under the per-chunk limit, hours over a large corpus.
SLOW_FUZZY = r"(?:the (?:\w+ ){0,6}quillstamp archive warden ledger){e<=3}"


def test_grep_stops_at_its_total_budget_and_on_request(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.ingest([Document(f"d{i}", f"Plain text number {i} about harbors and ships. " * 20) for i in range(40)])
    with pytest.raises(GrepStoppedError, match=r"scanned \d+ of \d+ chunks within its 0.3s budget") as stopped:
        store.grep(SLOW_FUZZY, budget_s=0.3)
    scanned, total = map(int, re.search(r"scanned (\d+) of (\d+)", str(stopped.value)).groups())
    assert scanned < total  # it stopped part-way instead of scanning on
    with pytest.raises(GrepStoppedError, match="scanned 0 of"):
        store.grep("ships", should_stop=lambda: True)
    assert len(store.grep("ships", budget_s=30)) == 5  # a fast pattern is unaffected
    with pytest.raises(GrepStoppedError, match="scanned 0 of .* when asked to stop"):  # no budget, still stops
        store.grep("ships", budget_s=None, should_stop=lambda: True)


def test_store_errors_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(CorpusStoreError, match="no corpus at .*; build one with `taskrl corpus build"):
        CorpusStore(tmp_path / "nothing")
    open_store(tmp_path)
    with pytest.raises(CorpusStoreError, match="built with embedder=hashing-384, chunk_tokens=32"):
        CorpusStore(tmp_path, create=True, embedder=HASHING, chunk_tokens=64)
    with pytest.raises(CorpusStoreError, match="cannot reach the Chroma server at http://127.0.0.1:9"):
        CorpusStore(tmp_path / "remote", create=True, embedder=HASHING, chroma_url="http://127.0.0.1:9")


def test_hashing_embedder_is_deterministic_and_lexical() -> None:
    vectors = HashingEmbedder().embed(["the harbor ships", "ships the harbor", "granite quarry", ""])
    assert vectors.shape == (4, 384)
    assert float(vectors[0] @ vectors[1]) == pytest.approx(1.0)
    assert float(vectors[0] @ vectors[2]) < 0.5
    assert not vectors[3].any()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def chroma_server(tmp_path: Path) -> Iterator[str]:
    """A real Chroma server (`chroma run`) on loopback, stopped after the test."""
    port = _free_port()
    chroma = Path(sys.executable).parent / "chroma"
    env = {**os.environ, "ANONYMIZED_TELEMETRY": "False"}
    proc = subprocess.Popen(
        [str(chroma), "run", "--path", str(tmp_path / "server"), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/api/v2/heartbeat", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"chroma run did not start on {url} within 30 s")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_store_on_a_chroma_server(tmp_path: Path, chroma_server: str) -> None:
    store = open_store(tmp_path / "corpus", chroma_url=chroma_server, collection="taskrl-test")
    assert store.ingest(DOCS).documents_added == 6
    assert store.collection.count() == store.count()
    reopened = CorpusStore(tmp_path / "corpus")  # the manifest remembers the server
    assert reopened.manifest["chroma_url"] == chroma_server
    result = HybridSearcher(reopened).search("secret code zx3q", budget=200)
    assert result.chunks and result.chunks[0].doc_id == "doc3"
