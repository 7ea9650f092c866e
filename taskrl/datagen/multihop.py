"""Verified multi-hop search tasks over a corpus, in Chroma's order (docs/design/index.md §9).

Gather documents -> extract a clue (a quoted sentence with one term masked), question and answer -> verify
(the quote is string-matched in the stored chunks; the answer is in the quote, not in the question) -> add
distractors (chunks that look relevant, verified not to contain the answer) -> chain 2-3 hops (a clue's
masked term is the id of the next hop's document, found as a whole id token through an inverted index of
normalised ids: ``BridgeIndex``; ``a-b`` never matches inside ``a-b-c``) -> re-verify the whole task. A task
that fails any check is dropped and counted by reason, never kept. Generators: ``ExtractiveGenerator``
(deterministic rules, CPU, no model) and ``LLMGenerator`` (any Policy proposes question/answer/quote; the same
verification applies).
Output: ``Task`` JSONL; ``info["facts"][i]["chunk_ids"]`` is the ground truth for recall, ``difficulty`` = hops.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from taskrl.datagen.bridges import ID_NORMALISATIONS, ID_TOKEN_RE, MASK, TOKEN_EDGE, BridgeIndex, id_alias_rule
from taskrl.envs.search.corpus import Chunk, doc_id_of
from taskrl.envs.search.store import CorpusStore
from taskrl.moved import moved_names
from taskrl.policies.base import Policy, SamplingParams
from taskrl.types import Message, Task
from taskrl.validate import at_least, require

_TERM_RE = re.compile(r"(?<![\w.])[A-Za-z_][A-Za-z0-9_]{4,}(?![\w])")
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"'(])")
_GUTTER_RE = re.compile(r"(?m)^[ \t]*\|")
# pydoc section headers glue onto the next sentence ("FUNCTIONS dump(obj, fp) ..."): such sentences are skipped.
_HEADER_RE = re.compile(
    r"\b(?:NAME|DESCRIPTION|FUNCTIONS|CLASSES|DATA|FILE|VERSION|AUTHOR|SUBMODULES|CONTENTS)\b"
    r"|Method resolution order|(?:[Mm]ethods|[Dd]escriptors|[Aa]ttributes) (?:defined here|inherited from)"
)
_COMMON_WORDS = (
    "about above after again against because before being below between both could doing during each further "
    "having other should their there these those through under until where which while would return returns "
    "value values object objects string strings function functions default argument arguments otherwise "
    "given using first second number instead always never called method methods class classes module "
    "modules never false true none error errors raise raised following example specified optional"
)
_COMMON = frozenset(_COMMON_WORDS.split())
def normalize(text: str) -> str:
    """Whitespace collapsed and pydoc's ``|`` class gutter removed: the form quotes are matched in."""
    return " ".join(_GUTTER_RE.sub(" ", text).split())


def contains_term(text: str, term: str) -> bool:
    """Whole-word, case-insensitive occurrence of ``term`` in ``text``."""
    return re.search(rf"(?<![\w]){re.escape(term)}(?![\w])", text, re.I) is not None


def mask_term(quote: str, term: str, index: int) -> str:
    return re.sub(rf"(?<![\w]){re.escape(term)}(?![\w])", MASK.format(index), quote, flags=re.I)


@dataclass
class GenerationConfig:
    """How many tasks, of which difficulty, and how strict the extraction is."""

    n: int = 64
    """Tasks to keep."""
    seed: int = 0
    """Seed of every random choice: the same corpus and config give the same tasks."""
    hops: tuple[int, ...] = (1, 2, 3)
    """Difficulties to cycle through (hops per task, 1-3)."""
    distractors: int = 3
    """Distractor chunks to attach per task (verified not to contain the answer)."""
    max_answer_df: int = 2
    """An answer term may occur in at most this many documents (rare terms make unambiguous answers)."""
    min_words: int = 6
    """Shortest quoted sentence, in words."""
    max_words: int = 40
    """Longest quoted sentence, in words."""
    max_attempts: int = 50
    """Attempts per requested task before giving up (the report says how many were dropped and why)."""
    id_normalisation: str = "casefold"
    """How id tokens in text are matched to document ids: exact, casefold or separators (see ID_NORMALISATIONS)."""
    id_alias: str = "prefix"
    """How text names a namespaced id: ``prefix`` (``deb:libssl3`` also as bare ``libssl3``), ``none``, or a
    regular expression with one group that fully matches an id, the group being its alias (``ID_ALIAS_RULES``)."""

    def __post_init__(self) -> None:
        try:
            id_alias_rule(self.id_alias)
        except ValueError as e:
            raise ValueError(f"GenerationConfig.id_alias: {e}") from None
        if self.id_normalisation not in ID_NORMALISATIONS:
            raise ValueError(
                f"GenerationConfig.id_normalisation must be one of {', '.join(ID_NORMALISATIONS)}, "
                f"got {self.id_normalisation!r}"
            )
        if self.n < 1:
            raise ValueError(f"GenerationConfig.n must be >= 1, got {self.n}")
        if not self.hops or any(h not in (1, 2, 3) for h in self.hops):
            raise ValueError(f"GenerationConfig.hops must be a non-empty tuple of 1, 2 or 3, got {self.hops}")
        if self.min_words < 3 or self.max_words < self.min_words:
            raise ValueError(
                f"GenerationConfig needs 3 <= min_words <= max_words, got {self.min_words}, {self.max_words}"
            )
        require("GenerationConfig", "must be >= 0", at_least(0), distractors=self.distractors)
        require("GenerationConfig", "must be >= 1", at_least(1), max_answer_df=self.max_answer_df,
                max_attempts=self.max_attempts)  # fmt: skip


