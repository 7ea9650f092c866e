"""The coding agent's tools: read_file, write_file, edit_file, replace_lines, list_dir, search_code, run_command,
run_tests.

``CodeTools`` is a mixin for an env that has ``workspace`` (a ``Workspace``), ``sandbox`` (a ``Sandbox``) and
``task``. File tools work on the host side through ``Workspace.resolve`` (absolute paths, '..' and symlinks
leading out are refused) and write copy-on-write; everything that executes (commands, tests, grep) runs in
the sandbox. Calls on one workspace are serialised, so a command cannot swap a path between a tool's check
and its use. ``replace_lines`` edits by line number (with ``line_numbers`` on, ``read_file`` shows them), for
models that cannot copy ``edit_file``'s exact text; an env exposes one of the two edit tools.
"""

from __future__ import annotations

import asyncio
import os
import stat
import textwrap
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


def split_lines(text: str) -> list[str]:
    """``text``'s lines with their endings, split at "\\n" only: the numbering of grep, editors and the hints
    (``str.splitlines`` would also split at form feeds and other separators a source file may contain)."""
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def numbered(lines: list[str], first: int) -> str:
    """``lines`` (with their endings) prefixed by their 1-based numbers from ``first``, as ``cat -n`` shows them
    (number, tab, line), the numbers right-aligned to the widest."""
    width = len(str(first + len(lines) - 1))
    return "".join(f"{first + i:>{width}}\t{line}" for i, line in enumerate(lines))


def replace_line_range(text: str, start_line: int, end_line: int, new: str) -> str:
    """``text`` with lines ``start_line``..``end_line`` (1-based, inclusive) replaced by ``new``, re-indented as
    a block: its common indentation is replaced by line ``start_line``'s, so the code may be given with or
    without it. Blank lines stay blank; an empty ``new`` deletes the lines. Raises ``CodeToolError`` for a
    range outside the file."""
    lines = split_lines(text)
    if start_line < 1 or end_line < start_line:
        raise CodeToolError(
            f"bad line range {start_line}..{end_line}: lines are numbered from 1 and end_line must be >= start_line"
        )
    if end_line > len(lines):
        raise CodeToolError(f"bad line range {start_line}..{end_line}: the file has {len(lines)} line(s)")
    first = lines[start_line - 1]
    body = first.rstrip("\r\n")
    indent, ending = body[: len(body) - len(body.lstrip(" \t"))], first[len(body) :] or "\n"
    block = textwrap.indent(textwrap.dedent(new.replace("\r\n", "\n")), indent).split("\n")
    replaced = [line + ending for line in (block[:-1] if block[-1] == "" else block)]
    if replaced and end_line == len(lines) and not lines[-1].endswith("\n"):
        replaced[-1] = replaced[-1][: -len(ending)]  # the file ended without a newline: keep it so
    return "".join(lines[: start_line - 1] + replaced + lines[end_line:])


class CodeTools:
    """Tool methods over ``self.workspace`` and ``self.sandbox`` (see the module docstring)."""

    workspace: Workspace | None
    sandbox: Sandbox
    task: Task | None
    edits: int = 0
    """Successful write_file/edit_file/replace_lines calls this episode."""
    line_numbers: bool = False
    """read_file prefixes every line with its number (for replace_lines)."""
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
        Where the env edits by line number, every line is shown after its number and a tab.

        Args:
            path: path relative to the workspace root, e.g. "src/pkg/module.py".
            start_line: first line to return.
            end_line: last line to return; omit to read to the end.
        """
        async with self._lock():
            _, text = self._read_text(path)
        if start_line == 1 and end_line is None and not self.line_numbers:
            return text
        lines = split_lines(text)
        if start_line < 1 or (end_line is not None and end_line < start_line):
            raise CodeToolError(f"bad line range {start_line}..{end_line}; lines are numbered from 1")
        shown = lines[start_line - 1 : end_line]
        return numbered(shown, start_line) if self.line_numbers else "".join(shown)

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
    async def replace_lines(self, path: str, start_line: int, end_line: int, new: str) -> str:
        """Replace lines start_line..end_line of a file (1-based, inclusive, as read_file numbers them) with `new`.
        `new` is indented like line start_line: give the code with or without that indentation (lines inside a
        block keep their extra indentation). An empty `new` deletes the lines.

        Args:
            path: path relative to the workspace root.
            start_line: first line to replace.
            end_line: last line to replace (equal to start_line for one line).
            new: the lines to put in their place, without line numbers.
        """
        async with self._lock():
            _, text = self._read_text(path)
            edited = replace_line_range(text, start_line, end_line, new)
            self._ws().write_file(path, edited.encode("utf-8"))
            self.edits += 1
        count = len(split_lines(edited)) - len(split_lines(text)) + end_line - start_line + 1
        shown = split_lines(edited)[start_line - 1 : start_line - 1 + count]
        now = f" now:\n{numbered(shown, start_line)}" if shown else ""
        return f"replaced lines {start_line}-{end_line} of {path} with {count} line(s){now}"

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
            budget = await asyncio.to_thread(ws.disk_budget)  # a walk only when no exact reading is kept
            result = await self.sandbox.run(command, ws.path, disk_quota_bytes=budget, disk_growth=ws.disk_growth())
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
            budget = await asyncio.to_thread(ws.disk_budget)
            run, _ = await run_pytest(
                self.sandbox,
                ws.path,
                targets,
                pythonpath=info.get("pythonpath", []),
                plugins=info.get("plugins", []),
                doctest_modules=info.get("doctest_modules", False),
                conftest=info.get("conftest", False),
                disk_quota_bytes=budget,
                disk_growth=ws.disk_growth(),
            )
            self.test_runs += 1
            note = await asyncio.to_thread(ws.quota_note)
        return run.summary() + (f"\n{note}" if note else "")
