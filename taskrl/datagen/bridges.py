"""Bridges between documents: which document ids a text mentions, as whole id tokens, in linear time.

``BridgeIndex(doc_ids, normalisation)`` maps each id's normalised form (``ID_NORMALISATIONS``: exact, casefold,
separators) to the id; ``mentioned(text)`` tokenises the text into maximal runs of id characters and looks each
up, so ``a-b`` never matches inside ``a-b-c`` and indexing 20k documents is one pass over their sentences
(``benchmarks/datagen_bench.py``). Used by ``taskrl datagen multihop`` to chain hops.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

MASK = "[X{}]"
ID_TOKEN_RE = re.compile(r"[\w.:/+\-@~=]+")
"""A maximal run of document-id characters: the unit bridges are matched in (exact tokens, never substrings)."""
TOKEN_EDGE = ".:/-,"
"""Sentence punctuation that may cling to an id token ("see pkg:a-b." names ``pkg:a-b``)."""
ID_NORMALISATIONS = ("exact", "casefold", "separators")
"""How an id token in text is compared with document ids: as is, case-insensitively, or also with every run of
``-``, ``_`` and ``.`` treated as one separator (PEP 503-style, ``Foo_Bar`` names ``foo-bar``)."""


def id_normaliser(mode: str) -> Callable[[str], str]:
    """The function that maps an id (or a token of text) to the form bridges are compared in."""
    if mode == "exact":
        return str
    if mode == "casefold":
        return str.casefold
    if mode == "separators":
        return lambda text: re.sub(r"[-_.]+", "-", text.casefold())
    raise ValueError(f"id normalisation must be one of {', '.join(ID_NORMALISATIONS)}, got {mode!r}")


def _token_variants(token: str) -> list[str]:
    """The token, then without clinging punctuation at the end, then at both ends (first that names an id wins)."""
    return list(dict.fromkeys(v for v in (token, token.rstrip(TOKEN_EDGE), token.strip(TOKEN_EDGE)) if v))


class BridgeIndex:
    """Document ids by normalised form: which ids a text mentions as whole tokens, in time linear in the text.

    Ids that collide after normalisation (``a_b`` and ``a-b`` under ``separators``) are ambiguous and never
    bridge; ``ambiguous`` lists them so the report can say so.
    """

    def __init__(self, doc_ids: Iterable[str], normalisation: str = "casefold") -> None:
        self.normalisation = normalisation
        self.normalise = id_normaliser(normalisation)
        by_key: dict[str, str] = {}
        ambiguous: set[str] = set()
        for doc_id in doc_ids:
            key = self.normalise(doc_id)
            if by_key.setdefault(key, doc_id) != doc_id:
                ambiguous.add(key)
        for key in ambiguous:
            del by_key[key]
        self.by_key = by_key
        self.ambiguous = sorted(ambiguous)

    def resolve(self, token: str) -> str | None:
        """The document a token of text names, or None."""
        doc_id = self.by_key.get(self.normalise(token))
        if doc_id is not None or not (token[:1] in TOKEN_EDGE or token[-1:] in TOKEN_EDGE):
            return doc_id
        for variant in _token_variants(token)[1:]:
            doc_id = self.by_key.get(self.normalise(variant))
            if doc_id is not None:
                return doc_id
        return None

    def spans(self, text: str) -> Iterator[tuple[int, int, str]]:
        """``(start, end, doc_id)`` of every id token in ``text`` (the span covers the id, not its punctuation)."""
        by_key, normalise = self.by_key, self.normalise
        for match in ID_TOKEN_RE.finditer(text):
            token = match.group()
            doc_id = by_key.get(normalise(token))
            if doc_id is not None:  # the common case: no punctuation clings to the token
                yield match.start(), match.end(), doc_id
                continue
            if not (token[0] in TOKEN_EDGE or token[-1] in TOKEN_EDGE):
                continue
            for variant in _token_variants(token)[1:]:
                doc_id = by_key.get(normalise(variant))
                if doc_id is not None:
                    start = match.start() + token.index(variant)
                    yield start, start + len(variant), doc_id
                    break

    def mentioned(self, text: str) -> set[str]:
        return {doc_id for _, _, doc_id in self.spans(text)}

    def mask(self, text: str, doc_id: str, index: int) -> str:
        """``text`` with every whole-token mention of ``doc_id`` replaced by ``[X{index}]``."""
        out, last = [], 0
        for start, end, found in self.spans(text):
            if found == doc_id:
                out += [text[last:start], MASK.format(index)]
                last = end
        return "".join(out) + text[last:]

    def mentions(self, sentences: dict[str, list[str]]) -> dict[str, list[tuple[str, str]]]:
        """For each document, the ``(source document, sentence)`` pairs of other documents that mention it."""
        found: dict[str, list[tuple[str, str]]] = {}
        for source, texts in sentences.items():
            for sentence in dict.fromkeys(texts):
                for target in sorted(self.mentioned(sentence) - {source}):
                    found.setdefault(target, []).append((source, sentence))
        return found
