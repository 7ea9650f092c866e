"""HumanEval's hidden check, run where the agent's code cannot reach it: two sandboxes joined by pipes.

``run_function_check(sandbox, workspace, check)`` starts ``inside/candidate.py`` in the agent's workspace
(it imports ``solution.py`` and answers calls) and ``inside/checker.py`` in a second sandbox that has no
workspace, only the problem's prompt and test, read from a pipe. Calls and results cross as plain data
(``inside/wire.py``), so the test compares built-in values with built-in values; the verdict comes back on a
pipe only the checker holds. The agent's code never sees the test, the expected values or the verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from taskrl.envs.code.sandbox import Sandbox
from taskrl.envs.code.testrun import FAILED, HARNESS_TARGET, PASSED, TestRun, harness_bind, read_pipe

_EMPTY: list[Path] = []


def _empty_dir() -> Path:
    """The checker's working directory: empty, private to this process, not writable by the sandbox uid."""
    if not _EMPTY:
        path = Path(tempfile.mkdtemp(prefix="taskrl-checker-"))
        os.chmod(path, 0o755)
        _EMPTY.append(path)
    return _EMPTY[0]


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError), os.fdopen(fd, "wb") as f:  # the checker died early: nothing to tell
        f.write(data)


async def run_function_check(
    sandbox: Sandbox, workspace: str | Path, check: dict[str, Any], test_id: str, *, timeout_s: float | None = None
) -> TestRun:
    """Run ``check`` ({"prompt", "test", "entry_point"}) against ``solution.<entry_point>`` in ``workspace``."""
    bind = harness_bind(sandbox)
    script = HARNESS_TARGET if sandbox.isolated else bind.host
    to_checker_r, to_checker_w = os.pipe()  # candidate -> checker
    to_candidate_r, to_candidate_w = os.pipe()  # checker -> candidate
    program_r, program_w = os.pipe()
    verdict_r, verdict_w = os.pipe()
    program = json.dumps({k: check[k] for k in ("prompt", "test", "entry_point")}).encode()
    writer = threading.Thread(target=_write_all, args=(program_w, program), daemon=True)
    writer.start()
    verdict_reading = asyncio.ensure_future(read_pipe(verdict_r, 1 << 20))
    checker = sandbox.run(
        [sandbox.python, "-I", "-B", f"{script}/checker.py", str(program_r), str(verdict_w)],
        _empty_dir(),
        binds=[bind],
        timeout_s=timeout_s,
        stdin_fd=to_checker_r,
        stdout_fd=to_candidate_w,
        pass_fds=(program_r, verdict_w),
    )
    candidate = sandbox.run(
        [sandbox.python, "-I", "-B", f"{script}/candidate.py", check["entry_point"]],
        workspace,
        binds=[bind],
        timeout_s=timeout_s,
        stdin_fd=to_candidate_r,
        stdout_fd=to_checker_w,
    )
    checked, answered = await asyncio.gather(checker, candidate)
    data = await verdict_reading
    run = TestRun(command=checked if checked.killed or not answered.killed else answered)
    verdict: Any = None
    if data and checked.killed is None and answered.killed is None:
        with contextlib.suppress(ValueError):
            verdict = json.loads(data)
    if isinstance(verdict, dict) and isinstance(verdict.get("passed"), bool):
        run.report_found = True
        run.outcomes = {test_id: PASSED if verdict["passed"] else FAILED}
        if not verdict["passed"]:
            run.messages = {test_id: str(verdict.get("message", ""))[:300]}
        run.tampering = [str(t)[:300] for t in verdict.get("tampering") or []]
    return run
