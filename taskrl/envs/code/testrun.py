"""Run pytest inside the sandbox and read the per-test outcomes from its JUnit XML report.

``run_pytest(sandbox, workspace, targets)`` is the one way tests run: for the agent's ``run_tests`` tool, for
the hidden-test reward and for verifying mined bugs. Python runs isolated (``-I``: the workspace cannot shadow
``pytest`` or inject ``sitecustomize``), plugin autoload is off (tasks name the plugins they need), and the
report goes to a directory outside the workspace. No report, no tests collected, collection errors and
timeouts are all reported as such; none of them counts as a pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskrl.envs.code.sandbox import Bind, CommandResult, Sandbox, host_uid

RESULTS_TARGET = "/taskrl-results"
PASSED, FAILED, ERROR, SKIPPED = "passed", "failed", "error", "skipped"


@dataclass
class TestRun:
    """Outcome of one pytest run. ``outcomes`` maps ``module.Class::test_name[param]`` to an outcome."""

    __test__ = False  # not a pytest test class, despite the name

    outcomes: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    """First line of the failure or error message of each test that did not pass."""
    command: CommandResult | None = None
    report_found: bool = False

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
    report: str,
    pythonpath: Sequence[str] = (),
    plugins: Sequence[str] = (),
    doctest_modules: bool = False,
    coverage_of: Sequence[str] = (),
    coverage_data: str | None = None,
) -> list[str]:
    """The pytest command line (optionally under coverage.py) used everywhere in the code env."""
    argv = [sys.executable, "-I", "-B"]
    if coverage_of:
        argv += ["-m", "coverage", "run", f"--data-file={coverage_data}", f"--include={','.join(coverage_of)}"]
    argv += ["-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", "-o", "junit_family=xunit1"]
    if pythonpath:
        argv += ["-o", "pythonpath=" + " ".join(pythonpath)]
    for plugin in plugins:
        argv += ["-p", plugin]
    if doctest_modules:
        argv.append("--doctest-modules")
    return [*argv, "--", *targets]


async def run_pytest(
    sandbox: Sandbox,
    workspace: str | Path,
    targets: Sequence[str],
    *,
    pythonpath: Sequence[str] = (),
    plugins: Sequence[str] = (),
    doctest_modules: bool = False,
    timeout_s: float | None = None,
    coverage_of: Sequence[str] = (),
) -> tuple[TestRun, dict[str, Any] | None]:
    """Run pytest on ``targets`` (paths relative to the workspace) in the sandbox.

    Returns the run and, when ``coverage_of`` names files (relative paths), coverage.py's JSON report of
    them, with paths relative to the workspace (None when it could not be measured).
    """
    results = Path(tempfile.mkdtemp(prefix="taskrl-pytest-"))
    if os.geteuid() == 0:
        os.chmod(results, 0o711)
        os.chown(results, host_uid(), host_uid())
    try:
        bind = Bind(str(results), RESULTS_TARGET, writable=True)
        where = sandbox.visible_path(bind)
        workdir = sandbox.workdir(workspace)
        argv = pytest_argv(
            targets,
            report=f"{where}/report.xml",
            pythonpath=pythonpath,
            plugins=plugins,
            doctest_modules=doctest_modules,
            coverage_of=[f"{workdir}/{path}" for path in coverage_of],
            coverage_data=f"{where}/coverage.dat",
        )
        env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        command = await sandbox.run(argv, workspace, binds=[bind], timeout_s=timeout_s, env=env)
        run = TestRun(command=command)
        report = results / "report.xml"
        if report.is_file() and command.killed is None:
            with contextlib.suppress(ET.ParseError):
                run.outcomes, run.messages = parse_junit(report.read_text(encoding="utf-8", errors="replace"))
                run.report_found = True
        coverage = None
        if coverage_of and run.report_found:
            coverage = await _coverage_report(sandbox, workspace, bind, where, timeout_s)
        return run, coverage
    finally:
        shutil.rmtree(results, ignore_errors=True)


async def _coverage_report(
    sandbox: Sandbox, workspace: str | Path, bind: Bind, where: str, timeout_s: float | None
) -> dict[str, Any] | None:
    argv = [
        sys.executable,
        "-I",
        "-m",
        "coverage",
        "json",
        f"--data-file={where}/coverage.dat",
        "-o",
        f"{where}/cov.json",
    ]
    done = await sandbox.run(argv, workspace, binds=[bind], timeout_s=timeout_s)
    path = Path(bind.host) / "cov.json"
    if "No data to report" in done.stdout + done.stderr:  # the tests never ran a line of the measured files
        return {"files": {}, "totals": {}, "no_data": True}
    if not done.ok or not path.is_file():
        return None
    report = json.loads(path.read_text())
    prefix = sandbox.workdir(workspace).rstrip("/") + "/"
    report["files"] = {name.removeprefix(prefix): data for name, data in report.get("files", {}).items()}
    return report


def line_coverage(report: dict[str, Any] | None) -> float | None:
    """Covered share of the measured statements in a coverage.py JSON report (None: nothing measured)."""
    if report is not None and report.get("no_data"):
        return 0.0
    totals = (report or {}).get("totals", {})
    statements = totals.get("num_statements", 0)
    return totals.get("covered_lines", 0) / statements if statements else None
