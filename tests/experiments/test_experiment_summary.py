"""experiments/summary.py: valid stage configs (only the GRPO arm trains, with self-summary on), a mixed
warm start whose demonstrations hold long uncompacted views and self-summarised ones, held-out tasks that share no
item combination with training, compaction error paired against the ceiling, the plot."""

from __future__ import annotations

import sys
from operator import attrgetter
from pathlib import Path

import pytest

from taskrl.context import SummaryConfig, is_summary_request
from taskrl.envs.prices import PricesEnv
from taskrl.eval import EvalConfig
from taskrl.training.config import config_from_dict
from taskrl.types import Message, ToolCall, Trajectory, read_jsonl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments import summary as bench  # noqa: E402
from experiments.summary_plots import plot_summary  # noqa: E402


def test_stages_are_valid_configs_from_one_warm_start(tmp_path: Path) -> None:
    args = bench.parse_args(["--device", "cpu"])
    sft = config_from_dict(bench.stage_config("sft", tmp_path / "sft", None, args))
    assert (sft.algo.name, sft.model) == ("sft", "smollm2")
    assert sft.sft_data == str(tmp_path / "demonstrations.jsonl")
    assert sft.rollout.summary == {}, "mixed: played beforehand"
    first_run = config_from_dict(bench.stage_config("sft", tmp_path / "sft", None,
                                                    bench.parse_args(["--sft-uncompacted-share", "0"])))  # fmt: skip
    assert first_run.sft_data == "expert"
    assert first_run.rollout.summary == {"trigger_tokens": 360, "mode": "self", "max_summary_tokens": 96}, "all compact"
    plain = bench.parse_args(["--no-sft-summaries"])
    plain_sft = config_from_dict(bench.stage_config("sft", tmp_path / "sft", None, plain))
    assert (plain_sft.sft_data, plain_sft.rollout.summary) == ("expert", {})
    assert sft.env_kwargs == {"min_items": 2, "max_items": 6, "one_call_per_turn": True}
    start = tmp_path / "start"
    stages = {s: config_from_dict(bench.stage_config(s, tmp_path / s, start, args)) for s in
              ("sft_only", "baselines", "grpo")}  # fmt: skip
    assert {c.model for c in stages.values()} == {str(start)}
    grpo = stages["grpo"]
    assert grpo.algo.name == "grpo" and grpo.env_kwargs["min_items"] == 5 and grpo.split == "train"
    assert SummaryConfig(**grpo.rollout.summary) == SummaryConfig(trigger_tokens=360, mode="self",
                                                                  max_summary_tokens=96)
    shared = ("rollout.max_turns", "rollout.max_new_tokens", "rollout.max_context_tokens", "dtype", "env", "finetune",
              "lora.rank")  # fmt: skip
    get = {f: attrgetter(f) for f in shared}
    assert all(get[f](grpo) == get[f](stages["baselines"]) == get[f](sft) for f in shared)


@pytest.mark.parametrize("mode", [None, "prompted", "state_dump", "self"])
def test_every_arm_is_a_valid_eval_config(mode: str | None) -> None:
    args = bench.parse_args([])
    for trigger in args.triggers:
        table = bench.summary_config(args, trigger, mode)
        config = EvalConfig(max_context_tokens=args.max_context_tokens, summary=table)
        summary = config.rollout_config().summary
        assert (summary is None) == (mode is None)
        assert summary is None or (summary.mode, summary.trigger_tokens) == (mode, trigger)
    assert set(bench.MODE.values()) == {"prompted", "state_dump", "self"}


