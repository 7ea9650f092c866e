"""Documents in, chunks out: source readers (text, markdown, HTML, JSON, JSONL(.gz), the stdlib docs) and the chunker.

``iter_documents(source)`` reads a file, a directory or a built-in source (``stdlib``: a few dozen standard
library modules rendered with pydoc; ``stdlib-full``: every public stdlib module); ``SUPPORTED_FORMATS`` lists
the file types, and a ``SourceReport`` records what was read, skipped (unsupported files) and which ids derived
from file names were made citeable. Ids given in the data are never rewritten: an id the model cannot cite
(spaces, commas, quotes, '#') is an error naming the file and line. ``chunk_document`` cuts a
document into ~``max_tokens`` WordPiece tokens, preferring paragraph, then line, then sentence breaks; every
chunk is an exact substring of its document, so quotes can be string-matched in chunks.
"""

from __future__ import annotations

import bisect
import gzip
import hashlib
import html.parser
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskrl.envs.search.embed import wordpiece_tokenizer

TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".rst")
HTML_SUFFIXES = (".html", ".htm")
JSON_SUFFIXES = (".jsonl", ".jsonl.gz", ".json")
SUPPORTED_FORMATS = {
    ".txt .md .markdown .rst": "one document per file; id = path relative to the source without the suffix",
    ".html .htm": "one document per file, text outside <script>/<style>; title from <title>",
    ".jsonl .jsonl.gz": 'one document per line: {"text": ..., "id": ..., "title": ...}',
    ".json": 'a list of such objects, {"documents": [...]}, or one object',
}
"""Every file type a corpus source may hold (``taskrl corpus build --help`` lists them)."""
DOC_ID_CHARS = r"\w.:/+\-@~="
DOC_ID_RE = re.compile(rf"^[{DOC_ID_CHARS}]+$")
"""A citeable document id: letters, digits and ``_ . : / + - @ ~ =`` (no spaces, commas, quotes or '#')."""

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
    """A citeable id made from a file name: runs of other characters (spaces, '#', ...) become '_'."""
    cleaned = re.sub(rf"[^{DOC_ID_CHARS}]+", "_", raw.strip()).strip("_")
    if not cleaned:
        raise CorpusSourceError(f"document id {raw!r} has no usable characters")
    return cleaned


def check_doc_id(raw: str, where: str) -> str:
    """An id given in the data, unchanged; a ``CorpusSourceError`` naming ``where`` if the model cannot cite it."""
    if not DOC_ID_RE.match(raw):
        bad = sorted({c for c in raw if not re.match(rf"[{DOC_ID_CHARS}]", c)})
        raise CorpusSourceError(
            f"{where}: document id {raw!r} contains {', '.join(map(repr, bad))}; ids may hold letters, digits "
            "and _ . : / + - @ ~ = only (ids are never rewritten, so your ground truth keeps matching): fix the id"
        )
    return raw


@dataclass
class SourceReport:
    """What reading a source did: documents per format, unsupported files skipped, file-name ids rewritten."""

    documents: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    rewritten_ids: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.documents.values())

    def count(self, kind: str) -> None:
        self.documents[kind] = self.documents.get(kind, 0) + 1

    def summary(self) -> str:
        parts = [f"read {self.total} documents ({', '.join(f'{k}: {v}' for k, v in self.documents.items()) or 'none'})"]
        if self.skipped:
            more = f" and {len(self.skipped) - 5} more" if len(self.skipped) > 5 else ""
            shown = ", ".join(self.skipped[:5]) + more
            parts.append(f"skipped {len(self.skipped)} unsupported files ({shown})")
        if self.rewritten_ids:
            pairs = list(self.rewritten_ids.items())[:5]
            parts.append(f"{len(self.rewritten_ids)} ids from file names made citeable ("
                         + ", ".join(f"{a!r} -> {b!r}" for a, b in pairs) + ")")  # fmt: skip
        return "; ".join(parts)


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


def _row_document(row: Any, where: str, default_id: str, source: str) -> Document:
    if not isinstance(row, dict) or not isinstance(row.get("text"), str):
        raise CorpusSourceError(f'{where}: each document needs a "text" string (and optional id, title)')
    raw_id = row.get("id")
    doc_id = check_doc_id(str(raw_id), where) if raw_id not in (None, "") else default_id
    return Document(doc_id, row["text"], str(row.get("title") or ""), source)


