"""The Composer-style coding env: a sandboxed copy-on-write workspace per episode, seven tools, hidden tests.

``CodeEnv`` is the machinery; ``HumanEvalEnv`` ("code-humaneval") and ``CodeBugsEnv`` ("code-bugs") give it
tasks. ``reset`` takes a warm workspace from the pool of the task's base tree, writes the task's files and
hashes the tests; ``reward`` scores the final workspace with the hidden tests (see ``reward.py``) and records
``tampering``, ``no_edit``, ``clarifying_question`` and test metrics; ``close`` (or garbage collection, or
process exit) destroys the workspace. ``snapshot``/``restore`` checkpoint the workspace mid-episode, and
``checkpoint_every_step`` does it after every step. ``scripted_rule`` is an expert that applies the gold fix.
``edit_tool`` picks how the agent edits: ``edit_file`` (exact text) or ``replace_lines`` (by line number, and
``read_file`` then numbers the lines); the other of the two is not offered.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from taskrl.chat import format_tool_call
from taskrl.env import StepOutput, ToolEnv
from taskrl.envs.code.reward import (
    CodeRewardConfig,
    Score,
    asked_a_question,
    protect,
    score,
    tree_state,
)
from taskrl.envs.code.sandbox import Sandbox, SandboxConfig
from taskrl.envs.code.tasks import (
    BUILTIN_BUGS,
    bug_window,
    humaneval_tasks,
    line_edit,
    load_bug_tasks,
    minimal_edit,
)
from taskrl.envs.code.tools import CodeTools, numbered, split_lines
from taskrl.envs.code.workspace import Workspace, WorkspaceConfig, WorkspaceError, pool_for
from taskrl.rewards.presets import composer
from taskrl.rewards.terms import EffortPenalty
from taskrl.scoring import Rubric
from taskrl.tools import ToolSet
from taskrl.types import Message, Task, ToolCall, Trajectory

EDIT_TOOLS = ("edit_file", "replace_lines")
"""The two ways to edit a file; an env offers one (``edit_tool``)."""
SYSTEM_PROMPT = (
    "You are a software engineer working in a project checked out in your working directory. Use the tools to "
    "read, search, edit and run code, and run the tests before you finish. Fix the code, never the tests. "
    "When you are done, reply with a short summary of what you changed, without a tool call."
)


@dataclass
class CodeEnvConfig:
    """Sandbox, workspaces and reward of a code env."""

    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Isolation and limits of every command the agent (and the hidden tests) run."""
    workspace: WorkspaceConfig = field(default_factory=WorkspaceConfig)
    """Where workspaces live, how they are cloned, how many are kept warm."""
    reward: CodeRewardConfig = field(default_factory=CodeRewardConfig)
    """How the final workspace is scored."""
    checkpoint_every_step: bool = False
    """Snapshot the workspace after every step as ``step-N`` (for branching rollouts from a checkpoint)."""

    def __post_init__(self) -> None:
        parts = {"sandbox": (self.sandbox, SandboxConfig), "workspace": (self.workspace, WorkspaceConfig),
                 "reward": (self.reward, CodeRewardConfig)}  # fmt: skip
        for name, (value, kind) in parts.items():
            if not isinstance(value, kind):
                raise ValueError(f"CodeEnvConfig.{name} must be a {kind.__name__}, got {type(value).__name__}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CodeEnvConfig:
        """A config from JSON (a Trainer's ``env_kwargs``): ``{"reward": {"valid_tool_use_weight": 0.1}}``."""
        kinds = {"sandbox": SandboxConfig, "workspace": WorkspaceConfig, "reward": CodeRewardConfig}
        unknown = sorted(set(data) - {*kinds, "checkpoint_every_step"})
        if unknown:
            raise ValueError(f"CodeEnvConfig has no field(s) {unknown}; fields: {sorted(kinds)}, checkpoint_every_step")
        parts = {name: kinds[name](**value) for name, value in data.items() if name in kinds}
        return cls(**parts, **{k: v for k, v in data.items() if k not in kinds})


def composer_reward(config: CodeRewardConfig) -> Rubric:
    """The code env's reward: the ``composer`` preset with ``config``'s weights and effort penalty, floored at a
    failure (0) so no penalty takes a success below one; the tamper gate is on whenever valid-tool-use credit is
    (the tests term alone is already 0 on tampering)."""
    return composer(
        valid_tool_use_weight=config.valid_tool_use_weight,
        valid_tool_use_counts_errors=config.valid_tool_use_counts_errors,
        effort=EffortPenalty(config.effort_k, config.effort_q, config.effort_measure),
        effort_weight=config.effort_weight,
        trivial_tests_weight=config.trivial_tests_weight,
        tamper_gate=config.valid_tool_use_weight > 0,
        floor_at_failure=config.effort_weight > 0 or config.trivial_tests_weight > 0,
    )


class CodeEnv(CodeTools, ToolEnv):
    """A coding task in a sandboxed workspace, scored by hidden tests. Subclasses provide ``tasks``."""

    name = "code"
    system_prompt = SYSTEM_PROMPT
    sequential_tools = True  # edits and commands share one workspace: a turn's calls apply in the order written

    def __init__(
        self,
        config: CodeEnvConfig | dict[str, Any] | None = None,
        *,
        edit_tool: Literal["edit_file", "replace_lines"] = "edit_file",
        unsafe_no_sandbox: bool = False,
    ) -> None:
        super().__init__()
        if edit_tool not in EDIT_TOOLS:
            raise ValueError(f"{type(self).__name__} edit_tool must be one of {EDIT_TOOLS}, got {edit_tool!r}")
        self.edit_tool = edit_tool
        self.line_numbers = edit_tool == "replace_lines"
        self.tools = ToolSet([t for t in self.tools if t.name == edit_tool or t.name not in EDIT_TOOLS],
                             max_parallel=self.max_parallel, sequential=self.sequential_tools)  # fmt: skip
        config = CodeEnvConfig.from_dict(config) if isinstance(config, dict) else config or CodeEnvConfig()
        if unsafe_no_sandbox:  # a copy: never change a config the caller may share
            config = replace(config, sandbox=replace(config.sandbox, unsafe_no_sandbox=True))
        self.config = config
        self.sandbox = Sandbox(self.config.sandbox)
        self.rubric = composer_reward(self.config.reward)
        """The ``composer`` preset: its terms measure the episode (``reward``), ``taskrl.scoring.score`` decides."""
        self.workspace: Workspace | None = None
        self._finalizer: weakref.finalize | None = None
        self._protected: dict[str, str] = {}
        self._initial: dict[str, tuple[int, int, int]] = {}
        self.steps = 0
        self.checkpoint_errors: list[str] = []
        """Snapshots that failed this episode (``checkpoint_every_step``); emptied by ``reset``."""

    # -- episode lifecycle ---------------------------------------------------------------------------------
    async def reset(self, task: Task, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        self.close()
        self.task = task
        pool = pool_for(task.info["base"], self.config.workspace)
        workspace = await asyncio.to_thread(pool.acquire)
        self.workspace = workspace
        self._finalizer = weakref.finalize(self, workspace.destroy)  # an env dropped without close()
        for relpath, content in task.info.get("files", {}).items():
            workspace.write_file(relpath, content.encode("utf-8"))
        self._protected = protect(workspace.path)
        self._initial = tree_state(workspace.path)
        self.edits = self.commands = self.test_runs = self.steps = 0
        self.checkpoint_errors = []
        info = {"workspace_mode": workspace.mode, "sandbox": "bubblewrap" if self.sandbox.isolated else "none",
                "limits": self.sandbox.mechanisms(workspace.disk_mechanism())}  # fmt: skip
        return [Message("system", self.system_prompt), Message("user", task.prompt)], info

    async def step(self, tool_calls: list[ToolCall]) -> StepOutput:
        results, terminated, truncated, info = await super().step(tool_calls)
        self.steps += 1
        if self.config.checkpoint_every_step and self.workspace is not None:
            try:
                await asyncio.to_thread(self.workspace.snapshot, f"step-{self.steps}")
            except (OSError, WorkspaceError) as e:  # a tree too deep to copy: the episode goes on unchecked
                # the rollout loop reads only its own keys of a step's info: the reward records these
                self.checkpoint_errors.append(f"step {self.steps}: {str(e)[:300]}")
                info = {**info, "checkpoint_error": str(e)[:300]}
        return StepOutput(results, terminated, truncated, info)

    def snapshot(self, name: str) -> None:
        """Checkpoint the workspace now; ``restore(name)`` brings it back."""
        self._ws().snapshot(name)

    def restore(self, name: str) -> None:
        """Put the workspace back as it was at ``snapshot(name)`` (or ``step-N`` with checkpoint_every_step)."""
        self._ws().restore(name)

    def close(self) -> None:
        """Destroy the episode's workspace. Idempotent; the rollout loop calls it after every episode."""
        if self._finalizer is not None:
            self._finalizer()  # runs workspace.destroy once
            self._finalizer = None
        self.workspace = None

    # -- reward --------------------------------------------------------------------------------------------
    async def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        """The ``composer`` terms, unweighted: the hidden tests' score (``tests``) and the terms configured on;
        first writes what they read: metrics (``tests_passed``,
        ``tampering``, ...) and, where they apply, ``trajectory.info`` keys: ``checkpoint_errors`` (up to 10),
        ``tampering`` (what was tampered with), ``test_failure`` (why the tests could not run), ``hidden_tests``
        (outcome counts), ``agent_tests`` and ``test_coverage`` (the agent's own tests under coverage)."""
        if self.task is None or self.workspace is None or not self.workspace.alive:
            return {"tests": 0.0}
        metrics, info = trajectory.metrics, trajectory.info
        try:
            changed = tree_state(self.workspace.path) != self._initial
            result = await score(
                self.sandbox, self.workspace, self.task, self._protected, self._initial, self.config.reward
            )
        except (OSError, WorkspaceError) as e:  # a tree the host-side checks refuse (e.g. 1,200 levels deep)
            changed, result = True, Score(failure=f"the workspace cannot be scored: {e}")
            metrics["unscorable_workspace"] = 1.0
        metrics["tests_passed"] = result.tests
        metrics["tampering"] = float(bool(result.tampering))
        metrics["tests_failed_to_run"] = float(result.failure is not None and not result.tampering)
        metrics["no_edit"] = float(not changed)
        metrics["clarifying_question"] = float(asked_a_question(trajectory))
        metrics["edits"], metrics["commands"] = float(self.edits), float(self.commands)
        metrics["test_runs"] = float(self.test_runs)
        if self.config.checkpoint_every_step:
            metrics["checkpoint_failed"] = float(bool(self.checkpoint_errors))
        if self.checkpoint_errors:
            info["checkpoint_errors"] = self.checkpoint_errors[:10]
        if result.tampering:
            info["tampering"] = result.tampering
        if result.failure:
            info["test_failure"] = result.failure
        if result.run is not None:
            info["hidden_tests"] = dict(result.run.counts)
        if result.agent_tests:
            info["agent_tests"] = result.agent_tests
        if result.coverage is not None:
            info["test_coverage"] = result.coverage
        return self.rubric.measure(trajectory, self.task)  # reads metrics["tests_passed"/"tampering"]

    # -- expert --------------------------------------------------------------------------------------------
    def scripted_rule(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        """Expert: read the file to fix, apply the gold fix, run the tests, then report (cold start, tests)."""
        prompt = next(m.content for m in messages if m.role == "user")
        calls = [c for m in messages if m.role == "assistant" for c in m.tool_calls]
        candidates = self._tasks_by_prompt().get(prompt, [])
        if not candidates:
            return "I cannot find this task in my task set."
        first = next(iter(candidates[0].info["files"]))
        window = candidates[0].info.get("read_window")  # a localised task: read only the lines it names
        if not calls:
            lines = {"start_line": window[0], "end_line": window[1]} if window else {}
            return format_tool_call("read_file", {"path": first, **lines})
        if len(calls) == 1:
            shown = next((m.content for m in messages if m.role == "tool"), "")
            task = next((t for t in candidates if _shown(t, first, self.line_numbers) == shown), candidates[0])
            gold = task.info["gold"]
            if "write" in gold:
                path, content = next(iter(gold["write"].items()))
                return format_tool_call("write_file", {"path": path, "content": content})
            edit = gold["edit"]
            text = task.info["files"][edit["path"]]
            if self.edit_tool == "replace_lines":
                start, end, new = line_edit(text, edit["old"], edit["new"])
                return format_tool_call(
                    "replace_lines", {"path": edit["path"], "start_line": start, "end_line": end, "new": new}
                )
            small_old, small_new = minimal_edit(text, edit["old"], edit["new"])
            return format_tool_call("edit_file", {"path": edit["path"], "old": small_old, "new": small_new})
        if len(calls) == 2:
            return format_tool_call("run_tests", {})
        return f"Fixed `{first}`: the tests pass now."

    def _tasks_by_prompt(self) -> dict[str, list[Task]]:
        cached = self.__dict__.get("_by_prompt")
        if cached is None:
            cached = {}
            for task in self.tasks("all"):
                cached.setdefault(task.prompt, []).append(task)
            self.__dict__["_by_prompt"] = cached
        return cached


def _localised(task: Task, radius: int, *, exact: bool = False) -> Task:
    """``task`` with the file and lines to look at appended to its prompt (``info["read_window"]``); ``exact``
    also names the lines the fix replaces (``info["fix_lines"]``)."""
    start, end = bug_window(task.info, radius)
    edit = task.info["gold"]["edit"]
    hint = f"\nThe bug is in `{edit['path']}`, lines {start}-{end}."
    info = {**task.info, "read_window": [start, end]}
    if exact:
        first, last, _ = line_edit(task.info["files"][edit["path"]], edit["old"], edit["new"])
        start, end = min(start, first), max(end, last)  # the named lines always lie in the read window
        named = f"line {first}" if first == last else f"lines {first}-{last}"
        hint = f"\nThe bug is in `{edit['path']}`, {named} (read lines {start}-{end} around it)."
        info.update(read_window=[start, end], fix_lines=[first, last])
    return replace(task, prompt=task.prompt + hint, info=info)


def _shown(task: Task, path: str, line_numbers: bool) -> str:
    """What the expert's first read_file of ``task`` shows: the file, or the lines of its read window (numbered
    where the env edits by line number)."""
    text = task.info["files"][path]
    window = task.info.get("read_window") or [1, None]
    lines = split_lines(text)[window[0] - 1 : window[1]]
    if line_numbers:
        return numbered(lines, window[0])
    return "".join(lines) if task.info.get("read_window") else text


class HumanEvalEnv(CodeEnv):
    """HumanEval's 164 problems: implement a function in ``solution.py``; reward = its hidden tests pass."""

    name = "code-humaneval"

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return humaneval_tasks(split)


class CodeBugsEnv(CodeEnv):
    """Bugs injected into real PyPI projects, verified against their own tests; reward = the tests pass again.

    ``tasks_path`` is one mined task set or a list of them (tasks in the order given); ``kinds`` keeps only the
    bugs of those mutation kinds (e.g. ``["flip comparison"]``). ``hint_lines`` > 0 localises
    every task: its prompt also names the file and the lines within ``hint_lines`` of the bug (inside the
    mutated function), and the expert reads just those lines (short contexts for small models). With
    ``edit_tool="replace_lines"`` the expert fixes the bug by line number (``tasks.line_edit``).
    ``hint_exact`` (with ``hint_lines``) also names the lines the fix replaces (the expert's ``line_edit``
    range): the agent still has to read them and write the fix, but no longer has to find the buggy line.
    """

    name = "code-bugs"

    def __init__(
        self,
        tasks_path: str | Sequence[str] = str(BUILTIN_BUGS),
        config: CodeEnvConfig | dict[str, Any] | None = None,
        *,
        kinds: Sequence[str] | None = None,
        hint_lines: int = 0,
        hint_exact: bool = False,
        edit_tool: Literal["edit_file", "replace_lines"] = "edit_file",
        unsafe_no_sandbox: bool = False,
    ) -> None:
        super().__init__(config, edit_tool=edit_tool, unsafe_no_sandbox=unsafe_no_sandbox)
        if hint_lines < 0:
            raise ValueError(f"CodeBugsEnv hint_lines must be >= 0, got {hint_lines}")
        if hint_exact and not hint_lines:
            raise ValueError("CodeBugsEnv hint_exact names lines inside the read window: it needs hint_lines > 0")
        paths = [tasks_path] if isinstance(tasks_path, str | os.PathLike) else list(tasks_path)
        if not paths:
            raise ValueError("CodeBugsEnv needs at least one task set in tasks_path")
        self.task_sets = [load_bug_tasks(str(path)) for path in paths]
        tasks = [t for task_set in self.task_sets for t in task_set.tasks]
        kept = [t for t in tasks if kinds is None or t.info["mutation"] in set(kinds)]
        if not kept:
            found = sorted({t.info["mutation"] for t in tasks})
            raise ValueError(f"CodeBugsEnv: no task of kinds {list(kinds or [])} (the task sets have {found})")
        if hint_lines:
            kept = [_localised(t, hint_lines, exact=hint_exact) for t in kept]
        self.bug_tasks = kept

    def tasks(self, split: str = "train") -> Sequence[Task]:
        """``test``: every fifth task; ``train``: the others; ``all``: every task."""
        if split not in ("train", "test", "all"):
            raise ValueError(f"code-bugs split must be train, test or all, got {split!r}")
        tasks = self.bug_tasks
        return [t for i, t in enumerate(tasks) if split == "all" or (i % 5 == 0) == (split == "test")]
