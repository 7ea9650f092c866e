"""``taskrl corpus build|info|search|metrics``: build and inspect the search env's document stores.

``taskrl corpus build SOURCE --out DIR`` ingests a file, a directory or a built-in source (``stdlib``,
``stdlib-full``) with a progress bar; re-running adds only what changed and resumes an interrupted build.
``--chroma-url`` puts the vectors on a Chroma server instead of the embedded PersistentClient.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from taskrl.envs.search.corpus import BUILTIN_SOURCES, SUPPORTED_FORMATS, SourceReport
from taskrl.envs.search.embed import EMBEDDERS, MINILM

corpus_app = typer.Typer(help="Build and inspect search corpora (chromadb + bm25s).", no_args_is_help=True)
console = Console()


_FORMATS_HELP = "; ".join(f"{suffixes}: {what}" for suffixes, what in SUPPORTED_FORMATS.items())


@corpus_app.command("build", help=(
    "Ingest documents into a corpus: chunk, embed, store in chromadb, index with BM25.\n\n"
    f"Supported files (a directory is read recursively): {_FORMATS_HELP}. Other files are skipped and "
    "listed; a source with no document fails before anything is written. Ids are kept exactly as given."
))  # fmt: skip
def build(
    source: Annotated[
        str,
        typer.Argument(help=f"file, directory, or built-in: {', '.join(BUILTIN_SOURCES)}; formats: "
                       f"{' '.join(s for k in SUPPORTED_FORMATS for s in k.split())}"),
    ],
    out: Annotated[Path, typer.Option(help="corpus directory (created, or updated in place)")],
    chroma_url: Annotated[str | None, typer.Option(help="Chroma server, e.g. http://127.0.0.1:8000")] = None,
    collection: Annotated[str | None, typer.Option(help="Chroma collection name (default taskrl-chunks)")] = None,
    embedder: Annotated[str, typer.Option(help=f"one of {', '.join(EMBEDDERS)}")] = MINILM,
    chunk_tokens: Annotated[int, typer.Option(help="chunk size in WordPiece tokens")] = 512,
    device: Annotated[str, typer.Option(help="embedder device: auto, cpu, cuda ...")] = "auto",
) -> None:
    from taskrl.envs.search.build import build_corpus

    columns = (SpinnerColumn(), TextColumn("[bold]{task.description}"), TextColumn("{task.fields[docs]} documents"),
               TextColumn("{task.fields[chunks]} new chunks"), TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=console) as bar:
        job = bar.add_task(f"ingesting {source}", total=None, docs=0, chunks=0)
        counts = {"docs": 0, "chunks": 0}

        def progress(docs: int, chunks: int) -> None:
            counts["docs"] += docs
            counts["chunks"] += chunks
            bar.update(job, **counts)

        report = SourceReport()
        store, stats = build_corpus(
            source, out, chroma_url=chroma_url, collection=collection, embedder=embedder,
            chunk_tokens=chunk_tokens, device=device, on_progress=progress, report=report,
        )  # fmt: skip
    console.print(report.summary(), markup=False, highlight=False)
    console.print(
        f"{stats.documents_added} documents added, {stats.documents_replaced} replaced, "
        f"{stats.documents_skipped} unchanged; {stats.chunks_added} chunks added; "
        f"corpus {out} holds {len(store.document_ids())} documents, {store.count()} chunks"
    )


@corpus_app.command("info")
def info(corpus: Annotated[Path, typer.Argument(help="corpus directory")]) -> None:
    """Show what a corpus holds and how it was built."""
    from taskrl.envs.search.store import CorpusStore

    store = CorpusStore(corpus)
    table = Table("field", "value")
    for key, value in store.manifest.items():
        table.add_row(key, str(value))
    table.add_row("documents", str(len(store.document_ids())))
    table.add_row("chunks", str(store.count()))
    console.print(table)


@corpus_app.command("search")
def search(
    corpus: Annotated[Path, typer.Argument(help="corpus directory")],
    query: Annotated[str, typer.Argument(help="what to search for")],
    budget: Annotated[int, typer.Option(help="token budget of the result")] = 1024,
) -> None:
    """Run one hybrid search (BM25 + dense, RRF, rerank) and print the chunks it returns."""
    from taskrl.envs.search.search import HybridSearcher
    from taskrl.envs.search.store import CorpusStore

    result = HybridSearcher(CorpusStore(corpus)).search(query, budget=budget)
    for chunk in result.chunks:
        console.rule(f"{chunk.id} ({chunk.tokens} tokens)")
        console.print(chunk.text[:800], markup=False, highlight=False)
    console.print(f"{len(result.chunks)} chunks, {result.tokens} tokens, from {result.candidates} candidates")


@corpus_app.command("metrics")
def metrics(trajectories: Annotated[Path, typer.Argument(help="trajectories JSONL of search-env episodes")]) -> None:
    """Aggregate the search metrics (recall, precision, prune accuracy, ...) of a rollout file."""
    from taskrl.envs.search.env import aggregate_metrics
    from taskrl.types import read_jsonl

    rows = read_jsonl(str(trajectories))
    table = Table("metric", "mean", title=f"{len(rows)} episodes")
    for key, value in aggregate_metrics(rows).items():
        table.add_row(key, "n/a" if math.isnan(value) else f"{value:.3f}")
    console.print(table)