def test_bad_triggers_and_shares_are_refused() -> None:
    for bad in ("480,360", "360", "360,2000"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--triggers", bad])
    with pytest.raises(SystemExit):
        bench.parse_args(["--sft-uncompacted-share", "1.5"])


def test_mixed_demonstrations_hold_long_uncompacted_and_compacted_episodes(tmp_path: Path) -> None:
    args = bench.parse_args(["--sft-steps", "3", "--sft-tasks", "8"])
    path = tmp_path / "demonstrations.jsonl"
    demos = bench.write_demonstrations(path, args)
    assert [t.to_dict() for t in read_jsonl(str(path))] == [t.to_dict() for t in demos] and len(demos) == 24
    assert all(t.error is None and t.rewards["items_right"] == 1.0 and t.segments for t in demos)

    def lookups(traj: Trajectory) -> int:
        return sum(len(m.tool_calls or []) for m in traj.messages if m.role == "assistant")

    uncompacted = [t for t in demos if not t.info.get("summaries")]
    compacted = [t for t in demos if t.info.get("summaries")]
    # the ceiling's view: 3 or more lookups in context, never compacted, answered from the view
    assert any(lookups(t) >= 3 for t in uncompacted), [lookups(t) for t in uncompacted]
    assert all(not any(is_summary_request([m]) for m in t.messages) for t in uncompacted)
    # the self-summary's view: compacted at the low trigger, the expert's summary in its sampled tokens
    assert compacted and all(r["mode"] == "self" and r["summary_tokens"] > 0 for t in compacted
                             for r in t.info["summaries"])  # fmt: skip
    assert 0.25 <= len(uncompacted) / len(demos) <= 0.75  # the default share, 0.5, over 24 seeded draws


def test_held_out_listings_share_no_combination_with_any_training_task() -> None:
    args = bench.parse_args([])
    held_out = {frozenset(t.info["items"]) for t in bench.eval_tasks(64, args)}
    train = {frozenset(t.info["items"]) for demos in (True, False)
             for t in PricesEnv(num_tasks=256, **bench.env_kwargs(args, demos=demos)).tasks("train")}  # fmt: skip
    assert held_out and train and not held_out & train
    assert all(5 <= len(c) <= 6 for c in held_out)


def test_compaction_error_is_ceiling_minus_arm_paired_per_task() -> None:
    args = bench.parse_args([])

    def result(per_task: list[float]) -> dict[str, object]:
        est = {"value": sum(per_task) / len(per_task), "low": 0.0, "high": 1.0}
        return {"success": est, "per_task": {"success": per_task, "reward": [v / 2 for v in per_task]},
                **{k: est for k in bench.METRICS if k != "success"}}  # fmt: skip

    ceiling = result([1, 1, 1, 0])
    report = bench.compaction_report({"prompted@360": result([0, 1, 0, 0]), "self_trained@360": result([1, 1, 1, 1])},
                                     ceiling, args)  # fmt: skip
    assert report["prompted@360"]["compaction_error"]["value"] == 0.5
    assert report["self_trained@360"]["compaction_error"]["value"] == -0.25  # better than the ceiling: negative
    assert report["prompted@360"]["compaction_error_reward"]["value"] == 0.25
    low, high = report["prompted@360"]["compaction_error"]["low"], report["prompted@360"]["compaction_error"]["high"]
    assert 0 <= low <= 0.5 <= high <= 1


def test_episode_row_counts_relookups_and_summary_tokens() -> None:
    traj = Trajectory(task_id="t", env="prices")
    calls = [Message("assistant", "", tool_calls=[ToolCall(str(i), "lookup_price", {"item": "pear"})]) for i in (1, 2)]
    traj.messages = [calls[0], Message("tool", "pear: $4", tool_call_id="1"), calls[1],
                     Message("tool", "pear: $4", tool_call_id="2")]  # fmt: skip
    traj.metrics = {"turns": 3.0, "compactions": 1.0, "summary_tokens": 12.0, "summary_tokens_total": 12.0}
    traj.rewards = {"items_right": 1.0}
    row = bench.episode_row(traj)
    assert row["relookups"] == 1.0 and row["success"] == 1.0 and row["summary_tokens"] == 12.0
    traj.metrics = {"turns": 3.0}
    assert bench.episode_row(traj)["summary_tokens"] != bench.episode_row(traj)["summary_tokens"]  # NaN: no summary


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    est = {"value": 0.5, "low": 0.3, "high": 0.7}
    arms = {f"{arm}@{t}": {"success": est, "compaction_error": est, "compaction_error_reward": est,
                          "summary_tokens": {"value": 20.0}}
            for arm in bench.MODE for t in (360, 480)}  # fmt: skip
    data = {"seeds": {"0": {"triggers": [360, 480], "ceiling": {"success": est}, "arms": arms}}}
    plot_summary(data, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_a_ceiling_cut_to_fewer_tasks_is_the_shorter_task_list() -> None:
    args = bench.parse_args([])
    assert [t.id for t in bench.eval_tasks(5, args)] == [t.id for t in bench.eval_tasks(32, args)][:5]
    full = {"tasks": 4, "per_task": {"success": [1.0, 0.0, 0.0, 0.0]}, "success": {"value": 0.25}}
    cut = bench.first_tasks(full, 2, seed=0)
    assert cut["tasks"] == 2 and cut["per_task"]["success"] == [1.0, 0.0] and cut["success"]["value"] == 0.5
    assert bench.first_tasks(full, 4, seed=0) is full
