"""Context-1's reward and metrics for the search env, exactly as DESIGN.md §6.

r = clamp(0.7·F_β + 0.3·r_traj + r_fa + w_ans·r_ans − p_prune − p_turn, ε, r_pre), r_pre the same without penalties:
- F_β over the documents the final answer lists, with fact-level recall (a fact counts as found when any
  document holding one of its supporting chunks is listed) and document precision; β anneals 4 -> 2. Only the
  first ``max_output_docs`` listed documents can earn recall; every listed document counts for precision.
- r_ans (optional, off by default = pure Context-1, whose final answer is a list of documents): 1 when the
  ``ANSWER:`` line equals the task's answer (case, spaces and edge punctuation ignored), weighted ``w_ans``.
- r_traj: fact-level recall over every chunk the episode encountered, pruned ones included.
- r_fa: +1 when a chunk containing the answer was encountered.
- p_prune: 0.1 per prune call beyond a streak of 3 consecutive prune calls, capped at 0.5.
- p_turn: 0 at 64 turns rising linearly to 0.5 at 128 turns.
- Floor ε for an episode that completed (final answer, no error); the floor wins over the cap when r_pre < ε,
  so a completed episode always beats a failed one. Episodes that did not complete are floored at 0.
``SearchReward`` holds the β schedule; the trainer moves it with ``set_step(step, epoch)``.
``independent_checks`` are the verifier's verdicts the reward-hacking monitor reads (``fabricated``: an answer
that is not the task's; ``verifier_disagrees``: most listed documents support nothing), whatever the weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from taskrl.algos.schedules import make_schedule
from taskrl.envs.search.corpus import doc_id_of
from taskrl.rewards.formulas import f_beta
from taskrl.validate import above, finite_at_least, require

PRUNE_TOOL = "prune_chunks"
_SIMPLE_TYPES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}


def check_field_types(config: Any) -> None:
    """A ``ValueError`` naming ``Class.field`` when a value from JSON/YAML has the wrong simple type."""
    for f in dataclasses.fields(config):
        kinds = str(f.type).split(" | ")
        value = getattr(config, f.name)
        allowed = tuple(t for k in kinds for t in _SIMPLE_TYPES.get(k, ()))
        if not allowed or (value is None and "None" in kinds):
            continue
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise ValueError(
                f"{type(config).__name__}.{f.name} must be {f.type}, got {type(value).__name__} {value!r:.80}"
            )


@dataclass(frozen=True)
class RewardConfig:
    """Weights and shapes of the Context-1 reward (defaults: DESIGN.md §6)."""

    f_beta_weight: float = 0.7
    """Weight of F_β on the final answer's documents."""
    trajectory_recall_weight: float = 0.3
    """Weight of the recall over every chunk encountered."""
    answer_found_bonus: float = 1.0
    """Added when a chunk containing the answer was encountered."""
    prune_penalty: float = 0.1
    """Cost of each prune call beyond the free streak."""
    prune_free_streak: int = 3
    """Consecutive prune calls allowed before each further one costs ``prune_penalty``."""
    prune_penalty_cap: float = 0.5
    """Most the prune penalty can take."""
    turn_penalty_start: int = 64
    """Turns at which the turn penalty starts (0 there)."""
    turn_penalty_end: int = 128
    """Turns at which the turn penalty reaches its maximum."""
    turn_penalty_max: float = 0.5
    """Turn penalty at and beyond ``turn_penalty_end``."""
    floor: float = 0.01
    """ε: the least reward of an episode that completes without error."""
    beta_start: float = 4.0
    """β at the start of training (recall weighted β² = 16x)."""
    beta_end: float = 2.0
    """β after annealing (recall 4x)."""
    beta_anneal_epochs: int = 4
    """Epochs over which β moves from start to end (linearly); the trainer reports epochs via set_step."""
    answer_weight: float = 0.0
    """Weight of the answer-correctness term (the ANSWER line equals the task's answer); 0 = pure Context-1."""
    max_output_docs: int = 10
    """Only the first this-many listed documents can earn recall (all count for precision): listing everything
    seen cannot buy recall at high β."""
    min_output_precision: float = 0.5
    """The independent check: a final list where fewer than this share of documents support the answer is
    flagged ``verifier_disagrees`` (the reward-hacking monitor reads it); it does not change the reward."""

    def __post_init__(self) -> None:
        check_field_types(self)
        require("RewardConfig", "must be a finite number >= 0", finite_at_least(0), f_beta_weight=self.f_beta_weight,
                trajectory_recall_weight=self.trajectory_recall_weight, answer_found_bonus=self.answer_found_bonus,
                prune_penalty=self.prune_penalty, prune_penalty_cap=self.prune_penalty_cap,
                turn_penalty_max=self.turn_penalty_max, floor=self.floor, answer_weight=self.answer_weight)  # fmt: skip
        if self.prune_free_streak < 0:
            raise ValueError(f"RewardConfig.prune_free_streak must be >= 0, got {self.prune_free_streak}")
        if not 0 <= self.turn_penalty_start < self.turn_penalty_end:
            raise ValueError(
                f"RewardConfig.turn_penalty_start ({self.turn_penalty_start}) must be >= 0 and below "
                f"turn_penalty_end ({self.turn_penalty_end})"
            )
        require("RewardConfig", "must be > 0", above(0), beta_start=self.beta_start, beta_end=self.beta_end)
        if self.beta_anneal_epochs < 1:
            raise ValueError(f"RewardConfig.beta_anneal_epochs must be >= 1, got {self.beta_anneal_epochs}")
        if self.max_output_docs < 1:
            raise ValueError(f"RewardConfig.max_output_docs must be >= 1, got {self.max_output_docs}")
        if not 0.0 <= self.min_output_precision <= 1.0:
            raise ValueError(f"RewardConfig.min_output_precision must be in [0, 1], got {self.min_output_precision}")


