"""Runs pytest inside the sandbox and sends the outcomes over a pipe (trusted harness script).

``python -I pytest_runner.py REPORT_FD KEY_FD COVERAGE_JSON -- PYTEST_ARGS``: the report is one JSON document
written to REPORT_FD (a pipe to taskrl, never a file the tests could rewrite) after pytest returns, sealed with
an HMAC under a fresh key taskrl sends on KEY_FD (read and closed before any workspace code is imported, never
in argv or the environment); then the pipe is closed and the runner ends at once with ``os._exit(exit code it
reported)``, so no ``atexit`` hook of the code under test runs and the host can check the process's exit
status against the report. Something that writes to the pipe itself (a forged report, whether or not it then
ends the process) cannot seal it, and a second document breaks the one-document rule: either way the host
flags tampering. If the pipe was closed or replaced under it the runner exits with ``PIPE_LOST``.

Before any workspace code is imported it keeps a reference to every pytest, pluggy and stdlib function that
decides or carries an outcome; afterwards it reports each one that was replaced and each hook implementation
registered by something other than a conftest: such a run is tampering, never a pass. (Code in the same
interpreter as pytest could still defeat checks it knows of, e.g. by finding the key in this process's memory;
HumanEval therefore runs its checks in another process altogether, see ``checker.py``.)
"""

import contextlib
import hashlib
import hmac
import json
import os
import sys

REPORT_FD, KEY_FD = int(sys.argv[1]), int(sys.argv[2])
PIPE_LOST, RUNNER_ERROR = 113, 70
os.set_inheritable(REPORT_FD, False)  # commands the tests start never get it
_PIPE = os.fstat(REPORT_FD)
_write, _close, _fstat, _exit, _dumps = os.write, os.close, os.fstat, os._exit, json.dumps


def _sealer():  # type: ignore[no-untyped-def]
    """``seal(report) -> bytes`` for the pipe; the key lives only in this closure."""
    with os.fdopen(KEY_FD, "rb") as f:
        key = f.read(64)
    new_mac, digest = hmac.new, hashlib.sha256

    def seal(report: dict) -> bytes:
        body = _dumps(report)
        return _dumps({"body": body, "mac": new_mac(key, body.encode(), digest).hexdigest()}).encode()

    return seal


seal = _sealer()
del _sealer

import _pytest.main  # noqa: E402
import _pytest.python  # noqa: E402
import _pytest.reports  # noqa: E402
import _pytest.runner  # noqa: E402
import _pytest.skipping  # noqa: E402
import pluggy  # noqa: E402
import pytest  # noqa: E402

CRITICAL = {
    "_pytest.runner.call_and_report": (_pytest.runner, "call_and_report"),
    "_pytest.runner.runtestprotocol": (_pytest.runner, "runtestprotocol"),
    "_pytest.runner.call_runtest_hook": (_pytest.runner, "call_runtest_hook"),
    "_pytest.runner.pytest_runtest_makereport": (_pytest.runner, "pytest_runtest_makereport"),
    "_pytest.runner.pytest_runtest_protocol": (_pytest.runner, "pytest_runtest_protocol"),
    "_pytest.runner.CallInfo": (_pytest.runner, "CallInfo"),
    "_pytest.runner.CallInfo.from_call": (_pytest.runner.CallInfo, "from_call"),
    "_pytest.reports.TestReport": (_pytest.reports, "TestReport"),
    "_pytest.reports.TestReport.from_item_and_call": (_pytest.reports.TestReport, "from_item_and_call"),
    "_pytest.reports.TestReport.__init__": (_pytest.reports.TestReport, "__init__"),
    "_pytest.reports.BaseReport.passed": (_pytest.reports.BaseReport, "passed"),
    "_pytest.reports.BaseReport.failed": (_pytest.reports.BaseReport, "failed"),
    "_pytest.python.Function.runtest": (_pytest.python.Function, "runtest"),
    "_pytest.python.pytest_pyfunc_call": (_pytest.python, "pytest_pyfunc_call"),
    "_pytest.skipping.pytest_runtest_makereport": (_pytest.skipping, "pytest_runtest_makereport"),
    "_pytest.main.pytest_runtestloop": (_pytest.main, "pytest_runtestloop"),
    "pluggy.HookCaller.__call__": (pluggy.HookCaller, "__call__"),
    "pluggy.PluginManager._hookexec": (pluggy.PluginManager, "_hookexec"),
    "pytest.main": (pytest, "main"),
    "os.write": (os, "write"),
    "json.dumps": (json, "dumps"),
}
WATCHED_HOOKS = (
    "pytest_runtest_protocol", "pytest_runtest_makereport", "pytest_runtest_logreport", "pytest_runtest_call",
    "pytest_pyfunc_call", "pytest_report_teststatus", "pytest_collectreport", "pytest_make_collect_report",
    "pytest_sessionfinish", "pytest_runtestloop",
)  # fmt: skip


def _get(owner, name):  # type: ignore[no-untyped-def]
    return owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)


def _code(obj):  # type: ignore[no-untyped-def]
    target = getattr(obj, "__func__", obj)
    target = getattr(target, "fget", target)
    return getattr(target, "__code__", None)


