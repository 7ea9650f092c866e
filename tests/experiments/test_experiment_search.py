"""experiments/search.py: held-out tasks share no document (both designs), stage configs, metrics, the plot."""

from __future__ import annotations

import argparse
import math
import sys
from operator import attrgetter
from pathlib import Path
from types import SimpleNamespace

import pytest

from taskrl.training.config import config_from_dict
from taskrl.types import Task

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments import search as bench  # noqa: E402
from experiments import search_tasks  # noqa: E402
from experiments.search_plots import plot_search  # noqa: E402
from experiments.search_tasks import disjointness, split_documents, split_two_hop  # noqa: E402


def _task(tid: str, *docs: str, quote: str | None = None) -> Task:
    facts = [{"doc_id": d, "quote": quote or f"{tid} says {d}", "term": d, "chunk_ids": [f"{d}#0"]} for d in docs]
    return Task(tid, f"prompt {tid}", "a", {"facts": facts, "difficulty": len(docs)})


def test_two_hop_split_keeps_document_components_whole_and_shares_nothing() -> None:
    tasks = [_task(f"a{i}", "hashlib", "zlib") for i in range(5)] + [_task(f"b{i}", "zlib", "gzip") for i in range(4)]
    tasks += [_task(f"c{i}", "base64", "binascii") for i in range(4)] + [_task("d0", "glob", "fnmatch")]
    train, held = split_two_hop(tasks, eval_share=0.4)
    assert sorted(t.id for t in train + held) == sorted(t.id for t in tasks)
    train_docs = {f["doc_id"] for t in train for f in t.info["facts"]}
    held_docs = {f["doc_id"] for t in held for f in t.info["facts"]}
    assert not train_docs & held_docs, "a document chain never straddles the split"
    assert {"hashlib", "zlib", "gzip"} <= train_docs and held_docs == {"base64", "binascii", "glob", "fnmatch"}
    assert disjointness([], train, held) == dict.fromkeys(
        ("shared_documents", "shared_pairs", "shared_quotes", "shared_prompts", "shared_ids"), 0
    )
    with pytest.raises(ValueError, match="one document component"):
        split_two_hop([_task("x", "a", "b"), _task("y", "b", "c")])


def test_disjointness_counts_every_kind_of_overlap() -> None:
    held = [_task("h", "base64", "binascii", quote="same sentence")]
    sft = [_task("s", "base64", quote="same sentence")]
    rl = [_task("h", "base64", "binascii")]
    overlaps = disjointness(sft, rl, held)
    assert overlaps["shared_documents"] == 2 and overlaps["shared_pairs"] == 1 and overlaps["shared_quotes"] == 1
    assert overlaps["shared_ids"] == 1 and overlaps["shared_prompts"] == 1


def test_three_hop_document_split_keeps_tasks_whole_and_demonstrations_off_held_out_documents() -> None:
    hubs = ["re", "time", "code"]  # every chain passes through a hub: one component, split_two_hop cannot help
    three = [_task(f"t{i}", f"m{i % 7}", hubs[i % 3], f"n{i % 5}") for i in range(40)]
    held_docs = split_documents(three, eval_share=0.4, trials=300)
    held = [t for t in three if set(search_tasks.task_docs(t)) <= held_docs]
    rl = search_tasks._without_held_out(three, held)
    assert held and rl and not {t.id for t in held} & {t.id for t in rl}
    quote = held[0].info["facts"][0]["quote"]
    demos = [_task("one", "m0"), _task("two", "m1", "re"), _task("dup", "zz", quote=quote)]
    sft = search_tasks._without_held_out(demos, held)
    used = {d for t in held for d in search_tasks.task_docs(t)}  # held-out documents no held-out task uses may train
    assert used <= held_docs and all(not set(search_tasks.task_docs(t)) & used for t in sft + rl)
    assert "dup" not in {t.id for t in sft}, "a demonstration quoting a held-out sentence is dropped"
    assert not any(disjointness(sft, rl, held).values())
    assert split_documents(three, trials=300) == held_docs, "seeded: the same split every time"
    with pytest.raises(ValueError, match="eval_share"):
        split_documents(three, eval_share=1.0)


def test_designs_are_checked_and_name_their_corpus(tmp_path: Path) -> None:
    assert search_tasks.corpus_source("onehop", tmp_path) == "stdlib"
    with pytest.raises(ValueError, match="design must be one of"):
        search_tasks.prepare(tmp_path, "fourhop")
    (tmp_path / "split.json").write_text('{"counts": {}}')  # a first-design data dir (no design recorded)
    with pytest.raises(ValueError, match="onehop design's data, not hops3"):
        search_tasks.prepare(tmp_path, "hops3")


def _args(**changes: object) -> argparse.Namespace:
    data = {"corpus": "/c", "files": {n: f"/d/{n}.jsonl" for n in ("sft", "rl", "eval")}}
    values = {"seed": 0, "sft_seed": 0, "device": "cpu", "max_turns": 4, "max_new_tokens": 192, "sft_steps": 12,
              "sft_tasks": 8, "sft_lr": 1e-3, "lr": 5e-4, "tasks": 2, "group_size": 4, "entropy_coef": 0.0,
              "max_steps": 10_000, "dtype": "bfloat16", "learner_precision": "float32", "context": 2048,
              "per_call_budget": 256, "micro_batch_tokens": 0, "data": data, "design": "hops3"}  # fmt: skip
    return argparse.Namespace(**{**values, **changes})


