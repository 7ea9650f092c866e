"""The Context-1 search env: four tools over a real corpus, token budgets, pruning, and the F-beta reward.

``SearchEnv(SearchEnvConfig(...))`` or ``make("search", corpus=DIR, tasks=JSONL, ...)``. The model searches
(``search_corpus``, ``grep_corpus``, ``read_document``) and frees context (``prune_chunks``); every chunk is
shown once per episode. After every turn the last tool result ends with ``[Token usage: used/T]``; past T/2 a
training rollout gets a "prune or answer" note; past the hard limit every tool but ``prune_chunks`` is refused.
Pruned chunks become ``<chunk id=... pruned="true"/>`` in the model's view (a new Segment) but stay in
``Trajectory.messages`` and count for the reward. Final answer: ``ANSWER: ...`` and ``DOCUMENTS: id, id``; the
system prompt says what is scored (the ANSWER line only with ``reward.answer_weight > 0``).
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskrl.env import ToolEnv
from taskrl.envs.search.corpus import Chunk, doc_id_of
from taskrl.envs.search.expert import expert_rule
from taskrl.envs.search.reward import (
    PRUNE_TOOL,
    EpisodeRecord,
    GroundTruth,
    RewardConfig,
    check_field_types,
    episode_metrics,
)
from taskrl.envs.search.search import HybridSearcher, fit_budget
from taskrl.envs.search.store import CorpusStore
from taskrl.rewards.presets import ANSWER_LINE, PrunePenalty, TurnPenalty, context1
from taskrl.scoring import Rubric
from taskrl.tools import call_budget, tool
from taskrl.types import Message, Task, ToolCall, ToolResult, Trajectory

SYSTEM_PROMPT = """\
You are a search agent. Find every document needed to answer the user's question in a document corpus. You do \
not know the corpus: search it.

Tools:
- search_corpus(query): hybrid keyword + semantic search; returns the best new chunks.
- grep_corpus(pattern): regular-expression search over chunk text; returns up to 5 new chunks.
- read_document(doc_id): the most relevant unseen chunks of one document.
- prune_chunks(chunk_ids): remove chunks you no longer need from your context.
Results are chunks written <chunk id="DOC#N" doc="DOC">text</chunk>. A chunk is shown only once per task.
Decompose the question into sub-queries, search for each clue, and call several tools in one turn when \
they are independent.

Your context has a token budget; after every turn you see [Token usage: used/total]. Prune chunks that do not \
help before the budget fills: near the limit every tool except prune_chunks is refused.

When you are done, reply without a tool call, in exactly this format:
ANSWER: <the short answer, or unknown>
DOCUMENTS: <every document id that supports the answer, comma-separated>