ORIGINAL = {name: (_get(owner, attr), _code(_get(owner, attr))) for name, (owner, attr) in CRITICAL.items()}


def mangle(nodeid: str) -> str:
    """The test id taskrl uses everywhere: JUnit (xunit1) ``classname::name`` of a pytest node id."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = names[0].replace("/", ".")
    if names[0].endswith(".py"):
        names[0] = names[0][:-3]
    names[-1] += bracket + params
    return ".".join(names[:-1]) + "::" + names[-1]


def first_message(report) -> str:  # type: ignore[no-untyped-def]
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    if not message:
        lines = [line[1:].strip() for line in str(report.longrepr).splitlines() if line.startswith("E ")]
        message = lines[-1] if lines else str(report.longrepr).strip()
    return (message.splitlines() or [""])[0][:300]


RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


class Reporter:
    """Collects outcomes as pytest reports them, and watches what was registered since the session began."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}
        self.messages: dict[str, str] = {}
        self.hooks_at_start: dict[str, set[int]] = {}
        self.config = None

    def _record(self, test: str, outcome: str, report) -> None:  # type: ignore[no-untyped-def]
        """The worse outcome stands (a failed call with a teardown error is an error)."""
        if RANK[outcome] >= RANK.get(self.outcomes.get(test, ""), -1):
            self.outcomes[test] = outcome
        if outcome in ("failed", "error"):
            self.messages[test] = first_message(report)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session) -> None:  # type: ignore[no-untyped-def]
        """Before the first test module (and so the code under test) is imported."""
        self.config = session.config
        hooks = session.config.pluginmanager.hook
        for name in WATCHED_HOOKS:
            caller = getattr(hooks, name, None)
            if caller is not None:
                self.hooks_at_start[name] = {id(impl.function) for impl in caller.get_hookimpls()}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report) -> None:  # type: ignore[no-untyped-def]
        test = mangle(report.nodeid)
        if report.when == "call":
            self._record(test, {"passed": "passed", "failed": "failed", "skipped": "skipped"}[report.outcome], report)
        elif report.failed:
            self._record(test, "error", report)
        elif report.skipped:
            self._record(test, "skipped", report)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collectreport(self, report) -> None:  # type: ignore[no-untyped-def]
        if report.failed:  # a module that does not import: an error named after the file
            self._record(mangle(report.nodeid), "error", report)

    def tampering(self) -> list[str]:
        found = []
        for name, (owner, attr) in CRITICAL.items():
            now = _get(owner, attr)
            if now is not ORIGINAL[name][0] or _code(now) is not ORIGINAL[name][1]:
                found.append(f"pytest internals patched: {name}")
        if self.config is not None:
            hooks = self.config.pluginmanager.hook
            for name, before in self.hooks_at_start.items():
                for impl in getattr(hooks, name).get_hookimpls():
                    plugin_file = getattr(impl.plugin, "__file__", "") or ""
                    if id(impl.function) not in before and os.path.basename(plugin_file) != "conftest.py":
                        found.append(f"hook registered at run time: {name} from {impl.plugin_name}")
        return found


def main() -> None:
    coverage_json = sys.argv[3]
    args = sys.argv[sys.argv.index("--") + 1 :]
    reporter = Reporter()
    cov = None
    if coverage_json != "-":
        import coverage

        include = os.environ.get("TASKRL_COVERAGE_INCLUDE", "").split(",")
        cov = coverage.Coverage(data_file=None, include=include)
        cov.start()
    exit_code = None
    try:
        exit_code = int(pytest.main(args, plugins=[reporter]))
    except BaseException:  # noqa: BLE001 - reported as RUNNER_ERROR; the traceback goes to the output
        import traceback

        traceback.print_exc()
    report: dict = {"exit_code": exit_code, "outcomes": reporter.outcomes, "messages": reporter.messages}
    try:
        report["tampering"] = reporter.tampering()
    except Exception as e:  # noqa: BLE001 - pytest's state broken by the code under test
        report["tampering"] = [f"pytest's plugin state could not be checked: {type(e).__name__}"]
    if cov is not None:
        cov.stop()
        try:
            cov.json_report(outfile=coverage_json)
            with open(coverage_json) as f:
                report["coverage"] = json.load(f)
        except Exception as e:  # noqa: BLE001 - e.g. "No data to report"
            report["coverage_error"] = str(e)[:300]
    send(report)


def send(report: dict) -> None:
    """Write the sealed report, close the pipe and end the process with the exit code it reports."""
    code = report["exit_code"] if isinstance(report["exit_code"], int) else RUNNER_ERROR
    report["exit_code"] = code
    data = seal(report)
    try:
        now = _fstat(REPORT_FD)
        if (now.st_dev, now.st_ino) != (_PIPE.st_dev, _PIPE.st_ino):  # closed and reopened as something else
            _exit(PIPE_LOST)
        while data:
            data = data[_write(REPORT_FD, data) :]
        _close(REPORT_FD)
    except OSError:  # closed under us by the code under test
        _exit(PIPE_LOST)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a stream the tests replaced or closed
            stream.flush()
    _exit(code)


if __name__ == "__main__":
    main()
