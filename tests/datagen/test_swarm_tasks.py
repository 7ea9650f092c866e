from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs" / "search"))  # the planted documents
from search_planted import PLANTED  # noqa: E402

from taskrl.cli import app  # noqa: E402
from taskrl.datagen.multihop import verify_task  # noqa: E402
from taskrl.datagen.widesearch import SwarmTaskConfig, generate_swarm_tasks  # noqa: E402
from taskrl.envs.search.corpus import Document  # noqa: E402
from taskrl.envs.search.embed import HASHING  # noqa: E402
from taskrl.envs.search.store import CorpusStore  # noqa: E402
from taskrl.envs.swarm.tasks import split_rows, task_performance  # noqa: E402
from taskrl.types import Task, read_tasks  # noqa: E402


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> CorpusStore:
    store = CorpusStore(tmp_path_factory.mktemp("swarmdg") / "corpus", create=True, embedder=HASHING, chunk_tokens=48)
    store.ingest(Document(k, v, k) for k, v in PLANTED.items())
    return store


def check_task(task: Task, store: CorpusStore, rows: int) -> None:
    items = task.info["items"]
    assert len(items) == rows == len(split_rows(task.prompt))
    assert len({i["answer"].lower() for i in items}) == rows  # distinct answers within a task
    for item, question in zip(items, split_rows(task.prompt).values(), strict=True):
        assert item["answer"].lower() not in question.lower()
        row = Task("row", question, None, {"answer": item["answer"], "difficulty": len(item["facts"]),
                   "facts": item["facts"], "answer_chunk_ids": item["facts"][-1]["chunk_ids"]})  # fmt: skip
        assert verify_task(row, store) == []  # every row re-verifies against the corpus
    assert "parallel" not in task.prompt.lower() and "at once" not in task.prompt.lower()
    assert task_performance(task, str(task.answer)) == 1.0
    assert task_performance(task, "| 1 | wrong |") < 1.0


def test_wide_tasks_via_the_cli(store: CorpusStore, tmp_path: Path) -> None:
    out = tmp_path / "wide.jsonl"
    args = ["datagen", "widesearch", "--corpus", str(store.path), "--n", "2", "--rows", "3", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    tasks = read_tasks(out)
    assert len(tasks) == 2 and all(t.info["kind"] == "wide" for t in tasks)
    for task in tasks:
        check_task(task, store, 3)


def test_deep_tasks_chain_hops_and_score_all_or_nothing(store: CorpusStore) -> None:
    config = SwarmTaskConfig(kind="deep", n=2, rows=2, hops=2, max_answer_df=1)
    tasks, report = generate_swarm_tasks(store, config)
    assert len(tasks) == 2, report.to_dict()
    for task in tasks:
        check_task(task, store, 2)
        assert all(len(i["facts"]) == 2 for i in task.info["items"])
        first = task.info["items"][0]
        assert task_performance(task, f"| 1 | {first['answer']} |") == 0.0  # half right is wrong for deep search
    same, _ = generate_swarm_tasks(store, config)
    assert [t.prompt for t in same] == [t.prompt for t in tasks]  # seeded


def test_fewer_tasks_than_asked_exit_non_zero_and_none_writes_nothing(store: CorpusStore, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "deep.jsonl"
    base = ["datagen", "deepsearch", "--corpus", str(store.path), "--rows", "2", "--hops", "2", "--out", str(out)]
    short = runner.invoke(app, [*base, "--n", "20"])  # the planted corpus holds far fewer 2-hop branches
    assert short.exit_code == 1 and "fewer tasks than asked" in short.output, short.output
    kept = read_tasks(out)
    assert 0 < len(kept) < 20 and f"kept {len(kept)}/20" in short.output
    allowed = runner.invoke(app, [*base, "--n", "20", "--allow-fewer"])
    assert allowed.exit_code == 0 and "warning" in allowed.output
    empty = tmp_path / "none.jsonl"
    impossible = ["datagen", "widesearch", "--corpus", str(store.path), "--rows", "500", "--n", "1"]
    impossible += ["--out", str(empty)]
    result = runner.invoke(app, [*impossible, "--allow-fewer"])
    assert result.exit_code == 1 and "kept 0/1 " in result.output and "nothing written" in result.output
    assert not empty.exists()


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="SwarmTaskConfig.kind"):
        SwarmTaskConfig(kind="tall")
    with pytest.raises(ValueError, match="SwarmTaskConfig.hops"):
        SwarmTaskConfig(hops=4)
