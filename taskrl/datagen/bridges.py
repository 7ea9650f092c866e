"""Bridges between documents: which document ids a text mentions, as whole id tokens, in linear time.

``BridgeIndex(doc_ids, normalisation, alias)`` maps each id's normalised form (``ID_NORMALISATIONS``: exact,
casefold, separators) to the id, and, by the ``alias`` rule (``id_alias_rule``), the bare name a namespaced id
is written as in text (``deb:libssl3`` mentioned as ``libssl3``); ``mentioned(text)`` tokenises the text into
maximal runs of id characters and looks each up, so ``a-b`` never matches inside ``a-b-c`` and indexing 20k
documents is one pass over their sentences (``benchmarks/datagen_bench.py``). Used by ``taskrl datagen
multihop`` to chain hops.
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


ID_ALIAS_RULES = ("prefix", "none")
"""Named alias rules: ``prefix`` (an id ``prefix:name`` is also named by its bare ``name``, the default of
``taskrl datagen multihop``), ``none`` (ids only). Any other rule is a regular expression that fully matches an
id and whose one group is the id's alias, e.g. ``^deb:(.+)$`` or ``^pypi/(.+)$``."""
PREFIX_ALIAS_RE = r"[A-Za-z][\w.+-]*:([^:]+)"
"""The ``prefix`` rule: a letter-led namespace, one colon, the bare name."""
MIN_ALIAS_CHARS = 3
"""A shorter alias ("x" of ``pkg:x``) would match ordinary words and letters: it is not used."""


def id_alias_rule(rule: str) -> Callable[[str], str | None]:
    """The function that maps a document id to its alias (the bare name it is written as in text), or None."""
    if rule == "none":
        return lambda doc_id: None
    try:
        pattern = re.compile(PREFIX_ALIAS_RE if rule == "prefix" else rule)
    except re.error as e:
        raise ValueError(
            f"id alias rule must be {' or '.join(ID_ALIAS_RULES)} or a regular expression with one group, "
            f"got {rule!r} ({e})"
        ) from None
    if pattern.groups != 1:
        raise ValueError(
            f"id alias rule {rule!r} must have exactly one group (the alias), e.g. '^deb:(.+)$', "
            f"it has {pattern.groups}"
        )

    def alias(doc_id: str) -> str | None:
        match = pattern.fullmatch(doc_id)
        name = match.group(1) if match else None
        if not name or name == doc_id or len(name) < MIN_ALIAS_CHARS or not ID_TOKEN_RE.fullmatch(name):
            return None
        return name

    return alias


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
    bridge; ``ambiguous`` lists them so the report can say so. An alias (``alias`` rule, see ``id_alias_rule``)
    names its document unless it is some document's own id (the id wins) or the alias of several (ambiguous).
    """

    def __init__(self, doc_ids: Iterable[str], normalisation: str = "casefold", alias: str = "none") -> None:
        self.normalisation = normalisation
        self.alias_rule = alias
        self.normalise = id_normaliser(normalisation)
        alias_of = id_alias_rule(alias)
        doc_ids = list(doc_ids)
        by_key: dict[str, str] = {}
        ambiguous: set[str] = set()
        for doc_id in doc_ids:
            key = self.normalise(doc_id)
            if by_key.setdefault(key, doc_id) != doc_id:
                ambiguous.add(key)
        by_alias: dict[str, str] = {}
        for doc_id in doc_ids:
            name = alias_of(doc_id)
            key = self.normalise(name) if name is not None else None
            if key is None or key in by_key or key in ambiguous:
                continue
            if by_alias.setdefault(key, doc_id) != doc_id:
                ambiguous.add(key)
        for key in ambiguous:
            by_key.pop(key, None)
            by_alias.pop(key, None)
        self.aliases = len(by_alias)
        """Documents that text may name by their alias."""
        self.by_key = {**by_alias, **by_key}
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
