"""experiments/tool_use.py: valid stage configs, held-out tasks that share nothing, the plot, the deltas."""

from __future__ import annotations

import argparse
import json
import sys
from operator import attrgetter
from pathlib import Path

import pytest

from taskrl.envs.builtin import ShopEnv
from taskrl.envs.prices import PricesEnv
from taskrl.training.config import config_from_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments import tool_use as bench  # noqa: E402
from experiments.plots import plot_tool_use  # noqa: E402


def _args(**changes: object) -> argparse.Namespace:
    values = {"seed": 0, "sft_seed": 0, "device": "cpu", "max_turns": 4, "max_new_tokens": 96, "sft_steps": 4,
              "sft_tasks": 8, "sft_lr": 1e-3, "lr": 2e-4, "tasks": 4, "group_size": 6, "entropy_coef": 0.0,
              "lookup_credit": 0.3, "max_steps": 10_000, "dtype": "bfloat16", "design": "prices3"}  # fmt: skip
    return argparse.Namespace(**{**values, **changes})


@pytest.mark.parametrize("design", sorted(bench.DESIGNS))
def test_stages_are_valid_configs_and_the_arms_differ_only_where_they_should(tmp_path: Path, design: str) -> None:
    args = _args(design=design)
    shape = bench.DESIGNS[design]
    start = tmp_path / "start"
    sft = config_from_dict(bench.stage_config("sft", tmp_path / "sft", None, args))
    assert (sft.algo.name, sft.lr, sft.env_kwargs, sft.model) == ("sft", 1e-3, shape["sft"], "smollm2")
    arms = {arm: config_from_dict(bench.stage_config(arm, tmp_path / arm, start, args)) for arm in bench.ARMS}
    assert {c.model for c in arms.values()} == {str(start)}, "both arms start from the one warm start"
    assert arms["sft_only"].algo.name == "sft" and arms["sft_only"].env_kwargs == shape["sft"]
    assert arms["grpo"].algo.name == "grpo" and arms["grpo"].env_kwargs["min_items"] > shape["sft"]["max_items"]
    assert arms["grpo"].env == sft.env == shape["env"]
    shared = ("finetune", "lora.rank", "rollout.max_turns", "rollout.max_new_tokens", "rollout.temperature", "seed",
              "dtype", "env")  # fmt: skip
    own = set(shape.get("rl_options", {}))  # what a design changes in its RL arms only (prices3c: the cap)
    assert all(attrgetter(f)(arms["sft_only"]) == attrgetter(f)(arms["grpo"]) for f in shared if f not in own)


def test_the_ladder_arms_imitate_the_held_out_shape_and_rft_matches_grpo(tmp_path: Path) -> None:
    from experiments.arms import MATCHED_FIELDS

    args, start = _args(design="prices3", rft_min_reward=1.0), tmp_path / "start"
    arms = {arm: bench.stage_config(arm, tmp_path / arm, start, args) for arm in bench.LADDER}
    configs = {arm: config_from_dict(dict(c)) for arm, c in arms.items()}
    assert configs["sft3"].algo.name == "sft" and configs["sft3"].sft_data == "expert"
    assert configs["sft3"].env_kwargs == bench.DESIGNS["prices3"]["rl"]  # 3-item demonstrations
    assert (configs["rft"].algo.name, configs["rft"].sft_data, configs["rft"].sft_min_reward) == ("sft", "policy", 1.0)
    assert all(arms["rft"][f] == arms["grpo"][f] for f in MATCHED_FIELDS if f in arms["grpo"])
    assert {c.model for c in configs.values()} == {str(start)}
    assert not configs["grpo"].overlong_filter and not configs["rft"].overlong_filter
    # prices3f: prices3g with the overlong filter on both RL arms, and nothing else changed
    filtered = {arm: config_from_dict(bench.stage_config(arm, tmp_path / arm, start, _args(design="prices3f")))
                for arm in bench.LADDER}  # fmt: skip
    assert filtered["grpo"].overlong_filter and filtered["rft"].overlong_filter
    assert not filtered["sft3"].overlong_filter and not filtered["sft_only"].overlong_filter
    assert {k: v for k, v in bench.DESIGNS["prices3f"].items() if k != "rl_options"} == bench.DESIGNS["prices3g"]
    # prices3c: the RL arms' training cap has room (160); the SFT arms and every evaluation keep prices3g's
    roomy = {arm: config_from_dict(bench.stage_config(arm, tmp_path / arm, start, _args(design="prices3c")))
             for arm in bench.LADDER}  # fmt: skip
    assert roomy["grpo"].rollout.max_new_tokens == roomy["rft"].rollout.max_new_tokens == 160
    assert roomy["sft3"].rollout.max_new_tokens == configs["sft3"].rollout.max_new_tokens == 96
    assert {k: v for k, v in bench.DESIGNS["prices3c"].items() if k != "rl_options"} == bench.DESIGNS["prices3g"]


