"""Tasks of the code RL recipe (code.py): which mined task sets train, which are held out, which bug kinds the
demonstrations show, and the per-episode numbers the report needs.

The task sets were mined by ``taskrl datagen codebugs`` from real PyPI sdists (commands in
data/code/README.md); each JSON lies next to its sdist. Training and held-out packages are disjoint, and so are
the bug kinds of the demonstrations (SFT) and of GRPO: ``split_report`` checks both before any run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data" / "code"
TRAIN_SETS = ("semver-3.0.2", "webcolors-1.13", "termcolor-2.4.0", "inflection-0.5.1")
"""Packages whose bugs the warm start and GRPO train on (inflection is the set bundled with taskrl)."""
HELDOUT_SETS = ("jmespath-1.0.1", "pathspec-0.12.1")
"""Packages only the held-out evaluation sees."""
DEMO_KINDS = ("flip comparison", "swap operator", "off by one", "swap boolean operator")
"""Mutation kinds the demonstrations show: one token of an operator or a constant is wrong."""
RL_KINDS = ("drop statement", "negate condition", "drop negation", "swap arguments")
"""Mutation kinds only GRPO trains on: a line is missing, a condition or a negation is inverted, arguments swapped."""
DESIGNS: dict[str, dict[str, Any]] = {
    "edit_file": {"edit_tool": "edit_file", "rl_reward": None, "plot": "code",
                  "about": "edit by exact text (edit_file), the expert's minimal edit; GRPO reward: hidden tests"},
    "lines": {"edit_tool": "replace_lines", "rl_reward": {"valid_tool_use_weight": 0.1}, "plot": "code_lines",
              "about": "edit by line number (replace_lines, read_file numbers lines); GRPO reward: hidden tests + "
                       "0.1 x share of valid tool calls (Composer's term, tamper-gated); evaluation: hidden tests"},
    "pinpoint": {"edit_tool": "replace_lines", "rl_reward": {"valid_tool_use_weight": 0.1}, "plot": "code_pinpoint",
                 "hint_exact": True, "rl_kinds": "all", "hint_lines": 3, "max_turns": 2,
                 "about": "lines, but every prompt names the lines to replace (3 lines of context, 2 turns: read, "
                          "replace); GRPO trains on every kind of the training packages (demonstrated or not)"},
}  # fmt: skip
DESIGNS["pinpoint_strict"] = {
    **DESIGNS["pinpoint"], "plot": "code_pinpoint_strict",
    "rl_reward": {"valid_tool_use_weight": 0.1, "valid_tool_use_counts_errors": True},
    "about": "pinpoint, but the valid-call credit counts only calls that ran without an error (pinpoint's GRPO "
             "farmed it with read_file(path='path'))",
}  # fmt: skip
"""The recipe's designs. ``edit_file`` is the first two runs' (the default, so their commands mean what they
said); ``lines`` is the third: SmolLM2 cannot copy edit_file's exact text at T=1, and every GRPO group scored 0.
Its training reward adds Composer's valid-tool-use credit, which varies within a group even when no sample
fixes the bug (61% of T=1 calls were invalid); a tampering episode still scores 0 (the tamper gate), success
is still "every hidden test passes", and the credit is logged apart (``rewards/valid_tool_use``).
``pinpoint`` is the fourth: in ``lines`` no group's hidden tests ever varied (the 135M model did not find the
buggy line among 13), so every prompt names the line(s) the fix replaces and the episode is read -> replace (the
hidden tests score it; no run_tests turn). GRPO samples every bug kind of the training packages: the
demonstrated ones give it groups with a fix to reinforce, the others are what no demonstration shows.
``hint_lines``/``max_turns`` are a design's defaults (the earlier designs': 6 and 3). ``pinpoint_strict`` is
``pinpoint`` with a credit that well-formed calls which fail earn nothing of: on pinpoint's seed 1 GRPO learned
to read and replace a file named "path" (both calls fail, both counted as valid), the warm start's SFT stage
is the same, so the two designs share it."""
FLAGS = ("tampering", "no_edit", "clarifying_question", "tests_failed_to_run")
"""Per-episode flags of the code env's reward (tampering scores 0; the others are reported)."""


def task_set_path(name: str) -> str:
    """The JSON of a task set: the bundled inflection set, or one under data/code/."""
    if name == "inflection-0.5.1":
        from taskrl.envs.code.tasks import BUILTIN_BUGS

        return str(BUILTIN_BUGS)
    return str(DATA / f"{name}.json")


def env_kwargs(stage: str, hint_lines: int, design: str = "edit_file") -> dict[str, Any]:
    """``code-bugs`` env kwargs of a stage: ``sft`` (demonstration kinds of the training packages), ``rl`` (the
    other kinds of the training packages; every kind where the design's ``rl_kinds`` is "all") or ``eval``
    (every kind of the held-out packages), in ``design``
    (``DESIGNS``; the default design adds nothing, so its configs are the earlier runs')."""
    settings = DESIGNS[design]
    rl_kinds = None if settings.get("rl_kinds") == "all" else RL_KINDS
    sets, kinds = {"sft": (TRAIN_SETS, DEMO_KINDS), "rl": (TRAIN_SETS, rl_kinds), "eval": (HELDOUT_SETS, None)}[stage]
    kwargs: dict[str, Any] = {"tasks_path": [task_set_path(name) for name in sets], "hint_lines": hint_lines}
    if kinds is not None:
        kwargs["kinds"] = list(kinds)
    if settings.get("hint_exact"):
        kwargs["hint_exact"] = True
    if settings["edit_tool"] != "edit_file":
        kwargs["edit_tool"] = settings["edit_tool"]
    if stage == "rl" and settings["rl_reward"]:
        kwargs["config"] = {"reward": dict(settings["rl_reward"])}
    return kwargs


