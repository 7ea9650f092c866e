"""Context-1's reward configuration, ground truth and metrics for the search env (docs/design/index.md §6).

The reward itself is the ``context1`` preset (``taskrl.rewards.presets``), one formula: ``SearchEnv`` builds it
from ``RewardConfig`` (``context1_reward``) as its rubric, measures every term unweighted with it, and
``taskrl.scoring.score`` derives F_β at its clock and applies weights, clamp and caps:
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
β is read at the clock ``score`` is given (the env knows nothing of training). ``independent_checks`` are the
verifier's verdicts the reward-hacking monitor reads (``fabricated``: an answer that is not the task's;
``verifier_disagrees``: most listed documents support nothing), whatever the weights; ``episode_metrics`` are
the ``search/*`` metrics.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from taskrl.envs.search.corpus import doc_id_of
from taskrl.rewards.formulas import answer_correct, fact_recall, normalise_answer, output_precision
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
    """Weights and shapes of the Context-1 reward (defaults: docs/design/index.md §6)."""

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
    """Epochs over which β moves from start to end (linearly), on the clock the batch is scored at."""
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
    answer: str | None = None
    """The text after ``ANSWER:`` in the final answer (None when there is no such line)."""


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


def episode_metrics(
    record: EpisodeRecord, truth: GroundTruth, terms: dict[str, float | None], *, config: RewardConfig
) -> dict[str, float]:
    """The ``search/*`` metrics and independent checks of one episode; ``terms`` are the episode's measured
    (unweighted) Context-1 terms, reported as they are. F_β and β are the scorer's (``rewards_raw/f_beta``,
    ``rewards/param/f_beta`` in ``taskrl.scoring.batch_metrics``): the env does not know the clock."""
    relevant = truth.relevant_chunks

    def term(name: str) -> float:
        value = terms.get(name)
        return float("nan") if value is None else float(value)

    return {
        "search/output_recall": fact_recall(truth.facts, found_docs=record.output_docs[: config.max_output_docs]),
        "search/output_precision": output_precision(record.output_docs, truth.relevant_docs),
        "search/trajectory_recall": term("trajectory_recall"),
        "search/answer_found": term("answer_found"),
        "search/prune_accuracy": (
            len(record.pruned - relevant) / len(record.pruned) if record.pruned else float("nan")
        ),
        "search/pruned_chunks": float(len(record.pruned)),
        "search/encountered_chunks": float(len(record.encountered)),
        "search/tool_calls_per_turn": len(record.tool_calls) / record.turns if record.turns else 0.0,
        "search/answer_correct": float(answer_correct(record.answer, truth.answer)),
        "search/output_docs": float(len(record.output_docs)),
        **independent_checks(record, truth, config),
    }
