"""Mine bug-fixing tasks from a real Python project on PyPI (SWE-smith style): ``taskrl datagen codebugs``.

``mine_bugs(sdist, n)`` unpacks the sdist, runs its own test suite in the sandbox under coverage.py, and
proposes small AST-level mutations (a flipped comparison, a swapped operator, an off-by-one constant, a
dropped statement, swapped arguments, a negated condition) on lines the tests execute. A mutation becomes a
task only if, applied in a fresh workspace, tests that pass on the original code now fail (the original code
is the verified gold fix). Descriptions stay vague, as a developer would file them. The result is a JSON task
set written next to a copy of the sdist, read by ``taskrl.envs.code.tasks.load_bug_tasks``.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskrl import __version__
from taskrl.envs.code.reward import is_test_file
from taskrl.envs.code.sandbox import Sandbox, SandboxConfig
from taskrl.envs.code.tasks import BUILTIN_DATA, TASK_SET_FORMAT, code_cache, sha256_file, unpack_sdist
from taskrl.envs.code.testrun import PASSED, TestRun, run_pytest
from taskrl.envs.code.workspace import WorkspaceConfig, pool_for
from taskrl.moved import moved_names
from taskrl.validate import at_least, require

_SPEC_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")
_SKIP_DIRS = {"docs", "doc", "build", "dist", ".git", ".tox", ".nox", "examples", "benchmarks", "__pycache__"}
_COMPARE_SWAP = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
                 ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.In: ("in", "not in"),
                 ast.NotIn: ("not in", "in"), ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is")}  # fmt: skip
_BINOP_SWAP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "//"), ast.FloorDiv: ("//", "*")}
_BOOL_SWAP = {ast.And: ("and", "or"), ast.Or: ("or", "and")}
_TEMPLATES = (
    "`{func}()` gives wrong results for some inputs since the last change. Can you find and fix the bug?",
    "Some tests in `{test_file}` started failing, e.g. `{test}`. Something in `{module}` broke. Please fix it.",
    "Users report that `{module}.{func}` misbehaves in some cases. Please investigate and fix it; the test suite "
    "should pass again.",
    "After a refactor `{test}` fails. Please fix the code (not the tests).",
)


class MiningError(RuntimeError):
    """The project cannot be mined (no tests, failing baseline, sdist not found)."""


@dataclass(frozen=True)
class Mutation:
    """One text edit of a source file: bytes [start, end) become ``replacement``."""

    path: str
    function: str
    kind: str
    start: int
    end: int
    replacement: bytes
    line: int

    def apply(self, data: bytes) -> bytes:
        return data[: self.start] + self.replacement + data[self.end :]


# -- finding the sdist ---------------------------------------------------------------------------------------


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _find_sdist(folder: Path, name: str, version: str) -> Path | None:
    for path in sorted(folder.glob("*.tar.gz")) if folder.is_dir() else []:
        stem, _, found_version = path.name.removesuffix(".tar.gz").rpartition("-")
        if _canonical(stem) == _canonical(name) and found_version == version:
            return path
    return None


def fetch_sdist(spec: str) -> Path:
    """``NAME==VERSION`` -> a local sdist: ``cache_dir()/code/sdists``, the bundled copy, or ``pip download``.

    pip prepares an sdist's metadata by running its build backend on this machine: mine projects you trust.
    """
    match = _SPEC_RE.match(spec.strip())
    if not match:
        raise MiningError(f"--sdist must look like NAME==VERSION, got {spec!r}")
    name, version = match.groups()
    downloads = code_cache() / "sdists"
    for folder in (downloads, BUILTIN_DATA):
        if (found := _find_sdist(folder, name, version)) is not None:
            return found
    downloads.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(downloads), spec]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    found = _find_sdist(downloads, name, version)
    if done.returncode != 0 or found is None:
        raise MiningError(f"pip download {spec} failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return found


# -- the project -----------------------------------------------------------------------------------------------


def _python_files(repo: Path) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(repo):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield os.path.relpath(os.path.join(dirpath, name), repo)


def find_test_files(repo: Path) -> list[str]:
    return [p for p in _python_files(repo) if is_test_file(p)]


def find_code_files(repo: Path) -> list[str]:
    """Library modules: not tests, not test helpers, not packaging scripts."""
    skip = {"setup.py", "conftest.py", "noxfile.py", "fabfile.py", "tasks.py"}
    test_dirs = {"tests", "test", "testing"}
    return [
        p for p in _python_files(repo)
        if not is_test_file(p) and os.path.basename(p) not in skip and not test_dirs & set(Path(p).parts)
    ]  # fmt: skip


# -- mutations -----------------------------------------------------------------------------------------------


def _function_nodes(body: list[ast.stmt], prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + node.name, node
            yield from _function_nodes(node.body, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _function_nodes(node.body, f"{prefix}{node.name}.")


def _own_nodes(func: ast.AST) -> Iterator[ast.AST]:
    """Nodes of a function, without those of functions nested in it (they are mutated as themselves)."""
    stack: list[ast.AST] = list(func.body)  # type: ignore[attr-defined] - not decorators, defaults, annotations
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def candidate_mutations(path: str, source: str, covered: set[int]) -> list[Mutation]:
    """Every single-site mutation on a line in ``covered`` (1-based line numbers executed by the tests)."""
    data = source.encode("utf-8")
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def at(lineno: int, col: int) -> int:
        return starts[lineno - 1] + col

    def between(a: ast.AST, b: ast.AST) -> tuple[int, int, str]:
        lo, hi = at(a.end_lineno, a.end_col_offset), at(b.lineno, b.col_offset)  # type: ignore[attr-defined, arg-type]
        return lo, hi, data[lo:hi].decode("utf-8", errors="replace")

    def segment(node: ast.AST) -> tuple[int, int, bytes]:
        lo, hi = at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined, arg-type]
        return lo, hi, data[lo:hi]

    out: list[Mutation] = []
    tree = ast.parse(source)
    for name, func in _function_nodes(tree.body):
        docstring = ast.get_docstring(func, clean=False) is not None  # type: ignore[arg-type]
        body = func.body[1:] if docstring else func.body  # type: ignore[attr-defined]

        def add(kind: str, lo: int, hi: int, new: bytes, line: int, function: str = name) -> None:
            out.append(Mutation(path, function, kind, lo, hi, new, line))

        nodes = list(_own_nodes(func))
        for node in nodes:
            if not isinstance(node, ast.stmt | ast.expr):  # operators, contexts, handlers: nothing to mutate
                continue
            line = node.lineno
            if isinstance(node, ast.If) and line in covered and node.test.lineno == node.test.end_lineno:
                lo, hi, text = segment(node.test)
                add("negate condition", lo, hi, b"not (" + text + b")", line)
            if line not in covered or node.end_lineno != line:
                continue
            if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE_SWAP:
                old, new = _COMPARE_SWAP[type(node.ops[0])]
                lo, hi, gap = between(node.left, node.comparators[0])
                if " ".join(gap.strip(" ()").split()) == old:
                    add("flip comparison", lo, hi, gap.replace(gap.strip(" ()"), new, 1).encode(), line)
            elif isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
                old, new = _BINOP_SWAP[type(node.op)]
                lo, hi, gap = between(node.left, node.right)
                if gap.strip(" ()") == old:
                    add("swap operator", lo, hi, gap.replace(old, new, 1).encode(), line)
            elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
                old, new = _BOOL_SWAP[type(node.op)]
                lo, hi, gap = between(node.values[0], node.values[1])
                if gap.strip(" ()") == old:
                    add("swap boolean operator", lo, hi, gap.replace(old, new, 1).encode(), line)
            elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                lo, _, _ = segment(node)
                add("drop negation", lo, at(node.operand.lineno, node.operand.col_offset), b"", line)
            elif (
                isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= 64
                and segment(node)[2] == str(node.value).encode()
            ):  # fmt: skip
                lo, hi, _ = segment(node)
                add("off by one", lo, hi, str(node.value + 1).encode(), line)
            elif isinstance(node, ast.Call) and len(node.args) >= 2 and not node.keywords:
                first, second = node.args[0], node.args[1]
                if not any(isinstance(a, ast.Starred) for a in (first, second)):
                    lo, _, a_text = segment(first)
                    _, hi, b_text = segment(second)
                    gap = data[at(first.end_lineno, first.end_col_offset) : at(second.lineno, second.col_offset)]  # type: ignore[arg-type]
                    if a_text != b_text:
                        add("swap arguments", lo, hi, b_text + gap + a_text, line)
        # Every statement list of a nested node: if/for/while/with/try bodies and else branches (an IfExp's are
        # expressions, not lists).
        branches = (value for n in nodes for name, value in ast.iter_fields(n) if name in ("body", "orelse"))
        blocks = [body] + [value for value in branches if isinstance(value, list)]
        for block in blocks:
            for stmt in block if len(block) > 1 else []:  # dropping the only statement would not parse
                if (
                    isinstance(stmt, ast.Assign | ast.AugAssign | ast.Expr)
                    and stmt.lineno in covered and stmt.lineno == stmt.end_lineno
                ):  # fmt: skip
                    lo, hi, text = segment(stmt)
                    line_start, line_end = starts[stmt.lineno - 1], starts[stmt.lineno]
                    if data[line_start:line_end].strip() == text.strip():  # the statement is alone on its line
                        add("drop statement", line_start, line_end, b"", stmt.lineno)
    return out


def snippet_pair(original: str, buggy: str, line: int) -> tuple[str, str]:
    """The smallest block of whole lines around ``line`` that is unique in both texts, before and after."""
    old_lines, new_lines = original.splitlines(keepends=True), buggy.splitlines(keepends=True)
    delta = len(new_lines) - len(old_lines)
    first, last = line - 1, line - 1
    while True:
        old = "".join(old_lines[first : last + 1])
        new = "".join(new_lines[first : last + 1 + delta])
        if old != new and original.count(old) == 1 and buggy.count(new) == 1:
            return old, new
        if first == 0 and last >= len(old_lines) - 1:
            raise MiningError(f"cannot find a unique snippet around line {line}")
        first, last = max(0, first - 1), min(len(old_lines) - 1, last + 1)


# -- mining --------------------------------------------------------------------------------------------------


@dataclass
class MineConfig:
    """How bugs are mined from one sdist."""

    n: int = 8
    """Tasks to keep."""
    seed: int = 0
    """Seed of the candidate order and of the description templates."""
    max_candidates: int = 200
    """Mutations tried at most before giving up on reaching n."""
    per_function: int = 1
    """Most tasks from one function, so the set spreads over the code."""
    concurrency: int = 2
    """Candidate verifications run at once."""
    test_timeout_s: float = 120.0
    """Wall limit of one test-suite run."""
    test_files: list[str] = field(default_factory=list)
    """Test files to run; empty = every test_*.py / *_test.py of the project."""
    cpu_seconds: int | None = None
    """CPU-seconds limit of one test-suite run (the baseline runs under coverage.py, which costs more); None
    keeps ``sandbox.cpu_seconds``."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Sandbox of every test run (mined code never runs outside it)."""
    workspace: WorkspaceConfig = field(default_factory=WorkspaceConfig)
    """Workspaces the candidates are verified in."""

    def __post_init__(self) -> None:
        require("MineConfig", "must be >= 1", at_least(1), n=self.n, max_candidates=self.max_candidates,
                per_function=self.per_function, concurrency=self.concurrency)  # fmt: skip
        if not self.test_timeout_s > 0:
            raise ValueError(f"MineConfig.test_timeout_s must be > 0, got {self.test_timeout_s}")
        if self.cpu_seconds is not None:
            if self.cpu_seconds < 1:
                raise ValueError(f"MineConfig.cpu_seconds must be >= 1, got {self.cpu_seconds}")
            self.sandbox = dataclasses.replace(self.sandbox, cpu_seconds=self.cpu_seconds)


