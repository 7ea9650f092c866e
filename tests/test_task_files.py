"""Tasks from a JSONL file (or a datasets dataset) played on an existing env's tools and reward, from rollout,
eval, env check and train, without writing an env class (issue 38, expected and missing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from taskrl.runlog import read_trajectories
from taskrl.task_files import TaskSourceError, build_env, load_tasks
from taskrl.types import read_jsonl

ROWS = [
    {"key": "mine-1", "question": "An order has 2 x apple. How much does it cost in total?", "label": 6,
     "split": "train", "shop": "north"},
    {"key": "mine-2", "question": "An order has 3 x pear, 1 x tea. How much does it cost in total?", "label": 18,
     "split": "train", "shop": "south"},
    {"key": "mine-3", "question": "An order has 5 x milk. How much does it cost in total?", "label": 10,
     "split": "test", "shop": "north"},
]  # fmt: skip
COLUMNS = "id=key,prompt=question,answer=label"


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "taskrl", *args], capture_output=True, text=True, timeout=120)


def test_rows_become_tasks_with_named_columns_and_splits(tmp_path: Path) -> None:
    source = write_rows(tmp_path / "orders.jsonl", ROWS)
    env = build_env("shop", {}, str(source), {"id": "key", "prompt": "question", "answer": "label"})
    train, test = env.tasks("train"), env.tasks("test")
    assert [t.id for t in train] == ["mine-1", "mine-2"] and [t.id for t in test] == ["mine-3"]
    assert train[1].answer == 18 and train[1].info == {"shop": "south"} and len(env.tasks("all")) == 3
    assert env.name == "shop" and set(env.tools.names) == {"lookup_price", "calculator"}
    unsplit = load_tasks(str(write_rows(tmp_path / "plain.jsonl", [{"prompt": "p", "answer": 1}])))
    assert [(t.id, split) for t, split in unsplit] == [("plain-0", None)]  # served for every split


def test_rollout_eval_and_check_play_the_files_tasks(tmp_path: Path) -> None:
    source = str(write_rows(tmp_path / "orders.jsonl", ROWS))
    check = cli("env", "check", "shop", "--tasks", source, "--task-columns", COLUMNS)
    assert check.returncode == 0 and "passes check_env" in check.stdout, check.stderr
    out = tmp_path / "r.jsonl"
    run = cli("rollout", "--env", "shop", "--policy", "scripted", "--tasks", source, "--task-columns", COLUMNS,
              "--out", str(out))  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert [(t.task_id, t.reward) for t in read_jsonl(str(out))] == [("mine-1", 1.0), ("mine-2", 1.0)]
    assert json.loads(out.with_suffix(".meta.json").read_text())["tasks"] == source
    evaluated = cli("eval", "--env", "shop", "--policy", "scripted", "--tasks", source, "--task-columns", COLUMNS,
                    "--k", "1", "--out", str(tmp_path / "eval"))  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    result = json.loads((tmp_path / "eval" / "eval" / "eval.json").read_text())
    assert result["tasks"] == 1 and [row["task_id"] for row in result["per_task"]] == ["mine-3"]  # split test


def test_bad_rows_and_sources_are_one_line_naming_them(tmp_path: Path) -> None:
    source = write_rows(tmp_path / "orders.jsonl", ROWS)
    cases = {
        ("--tasks", str(source)): "orders.jsonl:1: column 'prompt' (the prompt) must be a non-empty string",
        ("--tasks", str(tmp_path / "missing.jsonl")): "no task file at",
        ("--tasks", str(source), "--task-columns", "question=prompt"): "must be FIELD=COLUMN with FIELD one of",
        ("--tasks", "hf:some/dataset"): "is a Hugging Face dataset: pip install datasets",
    }
    pytest.importorskip("typer")
    for args, message in cases.items():
        if args[1].startswith("hf:") and _has_datasets():
            continue
        run = cli("env", "check", "shop", *args)
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        assert run.returncode == 2 and len(lines) == 1 and message in lines[0], (args, run.stderr)
    with pytest.raises(TaskSourceError, match="repeats an earlier row"):
        load_tasks(str(write_rows(tmp_path / "twice.jsonl", [ROWS[0], ROWS[0]])), columns={"id": "key",
                                                                                        "prompt": "question"})


def _has_datasets() -> bool:
    try:
        import datasets  # noqa: F401
    except ImportError:
        return False
    return True


def test_train_takes_tasks_from_the_config(tmp_path: Path) -> None:
    from taskrl.policies.models import tiny_model
    from taskrl.training.config import load_config
    from taskrl.training.trainer import train

    source = write_rows(tmp_path / "orders.jsonl", ROWS)
    base = tmp_path / "tiny"
    model, tokenizer = tiny_model(seed=0)
    model.save_pretrained(str(base))
    tokenizer.save_pretrained(str(base))
    run = tmp_path / "run"
    train(load_config(None, ['env="shop"', 'algo.name="sft"', "steps=1", "rollout.tasks_per_step=2",
                             "rollout.max_new_tokens=64",
                             "progress=false", f'tasks="{source}"', 'task_columns={id="key", prompt="question", '
                             'answer="label"}', f'model="{base}"', f'run_dir="{run}"']))  # fmt: skip
    played = read_trajectories(run)[1]
    assert sorted(t.task_id for t in played) == ["mine-1", "mine-2"] and all(t.reward == 1.0 for t in played)