def test_held_out_orders_share_no_item_quantity_pair_with_any_training_task() -> None:
    shop, args = bench.DESIGNS["shop"], _args(design="shop")
    held_out = {pair for t in bench.eval_tasks(64, args) for pair in t.info["order"].items()}
    train = {pair for kwargs in (shop["sft"], shop["rl"])
             for t in ShopEnv(num_tasks=256, **kwargs).tasks("train") for pair in t.info["order"].items()}  # fmt: skip
    assert held_out and train and not held_out & train
    assert all(2 <= len(t.info["order"]) <= 3 for t in bench.eval_tasks(64, args))


@pytest.mark.parametrize("design", ["prices", "prices3"])
def test_held_out_listings_share_no_item_combination_with_any_training_task(design: str) -> None:
    shape, args = bench.DESIGNS[design], _args(design=design)
    held_out = {frozenset(t.info["items"]) for t in bench.eval_tasks(64, args)}
    train = {frozenset(t.info["items"]) for kwargs in (shape["sft"], shape["rl"])
             for t in PricesEnv(num_tasks=256, **kwargs).tasks("train")}  # fmt: skip
    assert held_out and train and not held_out & train
    assert min(len(c) for c in held_out) > shape["sft"]["max_items"], "evaluation needs more items than any demo"


def test_paired_delta_is_the_mean_difference_with_a_ci() -> None:
    delta = bench.paired_delta([0, 0, 1, 1], [1, 1, 1, 1], seed=0)
    assert delta["value"] == 0.5 and 0 <= delta["low"] <= 0.5 <= delta["high"] <= 1


def _estimate(value: float) -> dict[str, float]:
    return {"value": value, "low": max(value - 0.1, 0.0), "high": min(value + 0.1, 1.0)}


def _evals(value: float) -> dict[str, dict[str, object]]:
    per_task = [value] * 4
    return {"greedy": {"success": _estimate(value), "per_task": per_task},
            "sampled": {"success": _estimate(value), "pass@1": _estimate(value), "per_task": per_task}}  # fmt: skip


def test_plot_writes_a_png_from_seed_records(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    steps = [{"step": i + 1, "train_s": 30.0 * (i + 1), "rewards/total": i / 10, "tools/invalid_tool_calls": 0.1,
              "losses/entropy": 0.5} for i in range(5)]  # fmt: skip
    curve = [{"train_s": 60.0, "tasks": 4, "success": _estimate(0.25)}]
    arms = {arm: {"steps": steps, "curve": curve, "train_s": 150.0, "final": _evals(0.5)} for arm in bench.ARMS}
    data = {"seeds": {"0": {"minutes": 2.5, "start": _evals(0.0), "arms": arms}}}
    path = tmp_path / "tool_use.png"
    plot_tool_use(data, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_recovers_steps_the_record_missed(tmp_path: Path) -> None:
    """Killed after step 2's checkpoint but before the record's save: step 2's time still counts."""
    import json

    lines = [{"step": 1, "charts/step_time_s": 150.0, "rewards/total": 0.5},
             {"step": 2, "charts/step_time_s": 270.0, "rewards/total": 0.75}]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in lines))
    recorded = [{"step": 1, "train_s": 152.0}]
    from experiments.common import lost_steps

    rows = lost_steps(tmp_path, recorded, completed=2, keys=bench.STEP_KEYS)
    assert [(r["step"], r["train_s"], r["rewards/total"], r["recovered"]) for r in rows] == [(2, 422.0, 0.75, True)]
    assert lost_steps(tmp_path, recorded + rows, completed=2, keys=bench.STEP_KEYS) == []
    assert lost_steps(tmp_path / "absent", recorded, completed=2, keys=bench.STEP_KEYS) == []


