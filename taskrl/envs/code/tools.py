"""The coding agent's tools: read_file, write_file, edit_file, list_dir, search_code, run_command, run_tests.

``CodeTools`` is a mixin for an env that has ``workspace`` (a ``Workspace``), ``sandbox`` (a ``Sandbox``) and
``task``. File tools work on the host side through ``Workspace.resolve`` (absolute paths, '..' and symlinks
leading out are refused) and write copy-on-write; everything that executes (commands, tests, grep) runs in
the sandbox. Calls on one workspace are serialised, so a command cannot swap a path between a tool's check
and its use.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

from taskrl.envs.code.sandbox import Sandbox
from taskrl.envs.code.testrun import run_pytest
from taskrl.envs.code.workspace import Workspace
from taskrl.tools import tool
from taskrl.types import Task

MAX_READ_BYTES = 1 << 20
MAX_LIST_ENTRIES = 500


class CodeToolError(ValueError):
    """A tool call that cannot be carried out as asked; the message tells the model what to do instead."""


class CodeTools:
    """Tool methods over ``self.workspace`` and ``self.sandbox`` (see the module docstring)."""

    workspace: Workspace | None
    sandbox: Sandbox
    task: Task | None
    edits: int = 0
    """Successful write_file/edit_file calls this episode."""
    commands: int = 0
    """run_command calls this episode."""
    test_runs: int = 0
    """run_tests calls this episode."""

    def _ws(self) -> Workspace:
        if self.workspace is None or not self.workspace.alive:
            raise CodeToolError("no workspace: the episode has not been reset (or is over)")
        return self.workspace

    def _lock(self) -> asyncio.Lock:
        lock = self.__dict__.get("_tool_lock")
        if lock is None:
            lock = self.__dict__["_tool_lock"] = asyncio.Lock()
        return lock

    def _read_text(self, path: str) -> tuple[Path, str]:
        target = self._ws().resolve(path, must_exist=True)
        st = target.stat()
        if stat.S_ISDIR(st.st_mode):
            raise CodeToolError(f"'{path}' is a directory; use list_dir")
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
            raise CodeToolError(f"'{path}' is not a regular file")
        if st.st_size > MAX_READ_BYTES:
            raise CodeToolError(f"'{path}' is {st.st_size} bytes; read_file reads files up to {MAX_READ_BYTES} bytes")
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_READ_BYTES + 1)
        if b"\x00" in data[:8192]:
            raise CodeToolError(f"'{path}' is a binary file")
        return target, data.decode("utf-8", errors="replace")

    @tool(timeout_s=30, max_output_chars=16_000)
    async def read_file(self, path: str, start_line: int = 1, end_line: int | None = None) -> str:
        """Read a text file of the workspace (whole, or lines start_line..end_line, 1-based and inclusive).

        Args:
            path: path relative to the workspace root, e.g. "src/pkg/module.py".
            start_line: first line to return.
            end_line: last line to return; omit to read to the end.
        """
        async with self._lock():
            _, text = self._read_text(path)
        if start_line == 1 and end_line is None:
            return text
        lines = text.splitlines(keepends=True)
        if start_line < 1 or (end_line is not None and end_line < start_line):
            raise CodeToolError(f"bad line range {start_line}..{end_line}; lines are numbered from 1")
        return "".join(lines[start_line - 1 : end_line])

    @tool(timeout_s=30)
    async def write_file(self, path: str, content: str) -> str:
        """Create or overwrite a file of the workspace with the given content (parent directories are created).

        Args:
            path: path relative to the workspace root.
            content: the complete new content of the file.
        """
        async with self._lock():
            target = self._ws().write_file(path, content.encode("utf-8"))
            self.edits += 1
        return f"wrote {len(content.encode('utf-8'))} bytes to {target.relative_to(self._ws().path)}"

    @tool(timeout_s=30)
    async def edit_file(self, path: str, old: str, new: str) -> str:
        """Replace one exact occurrence of `old` with `new` in a file. `old` must match the file exactly
        (whitespace included) and occur exactly once: add surrounding lines to make it unique.

        Args:
            path: path relative to the workspace root.
            old: the exact text to replace.
            new: the text to put in its place.
        """
        if not old:
            raise CodeToolError("`old` is empty; to create or overwrite a whole file use write_file")
        async with self._lock():
            _, text = self._read_text(path)
            count = text.count(old)
            if count == 0:
                raise CodeToolError(
                    f"`old` was not found in '{path}' (it must match exactly, whitespace and indentation included); "
                    "read the file and copy the text to replace"
                )
            if count > 1:
                raise CodeToolError(
                    f"`old` occurs {count} times in '{path}'; include more surrounding lines so that it is unique"
                )
            self._ws().write_file(path, text.replace(old, new, 1).encode("utf-8"))
            self.edits += 1
        return f"edited {path}: replaced {len(old.splitlines()) or 1} line(s) with {len(new.splitlines())} line(s)"

    @tool(timeout_s=30)
    async def list_dir(self, path: str = ".", recursive: bool = False) -> str:
        """List a directory of the workspace ('/' marks directories); recursive lists the whole tree below it.

        Args:
            path: directory relative to the workspace root.
            recursive: list every level below path, not just its direct entries.
        """
        async with self._lock():
            root = self._ws().resolve(path, must_exist=True)
            if not root.is_dir():
                raise CodeToolError(f"'{path}' is not a directory; use read_file")
            lines: list[str] = []
            todo = [""]
            while todo and len(lines) <= MAX_LIST_ENTRIES:  # iterative, never into links: any depth is safe
                rel = todo.pop()
                with os.scandir(root / rel if rel else root) as entries:
                    for entry in entries:
                        child = f"{rel}/{entry.name}" if rel else entry.name
                        if entry.is_dir(follow_symlinks=False):
                            lines.append(child + "/")
                            if recursive:
                                todo.append(child)
                        else:
                            lines.append(child)
        lines = [line.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for line in lines]
        shown = sorted(lines)[:MAX_LIST_ENTRIES]
        more = len(lines) - len(shown)
        return "\n".join(shown) + (f"\n[... {more} more entries ...]" if more > 0 else "") if shown else "(empty)"

    @tool(timeout_s=None, max_output_chars=None)
    async def search_code(self, pattern: str, path: str = ".") -> str:
        """Search file contents with an extended regular expression (grep -E); shows file:line: text.

        Args:
            pattern: the regular expression, e.g. "def (camelize|underscore)".
            path: file or directory to search, relative to the workspace root.
        """
        async with self._lock():
            ws = self._ws()
            target = ws.resolve(path, must_exist=True)
            rel = os.path.relpath(target, ws.path)
            argv = ["grep", "-rInE", "--exclude-dir=.git", "-m", "50", "-e", pattern, "--", rel]
            result = await self.sandbox.run(argv, ws.path)
        if result.returncode == 1 and not result.killed:
            return "no matches"
        if result.returncode > 1 or result.killed:
            return result.format()
        return result.stdout

    @tool(timeout_s=None, max_output_chars=None)
    async def run_command(self, command: str) -> str:
        """Run a shell command in the workspace (sandboxed: no network, only the workspace is writable).

        Args:
            command: the command line, run with /bin/sh -c, e.g. "python -c 'import pkg; print(pkg.f(2))'".
        """
        async with self._lock():
            ws = self._ws()
            result = await self.sandbox.run(command, ws.path, disk_quota_bytes=ws.disk_budget())
            self.commands += 1
            note = await asyncio.to_thread(ws.quota_note)
        return result.format() + (f"\n{note}" if note else "")

    @tool(timeout_s=None, max_output_chars=None)
    async def run_tests(self, path: str = "") -> str:
        """Run the project's tests (pytest) and report passes and failures.

        Args:
            path: a test file or test id (e.g. "tests/test_x.py::test_y") to run only that; empty runs the suite.
        """
        if self.task is None:
            raise CodeToolError("no task: the episode has not been reset")
        info = self.task.info
        async with self._lock():
            ws = self._ws()
            if path:
                ws.resolve(path.split("::", 1)[0], must_exist=True)
            targets = [path] if path else list(info["test_targets"])
            run, _ = await run_pytest(
                self.sandbox,
                ws.path,
                targets,
                pythonpath=info.get("pythonpath", []),
                plugins=info.get("plugins", []),
                doctest_modules=info.get("doctest_modules", False),
                conftest=info.get("conftest", False),
                disk_quota_bytes=ws.disk_budget(),
            )
            self.test_runs += 1
            note = await asyncio.to_thread(ws.quota_note)
        return run.summary() + (f"\n{note}" if note else "")
