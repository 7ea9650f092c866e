"""The command line: listing and checking envs, rollouts to JSONL, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from taskrl.types import read_jsonl


def taskrl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from taskrl.cli import main; main()", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)


def test_env_list_and_check() -> None:
    out = taskrl("env", "list")
    assert out.returncode == 0, out.stderr
    assert "shop" in out.stdout and "noop" in out.stdout
    check = taskrl("env", "check", "shop")
    assert check.returncode == 0 and "passes check_env" in check.stdout and "lookup_price" in check.stdout


def test_rollout_writes_trajectories_and_run_info(tmp_path: Path) -> None:
    out = tmp_path / "shop.jsonl"
    run = taskrl("rollout", "--env", "shop", "--policy", "scripted", "--n", "3", "--group-size", "2",
                 "--out", str(out))  # fmt: skip
    assert run.returncode == 0, run.stderr
    trajs = read_jsonl(str(out))
    assert len(trajs) == 6 and all(t.reward == 1.0 for t in trajs)
    meta = json.loads(out.with_suffix(".meta.json").read_text())
    assert meta["summary"]["episodes"] == 6 and meta["config"]["group_size"] == 2
    again = taskrl("rollout", "--env", "shop", "--policy", "scripted", "--out", str(out))
    assert again.returncode == 2 and "--overwrite" in again.stderr
    assert len(read_jsonl(str(out))) == 6, "a refused rerun must not touch the earlier results"


def test_user_errors_are_one_line_with_the_fix(tmp_path: Path) -> None:
    cases = {
        ("--env", "nope"): "registered envs: ",
        ("--env", "shop", "--policy", "bogus"): "choose one of: hf, openai, scripted",
        ("--env", "shop", "--policy", "openai"): "needs --base-url",
        ("--env", "shop", "--policy", "openai", "--base-url", "http://127.0.0.1:9/v1"): "start the server",
        ("--env", "shop", "--policy", "hf", "--model", str(tmp_path / "missing")): "no model at",
        ("--env", "shop", "--policy", "scripted", "--max-turns", "0"): "RolloutConfig.max_turns",
    }
    for i, (args, fix) in enumerate(cases.items()):
        run = taskrl("rollout", *args, "--out", str(tmp_path / f"{i}.jsonl"))
        assert run.returncode == 2, (args, run.stdout, run.stderr)
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and fix in lines[0], (args, run.stderr)
