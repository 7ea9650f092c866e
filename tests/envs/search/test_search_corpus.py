"""Readers and the chunker: exact substrings, token limits, natural breaks, clear errors on bad sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskrl.envs.search.corpus import (
    SUPPORTED_FORMATS,
    CorpusSourceError,
    Document,
    SourceReport,
    chunk_document,
    clean_doc_id,
    doc_id_of,
    iter_documents,
    render_stdlib_docs,
)
from taskrl.envs.search.embed import count_tokens

WORDS = st.sampled_from(["alpha", "beta", "gamma", "delta.", "json", "dump(obj)", "x", "über", "\n", "\n\n", "  "])


@settings(max_examples=40, deadline=None)
@given(words=st.lists(WORDS, min_size=0, max_size=300), max_tokens=st.integers(16, 64))
def test_chunks_are_exact_substrings_within_the_token_limit(words: list[str], max_tokens: int) -> None:
    doc = Document("d", " ".join(words))
    chunks = chunk_document(doc, max_tokens)
    position = 0
    for i, chunk in enumerate(chunks):
        assert chunk.id == f"d#{i}" and chunk.position == i and chunk.doc_id == "d"
        assert doc.text[chunk.char_start : chunk.char_start + len(chunk.text)] == chunk.text
        assert chunk.char_start >= position  # in order, no overlap
        position = chunk.char_start + len(chunk.text)
        assert 0 < chunk.tokens <= max_tokens
        assert count_tokens(chunk.text) <= chunk.tokens
    # Nothing but whitespace is lost between chunks.
    assert "".join("".join(c.text.split()) for c in chunks) == "".join(doc.text.split())
    assert sum(c.tokens for c in chunks) == count_tokens(doc.text)


def test_chunker_prefers_paragraph_breaks() -> None:
    paragraphs = ["word " * 30, "other " * 30, "third " * 30]
    chunks = chunk_document(Document("d", "\n\n".join(p.strip() for p in paragraphs)), max_tokens=50)
    assert [c.text for c in chunks] == [p.strip() for p in paragraphs]


def test_chunker_rejects_tiny_limits_and_handles_empty_text() -> None:
    with pytest.raises(ValueError, match="max_tokens must be >= 16"):
        chunk_document(Document("d", "text"), max_tokens=4)
    assert chunk_document(Document("d", "   \n ")) == []


def test_readers(tmp_path: Path) -> None:
    (tmp_path / "guide").mkdir()
    (tmp_path / "guide" / "intro.md").write_text("# Getting started\n\nInstall it.")
    (tmp_path / "notes.txt").write_text("plain notes")
    (tmp_path / "skip.bin").write_bytes(b"\x00\x01")
    rows = [{"id": "faq-1", "title": "FAQ", "text": "answers"}, {"text": "no id here"}]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    report = SourceReport()
    docs = {d.id: d for d in iter_documents(tmp_path, report)}
    assert sorted(docs) == ["data:2", "faq-1", "guide/intro", "notes"]
    assert docs["guide/intro"].title == "Getting started"
    assert docs["faq-1"].title == "FAQ" and docs["faq-1"].text == "answers"
    assert report.skipped == ["skip.bin"] and report.documents == {".jsonl": 2, ".md": 1, ".txt": 1}
    assert [d.id for d in iter_documents(tmp_path / "notes.txt")] == ["notes"]
    assert Document("a", "x").content_hash == Document("a", "x").content_hash != Document("a", "y").content_hash


def test_bad_sources_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(CorpusSourceError, match="neither a file, a directory nor a built-in"):
        list(iter_documents(tmp_path / "missing"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(CorpusSourceError, match=r"bad.jsonl:2: not valid JSON"):
        list(iter_documents(bad))
    bad.write_text('{"title": "no text"}\n')
    with pytest.raises(CorpusSourceError, match=r"bad.jsonl:1: each document needs a \"text\" string"):
        list(iter_documents(bad))
    with pytest.raises(CorpusSourceError, match="no usable characters"):
        clean_doc_id("  ###  ")


def test_ids() -> None:
    assert clean_doc_id("a b/c#d") == "a_b/c_d"
    assert clean_doc_id("g++-12") == "g++-12" and clean_doc_id("pkg:name-part@1.0") == "pkg:name-part@1.0"
    assert doc_id_of("json#3") == "json" and doc_id_of("json") == "json"


def test_every_supported_format_is_read_and_ids_are_never_rewritten(tmp_path: Path) -> None:
    import gzip

    rows = [{"id": "g++-12", "text": "The GNU C++ compiler, version 12."}, {"id": "pkg:name-part", "text": "A."}]
    with gzip.open(tmp_path / "packages.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "list.json").write_text(json.dumps([{"id": "café", "text": "Unicode ids stay."}]))
    (tmp_path / "wrapped.json").write_text(json.dumps({"documents": [{"text": "no id"}]}))
    (tmp_path / "one.json").write_text(json.dumps({"id": "single", "text": "One object."}))
    (tmp_path / "page.html").write_text(
        "<html><head><title>The  Page</title><style>p {color: red}</style></head><body><h1>Head</h1>"
        "<p>First &amp; foremost.</p><script>var x = 1;</script><p>Second.</p></body></html>"
    )
    (tmp_path / "my notes.md").write_text("# Notes\n\ntext")
    report = SourceReport()
    docs = {d.id: d for d in iter_documents(tmp_path, report)}
    assert sorted(docs) == ["café", "g++-12", "my_notes", "page", "pkg:name-part", "single", "wrapped:1"]
    assert docs["page"].title == "The Page" and docs["page"].text == "Head\n\nFirst & foremost.\n\nSecond."
    assert report.rewritten_ids == {"my notes": "my_notes"}  # a file name, reported; data ids never change
    assert set(report.documents) == {".jsonl.gz", ".json", ".html", ".md"}
    assert all(suffix in " ".join(SUPPORTED_FORMATS) for suffix in report.documents)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "faq 1", "text": "x"}) + "\n")
    with pytest.raises(CorpusSourceError, match=r"bad.jsonl:1: document id 'faq 1' contains ' '.*never rewritten"):
        list(iter_documents(bad))
    (tmp_path / "broken.jsonl.gz").write_bytes(b"not gzip at all")
    with pytest.raises(CorpusSourceError, match="broken.jsonl.gz: cannot be read as gzipped JSONL"):
        list(iter_documents(tmp_path / "broken.jsonl.gz"))


def test_stdlib_docs_render_offline_and_deterministically() -> None:
    first = render_stdlib_docs(["json", "colorsys"])
    second = render_stdlib_docs(["json", "colorsys"])
    assert [d.id for d in first] == ["json", "colorsys"]
    assert "JSONDecoder" in first[0].text and " at 0x" not in first[0].text
    assert [d.content_hash for d in first] == [d.content_hash for d in second]
    with pytest.raises(CorpusSourceError, match="rendered none"):
        render_stdlib_docs(["no_such_module_xyz"])
