"""Hidden-test reward: JUnit parsing, tampering detection, failure modes that never pass, effort, coverage."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskrl.envs.code.env import composer_reward
from taskrl.envs.code.reward import (
    CodeRewardConfig,
    asked_a_question,
    find_tampering,
    is_protected,
    protect,
    score,
    tree_state,
)
from taskrl.envs.code.sandbox import CommandResult, Sandbox
from taskrl.envs.code.testrun import FORGED, PIPE_LOST, TestRun, parse_junit, read_report, run_pytest
from taskrl.envs.code.workspace import WorkspaceConfig, pool_for
from taskrl.rewards.formulas import effort_penalty
from taskrl.scoring import Clock
from taskrl.scoring import score as score_terms
from taskrl.types import Message, Task, ToolCall, Trajectory

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_ok" />
<testcase classname="tests.test_a" name="test_param[1-2]"><failure message="assert 1 == 2">long</failure></testcase>
<testcase classname="tests.test_a.TestK" name="test_skip"><skipped message="later" /></testcase>
<testcase classname="tests.test_a" name="test_teardown" />
<testcase classname="tests.test_a" name="test_teardown"><error message="teardown boom" /></testcase>
<testcase classname="" name="tests.test_b"><error message="collection failure">Traceback
E   ModuleNotFoundError: No module named 'nope'</error></testcase>
</testsuite></testsuites>"""


def test_parse_junit_golden() -> None:
    outcomes, messages = parse_junit(JUNIT)
    assert outcomes == {
        "tests.test_a::test_ok": "passed",
        "tests.test_a::test_param[1-2]": "failed",
        "tests.test_a.TestK::test_skip": "skipped",
        "tests.test_a::test_teardown": "error",
        "::tests.test_b": "error",
    }
    assert messages["tests.test_a::test_param[1-2]"] == "assert 1 == 2"
    assert messages["::tests.test_b"] == "ModuleNotFoundError: No module named 'nope'"
    run = TestRun(outcomes=outcomes, messages=messages, report_found=True)
    assert run.collection_errors == ["::tests.test_b"]
    assert run.failure == "collection errors in tests.test_b"
    assert run.fraction_passed(["tests.test_a::test_ok", "tests.test_a.TestK::test_skip", "missing::x"]) == 1 / 3


def test_test_run_failures_are_never_a_pass() -> None:
    assert TestRun(report_found=False).failure == "pytest wrote no report (it crashed or was interrupted)"
    assert TestRun(report_found=True).failure == "no tests collected"
    with pytest.raises(ValueError, match="at least one expected test"):
        TestRun().fraction_passed([])


def test_protected_files() -> None:
    for path in ["test_x.py", "tests/test_y.py", "pkg/x_test.py", "conftest.py", "a/conftest.py", "pytest.ini",
                 "tox.ini", "setup.cfg", "pyproject.toml", "sitecustomize.py", "evil.pth"]:  # fmt: skip
        assert is_protected(path), path
    for path in ["pkg/mod.py", "solution.py", "README.md", "testing.py", "contest.py"]:
        assert not is_protected(path), path


