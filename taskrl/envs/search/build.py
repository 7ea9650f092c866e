"""Building corpora: ``build_corpus`` (what ``taskrl corpus build`` runs) and the cached default corpus.

The default corpus is the built-in ``stdlib`` source (pydoc text of a few dozen standard library modules),
built once into ``cache_dir()/corpora/`` with a verified multi-hop task set beside it (by
``taskrl.datagen.defaults``, which the env factories call), and reused afterwards: ``default_corpus()`` is the
reader's side. A build interrupted at any point resumes on the next call; a finished one opens in about a second.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from taskrl.envs.search.corpus import (
    BUILTIN_SOURCES,
    SUPPORTED_FORMATS,
    CorpusSourceError,
    Document,
    SourceReport,
    iter_documents,
)
from taskrl.envs.search.embed import MINILM
from taskrl.envs.search.store import CorpusStore, IngestStats
from taskrl.moved import moved_names

DEFAULT_SOURCE = "stdlib"
DEFAULT_CORPUS_NAME = "stdlib-v1"
DEFAULT_TASKS = 64
DEFAULT_TASKS_VERSION = 3
"""Bumped when the generator changes, so cached default corpora get fresh tasks (the corpus itself is kept)."""
TASKS_FILE = "tasks.jsonl"
DONE_MARKER = "taskrl_default_done.json"
"""Written last by the default build: its task-set version, so a reader never opens a half-built default."""


def build_corpus(
    source: str | Path,
    out: str | Path,
    *,
    chroma_url: str | None = None,
    collection: str | None = None,
    embedder: str = MINILM,
    chunk_tokens: int = 512,
    device: str = "auto",
    on_progress: Callable[[int, int], None] | None = None,
    report: SourceReport | None = None,
) -> tuple[CorpusStore, IngestStats]:
    """Ingest ``source`` into the corpus at ``out`` (created if needed); idempotent and resumable.

    The source is read and checked in full first (every file parses, ids are citeable and unique, at least one
    document), so a bad source fails before anything is written: no directory appears for a failed new build.
    A build that stops later (a crash, Ctrl-C) leaves the corpus marked unfinished, refused by readers and
    resumed by the next build. ``report`` (a ``SourceReport``) receives what was read and skipped.
    """
    report = report if report is not None else SourceReport()
    documents = _checked_documents(source, report)
    new = not (Path(out) / "manifest.json").exists()
    store = CorpusStore(
        out, create=True, chroma_url=chroma_url, collection=collection, embedder=embedder,
        chunk_tokens=chunk_tokens, device=device,
    )  # fmt: skip
    if new:
        store.set_building(True)
    stats = store.ingest(documents if documents is not None else iter_documents(source), on_progress=on_progress)
    if store.manifest.get("building"):
        store.set_building(False)
    return store, stats


def _checked_documents(source: str | Path, report: SourceReport) -> list[Document] | None:
    """Read the whole source once to check it; the documents of a built-in source (costly to render), else None."""
    seen: set[str] = set()
    kept: list[Document] = []
    builtin = isinstance(source, str) and source in BUILTIN_SOURCES
    for document in iter_documents(source, report):
        if document.id in seen:
            raise CorpusSourceError(f"document id {document.id!r} occurs twice in {source}; ids must be unique")
        seen.add(document.id)
        if builtin:
            kept.append(document)
    if not seen:
        formats = ", ".join(SUPPORTED_FORMATS)
        skipped = f"; skipped unsupported files: {', '.join(report.skipped[:10])}" if report.skipped else ""
        raise CorpusSourceError(f"no documents in {source} (supported formats: {formats}){skipped}")
    return kept if builtin else None


def default_corpus_dir() -> Path:
    from taskrl.paths import cache_dir

    return cache_dir() / "corpora" / DEFAULT_CORPUS_NAME


class DefaultCorpusMissingError(FileNotFoundError):
    """The default corpus (or its current task set) is not built yet; ``make("search")`` builds it."""


def default_corpus() -> Path:
    """The built default corpus directory; ``DefaultCorpusMissingError`` if it (or its current tasks) is missing.

    Building it (the corpus and its generated tasks) is ``taskrl.datagen.defaults.ensure_default_corpus``, which
    ``make("search")`` and ``make("swarm")`` call: the env reads data, it never generates it."""
    path = default_corpus_dir()
    try:
        if json.loads((path / DONE_MARKER).read_text()).get("tasks_version") == DEFAULT_TASKS_VERSION:
            return path
    except (OSError, ValueError):
        pass
    raise DefaultCorpusMissingError(
        f"the default corpus at {path} is not built (or its tasks are out of date): build the env with "
        f'make("search") (or `taskrl rollout --env search`), which builds it once, or pass corpus=<a corpus dir>'
    )


__getattr__ = moved_names(__name__, {"ensure_default_corpus": "taskrl.datagen.defaults"})
