"""Command-line options shared by the episode-playing commands (``taskrl rollout``, ``taskrl eval``).

Each alias is an ``Annotated`` type carrying its typer option, so every command spells an option the same way
with the same help; defaults stay at the use site, where a command may differ (e.g. the split).
"""

from __future__ import annotations

from typing import Annotated

import typer

EnvName = Annotated[str, typer.Option("--env", help="registered env name (see `taskrl env list`)")]
BaseUrl = Annotated[str | None, typer.Option("--base-url", help="openai: server URL incl. /v1")]
ApiKey = Annotated[str | None, typer.Option("--api-key", envvar="OPENAI_API_KEY", help="openai: API key")]
Device = Annotated[str, typer.Option("--device", help="hf: auto, cpu, cuda, cuda:1 ...")]
Split = Annotated[str, typer.Option("--split", help="task split")]
MaxTurns = Annotated[int, typer.Option("--max-turns", help="policy turns per episode before truncation")]
MaxNewTokens = Annotated[int, typer.Option("--max-new-tokens", help="sampled tokens per turn")]
MaxContextTokens = Annotated[int, typer.Option("--max-context-tokens", help="context tokens before truncation")]
Temperature = Annotated[float, typer.Option("--temperature", help="sampling temperature (0: greedy)")]
Concurrency = Annotated[int, typer.Option("--concurrency", help="episodes played at once")]
Seed = Annotated[int, typer.Option("--seed", help="root seed of tasks and sampling")]
