"""Pure reward formulas (closed forms from the recipes, or our documented stand-ins), golden-tested.

Context-1: ``f_beta``, ``f_beta_sets``, ``fact_recall``, ``output_precision``, ``answer_correct``,
``prune_penalty``, ``turn_penalty`` (the ``context1`` preset's terms and the search env's metrics both call these;
the clamp is ``taskrl.scoring.context1_clamp``); Composer:
``effort_penalty``; PARL: ``r_parallel``, ``r_finish``, ``r_efficiency``, and ``max_overlap`` (the one count of
intervals open at once, on the step clock or the wall clock). Inputs are validated: a bad value raises
``ValueError`` naming the argument, so a bad config fails at start instead of producing NaN rewards.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence, Set

from taskrl.moved import moved_names


def _check_unit(name: str, value: float) -> None:
    if not (0.0 <= value <= 1.0):
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")


def f_beta(precision: float, recall: float, beta: float) -> float:
    """F-beta score (1+β²)·P·R / (β²·P + R); 0 when precision and recall are both 0.

    β > 1 weights recall β² times as much as precision: Context-1 starts at β = 4 (recall 16x) and anneals
    toward β = 2 (recall 4x). Range [0, 1].
    """
    _check_unit("precision", precision)
    _check_unit("recall", recall)
    if not (beta > 0 and math.isfinite(beta)):
        raise ValueError(f"beta must be a positive finite number, got {beta!r}")
    b2 = beta * beta
    denominator = b2 * precision + recall
    if denominator == 0.0:
        return 0.0
    return (1.0 + b2) * precision * recall / denominator


def f_beta_sets(predicted: Set[Hashable], relevant: Set[Hashable], beta: float) -> tuple[float, float, float]:
    """F-beta of a predicted set against a relevant set: returns ``(f, precision, recall)``.

    precision = |predicted ∩ relevant| / |predicted|, recall = |predicted ∩ relevant| / |relevant|.
    An empty prediction has precision 0 and an empty relevant set recall 0, except that predicting nothing
    when nothing is relevant is perfect (1, 1, 1): there was nothing to find and nothing wrong was said.
    """
    predicted, relevant = set(predicted), set(relevant)
    if not predicted and not relevant:
        return 1.0, 1.0, 1.0
    hits = len(predicted & relevant)
    precision = hits / len(predicted) if predicted else 0.0
    recall = hits / len(relevant) if relevant else 0.0
    return f_beta(precision, recall, beta), precision, recall


def effort_penalty(x: float, k: float, q: float) -> float:
    """Composer's effort penalty ((1 + k·x)^(1-q) - 1) / (k·(1-q)); at q = 1 its limit log(1 + k·x) / k.

    ``x`` is the effort spent (tool calls, tokens, seconds: the caller chooses and scales it), ``k`` > 0 sets
    where the curve bends and ``q`` >= 0 its concavity (q = 0: linear, x; q > 1: bounded by 1/(k·(q-1))).
    Returns a non-negative cost that grows with x; the caller subtracts it (times a weight) from the reward.
    Computed with expm1/log1p so q near 1 is as accurate as q = 1.
    """
    if not (x >= 0 and math.isfinite(x)):
        raise ValueError(f"x (effort) must be a finite number >= 0, got {x!r}")
    if not (k > 0 and math.isfinite(k)):
        raise ValueError(f"k must be a positive finite number, got {k!r}")
    if not (q >= 0 and math.isfinite(q)):
        raise ValueError(f"q must be a finite number >= 0, got {q!r}")
    log_base = math.log1p(k * x)
    if q == 1.0:
        return log_base / k
    return math.expm1((1.0 - q) * log_base) / (k * (1.0 - q))


def r_parallel(max_concurrent: int, k: int) -> float:
    """PARL's parallelism reward (our closed form; Kimi published none): min(1, max_concurrent / K).

    ``max_concurrent`` is the most sub-tasks that ran at the same time in the episode (the PARL preset counts
    distinct useful sub-tasks on a step clock, ``taskrl.rewards.parl``); ``k`` the concurrency that earns full
    credit. Range [0, 1].
    """
    if k < 1:
        raise ValueError(f"k (sub-agents for full parallel credit) must be >= 1, got {k!r}")
    if max_concurrent < 0:
        raise ValueError(f"max_concurrent must be >= 0, got {max_concurrent!r}")
    return min(1.0, max_concurrent / k)


def r_finish(finished_nonempty: int, created: int) -> float:
    """PARL's finish reward (our closed form): sub-tasks finished / sub-agents created (or assignments).

    The PARL preset counts only distinct useful sub-tasks over max(assignments, sub-agents created).
    0 when no sub-agent was created, so spawning nothing earns nothing. Range [0, 1].
    """
    if created < 0 or finished_nonempty < 0:
        raise ValueError(f"counts must be >= 0, got finished_nonempty={finished_nonempty!r}, created={created!r}")
    if finished_nonempty > created:
        raise ValueError(f"finished_nonempty ({finished_nonempty}) cannot exceed created ({created})")
    return finished_nonempty / created if created else 0.0


def r_efficiency(perf: float, critical_steps: int, budget: int, useful_share: float) -> float:
    """PARL's efficiency term (ours, not annealed): perf · (1 − min(1, critical_steps / budget)) · useful_share.

    Kimi trains under a critical-steps budget; this keeps that pressure in the reward once λ1, λ2 reach 0: the
    same answer in fewer critical steps, with fewer wasted assignments, scores higher. Range [0, 1].
    """
    _check_unit("perf", perf)
    _check_unit("useful_share", useful_share)
    if budget < 1:
        raise ValueError(f"budget (critical steps) must be >= 1, got {budget!r}")
    if critical_steps < 0:
        raise ValueError(f"critical_steps must be >= 0, got {critical_steps!r}")
    return perf * (1.0 - min(1.0, critical_steps / budget)) * useful_share


def prune_penalty(
    streak_lengths: Iterable[int], *, free_streak: int = 3, per_call: float = 0.1, cap: float = 0.5
) -> float:
    """Context-1's p_prune: ``per_call`` for every prune call beyond a consecutive streak of ``free_streak``.

    ``streak_lengths`` are the lengths of the maximal runs of consecutive ``prune_chunks`` calls; a run of
    5 with the default free streak of 3 costs 2 · 0.1. The sum is capped at ``cap`` (0.5). Range [0, cap].
    """
    if free_streak < 0 or per_call < 0 or cap < 0:
        raise ValueError(f"free_streak, per_call and cap must be >= 0, got {free_streak}, {per_call}, {cap}")
    excess = sum(max(0, int(n) - free_streak) for n in streak_lengths)
    return min(cap, per_call * excess)


def turn_penalty(turns: int, *, start: int = 64, end: int = 128, max_penalty: float = 0.5) -> float:
    """Context-1's p_turn: 0 up to ``start`` turns, rising linearly to ``max_penalty`` at ``end`` and beyond."""
    if not 0 <= start < end:
        raise ValueError(f"turn_penalty needs 0 <= start < end, got start={start}, end={end}")
    if max_penalty < 0:
        raise ValueError(f"max_penalty must be >= 0, got {max_penalty}")
    return max_penalty * min(1.0, max(0.0, (turns - start) / (end - start)))