How you are scored: {scoring}"""
SCORING_DOCUMENTS = (
    "the DOCUMENTS list (recall of the supporting documents counts most, listing documents that do not support "
    "the answer lowers precision; only the first {max_docs} listed can count) and how many supporting passages "
    "your searches found. The ANSWER line is not scored: write what the documents say, or unknown."
)
SCORING_WITH_ANSWER = (
    "the DOCUMENTS list (recall of the supporting documents counts most, listing documents that do not support "
    "the answer lowers precision; only the first {max_docs} listed can count), how many supporting passages your "
    "searches found, and the ANSWER line, which must be exactly the answer (one answer, not a list of guesses)."
)


def system_prompt(reward: RewardConfig) -> str:
    """The system prompt, saying exactly what the reward scores (the ANSWER line only when its term is on)."""
    scoring = SCORING_WITH_ANSWER if reward.answer_weight > 0 else SCORING_DOCUMENTS
    return SYSTEM_PROMPT.format(scoring=scoring.format(max_docs=reward.max_output_docs))


SOFT_NOTE = (
    "You have used {used:,} of your {total:,}-token budget. Prune the chunks that do not help "
    "(prune_chunks) or give your final answer."
)
HARD_LIMIT_ERROR = (
    "Refused: the context is at {used:,} of {total:,} tokens, past the hard limit of {limit:,}. "
    "Only prune_chunks works now: prune chunks you do not need, or give your final answer."
)
_DOCUMENTS_RE = re.compile(r"DOCUMENTS?\s*:\s*(.*)", re.I | re.S)
_ANSWER_RE = re.compile(r"^\s*ANSWER\s*:\s*(.*?)\s*$", re.I | re.M)
_CHUNK_BLOCK_RE = re.compile(r'<chunk id="([^"]+)" doc="([^"]*)"[^>/]*>\n.*?\n</chunk>', re.S)


class UnknownChunksError(ValueError):
    """prune_chunks got ids that were never shown in this episode."""


class UnknownDocumentError(KeyError):
    """read_document got a document id the corpus does not have."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class SearchEnvConfig:
    """Corpus, tasks, budgets and reward of the search env (defaults: Context-1 as in docs/design/index.md §6)."""

    corpus: str = "default"
    """Corpus directory from `taskrl corpus build`, or "default": the stdlib docs, built once into the cache by
    ``make("search")``."""
    tasks: str | None = None
    """Tasks JSONL from `taskrl datagen multihop`; None: the corpus directory's tasks.jsonl."""
    chroma_url: str | None = None
    """Chroma server URL when the corpus was built on one (else the embedded PersistentClient)."""
    context_budget: int | None = None
    """T, the context token budget; None: the rollout's max_context_tokens (reported via observe_context)."""
    per_call_budget: int = 1024
    """S, the most tokens one search_corpus or read_document result may hold."""
    soft_fraction: float = 0.5
    """Soft threshold as a share of T (the "prune or answer" note, training rollouts only)."""
    hard_fraction: float = 0.9
    """Hard limit as a share of T, in [0.5, 1]: beyond it only prune_chunks runs."""
    grep_limit: int = 5
    """Most chunks one grep_corpus call returns."""
    grep_budget_s: float = 10.0
    """Most seconds one grep_corpus scan may take over the whole corpus (a slow pattern is stopped, not left)."""
    test_every: int = 5
    """Every n-th task (by a stable hash of its id) is in the "test" split, the rest in "train"."""
    device: str = "auto"
    """Device of the query embedder: auto, cpu, cuda, cuda:1 ..."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Weights, penalties, floor and β schedule of the reward."""
    expert_grep: bool = True
    """The expert (scripted_rule) greps every clue besides searching it; False: search only (shorter demos)."""

    def __post_init__(self) -> None:
        if isinstance(self.reward, dict):  # from a YAML/JSON config (unknown keys: a TypeError naming them)
            self.reward = RewardConfig(**self.reward)
        if not isinstance(self.reward, RewardConfig):
            raise ValueError(f"SearchEnvConfig.reward must be a dict of RewardConfig fields, got {self.reward!r:.80}")
        check_field_types(self)
        if self.context_budget is not None and self.context_budget < 256:
            raise ValueError(f"SearchEnvConfig.context_budget must be >= 256 or None, got {self.context_budget}")
        if self.per_call_budget < 16:
            raise ValueError(f"SearchEnvConfig.per_call_budget must be >= 16, got {self.per_call_budget}")
        if not 0.5 <= self.hard_fraction <= 1.0:
            raise ValueError(f"SearchEnvConfig.hard_fraction must be in [0.5, 1], got {self.hard_fraction}")
        if not 0.0 < self.soft_fraction <= self.hard_fraction:
            raise ValueError(
                f"SearchEnvConfig.soft_fraction must be in (0, hard_fraction={self.hard_fraction}], "
                f"got {self.soft_fraction}"
            )
        if self.grep_limit < 1 or self.test_every < 2:
            raise ValueError("SearchEnvConfig.grep_limit must be >= 1 and test_every >= 2")
        if not 0 < self.grep_budget_s <= 600:
            raise ValueError(f"SearchEnvConfig.grep_budget_s must be in (0, 600] seconds, got {self.grep_budget_s}")

    @classmethod
    def seed_preset(cls, **overrides: Any) -> SearchEnvConfig:
        """The seed articles' thresholds: soft note at 90% of T, hard limit at 100%."""
        return cls(**{"soft_fraction": 0.9, "hard_fraction": 1.0, **overrides})


