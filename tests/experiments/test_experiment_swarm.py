"""experiments/swarm.py: held-out swarm tasks share no row with training; unfinished sub-agents counted."""

from __future__ import annotations

import sys
from pathlib import Path

from taskrl.envs.swarm.tasks import item_scores, split_rows
from taskrl.types import Task, Trajectory

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments.swarm import episode_row  # noqa: E402
from experiments.swarm_tasks import assemble, row_overlaps  # noqa: E402
from experiments.swarm_tasks import split_rows as split_row_pool  # noqa: E402


def _row(tid: str, doc: str, answer: str, quote: str | None = None) -> Task:
    facts = [{"doc_id": doc, "quote": quote or f"{tid} in {doc}", "term": answer, "chunk_ids": [f"{doc}#0"]}]
    return Task(tid, f"Clue: {quote or tid}\nQuestion: what is [X1]?", answer, {"facts": facts, "answer": answer})


def test_held_out_tasks_share_no_document_quote_or_question_with_training() -> None:
    rows = [_row(f"r{i}", f"doc{i % 7}", f"ans{i}") for i in range(42)]
    rows += [_row("dup", "doc0", "ans-dup", quote="r1 in doc1")]  # on a doc of one side, quoting the other's row
    train, held = split_row_pool(rows, eval_share=0.4)
    assert {f["doc_id"] for t in train for f in t.info["facts"]}.isdisjoint(
        {f["doc_id"] for t in held for f in t.info["facts"]}
    )
    sft = assemble(train, (1, 2), 20, seed=1, prefix="sft", split="train")
    rl = assemble(train, (3,), 10, seed=2, prefix="rl", split="train")
    ev = assemble(held, (3,), 10, seed=3, prefix="eval", split="test")
    assert set(row_overlaps([*sft, *rl], ev).values()) == {0}
    assert {t.info["rows"] for t in sft} == {1, 2} and {t.info["rows"] for t in rl + ev} == {3}
    for task in sft + rl + ev:  # rows of one task: distinct answers; the gold table scores F1 1 against itself
        assert len({i["answer"] for i in task.info["items"]}) == task.info["rows"]
        assert split_rows(task.prompt) == {i["key"]: i["question"] for i in task.info["items"]}
        assert item_scores(task, task.answer)["item_f1"] == 1.0
    leaked = assemble([*held[:2], train[0]], (3,), 1, seed=0, prefix="leak", split="train")
    assert row_overlaps(leaked, ev)["shared_documents"] >= 1, "the check sees a held-out row in a training task"


def test_episode_row_counts_a_created_but_silent_subagent_as_unfinished() -> None:
    done = Trajectory(task_id="c1", info={"agent_id": "row1", "final_answer": "ANSWER: x"})
    silent = Trajectory(task_id="c2", info={"agent_id": "row2", "final_answer": ""})
    metrics = {"swarm/item_f1": 0.5, "swarm/subagents_created": 3.0, "invalid_tool_calls": 1.0, "tool_calls": 4.0}
    traj = Trajectory(task_id="t", children=[done, done, silent], metrics=metrics)
    row = episode_row(traj)
    assert row["subagents_finished"] == 1.0 and row["subagents_unfinished"] == 2.0
    assert row["invalid_rate"] == 0.25 and row["item_f1"] == 0.5
