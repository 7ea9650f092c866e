"""benchmarks/learning/code.py: training and held-out packages share nothing, SFT and GRPO see disjoint bug kinds,
localised tasks name a window that holds the bug, and the hack check catches a flagged episode that scored."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from taskrl.envs.code.env import CodeBugsEnv
from taskrl.envs.code.tasks import BUILTIN_BUGS
from taskrl.training.config import config_from_dict
from taskrl.types import Message

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.learning import code as bench  # noqa: E402
from benchmarks.learning.code_tasks import (  # noqa: E402
    DEMO_KINDS,
    HELDOUT_SETS,
    RL_KINDS,
    TRAIN_SETS,
    disjointness,
    flag_report,
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


def test_stage_configs_are_valid_and_the_arms_train_on_disjoint_kinds(tmp_path: Path) -> None:
    args = SimpleNamespace(max_turns=4, max_new_tokens=160, context=2048, device="cpu", dtype="bfloat16", seed=0,
                           sft_seed=0, concurrency=4, sft_lr=1e-3, hint_lines=6, sft_tasks=4, sft_steps=2,
                           max_steps=100, lr=5e-4, tasks=2, group_size=4, entropy_coef=0.0)  # fmt: skip
    configs = {s: bench.stage_config(s, tmp_path / s, tmp_path / "start", args) for s in ("sft", "sft_only", "grpo")}
    for config in configs.values():
        config_from_dict(dict(config))
    assert configs["sft"]["env_kwargs"] == configs["sft_only"]["env_kwargs"]
    assert configs["sft"]["env_kwargs"]["kinds"] == list(DEMO_KINDS)
    assert configs["grpo"]["env_kwargs"]["kinds"] == list(RL_KINDS) and configs["grpo"]["algo"] == "grpo"
