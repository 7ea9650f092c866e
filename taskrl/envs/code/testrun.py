"""Run pytest inside the sandbox; the per-test outcomes come back over a pipe, never through a file.

``run_pytest(sandbox, workspace, targets)`` is the one way tests run: for the agent's ``run_tests`` tool, for
the hidden-test reward and for verifying mined bugs. The trusted ``inside/pytest_runner.py`` runs pytest with
Python isolated (``-I``: no script directory, PYTHONPATH or user site on ``sys.path``; the workspace is on it
only where pytest's rootdir logic or the task's ``pythonpath`` puts it), only taskrl's own empty config
(``-c``, ``--rootdir``: no ``pytest.ini``/``pytest.toml``/``.pytest.toml``/``pyproject.toml``/``tox.ini``/
``setup.cfg`` of the workspace is read), no cache, plugin autoload off (tasks name the plugins they need),
conftest files only where the task allows them, and sends its report over an inherited pipe it closes before
exit. No report, a malformed one, no tests collected, collection errors, patched pytest internals and
timeouts are all reported as such; none of them counts as a pass.

The report is authenticated (``read_report``): it must be the pipe's only content, sealed with an HMAC under a
key sent to the runner on a second pipe, and the process must have exited with the exit code the report
states. A forged report (written by the code under test to the runner's pipe, with or without ending the
process), a second document, an exit status that contradicts the report and a runner that lost its pipe are
all flagged as tampering.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import secrets
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskrl.envs.code.sandbox import SANDBOX_WORKDIR, Bind, CommandResult, Sandbox, reachable_path

HARNESS_TARGET = "/taskrl-harness"
HARNESS_DIR = Path(__file__).parent / "inside"
MAX_REPORT_BYTES = 64 << 20
PASSED, FAILED, ERROR, SKIPPED = "passed", "failed", "error", "skipped"
PIPE_LOST, RUNNER_ERROR = 113, 70  # the runner's own exit codes, see inside/pytest_runner.py
FORGED = "the report pipe carried something other than the runner's one sealed report (forged?)"


@dataclass
class TestRun:
    """Outcome of one pytest run. ``outcomes`` maps ``module.Class::test_name[param]`` to an outcome."""

    __test__ = False  # not a pytest test class, despite the name

    outcomes: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    """First line of the failure or error message of each test that did not pass."""
    command: CommandResult | None = None
    report_found: bool = False
    tampering: list[str] = field(default_factory=list)
    """What the runner found changed in pytest while the tests ran (patched internals, hooks added)."""

    @property
    def counts(self) -> Counter[str]:
        return Counter(self.outcomes.values())

    @property
    def timed_out(self) -> bool:
        return self.command is not None and self.command.killed is not None

    @property
    def collection_errors(self) -> list[str]:
        """Test files (or modules) that failed to import: pytest reports them as errors named after the file."""
        return [t for t, o in self.outcomes.items() if o == ERROR and t.startswith("::")]

    @property
    def failure(self) -> str | None:
        """Why this run cannot count as passing as a whole, or None."""
        if self.timed_out:
            return f"tests did not finish: {self.command.killed}"  # type: ignore[union-attr]
        if not self.report_found:
            return "pytest wrote no report (it crashed or was interrupted)"
        if self.tampering:
            return "tampering: " + "; ".join(self.tampering)
        if self.collection_errors:
            return "collection errors in " + ", ".join(t.lstrip(":") for t in self.collection_errors)
        if not self.outcomes:
            return "no tests collected"
        return None

    def fraction_passed(self, expected: Sequence[str]) -> float:
        """Share of ``expected`` tests that passed; a test missing from the report did not pass."""
        if not expected:
            raise ValueError("fraction_passed needs at least one expected test id")
        return sum(self.outcomes.get(t) == PASSED for t in expected) / len(expected)

    def summary(self, max_failures: int = 20) -> str:
        """What the agent sees from run_tests: counts, failing tests with their first message line."""
        counts = self.counts
        line = ", ".join(f"{counts[k]} {k}" for k in (PASSED, FAILED, ERROR, SKIPPED) if counts[k]) or "0 tests"
        parts = [line]
        if self.failure:
            parts.append(f"problem: {self.failure}")
        bad = [t for t, o in self.outcomes.items() if o in (FAILED, ERROR)]
        for test in bad[:max_failures]:
            parts.append(f"{self.outcomes[test].upper()} {test}: {self.messages.get(test, '')}".rstrip(": "))
        if len(bad) > max_failures:
            parts.append(f"... and {len(bad) - max_failures} more")
        if self.command is not None and (self.failure or bad):
            parts.append("pytest output:\n" + self.command.format())
        return "\n".join(parts)


def _test_id(case: ET.Element) -> str:
    return f"{case.get('classname', '')}::{case.get('name', '')}"


def parse_junit(xml_text: str) -> tuple[dict[str, str], dict[str, str]]:
    """(outcomes, messages) from a JUnit XML report; a test with a failure and a teardown error is an error."""
    root = ET.fromstring(xml_text)
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    for case in root.iter("testcase"):
        test = _test_id(case)
        kinds = {child.tag for child in case}
        outcome = (
            ERROR if "error" in kinds else FAILED if "failure" in kinds else SKIPPED if "skipped" in kinds else PASSED
        )
        if outcomes.get(test) in (ERROR, FAILED) and outcome == PASSED:
            continue  # pytest may report a test twice (call + teardown); the worse outcome stands
        outcomes[test] = outcome
        for child in case:
            if child.tag in ("error", "failure"):
                messages[test] = _first_message(child)
    return outcomes, messages


def _first_message(element: ET.Element) -> str:
    """The message attribute, or for collection failures the exception line (pytest prefixes it with 'E ')."""
    message = element.get("message") or ""
    if message in ("", "collection failure"):
        raised = [line[1:].strip() for line in (element.text or "").splitlines() if line.startswith("E ")]
        message = raised[-1] if raised else message or (element.text or "").strip()
    return (message.splitlines() or [""])[0][:300]


def pytest_argv(
    targets: Sequence[str],
    *,
    report_fd: int,
    key_fd: int,
    pythonpath: Sequence[str] = (),
    plugins: Sequence[str] = (),
    doctest_modules: bool = False,
    conftest: bool = False,
    coverage: bool = False,
    workdir: str = SANDBOX_WORKDIR,
    python: str | None = None,
) -> list[str]:
    """The isolated pytest command line (through the trusted runner) used everywhere in the code env; ``python``
    is the interpreter's path where the command runs (``Sandbox.python``; this one's by default)."""
    argv = [python or sys.executable, "-I", "-B", f"{HARNESS_TARGET}/pytest_runner.py", str(report_fd), str(key_fd)]
    argv += ["/tmp/taskrl-coverage.json" if coverage else "-", "--"]
    argv += ["-c", f"{HARNESS_TARGET}/pytest.ini", f"--rootdir={workdir}", f"--confcutdir={workdir}"]
    argv += ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "-o", "console_output_style=classic"]
    if not conftest:
        argv.append("--noconftest")
    if pythonpath:  # absolute: pytest resolves relative ones against the config file's directory
        argv += ["-o", "pythonpath=" + " ".join(os.path.normpath(os.path.join(workdir, p)) for p in pythonpath)]
    for plugin in plugins:
        argv += ["-p", plugin]
    if doctest_modules:
        argv.append("--doctest-modules")
    return [*argv, "--", *targets]


def harness_bind(sandbox: Sandbox) -> Bind:
    """The trusted harness scripts, read-only at ``HARNESS_TARGET`` in the sandbox."""
    return Bind(reachable_path(str(HARNESS_DIR)), HARNESS_TARGET)


async def read_pipe(fd: int, limit: int = MAX_REPORT_BYTES) -> bytes | None:
    """Everything written to a pipe until its last writer closes it (None past ``limit`` bytes)."""

    def read() -> bytes | None:
        chunks, total = [], 0
        with os.fdopen(fd, "rb", buffering=0) as f:
            while block := f.read(1 << 16):
                total += len(block)
                if total > limit:
                    return None
                chunks.append(block)
        return b"".join(chunks)

    return await asyncio.to_thread(read)


async def run_pytest(
    sandbox: Sandbox,
    workspace: str | Path,
    targets: Sequence[str],
    *,
    pythonpath: Sequence[str] = (),
    plugins: Sequence[str] = (),
    doctest_modules: bool = False,
    conftest: bool = False,
    timeout_s: float | None = None,
    coverage_of: Sequence[str] = (),
    disk_quota_bytes: int | None = None,
    disk_growth: Callable[[], int | None] | None = None,
) -> tuple[TestRun, dict[str, Any] | None]:
    """Run pytest on ``targets`` (paths relative to the workspace) in the sandbox.

    Returns the run and, when ``coverage_of`` names files (relative paths), coverage.py's JSON report of
    them, with paths relative to the workspace (None when it could not be measured).
    """
    workdir = sandbox.workdir(workspace)
    bind = harness_bind(sandbox)
    read_end, write_end = os.pipe()
    key = secrets.token_bytes(32)
    key_r, key_w = os.pipe()
    os.write(key_w, key)  # 32 bytes: always fits the pipe's buffer
    os.close(key_w)
    argv = pytest_argv(
        targets,
        report_fd=write_end,
        key_fd=key_r,
        pythonpath=pythonpath,
        plugins=plugins,
        doctest_modules=doctest_modules,
        conftest=conftest,
        coverage=bool(coverage_of),
        workdir=workdir,
        python=sandbox.python,
    )
    if not sandbox.isolated:
        argv = [a.replace(HARNESS_TARGET, bind.host) for a in argv]
    env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    if coverage_of:
        env["TASKRL_COVERAGE_INCLUDE"] = ",".join(f"{workdir}/{path}" for path in coverage_of)
    reading = asyncio.ensure_future(read_pipe(read_end))
    command = await sandbox.run(  # closes write_end and key_r, started or not
        argv,
        workspace,
        binds=[bind],
        timeout_s=timeout_s,
        env=env,
        pass_fds=(write_end, key_r),
        disk_quota_bytes=disk_quota_bytes,
        disk_growth=disk_growth,
    )
    data = await reading
    run = TestRun(command=command)
    report, problem = read_report(data, key, command)
    if problem is not None:
        run.tampering = [problem]
    if report is not None:
        run.outcomes = {str(k): str(v) for k, v in report["outcomes"].items()}
        run.messages = {str(k): str(v) for k, v in dict(report.get("messages") or {}).items()}
        run.tampering = [str(t) for t in report.get("tampering") or []]
        run.report_found = True
    coverage = None
    if coverage_of and run.report_found and isinstance(report, dict):
        coverage = _relative_coverage(report, workdir)
    return run, coverage


def read_report(data: bytes | None, key: bytes, command: CommandResult) -> tuple[dict[str, Any] | None, str | None]:
    """(the runner's report, None) if ``data`` is its one sealed report and the exit status agrees, else
    (None, why it is tampering) or (None, None) for no report at all (a crash, a kill, a timeout)."""
    if command.killed is not None:  # stopped from outside: nothing it wrote is trusted, and it is no pass
        return None, None
    if not data:
        if command.returncode == PIPE_LOST:
            return None, "the runner's report pipe was closed or replaced by the code under test"
        return None, None
    try:
        sealed = json.loads(data)
        body, mac = sealed["body"], sealed["mac"]
        expected = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
        if not (isinstance(mac, str) and hmac.compare_digest(mac, expected)):
            return None, FORGED
        report = json.loads(body)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None, FORGED
    if not isinstance(report, dict) or not isinstance(report.get("outcomes"), dict):
        return None, FORGED
    if report.get("exit_code") != command.returncode:
        return None, (
            f"the runner reported exit code {report.get('exit_code')} but its process ended with "
            f"{command.returncode}: the code under test ended it"
        )
    return report, None


def _relative_coverage(report: dict[str, Any], workdir: str) -> dict[str, Any] | None:
    if "No data to report" in str(report.get("coverage_error", "")):  # the tests never ran a measured line
        return {"files": {}, "totals": {}, "no_data": True}
    data = report.get("coverage")
    if not isinstance(data, dict):
        return None
    prefix = workdir.rstrip("/") + "/"
    data["files"] = {str(name).removeprefix(prefix): d for name, d in dict(data.get("files") or {}).items()}
    return data


def line_coverage(report: dict[str, Any] | None) -> float | None:
    """Covered share of the measured statements in a coverage.py JSON report (None: nothing measured)."""
    if report is not None and report.get("no_data"):
        return 0.0
    totals = (report or {}).get("totals", {})
    statements = totals.get("num_statements", 0)
    return totals.get("covered_lines", 0) / statements if statements else None