@dataclass(frozen=True)
class GroundTruth:
    """What a task's answer rests on: each fact's supporting chunk ids, and the chunks holding the answer."""

    facts: tuple[tuple[str, ...], ...]
    answer_chunk_ids: frozenset[str]
    answer: str | None = None
    """The task's answer (for the optional answer term and the fabricated-answer check)."""

    def __post_init__(self) -> None:
        if not self.facts or any(not f for f in self.facts):
            raise ValueError("GroundTruth.facts needs at least one fact, each with at least one supporting chunk")

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> GroundTruth:
        """From ``task.info`` as written by ``taskrl datagen multihop`` (``facts[i]["chunk_ids"]``)."""
        facts = tuple(tuple(f["chunk_ids"]) for f in info["facts"])
        answer = info.get("answer")
        return cls(facts, frozenset(info.get("answer_chunk_ids", ())), str(answer) if answer is not None else None)

    @property
    def relevant_chunks(self) -> frozenset[str]:
        return frozenset(c for fact in self.facts for c in fact) | self.answer_chunk_ids

    @property
    def relevant_docs(self) -> frozenset[str]:
        return frozenset(doc_id_of(c) for c in self.relevant_chunks)


@dataclass(frozen=True)
class EpisodeRecord:
    """What an episode did, as the reward needs it."""

    output_docs: tuple[str, ...]
    """Documents the final answer lists (empty without a final answer)."""
    encountered: frozenset[str]
    """Every chunk id shown to the model this episode, pruned ones included."""
    pruned: frozenset[str]
    """Chunk ids removed from the model's view by prune_chunks."""
    tool_calls: tuple[str, ...]
    """Names of all tool calls in the order the model wrote them."""
    turns: int
    """Assistant turns."""
    completed: bool
    """The episode ended with a final answer and no error."""
    answer: str | None = None
    """The text after ``ANSWER:`` in the final answer (None when there is no such line)."""


def normalise_answer(text: str) -> str:
    """The form answers are compared in: casefolded, inner whitespace collapsed, edge quotes/punctuation gone."""
    return " ".join(text.casefold().split()).strip(" .,;:!?\"'`*()[]")


def answer_correct(given: str | None, gold: str | None) -> bool:
    """The given answer is exactly the gold one (after ``normalise_answer``); a list of guesses is not."""
    return given is not None and gold is not None and bool(normalise_answer(gold)) and (
        normalise_answer(given) == normalise_answer(gold)
    )


def independent_checks(record: EpisodeRecord, truth: GroundTruth, config: RewardConfig) -> dict[str, float]:
    """1.0 where the verifier disagrees with the episode, 0.0 where it agrees (keys the hacking monitor reads).

    ``fabricated``: an answer was given (not empty, not "unknown") and it is not the task's answer.
    ``verifier_disagrees``: documents were listed and fewer than ``min_output_precision`` of them hold a
    supporting or answer chunk (the "cite everything seen" pattern).
    """
    given = normalise_answer(record.answer or "")
    fabricated = bool(given) and given not in ("unknown", "i do not know", "n/a") and truth.answer is not None and (
        not answer_correct(record.answer, truth.answer)
    )
    precision = output_precision(record.output_docs, truth.relevant_docs)
    disagrees = bool(record.output_docs) and precision < config.min_output_precision
    return {"fabricated": float(fabricated), "verifier_disagrees": float(disagrees)}


def fact_recall(
    facts: Sequence[Iterable[str]], found_chunks: Iterable[str] = (), found_docs: Iterable[str] = ()
) -> float:
    """Share of facts with a supporting chunk in ``found_chunks`` or in a document of ``found_docs``."""
    chunks, docs = set(found_chunks), set(found_docs)
    hits = sum(any(c in chunks or doc_id_of(c) in docs for c in fact) for fact in facts)
    return hits / len(facts) if facts else 0.0


def output_precision(output_docs: Iterable[str], relevant_docs: Iterable[str]) -> float:
    """Share of the listed documents that hold a supporting or answer chunk (0 when none are listed)."""
    out = set(output_docs)
    return len(out & set(relevant_docs)) / len(out) if out else 0.0


