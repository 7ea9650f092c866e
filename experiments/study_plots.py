"""The seed-level figure of one study design on one split, drawn from its run records (``study.py plot``).

Left: each arm's primary outcome per seed (one dot per seed, the same marker for a seed in every arm, so a seed's
arms can be read across) with the mean over seeds and its Student-t 95% CI. Right: the paired per-seed deltas of
every arm against the baseline arm (``arm - baseline``), with the mean delta and its CI, and the verdict in the
tick label. Drawn only from the JSON records, so the figure always shows every seed that was run and nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.stats import over_seeds, paired_seeds

MARKERS = "osD^v<>ph*"
ORDER = ("start", "sft_only", "sft_more", "sft3", "rft", "grpo")
"""The ladder's order, left to right; arms not named here follow in the order their records appear."""


def seed_values(runs: list[dict[str, Any]], design: str, split: str,
                metric: str = "") -> tuple[dict[str, dict[int, float]], str, str]:  # fmt: skip
    """``{arm: {seed: value}}`` of the primary outcome (or ``metric``) of one design and split (a later run of a
    seed wins, as in the index), the outcome's name and the baseline arm."""
    from experiments.study import seed_table

    found = seed_table(runs, metric).get((design, split))
    if found is None:
        raise ValueError(f"no run of design '{design}' on split '{split}'" + (f" with {metric}" if metric else ""))
    arms, primary, baseline = found
    rank = {arm: ORDER.index(arm) if arm in ORDER else len(ORDER) + i for i, arm in enumerate(arms)}
    return {arm: arms[arm] for arm in sorted(arms, key=rank.__getitem__)}, primary, baseline


def plot_seeds(runs: list[dict[str, Any]], design: str, split: str, path: Path, *, title: str = "",
               metric: str = "") -> Path:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments.study import PROPORTION, is_proportion

    arms, primary, baseline = seed_values(runs, design, split, metric)
    bounds = PROPORTION if is_proportion(primary) else None
    seeds = sorted({s for values in arms.values() for s in values})
    marker = {s: MARKERS[i % len(MARKERS)] for i, s in enumerate(seeds)}
    names = list(arms)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.4), gridspec_kw={"width_ratios": [len(names), 3]})
    for x, arm in enumerate(names):
        summary = over_seeds(list(arms[arm].values()), bounds=bounds)
        if summary["t"]:
            low, high = summary["t"]
            left.errorbar(x, summary["mean"], yerr=[[summary["mean"] - low], [high - summary["mean"]]], fmt="_",
                          color="black", markersize=22, capsize=6, lw=1.5)  # fmt: skip
        else:
            left.plot(x, summary["mean"], "_", color="black", markersize=22)
        for i, (seed, value) in enumerate(sorted(arms[arm].items())):
            left.plot(x - 0.2 + 0.4 * i / max(1, len(seeds) - 1), value, marker[seed], color="tab:blue", alpha=0.7,
                      label=f"seed {seed}" if x == 0 else None)  # fmt: skip
    left.set_xticks(range(len(names)), [f"{a}\n(n={len(arms[a])})" for a in names])
    left.set(ylabel=primary, title=f"{primary} per seed; mean and 95% t CI over seeds")
    if bounds:
        left.set_ylim(-0.03, 1.03)
    left.legend(fontsize=7, loc="best")
    others = [a for a in names if a != baseline and baseline in arms]
    for x, arm in enumerate(others):
        paired = paired_seeds(arms[baseline], arms[arm], bounds=bounds)
        for seed, delta in paired["deltas"].items():
            right.plot(x, delta, marker[int(seed)], color="tab:orange", alpha=0.7)
        if paired["t"]:
            low, high = paired["t"]
            right.errorbar(x, paired["mean"], yerr=[[paired["mean"] - low], [high - paired["mean"]]], fmt="_",
                           color="black", markersize=22, capsize=6, lw=1.5)  # fmt: skip
        shown = "shown" if paired["t"] and (paired["t"][0] > 0 or paired["t"][1] < 0) else "not shown"
        right.annotate(f"{paired['wins']}W {paired['ties']}T {paired['losses']}L\n{shown}", (x, 0), fontsize=7,
                       xytext=(8, -30), textcoords="offset points")  # fmt: skip
    right.axhline(0, color="gray", lw=0.8)
    right.set_xticks(range(len(others)), [f"{a}\n- {baseline}" for a in others])
    right.set(title=f"paired per-seed deltas vs {baseline}", ylabel=f"delta {primary}")
    fig.suptitle(title or f"{design} on {split}: {len(seeds)} seeds", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
