"""The reverse-text, countdown and arithmetic studies (issue 40) end to end on a tiny random model: one step of
every arm, held-out evaluation on >= 64 tasks, one new record per arm, the test split refused until the design is
frozen."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from experiments import arithmetic, countdown, reverse_text
from experiments.ladder import main
from experiments.study import StandardError, Study, index_markdown
from taskrl.policies.models import tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny")
    model, tokenizer = tiny_model(seed=0)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


def _args(tiny_dir: Path, tmp_path: Path, *extra: str) -> list[str]:
    return ["--model-path", str(tiny_dir), "--seeds", "0", "--max-steps", "1", "--minutes", "1", "--eval-tasks", "64",
            "--warm-steps", "1", "--warm-tasks", "2", "--tasks-per-step", "2", "--group-size", "2",
            "--max-new-tokens", "24", "--runs-dir", str(tmp_path / "runs"), "--work-dir", str(tmp_path / "work"),
            "--threads", "1", *extra]  # fmt: skip


def test_reverse_text_runs_every_arm_for_one_step(tiny_dir: Path, tmp_path: Path) -> None:
    began = time.monotonic()
    paths = main(reverse_text.SPEC, _args(tiny_dir, tmp_path, "--overlong-filter"))
    assert time.monotonic() - began < 60 * 3  # < 60 s on a quiet machine; slack for a shared one
    records = [json.loads(p.read_text()) for p in paths]
    assert [r["arm"] for r in records] == ["start", "sft_more", "rft", "grpo"]
    assert all(r["split"] == "val" and r["primary"] == "reward" and r["held_out_tasks"] == 64 for r in records)
    assert all(0.0 <= r["outcome"]["reward"]["value"] <= 1.0 for r in records)
    assert records[0]["warm_start"]["steps"] == 1 and records[0]["warm_start"]["rewards"] == [1.0]  # the expert
    trained = {r["arm"]: r["budget"] for r in records[1:]}
    assert all(b["steps"] == 1 for b in trained.values())
    assert trained["rft"]["episodes"] == trained["grpo"]["episodes"] == 4.0  # matched sample budget
    assert trained["sft_more"]["episodes"] == 4.0
    assert records[3]["config"]["overlong_filter"] is True and records[0]["machine"]["engine"] == "hf-inprocess"
    assert "| grpo |" in index_markdown(tmp_path / "runs")


def test_countdown_reports_pass_at_k_and_chance(tiny_dir: Path, tmp_path: Path) -> None:
    args = _args(tiny_dir, tmp_path, "--arms", "grpo", "--eval-samples", "3", "--max-new-tokens", "8")
    paths = main(countdown.SPEC, args)
    records = [json.loads(p.read_text()) for p in paths]
    assert [r["arm"] for r in records] == ["start", "grpo"]
    outcome = records[1]["outcome"]
    assert {"pass@1", "pass@3", "chance_pass@1", "chance_pass@3"} <= set(outcome)  # the study runs K = 16
    assert 0 < outcome["chance_pass@1"] < outcome["chance_pass@3"] < 1
    assert outcome["successes"]["n"] == 64 * 3 and records[1]["primary"] == "pass@1"


def test_env_settings_and_start_seeds_reach_every_run(tiny_dir: Path, tmp_path: Path) -> None:
    args = _args(tiny_dir, tmp_path, "--arms", "grpo", "--eval-samples", "1", "--max-new-tokens", "8",
                 "--env-kwargs", '{"format_credit": 0.1}', "--start-seeds", "7")  # fmt: skip
    (path,) = main(countdown.SPEC, args)  # seed 0 is not a start seed: its start is the base, not evaluated
    record = json.loads(path.read_text())
    assert record["arm"] == "grpo" and record["config"]["env_kwargs"]["format_credit"] == 0.1
    with pytest.raises(SystemExit):
        main(countdown.SPEC, _args(tiny_dir, tmp_path, "--env-kwargs", "[1]"))


def test_the_test_split_needs_a_frozen_design(tiny_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(StandardError, match="not frozen"):
        main(countdown.SPEC, _args(tiny_dir, tmp_path, "--split", "test", "--arms", "grpo"))
    with pytest.raises(StandardError, match="32 distinct tasks .* needs >= 64"):
        main(countdown.SPEC, [*_args(tiny_dir, tmp_path, "--arms", "grpo")[:-2], "--eval-tasks", "32"])
    assert Study("countdown", tmp_path / "runs").runs() == []


def test_arithmetic_runs_without_a_warm_start_and_its_start_alone(tiny_dir: Path, tmp_path: Path) -> None:
    args = _args(tiny_dir, tmp_path, "--arms", "rft", "--eval-samples", "2", "--max-new-tokens", "8")
    records = [json.loads(p.read_text()) for p in main(arithmetic.SPEC, args)]
    assert [r["arm"] for r in records] == ["start", "rft"] and "warm_start" not in records[0]
    assert records[0]["start_model"] == str(tiny_dir) and {"pass@1", "pass@2"} <= set(records[1]["outcome"])
    # `--arms start`: the base model's evaluation for more seeds, after the arms ran
    only_start = [*_args(tiny_dir, tmp_path, "--arms", "start", "--eval-samples", "1"), "--seeds", "3"]
    (path,) = main(arithmetic.SPEC, only_start)
    record = json.loads(path.read_text())
    assert (record["arm"], record["seed"], record["budget"]["steps"]) == ("start", 3, 0)