def prune_penalty(tool_calls: Iterable[str], *, per_call: float = 0.1, free_streak: int = 3, cap: float = 0.5) -> float:
    """``per_call`` for each prune call that extends a run of consecutive prune calls past ``free_streak``.

    Any other tool call ends the run. Capped at ``cap``.
    """
    streak, penalty = 0, 0.0
    for name in tool_calls:
        streak = streak + 1 if name == PRUNE_TOOL else 0
        if streak > free_streak:
            penalty += per_call
    return min(penalty, cap)


def turn_penalty(turns: int, *, start: int = 64, end: int = 128, maximum: float = 0.5) -> float:
    """0 up to ``start`` turns, then linear to ``maximum`` at ``end``, flat after."""
    return maximum * min(max(turns - start, 0) / (end - start), 1.0)


def clamp_reward(value: float, pre_penalty: float, *, completed: bool, floor: float) -> float:
    """clamp(value, ε, r_pre) for completed episodes (the floor wins if r_pre < ε); failures floor at 0."""
    lower = floor if completed else 0.0
    return max(lower, min(value, pre_penalty))


@dataclass(frozen=True)
class RewardBreakdown:
    """The weighted terms (they add up to the reward) and the unweighted metrics of one episode."""

    terms: dict[str, float]
    metrics: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.terms.values())


def score_episode(
    record: EpisodeRecord, truth: GroundTruth, *, beta: float, config: RewardConfig | None = None
) -> RewardBreakdown:
    """The Context-1 reward of one episode, term by term, plus its metrics."""
    cfg = config or RewardConfig()
    recall = fact_recall(truth.facts, found_docs=record.output_docs[: cfg.max_output_docs])
    precision = output_precision(record.output_docs, truth.relevant_docs)
    f = f_beta(precision, recall, beta)
    traj_recall = fact_recall(truth.facts, found_chunks=record.encountered)
    answer_found = float(bool(truth.answer_chunk_ids & record.encountered))
    p_prune = prune_penalty(
        record.tool_calls, per_call=cfg.prune_penalty, free_streak=cfg.prune_free_streak, cap=cfg.prune_penalty_cap
    )
    p_turn = turn_penalty(
        record.turns, start=cfg.turn_penalty_start, end=cfg.turn_penalty_end, maximum=cfg.turn_penalty_max
    )
    terms = {
        "f_beta": cfg.f_beta_weight * f,
        "trajectory_recall": cfg.trajectory_recall_weight * traj_recall,
        "answer_found": cfg.answer_found_bonus * answer_found,
    }
    correct = answer_correct(record.answer, truth.answer)
    if cfg.answer_weight > 0:
        terms["answer_correct"] = cfg.answer_weight * float(correct)
    terms["prune_penalty"] = 0.0 - p_prune  # 0.0 - x, not -x: no "-0.0" in logs
    terms["turn_penalty"] = 0.0 - p_turn
    pre_penalty = terms["f_beta"] + terms["trajectory_recall"] + terms["answer_found"] + terms.get("answer_correct", 0)
    raw = pre_penalty - p_prune - p_turn
    terms["clamp"] = clamp_reward(raw, pre_penalty, completed=record.completed, floor=cfg.floor) - raw
    relevant = truth.relevant_chunks
    metrics = {
        "search/output_recall": recall,
        "search/output_precision": precision,
        "search/f_beta": f,
        "search/beta": beta,
        "search/trajectory_recall": traj_recall,
        "search/answer_found": answer_found,
        "search/prune_accuracy": (
            len(record.pruned - relevant) / len(record.pruned) if record.pruned else float("nan")
        ),
        "search/pruned_chunks": float(len(record.pruned)),
        "search/encountered_chunks": float(len(record.encountered)),
        "search/tool_calls_per_turn": len(record.tool_calls) / record.turns if record.turns else 0.0,
        "search/answer_correct": float(correct),
        "search/output_docs": float(len(record.output_docs)),
        **independent_checks(record, truth, cfg),
    }
    return RewardBreakdown(terms, metrics)


class SearchReward:
    """The reward with its β schedule; ``set_step(step, epoch)`` moves β (linear over epochs, 4 -> 2)."""

    def __init__(self, config: RewardConfig | None = None) -> None:
        self.config = config or RewardConfig()
        self._beta = make_schedule(
            {"kind": "linear", "start": self.config.beta_start, "end": self.config.beta_end,
             "steps": self.config.beta_anneal_epochs},
            field="RewardConfig.beta",
        )  # fmt: skip
        self.step = 0
        self.epoch = 0

    def set_step(self, step: int, epoch: int = 0) -> None:
        self.step, self.epoch = int(step), int(epoch)

    @property
    def beta(self) -> float:
        return self._beta(self.epoch)

    def __call__(self, record: EpisodeRecord, truth: GroundTruth) -> RewardBreakdown:
        return score_episode(record, truth, beta=self.beta, config=self.config)
