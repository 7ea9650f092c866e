"""Command-line options shared by the episode-playing commands (``taskrl rollout``, ``taskrl eval``).

Each alias is an ``Annotated`` type carrying its typer option, so every command spells an option the same way
with the same help; defaults stay at the use site, where a command may differ (e.g. the split).
``--env-kwargs`` / ``--corpus`` reach the env's constructor through ``env_factory``, one code path for
``rollout``, ``eval`` and ``env check``: a bad value is an error naming the option and the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import typer

ENV_HELP = "registered env name (`taskrl env list`), my_module:MyEnv / my_module:make_env, or path/to/env.py:MyEnv"
EnvName = Annotated[str, typer.Option("--env", help=ENV_HELP)]
BaseUrl = Annotated[str | None, typer.Option("--base-url", help="openai: server URL incl. /v1")]
ApiKey = Annotated[str | None, typer.Option("--api-key", envvar="OPENAI_API_KEY", help="openai: API key")]
TimeoutS = Annotated[
    float, typer.Option("--timeout-s", help="openai: seconds per request; a request past it fails its episode only")
]
Device = Annotated[str, typer.Option("--device", help="hf: auto, cpu, cuda, cuda:1 ...")]
Split = Annotated[str, typer.Option("--split", help="task split")]
MaxTurns = Annotated[int, typer.Option("--max-turns", help="policy turns per episode before truncation")]
MaxNewTokens = Annotated[int, typer.Option("--max-new-tokens", help="sampled tokens per turn")]
MaxContextTokens = Annotated[int, typer.Option("--max-context-tokens", help="context tokens before truncation")]
Temperature = Annotated[float, typer.Option("--temperature", help="sampling temperature (0: greedy)")]
Concurrency = Annotated[int, typer.Option("--concurrency", help="episodes played at once")]
Seed = Annotated[int, typer.Option("--seed", help="root seed of tasks and sampling")]
EnvKwargs = Annotated[
    str | None,
    typer.Option("--env-kwargs", help='JSON object of env constructor arguments, e.g. \'{"corpus": "DIR", '
                 '"tasks": "DIR/tasks.jsonl", "reward": {"answer_weight": 0.5}}\' (search: SearchEnvConfig fields)'),
]
Tasks = Annotated[
    str | None,
    typer.Option("--tasks", help="your tasks for this env's tools and reward: a JSONL file (id, prompt, answer, split "
                 "columns; others go to Task.info), a datasets save_to_disk dir, or hf:NAME"),
]
TaskColumns = Annotated[
    str | None, typer.Option("--task-columns", help="--tasks column names, e.g. prompt=question,answer=label")
]
Corpus = Annotated[
    str | None,
    typer.Option("--corpus", help="search env: your corpus directory from `taskrl corpus build` (= --env-kwargs "
                 '\'{"corpus": DIR}\'; its tasks.jsonl is used unless --env-kwargs sets "tasks")'),
]


class EnvOptionsError(ValueError):
    """``--env-kwargs`` or ``--corpus`` cannot build the env (printed as one line, exit code 2)."""


def parse_env_kwargs(raw: str | None, corpus: str | None = None) -> dict[str, Any]:
    """The env's keyword arguments from ``--env-kwargs`` JSON and ``--corpus``; errors name the option."""
    kwargs: dict[str, Any] = {}
    if raw is not None and raw.strip():
        try:
            value = json.loads(raw)
        except (json.JSONDecodeError, RecursionError) as e:
            why = e.msg if isinstance(e, json.JSONDecodeError) else e
            raise EnvOptionsError(f"--env-kwargs is not valid JSON ({why}): {raw[:200]!r}") from None
        if not isinstance(value, dict):
            example = '{"corpus": "DIR"}'
            raise EnvOptionsError(f"--env-kwargs must be a JSON object such as '{example}', got {raw[:200]!r}")
        kwargs.update(value)
    if corpus is not None:
        if "corpus" in kwargs and kwargs["corpus"] != corpus:
            raise EnvOptionsError(f"--corpus {corpus!r} and --env-kwargs corpus {kwargs['corpus']!r} disagree")
        kwargs["corpus"] = corpus
    return kwargs


def env_factory(
    name: str, kwargs: dict[str, Any], tasks: str | None = None, task_columns: str | None = None
) -> tuple[Any, Callable[[], Any]]:
    """One env ``name`` built with ``kwargs`` now (a bad field fails before any episode), and its factory; with
    ``tasks`` (``--tasks``), its tasks come from that file or dataset (read once)."""
    from taskrl.env import EnvKwargsError
    from taskrl.task_files import build_env, load_tasks, parse_columns

    columns = parse_columns(task_columns)
    loaded = load_tasks(tasks, columns=columns) if tasks else None

    def build() -> Any:
        try:
            return build_env(name, kwargs, tasks or "", columns, loaded=loaded)
        except EnvKwargsError as e:
            raise EnvOptionsError(f"--env-kwargs for {e}") from None
        except TypeError as e:  # an argument the env does not take, or a value of the wrong type
            raise EnvOptionsError(f"--env-kwargs for env '{name}': {e}") from None
        except ValueError as e:  # a config's own check, e.g. "SearchEnvConfig.per_call_budget must be ..."
            if not kwargs:
                raise
            raise EnvOptionsError(f"--env-kwargs for env '{name}': {e}") from None

    return build(), build
