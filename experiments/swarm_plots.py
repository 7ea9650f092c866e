"""Plot of the swarm learning recipe (issue 14): docs/learning_swarm.png from the JSON swarm.py writes.

Panels against training minutes: GRPO training reward, held-out greedy item F1 during training, invalid tool calls
per episode, policy entropy; then the final held-out item F1 (greedy and T=1) with 95% CIs per arm and seed, and
the final greedy critical steps and unfinished sub-agents per episode, the warm start in grey.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.plots import COLORS, LINES, _curve


def _bars(ax: Any, bars: list[tuple[str, dict[str, Any], Any]], title: str, ylim: tuple[float, float] | None) -> None:
    if not bars:
        return
    values = [b[1]["value"] for b in bars]
    errors = [(b[1]["value"] - b[1]["low"], b[1]["high"] - b[1]["value"]) if b[1].get("low") is not None
              else (0.0, 0.0) for b in bars]  # fmt: skip
    ax.bar(range(len(bars)), values, yerr=list(zip(*errors, strict=True)), capsize=3, color=[b[2] for b in bars])
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=5)
    ax.set(title=title, **({"ylim": ylim} if ylim else {}))


def plot_swarm(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted(data["seeds"].items(), key=lambda item: int(item[0]))
    fig, axes = plt.subplots(1, 6, figsize=(27, 4.4))
    reward_ax, curve_ax, invalid_ax, entropy_ax, f1_ax, steps_ax = axes
    f1_bars: list[tuple[str, dict[str, Any], Any]] = []
    step_bars: list[tuple[str, dict[str, Any], Any]] = []
    for index, (seed, result) in enumerate(seeds):
        line = LINES[index % len(LINES)]
        start = result["start"]
        f1_bars.append((f"start\nT0\ns{seed}", start["greedy"]["item_f1"], "tab:gray"))
        step_bars.append((f"start\ncritical\ns{seed}", start["greedy"]["critical_steps"], "tab:gray"))
        step_bars.append((f"start\nunfin.\ns{seed}", start["greedy"]["subagents_unfinished"], "silver"))
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
            ys = [head(start["greedy"]["per_task"]["item_f1"])] + [c["item_f1"]["value"] for c in record["curve"]]
            ys.append(head(final["greedy"]["per_task"]["item_f1"]) if final else None)
            _curve(curve_ax, xs, ys, color=color, ls=line, marker="o", label=label)
            if final:
                for kind in ("greedy", "sampled"):
                    shade = color if kind == "greedy" else matplotlib.colors.to_rgba(color, 0.45)
                    f1_bars.append((f"{arm}\n{'T0' if kind == 'greedy' else 'T1'}\ns{seed}", final[kind]["item_f1"],
                                    shade))  # fmt: skip
                step_bars.append((f"{arm}\ncritical\ns{seed}", final["greedy"]["critical_steps"], color))
                step_bars.append((f"{arm}\nunfin.\ns{seed}", final["greedy"]["subagents_unfinished"],
                                  matplotlib.colors.to_rgba(color, 0.45)))  # fmt: skip
    minutes = seeds[0][1]["minutes"] if seeds else 0
    reward_ax.set(title="GRPO training reward (T=1, 3-row tasks)", xlabel="training minutes", ylabel="parl reward")
    curve_ax.set(title="held-out greedy item F1", xlabel="training minutes", ylim=(-0.05, 1.05))
    invalid_ax.set(title="invalid tool calls per episode", xlabel="training minutes")
    entropy_ax.set(title="policy entropy (learner, nats/token)", xlabel="training minutes")
    for ax in (reward_ax, curve_ax, invalid_ax, entropy_ax):
        ax.legend(fontsize=7)
    _bars(f1_ax, f1_bars, "held-out 3-row tasks: item F1 (95% CI)", (0, 1.05))
    _bars(steps_ax, step_bars, "greedy: critical steps, unfinished sub-agents / episode", None)
    fig.suptitle(f"SmolLM2-135M LoRA orchestrator, frozen scripted search sub-agents: SFT on 1-2 row fan-outs, then "
                 f"{minutes:g} min per arm of more SFT vs GRPO (parl reward) on 3-row tasks (held-out rows)",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