def _read_jsonl(path: Path) -> Iterator[Document]:
    gzipped = path.name.endswith(".gz")
    stem = path.name.removesuffix(".gz").removesuffix(".jsonl")
    try:
        with (gzip.open(path, "rt", encoding="utf-8") if gzipped else path.open(encoding="utf-8")) as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row: Any = json.loads(line)
                except json.JSONDecodeError as e:
                    raise CorpusSourceError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
                yield _row_document(row, f"{path}:{line_no}", clean_doc_id(f"{stem}:{line_no}"), str(path))
    except (OSError, EOFError, UnicodeDecodeError) as e:  # a truncated .gz, a binary file named .jsonl
        raise CorpusSourceError(f"{path}: cannot be read as {'gzipped ' if gzipped else ''}JSONL ({e})") from None


def _read_json(path: Path) -> Iterator[Document]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorpusSourceError(f"{path}: not valid JSON ({e})") from None
    rows = data.get("documents") if isinstance(data, dict) and "text" not in data else data
    rows = [rows] if isinstance(rows, dict) else rows
    if not isinstance(rows, list):
        raise CorpusSourceError(f'{path}: expected a list of documents, {{"documents": [...]}} or one document')
    for i, row in enumerate(rows):
        yield _row_document(row, f"{path}[{i}]", clean_doc_id(f"{path.stem}:{i + 1}"), str(path))


class _HTMLText(html.parser.HTMLParser):
    """Visible text of an HTML page (stdlib parser), with block elements as line breaks, and its <title>."""

    _BLOCKS = frozenset({"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "section",
                         "article", "table", "ul", "ol", "dt", "dd", "blockquote", "header", "footer"})  # fmt: skip

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title = ""
        self._skip = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in ("script", "style", "noscript", "template"):
            self._skip += 1
        elif tag == "title":
            self._in_title = True
        elif tag in self._BLOCKS:
            self.parts.append("\n\n" if tag in ("p", "div", "pre", "section", "article") else "\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "noscript", "template"):
            self._skip = max(self._skip - 1, 0)
        elif tag == "title":
            self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif not self._skip:
            self.parts.append(data)

    def text(self) -> str:
        lines = (" ".join(line.split()) for line in "".join(self.parts).splitlines())
        return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _read_html(path: Path, root: Path, report: SourceReport) -> Document:
    parser = _HTMLText()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    parser.close()
    doc_id = _path_id(path, root, report)
    return Document(doc_id, parser.text(), " ".join(parser.title.split()) or path.stem, str(path))


def _path_id(path: Path, root: Path, report: SourceReport) -> str:
    raw = path.relative_to(root).as_posix() if path != root else path.name
    raw = raw.rsplit(".", 1)[0] if "." in Path(raw).name else raw
    doc_id = clean_doc_id(raw)
    if doc_id != raw:
        report.rewritten_ids[raw] = doc_id
    return doc_id


def _read_text(path: Path, root: Path, report: SourceReport) -> Document:
    text = path.read_text(encoding="utf-8", errors="replace")
    heading = re.search(r"^#+\s+(.+)$", text, re.M) if path.suffix in (".md", ".markdown") else None
    doc_id = _path_id(path, root, report)
    return Document(doc_id, text, heading.group(1).strip() if heading else path.stem, str(path))


def file_format(path: Path) -> str | None:
    """The supported format of a file (``.jsonl.gz``, ``.md``, ...), or None."""
    name = path.name.lower()
    for suffix in (*JSON_SUFFIXES, *HTML_SUFFIXES, *TEXT_SUFFIXES):
        if name.endswith(suffix):
            return suffix
    return None


def iter_documents(source: str | Path, report: SourceReport | None = None) -> Iterator[Document]:
    """Documents from a built-in name, a supported file (``SUPPORTED_FORMATS``), or a directory of them
    (recursive, sorted). Unsupported files are skipped and listed in ``report``."""
    report = report if report is not None else SourceReport()
    if isinstance(source, str) and source in BUILTIN_SOURCES:
        modules = BUILTIN_SOURCES[source]
        for document in render_stdlib_docs(list(modules) if modules else stdlib_module_names()):
            report.count("pydoc")
            yield document
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
        kind = file_format(file)
        if kind is None:
            report.skipped.append(str(file.relative_to(root)) if file != root else file.name)
            continue
        if kind in (".jsonl", ".jsonl.gz"):
            documents: Iterator[Document] = _read_jsonl(file)
        elif kind == ".json":
            documents = _read_json(file)
        elif kind in HTML_SUFFIXES:
            documents = iter([_read_html(file, root, report)])
        else:
            documents = iter([_read_text(file, root, report)])
        for document in documents:
            report.count(kind)
            yield document


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