@dataclass
class MineReport:
    """What mining tried and why candidates were dropped."""

    tried: int = 0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    baseline_passed: int = 0
    unstable: int = 0
    """Passing tests left out of the baseline: their test function's ids differ between two clean runs."""


def unstable_tests(first: set[str], second: set[str]) -> set[str]:
    """Ids passing in one clean run but not the other, with every id of their test function (parametrised ids
    built from a run-dependent order, e.g. ``test_format[4-19-expected6-%C]``, differ as a family)."""
    changed = first ^ second
    functions = {t.split("[", 1)[0] for t in changed}
    return changed | {t for t in first | second if t.split("[", 1)[0] in functions}


def test_file_of(test_id: str, test_files: Sequence[str]) -> str | None:
    """The test file a ``classname::name`` id comes from (classes and nested dirs included), if it is one."""
    classname = test_id.split("::")[0]
    matches = [f for f in test_files if classname == (m := f.removesuffix(".py").replace("/", ".")) or
               classname.startswith(m + ".")]  # fmt: skip
    return max(matches, key=len) if matches else None


def describe(
    mutation: Mutation, failing: Sequence[str], rng: random.Random, test_files: Sequence[str] | None = None
) -> str:
    """A vague, developer-style report of the bug: a symptom, never the fix. It names a test file only when
    the failing test really comes from one of ``test_files`` (default: the file its id implies)."""
    module = mutation.path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    test = failing[0].split("::")[-1].split("[")[0]
    implied = failing[0].split("::")[0].replace(".", "/") + ".py"
    test_file = test_file_of(failing[0], test_files if test_files is not None else [implied])
    func = mutation.function.split(".")[-1]
    templates = [t for t in _TEMPLATES if test_file is not None or "{test_file}" not in t]
    if func.startswith("_"):
        templates = [t for t in templates if "{func}()" not in t and "{module}.{func}" not in t]
    return rng.choice(templates).format(func=func, module=module, test=test, test_file=test_file)