def test_stages_are_valid_configs_and_the_arms_differ_only_where_they_should(tmp_path: Path) -> None:
    args, start = _args(), tmp_path / "start"
    sft = config_from_dict(bench.stage_config("sft", tmp_path / "sft", None, args))
    assert (sft.algo.name, sft.model, sft.env, sft.env_kwargs["tasks"]) == ("sft", "smollm2", "search", "/d/sft.jsonl")
    assert sft.env_kwargs["expert_grep"] is False and sft.env_kwargs["context_budget"] == sft.rollout.max_context_tokens
    assert sft.checkpoint_every == 1, "the warm start resumes after a kill"
    arms = {arm: config_from_dict(bench.stage_config(arm, tmp_path / arm, start, args)) for arm in bench.ARMS}
    assert {c.model for c in arms.values()} == {str(start)}, "both arms start from the one warm start"
    assert arms["sft_only"].algo.name == "sft" and arms["sft_only"].env_kwargs["tasks"] == "/d/sft.jsonl"
    assert arms["grpo"].algo.name == "grpo" and arms["grpo"].env_kwargs["tasks"] == "/d/rl.jsonl"
    shared = ("finetune", "lora.rank", "rollout.max_turns", "rollout.max_new_tokens", "rollout.max_context_tokens",
              "seed", "dtype", "env")  # fmt: skip
    assert all(attrgetter(f)(arms["sft_only"]) == attrgetter(f)(arms["grpo"]) for f in shared)
    assert bench.env_kwargs("eval", args)["tasks"] == "/d/eval.jsonl"
    assert sft.micro_batch_tokens == 4096 and arms["grpo"].micro_batch_tokens == 2048
    small = _args(micro_batch_tokens=1024)
    assert {
        bench.stage_config(stage, tmp_path, start, small)["micro_batch_tokens"] for stage in ("sft", *bench.ARMS)
    } == {1024}


def test_hops3b_moves_the_training_note_to_the_hard_limit_in_every_stage_and_hops3_stays_as_it_was(
    tmp_path: Path,
) -> None:
    from taskrl.envs.search.env import SearchEnvConfig

    start = tmp_path / "start"
    for design, soft in (("hops3", SearchEnvConfig().soft_fraction), ("hops3b", 0.9)):
        args = _args(design=design)
        stages = {stage: config_from_dict(bench.stage_config(stage, tmp_path / stage, start, args))
                  for stage in ("sft", *bench.ARMS)}  # fmt: skip
        kwargs = [c.env_kwargs for c in stages.values()] + [bench.env_kwargs("eval", args)]
        for k in kwargs:
            env = SearchEnvConfig(**{f: v for f, v in k.items() if f in SearchEnvConfig.__dataclass_fields__})
            assert env.soft_fraction == soft and env.hard_fraction == SearchEnvConfig().hard_fraction
    assert "hops3b" in search_tasks.DESIGNS and "hops3b" in bench.DESIGN_ENV


def _traj(task_id: str, recall: float, precision: float, pruned: float = 0.0, accuracy: float = math.nan) -> object:
    metrics = {"search/output_recall": recall, "search/output_precision": precision, "search/answer_found": 1.0,
               "search/pruned_chunks": pruned, "search/prune_accuracy": accuracy, "invalid_tool_calls": 1.0,
               "search/context_utilisation": 0.5, "tool_calls": 2.0, "turns": 3.0}  # fmt: skip
    return SimpleNamespace(task_id=task_id, reward=1.0, error=None, metrics=metrics, final_answer="ANSWER: x")


def test_metrics_are_means_per_task_then_over_tasks_with_f_beta_at_the_report_beta() -> None:
    row = bench.episode_row(_traj("t", 0.5, 1.0))
    assert row["f_beta"] == pytest.approx(5 * 0.5 / (4 * 1.0 + 0.5)) and row["full_recall"] == 0.0
    assert row["lists_documents"] == 0.0, "an ANSWER line without DOCUMENTS lists nothing"
    listing = SimpleNamespace(**{**vars(_traj("t", 0.5, 1.0)), "final_answer": "ANSWER: x\nDOCUMENTS: zlib, gzip"})
    assert bench.episode_row(listing)["lists_documents"] == 1.0
    rows = [bench.episode_row(t) for t in (_traj("a", 1.0, 1.0), _traj("a", 0.0, 0.0, pruned=2, accuracy=0.5),
                                           _traj("b", 0.5, 0.5, pruned=1, accuracy=1.0))]  # fmt: skip
    out = bench.summarise(rows, ["a", "b"], seed=0)
    assert out["per_task"]["output_recall"] == [0.5, 0.5] and out["output_recall"]["value"] == 0.5
    assert out["per_task"]["full_recall"] == [0.5, 0.0]
    assert out["episodes_pruning"] == 2 and out["prune_accuracy"] == pytest.approx(0.75)
    assert out["output_recall"]["low"] == out["output_recall"]["high"] == 0.5  # identical tasks: a tight CI


def test_plot_draws_from_a_results_file(tmp_path: Path) -> None:
    est = {"value": 0.5, "low": 0.4, "high": 0.6}
    evals = {kind: {**{k: est for k in bench.METRICS}, "tasks": 2,
                    "per_task": {k: [0.5, 0.5] for k in bench.METRICS}} for kind in ("greedy", "sampled")}  # fmt: skip
    step = {"step": 1, "train_s": 60.0, **dict.fromkeys(bench.STEP_KEYS, 0.1)}
    arm = {"steps": [step], "curve": [{"train_s": 30.0, "tasks": 2, "output_recall": est}], "train_s": 60.0,
           "final": evals}  # fmt: skip
    for design in search_tasks.DESIGNS:
        seed = {"design": design, "minutes": 1, "start": evals, "arms": {"sft_only": arm, "grpo": arm}}
        plot_search({"seeds": {"0": seed}}, tmp_path / f"{design}.png")
        assert (tmp_path / f"{design}.png").stat().st_size > 10_000
