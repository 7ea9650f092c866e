"""Documents in, chunks out: source readers (text, markdown, JSONL, the built-in stdlib docs) and the chunker.

``iter_documents(source)`` reads a file, a directory or a built-in source (``stdlib``: a few dozen standard
library modules rendered with pydoc; ``stdlib-full``: every public stdlib module). ``chunk_document`` cuts a
document into ~``max_tokens`` WordPiece tokens, preferring paragraph, then line, then sentence breaks; every
chunk is an exact substring of its document, so quotes can be string-matched in chunks.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskrl.envs.search.embed import wordpiece_tokenizer

TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".rst")
DOC_ID_RE = re.compile(r"^[A-Za-z0-9_.:/\-]+$")

# A few dozen small and medium modules that cross-reference each other (bridges for multi-hop tasks);
# about 180 chunks of 512 tokens, which embed in well under a minute on two CPU cores.
DEFAULT_STDLIB_MODULES = (
    "json", "csv", "heapq", "bisect", "shlex", "glob", "fnmatch", "textwrap", "string", "base64", "binascii",
    "hashlib", "hmac", "secrets", "fractions", "copy", "pprint", "reprlib", "functools", "zlib", "gzip",
    "tempfile", "filecmp", "sched", "uuid", "colorsys", "keyword", "linecache", "getopt", "gettext", "quopri",
    "graphlib", "math", "struct", "zoneinfo", "tomllib", "netrc", "plistlib", "mimetypes", "errno",
)  # fmt: skip
# Importing these opens windows or browsers, prints, or needs a display: never rendered.
_STDLIB_DENYLIST = frozenset(
    {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "lib2to3", "pydoc_data", "__main__"}
)
BUILTIN_SOURCES = {"stdlib": DEFAULT_STDLIB_MODULES, "stdlib-full": None}

_RENDER_SCRIPT = r"""
import contextlib, importlib, io, json, pydoc, re, sys, warnings
warnings.simplefilter("ignore")
address = re.compile(r" at 0x[0-9a-fA-F]+")  # object reprs differ per process; the text must not
for name in sys.argv[1:]:
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            text = pydoc.render_doc(importlib.import_module(name), renderer=pydoc.plaintext)
    except BaseException:  # a module that cannot be imported here is skipped, not fatal
        continue
    print(json.dumps({"name": name, "text": address.sub("", text)}), flush=True)
