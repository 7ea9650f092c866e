"""Plot of the search learning recipe (issue 14): docs/learning_search.png from the JSON search.py writes.

Panels against training minutes: GRPO training reward, held-out greedy output recall during training, invalid
tool calls per episode, policy entropy; then the final held-out output recall and F-beta (greedy and T=1) with
95% CIs per arm and seed, the warm start in grey.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.plots import COLORS, LINES, _curve

DESIGN_LABELS = {
    "onehop": ("one-hop", "two-hop"),
    "hops3": ("one- and two-hop", "three-hop"),
    "hops3b": ("one- and two-hop", "three-hop"),
}
"""(demonstrated, GRPO and held-out) questions of each task design of search_tasks.py."""


def plot_search(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted(data["seeds"].items(), key=lambda item: int(item[0]))
    fig, axes = plt.subplots(1, 5, figsize=(23, 4.4))
    reward_ax, curve_ax, invalid_ax, entropy_ax, bars_ax = axes
    names: list[str] = []
    values: list[float] = []
    errors: list[tuple[float, float]] = []
    colors: list[Any] = []

    def bar(name: str, estimate: dict[str, Any], color: Any) -> None:
        names.append(name)
        values.append(estimate["value"])
        low, high = estimate.get("low"), estimate.get("high")
        errors.append((estimate["value"] - low, high - estimate["value"]) if low is not None else (0.0, 0.0))
        colors.append(color)

    for index, (seed, result) in enumerate(seeds):
        line = LINES[index % len(LINES)]
        start = result["start"]
        for key, short in (("output_recall", "recall"), ("f_beta", "F2")):
            bar(f"start\n{short}\ns{seed}", start["greedy"][key], "tab:gray")
        for arm, record in result["arms"].items():
            color, label = COLORS.get(arm, "gray"), f"{arm} seed {seed}"
            minutes = [s["train_s"] / 60 for s in record["steps"]]
            if arm != "sft_only":  # SFT steps play the expert: their reward is the expert's
                _curve(reward_ax, minutes, [s["rewards/total"] for s in record["steps"]], color=color, ls=line,
                       marker=".", label=label)  # fmt: skip
                _curve(invalid_ax, minutes, [s["tools/invalid_tool_calls"] for s in record["steps"]], color=color,
                       ls=line, marker=".", label=f"{label} (training samples)")  # fmt: skip
            _curve(entropy_ax, minutes, [s["losses/entropy"] for s in record["steps"]], color=color, ls=line,
                   label=label)  # fmt: skip
            n = record["curve"][0]["tasks"] if record["curve"] else start["greedy"]["tasks"]
            final = record.get("final")
            head = lambda per_task, n=n: sum(per_task[:n]) / n  # noqa: E731 - the curve's task subset
            xs = [0.0] + [c["train_s"] / 60 for c in record["curve"]] + [record.get("train_s", 0.0) / 60]
            ys = [head(start["greedy"]["per_task"]["output_recall"])]
            ys += [c["output_recall"]["value"] for c in record["curve"]]
            ys.append(head(final["greedy"]["per_task"]["output_recall"]) if final else None)
            _curve(curve_ax, xs, ys, color=color, ls=line, marker="o", label=label)
            if final:
                for kind in ("greedy", "sampled"):
                    shade = color if kind == "greedy" else matplotlib.colors.to_rgba(color, 0.45)
                    for key, short in (("output_recall", "recall"), ("f_beta", "F2")):
                        bar(f"{arm}\n{short} {'T0' if kind == 'greedy' else 'T1'}\ns{seed}", final[kind][key], shade)
    minutes = seeds[0][1]["minutes"] if seeds else 0
    shown, trained = DESIGN_LABELS[seeds[0][1].get("design", "onehop") if seeds else "onehop"]
    reward_ax.set(title=f"GRPO training reward (T=1, {trained})", xlabel="training minutes", ylabel="mean reward")
    curve_ax.set(title="held-out greedy output recall", xlabel="training minutes", ylim=(-0.05, 1.05))
    invalid_ax.set(title="invalid tool calls per episode", xlabel="training minutes")
    entropy_ax.set(title="policy entropy (learner, nats/token)", xlabel="training minutes")
    for ax in (reward_ax, curve_ax, invalid_ax, entropy_ax):
        ax.legend(fontsize=7)
    if values:
        bars_ax.bar(range(len(values)), values, yerr=list(zip(*errors, strict=True)), capsize=3, color=colors)
        bars_ax.set_xticks(range(len(values)), names, fontsize=5)
    bars_ax.set(title=f"held-out {trained}: output recall, F-beta(2) (95% CI)", ylim=(0, 1.05))
    fig.suptitle(f"SmolLM2-135M LoRA, Context-1 search: SFT on {shown} questions, then {minutes:g} min per arm "
                 f"of more SFT vs GRPO on {trained} questions (held-out documents)", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
