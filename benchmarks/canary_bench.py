"""How often the canary's live rollback test rolls back a candidate that is no worse: three rules side by side.

The router tests (candidate - stable) live reward as canary sessions arrive. The old rule (a 95% percentile
bootstrap after *every* session) peeks dozens of times per canary, and a bootstrap of 8 sessions is too narrow,
so a candidate equal to stable was rolled back far more often than the 2.5% a one-sided 95% interval promises.
Rules: ``old`` (that; reproduced here by a subclass), ``peeking`` (today's interval, Welch's t with a pooled
floor, still after every session: ``sequential_rollback=False``) and ``sequential`` (the default: today's
interval only at doubling session counts, the error rate split over the looks; ``taskrl.deploy.router``). The
real ``Router`` runs on simulated sessions with the canary rule of experiments/production.py (stages
0.2/0.5/1.0, 16 sessions per stage, first rollback look at 8 sessions, 30% of sessions on the candidate, a
160-session stage limit; stable's evidence restarts with the canary, as in the router):

- equal (success 0.5 vs 0.5): a rollback is a false alarm;
- better (0.65 vs 0.5): a rollback throws a good model away;
- worse (0.2 vs 0.5): it must be rolled back, at the first stage, soon (candidate sessions until then).

A session's reward is +1 (accepted) or -1 (rejected), as the production recipe's feedback.

    .venv/bin/python benchmarks/canary_bench.py [--reps 200]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.datagen_bench import cpu_model  # noqa: E402
from taskrl.deploy.gate import bootstrap_diff_ci  # noqa: E402
from taskrl.deploy.router import Router, RouterConfig  # noqa: E402
from taskrl.policies.scripted import ScriptedPolicy  # noqa: E402

CANDIDATES = {"equal": (0.5, 0.5), "better": (0.5, 0.65), "worse": (0.5, 0.2)}


def policy(name: str) -> ScriptedPolicy:
    return ScriptedPolicy(lambda messages, tools: name, name=name)


class OldRouter(Router):
    """The rule before the sequential test: a 95% percentile bootstrap (500 resamples) after every session."""

    def _live_test(self, confidence: float | None = None) -> dict | None:
        candidate, stable = self._sample(self.candidate), self._sample(self.stable)
        if len(candidate) < self.config.rollback_min_samples or len(stable) < 2:
            return None
        diff, lower, upper = bootstrap_diff_ci(stable, candidate, confidence=0.95, n_boot=500, seed=len(candidate))
        return {"diff": diff, "ci": [lower, upper], **self._live_summary()}


RULES = {"old": (OldRouter, False), "peeking": (Router, False), "sequential": (Router, True)}
"""old: bootstrap after every session (before); peeking: today's interval after every session; sequential: the
default (today's interval at doubling looks, error rate split over them)."""


def one_canary(stable_p: float, candidate_p: float, seed: int, rule: str) -> tuple[str, int]:
    """(outcome, candidate sessions seen) of one canary: the first decision (advance, rollback = shown worse,
    inconclusive = a stage limit reached without evidence either way) or "open"."""
    rng = random.Random(seed)
    config = RouterConfig(stages=(0.2, 0.5, 1.0), min_samples=16, holdout=0.0, rollback_min_samples=8,
                          max_stage_samples=160, max_tenant_share=1.0, salt="bench",
                          sequential_rollback=RULES[rule][1])  # fmt: skip
    router = RULES[rule][0]("m", policy("v0"), config)
    version = router.add_version(policy("v1"))
    for i in range(40):
        router.observe(0, 1.0 if rng.random() < stable_p else -1.0, session_id=f"s{i}", tenant="t")
    router.start_canary(version)
    seen = 0
    for i in range(2000):
        on_candidate = rng.random() < 0.3
        p = candidate_p if on_candidate else stable_p
        seen += on_candidate
        decision = router.observe(version if on_candidate else 0, 1.0 if rng.random() < p else -1.0,
                                  session_id=f"c{i}", tenant="t")  # fmt: skip
        if decision is not None:
            inconclusive = decision.kind == "rollback" and "inconclusive" in decision.evidence.get("reason", "")
            return "inconclusive" if inconclusive else decision.kind, seen
    return "open", seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=200, help="simulated canaries per candidate and rule")
    args = ap.parse_args()
    print(f"CPU: {cpu_model()[0]}; {args.reps} canaries per cell")
    start = time.perf_counter()
    rows = {}
    for name, (stable_p, candidate_p) in CANDIDATES.items():
        for i, rule in enumerate(RULES):
            outcomes = [one_canary(stable_p, candidate_p, 10_000 * i + r, rule) for r in range(args.reps)]
            counts = Counter(kind for kind, _ in outcomes)
            until = [seen for kind, seen in outcomes if kind == "rollback"]
            rows[name, rule] = (counts["rollback"] / args.reps, counts["advance"] / args.reps,
                                      statistics.median(until) if until else float("nan"),
                                      counts["inconclusive"] / args.reps)  # fmt: skip
    print(
        "rollback = shown worse; advance = shown non-inferior, first stage passed; inconclusive = rolled back "
        "at the 160-session stage limit; sessions = candidate sessions until a shown-worse rollback (median)"
    )
    header = " | ".join(f"{what + ': ' + ' / '.join(RULES):>32}" for what in ("rollback", "advance", "inconclusive"))
    print(f"{'candidate':>9} | {header} | {'sessions: ' + ' / '.join(RULES):>32}")
    for name in CANDIDATES:
        cells = [" / ".join(f"{rows[name, rule][k]:.3f}" for rule in RULES) for k in (0, 1, 3)]
        sessions = " / ".join(f"{rows[name, rule][2]:.1f}" for rule in RULES)
        print(f"{name:>9} | " + " | ".join(f"{c:>32}" for c in cells) + f" | {sessions:>32}")
    old, new = rows["equal", "old"][0], rows["equal", "sequential"][0]
    ratio = old / new if new else float("inf")
    print(
        f"false rollbacks of an equal candidate: old {old:.3f} vs sequential {new:.3f} ({ratio:.1f}x fewer); "
        f"target <= 0.025 (one-sided 95%); wall {time.perf_counter() - start:.0f}s"
    )


if __name__ == "__main__":
    main()
