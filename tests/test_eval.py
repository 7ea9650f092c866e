"""Evaluation: pass@k golden values and properties, bootstrap CIs, side-by-side policies, files, resume, CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskrl.env import make
from taskrl.eval import EvalConfig, EvalError, bootstrap_ci, evaluate, paired_delta, pass_at_k
from taskrl.policies.base import Completion, PolicyError
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.runlog import RunLog, read_trajectories


def test_pass_at_k_golden_values() -> None:
    assert pass_at_k(10, 1, 1) == pytest.approx(0.1)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(200, 13, 10) == pytest.approx(1 - math.comb(187, 10) / math.comb(200, 10))
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0 and pass_at_k(3, 3, 1) == 1.0
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(3, 4, 1)


@given(st.integers(1, 60).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_matches_the_combinatorial_definition(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    value = pass_at_k(n, c, k)
    assert value == pytest.approx(exact, abs=1e-9) and 0.0 <= value <= 1.0
    if k < n:
        assert pass_at_k(n, c, k + 1) >= value - 1e-12, "more tries never lower pass@k"


def test_paired_delta_is_the_mean_per_task_difference_and_empty_has_none() -> None:
    delta = paired_delta([0, 0, 1, 1], [1, 1, 1, 0], seed=0)
    assert delta["value"] == 0.25 and delta["low"] <= 0.25 <= delta["high"]
    assert paired_delta([], []) == {"value": None, "low": None, "high": None}
    with pytest.raises(ValueError):
        paired_delta([1.0], [1.0, 0.0])  # not the same tasks


def test_bootstrap_ci_brackets_the_mean_and_narrows_with_more_tasks() -> None:
    few = [0.0, 1.0] * 5
    many = [0.0, 1.0] * 200
    low, high = bootstrap_ci(few, seed=1)
    assert low < 0.5 < high and low >= 0.0 and high <= 1.0
    low2, high2 = bootstrap_ci(many, seed=1)
    assert high2 - low2 < (high - low) / 3
    assert bootstrap_ci([1.0]) is None, "one task has no spread to resample"
    assert bootstrap_ci(few, seed=3) == bootstrap_ci(few, seed=3)


def wrong_policy() -> ScriptedPolicy:
    """Answers at once, without tools: always wrong on shop."""
    return ScriptedPolicy.from_turns(["The total is 0."], name="wrong")


def half_right(env: Any) -> ScriptedPolicy:
    """The expert on even-numbered tasks, a wrong answer on odd ones."""

    def rule(messages: Any, tools: Any) -> str:
        prompt = next(m.content for m in messages if m.role == "user")
        odd = sum(map(ord, prompt)) % 2
        return "The total is 0." if odd else env.scripted_rule(messages, tools)

    return ScriptedPolicy(rule, name="half")


async def test_side_by_side_results_files_and_per_task_table(tmp_path: Path) -> None:
    env = make("shop")
    tasks = list(env.tasks("test"))[:6]
    policies = {"expert": ScriptedPolicy(env.scripted_rule), "half": half_right(env), "wrong": wrong_policy()}
    log = RunLog(tmp_path)
    config = EvalConfig(samples_per_task=3, pass_ks=(1, 2), bootstrap_resamples=500)
    result = await evaluate(lambda: make("shop"), policies, tasks, config, run_log=log, name="final")

    expert, half, wrong = (result["policies"][k] for k in ("expert", "half", "wrong"))
    assert expert["mean_reward"]["value"] == 1.0 and expert["pass@1"]["value"] == 1.0
    assert expert["mean_reward"]["low"] == expert["mean_reward"]["high"] == 1.0
    assert wrong["success_rate"]["value"] == 0.0 and wrong["pass@3"]["value"] == 0.0
    assert 0.0 < half["mean_reward"]["value"] < 1.0
    assert half["mean_reward"]["low"] < half["mean_reward"]["value"] < half["mean_reward"]["high"]
    assert wrong["delta_mean_reward_vs_expert"]["value"] == -1.0
    assert "early_termination" in {a["monitor"] for a in wrong["alerts"]}
    assert expert["monitors"]["monitor/invalid_call_rate"] == 0.0
    assert [row["task_id"] for row in result["per_task"]] == [t.id for t in tasks]
    row = result["per_task"][0]["policies"]
    assert row["expert"] == {"n": 3, "successes": 3, "mean_reward": 1.0, "pass@1": 1.0, "pass@2": 1.0, "pass@3": 1.0}
    assert "bootstrap" in result["ci_method"]

    saved = json.loads((tmp_path / "eval" / "final.json").read_text())
    assert saved["policies"]["half"]["mean_reward"] == half["mean_reward"]
    trajectories = read_trajectories(tmp_path, "final-expert")[0]
    assert len(trajectories) == 18 and {t.task_id for t in trajectories} == {t.id for t in tasks}
    assert json.loads((tmp_path / "config.json").read_text())["command"] == "eval"


class Crashing(ScriptedPolicy):
    """The expert that loses its backend after ``budget`` turns (an interrupted evaluation)."""

    def __init__(self, rule: Any, budget: int) -> None:
        super().__init__(rule)
        self.budget = budget
        self.calls = 0

    async def generate(self, **kwargs: Any) -> Completion:
        self.calls += 1
        if self.calls > self.budget:
            raise PolicyError("backend went away")
        return await super().generate(**kwargs)


async def test_interrupted_evaluation_resumes_without_replaying_finished_episodes(tmp_path: Path) -> None:
    env = make("shop")
    tasks = list(env.tasks("test"))[:4]
    config = EvalConfig(samples_per_task=2, concurrency=1)
    with pytest.raises(PolicyError):
        await evaluate(lambda: make("shop"), {"expert": Crashing(env.scripted_rule, 10)}, tasks, config,
                       run_log=RunLog(tmp_path))  # fmt: skip
    finished = read_trajectories(tmp_path, "eval-expert")[0]
    assert 0 < len(finished) < 8
    resumed_policy = Crashing(env.scripted_rule, 10_000)
    resumed = await evaluate(lambda: make("shop"), {"expert": resumed_policy}, tasks, config,
                             run_log=RunLog(tmp_path))  # fmt: skip
    fresh_policy = Crashing(env.scripted_rule, 10_000)
    fresh = await evaluate(lambda: make("shop"), {"expert": fresh_policy}, tasks, config,
                           run_log=RunLog(tmp_path / "b"))  # fmt: skip
    assert resumed_policy.calls < fresh_policy.calls, "finished episodes must not be played again"
    for key in ("mean_reward", "success_rate", "pass@2"):
        assert resumed["policies"]["expert"][key] == fresh["policies"]["expert"][key]
    assert len(read_trajectories(tmp_path, "eval-expert")[0]) == 8


async def test_bad_configs_fail_naming_the_field() -> None:
    with pytest.raises(ValueError, match="EvalConfig.pass_ks"):
        EvalConfig(samples_per_task=2, pass_ks=(4,))
    with pytest.raises(ValueError, match="EvalConfig.confidence"):
        EvalConfig(confidence=1.5)
    assert EvalConfig(samples_per_task=8, pass_ks=(1, 4)).pass_ks == (1, 4, 8)
    with pytest.raises(EvalError, match="no tasks"):
        await evaluate(lambda: make("shop"), {"p": wrong_policy()}, [])


def test_eval_command_compares_policies_and_fails_in_one_line(tmp_path: Path) -> None:
    def taskrl(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-c", "from taskrl.cli import main; main()", "eval", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    run = taskrl("--env", "shop", "--policy", "scripted", "--n", "3", "--k", "2", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert "pass@1" in run.stdout and "scripted" in run.stdout and "1.000" in run.stdout
    assert json.loads((tmp_path / "eval" / "eval.json").read_text())["policies"]["scripted"]["episodes"] == 6
    bad = taskrl("--env", "shop", "--k", "2", "--pass-k", "3", "--out", str(tmp_path / "x"))
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert bad.returncode == 2 and len(lines) == 1 and "EvalConfig.pass_ks" in lines[0], bad.stderr


def test_eval_command_shows_progress(tmp_path) -> None:
    """Issue 38: `taskrl eval` showed nothing until the end; it now has a progress bar per policy."""
    from typer.testing import CliRunner

    from taskrl.cli import app

    run = CliRunner().invoke(app, ["eval", "--env", "shop", "--policy", "scripted", "--n", "3", "--k", "2",
                                   "--out", str(tmp_path)])  # fmt: skip
    assert run.exit_code == 0, run.output
    assert "eval scripted" in run.output and "6/6" in run.output and "reward 1.00" in run.output