def context1_reward(config: RewardConfig) -> Rubric:
    """The search env's reward: the ``context1`` preset with ``config``'s weights, penalties, ε and β schedule
    (β linear from ``beta_start`` to ``beta_end`` over ``beta_anneal_epochs`` epochs)."""
    beta = {"kind": "linear", "start": config.beta_start, "end": config.beta_end, "steps": config.beta_anneal_epochs}
    return context1(
        beta=beta,
        epsilon=config.floor,
        f_beta_weight=config.f_beta_weight,
        trajectory_recall_weight=config.trajectory_recall_weight,
        answer_found_weight=config.answer_found_bonus,
        answer_weight=config.answer_weight,
        max_output_docs=config.max_output_docs,
        prune=PrunePenalty(PRUNE_TOOL, config.prune_penalty, config.prune_free_streak, config.prune_penalty_cap),
        turns=TurnPenalty(config.turn_penalty_start, config.turn_penalty_end, config.turn_penalty_max),
    )


@dataclass
class _Shared:
    """What every env on one corpus shares in a process: the store, searcher and tasks (never the reward: it
    has no state, and β is the scorer's, read at the clock of the batch it scores)."""

    store: CorpusStore
    searcher: HybridSearcher
    tasks: list[Task]


_SHARED: dict[tuple[Any, ...], _Shared] = {}
_SHARED_LOCK = threading.Lock()


def _shared(config: SearchEnvConfig) -> _Shared:
    from taskrl.envs.search.build import TASKS_FILE, default_corpus
    from taskrl.types import read_tasks

    default = config.corpus == "default"
    corpus = default_corpus() if default else Path(config.corpus).expanduser()
    key = (str(corpus.resolve()), config.tasks, config.chroma_url, config.device)
    with _SHARED_LOCK:
        if key not in _SHARED:
            store = CorpusStore(corpus, chroma_url=config.chroma_url, device=config.device)
            tasks_path = Path(config.tasks) if config.tasks else corpus / TASKS_FILE
            if not tasks_path.exists():
                raise FileNotFoundError(
                    f"no tasks at {tasks_path}; generate them with "
                    f"`taskrl datagen multihop --corpus {corpus} --n 64 --out {tasks_path}`"
                )
            _SHARED[key] = _Shared(store, HybridSearcher(store), read_tasks(tasks_path))
        return _SHARED[key]


def format_chunk(chunk: Chunk) -> str:
    text = chunk.text.replace("</chunk>", "</ chunk>")  # keep the block parseable for pruning
    return f'<chunk id="{chunk.id}" doc="{chunk.doc_id}" tokens="{chunk.tokens}">\n{text}\n</chunk>'


def prune_view(messages: list[Message], pruned: frozenset[str]) -> list[Message]:
    """The model's view with each pruned chunk's text replaced by a short marker (other text untouched)."""

    def mark(match: re.Match[str]) -> str:
        if match.group(1) not in pruned:
            return match.group(0)
        return f'<chunk id="{match.group(1)}" doc="{match.group(2)}" pruned="true"/>'

    return [
        Message(m.role, _CHUNK_BLOCK_RE.sub(mark, m.content), m.tool_calls, m.tool_call_id, m.name)
        if m.role == "tool" and "<chunk " in m.content
        else m
        for m in messages
    ]


def parse_answer(final_answer: str | None) -> str | None:
    """The text after the first ``ANSWER:`` line, or None when there is none."""
    match = _ANSWER_RE.search(final_answer or "")
    return match.group(1) if match else None


