"""experiments/production.py end to end with a tiny random model (a real server process, the openai SDK,
feedback, ProductionCycle, the degraded cycle), and the task's splits. The tiny model learns nothing, so this checks
that every part runs and is recorded in the store, not the acceptance targets (the real run does)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments import production as bench  # noqa: E402
from experiments.production_task import correct, make_tasks  # noqa: E402


def test_splits_share_no_prompt_and_the_check_reads_the_asked_price() -> None:
    train, val, test = make_tasks(64, "train"), make_tasks(48, "val"), make_tasks(64, "test")
    prompts = [{t.prompt for t in split} for split in (train, val, test)]
    assert [len(p) for p in prompts] == [64, 48, 64]
    assert not (prompts[0] & prompts[1]) and not (prompts[0] & prompts[2]) and not (prompts[1] & prompts[2])
    task = train[0]
    asked = task.prompt.rsplit("one ", 1)[1].removesuffix(" cost?")
    assert f"{asked} ${task.answer}" in task.prompt
    assert correct(f"One {asked} costs ${task.answer}.", task) and not correct(f"${task.answer + 1}", task)
    with pytest.raises(ValueError, match="split"):
        make_tasks(1, "eval")


@pytest.mark.timeout(300)
def test_tiny_production_loop_runs_end_to_end_and_reads_decisions_back(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out, plot = tmp_path / "summary.json", tmp_path / "curve.png"
    summary = bench.main(["--tiny", "--run-dir", str(run_dir), "--out", str(out), "--plot", str(plot)])
    assert json.loads(out.read_text())["acceptance"] == json.loads(json.dumps(summary["acceptance"], default=str))
    assert plot.stat().st_size > 10_000
    assert summary["population"]["sessions"] > 0 and summary["population"]["feedback"] > 0
    assert len(summary["cycles"]) == 2 and summary["baseline"]["n"] == 8
    for cycle in summary["cycles"]:
        assert cycle["outcome"] in ("canary", "blocked", "waiting")
        assert cycle["held_out"]["n"] == 8 and cycle["deployed"] >= 0
    kinds = {d["kind"] for d in summary["decisions"]}
    assert {"add_version", "start_canary", "gate_pass"} <= kinds or "block" in kinds
    assert summary["degraded"]["cycle"]["cycle"] == 900, "the inverted-feedback cycle ran"
    accept = summary["acceptance"]
    assert accept["decisions_with_evidence"] and accept["every_cycle_decision_in_store"]
    assert accept["feedback_signals"] == summary["population"]["feedback"]
    assert set(accept["feedback_by_tenant"]) <= {*bench.HONEST, bench.ADVERSARY}
    assert summary["traffic"]["buckets"] and abs(sum(summary["traffic"]["buckets"][0]["share"].values()) - 1) < 1e-9
    events = [json.loads(line)["event"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events[0] == "ready" and events[-1] == "done"
    assert not (run_dir / ".spec-with-keys.json").exists(), "the file with the API keys is removed"
    # --resume on a finished run rebuilds the summary from the store without serving again
    again = bench.main(["--tiny", "--resume", "--run-dir", str(run_dir)])
    assert again["decisions"] == summary["decisions"] and "population" not in again