def test_tampering_is_every_change_to_a_protected_file(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test(): assert f() == 1\n")
    (tmp_path / "tests" / "test_b.py").write_text("def test(): pass\n")
    (tmp_path / "setup.cfg").write_text("[tool:pytest]\n")
    (tmp_path / "mod.py").write_text("x = 1\n")
    before = protect(tmp_path)
    assert sorted(before) == ["setup.cfg", "tests/test_a.py", "tests/test_b.py"]
    assert find_tampering(tmp_path, before) == []
    (tmp_path / "mod.py").write_text("x = 2\n")  # fixing code is the job
    (tmp_path / "tests" / "test_mine.py").write_text("def test(): pass\n")  # so is writing new tests
    assert find_tampering(tmp_path, before) == []
    (tmp_path / "tests" / "test_a.py").write_text("def test(): assert True\n")
    (tmp_path / "tests" / "test_b.py").unlink()
    (tmp_path / "tests" / "test_b.py").symlink_to(tmp_path / "mod.py")
    (tmp_path / "setup.cfg").unlink()
    (tmp_path / "conftest.py").write_text("collect_ignore = ['tests']\n")
    (tmp_path / "x.pth").write_text("import os\n")
    assert find_tampering(tmp_path, before) == [
        "deleted setup.cfg",
        "modified tests/test_a.py",
        "modified tests/test_b.py",
        "added conftest.py",
        "added x.pth",
    ]


def humaneval_like_task(tmp_path: Path, solution: str, test: str, **info: object) -> Task:
    base = tmp_path / "empty"
    base.mkdir(exist_ok=True)
    return Task(
        "t",
        "implement f",
        info={
            "base": str(base),
            "files": {"solution.py": solution},
            "hidden_files": {"test_hidden.py": test},
            "hidden_targets": ["test_hidden.py"],
            "fail_to_pass": ["test_hidden::test_f"],
            "code_files": ["solution.py"],
            **info,
        },
    )


async def scored(sandbox: Sandbox, config: WorkspaceConfig, task: Task, agent_files: dict[str, str], **kw: object):  # type: ignore[no-untyped-def]
    with pool_for(task.info["base"], config).acquire() as ws:
        for path, text in task.info["files"].items():
            ws.write_file(path, text.encode())
        protected, state = protect(ws.path), tree_state(ws.path)
        for path, text in agent_files.items():
            ws.write_file(path, text.encode())
        return await score(sandbox, ws, task, protected, state, CodeRewardConfig(**kw))  # type: ignore[arg-type]


HIDDEN = "from solution import f\n\n\ndef test_f():\n    assert f(2) == 4\n"


async def test_hidden_tests_score_the_final_workspace(
    sandbox: Sandbox, workspace_config: WorkspaceConfig, tmp_path: Path
) -> None:
    task = humaneval_like_task(tmp_path, "def f(x):\n    raise NotImplementedError\n", HIDDEN)
    fixed = await scored(sandbox, workspace_config, task, {"solution.py": "def f(x):\n    return 2 * x\n"})
    assert (fixed.tests, fixed.failure, fixed.tampering) == (1.0, None, [])
    unfixed = await scored(sandbox, workspace_config, task, {})
    assert unfixed.tests == 0.0 and unfixed.failure is None and unfixed.run.counts["failed"] == 1


async def test_conftest_hack_is_tampering_and_scores_zero(
    sandbox: Sandbox, workspace_config: WorkspaceConfig, tmp_path: Path
) -> None:
    task = humaneval_like_task(tmp_path, "def f(x):\n    return 0\n", HIDDEN)
    hack = (
        "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
    )
    result = await scored(sandbox, workspace_config, task, {"conftest.py": hack})
    assert result.tests == 0.0 and result.tampering == ["added conftest.py"] and result.run is None


@pytest.mark.parametrize(
    ("hidden", "why"),
    [
        ("def helper():\n    pass\n", "no tests collected"),
        ("from solution import f\ndef test_f(:\n", "collection errors in test_hidden"),
        ("from solution import f\n\n\ndef test_f():\n    while True:\n        pass\n", "tests did not finish"),
    ],
)
async def test_no_tests_collection_errors_and_timeouts_are_failures(
    sandbox: Sandbox, workspace_config: WorkspaceConfig, tmp_path: Path, hidden: str, why: str
) -> None:
    task = humaneval_like_task(tmp_path, "def f(x):\n    return 2 * x\n", hidden)
    timeout = 1.5 if "while True" in hidden else 60.0  # pytest alone can take seconds on a loaded machine
    result = await scored(sandbox, workspace_config, task, {}, test_timeout_s=timeout)
    assert result.tests == 0.0 and result.failure is not None and result.failure.startswith(why), result.failure


async def test_agent_tests_are_measured_with_coverage(
    sandbox: Sandbox, workspace_config: WorkspaceConfig, tmp_path: Path
) -> None:
    solution = "def f(x):\n    if x > 100:\n        return -1\n    return 2 * x\n"
    task = humaneval_like_task(tmp_path, solution, HIDDEN)
    mine = "from solution import f\n\n\ndef test_small():\n    assert f(1) == 2\n"
    result = await scored(sandbox, workspace_config, task, {"test_mine.py": mine})
    assert result.agent_tests == ["test_mine.py"] and result.tests == 1.0
    assert result.coverage == pytest.approx(3 / 4)  # the x > 100 branch is never run
    trivial = await scored(sandbox, workspace_config, task, {"test_trivial.py": "def test_nothing():\n    pass\n"})
    assert trivial.coverage == 0.0


async def test_run_pytest_reports_outcomes_per_test(sandbox: Sandbox, agent_tmp: Path) -> None:
    tmp_path = agent_tmp
    (tmp_path / "test_mix.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('x', [1, 2])\ndef test_p(x):\n    assert x == 1\n\n"
        "@pytest.mark.skip\ndef test_s():\n    pass\n"
    )
    run, coverage = await run_pytest(sandbox, tmp_path, ["test_mix.py"])
    assert run.outcomes == {
        "test_mix::test_p[1]": "passed",
        "test_mix::test_p[2]": "failed",
        "test_mix::test_s": "skipped",
    }
    assert coverage is None and run.failure is None
    assert run.summary().startswith("1 passed, 1 failed, 1 skipped\nFAILED test_mix::test_p[2]: assert 2 == 1")


def _sealed(report: dict, key: bytes) -> bytes:
    body = json.dumps(report)
    return json.dumps({"body": body, "mac": hmac.new(key, body.encode(), hashlib.sha256).hexdigest()}).encode()


def test_only_the_runners_one_sealed_report_with_a_matching_exit_status_is_read() -> None:
    key, other = b"k" * 32, b"o" * 32
    report = {"exit_code": 1, "outcomes": {"t::a": "failed"}, "messages": {}, "tampering": []}
    exited = CommandResult(returncode=1, stdout="", stderr="", duration_s=0.1)
    assert read_report(_sealed(report, key), key, exited) == (report, None)
    forged = json.dumps({k: v for k, v in report.items()}).encode()
    assert read_report(forged, key, exited) == (None, FORGED)  # not sealed
    assert read_report(_sealed(report, other), key, exited) == (None, FORGED)  # sealed under another key
    assert read_report(forged + _sealed(report, key), key, exited) == (None, FORGED)  # a second document
    assert read_report(_sealed(report, key) + b"{}", key, exited) == (None, FORGED)
    assert read_report(b"\xff" * 10, key, exited) == (None, FORGED)
    ended = CommandResult(returncode=0, stdout="", stderr="", duration_s=0.1)  # os._exit(0) after the report
    assert "ended with 0" in str(read_report(_sealed(report, key), key, ended)[1])
    lost = CommandResult(returncode=PIPE_LOST, stdout="", stderr="", duration_s=0.1)
    assert "closed or replaced" in str(read_report(b"", key, lost)[1])
    assert read_report(b"", key, exited) == (None, None)  # a crash: no report, a failure, not tampering
    killed = CommandResult(returncode=137, stdout="", stderr="", duration_s=0.1, killed="wall timeout")
    assert read_report(_sealed(report, key), key, killed) == (None, None)


async def test_a_test_that_ends_pytest_early_is_no_pass_and_a_forged_report_is_tampering(
    sandbox: Sandbox, agent_tmp: Path
) -> None:
    (agent_tmp / "test_exit.py").write_text("import os\n\ndef test_a():\n    os._exit(0)\n")
    run, _ = await run_pytest(sandbox, agent_tmp, ["test_exit.py"])
    assert not run.report_found and run.failure is not None and not run.tampering and not run.outcomes
    forge = (
        "import json, os\n\ndef test_a():\n    for fd in os.listdir('/proc/self/fd'):\n        try:\n"
        "            os.write(int(fd), json.dumps({'body': '{}', 'mac': ''}).encode())\n"
        "        except OSError:\n            pass\n    os._exit(0)\n"
    )
    (agent_tmp / "test_exit.py").write_text(forge)
    run, _ = await run_pytest(sandbox, agent_tmp, ["test_exit.py"])
    assert run.tampering == [FORGED] and run.failure is not None and not run.outcomes


def trajectory(calls: int, answer: str = "done") -> Trajectory:
    assistant = Message("assistant", "", tool_calls=[ToolCall(f"c{i}", "run_tests", {}) for i in range(calls)])
    traj = Trajectory(messages=[Message("user", "fix it"), assistant, Message("assistant", answer)])
    traj.info["final_answer"] = answer
    return traj


def rubric_scored(tests: float, traj: Trajectory, config: CodeRewardConfig, *, tampering: bool = False) -> Trajectory:
    """``traj`` as the code env scores it: the hidden tests' share in its metrics, measured by the env's
    ``composer`` rubric and scored by it."""
    traj.metrics.update(tests_passed=tests, tampering=float(tampering))
    reward = composer_reward(config)
    traj.terms = reward.measure(traj, None)
    score_terms([traj], reward, Clock())
    return traj


def test_effort_term_golden() -> None:
    config = CodeRewardConfig(effort_weight=0.1, effort_k=1.0, effort_q=0.5)
    # ((1 + 1*3)^(1-0.5) - 1) / (1 * 0.5) = 2, times the weight 0.1
    solved = rubric_scored(1.0, trajectory(3), config)
    assert solved.rewards["effort"] == pytest.approx(-0.2) and solved.reward == pytest.approx(0.8)
    assert solved.terms["effort"] == pytest.approx(-2.0)  # measured: unweighted
    assert rubric_scored(0.05, trajectory(3), config).reward == pytest.approx(0.0)  # never below a failure
    assert rubric_scored(0.0, trajectory(3), config).reward == 0.0
    off = rubric_scored(1.0, trajectory(3), CodeRewardConfig())  # weight 0: off, not a term at all
    assert off.rewards == {"tests": 1.0} and off.terms == {"tests": 1.0}
    turns = CodeRewardConfig(effort_weight=0.5, effort_k=1.0, effort_q=1.0, effort_measure="turns")
    by_turns = rubric_scored(1.0, trajectory(7), turns)  # 2 turns; q=1: log(1+kx)/k
    assert by_turns.rewards["effort"] == pytest.approx(-0.5 * math.log(3))
    assert by_turns.reward == pytest.approx(1.0 - 0.5 * math.log(3))


def test_valid_tool_use_credit_can_refuse_calls_that_failed() -> None:
    """``valid_tool_use_counts_errors``: a well-formed call whose tool failed (a file that does not exist) earns
    no credit; by default it does (Cursor's definition: the call was valid)."""
    traj = trajectory(2)
    traj.messages.insert(2, Message("tool", "'path' does not exist", tool_call_id="c0", is_error=True))
    traj.messages.insert(3, Message("tool", "tests: 3 passed", tool_call_id="c1"))
    lenient = rubric_scored(0.0, traj, CodeRewardConfig(valid_tool_use_weight=0.1))
    assert lenient.rewards["valid_tool_use"] == pytest.approx(0.1)
    strict = rubric_scored(0.0, traj, CodeRewardConfig(valid_tool_use_weight=0.1, valid_tool_use_counts_errors=True))
    assert strict.rewards["valid_tool_use"] == pytest.approx(0.05) and strict.reward == pytest.approx(0.05)


def test_valid_tool_use_credit_brings_the_tamper_gate() -> None:
    config = CodeRewardConfig(valid_tool_use_weight=0.1)
    honest = rubric_scored(1.0, trajectory(3), config)
    assert honest.rewards["valid_tool_use"] == pytest.approx(0.1) and honest.reward == pytest.approx(1.1)
    tampered = rubric_scored(0.0, trajectory(3), config, tampering=True)  # the env scores a tampered workspace 0
    assert tampered.terms["tests_intact"] == 0.0 and tampered.reward == 0.0  # no credit for its valid calls
    assert "tests_intact" not in rubric_scored(1.0, trajectory(3), CodeRewardConfig()).terms  # tests alone: no gate


@given(
    tests=st.floats(0, 1),
    calls=st.integers(0, 500),
    weight=st.floats(0, 10),
    k=st.floats(0.01, 10),
    q=st.floats(0, 3),
)
def test_effort_never_takes_a_success_below_a_failure(
    tests: float, calls: int, weight: float, k: float, q: float
) -> None:
    traj = rubric_scored(tests, trajectory(calls), CodeRewardConfig(effort_weight=weight, effort_k=k, effort_q=q))
    assert 0.0 <= traj.reward <= tests + 1e-12
    assert traj.reward == pytest.approx(max(tests - weight * effort_penalty(calls, k, q), 0.0), abs=1e-9)


def test_clarifying_questions() -> None:
    assert asked_a_question(trajectory(0, "Should I change the API or the tests?"))
    assert asked_a_question(trajectory(0, "<answer>Which file do you mean?</answer>"))
    assert not asked_a_question(trajectory(0, "Fixed. Why did it fail? The sign was wrong."))
    assert not asked_a_question(trajectory(0, ""))


@pytest.mark.parametrize(
    ("field", "value"),
    [("effort_weight", -1), ("effort_measure", "tokens"), ("effort_k", 0), ("test_timeout_s", 0),
     ("valid_tool_use_weight", -0.1), ("trivial_tests_weight", -1), ("valid_tool_use_counts_errors", "yes")],
)
def test_config_errors_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"CodeRewardConfig.{field}"):
        CodeRewardConfig(**{field: value})
