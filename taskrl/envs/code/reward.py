"""Hidden-test measurement of the code env, with the anti-hacking checks Composer needed.

``protect(workspace)`` hashes every test and test-configuration file before the episode; ``score(...)`` after
it reports tampering (any protected file changed or deleted, or a new conftest/pytest config/``.pth``), runs
the hidden tests in the sandbox and returns the share that passes. Tampering scores 0 without running
anything; no tests collected, collection errors, a missing report and timeouts score 0 too. Tests the agent
wrote are run under coverage.py and their coverage of the code under test is reported (the trivial-test
penalty reads it). The reward is the ``composer`` preset (``taskrl.rewards.presets``), built from
``CodeRewardConfig`` by ``taskrl.envs.code.env.composer_reward``: one formula, Composer's effort penalty
((1+k·x)^(1-q)-1)/(k·(1-q)) included.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from taskrl.envs.code.checks import run_function_check
from taskrl.envs.code.sandbox import Sandbox
from taskrl.envs.code.testrun import TestRun, line_coverage, run_pytest
from taskrl.envs.code.workspace import Workspace, walk_tree
from taskrl.types import Task, Trajectory

TEST_FILE_PATTERNS = ("test_*.py", "*_test.py")
CONFIG_NAMES = frozenset(
    {"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg",
     "pyproject.toml", "sitecustomize.py", "usercustomize.py"}
)  # fmt: skip
"""Files pytest or Python read as configuration. The test runs read none of them from the workspace (see
``testrun``); changing or adding one is flagged all the same, since it can only be meant for the tests."""
_QUESTION_RE = re.compile(r"\?\s*(?:</answer>)?\s*$")


@dataclass
class CodeRewardConfig:
    """How an episode of the code env is scored: the ``composer`` preset's parameters (defaults: hidden tests
    only, each extra term off) and the test run's."""

    effort_weight: float = 0.0
    """Weight of the effort penalty; 0 turns it off. Penalties never take an episode below a failure (0)."""
    effort_measure: Literal["tool_calls", "turns"] = "tool_calls"
    """What x counts in the effort penalty."""
    effort_k: float = 0.1
    """k of the effort penalty: where the curve bends."""
    effort_q: float = 0.5
    """q of the effort penalty: its concavity (0 linear, 1 logarithmic)."""
    test_timeout_s: float = 300.0
    """Wall limit of the hidden-test run; a run past it scores 0."""
    measure_coverage: bool = True
    """Run tests the agent wrote under coverage.py and record ``info["test_coverage"]``."""
    valid_tool_use_weight: float = 0.0
    """Weight of Composer's valid-tool-use credit (share of calls that were valid); 0 turns it off. When on, the
    tamper gate is on too: a tampering episode earns no credit."""
    valid_tool_use_counts_errors: bool = False
    """The credit counts only calls that also ran without an error (a read of a file that does not exist
    earns nothing): well-formed calls that do nothing cannot farm it."""
    trivial_tests_weight: float = 0.0
    """Weight of Composer's trivial-test penalty on tests the agent wrote (needs ``measure_coverage``); 0: off."""

    def __post_init__(self) -> None:
        weights = {"effort_weight": self.effort_weight, "valid_tool_use_weight": self.valid_tool_use_weight,
                   "trivial_tests_weight": self.trivial_tests_weight}  # fmt: skip
        for name, value in weights.items():
            if not value >= 0:
                raise ValueError(f"CodeRewardConfig.{name} must be >= 0, got {value}")
        if not isinstance(self.valid_tool_use_counts_errors, bool):
            raise ValueError(f"CodeRewardConfig.valid_tool_use_counts_errors must be true or false, got "
                             f"{self.valid_tool_use_counts_errors!r}")  # fmt: skip
        if self.effort_measure not in ("tool_calls", "turns"):
            raise ValueError(
                f"CodeRewardConfig.effort_measure must be tool_calls or turns, got {self.effort_measure!r}"
            )
        if not self.effort_k > 0:
            raise ValueError(f"CodeRewardConfig.effort_k must be > 0, got {self.effort_k}")
        if self.effort_q < 0:
            raise ValueError(f"CodeRewardConfig.effort_q must be >= 0, got {self.effort_q}")
        if not self.test_timeout_s > 0:
            raise ValueError(f"CodeRewardConfig.test_timeout_s must be > 0, got {self.test_timeout_s}")


def is_test_file(relpath: str) -> bool:
    name = os.path.basename(relpath)
    return any(fnmatch.fnmatch(name, p) for p in TEST_FILE_PATTERNS)


def is_protected(relpath: str) -> bool:
    """Files whose change can make tests pass without fixing code: tests, conftest, pytest config, .pth."""
    name = os.path.basename(relpath)
    return is_test_file(relpath) or name in CONFIG_NAMES or name.endswith(".pth")


def _walk(root: Path) -> list[tuple[str, os.stat_result]]:
    """Every non-directory under ``root``, never following a link (``TreeTooDeepError`` on hostile depths)."""
    return [(rel, st) for rel, st in walk_tree(root) if not stat.S_ISDIR(st.st_mode)]