"""


class CorpusSourceError(ValueError):
    """A corpus source cannot be read (missing path, bad JSONL line, unknown built-in)."""


@dataclass(frozen=True)
class Document:
    """One source document. ``id`` is what the model cites in its final answer."""

    id: str
    text: str
    title: str = ""
    source: str = ""

    @property
    def content_hash(self) -> str:
        """Hash of the id, title and text: re-ingesting an unchanged document is a no-op."""
        payload = json.dumps([self.id, self.title, self.text], ensure_ascii=False).encode()
        return hashlib.blake2b(payload, digest_size=16).hexdigest()


@dataclass(frozen=True)
class Chunk:
    """A piece of a document: ``text == document.text[char_start:char_start + len(text)]``."""

    id: str
    doc_id: str
    position: int
    text: str
    tokens: int
    char_start: int


def chunk_id(doc_id: str, position: int) -> str:
    return f"{doc_id}#{position}"


def doc_id_of(chunk_or_doc_id: str) -> str:
    """``"json#3"`` -> ``"json"``; a document id is returned unchanged."""
    return chunk_or_doc_id.split("#", 1)[0]


def clean_doc_id(raw: str) -> str:
    """A document id the model can cite: no spaces, quotes, commas or '#' (replaced by '_')."""
    cleaned = re.sub(r"[^A-Za-z0-9_.:/\-]+", "_", raw.strip()).strip("_")
    if not cleaned:
        raise CorpusSourceError(f"document id {raw!r} has no usable characters")
    return cleaned


# -- readers ----------------------------------------------------------------------------------------
def stdlib_module_names() -> list[str]:
    """Public top-level standard library modules that are safe to import for rendering."""
    return sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in _STDLIB_DENYLIST)


def render_stdlib_docs(modules: tuple[str, ...] | list[str], timeout_s: float = 600.0) -> list[Document]:
    """pydoc plaintext of each module, rendered in a child process so imports cannot touch this one."""
    proc = subprocess.run(
        [sys.executable, "-c", _RENDER_SCRIPT, *modules],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    docs = []
    for line in proc.stdout.splitlines():
        row = json.loads(line)
        docs.append(Document(id=row["name"], text=row["text"], title=row["name"], source="pydoc"))
    if not docs:
        raise CorpusSourceError(f"pydoc rendered none of {len(modules)} modules: {proc.stderr.strip()[-300:]}")
    return docs


def _read_jsonl(path: Path) -> Iterator[Document]:
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row: Any = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusSourceError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise CorpusSourceError(f'{path}:{line_no}: each line needs a "text" string (and optional id, title)')
            raw_id = str(row.get("id") or f"{path.stem}:{line_no}")
            yield Document(clean_doc_id(raw_id), row["text"], str(row.get("title") or ""), str(path))


def _read_text(path: Path, root: Path) -> Document:
    text = path.read_text(encoding="utf-8", errors="replace")
    heading = re.search(r"^#+\s+(.+)$", text, re.M) if path.suffix in (".md", ".markdown") else None
    raw_id = path.relative_to(root).with_suffix("").as_posix() if path != root else path.stem
    return Document(clean_doc_id(raw_id), text, heading.group(1).strip() if heading else path.stem, str(path))


def iter_documents(source: str | Path) -> Iterator[Document]:
    """Documents from a built-in name, a .txt/.md/.rst/.jsonl file, or a directory of them (recursive, sorted)."""
    if isinstance(source, str) and source in BUILTIN_SOURCES:
        modules = BUILTIN_SOURCES[source]
        yield from render_stdlib_docs(list(modules) if modules else stdlib_module_names())
        return
    path = Path(source)
    if not path.exists():
        raise CorpusSourceError(
            f"corpus source {str(source)!r} is neither a file, a directory nor a built-in "
            f"({', '.join(BUILTIN_SOURCES)})"
        )
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    root = path if path.is_dir() else path.parent
    for file in files:
        if file.suffix == ".jsonl":
            yield from _read_jsonl(file)
        elif file.suffix in TEXT_SUFFIXES:
            yield _read_text(file, root)


# -- chunking ---------------------------------------------------------------------------------------
def _break_tokens(text: str, starts: list[int], pattern: str) -> list[int]:
    """Token indices that start right after a match of ``pattern`` (candidate chunk boundaries)."""
    return sorted({bisect.bisect_left(starts, m.end()) for m in re.finditer(pattern, text)})


def chunk_document(document: Document, max_tokens: int = 512) -> list[Chunk]:
    """Cut ``document`` into chunks of at most ``max_tokens`` WordPiece tokens at natural breaks."""
    if max_tokens < 16:
        raise ValueError(f"max_tokens must be >= 16, got {max_tokens}")
    text = document.text
    offsets = wordpiece_tokenizer()(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    n = len(offsets)
    if n == 0:
        return []
    starts = [s for s, _ in offsets]
    # Preferred cut points, best first; a cut must leave the chunk at least half full.
    breaks = [_break_tokens(text, starts, p) for p in (r"\n[ \t]*\n", r"\n", r"[.!?;:][ \t]")]
    chunks: list[Chunk] = []
    begin = 0
    while begin < n:
        end = min(begin + max_tokens, n)
        if end < n:
            for candidates in breaks:
                i = bisect.bisect_right(candidates, end) - 1
                if i >= 0 and candidates[i] > begin + max_tokens // 2:
                    end = candidates[i]
                    break
        char_start = starts[begin]
        char_end = starts[end] if end < n else len(text)
        piece = text[char_start:char_end].rstrip()
        chunks.append(
            Chunk(chunk_id(document.id, len(chunks)), document.id, len(chunks), piece, end - begin, char_start)
        )
        begin = end
    return chunks