def project_pythonpath(repo: Path) -> list[str]:
    """Where the project's code imports from: ``src`` for a src layout, and the root always (a root package
    with its tests in ``test/`` or ``tests/`` needs it: isolated Python does not put the working directory on
    ``sys.path``)."""
    return (["src"] if (repo / "src").is_dir() else []) + ["."]


async def _verify(
    mutation: Mutation,
    repo: Path,
    data: bytes,
    baseline: set[str],
    config: MineConfig,
    sandbox: Sandbox,
    test_files: list[str],
    pythonpath: list[str],
    conftest: bool,
) -> tuple[list[str] | None, str]:
    """(tests the bug breaks, "") or (None, why the candidate was dropped)."""
    buggy = mutation.apply(data)
    try:
        ast.parse(buggy)
    except SyntaxError:
        return None, "mutation is not valid Python"
    workspace = await asyncio.to_thread(pool_for(repo, config.workspace).acquire)
    try:
        workspace.write_file(mutation.path, buggy)
        run, _ = await run_pytest(
            sandbox,
            workspace.path,
            test_files,
            pythonpath=pythonpath,
            conftest=conftest,
            timeout_s=config.test_timeout_s,
        )
    finally:
        await asyncio.to_thread(workspace.destroy)
    if run.failure is not None:
        return None, run.failure.split(":")[0]
    broken = sorted(t for t in baseline if run.outcomes.get(t) != PASSED)
    return (broken, "") if broken else (None, "no test fails with the bug")


