"""The report payload: token usage from segments, chunks, critical path, run dirs and bare files, the HTML page."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from taskrl.report import ReportError, build_report, load_payload, render_html
from taskrl.report.data import critical_path, json_safe, split_chunks, timeline, token_usage
from taskrl.runlog import RunLog, read_trajectories
from taskrl.types import Message, Segment, Trajectory, write_jsonl


def seg(mask: list[int]) -> Segment:
    return Segment(token_ids=list(range(len(mask))), logprobs=[0.0] * len(mask), loss_mask=mask)


def test_token_usage_reads_turns_from_the_loss_mask_and_marks_rebuilt_contexts() -> None:
    traj = Trajectory(segments=[seg([0, 0, 0, 1, 1, 0, 0, 1]), seg([0, 0, 1, 1, 1])])
    usage = token_usage(traj)
    assert not usage["estimated"]
    assert [(t["turn"], t["context"], t["sampled"], t["reset"]) for t in usage["turns"]] == [
        (1, 5, 2, False), (2, 8, 1, False), (3, 5, 3, True)]  # fmt: skip
    text_only = Trajectory(messages=[Message("user", "x" * 40), Message("assistant", "y" * 20)])
    estimated = token_usage(text_only)
    assert estimated["estimated"] and estimated["turns"] == [
        {"turn": 1, "context": 15, "sampled": 5, "reset": False, "segment": 0}]  # fmt: skip


def test_chunks_split_on_headers_and_pruned_ones_are_marked() -> None:
    content = "2 hits\n[chunk doc1#0] score 0.9\nalpha\n[chunk doc2#3]\nbeta"
    parts = split_chunks(content, {"doc2#3"})
    assert [p.get("chunk_id") for p in parts] == [None, "doc1#0", "doc2#3"]
    assert [p.get("pruned", False) for p in parts] == [False, False, True]
    assert "".join(p["text"] for p in parts) == content, "nothing is lost when splitting"
    assert split_chunks("no chunks here", set()) is None


def test_critical_path_is_the_slowest_member_of_each_wave() -> None:
    spans = [(0, 2), (0.5, 3), (1, 1.5), (3, 4), (3.2, 3.5), (5, 6)]
    assert critical_path(spans) == [False, True, False, True, False, True]
    parent = Trajectory(children=[Trajectory(info={"started_at": 0.0, "ended_at": 1.0}),
                                  Trajectory(info={"started_at": 0.1, "ended_at": 2.0, "critical": False}),
                                  Trajectory(info={"note": "no timing"})])  # fmt: skip
    tl = timeline(parent)
    assert [r["critical"] for r in tl["rows"]] == [False, False], "an env's own critical flag wins"
    assert (tl["start"], tl["end"]) == (0.0, 2.0)
    assert timeline(Trajectory()) is None


def test_bare_jsonl_gets_monitors_computed_and_nan_becomes_null(tmp_path: Path) -> None:
    path = tmp_path / "rollout.jsonl"
    write_jsonl(str(path), [Trajectory(task_id="a", messages=[Message("assistant", "Could you clarify?")],
                                       metrics={"turns": 1.0, "x": float("nan")}, terminated=True)] * 3)  # fmt: skip
    payload = load_payload(path)
    assert payload["monitors"]["source"] == "report" and payload["episodes"] == 3
    assert "monitor/clarifying_rate" in payload["metrics"]["series"]
    assert {a["monitor"] for a in payload["alerts"]} >= {"clarifying_rate"}
    assert payload["trajectories"][0]["metrics"]["x"] is None
    assert json_safe({"a": [float("inf"), 1.0]}) == {"a": [None, 1.0]}
    with pytest.raises(ReportError, match="does not exist"):
        load_payload(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="holds no metrics"):
        load_payload(tmp_path / "empty")


def test_run_dir_payload_keeps_logged_monitors_and_caps_trajectories(demo_run: Path) -> None:
    payload = load_payload(demo_run, max_trajectories=20)
    assert payload["monitors"]["source"] == "run"
    assert payload["metrics"]["steps"] == [0, 1, 2, 3]
    assert {"rewards/mean", "monitor/invalid_call_rate", "charts/success_rate"} <= set(payload["metrics"]["series"])
    assert payload["alerts"] and payload["evals"][0]["name"] == "final"
    assert len(payload["trajectories"]) <= 20
    train_0 = read_trajectories(demo_run)[0]
    rewards = sorted(t.reward for t in train_0)
    shown = sorted(v["reward"] for v in payload["trajectories"] if v["source"] == "train" and v["step"] == 0)
    assert shown[0] == rewards[0] and shown[-1] == rewards[-1], "the best and the worst of a step are kept"


def test_page_is_self_contained_and_model_text_cannot_close_the_script(tmp_path: Path) -> None:
    hostile = "</script><script>alert(1)</script><img src=http://example.com/x.png>"
    page = render_html(json_safe({"title": "t</title>", "trajectories": [{"messages": [{"content": hostile}]}]}))
    assert page.count("</script>") == 2, "only the page's own two script tags close"
    assert "t&lt;/title&gt;" in page
    data = re.search(r'id="report-data">(.*?)</script>', page, re.S).group(1)
    assert json.loads(data)["trajectories"][0]["messages"][0]["content"] == hostile
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page.split('id="report-data"')[0]), "nothing to fetch"


def test_report_command_on_a_run_dir_and_on_a_jsonl_file(demo_run: Path, tmp_path: Path) -> None:
    def taskrl(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-c", "from taskrl.cli import main; main()", "report", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    out = tmp_path / "r.html"
    run = taskrl(str(demo_run), "-o", str(out))
    assert run.returncode == 0, run.stderr
    assert out.stat().st_size > 10_000 and "self-contained" in run.stdout
    jsonl = sorted((demo_run / "trajectories").glob("train_*.jsonl"))[0]
    assert taskrl(str(jsonl), "-o", str(tmp_path / "j.html")).returncode == 0
    missing = taskrl(str(tmp_path / "nope"), "-o", str(tmp_path / "n.html"))
    assert missing.returncode == 2 and missing.stderr.startswith("error:") and "does not exist" in missing.stderr


def test_build_report_writes_atomically(demo_run: Path, tmp_path: Path) -> None:
    log = RunLog(tmp_path / "run")
    log.log(0, {"losses/loss": 1.0})
    out = build_report(log.dir, tmp_path / "deep" / "report.html")
    assert out.exists() and not list(out.parent.glob("*.tmp"))
