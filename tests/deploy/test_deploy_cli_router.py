"""`taskrl serve`/`cycle` canary flags: they reach the served router's rule, and a bad one fails naming its flag."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import typer
from typer.testing import CliRunner

from taskrl.cli import app
from taskrl.deploy.cli import router_config
from tests.deploy.test_deploy_cli import free_port


def test_flags_build_the_router_rule_and_bad_values_name_their_flag() -> None:
    rule = router_config(0.1, "0.1,0.5,1", 7, 5, 0.02, 0.05, 40)
    assert (rule.stages, rule.min_samples, rule.rollback_min_samples) == ((0.1, 0.5, 1.0), 7, 5)
    assert (rule.holdout, rule.rollback_margin, rule.advance_margin, rule.max_stage_samples) == (0.1, 0.02, 0.05, 40)
    for args, flag in [
        ({"stages": "0.1,half,1"}, "--canary-stages"),
        ({"stages": "0.5,0.2,1"}, "--canary-stages"),
        ({"stage_sessions": 0}, "--stage-sessions"),
        ({"rollback_sessions": 1}, "--rollback-sessions"),
        ({"rollback_margin": -0.1}, "--rollback-margin"),
        ({"advance_margin": float("inf")}, "--advance-margin"),
        ({"stage_sessions": 10, "max_stage_sessions": 3}, "--max-stage-sessions"),
        ({"holdout": 0.9}, "--holdout"),
    ]:
        with pytest.raises(typer.BadParameter, match=flag):
            router_config(**args)  # type: ignore[arg-type]


def test_cycle_refuses_a_bad_flag_before_loading_anything(tmp_path: Path) -> None:
    args = ["cycle", "--store", f"sqlite:///{tmp_path / 's.db'}", "--canary-stages", "0.2,0.5", "--port", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "--canary-stages" in result.output and "1.0" in result.output
    assert not (tmp_path / "s.db").exists()


def test_serve_flags_reach_the_served_router(tmp_path: Path) -> None:
    port = free_port()
    command = [
        sys.executable, "-m", "taskrl.cli", "serve", "--policy", "scripted", "--env", "shop", "--name", "shop",
        "--store", f"sqlite:///{tmp_path / 's.db'}", "--admin-key", "admin", "--port", str(port),
        "--canary-stages", "0.1,0.5,1", "--stage-sessions", "7", "--rollback-sessions", "5",
        "--rollback-margin", "0.02", "--advance-margin", "0.05", "--max-stage-sessions", "40", "--holdout", "0",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        rule = None
        for _ in range(600):
            try:
                reply = httpx.get(f"http://127.0.0.1:{port}/v1/router/shop", headers={"Authorization": "Bearer admin"})
                rule = reply.json()["rule"]
                break
            except httpx.HTTPError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.1)
        assert rule is not None, "taskrl serve did not answer in 60 s"
        assert rule["stages"] == [0.1, 0.5, 1.0] and rule["holdout"] == 0.0
        assert (rule["min_samples"], rule["rollback_min_samples"], rule["max_stage_samples"]) == (7, 5, 40)
        assert (rule["rollback_margin"], rule["advance_margin"]) == (0.02, 0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
