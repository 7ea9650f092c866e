"""The search env's expert (scripted rule): search and grep every clue, follow the bridges, cite what they prove.

It uses only what the model sees (the clues and the tool results), so it also serves as a cold-start guide.
A clue's masked term ``[Xk]`` may be any id (``pkg:name-part``, ``g++-12``, ``lib:a-b`` next to ``lib:a-b-c``),
so the capture is a whole whitespace-free token, not a word. Matches are chained: the term captured in clue k
must name the document the match of clue k+1 is in, which rules out look-alike passages in other documents.
A bridged document that no search returned is read with ``read_document`` before answering.
"""

from __future__ import annotations

import re
from typing import Any

from taskrl.chat import format_tool_call
from taskrl.types import Message

CLUE_RE = re.compile(r'^Clue \d+[^:]*: "(.*)"$', re.M)
_MASK_RE = re.compile(r"(\[X\d+\])")
_CHUNK_RE = re.compile(r'<chunk id="[^"]+" doc="([^"]*)"[^>/]*>\n(.*?)\n</chunk>', re.S)
_EDGE = ".,;:!?()[]{}\"'`"


def clue_pattern(clue: str) -> re.Pattern[str]:
    """A regex matching a clue's quote in raw chunk text: words in order, any whitespace or pydoc gutter.

    Each ``[Xk]`` captures the longest run of characters without whitespace or gutter that fits, so ids with
    ``-``, ``:``, ``+`` or ``/`` are captured whole.
    """
    parts = []
    for word in clue.split():
        pieces = _MASK_RE.split(word)
        parts.append("".join(r"([^\s|]+)" if _MASK_RE.fullmatch(p) else re.escape(p) for p in pieces if p))
    return re.compile(r"[\s|]+".join(parts))


def _key(doc_or_term: str) -> str:
    """The form terms and document ids are compared in (case and ``-_.`` separators ignored, edges trimmed)."""
    return re.sub(r"[-_.]+", "-", doc_or_term.strip(_EDGE).casefold())


def chunk_blocks(text: str) -> list[tuple[str, str]]:
    """(doc id, text) of every unpruned chunk block in ``text``."""
    return [(m.group(1), m.group(2)) for m in _CHUNK_RE.finditer(text)]


def resolve_chain(patterns: list[re.Pattern[str]], blocks: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """For each clue, the (document, captured term) matches consistent with the chain of bridges."""
    candidates = []
    for pattern in patterns:
        found = {}
        for doc, text in blocks:
            for match in pattern.finditer(text):
                found[(doc, match.group(match.lastindex or 0))] = None
        candidates.append(list(found))
    # Backward: a clue's term must name a document some match of the next clue is in.
    for k in range(len(candidates) - 2, -1, -1):
        docs_next = {_key(d) for d, _ in candidates[k + 1]}
        if docs_next:
            candidates[k] = [(d, t) for d, t in candidates[k] if _key(t) in docs_next]
    # Forward: a later clue's match must be in the document the previous term names.
    for k in range(1, len(candidates)):
        named = {_key(t) for _, t in candidates[k - 1]}
        if named:
            candidates[k] = [(d, t) for d, t in candidates[k] if _key(d) in named]
    return candidates


def expert_rule(messages: list[Message], tools: list[dict[str, Any]] | None, *, grep: bool = True) -> str:
    """Turn 1: (with ``grep``, grep every quoted clue's exact passage, then) search every clue. Then read bridged
    documents not yet seen (once). Then answer. The greps come first: a turn's calls run in the order written and
    share the token room, so the exact passages claim it before broader searches fill what is left."""
    question = next(m.content for m in messages if m.role == "user")
    clues = CLUE_RE.findall(question)
    patterns = [clue_pattern(c) for c in clues]
    turns = sum(m.role == "assistant" for m in messages)
    if turns == 0:
        calls = [format_tool_call("grep_corpus", {"pattern": p.pattern}) for p in patterns] if grep else []
        calls += [format_tool_call("search_corpus", {"query": c}) for c in clues]
        return "\n".join(calls)
    shown = "\n".join(m.content for m in messages if m.role == "tool")
    blocks = chunk_blocks(shown)
    chain = resolve_chain(patterns, blocks)
    if turns == 1:  # a hop no search returned: read the document the previous clue names
        missing = [t.strip(_EDGE) for k in range(1, len(chain)) if not chain[k] for _, t in chain[k - 1]]
        if missing:
            return "\n".join(format_tool_call("read_document", {"doc_id": t}) for t in dict.fromkeys(missing))
    docs = [d for matches in chain for d, _ in matches]
    answers = [t.strip(_EDGE) for _, t in chain[-1]] if chain else []
    answer = answers[0] if answers else "unknown"
    return f"ANSWER: {answer}\nDOCUMENTS: {', '.join(dict.fromkeys(docs))}"