async def mine_bugs(sdist: Path, config: MineConfig) -> tuple[dict[str, Any], MineReport]:
    """Mine up to ``config.n`` verified bug tasks from an sdist; returns the task set and a report."""
    repo = unpack_sdist(sdist)
    sandbox = Sandbox(config.sandbox)
    test_files = config.test_files or find_test_files(repo)
    if not test_files:
        raise MiningError(f"{sdist.name} ships no test files (test_*.py, *_test.py); pass them with --test-file")
    pythonpath = project_pythonpath(repo)
    conftest = any(repo.rglob("conftest.py"))  # the env runs the tasks the same way (tasks._has_conftest)
    code_files = find_code_files(repo)
    report = MineReport()
    pool = pool_for(repo, config.workspace)

    async def suite(coverage_of: list[str] | None) -> tuple[TestRun, dict[str, Any] | None]:
        workspace = await asyncio.to_thread(pool.acquire)
        try:
            return await run_pytest(
                sandbox,
                workspace.path,
                test_files,
                pythonpath=pythonpath,
                conftest=conftest,
                timeout_s=config.test_timeout_s,
                coverage_of=coverage_of,
            )
        finally:
            await asyncio.to_thread(workspace.destroy)

    run, coverage = await suite(code_files)
    if run.failure is not None or coverage is None:
        raise MiningError(
            f"the test suite of {sdist.name} does not run cleanly: {run.failure or 'no coverage'}\n{run.summary()}"
        )
    baseline = {t for t, o in run.outcomes.items() if o == PASSED}
    again, _ = await suite(None)  # a test whose id changes from run to run can never be checked by id
    unstable = unstable_tests(baseline, {t for t, o in again.outcomes.items() if o == PASSED})
    baseline -= unstable
    report.unstable = len(unstable)
    report.baseline_passed = len(baseline)
    candidates: list[Mutation] = []
    sources: dict[str, bytes] = {}
    for path in code_files:
        covered = set(coverage["files"].get(path, {}).get("executed_lines", []))
        if covered:
            sources[path] = (repo / path).read_bytes()
            candidates += candidate_mutations(path, sources[path].decode("utf-8"), covered)
    rng = random.Random(config.seed)
    rng.shuffle(candidates)
    candidates = _interleave_kinds(candidates)
    tasks: list[dict[str, Any]] = []
    per_function: Counter[tuple[str, str]] = Counter()
    queue = iter(candidates[: config.max_candidates])
    while len(tasks) < config.n:
        batch = []
        for mutation in queue:
            if per_function[(mutation.path, mutation.function)] < config.per_function:
                batch.append(mutation)
            if len(batch) == config.concurrency:
                break
        if not batch:
            break
        results = await asyncio.gather(
            *(
                _verify(m, repo, sources[m.path], baseline, config, sandbox, test_files, pythonpath, conftest)
                for m in batch
            )
        )
        for mutation, (broken, why) in zip(batch, results, strict=True):
            report.tried += 1
            key = (mutation.path, mutation.function)
            if broken is None or per_function[key] >= config.per_function or len(tasks) >= config.n:
                report.dropped[why or "enough tasks from this function"] += 1
                continue
            per_function[key] += 1
            tasks.append(_task_spec(sdist, mutation, sources[mutation.path], broken, len(tasks), rng, test_files))
    report.kept = len(tasks)
    meta = {
        "format": TASK_SET_FORMAT,
        "project": repo.name,
        "sdist": {"filename": sdist.name, "sha256": sha256_file(sdist)},
        "test_files": test_files,
        "pythonpath": pythonpath,
        "plugins": [],
        "conftest": conftest,
        "baseline_passed": sorted(baseline),
        "unstable_tests": report.unstable,
        "generator": {"taskrl": __version__, "seed": config.seed, "tried": report.tried},
        "tasks": tasks,
    }
    return meta, report


