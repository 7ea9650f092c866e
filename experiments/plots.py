"""Plots of the learning recipes (issue 14): curves per arm and seed, and the final held-out comparison.

``plot_tool_use(data, path)`` draws docs/learning_tool_use.png from the JSON that tool_use.py writes
(``{"seeds": {"0": {...}, ...}}``): training reward, held-out greedy success during training, invalid calls
per episode and policy entropy, each against training minutes, then the final held-out success with 95% CIs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = {"sft_only": "tab:blue", "sft3": "tab:green", "rft": "tab:orange", "grpo": "tab:red"}
DESIGN_TITLES = {
    "prices3": ("held-out 3-item price listings", "SFT on 1-2 item price listings, then {budget} per arm of more SFT "
                "vs GRPO on 3-item listings (prices env)"),
    "prices3g": ("held-out 3-item price listings", "SFT on 1-2 item price listings, then {budget} per arm of more "
                 "SFT vs GRPO on 3-item listings (prices env; generalisation sets evaluated)"),
    "prices": ("held-out 2-3 item price listings", "SFT on 1-item price listings, then {budget} per arm of more SFT "
               "vs GRPO on 2-3 item listings (prices env)"),
    "code": ("held-out packages' bugs, all kinds", "SFT on 4 bug kinds of 4 packages, then {budget} per arm of more "
             "SFT vs GRPO on 4 other kinds (code-bugs env, hidden tests)"),
    "code_lines": ("held-out packages' bugs, all kinds", "SFT on 4 bug kinds of 4 packages, then {budget} per arm "
                   "of more SFT vs GRPO on 4 other kinds (code-bugs env, edits by line number)"),
    "code_pinpoint": ("held-out packages' bugs, all kinds", "SFT on 4 bug kinds of 4 packages, then {budget} per "
                      "arm of more SFT vs GRPO on all 8 kinds (code-bugs env, the lines to fix named)"),
    "code_pinpoint_strict": ("held-out packages' bugs, all kinds", "SFT on 4 bug kinds of 4 packages, then {budget} "
                             "per arm of more SFT vs GRPO on all 8 kinds (lines to fix named; credit for calls "
                             "that ran)"),
    "shop": ("held-out multi-item orders", "SFT on single-item orders, then {budget} per arm of more SFT vs GRPO on "
             "multi-item orders (shop env)"),
}  # fmt: skip
LINES = ("-", "--", ":", "-.")


def _curve(ax: Any, xs: list[float], ys: list[Any], **style: Any) -> None:
    points = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
    if points:
        ax.plot([p[0] for p in points], [p[1] for p in points], **style)


def plot_tool_use(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted(data["seeds"].items(), key=lambda item: int(item[0]))
    fig, axes = plt.subplots(1, 5, figsize=(22, 4.2))
    reward_ax, curve_ax, invalid_ax, entropy_ax, bars_ax = axes
    names, values, errors, colors = [], [], [], []
    for index, (seed, result) in enumerate(seeds):
        line = LINES[index % len(LINES)]
        start = result["start"]["greedy"]
        names.append(f"start\ngreedy\ns{seed}")
        values.append(start["success"]["value"])
        errors.append((start["success"]["value"] - start["success"]["low"],
                       start["success"]["high"] - start["success"]["value"]))  # fmt: skip
        colors.append("tab:gray")
        for arm, record in result["arms"].items():
            color, label = COLORS.get(arm, "gray"), f"{arm} seed {seed}"
            minutes = [s["train_s"] / 60 for s in record["steps"]]
            if arm not in ("sft_only", "sft3"):  # expert SFT steps: their reward is the expert's, not the policy's
                _curve(reward_ax, minutes, [s["rewards/total"] for s in record["steps"]], color=color, ls=line,
                       marker=".", label=label)  # fmt: skip
                _curve(invalid_ax, minutes, [s["tools/invalid_tool_calls"] for s in record["steps"]], color=color,
                       ls=line, marker=".", label=f"{label} (training samples)")  # fmt: skip
            _curve(entropy_ax, minutes, [s["losses/entropy"] for s in record["steps"]], color=color, ls=line,
                   label=label)  # fmt: skip
            n = record["curve"][0]["tasks"] if record["curve"] else len(start["per_task"])
            xs = [0.0] + [c["train_s"] / 60 for c in record["curve"]] + [record.get("train_s", 0.0) / 60]
            ys = [sum(start["per_task"][:n]) / n] + [c["success"]["value"] for c in record["curve"]]
            final = record.get("final")
            ys.append(sum(final["greedy"]["per_task"][:n]) / n if final else None)
            _curve(curve_ax, xs, ys, color=color, ls=line, marker="o", label=label)
            if final:
                for kind, key in (("greedy", "success"), ("sampled", "pass@1")):
                    if kind not in final:
                        continue  # --sampled-samples 0
                    estimate = final[kind][key]
                    names.append(f"{arm}\n{kind}\ns{seed}")
                    values.append(estimate["value"])
                    errors.append((estimate["value"] - estimate["low"], estimate["high"] - estimate["value"]))
                    colors.append(color if kind == "greedy" else matplotlib.colors.to_rgba(color, 0.45))
    minutes = seeds[0][1]["minutes"] if seeds else 0
    reward_ax.set(title="GRPO training reward (T=1 samples)", xlabel="training minutes", ylabel="mean reward")
    curve_ax.set(title="held-out greedy success", xlabel="training minutes", ylabel="success", ylim=(-0.05, 1.05))
    invalid_ax.set(title="invalid tool calls per episode", xlabel="training minutes")
    entropy_ax.set(title="policy entropy (learner, nats/token)", xlabel="training minutes")
    for ax in (reward_ax, curve_ax, invalid_ax, entropy_ax):
        ax.legend(fontsize=7)
    if values:
        bars_ax.bar(range(len(values)), values, yerr=list(zip(*errors, strict=True)), capsize=3, color=colors)
        bars_ax.set_xticks(range(len(values)), names, fontsize=6)
    design = seeds[0][1].get("design", "shop") if seeds else "shop"
    bars_title, title = DESIGN_TITLES.get(design, DESIGN_TITLES["shop"])
    bars_ax.set(title=f"{bars_title} (95% CI)", ylim=(0, 1.05))
    trained = [record for _, seed in seeds for record in seed["arms"].values()]
    if trained and all(r.get("train_s", 0.0) < 0.9 * minutes * 60 for r in trained):  # a step cap ended every arm
        counts = sorted({len(r["steps"]) for r in trained})
        budget = f"{counts[0]} steps" if len(counts) == 1 else f"{counts[0]}-{counts[-1]} steps"
    else:
        budget = f"{minutes:g} min"
    fig.suptitle(f"SmolLM2-135M LoRA: {title.format(budget=budget)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