def _digest(path: Path, st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):  # never follow: a test replaced by a symlink is a change
        return "symlink:" + os.readlink(path)
    if not stat.S_ISREG(st.st_mode):
        return f"special:{stat.S_IFMT(st.st_mode)}"
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def protect(root: Path) -> dict[str, str]:
    """sha256 of every protected file under ``root``, taken before the episode."""
    return {rel: _digest(root / rel, st) for rel, st in _walk(root) if is_protected(rel)}


def find_tampering(root: Path, before: dict[str, str]) -> list[str]:
    """What happened to protected files since ``protect``: 'modified X', 'deleted X', 'added X' (configs only)."""
    now = {rel: st for rel, st in _walk(root) if is_protected(rel)}
    problems = []
    for rel, digest in sorted(before.items()):
        if rel not in now:
            problems.append(f"deleted {rel}")
        elif _digest(root / rel, now[rel]) != digest:
            problems.append(f"modified {rel}")
    problems += [f"added {rel}" for rel in sorted(now) if rel not in before and not is_test_file(rel)]
    return problems


def tree_state(root: Path) -> dict[str, tuple[int, int, int]]:
    """(size, mtime, inode) of every file: cheap, and any write by a tool or a command changes it."""
    return {rel: (st.st_size, st.st_mtime_ns, st.st_ino) for rel, st in _walk(root)}


def new_test_files(root: Path, before: dict[str, tuple[int, int, int]], hidden: set[str]) -> list[str]:
    """Test files the agent wrote (present now, absent at reset, not a hidden test)."""
    return sorted(
        rel
        for rel, st in _walk(root)
        if stat.S_ISREG(st.st_mode) and is_test_file(rel) and rel not in before and rel not in hidden
    )  # regular files only: a FIFO named test_x.py would hang the coverage run


@dataclass
class Score:
    """The hidden-test outcome of one episode."""

    tests: float = 0.0
    """Share of fail-to-pass tests passing times share of pass-to-pass tests passing; 0 on any failure."""
    failure: str | None = None
    tampering: list[str] = field(default_factory=list)
    run: TestRun | None = None
    coverage: float | None = None
    agent_tests: list[str] = field(default_factory=list)


async def score(
    sandbox: Sandbox,
    workspace: Workspace,
    task: Task,
    protected: dict[str, str],
    initial_state: dict[str, tuple[int, int, int]],
    config: CodeRewardConfig,
) -> Score:
    """Check for tampering, put the hidden tests in place, run them, and measure the agent's own tests."""
    info = task.info
    out = Score(tampering=find_tampering(workspace.path, protected))
    hidden_files: dict[str, str] = info.get("hidden_files", {})
    out.agent_tests = new_test_files(workspace.path, initial_state, set(hidden_files))
    if config.measure_coverage and out.agent_tests and not out.tampering:
        _, report = await run_pytest(
            sandbox,
            workspace.path,
            out.agent_tests,
            pythonpath=info.get("pythonpath", []),
            plugins=info.get("plugins", []),
            conftest=info.get("conftest", False),
            timeout_s=config.test_timeout_s,
            coverage_of=info["code_files"],
        )
        out.coverage = line_coverage(report)
    if out.tampering:
        out.failure = "tampering: " + "; ".join(out.tampering)
        return out
    if "check" in info:  # HumanEval: the test runs in a sandbox of its own against the agent's function
        out.run = await run_function_check(
            sandbox, workspace.path, info["check"], info["fail_to_pass"][0], timeout_s=config.test_timeout_s
        )
    else:
        try:
            for relpath, content in hidden_files.items():
                workspace.write_file(relpath, content.encode("utf-8"))
        except (OSError, ValueError) as e:  # e.g. the agent left a directory where a hidden test goes
            out.failure = f"could not put the hidden tests in place: {e}"
            return out
        out.run, _ = await run_pytest(
            sandbox,
            workspace.path,
            info["hidden_targets"],
            pythonpath=info.get("pythonpath", []),
            plugins=info.get("plugins", []),
            conftest=info.get("conftest", False),
            timeout_s=config.test_timeout_s,
        )
    fail_to_pass, pass_to_pass = info["fail_to_pass"], info.get("pass_to_pass", [])
    if out.run.tampering:  # pytest patched from the code under test: tampering, like an edited test
        out.tampering = list(out.run.tampering)
    if out.run.failure is not None:  # no tests, collection errors, tampering, timeouts: never a pass
        out.failure = out.run.failure
        return out
    out.tests = out.run.fraction_passed(fail_to_pass) * (out.run.fraction_passed(pass_to_pass) if pass_to_pass else 1.0)
    return out


def asked_a_question(trajectory: Trajectory) -> bool:
    """The episode ended with a question to the user instead of a result (Cursor saw this hack grow)."""
    answer = trajectory.final_answer
    return bool(answer) and bool(_QUESTION_RE.search(answer.strip()))  # type: ignore[union-attr]