def parse_output_docs(final_answer: str | None) -> tuple[str, ...]:
    """Document ids listed after ``DOCUMENTS:`` (chunk ids count as their document), in order, deduplicated."""
    match = _DOCUMENTS_RE.search(final_answer or "")
    if not match:
        return ()
    ids = re.split(r"[\s,;]+", match.group(1).strip())
    return tuple(dict.fromkeys(doc_id_of(i.strip("`'\"[]().")) for i in ids if i.strip("`'\"[]().")))


class SearchEnv(ToolEnv):
    """Context-1 agentic search over a chromadb + bm25s corpus; one instance plays one episode at a time."""

    name = "search"
    system_prompt = system_prompt(RewardConfig())
    failure_reward = 0.0
    sequential_tools = True  # calls share the chunks shown and the token budget: in call order, not thread order

    def __init__(self, config: SearchEnvConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        self.config = config if config is not None else SearchEnvConfig(**overrides)
        self.system_prompt = system_prompt(self.config.reward)
        self._shared = _shared(self.config)
        self.store = self._shared.store
        self.searcher = self._shared.searcher
        self.rubric = context1_reward(self.config.reward)
        """The ``context1`` preset: its terms measure the episode (``reward``); ``taskrl.scoring.score`` weighs
        them, derives F_β at the batch's clock (β annealed by epoch) and applies the clamp (ε)."""
        self.training = True
        if not self.config.expert_grep:
            self.scripted_rule = functools.partial(expert_rule, grep=False)
        self._lock = threading.Lock()
        self._reset_state()

    def _reset_state(self) -> None:
        self.seen: dict[str, int] = {}
        """Chunk id -> tokens, for every chunk shown this episode (in order)."""
        self.pruned: set[str] = set()
        self._newly_pruned: list[str] = []
        self._claimed_this_step = 0
        self.used_tokens = 0
        self.peak_tokens = 0
        self.max_tokens: int | None = None
        self._soft_noted = False

    # -- contract -----------------------------------------------------------------------------------
    def tasks(self, split: str = "train") -> Sequence[Task]:
        def is_test(task: Task) -> bool:
            digest = hashlib.blake2b(task.id.encode(), digest_size=4).digest()
            return int.from_bytes(digest, "little") % self.config.test_every == 0

        return [t for t in self._shared.tasks if is_test(t) == (split == "test")]

    def reset(self, task: Task, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        self._reset_state()
        return super().reset(task, seed)

    def observe_context(self, used_tokens: int, max_tokens: int) -> None:
        self.used_tokens = used_tokens
        self.peak_tokens = max(self.peak_tokens, used_tokens)
        self.max_tokens = max_tokens

    @property
    def budget(self) -> int | None:
        """T: the configured context budget, else the rollout's context size (None before the first turn)."""
        return self.config.context_budget or self.max_tokens

    def _limit(self, fraction: float) -> int | None:
        return int(self.budget * fraction) if self.budget else None

    async def step(self, tool_calls: list[ToolCall]) -> tuple[list[ToolResult], bool, bool, dict[str, Any]]:
        hard = self._limit(self.config.hard_fraction)
        blocked = hard is not None and self.used_tokens >= hard
        allowed = [c for c in tool_calls if not blocked or c.name == PRUNE_TOOL]
        self._claimed_this_step = 0
        done = {r.call_id: r for r in await self.tools.execute(allowed)} if allowed else {}
        refusal = HARD_LIMIT_ERROR.format(used=self.used_tokens, total=self.budget or 0, limit=hard or 0)
        results = [done.get(c.id) or ToolResult(c.id, c.name, refusal, is_error=True) for c in tool_calls]
        info: dict[str, Any] = {}
        freed = sum(self.seen[i] for i in self._newly_pruned)
        if self._newly_pruned:
            info["context"] = functools.partial(prune_view, pruned=frozenset(self.pruned))
            self._newly_pruned = []
        if self.budget and results:
            added = sum(len(r.content) for r in results) // 4  # ~4 characters per token until the next turn
            estimate = max(self.used_tokens - freed + added, 0)
            last = results[-1]
            results[-1] = ToolResult(
                last.call_id, last.name, f"{last.content}\n\n[Token usage: {estimate:,}/{self.budget:,}]", last.is_error
            )
            soft = self._limit(self.config.soft_fraction) or 0
            if estimate < soft:
                self._soft_noted = False  # re-armed after pruning below the threshold
            elif self.training and not self._soft_noted:
                self._soft_noted = True
                info["append_messages"] = [Message("user", SOFT_NOTE.format(used=estimate, total=self.budget))]
        return results, False, False, info

    # -- tools --------------------------------------------------------------------------------------
    def _claim(self, chunks: list[Chunk]) -> list[Chunk]:
        """Mark chunks as shown, in order, while they fit; the authoritative budget check.

        Runs under the lock, so parallel calls of one turn neither show a chunk twice nor together overrun the
        room left before the hard limit (each call's own cut, ``_room``, was computed before the others claimed).
        """
        with self._lock:
            left = self._room()
            fresh = []
            for chunk in chunks:
                if chunk.id not in self.seen and chunk.tokens <= left:
                    fresh.append(chunk)
                    left -= chunk.tokens
                    self.seen[chunk.id] = chunk.tokens
                    self._claimed_this_step += chunk.tokens
        return fresh

    def _excluded(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self.seen)

    def _room(self) -> int:
        """Tokens a result may add: the per-call budget, and no more than is left before the hard limit once
        the results other calls of this turn already claimed are counted."""
        hard = self._limit(self.config.hard_fraction)
        room = self.config.per_call_budget
        if hard is None:
            return room
        return min(room, max(hard - self.used_tokens - self._claimed_this_step, 0))

    @staticmethod
    def _render(chunks: list[Chunk], none: str) -> str:
        return "\n".join(format_chunk(c) for c in chunks) if chunks else none

    @tool(timeout_s=60)
    def search_corpus(self, query: str) -> str:
        """Search the corpus with keywords and meaning (hybrid BM25 + dense, reranked) for relevant chunks.

        Args:
            query: what to look for: keywords, a phrase from a clue, or a question.
        """
        excluded = self._excluded()
        found = self.searcher.search(query, exclude=excluded, budget=self._room())
        return self._render(self._claim(found.chunks), f"No new chunks match ({len(excluded)} already shown).")

    @tool(timeout_s=60)
    def grep_corpus(self, pattern: str) -> str:
        """Find chunks whose text matches a regular expression (Python syntax); at most 5 new chunks.

        Args:
            pattern: a regular expression, e.g. "dump\\w*\\(" or "(?i)json decoder".
        """
        budget = call_budget()  # the tool call's deadline and stop flag: a timed-out grep ends its scan
        found = self.store.grep(
            pattern,
            exclude=self._excluded(),
            limit=self.config.grep_limit,
            budget_s=min(self.config.grep_budget_s, budget.remaining()) if budget else self.config.grep_budget_s,
            should_stop=(lambda: budget.stopped) if budget else None,
        )
        kept, skipped = fit_budget(found, self._room())
        note = f"\n({skipped} more matching chunks did not fit in the budget.)" if skipped else ""
        return self._render(self._claim(kept), f"No new chunk matches {pattern!r}.") + note

    @tool(timeout_s=60)
    def read_document(self, doc_id: str) -> str:
        """Read a document: its most relevant chunks you have not seen, as many as the budget allows.

        Args:
            doc_id: the document id, as in doc="..." of a chunk.
        """
        if not self.store.has_document(doc_id):
            raise UnknownDocumentError(f'no document {doc_id!r}; use the doc="..." value of a chunk')
        excluded = self._excluded()
        unseen = [c for c in self.store.document_chunks(doc_id) if c.id not in excluded]
        if not unseen:
            return f"Every chunk of {doc_id!r} was already shown."
        question = self.task.prompt if self.task is not None else doc_id
        scores = self.searcher.reranker(question, self.store.embed_query(question), unseen, self.store)
        ranked = [unseen[i] for i in sorted(range(len(unseen)), key=lambda i: -scores[i])]
        kept, skipped = fit_budget(ranked, self._room())
        note = f"\n({skipped} more chunks of {doc_id!r} did not fit in the budget.)" if skipped else ""
        return self._render(self._claim(kept), f"No chunk of {doc_id!r} fits in the remaining budget.") + note

    @tool(timeout_s=10, in_thread=False)
    def prune_chunks(self, chunk_ids: list[str]) -> str:
        """Remove chunks you no longer need from your context (they stay counted as found).

        Args:
            chunk_ids: ids of chunks shown earlier, e.g. ["json#3", "csv#0"].
        """
        with self._lock:
            unknown = [i for i in dict.fromkeys(chunk_ids) if i not in self.seen]
            if unknown:
                more = f" and {len(unknown) - 20:,} more" if len(unknown) > 20 else ""
                named = ", ".join(i[:80] for i in unknown[:20]) + more
                raise UnknownChunksError(
                    f"unknown chunk ids: {named}; prune only ids of chunks shown in this task (nothing was pruned)"
                )
            new = [i for i in dict.fromkeys(chunk_ids) if i not in self.pruned]
            self.pruned.update(new)
            self._newly_pruned.extend(new)
        again = len(set(chunk_ids)) - len(new)
        note = f" ({again} were already pruned)" if again else ""
        return f"Pruned {len(new)} chunks, about {sum(self.seen[i] for i in new):,} tokens{note}."

    # -- reward -------------------------------------------------------------------------------------
    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        """The Context-1 measurements, unweighted and clock-free (``self.rubric.measure``: precision and recall
        of the output, from which ``score`` derives F_β; trajectory recall, answer found, penalties). First
        writes ``trajectory.info``, which the preset reads: ``encountered_chunk_ids`` (every chunk shown, in order,
        pruned ones included), ``pruned_chunk_ids`` (sorted), ``output_doc_ids`` (the documents the final answer
        lists) and ``answer_line`` (its ANSWER line, None without one); then the ``search/*`` metrics."""
        assert self.task is not None, "reward() before reset()"
        calls = tuple(c.name for m in trajectory.messages if m.role == "assistant" for c in m.tool_calls)
        record = EpisodeRecord(
            output_docs=parse_output_docs(trajectory.final_answer) if trajectory.terminated else (),
            answer=parse_answer(trajectory.final_answer) if trajectory.terminated else None,
            encountered=frozenset(self.seen),
            pruned=frozenset(self.pruned),
            tool_calls=calls,
            turns=sum(m.role == "assistant" for m in trajectory.messages),
        )
        trajectory.info["encountered_chunk_ids"] = list(self.seen)
        trajectory.info["pruned_chunk_ids"] = sorted(self.pruned)
        trajectory.info["output_doc_ids"] = list(record.output_docs)
        trajectory.info[ANSWER_LINE] = record.answer
        terms = self.rubric.measure(trajectory, self.task)
        truth = GroundTruth.from_info(self.task.info)
        trajectory.metrics.update(episode_metrics(record, truth, terms, config=self.config.reward))
        trajectory.metrics["search/context_utilisation"] = (
            self.peak_tokens / self.budget if self.budget else float("nan")
        )
        return terms

    # -- expert rule ----------------------------------------------------------------------------------
    scripted_rule = staticmethod(expert_rule)
    """Oracle: search and grep every clue, follow the bridges, cite the documents the chain proves (expert.py)."""


def aggregate_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Means of every ``search/`` metric over trajectories (NaN values, e.g. no prunes, are left out)."""
    keys = sorted({k for t in trajectories for k in t.metrics if k.startswith("search/")})
    out = {}
    for key in keys:
        values = [t.metrics[key] for t in trajectories if key in t.metrics and not math.isnan(t.metrics[key])]
        out[key] = sum(values) / len(values) if values else float("nan")
    return out