@dataclass
class Fact:
    """One hop: a quote from ``doc_id`` whose ``term`` is masked in the clue."""

    doc_id: str
    quote: str
    term: str
    chunk_ids: list[str] = field(default_factory=list)
    """Every stored chunk containing the quote (the ground truth for recall of this fact)."""
    question: str | None = None
    """An LLM-written question for this hop (the last hop only); None for extractive clues."""


@dataclass
class GenerationReport:
    """Kept and dropped counts; ``dropped`` maps a verification failure to how often it happened."""

    requested: int
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)
    id_normalisation: str = "casefold"
    """How bridge ids were matched (GenerationConfig.id_normalisation)."""
    bridge_sources: int = 0
    """(document, sentence) pairs that mention another document: the raw material of multi-hop chains."""
    ambiguous_ids: list[str] = field(default_factory=list)
    """Normalised ids (or aliases) shared by several documents (they never bridge); a stricter rule keeps them."""
    id_alias: str = "none"
    """How bare mentions were bridged to namespaced ids (GenerationConfig.id_alias)."""
    aliased_ids: int = 0
    """Documents that text may name by their alias (e.g. ``deb:libssl3`` as ``libssl3``)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "requested": self.requested, "kept": self.kept, "dropped": dict(sorted(self.dropped.items())),
            "id_normalisation": self.id_normalisation, "id_alias": self.id_alias, "aliased_ids": self.aliased_ids,
            "bridge_sources": self.bridge_sources, "ambiguous_ids": self.ambiguous_ids[:20],
        }  # fmt: skip


# -- verification ---------------------------------------------------------------------------------------
def supporting_chunks(quote: str, chunks: Iterable[Chunk]) -> list[str]:
    """Ids of the chunks whose normalised text contains the normalised quote."""
    needle = normalize(quote)
    return [c.id for c in chunks if needle and needle in normalize(c.text)]


def verify_fact(fact: Fact, store: CorpusStore, bridges: BridgeIndex | None = None) -> str | None:
    """Why this hop is not supported by the corpus, or None. Fills ``fact.chunk_ids`` from the store.

    With ``bridges``, the fact is a bridge hop: its term is a document id, which must occur as a whole id token.
    """
    if bridges is not None:
        if fact.term not in bridges.mentioned(fact.quote):
            return "term_not_in_quote"
    elif not contains_term(fact.quote, fact.term):
        return "term_not_in_quote"
    in_doc = supporting_chunks(fact.quote, store.document_chunks(fact.doc_id))
    if not in_doc:
        return "quote_not_in_document"
    # The same sentence may sit in other chunks too (repeated docstrings): each of them supports the fact.
    elsewhere = store.chunks(i for i, _ in store.lexical(fact.quote, 20))
    fact.chunk_ids = sorted(set(in_doc) | set(supporting_chunks(fact.quote, elsewhere.values())))
    return None


def render_prompt(facts: Sequence[Fact], bridges: BridgeIndex | None = None) -> str:
    """The question the model sees: one clue per hop; each masked term names the next hop's document.

    Bridge ids (and their aliases) are masked as whole id tokens in every clue (``bridges``; casefold matching
    when None), so a later clue that names its own document does not give the hop away; answers as words.
    """
    bridges = bridges or BridgeIndex([f.term for f in facts[:-1]])
    lines = ["Find the documents that answer this question, then answer it."]
    for i, fact in enumerate(facts, 1):
        where = f" (this passage is in the document whose id is {MASK.format(i - 1)})" if i > 1 else ""
        masked = normalize(fact.quote)
        if i == len(facts):
            masked = mask_term(masked, fact.term, i)
        for j, bridge in enumerate(facts[:-1], 1):  # a document never names itself in its own clue: [Xj] stays hidden
            masked = bridges.mask(masked, bridge.term, j)
        if fact.question is not None:
            lines.append(f"Clue {i}{where}: {fact.question}")
        else:
            lines.append(f'Clue {i}{where}: "{masked}"')
    last = facts[-1]
    lines.append("Question: " + (last.question or f"what is {MASK.format(len(facts))}?"))
    return "\n".join(lines)


def gold_output(answer: str, doc_ids: Sequence[str]) -> str:
    """The final answer a perfect search agent gives (the env's answer format)."""
    return f"ANSWER: {answer}\nDOCUMENTS: {', '.join(dict.fromkeys(doc_ids))}"


def verify_task(task: Task, store: CorpusStore) -> list[str]:
    """Re-verify a finished task against the store; an empty list means it may be kept."""
    info = task.info
    problems = []
    facts = info.get("facts") or []
    answer = str(info.get("answer", ""))
    if not facts or info.get("difficulty") != len(facts):
        problems.append("difficulty_mismatch")
    if len({f["doc_id"] for f in facts}) != len(facts):
        problems.append("repeated_document")
    for i, fact in enumerate(facts):
        chunks = store.chunks(fact["chunk_ids"])
        if not fact["chunk_ids"] or len(chunks) != len(fact["chunk_ids"]):
            problems.append(f"fact_{i}_unknown_chunk")
        elif set(supporting_chunks(fact["quote"], chunks.values())) != set(fact["chunk_ids"]):
            problems.append(f"fact_{i}_quote_not_in_chunk")
        elif fact["doc_id"] not in {doc_id_of(c) for c in fact["chunk_ids"]}:
            problems.append(f"fact_{i}_quote_not_in_document")
        if i + 1 < len(facts) and (
            fact["term"] != facts[i + 1]["doc_id"]
            or fact["term"]
            not in BridgeIndex(
                [fact["term"]], info.get("id_normalisation", "casefold"), info.get("id_alias", "none")
            ).mentioned(fact["quote"])
        ):
            problems.append(f"fact_{i}_bridge_mismatch")
    if not answer or contains_term(task.prompt, answer):
        problems.append("answer_in_question")
    answer_chunks = store.chunks(info.get("answer_chunk_ids") or [])
    if not answer_chunks or not all(contains_term(normalize(c.text), answer) for c in answer_chunks.values()):
        problems.append("answer_not_in_answer_chunks")
    for chunk in store.chunks(info.get("distractor_chunk_ids") or []).values():
        if contains_term(normalize(chunk.text), answer):
            problems.append("distractor_contains_answer")
    return problems


# -- extraction -----------------------------------------------------------------------------------------
def _sentences(chunk: Chunk, config: GenerationConfig) -> list[str]:
    out = []
    for sentence in _SENTENCE_SPLIT_RE.split(normalize(chunk.text)):
        words = sentence.split()
        if _HEADER_RE.search(sentence) or '"' in sentence or sentence[-1:] not in ".!?":
            continue
        if config.min_words <= len(words) <= config.max_words:
            out.append(sentence)
    return out


class _CorpusIndex:
    """Sentences per document, document frequency of terms, and which sentences mention which document."""

    def __init__(self, store: CorpusStore, config: GenerationConfig) -> None:
        self.doc_ids = store.document_ids()
        self.bridges = BridgeIndex(self.doc_ids, config.id_normalisation, config.id_alias)
        self.sentences: dict[str, list[str]] = {d: [] for d in self.doc_ids}
        doc_terms: dict[str, set[str]] = {d: set() for d in self.doc_ids}
        for chunk in store.iter_chunks():
            self.sentences[chunk.doc_id].extend(_sentences(chunk, config))
            doc_terms[chunk.doc_id].update(t.lower() for t in _TERM_RE.findall(chunk.text))
        self.df = Counter(t for terms in doc_terms.values() for t in terms)
        self.mentions = self.bridges.mentions(self.sentences)

    def answer_terms(self, doc_id: str, sentence: str, config: GenerationConfig) -> list[str]:
        """Rare words of ``sentence`` that are whole tokens (not part of an id such as ``pkg:word-x``)."""
        terms = []
        whole = {m.group().strip(TOKEN_EDGE) for m in ID_TOKEN_RE.finditer(sentence)}
        for term in dict.fromkeys(_TERM_RE.findall(sentence)):
            low = term.lower()
            if term not in whole or low in _COMMON or self.bridges.resolve(term) or self.df[low] > config.max_answer_df:
                continue
            if len(re.findall(rf"(?<![\w]){re.escape(term)}(?![\w])", sentence, re.I)) == 1:
                terms.append(term)
        return terms


class ExtractiveGenerator:
    """Deterministic multi-hop tasks from a store, with no model: masked-term clues chained by document ids."""

    name = "extractive"

    def __init__(self, store: CorpusStore, config: GenerationConfig | None = None) -> None:
        self.store = store
        self.config = config or GenerationConfig()
        self.rng = random.Random(self.config.seed)
        self._index: _CorpusIndex | None = None
        self._kept_quotes: set[str] = set()

    @property
    def index(self) -> _CorpusIndex:
        if self._index is None:
            self._index = _CorpusIndex(self.store, self.config)
        return self._index

    def propose_final(self) -> Fact | None:
        """A last hop: a sentence of a random document with one rare term masked."""
        doc_id = self.rng.choice(self.index.doc_ids)
        sentences = self.index.sentences[doc_id]
        if not sentences:
            return None
        sentence = self.rng.choice(sentences)
        terms = self.index.answer_terms(doc_id, sentence, self.config)
        return Fact(doc_id, sentence, self.rng.choice(terms)) if terms else None

    def chain(self, final: Fact, hops: int) -> list[Fact] | None:
        """Prepend bridge hops: a sentence of another document that mentions the next hop's document id."""
        facts = [final]
        while len(facts) < hops:
            target = facts[0].doc_id
            used = {f.doc_id for f in facts}
            options = [(d, s) for d, s in self.index.mentions.get(target, ()) if d not in used]
            if not options:
                return None
            source, sentence = self.rng.choice(options)
            facts.insert(0, Fact(source, sentence, target))
        return facts

    def distractors(self, facts: Sequence[Fact], answer: str, report: GenerationReport) -> list[str]:
        """Chunks BM25 ranks high for the clues that are not supporting and do not contain the answer."""
        supporting = {c for f in facts for c in f.chunk_ids}
        query = " ".join(mask_term(normalize(f.quote), f.term, 0) for f in facts)
        candidates = [i for i, _ in self.store.lexical(query, 10 * (self.config.distractors + len(supporting)))]
        kept: list[str] = []
        for chunk in self.store.chunks(c for c in candidates if c not in supporting).values():
            if len(kept) >= self.config.distractors:
                break
            if contains_term(normalize(chunk.text), answer):
                report.dropped["distractor_contains_answer"] += 1  # the distractor is dropped, not the task
                continue
            kept.append(chunk.id)
        return kept

    def assemble(self, facts: list[Fact], report: GenerationReport, task_id: str) -> Task | None:
        """Verify every hop, attach distractors, re-verify the whole task; None (counted) on any failure."""
        for i, fact in enumerate(facts):
            problem = verify_fact(fact, self.store, self.index.bridges if i + 1 < len(facts) else None)
            if problem is not None:
                report.dropped[problem] += 1
                return None
        answer = facts[-1].term
        prompt = render_prompt(facts, self.index.bridges)
        info = {
            "answer": answer,
            "difficulty": len(facts),
            "id_normalisation": self.config.id_normalisation,
            "id_alias": self.config.id_alias,
            "facts": [asdict(f) for f in facts],
            "answer_chunk_ids": list(facts[-1].chunk_ids),
            "distractor_chunk_ids": self.distractors(facts, answer, report),
            "generator": self.name,
        }
        task = Task(task_id, prompt, gold_output(answer, [f.doc_id for f in facts]), info)
        problems = verify_task(task, self.store)
        if problems:
            report.dropped.update(problems)
            return None
        return task

    def hops_for(self, kept: int) -> int:
        return self.config.hops[kept % len(self.config.hops)]

    def attempt(self, final: Fact | None, hops: int, index: int, report: GenerationReport) -> Task | None:
        """Chain, verify and assemble one task from a proposed last hop; None (counted) when it fails."""
        if final is None:
            report.dropped["no_answer_term"] += 1
            return None
        if final.quote in self._kept_quotes:
            report.dropped["duplicate"] += 1
            return None
        facts = self.chain(final, hops)
        if facts is None:
            report.dropped["no_bridge"] += 1
            return None
        task = self.assemble(facts, report, f"{self.name}-{self.config.seed}-{index}")
        if task is not None:
            self._kept_quotes.add(final.quote)
        return task

    def new_report(self) -> GenerationReport:
        bridge_sources = sum(len(v) for v in self.index.mentions.values())
        return GenerationReport(
            self.config.n, id_normalisation=self.config.id_normalisation, bridge_sources=bridge_sources,
            ambiguous_ids=self.index.bridges.ambiguous, id_alias=self.config.id_alias,
            aliased_ids=self.index.bridges.aliases,
        )  # fmt: skip

    def generate(self) -> tuple[list[Task], GenerationReport]:
        """Up to ``config.n`` verified tasks, cycling through ``config.hops``; the report counts the rest."""
        report, tasks = self.new_report(), []
        for index in range(self.config.n * self.config.max_attempts):
            if len(tasks) >= self.config.n:
                break
            task = self.attempt(self.propose_final(), self.hops_for(len(tasks)), index, report)
            if task is not None:
                tasks.append(task)
        report.kept = len(tasks)
        return tasks, report


LLM_PROMPT = """\
You write questions for a search engine test. Read the passage. Choose one sentence of it and copy it \
exactly as "quote". Choose "answer": a word or short name that appears in that sentence. Write "question": \
a question that the sentence answers, without the answer in it. Reply with JSON only:
{"question": "...", "answer": "...", "quote": "..."}"""
_JSON_RE = re.compile(r"\{.*\}", re.S)


class LLMGenerator(ExtractiveGenerator):
    """Any Policy (e.g. OpenAIPolicy) writes the last hop's question, answer and quote from a chunk.

    Its proposal goes through the same verification as extractive facts (the quote must be in the document,
    the answer in the quote and not in the question); bridges to earlier hops are extractive.
    """

    name = "llm"

    def __init__(self, store: CorpusStore, policy: Policy, config: GenerationConfig | None = None) -> None:
        super().__init__(store, config)
        self.policy = policy

    async def apropose_final(self, report: GenerationReport) -> Fact | None:
        doc_id = self.rng.choice(self.index.doc_ids)
        chunk = self.rng.choice(self.store.document_chunks(doc_id))
        completion = await self.policy.generate(
            messages=[Message("system", LLM_PROMPT), Message("user", chunk.text)],
            tools=None,
            sampling=SamplingParams(max_new_tokens=384, temperature=0.7, seed=self.rng.randrange(1 << 31)),
        )
        match = _JSON_RE.search(completion.text)
        try:
            row = json.loads(match.group(0)) if match else None
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict) or not all(
            isinstance(row.get(k), str) and row[k] for k in ("question", "answer", "quote")
        ):
            report.dropped["unparseable_proposal"] += 1
            return None
        return Fact(doc_id, row["quote"], row["answer"].strip(), question=row["question"].strip())

    async def agenerate(self) -> tuple[list[Task], GenerationReport]:
        """Like ``generate``, with the policy proposing every last hop."""
        report, tasks = self.new_report(), []
        for index in range(self.config.n * self.config.max_attempts):
            if len(tasks) >= self.config.n:
                break
            final = await self.apropose_final(report)
            if final is None:
                continue
            task = self.attempt(final, self.hops_for(len(tasks)), index, report)
            if task is not None:
                tasks.append(task)
        report.kept = len(tasks)
        return tasks, report


class TooFewTasksError(ValueError):
    """Generation kept fewer tasks than ``--min-yield`` (or ``--strict``) demands (printed as one line, exit 2)."""


DEFAULT_MIN_YIELD = 0.5
"""``taskrl datagen multihop`` fails (exit 2, nothing written) when it keeps fewer than this share of ``--n``."""


def shortfall_hint(report: GenerationReport, hops: Sequence[int]) -> str:
    """What to change when few tasks were kept, from what the report saw."""
    if report.bridge_sources == 0 and any(h > 1 for h in hops):
        return (
            "no sentence names another document by its id, so no hop can chain: if the text names documents "
            "differently from their ids (bare 'libssl3' for 'deb:libssl3'), set --id-alias to a regular expression "
            "whose group is the bare name (e.g. '^deb:(.+)$'), or try --id-normalisation separators or --hops 1"
        )
    return "try other --hops, a larger corpus, --id-alias or --id-normalisation separators"


__getattr__ = moved_names(__name__, {"read_tasks": "taskrl.types", "write_tasks": "taskrl.types",
                                     "multihop_command": "taskrl.commands.datagen"})  # fmt: skip