def _interleave_kinds(candidates: list[Mutation]) -> list[Mutation]:
    """Round-robin over mutation kinds (keeping each kind's shuffled order), so a set is not all one kind."""
    by_kind: dict[str, list[Mutation]] = {}
    for mutation in candidates:
        by_kind.setdefault(mutation.kind, []).append(mutation)
    queues = [by_kind[k] for k in sorted(by_kind)]
    out: list[Mutation] = []
    for i in range(max((len(q) for q in queues), default=0)):
        out += [q[i] for q in queues if i < len(q)]
    return out


def _task_spec(
    sdist: Path,
    mutation: Mutation,
    data: bytes,
    broken: list[str],
    index: int,
    rng: random.Random,
    test_files: Sequence[str],
) -> dict[str, Any]:
    original = data.decode("utf-8")
    old, new = snippet_pair(original, mutation.apply(data).decode("utf-8"), mutation.line)
    project = sdist.name.removesuffix(".tar.gz")
    ticket = int(hashlib.sha256(f"{project}/{mutation.function}/{index}".encode()).hexdigest()[:4], 16) % 900 + 100
    return {
        "id": f"{project}/{mutation.function}-{index}",
        "prompt": f"Issue #{ticket}: {describe(mutation, broken, rng, test_files)}",
        "path": mutation.path,
        "function": mutation.function,
        "mutation": mutation.kind,
        "original": old,
        "buggy": new,
        "fail_to_pass": broken,
    }


def write_task_set(meta: dict[str, Any], sdist: Path, out: Path) -> Path:
    """Write the JSON and put a copy of the sdist next to it (a task set is read from that pair)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if not (out.parent / sdist.name).exists():
        shutil.copy2(sdist, out.parent / sdist.name)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out)
    return out


__getattr__ = moved_names(__name__, {"codebugs_command": "taskrl.commands.datagen"})