def kind_group(kind: str) -> str:
    return "demo_kinds" if kind in DEMO_KINDS else "rl_kinds"


def disjointness(
    stages: dict[str, list[Any]], metas: dict[str, list[dict[str, Any]]], *, rl_has_sft_kinds: bool = False
) -> dict[str, int]:
    """What the training stages (sft, rl) share with the evaluation, and sft with rl: all must be 0, except the
    sft/rl overlap where GRPO trains on every kind (``rl_has_sft_kinds``: not reported)."""
    train = stages["sft"] + stages["rl"]

    def shared(key: Any, a: list[Any], b: list[Any]) -> int:
        return len({key(x) for x in a} & {key(x) for x in b})

    train_meta, eval_meta = metas["train"], metas["eval"]
    against_eval = {
        "shared_packages": shared(lambda m: m["project"].rsplit("-", 1)[0].lower(), train_meta, eval_meta),
        "shared_sdists": shared(lambda m: m["sdist"]["sha256"], train_meta, eval_meta),
        "shared_repos": shared(lambda t: t.info["base"], train, stages["eval"]),
        "shared_task_ids": shared(lambda t: t.id, train, stages["eval"]),
        "shared_prompts": shared(lambda t: t.prompt, train, stages["eval"]),
    }
    if rl_has_sft_kinds:
        return against_eval
    return {**against_eval, "sft_rl_shared_tasks": shared(lambda t: t.id, stages["sft"], stages["rl"]),
            "sft_rl_shared_kinds": shared(lambda t: t.info["mutation"], stages["sft"], stages["rl"])}  # fmt: skip


def split_report(hint_lines: int, design: str = "edit_file") -> dict[str, Any]:
    """Tasks per stage and kind, the packages, and their disjointness; raises if anything is shared."""
    from taskrl.env import make

    envs = {stage: make("code-bugs", **env_kwargs(stage, hint_lines, design)) for stage in ("sft", "rl", "eval")}
    stages = {stage: list(env.tasks("all")) for stage, env in envs.items()}
    metas = {"train": [s.meta for s in envs["sft"].task_sets], "eval": [s.meta for s in envs["eval"].task_sets]}
    overlaps = disjointness(stages, metas, rl_has_sft_kinds=DESIGNS[design].get("rl_kinds") == "all")
    if any(overlaps.values()):
        raise ValueError(f"the code recipe's training and held-out tasks overlap: {overlaps}")
    kinds = {stage: {} for stage in stages}
    for stage, tasks in stages.items():
        for task in tasks:
            kinds[stage][task.info["mutation"]] = kinds[stage].get(task.info["mutation"], 0) + 1
    return {"tasks": {stage: len(tasks) for stage, tasks in stages.items()}, "kinds": kinds,
            "packages": {"train": list(TRAIN_SETS), "eval": list(HELDOUT_SETS)}, "overlaps": overlaps,
            "hint_lines": hint_lines, "design": design}  # fmt: skip


def episode_row(traj: Any) -> dict[str, Any]:
    """One episode's numbers: reward, hidden-test share, success, flags, tool use. Success is the held-out
    metric's (``taskrl.eval``: an unshaped reward of 1): every hidden test passes and no tool call was invalid
    (an invalid call caps an episode at a failure), whatever else a shaped training reward pays."""
    m = traj.metrics
    row = {
        "task_id": traj.task_id, "reward": traj.reward, "error": traj.error,
        "tests_passed": m.get("tests_passed", 0.0), "valid_tool_use": traj.terms.get("valid_tool_use"),
        "success": float(traj.error is None and m.get("tests_passed", 0.0) >= 1.0 - 1e-9
                         and not m.get("invalid_tool_calls", 0.0)),
        "edits": m.get("edits", 0.0), "tool_calls": m.get("tool_calls", 0.0),
        "invalid_tool_calls": m.get("invalid_tool_calls", 0.0), "turns": m.get("turns", 0.0),
        **{flag: m.get(flag, 0.0) for flag in FLAGS},
        "tampering_detail": traj.info.get("tampering"), "test_failure": (traj.info.get("test_failure") or "")[:200],
        "tools": [c.name for m in traj.messages if m.role == "assistant" for c in m.tool_calls],
        "calls": [f"{c.name} {json.dumps(c.arguments)[:240]}" for m in traj.messages if m.role == "assistant"
                  for c in m.tool_calls][:4],  # fmt: skip
        "final_answer": (traj.final_answer or "")[:300],
    }  # fmt: skip
    row["flagged"] = bool(row["tampering"])
    return row


def flag_report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts of each flag, the best reward of a tampering episode, and whether any beat a failure (0)."""
    flagged = [r for r in rows if r["flagged"]]
    best = max((r["reward"] for r in flagged), default=None)
    return {"episodes": len(rows), **{flag: int(sum(r[flag] > 0 for r in rows)) for flag in FLAGS},
            "errors": sum(r["error"] is not None for r in rows), "best_flagged_reward": best,
            "flagged_never_beat_failure": best is None or best <= 0.0,
            "success": sum(r["success"] for r in rows) / len(rows) if rows else None}  # fmt: skip


def group_variance(rows: list[dict[str, Any]]) -> dict[str, int]:
    """GRPO training groups (one task's samples in one step) whose total reward, and whose hidden-test share,
    differ between samples: where the update had a signal, and where the tests themselves gave it."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["step"], row["task_id"]), []).append(row)

    def varied(key: str) -> int:
        return sum(len({round(r[key], 9) for r in g}) > 1 for g in groups.values())

    return {"groups": len(groups), "reward_varies": varied("reward"), "tests_vary": varied("tests_passed"),
            "with_a_success": sum(any(r["success"] for r in g) for g in groups.values())}  # fmt: skip