def test_held_out_prompts_are_distinct_and_enough_for_the_standard() -> None:
    from experiments.study import Study

    for split in ("val", "test"):
        tasks = bench.eval_tasks(64, _args(design="prices3", split=split))
        assert len({t.prompt for t in tasks}) == 64 and Study.check_held_out(tasks) == 64


def test_every_arm_and_the_start_become_new_run_records(tmp_path: Path) -> None:
    from experiments.study import Study, index_markdown

    args = _args(design="prices3", split="val", arms=list(bench.LADDER), runs_dir=str(tmp_path), eval_tasks=64,
                 resume=False)  # fmt: skip
    study = bench._study(args)
    steps = [{"step": 1, "charts/episodes": 12.0, "charts/sampled_tokens": 900.0, "charts/trained_trajectories": 3.0}]
    arms = {arm: {"config": {"algo": arm}, "steps": steps, "train_s": 60.0,
                  "final": {**_evals(0.5), "greedy": {**_evals(0.5)["greedy"], "tasks": 64}}}
            for arm in bench.LADDER}  # fmt: skip
    start = {**_evals(0.2), "greedy": {**_evals(0.2)["greedy"], "tasks": 64}, "config": {}, "sft_s": 30.0,
             "sft_steps": 4}  # fmt: skip
    result = {"cpu": "cpu", "command": "python ...", "start": start, "arms": arms}
    paths = bench.record_runs(study, result, args)
    records = Study("prices", tmp_path).runs()
    assert len(paths) == 5 and [r["arm"] for r in records].count("rft") == 1
    rft = next(r for r in records if r["arm"] == "rft")
    assert rft["budget"]["episodes"] == 12.0 and rft["outcome"]["greedy_success"]["value"] == 0.5
    assert rft["baseline_arm"] == "rft" and "| grpo | 1 | 0.500 |" in index_markdown(tmp_path)
    with pytest.raises(Exception, match="not frozen"):
        bench._study(argparse.Namespace(**{**vars(args), "split": "test"}))


