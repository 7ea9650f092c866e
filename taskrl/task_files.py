"""Tasks from a file or a dataset, played on an existing env's tools and reward, without writing an env class.

``load_tasks("orders.jsonl", columns={"prompt": "question"})`` reads one ``Task`` per row: ``id``, ``prompt``,
``answer`` and ``split`` columns (renamed through ``columns``), every other column into ``Task.info``. A row with a
``split`` column serves only that split; a file without one serves every split (give eval its own file). The
source may also be a Hugging Face ``datasets`` dataset (``pip install datasets``): a ``save_to_disk`` directory,
or ``hf:NAME`` (``load_dataset``, from the local cache when ``HF_HUB_OFFLINE=1``), its splits as the splits.
``build_env(name, env_kwargs, tasks, task_columns)`` is the env every command builds: ``make`` plus ``WithTasks``
when a task source is given (``--tasks`` on rollout/eval/env check, ``tasks`` in ``taskrl train``'s config).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from taskrl.env import Env, Wrapper, make
from taskrl.types import Task

TASK_COLUMNS = ("id", "prompt", "answer", "split")
"""The Task fields a row provides (``columns`` maps each to the row's column name); the rest goes to ``info``."""


class TaskSourceError(ValueError):
    """A task file or dataset cannot be read as tasks; the message names the source, the row and the column."""


def parse_columns(text: str | None) -> dict[str, str]:
    """``"prompt=question,answer=label"`` -> ``{"prompt": "question", "answer": "label"}`` (``--task-columns``)."""
    columns: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        field, sep, column = item.partition("=")
        if not sep or field.strip() not in TASK_COLUMNS or not column.strip():
            raise TaskSourceError(f"--task-columns item {item!r} must be FIELD=COLUMN with FIELD one of "
                                  f"{', '.join(TASK_COLUMNS)} (e.g. prompt=question)")  # fmt: skip
        columns[field.strip()] = column.strip()
    return columns


def _rows(source: str) -> Iterable[tuple[str, dict[str, Any], str | None]]:
    """(where, row, dataset split or None) for every row of ``source``."""
    path = Path(source).expanduser()
    if source.startswith("hf:") or (path.is_dir() and any(
            (path / name).is_file() for name in ("dataset_info.json", "dataset_dict.json", "state.json"))):  # fmt: skip
        yield from _dataset_rows(source)
        return
    if not path.is_file():
        raise TaskSourceError(f"no task file at {str(path)!r}: give a JSONL file (one task per line), a datasets "
                              "save_to_disk directory, or hf:NAME")  # fmt: skip
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as e:
                raise TaskSourceError(f"{path}:{number}: not a JSON object ({e})") from None
            if not isinstance(row, dict):
                raise TaskSourceError(f"{path}:{number}: each line must be a JSON object, got {type(row).__name__}")
            yield f"{path}:{number}", row, None


def _dataset_rows(source: str) -> Iterable[tuple[str, dict[str, Any], str | None]]:
    try:
        import datasets
    except ImportError:
        raise TaskSourceError(f"task source {source!r} is a Hugging Face dataset: pip install datasets") from None
    loaded = (datasets.load_dataset(source.removeprefix("hf:")) if source.startswith("hf:")
              else datasets.load_from_disk(str(Path(source).expanduser())))  # fmt: skip
    splits = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [(None, loaded)]
    for split, dataset in splits:
        for number, row in enumerate(dataset):
            yield f"{source}[{split or 'rows'}][{number}]", dict(row), split


def load_tasks(source: str, *, columns: dict[str, str] | None = None) -> list[tuple[Task, str | None]]:
    """Every row of ``source`` as ``(Task, split or None)``; ``TaskSourceError`` naming the row and column."""
    names = {field: (columns or {}).get(field, field) for field in TASK_COLUMNS}
    stem = Path(source.removeprefix("hf:")).stem or "task"
    out: list[tuple[Task, str | None]] = []
    seen: set[str] = set()
    for index, (where, row, dataset_split) in enumerate(_rows(source)):
        prompt = row.get(names["prompt"])
        if not isinstance(prompt, str) or not prompt.strip():
            raise TaskSourceError(f"{where}: column '{names['prompt']}' (the prompt) must be a non-empty string, got "
                                  f"{str(prompt)[:60]!r}; map another column with --task-columns "
                                  f"prompt=COLUMN (columns here: {', '.join(row)})")  # fmt: skip
        task_id = str(row.get(names["id"], f"{stem}-{index}"))
        if task_id in seen:
            raise TaskSourceError(f"{where}: task id {task_id!r} repeats an earlier row; ids must be unique")
        seen.add(task_id)
        split = row.get(names["split"], dataset_split)
        info = {k: v for k, v in row.items() if k not in names.values()}
        out.append((Task(task_id, prompt, answer=row.get(names["answer"]), info=info), split))
    if not out:
        raise TaskSourceError(f"task source {source!r} has no rows")
    return out


class WithTasks(Wrapper):
    """``env`` with its tasks replaced by a file's or a dataset's (see the module docstring)."""

    def __init__(self, env: Env, tasks: Sequence[tuple[Task, str | None]]) -> None:
        super().__init__(env)
        self._tasks = list(tasks)

    def tasks(self, split: str = "train") -> Sequence[Task]:
        if split == "all":
            return [task for task, _ in self._tasks]
        return [task for task, task_split in self._tasks if task_split is None or task_split == split]


def build_env(name: str, env_kwargs: dict[str, Any], tasks: str = "", task_columns: dict[str, str] | None = None,
              loaded: Sequence[tuple[Task, str | None]] | None = None) -> Env:  # fmt: skip
    """``make(name, **env_kwargs)``, with its tasks from ``tasks`` when given (``loaded``: already read rows)."""
    env = make(name, **env_kwargs)
    if not tasks:
        return env
    return WithTasks(env, loaded if loaded is not None else load_tasks(tasks, columns=task_columns))
