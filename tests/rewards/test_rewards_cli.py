"""``taskrl rewards list|score``: presets listed; saved trajectories re-scored term by term, cheats exposed."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from taskrl.env import make
from taskrl.envs.builtin import PRICES, ShopEnv
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rewards.cli import rewards_app
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.types import Message, Trajectory, read_jsonl, write_jsonl

runner = CliRunner()


def fabricator(messages: list[Message], tools: Any) -> str:
    order = re.findall(r"(\d+) x (\w+)", messages[1].content)
    return str(sum(int(q) * PRICES[item] for q, item in order))


def test_list_shows_every_preset() -> None:
    result = runner.invoke(rewards_app, ["list"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in ("context1", "parl", "seed_weighted", "composer", "grounding", "tests_intact"):
        assert name in result.output


def test_score_rescores_saved_trajectories_and_exposes_fabrication(tmp_path: Path) -> None:
    tasks = list(make("shop").tasks())[:3]
    played = []
    for seed, rule in enumerate((ShopEnv.scripted_rule, fabricator)):  # the seed keeps the runs' group ids apart
        config = RolloutConfig(group_size=2, seed=seed)
        played += asyncio.run(run_episodes(lambda: make("shop"), ScriptedPolicy(rule), tasks, config))
    path, out = tmp_path / "trajs.jsonl", tmp_path / "rescored.jsonl"
    write_jsonl(str(path), played)
    args = ["score", str(path), "--preset", "seed_weighted", "--env", "shop", "--answer-mode", "number"]
    args += ["--out", str(out)]
    result = runner.invoke(rewards_app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "grounding_cap (gate)" in result.output and "stability" in result.output
    rescored = read_jsonl(str(out))
    honest, fabricated = rescored[:6], rescored[6:]
    assert all(t.rewards["completion"] == 0.4 for t in rescored)  # every answer is right...
    assert all(t.terms["grounding"] == 1.0 for t in honest)
    assert all(t.terms["grounding"] == 0.0 for t in fabricated)
    assert all(t.rewards["stability"] == 0.3 for t in rescored)  # each pair of samples agrees
    assert all(t.reward == 0.0 for t in fabricated) and all(t.reward == 0.7 for t in honest)  # ...few are earned
    assert json.loads(path.read_text().splitlines()[0])["rewards"] == {"correct": 1.0}  # the input is untouched


def test_score_errors_name_the_fix(tmp_path: Path) -> None:
    result = runner.invoke(rewards_app, ["score", str(tmp_path / "nope.jsonl"), "--preset", "parl"])
    assert result.exit_code != 0 and "no trajectories file" in str(result.exception)
    (tmp_path / "t.jsonl").write_text("")
    result = runner.invoke(rewards_app, ["score", str(tmp_path / "t.jsonl"), "--preset", "parl"])
    assert "holds no trajectories" in str(result.exception)
    write_jsonl(str(tmp_path / "t.jsonl"), [Trajectory()])
    result = runner.invoke(
        rewards_app, ["score", str(tmp_path / "t.jsonl"), "--preset", "composer", "--answer-mode", "number"]
    )
    assert "--answer-mode applies to parl, seed_weighted" in str(result.exception)