def doc_of(chunk_id: Hashable) -> Hashable:
    """The document of a chunk id, ``"doc#3"`` -> ``"doc"`` (the search corpus's id rule,
    ``taskrl.envs.search.corpus.doc_id_of``); a document id, or a non-string id, is returned unchanged."""
    return chunk_id.split("#", 1)[0] if isinstance(chunk_id, str) else chunk_id


def fact_recall(
    facts: Sequence[Iterable[Hashable]], found_chunks: Iterable[Hashable] = (), found_docs: Iterable[Hashable] = ()
) -> float:
    """Context-1's fact-level recall: the share of facts with a supporting chunk in ``found_chunks`` or in a
    document of ``found_docs`` (a fact backed by a chunk repeated in two documents counts once). 0 without facts."""
    chunks, docs = set(found_chunks), set(found_docs)
    hits = sum(any(c in chunks or doc_of(c) in docs for c in fact) for fact in facts)
    return hits / len(facts) if facts else 0.0


def output_precision(listed_docs: Iterable[Hashable], relevant_docs: Iterable[Hashable]) -> float:
    """Context-1's document precision: the share of listed documents that hold a supporting or answer chunk
    (0 when none are listed)."""
    out = set(listed_docs)
    return len(out & set(relevant_docs)) / len(out) if out else 0.0


def normalise_answer(text: str) -> str:
    """The form answers are compared in: casefolded, inner whitespace collapsed, edge quotes/punctuation gone."""
    return " ".join(text.casefold().split()).strip(" .,;:!?\"'`*()[]")


def answer_correct(given: str | None, gold: str | None) -> bool:
    """The given answer is exactly the gold one (after ``normalise_answer``); a list of guesses is not."""
    return given is not None and gold is not None and bool(normalise_answer(gold)) and (
        normalise_answer(given) == normalise_answer(gold)
    )


def max_overlap(spans: Sequence[tuple[float, float]]) -> int:
    """Most intervals open at one instant; one ending where another starts does not overlap it, and an empty
    interval (end <= start) is never open."""
    events = sorted([(s, 1) for s, e in spans if e > s] + [(e, -1) for s, e in spans if e > s])  # ends sort first
    running = best = 0
    for _, delta in events:
        running += delta
        best = max(best, running)
    return best


__getattr__ = moved_names(__name__, {"context1_clamp": "taskrl.scoring"})
