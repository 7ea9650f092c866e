"""The recipe env factories (``make("search")``, ``make("swarm")``) hand their envs what lives above the envs:
the default data from ``datagen`` and the swarm's Ray runtime builder; the envs themselves never generate data."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("chromadb")

from taskrl.datagen.defaults import DEFAULT_SWARM_TASKS  # noqa: E402
from taskrl.env import make  # noqa: E402
from taskrl.envs.search.build import default_corpus_dir  # noqa: E402
from taskrl.envs.search.env import SearchEnvConfig  # noqa: E402
from taskrl.envs.swarm.env import SwarmEnvConfig  # noqa: E402


def test_the_search_factory_resolves_the_default_corpus_given_as_a_field_or_a_config() -> None:
    by_field, by_config = make("search"), make("search", config=SearchEnvConfig())
    assert Path(by_field.config.corpus) == Path(by_config.config.corpus) == default_corpus_dir()
    assert by_field.tasks("train") and by_config.tasks("train")


def test_the_swarm_factory_fills_in_the_default_task_set_and_keeps_a_given_one(tmp_path: Path) -> None:
    env = make("swarm")
    assert Path(env.config.tasks) == default_corpus_dir() / DEFAULT_SWARM_TASKS and env.tasks("train")
    given = tmp_path / "one.jsonl"
    given.write_text('{"id": "w0", "prompt": "Fill the table.", "answer": "| 1 | a |"}\n')
    env = make("swarm", config=SwarmEnvConfig(tasks=str(given), subagent_env="noop"))
    assert [t.id for t in env.tasks("train")] == ["w0"]
