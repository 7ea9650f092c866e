"""``taskrl datagen multihop|widesearch|deepsearch|codebugs``: the command lines of the task-set generators.

Each command parses its options, runs a generator of ``taskrl.datagen`` and prints what it kept and dropped; a
user-fixable problem raises ``ValueError`` (or a subclass), which ``taskrl.cli.main`` prints as one line, exit 2.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from taskrl.datagen.codebugs import MineConfig, MiningError, fetch_sdist, mine_bugs, write_task_set
from taskrl.datagen.multihop import (
    DEFAULT_MIN_YIELD,
    ExtractiveGenerator,
    GenerationConfig,
    LLMGenerator,
    TooFewTasksError,
    shortfall_hint,
)
from taskrl.datagen.widesearch import DEEP, WIDE, SwarmTaskConfig, generate_swarm_tasks
from taskrl.envs.code.sandbox import SandboxConfig
from taskrl.envs.code.tasks import TaskSetError
from taskrl.envs.search.store import CorpusStore
from taskrl.types import write_tasks


def multihop_command(
    corpus: Annotated[Path, typer.Option(help="corpus directory from `taskrl corpus build`")],
    n: Annotated[int, typer.Option(help="tasks to keep")] = 64,
    out: Annotated[Path | None, typer.Option(help="tasks JSONL (default: CORPUS/tasks.jsonl)")] = None,
    seed: Annotated[int, typer.Option(help="seed of every random choice")] = 0,
    hops: Annotated[str, typer.Option(help="difficulties (hops) to cycle through, e.g. 1,2,3")] = "1,2,3",
    id_normalisation: Annotated[
        str, typer.Option(help="how id tokens in text match document ids: exact, casefold or separators (-_. alike)")
    ] = "casefold",
    id_alias: Annotated[
        str, typer.Option(help="how text names namespaced ids: prefix (deb:libssl3 as libssl3), none, or a regex "
                               "with one group that fully matches an id, the group being its bare name")
    ] = "prefix",
    min_yield: Annotated[float, typer.Option(
        help="fail (exit 2, nothing written) when fewer than this share of --n tasks are kept; 0: keep any")
    ] = DEFAULT_MIN_YIELD,
    strict: Annotated[bool, typer.Option(help="fail (exit 2, nothing written) unless all --n tasks are kept")] = False,
    generator: Annotated[str, typer.Option(help="extractive (rules, CPU, no model) or llm (a policy)")] = "extractive",
    policy: Annotated[str, typer.Option(help="llm generator: hf or openai")] = "openai",
    model: Annotated[str, typer.Option(help="llm generator: model name or 'smollm2'")] = "smollm2",
    base_url: Annotated[str | None, typer.Option(help="llm generator with openai: server URL incl. /v1")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="OPENAI_API_KEY", help="openai: API key")] = None,
) -> None:
    """Generate verified multi-hop search tasks (JSONL) from a corpus; failed tasks are dropped and counted.

    Keeping no task, or fewer than --min-yield of --n (default half), is an error naming the reasons (nothing
    is written); keeping fewer than --n but enough prints a warning (an error with --strict).
    """
    from taskrl.policies import make_policy

    try:
        hop_values = tuple(int(h) for h in hops.split(","))
    except ValueError:
        raise ValueError(f"--hops must be comma-separated integers such as 1,2,3, got {hops!r}") from None
    if not 0 <= min_yield <= 1:
        raise ValueError(f"--min-yield must be a share of --n between 0 and 1, got {min_yield}")
    config = GenerationConfig(n=n, seed=seed, hops=hop_values, id_normalisation=id_normalisation, id_alias=id_alias)
    store = CorpusStore(corpus)
    if generator == "extractive":
        tasks, report = ExtractiveGenerator(store, config).generate()
    elif generator == "llm":
        llm = make_policy(policy, model=model, base_url=base_url, api_key=api_key)
        tasks, report = asyncio.run(LLMGenerator(store, llm, config).agenerate())
    else:
        raise ValueError(f"--generator must be 'extractive' or 'llm', got {generator!r}")
    reasons = ", ".join(f"{k}: {v}" for k, v in report.dropped.most_common(5)) or "none"
    bridges = (
        f"id normalisation {report.id_normalisation}, id alias {report.id_alias} ({report.aliased_ids} aliased ids), "
        f"{report.bridge_sources} bridge sentences"
        + (f", {len(report.ambiguous_ids)} ambiguous ids" if report.ambiguous_ids else "")
    )
    needed = n if strict else max(1, math.ceil(min_yield * n))
    if len(tasks) < needed:
        why = "--strict" if strict else f"--min-yield {min_yield:g}"
        raise TooFewTasksError(
            f"kept {report.kept} of {n} tasks, nothing written: {why} asks for at least {needed} ({bridges}; "
            f"dropped: {reasons}); {shortfall_hint(report, hop_values)}"
        )
    path = write_tasks(tasks, out or corpus / "tasks.jsonl")
    by_hops = ", ".join(f"{h} hops: {c}" for h, c in sorted(Counter(t.info["difficulty"] for t in tasks).items()))
    dropped = dict(report.dropped) or "none"
    Console().print(f"kept {report.kept}/{report.requested} tasks ({by_hops}); {bridges}; dropped: {dropped}; "
                    f"written to {path}")  # fmt: skip
    if len(tasks) < n:
        Console(stderr=True).print(
            f"[yellow]warning:[/yellow] only {len(tasks)} of the {n} requested tasks were kept (most dropped: "
            f"{reasons}); pass --strict to make this an error"
        )


def _swarm_command(
    kind: str, corpus: Path, n: int, rows: int, hops: int, seed: int, out: Path | None, allow_fewer: bool
) -> None:
    """Generate and write; exit 1 (after writing what was kept) when fewer than ``n`` tasks were kept, unless
    ``allow_fewer``; with 0 kept nothing is written and the exit is 1 either way."""
    console = Console(stderr=True, soft_wrap=True)
    config = SwarmTaskConfig(kind=kind, n=n, rows=rows, hops=hops, seed=seed)
    tasks, report = generate_swarm_tasks(CorpusStore(corpus), config)
    dropped = dict(report.dropped) or "none"
    if not tasks:
        console.print(
            f"[red]error:[/red] kept 0/{n} {kind}-search tasks of {rows} rows ({report.kept} verified rows for "
            f"{n * rows} wanted; dropped: {dropped}); nothing written. Try fewer --rows or --hops, or a larger corpus."
        )
        raise typer.Exit(1)
    path = write_tasks(tasks, out or corpus / f"swarm_{kind}.jsonl")
    summary = (
        f"kept {len(tasks)}/{n} {kind}-search tasks of {rows} rows ({report.kept} verified rows); "
        f"dropped: {dropped}; written to {path}"
    )
    if len(tasks) < n:
        console.print(f"[yellow]warning:[/yellow] {summary}: fewer tasks than asked for (--allow-fewer accepts that)")
        if not allow_fewer:
            raise typer.Exit(1)
        return
    Console(soft_wrap=True).print(summary)


CorpusOpt = Annotated[Path, typer.Option(help="corpus directory from `taskrl corpus build`")]
OutOpt = Annotated[Path | None, typer.Option(help="tasks JSONL (default: CORPUS/swarm_<kind>.jsonl)")]
SeedOpt = Annotated[int, typer.Option(help="seed of every random choice")]
AllowFewerOpt = Annotated[
    bool, typer.Option(help="exit 0 when fewer tasks than --n were kept (0 kept is an error regardless)")
]


def widesearch_command(
    corpus: CorpusOpt,
    n: Annotated[int, typer.Option(help="tasks to write")] = 16,
    rows: Annotated[int, typer.Option(help="independent items per task")] = 8,
    seed: SeedOpt = 0,
    out: OutOpt = None,
    allow_fewer: AllowFewerOpt = False,
) -> None:
    """Generate wide-search tasks: many independent look-ups answered as a table (r_perf = item F1)."""
    _swarm_command(WIDE, corpus, n, rows, 1, seed, out, allow_fewer)


def deepsearch_command(
    corpus: CorpusOpt,
    n: Annotated[int, typer.Option(help="tasks to write")] = 16,
    rows: Annotated[int, typer.Option(help="branches per task")] = 3,
    hops: Annotated[int, typer.Option(help="hops per branch (2 or 3)")] = 2,
    seed: SeedOpt = 0,
    out: OutOpt = None,
    allow_fewer: AllowFewerOpt = False,
) -> None:
    """Generate deep-search tasks: multi-hop branches whose answers combine (right only when all are)."""
    _swarm_command(DEEP, corpus, n, rows, hops, seed, out, allow_fewer)


def codebugs_command(
    sdist: Annotated[str, typer.Option(help="NAME==VERSION of a PyPI sdist that ships its tests")],
    n: Annotated[int, typer.Option(help="tasks to keep")] = 8,
    out: Annotated[Path | None, typer.Option(help="task set JSON (default: data/codebugs/NAME-VERSION.json)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the candidate order and descriptions")] = 0,
    sdist_file: Annotated[
        Path | None, typer.Option(help="use this local sdist instead of fetching NAME==VERSION")
    ] = None,
    test_file: Annotated[list[str] | None, typer.Option(help="test file to run (repeatable); default: all")] = None,
    max_candidates: Annotated[int, typer.Option(help="mutations tried at most")] = 200,
    cpu_seconds: Annotated[
        int, typer.Option(help="CPU-seconds limit of one test-suite run (coverage costs more)")
    ] = 300,
    test_timeout: Annotated[float, typer.Option(help="wall-clock limit of one test-suite run, seconds")] = 120.0,
    unsafe_no_sandbox: Annotated[bool, typer.Option(help="run the project's tests WITHOUT bubblewrap")] = False,
) -> None:
    """Mine verified bug-fixing tasks from a PyPI project with its own tests (SWE-smith style)."""
    console = Console()
    path = sdist_file if sdist_file is not None else fetch_sdist(sdist)
    if not path.is_file():
        raise TaskSetError(f"sdist {path} not found")
    config = MineConfig(
        n=n, seed=seed, max_candidates=max_candidates, test_files=list(test_file or []), cpu_seconds=cpu_seconds,
        test_timeout_s=test_timeout, sandbox=SandboxConfig(unsafe_no_sandbox=unsafe_no_sandbox),
    )  # fmt: skip
    meta, report = asyncio.run(mine_bugs(path, config))
    target = out or Path("data/codebugs") / path.name.replace(".tar.gz", ".json")
    write_task_set(meta, path, target)
    dropped = ", ".join(f"{why}: {k}" for why, k in report.dropped.most_common()) or "none"
    console.print(
        f"kept {report.kept}/{n} tasks from {report.tried} candidates ({report.baseline_passed} baseline tests pass, "
        f"{report.unstable} with run-dependent ids left out); "
        f"dropped: {dropped}\ntask set: {target}  (use: make('code-bugs', tasks_path='{target}'))",
        highlight=False,
    )
    if report.kept < n:
        raise MiningError(f"only {report.kept} of {n} tasks could be verified; raise --max-candidates or lower --n")