def test_greedy_only_evaluations_record_and_plot(tmp_path: Path) -> None:
    """``--sampled-samples 0`` (greedy success only): records, the seed's deltas and the plot do without it."""
    from experiments.study import Study

    args = _args(design="prices3", split="val", arms=list(bench.LADDER), runs_dir=str(tmp_path), eval_tasks=64,
                 resume=False, sampled_samples=0)  # fmt: skip
    greedy = lambda v: {"greedy": {**_evals(v)["greedy"], "tasks": 64}}  # noqa: E731
    steps = [{"step": 1, "train_s": 60.0, "rewards/total": 0.5, "tools/invalid_tool_calls": 0.0, "losses/entropy": 0.5}]
    arms = {arm: {"config": {}, "steps": steps, "curve": [], "train_s": 60.0, "final": greedy(0.5)}
            for arm in bench.LADDER}  # fmt: skip
    start = {**greedy(0.2), "config": {}, "sft_s": 30.0, "sft_steps": 4}
    bench.record_runs(bench._study(args), {"cpu": "cpu", "command": "c", "start": start, "arms": arms}, args)
    assert all(r["outcome"]["sampled_pass@1"] is None for r in Study("prices", tmp_path).runs())
    pytest.importorskip("matplotlib")
    plot_tool_use({"seeds": {"0": {"minutes": 1.0, "start": start, "arms": arms}}}, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_at_most_parallel_arms_train_at_once_and_a_failed_arm_is_named(tmp_path: Path, monkeypatch) -> None:
    import subprocess

    script = ("import sys, time; open(sys.argv[1], 'a').write(f'{sys.argv[2]} {time.monotonic()}\\n'); "
              "time.sleep(0.6); sys.exit(sys.argv[2] == 'rft')")  # fmt: skip
    log = tmp_path / "starts.txt"
    from experiments import common

    monkeypatch.setattr(common, "child", lambda _script, arm, _dir, threads: subprocess.Popen(
        [sys.executable, "-c", script, str(log), arm]))  # fmt: skip
    common.run_stages("tool_use.py", ["sft_only", "sft3", "grpo"], tmp_path, limit=2, threads=1)
    starts = {arm: float(t) for arm, t in (line.split() for line in log.read_text().splitlines())}
    assert starts["grpo"] - min(starts["sft_only"], starts["sft3"]) >= 0.5  # the third waited for a free slot
    log.unlink()
    with pytest.raises(SystemExit, match=r"stage\(s\) \['rft'\] failed"):
        common.run_stages("tool_use.py", ["rft", "grpo"], tmp_path, limit=0, threads=1)
    assert len(log.read_text().splitlines()) == 2  # 0: both at once, and the other arm still ran


def test_generalisation_sets_are_held_out_distinct_and_recorded(tmp_path: Path) -> None:
    from experiments.study import Study
    from taskrl.envs.builtin import NOVEL_PRICES
    from taskrl.envs.prices import held_out_combination

    args = _args(design="prices3", split="test")
    gen4 = bench.eval_tasks(64, args, bench.GENERALISATION["gen4"])
    novel = bench.eval_tasks(64, args, bench.GENERALISATION["novel"])
    for tasks in (gen4, novel):
        assert Study.check_held_out(tasks) == 64 and all(held_out_combination(t.info["items"]) for t in tasks)
    assert all(len(t.info["items"]) == 4 and not set(t.info["items"]) & set(NOVEL_PRICES) for t in gen4)
    assert all(len(t.info["items"]) == 3 and set(t.info["items"]) <= set(NOVEL_PRICES) for t in novel)
    args = _args(design="prices3", split="val", arms=["rft"], runs_dir=str(tmp_path), eval_tasks=64, resume=False)
    final = {"greedy": {**_evals(0.5)["greedy"], "tasks": 64}, "gen4": _evals(0.25)["greedy"],
             "novel": _evals(0.75)["greedy"]}  # fmt: skip
    arms = {"rft": {"config": {}, "steps": [{"step": 1}], "train_s": 60.0, "final": final}}
    start = {"greedy": {**_evals(0.2)["greedy"], "tasks": 64}, "config": {}, "sft_s": 30.0, "sft_steps": 4,
             "gen4": _evals(0.0)["greedy"], "novel": _evals(0.1)["greedy"]}  # fmt: skip
    bench.record_runs(bench._study(args), {"cpu": "cpu", "command": "c", "start": start, "arms": arms}, args)
    rft = next(r for r in Study("prices", tmp_path).runs() if r["arm"] == "rft")
    assert rft["outcome"]["gen4_greedy_success"]["value"] == 0.25
    assert rft["outcome"]["novel_greedy_success"]["value"] == 0.75
    assert rft["secondary"] == ["gen4_greedy_success", "novel_greedy_success"]  # the index tabulates these too


def test_generalisation_turns_fit_the_expert_and_prices3g_always_evaluates_them() -> None:
    """A four-item expert turn is longer than the training cap of 96 tokens: the generalisation evaluations get
    a cap that holds the expert's longest turn, else gen4 would measure truncation, not generalisation."""
    from taskrl.envs.prices import expert_rule, make_prices_tasks
    from taskrl.policies.models import smollm2_tokenizer
    from taskrl.types import Message

    tokenizer = smollm2_tokenizer()
    longest = {}
    for key, shape in bench.GENERALISATION.items():
        tasks = [t for split in ("val", "test") for t in make_prices_tasks(256, 1, split=split, **shape)]
        turns = [expert_rule([Message("system", ""), Message("user", t.prompt)], None) for t in tasks]
        longest[key] = max(len(tokenizer(turn)["input_ids"]) for turn in turns)
    assert longest["gen4"] > 96 and max(longest.values()) <= bench.GENERALISATION_NEW_TOKENS
    assert bench.DESIGNS["prices3g"]["generalise"] and not bench.DESIGNS["prices3"].get("generalise")
    assert {k: v for k, v in bench.DESIGNS["prices3g"].items() if k != "generalise"} == bench.DESIGNS["prices3"]


def test_turn_caps_counts_first_turns_that_ran_into_the_cap(tmp_path: Path) -> None:
    from experiments import turn_caps

    def row(first: list[int], reward: float) -> dict[str, object]:
        ids = [7, 7] + first + [9] + [5, 5, turn_caps.END_OF_TURN]  # prompt, turn 1, observation, turn 2
        mask = [0, 0] + [1] * len(first) + [0] + [1, 1, 1]
        return {"segments": [{"token_ids": ids, "loss_mask": mask}], "rewards": {"items_right": reward}}

    rows = [row([4] * 5, 1.0), row([4] * 4 + [turn_caps.END_OF_TURN], 1.0), row([4] * 3, 0.0)]
    path = tmp_path / "heldout-greedy-policy_000000.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert turn_caps.capped(path, cap=5) == {"episodes": 3, "capped": 1, "success": 2, "success_when_capped": 1}
