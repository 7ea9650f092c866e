"""The plot of experiments/summary.py: success, compaction error and summary tokens per arm and trigger.

``plot_summary(data, path)`` draws from the JSON summary.py writes (``{"seeds": {"0": {...}}}``), one row of four
panels per seed: held-out success per arm at each trigger with 95% CIs (the no-compaction ceiling as a line),
compaction error (ceiling - arm, paired per task) with CIs on success and on the per-item credit, and tokens per
summary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = {"prompted": "tab:blue", "state_dump": "tab:green", "self_untrained": "tab:gray",
          "self_trained": "tab:red"}  # fmt: skip


def _bars(ax: Any, result: dict[str, Any], key: str, title: str, ci: bool = True) -> None:
    triggers = result["triggers"]
    width = 0.8 / len(COLORS)
    for index, arm in enumerate(COLORS):
        xs, ys, errs = [], [], [[], []]
        for position, trigger in enumerate(triggers):
            record = result["arms"].get(f"{arm}@{trigger}")
            if record is None:
                continue
            est = record[key]
            xs.append(position + (index - (len(COLORS) - 1) / 2) * width)
            ys.append(est["value"])
            low, high = est.get("low"), est.get("high")
            errs[0].append(est["value"] - low if ci and low is not None else 0.0)
            errs[1].append(high - est["value"] if ci and high is not None else 0.0)
        ax.bar(xs, ys, width, yerr=errs, capsize=3, color=COLORS[arm], label=arm)
    ax.set_xticks(range(len(triggers)), [f"trigger {t} tokens" for t in triggers])
    ax.set_title(title)


def plot_summary(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted(data["seeds"].items(), key=lambda item: int(item[0]))
    fig, axes = plt.subplots(len(seeds), 4, figsize=(22, 4.4 * len(seeds)), squeeze=False)
    for row, (seed, result) in zip(axes, seeds, strict=True):
        success_ax, error_ax, credit_error_ax, tokens_ax = row
        # without summary demonstrations none compacts; the first run's record predates the share (all compacted)
        share = result.get("sft_uncompacted_share", 0.0) if result.get("sft_summaries", True) else 1.0
        _bars(success_ax, result, "success", f"seed {seed}: success (greedy, 95% CI); {share:.0%} uncompacted demos")
        ceiling = result["ceiling"]["success"]
        success_ax.axhline(ceiling["value"], color="black", ls="--", label="ceiling (no compaction)")
        success_ax.set_ylim(0, 1.05)
        success_ax.legend(fontsize=7)
        _bars(error_ax, result, "compaction_error", "compaction error: ceiling - arm (paired per task)")
        error_ax.axhline(0, color="black", lw=0.8)
        _bars(credit_error_ax, result, "compaction_error_reward", "the same on the per-item credit")
        credit_error_ax.axhline(0, color="black", lw=0.8)
        _bars(tokens_ax, result, "summary_tokens", "tokens per summary", ci=False)
    fig.suptitle("Self-summarization vs harness compaction (prices, 5-6 items, one lookup per turn; SmolLM2-135M)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
