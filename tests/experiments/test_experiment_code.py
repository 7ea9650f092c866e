"""experiments/code.py: training and held-out packages share nothing, SFT and GRPO see disjoint bug kinds,
localised tasks name a window that holds the bug, the hack check catches a flagged episode that scored, and the
``lines`` design edits by line number with a valid-tool-use credit that tampering cannot earn."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from taskrl.env import make
from taskrl.envs.code.env import CodeBugsEnv
from taskrl.envs.code.tasks import BUILTIN_BUGS
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episode
from taskrl.scoring import Clock
from taskrl.training.config import config_from_dict
from taskrl.types import Message, Trajectory

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments import code as bench  # noqa: E402
from experiments.code_tasks import (  # noqa: E402
    DEMO_KINDS,
    HELDOUT_SETS,
    RL_KINDS,
    TRAIN_SETS,
    disjointness,
    env_kwargs,
    episode_row,
    flag_report,
    group_variance,
    split_report,
)


def test_the_split_shares_no_package_sdist_task_or_kind() -> None:
    report = split_report(hint_lines=6)
    assert not set(TRAIN_SETS) & set(HELDOUT_SETS) and len(TRAIN_SETS) + len(HELDOUT_SETS) >= 5
    assert not set(DEMO_KINDS) & set(RL_KINDS)
    assert set(report["overlaps"].values()) == {0}
    assert set(report["kinds"]["sft"]) <= set(DEMO_KINDS) and set(report["kinds"]["rl"]) <= set(RL_KINDS)
    assert set(report["kinds"]["eval"]) & set(DEMO_KINDS) and set(report["kinds"]["eval"]) & set(RL_KINDS)
    assert min(report["tasks"].values()) >= 20


def test_disjointness_counts_what_is_shared() -> None:
    env = CodeBugsEnv(str(BUILTIN_BUGS))
    tasks = list(env.tasks("all"))
    meta = [env.task_sets[0].meta]
    overlaps = disjointness({"sft": tasks[:2], "rl": tasks[2:4], "eval": tasks[3:5]}, {"train": meta, "eval": meta})
    assert overlaps["shared_packages"] == overlaps["shared_sdists"] == 1
    assert overlaps["shared_task_ids"] == 1 and overlaps["shared_repos"] == 1
    assert overlaps["sft_rl_shared_tasks"] == 0


def test_localised_tasks_name_a_window_inside_the_function_that_holds_the_bug() -> None:
    plain = CodeBugsEnv(str(BUILTIN_BUGS))
    env = CodeBugsEnv([str(BUILTIN_BUGS)], kinds=["drop statement", "flip comparison"], hint_lines=3)
    tasks = list(env.tasks("all"))
    assert {t.info["mutation"] for t in tasks} == {"drop statement", "flip comparison"}
    assert len(tasks) == sum(t.info["mutation"] in ("drop statement", "flip comparison") for t in plain.tasks("all"))
    for task in tasks:
        start, end = task.info["read_window"]
        edit = task.info["gold"]["edit"]
        window = "".join(task.info["files"][edit["path"]].splitlines(keepends=True)[start - 1 : end])
        assert edit["old"] in window and end - start + 1 <= edit["old"].count("\n") + 6
        assert task.prompt.endswith(f"The bug is in `{edit['path']}`, lines {start}-{end}.")
        first = env.scripted_rule([Message("user", task.prompt)], None)
        assert f'"start_line": {start}' in first and f'"end_line": {end}' in first
    with pytest.raises(ValueError, match="no task of kinds"):
        CodeBugsEnv(str(BUILTIN_BUGS), kinds=["no such kind"])


def test_flag_report_catches_a_tampering_episode_that_scored() -> None:
    row = {"reward": 0.0, "success": 0.0, "error": None, "tampering": 0.0, "no_edit": 1.0,
           "clarifying_question": 0.0, "tests_failed_to_run": 0.0, "flagged": False}  # fmt: skip
    clean = flag_report([row, {**row, "tampering": 1.0, "flagged": True}])
    assert clean["tampering"] == 1 and clean["no_edit"] == 2 and clean["flagged_never_beat_failure"]
    hacked = flag_report([{**row, "tampering": 1.0, "flagged": True, "reward": 0.5}])
    assert not hacked["flagged_never_beat_failure"] and hacked["best_flagged_reward"] == 0.5


def stage_args(design: str) -> SimpleNamespace:
    return SimpleNamespace(max_turns=4, max_new_tokens=160, context=2048, device="cpu", dtype="bfloat16", seed=0,
                           sft_seed=0, concurrency=4, sft_lr=1e-3, hint_lines=6, sft_tasks=4, sft_steps=2,
                           max_steps=100, lr=5e-4, tasks=2, group_size=4, entropy_coef=0.0, design=design,
                           micro_batch_tokens=0)  # fmt: skip


def test_stage_configs_are_valid_and_the_arms_train_on_disjoint_kinds(tmp_path: Path) -> None:
    configs = {s: bench.stage_config(s, tmp_path / s, tmp_path / "start", stage_args("edit_file"))
               for s in ("sft", "sft_only", "grpo")}  # fmt: skip
    for config in configs.values():
        config_from_dict(dict(config))
        assert set(config["env_kwargs"]) <= {"tasks_path", "hint_lines", "kinds"}  # the earlier runs' configs
    assert configs["sft"]["env_kwargs"] == configs["sft_only"]["env_kwargs"]
    assert configs["sft"]["env_kwargs"]["kinds"] == list(DEMO_KINDS)
    assert configs["grpo"]["env_kwargs"]["kinds"] == list(RL_KINDS) and configs["grpo"]["algo.name"] == "grpo"
    assert all("micro_batch_tokens" not in config for config in configs.values())
    args = stage_args("edit_file")
    args.micro_batch_tokens = 1024
    small = {s: bench.stage_config(s, tmp_path / s, tmp_path / "start", args) for s in ("sft", "sft_only", "grpo")}
    assert small["sft"] == configs["sft"]  # the warm start is the same checkpoint
    assert small["grpo"]["micro_batch_tokens"] == small["sft_only"]["micro_batch_tokens"] == 1024


def test_the_lines_design_edits_by_number_everywhere_and_shapes_only_the_grpo_reward(tmp_path: Path) -> None:
    configs = {s: bench.stage_config(s, tmp_path / s, tmp_path / "start", stage_args("lines"))
               for s in ("sft", "sft_only", "grpo")}  # fmt: skip
    envs = {stage: make("code-bugs", **configs[stage]["env_kwargs"]) for stage in configs}
    envs["eval"] = make("code-bugs", **env_kwargs("eval", 6, "lines"))
    for stage, env in envs.items():
        config_from_dict(dict(configs.get(stage, configs["sft"])))
        assert "replace_lines" in env.tools.names and "edit_file" not in env.tools.names, stage
        assert env.line_numbers, stage
    assert envs["grpo"].rubric.weights(Clock()) == {"tests": 1.0, "valid_tool_use": 0.1}
    for stage in ("sft", "sft_only", "eval"):  # success and the evaluation stay "every hidden test passes"
        assert envs[stage].rubric.weights(Clock()) == {"tests": 1.0}, stage


def test_the_pinpoint_design_names_the_fix_lines_and_grpo_samples_every_training_kind(tmp_path: Path) -> None:
    """pinpoint: every stage's prompt names the lines to replace inside its read window; GRPO trains on every
    kind of the training packages (the demonstrated ones too), and the held-out packages stay unseen."""
    report = split_report(hint_lines=3, design="pinpoint")
    assert set(report["overlaps"]) == {"shared_packages", "shared_sdists", "shared_repos", "shared_task_ids",
                                       "shared_prompts"} and set(report["overlaps"].values()) == {0}  # fmt: skip
    assert set(report["kinds"]["rl"]) == set(DEMO_KINDS) | set(RL_KINDS)
    assert set(report["kinds"]["sft"]) <= set(DEMO_KINDS)
    args = stage_args("pinpoint")
    args.hint_lines = 3
    configs = {s: bench.stage_config(s, tmp_path / s, tmp_path / "start", args) for s in ("sft", "sft_only", "grpo")}
    assert "kinds" not in configs["grpo"]["env_kwargs"] and configs["sft"]["env_kwargs"]["kinds"] == list(DEMO_KINDS)
    envs = {stage: make("code-bugs", **configs[stage]["env_kwargs"]) for stage in configs}
    envs["eval"] = make("code-bugs", **env_kwargs("eval", 3, "pinpoint"))
    for stage, env in envs.items():
        config_from_dict(dict(configs.get(stage, configs["sft"])))
        assert "replace_lines" in env.tools.names and "edit_file" not in env.tools.names, stage
        for task in env.tasks("all"):
            first, last = task.info["fix_lines"]
            start, end = task.info["read_window"]
            assert start <= first <= last <= end, (stage, task.id)
            named = f"line {first}" if first == last else f"lines {first}-{last}"
            assert task.prompt.endswith(f"{named} (read lines {start}-{end} around it)."), task.prompt
    assert envs["grpo"].rubric.weights(Clock()) == {"tests": 1.0, "valid_tool_use": 0.1}
    assert envs["eval"].rubric.weights(Clock()) == {"tests": 1.0}
    with pytest.raises(ValueError, match="needs hint_lines > 0"):
        CodeBugsEnv(str(BUILTIN_BUGS), hint_exact=True)


async def test_tampering_earns_no_valid_tool_use_credit(tmp_path: Path) -> None:
    """A GRPO-stage episode of the lines design that edits a test with valid calls scores 0 in total, though its
    valid-tool-use term is 1: the tamper gate holds the shaping too."""
    kwargs = env_kwargs("rl", 6, "lines")
    task = make("code-bugs", **kwargs).tasks("all")[0]
    tests = task.info["test_targets"][0]
    edit_a_test = f"find {tests} -name 'test_*.py' | head -1 | xargs sed -i 's/==/!=/'"
    rule = ScriptedPolicy.from_turns(
        [ScriptedPolicy.call("run_command", command=edit_a_test), ScriptedPolicy.call("run_tests"), "Fixed."]
    ).rule
    env = make("code-bugs", **kwargs)
    try:
        traj = await run_episode(env, ScriptedPolicy(rule), task, RolloutConfig(max_turns=3), seed=0)
    finally:
        env.close()
    assert traj.metrics["tampering"] == 1.0 and traj.terms["valid_tool_use"] == 1.0
    assert traj.reward == 0.0 and episode_row(traj)["flagged"] and not episode_row(traj)["success"]


def test_success_is_every_hidden_test_passing_whatever_the_credit() -> None:
    def traj(tests: float, valid: float) -> Trajectory:
        t = Trajectory(id="x", task_id="t", rewards={"tests": tests, "valid_tool_use": 0.1 * valid})
        t.terms = {"tests": tests, "valid_tool_use": valid}
        t.metrics.update({"tests_passed": tests, "tampering": 0.0})
        return t

    near = episode_row(traj(0.95, 1.0))
    assert near["reward"] >= 1.0 and not near["success"] and episode_row(traj(1.0, 0.0))["success"]
    sloppy = traj(1.0, 0.5)
    sloppy.metrics["invalid_tool_calls"] = 1.0  # capped at a failure, as the held-out evaluation counts it
    assert not episode_row(sloppy)["success"]
    rows = [{"step": 1, "task_id": "a", "reward": r, "tests_passed": 0.0, "success": 0.0} for r in (0.0, 0.1)]
    rows += [{"step": 1, "task_id": "b", "reward": 0.1, "tests_passed": 0.0, "success": 0.0}] * 2
    rows += [{"step": 2, "task_id": "a", "reward": r, "tests_passed": r, "success": r} for r in (0.0, 1.0)]
    assert group_variance(rows) == {"groups": 3, "reward_varies": 2, "tests_vary": 1, "with_a_success": 1}
